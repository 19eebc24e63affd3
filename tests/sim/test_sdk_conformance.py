"""Conformance with the official anthropic SDK: the sim speaks the real wire format (anthropic profile).

Every event the sim emits (stream, with previews, and history) is validated with the SDK's own pydantic
types, strictly (TypeAdapter validation, not the SDK's lenient construct)."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest
from anthropic.types.beta.sessions import (
    BetaManagedAgentsSessionEvent,
    BetaManagedAgentsStreamSessionEvents,
)
from pydantic import TypeAdapter

from pipeline.sim import SimServer

from .conftest import API_KEY

STREAM_ADAPTER: TypeAdapter[Any] = TypeAdapter(BetaManagedAgentsStreamSessionEvents)
HISTORY_ADAPTER: TypeAdapter[Any] = TypeAdapter(BetaManagedAgentsSessionEvent)

SCRIPTS = [
    "plain",
    "with previews [sim:deltas] [sim:progress]",
    "team [sim:subagent]",
    "err [sim:error=retrying]",
    "bad [sim:error=exhausted]",
    "long [sim:long=300] [sim:fenced_json]",
]


@pytest.fixture
async def sdk(sim: SimServer) -> Any:
    client = anthropic.AsyncAnthropic(base_url=sim.root_url, api_key=API_KEY, max_retries=0)
    yield client
    await client.close()


async def _stream_turn(sdk: Any, sid: str, events: list[dict[str, Any]], seen: list[Any]) -> None:
    stream = await sdk.beta.sessions.events.stream(sid, event_deltas=["agent.message", "agent.thinking"])
    sent = False
    async with stream:
        # The SDK opens the stream on the call above; send once it is open.
        send = asyncio.create_task(sdk.beta.sessions.events.send(sid, events=events))
        async for event in stream:
            seen.append(event)
            if not sent:
                await send
                sent = True
            if event.type == "session.status_idle":
                break
    await send


async def test_sdk_send_stream_list_against_sim(sim: SimServer, sdk: Any) -> None:
    session = await sdk.beta.sessions.create(agent="agent-sim", environment_id="env-1")
    sid = session.id
    assert (await sdk.beta.sessions.retrieve(sid)).status == "idle"
    seen: list[Any] = []
    for n, script in enumerate(SCRIPTS):
        events = [
            {
                "type": "user.message",
                "id": f"cli-{n}",
                "content": [{"type": "text", "text": f"{script} [sim:think=0.05]"}],
            },
            {"type": "system.message", "content": [{"type": "text", "text": "contract"}]},
        ]
        await _stream_turn(sdk, sid, events, seen)
    assert {"event_start", "event_delta", "session.usage", "session.thread_created", "session.error"} <= {
        e.type for e in seen
    }

    # Strict validation of every stream event with the SDK's union (the sim's raw JSON, re-validated).
    raw_stream = [e.model_dump(mode="json", exclude_unset=True) for e in seen]
    for raw in raw_stream:
        STREAM_ADAPTER.validate_python(raw)

    history = [e async for e in sdk.beta.sessions.events.list(sid, limit=7, order="asc")]
    assert [e.id for e in history] == [e.id for e in seen if e.type not in ("event_start", "event_delta")]
    for event in history:
        HISTORY_ADAPTER.validate_python(event.model_dump(mode="json", exclude_unset=True))
    assert history[0].type == "user.message" and history[0].id == "cli-0"

    # The SDK's own send parses the echo with its types.
    interrupt = await sdk.beta.sessions.events.send(sid, events=[{"type": "user.interrupt"}])
    assert interrupt.data and interrupt.data[0].type == "user.interrupt"

    deleted = await sdk.beta.sessions.delete(sid)
    assert deleted.id == sid


async def test_sim_raw_history_validates_strictly(sim: SimServer, sdk: Any) -> None:
    """Validate the JSON straight off the wire (no SDK round trip in between)."""
    import httpx

    sid = await sim.create_session()
    events = [
        {"type": "user.message", "content": [{"type": "text", "text": "x [sim:subagent] [sim:progress]"}]},
        {"type": "system.message", "content": [{"type": "text", "text": "contract"}]},
    ]
    await sdk.beta.sessions.events.send(sid, events=events)
    async with httpx.AsyncClient(base_url=sim.root_url, headers={"x-api-key": API_KEY}) as http:
        for _ in range(100):
            page = (await http.get(f"/v1/sessions/{sid}/events", params={"limit": 1000})).json()
            if page["data"] and page["data"][-1]["type"] == "session.status_idle":
                break
            await asyncio.sleep(0.02)
    assert page["data"][-1]["type"] == "session.status_idle"
    for raw in page["data"]:
        HISTORY_ADAPTER.validate_python(raw, strict=False)
        STREAM_ADAPTER.validate_python(raw)


async def test_sdk_auth_error(sim: SimServer) -> None:
    client = anthropic.AsyncAnthropic(base_url=sim.root_url, api_key="wrong", max_retries=0)
    sid = await sim.create_session()
    with pytest.raises(anthropic.AuthenticationError):
        await client.beta.sessions.events.send(sid, events=[{"type": "user.interrupt"}])
    await client.close()
