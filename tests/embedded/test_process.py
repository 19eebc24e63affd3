"""ManagedProcess basics: SIGTERM→SIGKILL escalation, start failures, lost port races."""

from __future__ import annotations

import socket
import sys
import time

import httpx
import pytest

from pipeline.embedded import (
    ManagedProcess,
    PortInUseError,
    RedisServer,
    ServiceStartError,
    TansuBroker,
    free_port,
    free_ports,
    port_open,
)
from pipeline.stack import SimProcess


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


async def test_sigkill_after_grace() -> None:
    svc = _Stubborn()
    await svc.start()
    t0 = time.monotonic()
    await svc.stop()
    assert not svc.is_running
    assert time.monotonic() - t0 >= svc.stop_grace
    svc.cleanup()


async def test_exit_during_start_reports_log() -> None:
    svc = _Crasher()
    with pytest.raises(ServiceStartError, match="boom: bad config"):
        await svc.start()
    assert not svc.is_running
    svc.cleanup()


@pytest.mark.parametrize("listening", [True, False], ids=["listening", "bound-only"])
@pytest.mark.parametrize("cls", [TansuBroker, RedisServer])
async def test_lost_port_race_is_retried(cls: type[TansuBroker] | type[RedisServer], listening: bool) -> None:
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


@pytest.mark.parametrize("listening", [True, False], ids=["listening", "bound-only"])
async def test_explicit_port_in_use_is_a_port_in_use_error(listening: bool) -> None:
    """A port given by the caller is not replaced: taken, it is a PortInUseError naming it, whether
    seen before spawning (``listening``) or from the service's own log line (``bound-only``)."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        if listening:
            squatter.listen()
        port = squatter.getsockname()[1]
        svc = RedisServer(port=port)
        with pytest.raises(PortInUseError) as caught:
            await svc.start()
        assert (caught.value.service, caught.value.host, caught.value.port) == ("redis", "127.0.0.1", port)
        assert not svc.is_running
        svc.cleanup()


class _LowercaseBinder(ManagedProcess):
    """Fails the way aiohttp (the worker's web server) reports a taken port: lower case."""

    name = "binder"

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self._port_is_ours = False

    def _ports(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.port)]

    def _command(self) -> list[str]:
        message = f"OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', {self.port}): "
        return [sys.executable, "-c", f"import sys; print({message + 'address already in use'!r}); sys.exit(1)"]

    async def _probe(self) -> bool:
        return False


async def test_port_in_use_markers_ignore_case() -> None:
    svc = _LowercaseBinder(free_port())
    with pytest.raises(PortInUseError):
        await svc.start()
    svc.cleanup()


async def test_exit_code_of_a_dead_service() -> None:
    svc = _Crasher()
    with pytest.raises(ServiceStartError):
        await svc.start()
    assert svc.exit_code == 3
    svc.cleanup()


def test_ports_chosen_together_are_distinct() -> None:
    """Apache Kafka's broker and controller ports: two `free_port` calls in a row once returned the
    same port, and the broker refused to start (two listeners on one port)."""
    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports:  # and each was free: it can be bound now
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


async def test_a_stack_picked_port_taken_before_the_child_binds_it_is_replaced_a_given_one_is_not() -> None:
    """`Stack` picks its simulator's and workers' ports free a moment before the child binds them;
    another process may take one meanwhile (an outgoing connection's ephemeral port). Such a port
    is replaced; a port the caller gave is part of its contract and is refused as taken."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        with pytest.raises(PortInUseError):
            await SimProcess(taken).start()
        sim = SimProcess(taken, port_chosen_here=True)
        await sim.start()
        try:
            assert sim.port != taken
            async with httpx.AsyncClient() as client:  # serving on the port it moved to
                assert (await client.get(f"{sim.url}/_sim/stats")).status_code == 200
        finally:
            await sim.stop()
    finally:
        holder.close()
