"""The `switchboard` command: topics apply/check against a real broker, fail-fast settings."""

from __future__ import annotations

import os
import subprocess
import sys

from pipeline.embedded import TansuBroker


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_topics_check_reports_drift_until_apply(tansu_broker: TansuBroker) -> None:
    env = {"SWITCHBOARD_KAFKA_BOOTSTRAP": tansu_broker.bootstrap, "SWITCHBOARD_PARTITIONS": "3"}
    before = run("topics", "check", env=env)
    assert before.returncode == 1, before.stdout + before.stderr
    assert "missing" in before.stdout
    applied = run("topics", "apply", env=env)
    assert applied.returncode == 0, applied.stderr
    after = run("topics", "check", env=env)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "no drift" in after.stdout


def test_bad_setting_fails_fast_naming_the_field() -> None:
    result = run("worker", env={"SWITCHBOARD_PARTITIONS": "0", "SWITCHBOARD_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert result.returncode == 2
    assert "partitions" in result.stderr and "greater than or equal to 1" in result.stderr


def test_worker_without_a_broker_setting_says_what_is_missing() -> None:
    result = run("worker", env={"SWITCHBOARD_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 2
    assert "SWITCHBOARD_KAFKA_BOOTSTRAP" in result.stderr


def test_bad_bot_file_fails_fast(tmp_path: os.PathLike[str]) -> None:
    config = os.path.join(tmp_path, "bots.toml")
    with open(config, "w") as handle:
        handle.write('[[bots]]\nplatform = "console"\nbot_id = "has space"\n')
    result = run("worker", env={"SWITCHBOARD_CONFIG": config, "SWITCHBOARD_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert result.returncode == 2
    assert "bot_id" in result.stderr
