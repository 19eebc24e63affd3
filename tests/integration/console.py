"""A test client of the console platform: send as users, read what each chat received."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx

from pipeline.stack import Stack


class ConsoleClient:
    def __init__(self, stack: Stack, bot_id: str = "demo") -> None:
        self.stack = stack
        self.bot_id = bot_id

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
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{self.url}/webhooks/console/{bot_id or self.bot_id}", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def messages(self, chat_id: str, *, bot_id: str | None = None) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.get(
                f"{self.url}/console/api/messages", params={"chat_id": chat_id, "bot_id": bot_id or self.bot_id}
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

    async def settle(self, chat_id: str, *, quiet: float = 2.0, bot_id: str | None = None) -> list[dict[str, Any]]:
        """The chat's messages once nothing new arrived for `quiet` seconds (to prove 'exactly one')."""
        last = await self.messages(chat_id, bot_id=bot_id)
        stable_since = time.monotonic()
        while time.monotonic() - stable_since < quiet:
            await asyncio.sleep(0.2)
            now = await self.messages(chat_id, bot_id=bot_id)
            if len(now) != len(last):
                last, stable_since = now, time.monotonic()
        return last


def texts(messages: list[dict[str, Any]]) -> list[str]:
    """Each message's text segments joined."""
    return ["".join(s["data"].get("text", "") for s in m["segments"] if s["type"] == "text") for m in messages]
