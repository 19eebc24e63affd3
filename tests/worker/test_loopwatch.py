"""The loop watch measures how long the event loop was held and, past a bound, writes the stacks
of the code holding it to stderr while it still holds it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

from pipeline import metrics
from pipeline.worker.loopwatch import LoopWatch
from tests.event_loop import hold_the_loop
from tests.metric_values import current


def _stalls() -> float:
    return current(metrics.EVENT_LOOP_STALLS)


async def test_a_held_loop_is_measured_and_counted() -> None:
    watch = LoopWatch(interval=0.02)
    watch.start()
    await asyncio.sleep(0.1)  # it ticks
    # What the loop lagged before the hold is not asserted (a loaded machine lags it too); the hold's
    # effect is: one stall counted across it, and a lag of at least the hold's own length.
    before = _stalls()
    hold_the_loop(1.1)
    await asyncio.sleep(0.1)
    await watch.stop()
    assert watch.max_lag >= 1.0
    assert _stalls() == before + 1


def test_only_a_lag_of_a_second_or_more_is_a_stall() -> None:
    # The threshold itself, without a clock: observe() is what each tick reports.
    watch = LoopWatch()
    before = _stalls()
    watch.observe(0.99)
    watch.observe(-0.01)  # a tick a little early is no lag
    assert (_stalls(), watch.max_lag) == (before, 0.99)
    watch.observe(1.0)
    assert (_stalls(), watch.max_lag) == (before + 1, 1.0)


def test_a_stall_dumps_the_stack_that_holds_the_loop() -> None:
    program = textwrap.dedent(
        """
        import asyncio, time
        from pipeline.worker.loopwatch import LoopWatch

        def hold_the_loop_for_a_while():
            time.sleep(1.5)

        async def main():
            watch = LoopWatch(interval=0.05, dump_after=0.5)
            watch.start()
            await asyncio.sleep(0.2)
            hold_the_loop_for_a_while()
            await asyncio.sleep(0.1)
            await watch.stop()

        asyncio.run(main())
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert "hold_the_loop_for_a_while" in done.stderr
    assert "the event loop was held for" in done.stderr


def test_no_dump_without_a_stall() -> None:
    program = textwrap.dedent(
        """
        import asyncio
        from pipeline.worker.loopwatch import LoopWatch

        async def main():
            watch = LoopWatch(interval=0.05, dump_after=0.5)
            watch.start()
            await asyncio.sleep(1.2)
            await watch.stop()
            await asyncio.sleep(0.8)  # past the last arming: cancelled on stop

        asyncio.run(main())
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert "Thread" not in done.stderr and "File" not in done.stderr
