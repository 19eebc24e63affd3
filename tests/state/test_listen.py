"""`pipeline.state.listen`: a subscription that hands on every message and ends by itself once told
to, on a real Redis. The console's live hub and the early refusals' broadcast stop through it: redis-py
can absorb a task's cancellation inside a read (the read returns nothing), so a stop that only
cancelled could wait for ever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pipeline.state import RedisPy, close_redis_py, listen, redis_py_client


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[tuple[RedisPy, RedisPy]]:
    """A subscriber's client and a publisher's."""
    client = redis_py_client(redis_url, decode_responses=True)
    publisher = redis_py_client(redis_url, decode_responses=True)
    yield client, publisher
    await close_redis_py(client)
    await close_redis_py(publisher)


async def test_every_message_is_handed_on_and_the_loop_ends_once_not_running(clients: tuple[RedisPy, RedisPy]) -> None:
    client, publisher = clients
    got: list[str] = []
    lost: list[Exception] = []
    subscribed = asyncio.Event()
    running = True
    task = asyncio.create_task(
        listen(
            client,
            "chan",
            got.append,
            subscribed=subscribed,
            on_lost=lost.append,
            running=lambda: running,
            poll_seconds=0.2,
        )
    )
    try:
        await asyncio.wait_for(subscribed.wait(), 10)
        for text in ("one", "two"):
            await publisher.publish("chan", text)
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.02)
        assert got == ["one", "two"] and lost == []
        # Not cancelled: told to stop, it ends within a poll, and says it is no longer subscribed.
        running = False
        await asyncio.wait_for(task, 2)
        assert not subscribed.is_set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_handler_that_fails_counts_as_a_lost_subscription_and_it_subscribes_again(
    clients: tuple[RedisPy, RedisPy],
) -> None:
    client, publisher = clients
    got: list[str] = []
    lost: list[Exception] = []
    subscribed = asyncio.Event()

    def on_message(text: str) -> None:
        if text == "bad":
            raise ValueError(text)
        got.append(text)

    task = asyncio.create_task(listen(client, "chan", on_message, subscribed=subscribed, on_lost=lost.append))
    try:
        await asyncio.wait_for(subscribed.wait(), 10)
        await publisher.publish("chan", "bad")
        for _ in range(100):
            if lost and subscribed.is_set():
                break
            await asyncio.sleep(0.02)
        assert [type(e) for e in lost] == [ValueError] and subscribed.is_set()
        await publisher.publish("chan", "good")
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.02)
        assert got == ["good"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
