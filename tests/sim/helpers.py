"""Shared test helpers: run a turn and collect what a subscriber sees until the session idles."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pipeline.session import (
    AgentMessage,
    Preview,
    ServerEvent,
    SessionClient,
    SessionStatusIdle,
    SystemMessage,
    TextBlock,
    UserMessage,
)


def user_message(text: str, message_id: str | None = None) -> UserMessage:
    return UserMessage(id=message_id, content=[TextBlock(text=text)])


def system_message(text: str = "reply contract") -> SystemMessage:
    return SystemMessage(content=[TextBlock(text=text)])


def segments_text(body: str) -> str:
    """The text of the single text segment of an IM reply."""
    return str(json.loads(body)["segments"][0]["data"]["text"])


async def collect_until(
    client: SessionClient,
    session_id: str,
    *,
    after: str | None,
    stop_types: tuple[str, ...] = ("session.status_idle",),
    deltas: bool = False,
    idles: int = 1,
    within: float = 10.0,
) -> list[ServerEvent | Preview]:
    """Subscribe from ``after`` and collect items until ``idles`` stop events were seen."""
    items: list[ServerEvent | Preview] = []

    async def run() -> None:
        seen = 0
        async for item in client.subscribe(session_id, after=after, deltas=deltas):
            items.append(
                item if not isinstance(item, Preview) else Preview(item.event_id, item.event_type, list(item.parts))
            )
            if not isinstance(item, Preview) and item.type in stop_types:
                seen += 1
                if seen >= idles or item.type != "session.status_idle":
                    return

    await asyncio.wait_for(run(), within)
    return items


async def turn(
    client: SessionClient, session_id: str, text: str, *, deltas: bool = False, message_id: str | None = None
) -> list[ServerEvent]:
    """Send user.message + system.message and return the events of that turn (until status_idle)."""
    echoed = await client.send(session_id, [user_message(text, message_id), system_message()])
    items = await collect_until(client, session_id, after=echoed[-1].id, deltas=deltas)
    return [i for i in items if not isinstance(i, Preview)]


def final_reply(events: list[Any]) -> str:
    messages = [e for e in events if isinstance(e, AgentMessage)]
    assert messages, "no agent.message in turn"
    return messages[-1].text


def last_idle(events: list[Any]) -> SessionStatusIdle:
    idles = [e for e in events if isinstance(e, SessionStatusIdle)]
    assert idles, "no session.status_idle"
    return idles[-1]


def types_of(events: list[Any]) -> list[str]:
    return [e.type for e in events if not isinstance(e, Preview)]
