"""What a worker refuses to serve, checked by running the real CLI (`python -m pipeline.cli worker`):
an open console beyond loopback, nothing to serve, a console bot with the console off. Each refusal
exits 2 with a message that says how to fix it, before anything is started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.settings import Settings
from pipeline.web import check_worker_settings, exposure_warnings, is_loopback

from .conftest import console_bot

# What a worker needs besides bots. Nothing listens there: the refusals below come first, from the
# settings (exit 2), before the worker would look for the broker (exit 1).
WORKER_ENV = {
    "SWITCHBOARD_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    "SWITCHBOARD_REDIS_URL": "redis://127.0.0.1:1/0",
    "SWITCHBOARD_SESSION_BASE_URL": "http://127.0.0.1:1/v1",
    "SWITCHBOARD_SESSION_API_KEY": "k",
}


def worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "worker"],
        env={**clean, **WORKER_ENV, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_worker_with_an_open_console_beyond_loopback_refuses_to_start() -> None:
    result = worker({"SWITCHBOARD_CONSOLE_ENABLED": "true", "SWITCHBOARD_WEB_HOST": "0.0.0.0"})
    assert result.returncode == 2, result.stderr
    message = result.stderr
    assert "console is enabled on 0.0.0.0:8080" in message and "demo" in message
    for fix in ("SWITCHBOARD_CONSOLE_TOKEN", "SWITCHBOARD_WEB_HOST=127.0.0.1", "SWITCHBOARD_CONSOLE_ENABLED=false"):
        assert fix in message, fix
    # An empty token (an unset compose variable) is no token.
    empty = worker(
        {"SWITCHBOARD_CONSOLE_ENABLED": "true", "SWITCHBOARD_WEB_HOST": "0.0.0.0", "SWITCHBOARD_CONSOLE_TOKEN": ""}
    )
    assert empty.returncode == 2 and "SWITCHBOARD_CONSOLE_TOKEN" in empty.stderr


def test_a_worker_without_bots_and_without_the_console_names_the_bots_file() -> None:
    result = worker({})
    assert result.returncode == 2, result.stderr
    assert "no bots are configured" in result.stderr and "SWITCHBOARD_CONFIG" in result.stderr


def test_a_console_bot_with_the_console_off_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "bots.toml"
    config.write_text('[[bots]]\nplatform = "console"\nbot_id = "mine"\n[bots.credentials]\ntoken = "x"\n')
    result = worker({"SWITCHBOARD_CONFIG": str(config)})
    assert result.returncode == 2, result.stderr
    assert "mine" in result.stderr and "SWITCHBOARD_CONSOLE_ENABLED=true" in result.stderr


@pytest.mark.parametrize(
    ("settings", "allowed"),
    [
        ({"console_enabled": True}, True),  # loopback: the demo bot needs no token
        ({"console_enabled": True, "web_host": "::1"}, True),
        ({"console_enabled": True, "web_host": "0.0.0.0"}, False),
        ({"console_enabled": True, "web_host": ""}, False),
        ({"console_enabled": True, "web_host": "worker.internal"}, False),
        ({"console_enabled": True, "web_host": "0.0.0.0", "console_token": "t0ken"}, True),
        (
            {"console_enabled": True, "web_host": "0.0.0.0", "bots": [console_bot("a"), console_bot("b", token=None)]},
            False,
        ),
        ({"console_enabled": True, "web_host": "0.0.0.0", "bots": [console_bot("a")]}, True),
        ({"web_host": "0.0.0.0", "bots": [console_bot("a", platform="onebot", token=None)]}, True),
    ],
)
def test_which_settings_a_worker_accepts(settings: dict[str, object], allowed: bool) -> None:
    parsed = Settings(**settings)  # type: ignore[arg-type]
    if allowed:
        check_worker_settings(parsed)
    else:
        with pytest.raises(ValueError, match="have no token"):
            check_worker_settings(parsed)


def test_the_demo_bot_exists_only_with_the_console_and_carries_its_token() -> None:
    assert Settings().bots == []
    demo = Settings(console_enabled=True, console_token="t0ken").bot("console", "demo")
    assert demo is not None and demo.secret("token") == "t0ken"
    own = Settings(console_enabled=True, bots=[console_bot("mine")])
    assert [b.bot_id for b in own.bots] == ["mine"]  # a configured console bot: no demo


def test_open_metrics_beyond_loopback_are_warned_about() -> None:
    (warning,) = exposure_warnings(Settings(web_host="0.0.0.0"))
    assert "SWITCHBOARD_METRICS_TOKEN" in warning and "refuses every request" in warning
    assert exposure_warnings(Settings(web_host="0.0.0.0", metrics_token="m")) == []
    assert exposure_warnings(Settings()) == []  # loopback: /metrics is open there
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.0.0.1")
