"""`switchboard up` and the local stack: a web port someone else holds is refused with one plain
line before anything starts, the stack's worker is recognised by its own id (never another
program on the port), and the terminal shows one line per delivered message."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from pipeline.cli import LogFollower
from pipeline.embedded import PortInUseError, RedisServer, TansuBroker, free_port
from pipeline.stack import WorkerProcess
from tests.cli.support import run, worker_env


def _refusal(result: subprocess.CompletedProcess[str], port: int) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"switchboard: port {port} on 127.0.0.1: address already in use"), line
    assert f"--web-port {port + 1}" in line and "SWITCHBOARD_WEB_PORT" in line, line
    assert "starting" not in result.stdout, "the port is checked before anything starts"
    return line


def test_port_held_by_another_program(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = run("up", "--web-port", str(port), "--run-dir", str(tmp_path / "run"))
    assert "(another program holds it)" in _refusal(result, port)
    assert not (tmp_path / "run").exists()


def test_port_from_the_environment_held_by_another_program(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))  # bound, not listening: a connect is refused, a bind is not
        port = squatter.getsockname()[1]
        result = run("up", "--run-dir", str(tmp_path / "run"), env={"SWITCHBOARD_WEB_PORT": str(port)})
    _refusal(result, port)


@pytest.fixture
def other_worker(tansu_broker: TansuBroker, redis_server: RedisServer, tmp_path: Path) -> Iterator[int]:
    """A real `switchboard worker` (another Switchboard, logging JSON lines to
    `tmp_path/other-worker.log`) listening on a port; yields the port."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env |= worker_env(
        tansu_broker.bootstrap,
        redis_server.url_for_db(7),
        port,
        SWITCHBOARD_APP_ID=f"cli-other-{port}",
        SWITCHBOARD_REDIS_PREFIX=f"cli-other-{port}:",
        SWITCHBOARD_LOG_FORMAT="json",
    )
    with open(tmp_path / "other-worker.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "worker", "--stages", "ingest"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "other-worker.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
                    if json.loads(response.read()).get("status") == "ok":
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the other worker did not start"
            time.sleep(0.2)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_port_held_by_another_switchboard(other_worker: int, tmp_path: Path) -> None:
    """A worker not started by `up` (no run's pid file beside it): named by its pid, with how to stop it."""
    result = run("up", "--web-port", str(other_worker), "--run-dir", str(tmp_path / "run"))
    line = _refusal(result, other_worker)
    holder = re.search(r"\(another Switchboard, pid (\d+), holds it; stop it with `kill (\d+)`\)", line)
    assert holder is not None, line
    assert holder[1] == holder[2] and _cmdline(int(holder[1])).endswith("pipeline.cli worker --stages ingest"), line
    assert not (tmp_path / "run").exists()


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def test_worker_log_keeps_the_configured_format(other_worker: int, tmp_path: Path) -> None:
    """SWITCHBOARD_LOG_FORMAT=json: every line the worker writes is a JSON object, Faust's own
    included (Faust would otherwise replace the handler with its text format and its spinner)."""
    lines = [line for line in (tmp_path / "other-worker.log").read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]
    assert all({"ts", "level", "logger", "msg"} <= set(entry) for entry in entries)
    loggers = {entry["logger"] for entry in entries}
    assert "pipeline.runtime" in loggers and any(name.startswith("faust.") for name in loggers), loggers


async def test_the_stack_recognises_only_its_own_worker(unused_tcp_port: int) -> None:
    """Another program answering /healthz on the worker's port (the port taken after the check)
    is not taken for the stack's worker: the probe wants the id the stack gave its worker."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "instance": "someone-else"})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        worker = WorkerProcess(unused_tcp_port, {})
        worker._prepare()  # the id a start would give the process  # noqa: SLF001
        assert await worker._probe() is False  # noqa: SLF001
        worker.instance_id = "someone-else"
        assert await worker._probe() is True  # the same probe does accept the right id  # noqa: SLF001
    finally:
        await runner.cleanup()


async def test_worker_losing_its_port_is_a_port_in_use_error(
    tansu_broker: TansuBroker, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The port taken between `up`'s check and the worker's bind: the worker says so and exits,
    and the supervisor turns that into a PortInUseError (one line in `up`), not a log dump."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))  # bound, not listening: the supervisor's pre-check passes
        port = squatter.getsockname()[1]
        worker = WorkerProcess(
            port, worker_env(tansu_broker.bootstrap, redis_server.url_for_db(7), port), run_dir=tmp_path
        )
        with pytest.raises(PortInUseError) as caught:
            await worker.start()
    assert (caught.value.host, caught.value.port) == ("127.0.0.1", port)
    assert not worker.is_running


def test_log_follower_picks_turn_lines_and_warnings(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text(
        "\n--- 12:00:00 start: python -m pipeline.cli worker\n"
        "2026-01-31 12:00:01,100 INFO faust.worker: [^DrainingWorker]: Starting...\n"
        "\x08\x1b[?25h2026-01-31 12:00:02,200 INFO pipeline.turns: console:demo:c1: reply delivered, 150 ms after"
        " the webhook\n"
        "2026-01-31 12:00:03,300 WARNING pipeline.stages.egress: outbound out-1 dead-lettered: forbidden\n"
        "2026-01-31 12:00:04,400 INFO pipeline.turns: console:demo:c2: notice deliv"
    )
    follower = LogFollower(log)
    assert follower.new_lines() == [
        "  12:00:02 console:demo:c1: reply delivered, 150 ms after the webhook",
        "  12:00:03 WARNING pipeline.stages.egress: outbound out-1 dead-lettered: forbidden",
    ]
    with open(log, "a") as handle:  # the rest of a half-written line, then a JSON-format line
        handle.write("ered, 90 ms after the webhook\n")
        entry = {"ts": "2026-01-31T12:00:05.000Z", "level": "info", "logger": "pipeline.turns", "msg": "k: reply"}
        handle.write(json.dumps(entry) + "\n")
    assert follower.new_lines() == [
        "  12:00:04 console:demo:c2: notice delivered, 90 ms after the webhook",
        "  12:00:05 k: reply",
    ]
    assert follower.new_lines() == []


def _java(tmp_path: Path, version: str) -> str:
    """A directory holding a `java` that reports `version` (a machine with another JDK), for PATH."""
    bin_dir = tmp_path / "jdk" / "bin"
    bin_dir.mkdir(parents=True)
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2023-01-17' >&2\n")
    java.chmod(0o755)
    return str(bin_dir)


def test_up_falls_back_to_tansu_and_says_why_where_java_is_too_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import _embedded_broker

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", _java(tmp_path, "11.0.2") + os.pathsep + os.environ["PATH"])
    assert _embedded_broker("auto") == "tansu"
    said = capsys.readouterr().out
    assert "using the embedded Tansu broker" in said and "needs Java 17+" in said, said
    assert _embedded_broker("tansu") == "tansu"


def test_up_asked_for_kafka_without_java_17_refuses_before_starting_anything(tmp_path: Path) -> None:
    env = {"PATH": _java(tmp_path, "11.0.2") + os.pathsep + os.environ["PATH"], "JAVA_HOME": ""}
    result = run("up", "--broker", "kafka", "--web-port", str(free_port()), "--run-dir", str(tmp_path / "run"), env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "needs Java 17+" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_up_picks_apache_kafka_where_java_17_and_its_jars_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import _embedded_broker

    libs = tmp_path / "libs"
    libs.mkdir()
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", _java(tmp_path, "17.0.9") + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("SWITCHBOARD_KAFKA_LIBS", str(libs))  # jars at hand: nothing to fetch
    assert _embedded_broker("auto") == "kafka"
    assert _embedded_broker("kafka") == "kafka"
    assert "fetching" not in capsys.readouterr().out
