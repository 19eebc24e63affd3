"""Running the real `switchboard` command in a child process, with no SWITCHBOARD_* leaking in."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
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
        # Sessions from a pool: nothing else to configure (no agent, no control-plane keys).
        "SWITCHBOARD_SESSION_PROVISIONER": "static",
        "SWITCHBOARD_SESSION_STATIC_IDS": '["sesn-test-1"]',
        "SWITCHBOARD_WEB_PORT": str(web_port),
        "SWITCHBOARD_CONSOLE_ENABLED": "true",  # a bot to serve: the console's `demo` (on loopback)
        "SWITCHBOARD_KAFKA_IDEMPOTENCE": "false",  # the tests' broker is Tansu (no InitProducerId)
        **more,
    }


BANNER = "switchboard is up"


class Up:
    """A `switchboard up` child whose output goes to a pipe the test reads (as a terminal would)."""

    def __init__(self, port: int, run_dir: Path, env: dict[str, str] | None = None, *, broker: str = "tansu") -> None:
        self.port = port
        self.run_dir = run_dir
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")} | (env or {})
        command = ["up", "--web-port", str(port), "--run-dir", str(run_dir), "--broker", broker]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", *command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the "terminal" the test hangs up
        )
        self.output = ""

    def wait_for_banner(self, timeout: float = 180) -> float:
        """Read the output until the banner is complete; the monotonic time it appeared."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        seen_at = None
        while "Ctrl-C stops everything" not in self.output:
            assert time.monotonic() < deadline, self.output
            line = self.proc.stdout.readline().decode(errors="replace")
            if not line:
                raise AssertionError(f"`up` ended before its banner (code {self.proc.wait()}):\n{self.output}")
            if BANNER in line:
                seen_at = time.monotonic()
            self.output += line
        assert seen_at is not None
        return seen_at

    def descendants(self) -> set[int]:
        """Every process started under `up` (the parts run in sessions of their own, so the process
        group does not find them: the kernel's child lists do)."""
        found: set[int] = set()
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    children = (task / "children").read_text().split()
                except OSError:
                    continue
                for child in map(int, children):
                    if child not in found:
                        found.add(child)
                        todo.append(child)
        return found

    def kill(self) -> None:
        """After a failed test: this run's processes only (each part leads its own group)."""
        for pid in [*self.descendants(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
