"""The fetch loop's deliveries, cut short by a rebalance: `CutShort` cancels a delivery when the
flow is suspended, as Faust's `wait_first(delivery, suspend_flow.wait())` did, in the loop's own
task, and leaves that task as it found it."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.worker.driver import CutShort


class Delivery:
    """A delivery that waits until released (as one blocked on a full executor or on Redis)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = False
        self.cancelled = False

    async def __call__(self) -> None:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True


async def test_a_delivery_runs_to_its_end_while_the_flow_runs() -> None:
    suspended = asyncio.Event()
    cut_short = CutShort(suspended)
    delivery = Delivery()
    delivery.release.set()
    assert await cut_short.run(delivery()) is True
    assert delivery.finished
    cut_short.close()


async def test_a_suspension_cuts_a_blocked_delivery_short_and_the_loop_goes_on() -> None:
    suspended = asyncio.Event()
    cut_short = CutShort(suspended)
    delivery = Delivery()

    async def loop() -> tuple[bool, bool]:
        cut = await cut_short.run(delivery())
        await asyncio.sleep(0.01)  # the loop's task is not left cancelled
        task = asyncio.current_task()
        assert task is not None
        return cut, task.cancelling() == 0

    running = asyncio.create_task(loop())
    await delivery.started.wait()
    suspended.set()
    assert await asyncio.wait_for(running, 2) == (False, True)
    assert delivery.cancelled and not delivery.finished
    cut_short.close()


async def test_a_delivery_does_not_start_while_the_flow_is_suspended() -> None:
    suspended = asyncio.Event()
    suspended.set()
    cut_short = CutShort(suspended)
    delivery = Delivery()
    assert await cut_short.run(delivery()) is False
    assert not delivery.started.is_set()


async def test_after_the_flow_resumes_the_next_suspension_cuts_again() -> None:
    suspended = asyncio.Event()
    cut_short = CutShort(suspended)
    for _ in range(2):
        delivery = Delivery()
        running = asyncio.create_task(cut_short.run(delivery()))
        await delivery.started.wait()
        suspended.set()
        assert await asyncio.wait_for(running, 2) is False
        suspended.clear()  # the rebalance is over: Faust resumes the flow
    delivery = Delivery()
    delivery.release.set()
    assert await cut_short.run(delivery()) is True
    cut_short.close()


async def test_a_suspension_as_the_delivery_ends_cancels_nothing_later() -> None:
    suspended = asyncio.Event()
    cut_short = CutShort(suspended)
    delivery = Delivery()

    async def loop() -> bool:
        await cut_short.run(delivery())
        await asyncio.sleep(0.05)  # a late cancellation would land here
        return True

    running = asyncio.create_task(loop())
    await delivery.started.wait()
    # In the same loop turn, the watch first: its callback is scheduled behind the delivery's end.
    suspended.set()
    delivery.release.set()
    assert await asyncio.wait_for(running, 2) is True
    cut_short.close()


async def test_a_stop_during_a_delivery_still_cancels_the_loop() -> None:
    suspended = asyncio.Event()
    cut_short = CutShort(suspended)
    delivery = Delivery()
    running = asyncio.create_task(cut_short.run(delivery()))
    await delivery.started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert delivery.cancelled
    cut_short.close()


async def test_a_stop_and_a_suspension_together_still_cancel_the_loop() -> None:
    suspended = asyncio.Event()
    cut_short = CutShort(suspended)
    delivery = Delivery()
    running = asyncio.create_task(cut_short.run(delivery()))
    await delivery.started.wait()
    suspended.set()
    await asyncio.sleep(0)  # the watch's callback cancels the delivery
    running.cancel()  # and the worker stops meanwhile
    with pytest.raises(asyncio.CancelledError):
        await running
    cut_short.close()
