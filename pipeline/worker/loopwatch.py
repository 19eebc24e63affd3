"""Event-loop stalls, measured and explained.

A task wakes every `interval` seconds; how late it wakes is how long something else held the loop
(`switchboard_event_loop_lag_seconds`, and `switchboard_event_loop_stalls_total` for a second or
more). Faust's own livelock warning says only that a timer overlapped. When the loop has not ticked
for `dump_after` seconds, `faulthandler`'s watchdog thread writes every thread's stack to stderr
(the worker's log), so a stall names the code that held the loop while it still holds it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import sys
import time

from pipeline import metrics

log = logging.getLogger(__name__)

STALL_SECONDS = 1.0


class LoopWatch:
    def __init__(self, *, interval: float = 0.1, dump_after: float = 0.0) -> None:
        self.interval = interval
        self.dump_after = dump_after  # 0: no stack dumps
        self.max_lag = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="loop-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.dump_after > 0:
            faulthandler.cancel_dump_traceback_later()

    async def _run(self) -> None:
        dump_to = sys.__stderr__ if self.dump_after > 0 else None
        try:
            while True:
                if dump_to is not None:
                    # Re-armed every tick: it fires only if the loop misses ticks for `dump_after`.
                    faulthandler.dump_traceback_later(self.dump_after, exit=False, file=dump_to)
                started = time.perf_counter()
                await asyncio.sleep(self.interval)
                self.observe(time.perf_counter() - started - self.interval)
        finally:
            if dump_to is not None:
                faulthandler.cancel_dump_traceback_later()

    def observe(self, lag: float) -> None:
        lag = max(0.0, lag)
        self.max_lag = max(self.max_lag, lag)
        metrics.EVENT_LOOP_LAG.observe(lag)
        if lag >= STALL_SECONDS:
            metrics.EVENT_LOOP_STALLS.inc()
            log.warning("the event loop was held for %.2f s (stacks are dumped after %.1f s)", lag, self.dump_after)
