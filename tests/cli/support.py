"""Running the real `switchboard` command in a child process, with no SWITCHBOARD_* leaking in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def worker_env(kafka: str, redis: str, web_port: int, **more: str) -> dict[str, str]:
    """Everything `switchboard worker` requires, set (the session API is never called before a turn)."""
    return {
        "SWITCHBOARD_KAFKA_BOOTSTRAP": kafka,
        "SWITCHBOARD_REDIS_URL": redis,
        "SWITCHBOARD_SESSION_BASE_URL": "http://127.0.0.1:9/api/v3",
        "SWITCHBOARD_SESSION_API_KEY": "test-key",
        "SWITCHBOARD_WEB_PORT": str(web_port),
        "SWITCHBOARD_CONSOLE_ENABLED": "true",  # a bot to serve: the console's `demo` (on loopback)
        "SWITCHBOARD_KAFKA_IDEMPOTENCE": "false",  # the tests' broker is Tansu (no InitProducerId)
        **more,
    }
