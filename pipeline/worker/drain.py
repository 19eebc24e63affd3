"""Graceful stop: on the first SIGTERM a worker takes no new turns and lets the running ones
finish (through render and egress) for a bounded time before Faust stops; the rest resumes on the
partitions' next owner."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import faust
from faust.types import TP

log = logging.getLogger(__name__)


class DrainedConsumer(Protocol):
    def assignment(self) -> set[TP]: ...

    def highwater(self, tp: TP) -> int | None: ...

    def read_offset(self, tp: TP) -> int | None: ...

    def pause_partitions(self, tps: Iterable[TP]) -> None: ...


@dataclass
class Drain:
    """What a drain watches: the consumer, the topics whose new records start turns, and how
    many turns are still in flight (streams held, executor work pending)."""

    consumer: DrainedConsumer
    intake_topics: frozenset[str]
    busy: Callable[[], bool]
    # A turn's last records travel through the broker between stages, where neither streams nor
    # executors see them: quiet must outlast a few fetch round trips.
    quiet_seconds: float = 0.5
    poll_seconds: float = 0.1

    async def run(self, seconds: float) -> bool:
        """Pause intake and wait until nothing is in flight (True) or `seconds` pass (False)."""
        if seconds <= 0:
            return True
        with contextlib.suppress(Exception):  # no assignment yet, or a rebalance under way
            self.consumer.pause_partitions({tp for tp in self.consumer.assignment() if tp.topic in self.intake_topics})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        quiet_since: float | None = None
        while loop.time() < deadline:
            if self.busy() or self.unread_downstream():
                quiet_since = None
            elif quiet_since is None:
                quiet_since = loop.time()
            elif loop.time() - quiet_since >= self.quiet_seconds:
                log.info("drained: no turn in flight")
                return True
            await asyncio.sleep(self.poll_seconds)
        log.warning("drain time over with turns in flight; they resume on the next owner")
        return False

    def unread_downstream(self) -> bool:
        """Records waiting in our partitions of the topics after intake (as far as the last fetch
        responses tell: their high watermarks against what was read)."""
        return self._unread(skip=self.intake_topics)

    def idle(self) -> bool:
        """Nothing in flight on this worker: partitions assigned, every record the last fetches
        saw read, no executor work pending, no turn in flight. Tests and the bench wait on this
        (the `switchboard_worker_idle` gauge) instead of a fixed quiet time; records still on their
        way between stages are seen a fetch later, so a caller wants it true for a few fetches."""
        try:
            if not self.consumer.assignment():
                return False
        except Exception:  # during a rebalance
            return False
        return not (self.busy() or self._unread(skip=frozenset()))

    def _unread(self, *, skip: frozenset[str]) -> bool:
        try:
            for tp in self.consumer.assignment():
                if tp.topic in skip:
                    continue
                highwater = self.consumer.highwater(tp)
                read = self.consumer.read_offset(tp)  # None: nothing read yet (quiet time covers it)
                if highwater is not None and read is not None and highwater > read + 1:
                    return True
        except Exception:  # during a rebalance: nothing to tell
            log.debug("unread check skipped", exc_info=True)
        return False


class DrainingWorker(faust.Worker):
    """A Faust worker whose first SIGTERM drains the turns in flight before stopping (a second
    SIGTERM, or SIGINT, stops at once). `drain` is set by the app's service once it runs.

    mode's worker installs its signal handlers in `install_signal_handlers`; this one then puts
    its own on SIGTERM (asyncio's `add_signal_handler` replaces a handler), and stops the worker the
    way its SIGINT does: by raising SIGINT, whose handler stays mode's."""

    drain: Callable[[], Awaitable[Any]] | None = None
    draining = False
    drain_task: asyncio.Future[None] | None = None

    def install_signal_handlers(self) -> None:
        super().install_signal_handlers()
        if sys.platform != "win32":
            self.loop.add_signal_handler(signal.SIGTERM, self.on_sigterm)

    def on_sigterm(self) -> None:
        if self.draining or self.drain is None:
            self.stop_by_signal()
            return
        self.draining = True
        drain = self.drain

        async def drain_then_stop() -> None:
            try:
                await drain()
            finally:
                self.stop_by_signal()

        self.drain_task = asyncio.ensure_future(drain_then_stop(), loop=self.loop)

    def stop_by_signal(self) -> None:
        log.info("SIGTERM: stopping")
        signal.raise_signal(signal.SIGINT)
