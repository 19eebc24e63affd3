"""`switchboard up` says "switchboard is up", and `/readyz` says ready, only once the worker's
stages consume: a message sent at once is answered about as fast as the ones after it. Before that
the worker already serves (health, webhooks) while its consumer group joins, which takes seconds
on the embedded broker (its initial rebalance delay)."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import pytest

from pipeline.stack import Stack, WorkerProcess
from tests.cli.support import Up
from tests.integration.console import ConsoleClient

pytestmark = [pytest.mark.integration]


async def _answer_seconds(console: ConsoleClient, text: str) -> float:
    chat = console.chat("ready")  # a new chat each time: every message starts a session, as the first does
    started = time.monotonic()
    await console.send(chat, text)
    await console.wait_for(chat, 1, timeout=60)
    return time.monotonic() - started


async def _watch_readyz(url: str, seen: list[tuple[int, dict[str, Any]]], stop: asyncio.Event) -> None:
    """Record each answer of /readyz (status, body) while the worker starts."""
    async with httpx.AsyncClient(timeout=2.0) as http:
        while not stop.is_set():
            try:
                response = await http.get(url + "/readyz")
                seen.append((response.status_code, response.json()))
            except httpx.HTTPError:
                pass  # not listening yet
            await asyncio.sleep(0.1)


async def test_the_first_message_after_the_banner_is_answered_like_the_next(up: Up) -> None:
    worker = WorkerProcess(up.port, {})
    seen: list[tuple[int, dict[str, Any]]] = []
    banner_seen = asyncio.Event()
    watching = asyncio.create_task(_watch_readyz(worker.url, seen, banner_seen))
    try:
        await asyncio.to_thread(up.wait_for_banner)
    finally:
        banner_seen.set()
        await watching
    # While joining, the worker answered and said why it was not ready yet.
    assert any(status == 503 and body["checks"].get("consuming") is False for status, body in seen), seen
    async with httpx.AsyncClient(timeout=2.0) as http:
        ready = await http.get(worker.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["consuming"] is True, ready.text

    # The client finds the worker's URL through a stack: one that names `up`'s worker.
    console = ConsoleClient(Stack(workers=[worker]))
    first = await _answer_seconds(console, "first")
    later = [await _answer_seconds(console, f"later {i}") for i in range(5)]
    # A ratio with a generous bound: catches the seconds of a join, not the noise of a busy machine.
    bound = 3 * statistics.median(later) + 1.0
    assert first <= bound, f"first {first:.2f} s, then {', '.join(f'{s:.2f}' for s in later)}"
