"""The settings: plain data found by (platform, bot_id), every problem reported in one pass before
anything starts, and a misspelt variable named instead of ignored."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import ConfigurationError
from pipeline.platforms.checks import bot_problems
from pipeline.settings import OTHER_VARIABLES, BotConfig, Settings, load_settings, unknown_variables
from tests.cli.support import run

ROOT = Path(__file__).resolve().parent.parent


def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the test sets is all the settings see (a developer's own SWITCHBOARD_* would leak in).
    for name in [n for n in os.environ if n.upper().startswith("SWITCHBOARD_")]:
        monkeypatch.delenv(name)


# -- the index -----------------------------------------------------------------------------------------


def test_a_bot_is_found_by_platform_and_bot_id() -> None:
    settings = Settings(
        bots=[
            {"platform": "onebot", "bot_id": "a"},
            {"platform": "console", "bot_id": "a"},
            {"platform": "console", "bot_id": "b"},
        ]
    )
    assert settings.bot("onebot", "a") is settings.bots[0]
    assert settings.bot("console", "a") is settings.bots[1]  # the same bot_id on another platform
    assert settings.bot("console", "b") is settings.bots[2]
    assert settings.bot("onebot", "b") is None and settings.bot("telegram", "a") is None
    # Built once for the list, not at each look-up.
    assert settings._bots_by_key() is settings._bots_by_key()  # noqa: SLF001


def test_bots_put_in_place_later_are_found_and_the_old_ones_are_not() -> None:
    settings = Settings(bots=[{"platform": "onebot", "bot_id": "old"}])
    assert settings.bot("onebot", "old") is not None
    new = BotConfig(platform="onebot", bot_id="new")
    # `model_copy(update=…)` validates nothing: the copy must still not answer from the old index.
    copy = settings.model_copy(update={"bots": [new]})
    assert copy.bot("onebot", "new") is new and copy.bot("onebot", "old") is None
    assert settings.bot("onebot", "old") is not None and settings.bot("onebot", "new") is None
    settings.bots = [new]
    assert settings.bot("onebot", "new") is new and settings.bot("onebot", "old") is None


def test_the_console_demo_bot_is_in_the_index() -> None:
    settings = Settings(console_enabled=True)
    demo = settings.bot("console", "demo")
    assert demo is not None and demo is settings.bots[-1]


# -- the bots file: every problem in one pass ----------------------------------------------------------

TYPOS = """
[[bots]]
platfrom = "onebot"
bot_id = "qq"
transport = "ws_reverse"

[[bots]]
platform = "telegram"
bot_id = "tg"
transport = "ws-reverse"
credentials = { token = "123:abc" }

[[bots]]
bot_id = "lost"
transport = "carrier-pigeon"
"""


def test_a_misspelt_field_does_not_hide_the_rest_of_the_bots_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clean_environment(monkeypatch)
    config = tmp_path / "bots.toml"
    config.write_text(TYPOS)
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(config))
    with pytest.raises(ConfigurationError) as error:
        load_settings("up", bots_check=bot_problems)
    assert error.value.problems == [
        f"{config}: bots[0].platform: Field required",
        f"{config}: bots[0].platfrom: Extra inputs are not permitted; did you mean 'platform'?",
        # The transport is checked against the platform the misspelt key names.
        f"{config}: bots[0].transport: onebot does not offer transport 'ws_reverse' (bot 'qq', taking platfrom = "
        "'onebot' for platform); it offers: webhook, ws-reverse, ws-forward; did you mean 'ws-reverse'?",
        f"{config}: bots[1].transport: telegram does not offer transport 'ws-reverse' (bot 'tg'); it offers: "
        "webhook, polling",
        f"{config}: bots[2].platform: Field required",
        f"{config}: bots[2].transport: no platform offers transport 'carrier-pigeon' (bot 'lost')",
    ]


def test_the_same_checks_run_on_settings_made_in_code() -> None:
    settings = Settings(bots=[{"platform": "slack", "bot_id": "s", "credentials": {"bot_token": "xoxb-1"}}])
    problems = bot_problems(settings.bots)
    assert [(p.loc, p.message) for p in problems] == [
        ((0, "credentials", "signing_secret"), "required for slack webhook (bot 's')")
    ]


# -- the log level -------------------------------------------------------------------------------------


def test_an_unknown_log_level_is_refused_with_the_other_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_environment(monkeypatch)
    monkeypatch.setenv("SWITCHBOARD_LOG_LEVEL", "verbose")
    monkeypatch.setenv("SWITCHBOARD_PARTITIONS", "0")
    with pytest.raises(ConfigurationError) as error:
        load_settings("up")
    assert error.value.problems == [
        "SWITCHBOARD_PARTITIONS=0: Input should be greater than or equal to 1",
        "SWITCHBOARD_LOG_LEVEL=verbose: Input should be 'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'",
    ]
    monkeypatch.delenv("SWITCHBOARD_PARTITIONS")
    monkeypatch.setenv("SWITCHBOARD_LOG_LEVEL", "debug")  # any case, as the logging module takes it
    assert load_settings("up").log_level == "DEBUG"


def test_a_worker_with_an_unknown_log_level_starts_nothing() -> None:
    result = run(
        "worker",
        env={
            "SWITCHBOARD_LOG_LEVEL": "verbose",
            # Nothing listens there: a worker that got past its settings would say so instead.
            "SWITCHBOARD_KAFKA_BOOTSTRAP": "127.0.0.1:1",
            "SWITCHBOARD_REDIS_URL": "redis://127.0.0.1:1/0",
            "SWITCHBOARD_SESSION_BASE_URL": "http://127.0.0.1:9/api/v3",
            "SWITCHBOARD_SESSION_API_KEY": "k",
            "SWITCHBOARD_CONSOLE_ENABLED": "true",
        },
    )
    assert result.returncode == 2, result.stderr
    assert "SWITCHBOARD_LOG_LEVEL=verbose: Input should be 'DEBUG'" in result.stderr
    assert "Unknown level" not in result.stderr and "cannot reach" not in result.stderr


# -- unknown variables ---------------------------------------------------------------------------------


def test_an_unknown_variable_is_named_with_the_closest_known_one() -> None:
    environ = {
        "SWITCHBOARD_REDIS_ULR": "redis://redis:6379/0",
        "switchboard_kafka_bootstrp": "kafka:9092",  # the settings take any case: so does the check
        "SWITCHBOARD_FROBNICATE": "1",
        # Known: settings, a nested value of one, variables read elsewhere, other programs' names.
        "SWITCHBOARD_REDIS_URL": "redis://redis:6379/0",
        "SWITCHBOARD_BOTS__0__BOT_ID": "a",
        "SWITCHBOARD_TEST_BROKERS": "tansu",
        "SWITCHBOARD_CONFIG": "/etc/switchboard.toml",
        "REDIS_ULR": "x",
    }
    assert unknown_variables(environ) == [
        "SWITCHBOARD_FROBNICATE is not a setting and is ignored; the settings are listed in README.md, Configuration",
        "SWITCHBOARD_REDIS_ULR is not a setting and is ignored; did you mean SWITCHBOARD_REDIS_URL?",
        "switchboard_kafka_bootstrp is not a setting and is ignored; did you mean SWITCHBOARD_KAFKA_BOOTSTRAP?",
    ]


def test_up_warns_of_an_unknown_variable_before_anything_starts(tmp_path: Path) -> None:
    # A bad setting besides: `up` stops at its settings, so the test starts nothing either.
    result = run(
        "up",
        "--run-dir",
        str(tmp_path / "run"),
        env={"SWITCHBOARD_REDIS_ULR": "redis://127.0.0.1:1/0", "SWITCHBOARD_PARTITIONS": "0"},
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "switchboard: warning: SWITCHBOARD_REDIS_ULR is not a setting and is ignored; "
        "did you mean SWITCHBOARD_REDIS_URL?"
    )
    assert lines[1].startswith("switchboard: bad settings")
    assert not (tmp_path / "run").exists()


# Names the tests spell wrong on purpose.
_DELIBERATE_TYPOS = {"SWITCHBOARD_KAFKA_BROKERS", "SWITCHBOARD_REDIS_ULR", "SWITCHBOARD_FROBNICATE"}


def test_every_variable_the_tree_reads_is_known() -> None:
    """A SWITCHBOARD_* variable read anywhere (code, tests, Makefile, deployment files) is a setting or
    listed in OTHER_VARIABLES: otherwise every command would warn that it is ignored."""
    files = [
        ROOT / "Makefile",
        *(p for d in ("pipeline", "bench", "tests", "deploy", ".ci") for p in (ROOT / d).rglob("*")),
    ]
    found: dict[str, Path] = {}
    for path in files:
        if not path.is_file() or path.suffix in {".pyc", ".png", ".lua"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for name in re.findall(r"SWITCHBOARD_[A-Z0-9_]*[A-Z0-9]", text):
            found.setdefault(name, path)
    assert len(found) > 20, "the walk found the settings' variables"
    unknown = {
        name: str(path)
        for name, path in found.items()
        if name not in _DELIBERATE_TYPOS and unknown_variables({name: ""})
    }
    assert unknown == {}, "add these to OTHER_VARIABLES (pipeline/settings.py) or make them settings"
    assert "SWITCHBOARD_CONFIG" in OTHER_VARIABLES


# -- the import circle -----------------------------------------------------------------------------------


def test_the_settings_import_nothing_above_them() -> None:
    code = "import pipeline.settings, sys; print(sorted(m for m in sys.modules if m.startswith('pipeline.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(ast.literal_eval(result.stdout))
    assert "pipeline.settings" in loaded
    above = {m for m in loaded if m.startswith(("pipeline.platforms", "pipeline.web", "pipeline.stages"))}
    assert above == set()
    # The controls' configuration models (pipeline.controls) are plain data too, importing nothing.
    assert {m for m in loaded if m != "pipeline.controls" and not m.startswith("pipeline.controls.")} == {
        "pipeline.settings",
        "pipeline.errors",
    }
