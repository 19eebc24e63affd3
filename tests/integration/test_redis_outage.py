"""Redis stops in the middle of the traffic: nothing is lost, nothing crashes.

With AOF (production) the restarted Redis still knows the conversation's session; without it the
conversation simply starts a new session. Either way the waiting message gets exactly one reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import cast

import pytest
import redis.asyncio as aioredis

from pipeline.stack import Stack

from .console import ConsoleClient, texts
from .stacks import running_stack

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module", params=[True, False], ids=["aof", "no-persistence"])
def own_redis_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    with running_stack("tansu", name="redis", redis_aof=request.param, partitions=2) as stack:
        yield stack


async def _session_of(stack: Stack, chat: str) -> str | None:
    settings = stack.settings()
    client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        return cast(str | None, await client.get(f"{settings.redis_prefix}c2s:console:demo:{chat}"))
    finally:
        await client.aclose()


async def test_message_sent_while_redis_is_down_is_answered_once_after_it_returns(own_redis_stack: Stack) -> None:
    stack = own_redis_stack
    assert stack.redis is not None
    console = ConsoleClient(stack)
    chat = console.chat("outage")
    await console.send(chat, "before")
    await console.wait_for(chat, 1)
    session_before = await _session_of(stack, chat)

    await stack.redis.stop()
    await console.send(chat, "during")  # ingress needs only the broker: accepted
    await asyncio.sleep(3)
    await stack.redis.start()  # same port; with AOF, same data

    # The console keeps deliveries in Redis too: without persistence the first one went with it.
    expected = ["echo: before", "echo: during"] if stack.redis_aof else ["echo: during"]
    got = await console.wait_for(chat, len(expected), timeout=60)
    got = await console.settle(chat)
    assert texts(got) == expected
    assert stack.workers[0].is_running
    session_after = await _session_of(stack, chat)
    if stack.redis_aof:
        assert session_after == session_before  # the mapping survived
    else:
        assert session_after not in (None, session_before)  # state lost: a new session, no crash
