"""A worker killed with SIGKILL in the middle of a turn; its replacement finishes the turn.

The reply arrives exactly once and the user message was posted to the session exactly once.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis.asyncio as aioredis

from pipeline.stack import SIM_API_KEY, Stack

from .console import ConsoleClient, texts

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def _user_messages_in_session(stack: Stack, chat: str) -> int:
    settings = stack.settings()
    client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        session_id = await client.get(f"{settings.redis_prefix}c2s:console:demo:{chat}")
    finally:
        await client.aclose()
    assert session_id, "the conversation has no session"
    assert stack.sim is not None
    async with httpx.AsyncClient(timeout=10, headers={"x-api-key": SIM_API_KEY}) as http:
        response = await http.get(f"{stack.sim.url}/v1/sessions/{session_id}/events", params={"limit": 100})
    response.raise_for_status()
    return sum(1 for e in response.json()["data"] if e["type"] == "user.message")


async def test_sigkill_mid_turn_delivers_the_reply_exactly_once(console: ConsoleClient, stack: Stack) -> None:
    chat = console.chat("crash")
    await console.send(chat, "warm up")
    await console.wait_for(chat, 1)

    await console.send(chat, "[sim:think=5] survive this")
    await asyncio.sleep(1.5)  # dispatched; the stream is open; the agent is thinking
    victim = stack.workers[0]
    await victim.kill()
    assert not victim.is_running
    await stack.add_worker()

    got = await console.wait_for(chat, 2, timeout=60)
    got = await console.settle(chat, quiet=4)
    assert texts(got) == ["echo: warm up", "echo: survive this"]
    assert await _user_messages_in_session(stack, chat) == 2
