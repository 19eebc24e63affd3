"""A test client of the console platform: send as users, read what each chat received, follow a
chat's live stream. With `token`, every request carries `Authorization: Bearer <token>`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import redis.asyncio as aioredis

from pipeline.bench.measure import TLS, metric_sum, scrape_metrics
from pipeline.stack import Stack

from .stacks import stack_idle


class ConsoleClient:
    def __init__(self, stack: Stack, bot_id: str = "demo", token: str | None = None) -> None:
        self.stack = stack
        self.bot_id = bot_id
        self.token = token

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def url(self) -> str:
        alive = [w for w in self.stack.workers if w.is_running]
        return (alive or self.stack.workers)[0].url

    def chat(self, prefix: str = "chat") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        user_id: str = "u1",
        user_name: str = "Ann",
        chat_type: str = "private",
        mentions: list[str] | None = None,
        message_id: str | None = None,
        bot_id: str | None = None,
        is_admin: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "chat_id": chat_id,
            "chat_type": chat_type,
            "user_id": user_id,
            "user_name": user_name,
            "text": text,
            "is_admin": is_admin,
        }
        if mentions:
            body["mentions"] = mentions
        if message_id:
            body["message_id"] = message_id
        async with httpx.AsyncClient(timeout=30, verify=TLS) as client:
            response = await client.post(
                f"{self.url}/webhooks/console/{bot_id or self.bot_id}", json=body, headers=self.headers
            )
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def messages(self, chat_id: str, *, bot_id: str | None = None) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=30, verify=TLS) as client:
            response = await client.get(
                f"{self.url}/console/api/messages",
                params={"chat_id": chat_id, "bot_id": bot_id or self.bot_id},
                headers=self.headers,
            )
        assert response.status_code == 200, response.text
        return list(response.json()["messages"])

    async def wait_for(
        self, chat_id: str, count: int, *, timeout: float = 30.0, bot_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Wait until the chat has at least `count` messages; return them all."""
        deadline = time.monotonic() + timeout
        while True:
            got = await self.messages(chat_id, bot_id=bot_id)
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{chat_id}: {len(got)} of {count} messages after {timeout}s: {got}")
            await asyncio.sleep(0.1)

    async def all_answered(self, chats: list[str], count: int, *, since: float) -> tuple[dict[str, list[str]], float]:
        """Wait until every chat has `count` messages: their texts once the stack is idle (to prove
        'exactly one'), and the seconds from `since` (a `time.monotonic()`) until they were all there."""
        for chat in chats:
            await self.wait_for(chat, count, timeout=90)
        seconds = time.monotonic() - since
        await stack_idle(self.stack)
        return {chat: texts(await self.messages(chat)) for chat in chats}, seconds

    async def session_of(self, chat_id: str, *, bot_id: str | None = None) -> str | None:
        """The session the chat is mapped to in Redis (None before its first turn starts)."""
        settings = self.stack.settings()
        client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
        try:
            key = f"{settings.redis_prefix}c2s:console:{bot_id or self.bot_id}:{chat_id}"
            return cast(str | None, await client.get(key))
        finally:
            await client.aclose()

    async def session_started(self, chat_id: str, *, timeout: float = 30.0) -> None:
        """Until the chat's first turn has a session: messages sent from now on find it running
        (a fixed sleep is too short on a busy machine)."""
        deadline = time.monotonic() + timeout
        while await self.session_of(chat_id) is None:
            assert time.monotonic() < deadline, f"{chat_id}: no session after {timeout} s"
            await asyncio.sleep(0.05)

    async def stack_idle(self) -> None:
        await stack_idle(self.stack)

    async def worker_idle(self) -> bool:
        """This moment's `switchboard_worker_idle` of the worker the client talks to."""
        return metric_sum(await scrape_metrics(self.url), "switchboard_worker_idle") == 1.0

    async def settle(self, chat_id: str, *, bot_id: str | None = None) -> list[dict[str, Any]]:
        """The chat's messages once the stack has nothing in flight (to prove 'exactly one')."""
        await stack_idle(self.stack)
        return await self.messages(chat_id, bot_id=bot_id)

    @contextlib.asynccontextmanager
    async def stream(self, chat_id: str, *, after: int = 0, url: str | None = None) -> AsyncIterator[LiveStream]:
        """The chat's live stream (`/console/api/stream`), open until the block ends."""
        params = {"chat_id": chat_id, "bot_id": self.bot_id, "after": str(after)}
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(30, read=60), verify=TLS) as client,
            client.stream("GET", f"{url or self.url}/console/api/stream", params=params, headers=self.headers) as r,
        ):
            yield LiveStream(r)


class LiveStream:
    """Server-sent events of one console stream: each message with its seq; the status notes read
    on the way are kept in `notes`."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()
        self.notes: list[dict[str, Any]] = []

    async def next(self, timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
        fields: dict[str, str] = {}
        async with asyncio.timeout(timeout):
            async for line in self._lines:
                if line == "" and fields.get("event") == "note":
                    assert "id" not in fields  # a note never moves the page's `after`
                    self.notes.append(json.loads(fields["data"]))
                    fields = {}
                elif line == "" and "data" in fields:
                    return int(fields["id"]), json.loads(fields["data"])
                if line and not line.startswith(":"):
                    key, _, value = line.partition(": ")
                    fields[key] = value
        raise EOFError("the stream ended")

    async def rest(self, timeout: float = 10.0) -> bytes:
        """Everything until the server ends the stream."""
        async with asyncio.timeout(timeout):
            return b"".join([chunk async for chunk in self.response.aiter_bytes()])


def texts(messages: list[dict[str, Any]]) -> list[str]:
    """Each message's text segments joined."""
    return ["".join(s["data"].get("text", "") for s in m["segments"] if s["type"] == "text") for m in messages]
