"""Event-loop stalls, measured and explained.

A task wakes every `interval` seconds; how late it wakes is how long something else held the loop
(`switchboard_event_loop_lag_seconds`, and `switchboard_event_loop_stalls_total` for a second or
more). Faust's own livelock warning says only that a timer overlapped. A watchdog thread sees when
the loop has not ticked for `dump_after` seconds and writes every thread's stack to stderr (the
worker's log) with `faulthandler`, so a stall names the code holding the loop while it holds it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import sys
import threading
import time

from pipeline import metrics

log = logging.getLogger(__name__)

STALL_SECONDS = 1.0


class LoopWatch:
    def __init__(self, *, interval: float = 0.1, dump_after: float = 0.0) -> None:
        self.interval = interval
        self.dump_after = dump_after  # 0: no stack dumps
        self.max_lag = 0.0
        self._last_tick = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._watchdog: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        if self._task is not None:
            return
        self._last_tick = time.monotonic()
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="loop-watch")
        if self.dump_after > 0:
            self._watchdog = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
            self._watchdog.start()

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._watchdog is not None:
            await asyncio.to_thread(self._watchdog.join)
            self._watchdog = None

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.interval)
            self._last_tick = time.monotonic()
            self.observe(time.perf_counter() - started - self.interval)

    def observe(self, lag: float) -> None:
        lag = max(0.0, lag)
        self.max_lag = max(self.max_lag, lag)
        metrics.EVENT_LOOP_LAG.observe(lag)
        if lag >= STALL_SECONDS:
            metrics.EVENT_LOOP_STALLS.inc()
            log.warning("the event loop was held for %.2f s", lag)

    def _watch(self) -> None:
        """One dump per stall: the loop must tick again before the next one."""
        dumped_for = -1.0
        while not self._stopping.wait(min(self.dump_after / 4, 1.0)):
            last = self._last_tick
            if time.monotonic() - last >= self.dump_after and last != dumped_for:
                dumped_for = last
                out = sys.__stderr__
                if out is not None:
                    print(f"the event loop has been held for {self.dump_after:.1f} s; every thread's stack:", file=out)
                    faulthandler.dump_traceback(file=out, all_threads=True)
