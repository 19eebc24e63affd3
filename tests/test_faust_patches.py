"""The faust-streaming patches: the resumed-coroutine driver and the delivery fast path."""

from __future__ import annotations

import asyncio

import pytest
from faust.transport.consumer import Consumer
from mode.utils.locks import Event

from pipeline import faust_patches
from pipeline.faust_patches import _resume


async def _waits_on(future: asyncio.Future[int]) -> int:
    return await future + 1


async def test_a_stepped_coroutine_finishes_with_the_future_result() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    coro = _waits_on(future)
    pending = coro.send(None)
    assert pending is future  # it stopped on the future
    task = asyncio.ensure_future(_resume(coro, pending))
    await asyncio.sleep(0)
    assert not task.done()
    future.set_result(41)
    assert await task == 42


async def test_a_stepped_coroutine_sees_cancellation_and_errors() -> None:
    loop = asyncio.get_running_loop()
    cleaned = []

    async def guarded(future: asyncio.Future[None]) -> None:
        try:
            await future
        finally:
            cleaned.append(True)

    future: asyncio.Future[None] = loop.create_future()
    coro = guarded(future)
    task = asyncio.ensure_future(_resume(coro, coro.send(None)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]

    failing: asyncio.Future[int] = loop.create_future()
    coro2 = _waits_on(failing)
    task2 = asyncio.ensure_future(_resume(coro2, coro2.send(None)))
    failing.set_exception(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        await task2


class _ConsumerLike:
    """What the patched `wait_first` reads of a consumer."""

    def __init__(self) -> None:
        self.suspend_flow = Event()
        self.should_stop = False


async def test_delivery_that_does_not_wait_skips_the_tasks() -> None:
    faust_patches.apply()
    consumer = _ConsumerLike()
    delivered = []

    async def deliver() -> str:
        delivered.append(1)
        return "ok"

    before = len(asyncio.all_tasks())
    result = await Consumer.wait_first(consumer, deliver(), consumer.suspend_flow.wait())  # type: ignore[arg-type]
    assert delivered == [1]
    assert result.done and result.results == ["ok"] and not result.stopped
    assert len(asyncio.all_tasks()) == before  # no task was made for it
