"""A worker killed with SIGKILL in the middle of a turn; its replacement finishes the turn.

The reply arrives exactly once and the user message was posted to the session exactly once.
"""

from __future__ import annotations

import asyncio
import re
from typing import cast

import httpx
import pytest
import redis.asyncio as aioredis

from pipeline.stack import SIM_API_KEY, Stack

from .console import ConsoleClient, texts

pytestmark = [pytest.mark.integration]


async def _until_running(stack: Stack, chat: str, timeout: float = 20.0) -> None:
    """Wait until dispatch has started the chat's turn (a fixed sleep races a slow group join)."""
    settings = stack.settings()
    client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        key = f"{settings.redis_prefix}conv:console:demo:{chat}"
        deadline = asyncio.get_running_loop().time() + timeout
        while await client.hget(key, "status") != "running":
            assert asyncio.get_running_loop().time() < deadline, "the turn never started"
            await asyncio.sleep(0.05)  # polling Redis: nothing to wait on in-process
    finally:
        await client.aclose()


async def _user_messages_in_session(stack: Stack, chat: str) -> int:
    settings = stack.settings()
    client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        session_id = cast(str | None, await client.get(f"{settings.redis_prefix}c2s:console:demo:{chat}"))
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
    got = await console.settle(chat)
    assert texts(got) == ["echo: warm up", "echo: survive this"]
    assert await _user_messages_in_session(stack, chat) == 2


async def test_sigterm_lets_the_running_turn_finish_before_the_worker_exits(
    console: ConsoleClient, stack: Stack
) -> None:
    chat = console.chat("drain")
    await console.send(chat, "[sim:think=3] finish me first")
    await _until_running(stack, chat)  # SIGTERM while the agent thinks, not before the turn starts
    worker = next(w for w in stack.workers if w.is_running)
    await worker.stop()  # SIGTERM; returns when the process has exited
    assert not worker.is_running
    # No other worker runs: the reply can only have come from the draining one. (Read from Redis:
    # no worker serves the console API now.)
    settings = stack.settings()
    client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        delivered = await client.lrange(f"{settings.redis_prefix}console:demo:{chat}", 0, -1)
    finally:
        await client.aclose()
    assert len(delivered) == 1 and "echo: finish me first" in delivered[0]
    await stack.add_worker()  # for the tests after this one
    got = await console.settle(chat)
    assert texts(got) == ["echo: finish me first"]


async def test_workers_started_at_once_each_get_their_own_run_dir(stack: Stack) -> None:
    """A replacement and another fault's worker starting together (the chaos bench does this) must
    not share a run dir: each log is one process's."""
    before = len(stack.workers)
    first, second = await asyncio.gather(stack.add_worker(), stack.add_worker())
    try:
        assert first.log_path.parent != second.log_path.parent
        assert {first.log_path.parent, second.log_path.parent}.isdisjoint(
            w.log_path.parent for w in stack.workers[:before]
        )
        for worker in (first, second):  # one start header per log (ManagedProcess writes one per spawn)
            log = worker.log_path.read_text(errors="replace")
            assert len(re.findall(r"^--- \d\d:\d\d:\d\d start: ", log, re.M)) == 1, log[:2000]
    finally:
        await asyncio.gather(first.stop(), second.stop())
