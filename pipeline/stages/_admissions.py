"""Ingest's admissions to Redis, coalesced across fetched batches.

Most group messages produce nothing: their admission only keeps the chat's context window and
marks them seen. At moderate rates a fetch brings one or two messages, so each such batch would
cost a Redis round trip of its own. A small batch of only such messages waits instead, at most
`linger` seconds, and goes with the next batch that must go at once (a user turn, a command), in
the same script call and before it, so a turn's window still has every message that came before
it. Their records are acknowledged only once their admission is in Redis: a crash before that
replays them, and their markers keep the replay from counting twice.

A large batch of only such messages (a backlog of chatter) is started and not waited for
(`start`): ingest goes on with its next batch while Redis runs this one's script. Calls still go
one after another, each once the one before it is answered, so a turn's window is never read
before the chatter ahead of it is in.
"""

from __future__ import annotations

import asyncio
import logging

from pipeline.state import AdmissionResult, InboundAdmission
from pipeline.state.markers import MarkerStore

log = logging.getLogger(__name__)

# A batch this large is worth its own round trip (a backlog, or a busy chat): it goes at once, and
# its records are settled without a work each.
DEFER_BELOW = 16


class CoalescedAdmissions:
    def __init__(self, markers: MarkerStore, context_size: int, *, linger: float) -> None:
        self._markers = markers
        self._context_size = context_size
        self._linger = linger
        self._deferred: list[tuple[InboundAdmission, asyncio.Future[AdmissionResult]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        # The last call started and not waited for: the next call goes once it is answered.
        self._started: asyncio.Task[list[AdmissionResult]] | None = None

    def deferrable(self, items: list[InboundAdmission]) -> bool:
        """Whether the batch may wait: a small one whose messages all settle at admission."""
        return 0 < len(items) < DEFER_BELOW and self._linger > 0 and _settle(items)

    def startable(self, items: list[InboundAdmission]) -> bool:
        """Whether the batch may be started and not waited for: a large one whose messages all
        settle at admission (nothing of the batch needs its result to go on)."""
        return len(items) >= DEFER_BELOW and _settle(items)

    def start(self, items: list[InboundAdmission]) -> asyncio.Task[list[AdmissionResult]]:
        """Admit `items` (after every deferred admission, in the same call) once the call started
        before is answered; the caller need not wait. Per item, the task gives its result."""
        task = asyncio.get_running_loop().create_task(self._after(self._started, items))
        self._started = task
        return task

    async def now(self, items: list[InboundAdmission]) -> list[AdmissionResult]:
        """Admit `items` at once (once a started call is answered), after every deferred
        admission (in the same script call)."""
        return await self._after(self._started, items)

    async def _after(
        self, started: asyncio.Task[list[AdmissionResult]] | None, items: list[InboundAdmission]
    ) -> list[AdmissionResult]:
        if started is not None and not started.done():
            await asyncio.wait([started])  # its outcome is its own callers'
        return await self._call(items)

    async def _call(self, items: list[InboundAdmission]) -> list[AdmissionResult]:
        deferred, self._deferred = self._deferred, []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            results = await self._markers.admit_inbound([i for i, _ in deferred] + items, self._context_size)
        except Exception as exc:
            for _, future in deferred:
                future.set_exception(exc)
            raise
        except asyncio.CancelledError:  # they go with the next call (a repeat finds their markers)
            self._deferred[:0] = deferred
            if self._deferred and self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self._linger, self._linger_over)
            raise
        # Each future is resolved here once (its work awaits it shielded: a cancelled work leaves it be).
        for (_, future), result in zip(deferred, results, strict=False):
            future.set_result(result)
        return results[len(deferred) :]

    def later(self, items: list[InboundAdmission]) -> list[asyncio.Future[AdmissionResult]]:
        """Admit `items` with the next call that goes at once, or after the linger: per item, the
        future of its result."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self._deferred.extend(zip(items, futures, strict=True))
        if self._timer is None:
            self._timer = loop.call_later(self._linger, self._linger_over)
        return futures

    def _linger_over(self) -> None:
        self._timer = None
        if self._deferred:
            task = asyncio.get_running_loop().create_task(self._flush())
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush(self) -> None:
        try:
            await self.now([])
        except Exception as exc:  # each waiting work has it too, and admits its message again alone
            log.warning("ingest: a coalesced admission failed: %s", type(exc).__name__)


def _settle(items: list[InboundAdmission]) -> bool:
    return all(i.mark and not i.want_window for i in items)
