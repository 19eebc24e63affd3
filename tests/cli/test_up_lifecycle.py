"""`switchboard up` as a user runs it, in a process group of its own as a terminal would run it:
a hang-up (closed terminal, dropped SSH) stops every part and frees the port, and a second `up` on
the same port names the run that holds it and how to stop it."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from pipeline.embedded import free_port
from tests.cli.support import Up, run

pytestmark = [pytest.mark.integration]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose here (its parent has not reaped it yet).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_hang_up_stops_every_part_and_frees_the_port(up: Up) -> None:
    _hang_up_stops_everything(up)


def test_hang_up_stops_every_part_on_apache_kafka_too(tmp_path: Path) -> None:
    """The default broker wherever Java 17+ is installed: a JVM, which must go with the rest."""
    up = Up(free_port(), tmp_path / "run", broker="kafka")
    try:
        _hang_up_stops_everything(up)
        assert "(embedded Apache Kafka)" in up.output
    finally:
        if up.proc.poll() is None:
            up.kill()


def _hang_up_stops_everything(up: Up) -> None:
    up.wait_for_banner()
    children = up.descendants()
    assert len(children) >= 4, f"broker, Redis, simulator and worker: {children}"
    assert not _bindable(up.port)
    # The terminal goes away: its end of the output closes, then the whole group gets SIGHUP.
    assert up.proc.stdout is not None
    up.proc.stdout.close()
    os.killpg(up.proc.pid, signal.SIGHUP)
    code = up.proc.wait(timeout=90)
    assert code == 0
    deadline = time.monotonic() + 10  # a part's last exit may trail `up`'s by a moment
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)], "parts left running after the hang-up"
    assert _bindable(up.port)


def test_port_held_by_an_up_names_the_run_and_how_to_stop_it(up: Up, tmp_path: Path) -> None:
    up.wait_for_banner()
    result = run("up", "--web-port", str(up.port), "--run-dir", str(tmp_path / "second"))
    assert result.returncode == 1, result.stdout + result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert f"`switchboard up` pid {up.proc.pid}" in line, line
    assert f"run directory {up.run_dir}" in line, line
    assert f"`kill {up.proc.pid}`" in line, line
    assert not (tmp_path / "second").exists()
    # SIGTERM (a supervisor, `kill`) stops it like Ctrl-C: every part, and the pid file goes.
    children = up.descendants()
    os.kill(up.proc.pid, signal.SIGTERM)
    assert up.proc.wait(timeout=90) == 0
    assert not [pid for pid in children if _alive(pid)]
    assert not (up.run_dir / "switchboard-up.json").exists()
