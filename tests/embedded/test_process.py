"""ManagedProcess basics: SIGTERM→SIGKILL escalation, start failures, lost port races."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from pipeline.embedded import ManagedProcess, RedisServer, ServiceStartError, TansuBroker, port_open


class _Stubborn(ManagedProcess):
    """A child that ignores SIGTERM, to exercise the SIGKILL fallback."""

    name = "stubborn"
    stop_grace = 0.5

    def _command(self) -> list[str]:
        code = (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);print('up', flush=True); time.sleep(60)"
        )
        return [sys.executable, "-c", code]

    async def _probe(self) -> bool:
        return "up" in self.log_tail().splitlines()  # a line of its own, not the logged argv


class _Crasher(ManagedProcess):
    name = "crasher"

    def _command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; print('boom: bad config', flush=True); sys.exit(3)"]

    async def _probe(self) -> bool:
        return False


async def test_sigkill_after_grace():
    svc = _Stubborn()
    await svc.start()
    t0 = time.monotonic()
    await svc.stop()
    assert not svc.is_running
    assert time.monotonic() - t0 >= svc.stop_grace
    svc.cleanup()


async def test_exit_during_start_reports_log():
    svc = _Crasher()
    with pytest.raises(ServiceStartError, match="boom: bad config"):
        await svc.start()
    assert not svc.is_running
    svc.cleanup()


@pytest.mark.parametrize("listening", [True, False], ids=["listening", "bound-only"])
@pytest.mark.parametrize("cls", [TansuBroker, RedisServer])
async def test_lost_port_race_is_retried(cls, listening):
    """A picked port taken by someone else before the service binds it: start again on another.

    ``listening``: caught before spawning. ``bound-only`` (connect is refused, bind fails): caught
    from the service's own "address in use" log line.
    """
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        if listening:
            squatter.listen()
        taken = squatter.getsockname()[1]
        svc = cls()
        svc.port = taken  # simulate the race: our freshly picked port got taken
        try:
            await svc.start()
            assert svc.port != taken
            assert port_open("127.0.0.1", svc.port)
        finally:
            await svc.stop()
            svc.cleanup()


async def test_explicit_port_in_use_fails_fast():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        svc = RedisServer(port=squatter.getsockname()[1])
        with pytest.raises(ServiceStartError):
            await svc.start()
        svc.cleanup()
