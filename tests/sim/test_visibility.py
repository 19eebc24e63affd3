"""P6 (previews), P7 (sub-agent visibility), P8 (session_thread_id on stream only), no replay."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.session import SessionClient
from pipeline.session.models import EventDelta, EventStart
from pipeline.sim import SimServer

from .helpers import system_message, user_message


async def _read_stream(
    client: SessionClient, sid: str, deltas: tuple[str, ...], out: list[Any], ready: asyncio.Event
) -> None:
    async with client.stream(sid, deltas=deltas) as events:
        ready.set()
        async for event in events:
            out.append(event)
            if event.type in ("session.status_idle", "session.deleted"):
                return


async def _with_streams(
    sim: SimServer, client: SessionClient, sid: str, text: str, *deltas_per_stream: tuple[str, ...]
) -> list[list[Any]]:
    outputs: list[list[Any]] = [[] for _ in deltas_per_stream]
    readies = [asyncio.Event() for _ in deltas_per_stream]
    tasks = [
        asyncio.create_task(_read_stream(client, sid, deltas, out, ready))
        for deltas, out, ready in zip(deltas_per_stream, outputs, readies, strict=True)
    ]
    await asyncio.gather(*(r.wait() for r in readies))
    await client.send(sid, [user_message(text), system_message()])
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    return outputs


async def test_previews_only_to_subscribers_that_asked_and_never_in_history(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    with_deltas, without = await _with_streams(sim, ark, sid, "hello there [sim:deltas]", ("agent.message",), ())
    previews = [e for e in with_deltas if isinstance(e, EventStart | EventDelta)]
    assert previews and isinstance(previews[0], EventStart)
    final = next(e for e in with_deltas if e.type == "agent.message")
    assert previews[0].event.id == final.id and previews[0].event.type == "agent.message"
    assert all(isinstance(p, EventStart) or p.event_id == final.id for p in previews)
    assert "".join(p.delta.text for p in previews if isinstance(p, EventDelta)) == final.text
    assert all(p.id and p.id.startswith("sevt-") and p.processed_at for p in previews)  # own id/processed_at
    assert previews[0].id != final.id
    assert not any(e.type in ("event_start", "event_delta") for e in without)
    history = [e async for e in ark.list(sid)]
    assert not any(e.type in ("event_start", "event_delta") for e in history)
    # Apart from previews both streams saw exactly the history.
    assert [e.id for e in with_deltas if e.type not in ("event_start", "event_delta")] == [e.id for e in history]
    assert [e.id for e in without] == [e.id for e in history]


async def test_anthropic_bracket_delta_encoding(sim: SimServer, anthropic_client: SessionClient) -> None:
    sid = await sim.create_session()
    (events,) = await _with_streams(sim, anthropic_client, sid, "hi [sim:deltas]", ("agent.message",))
    assert any(e.type == "event_delta" for e in events)


async def test_subagent_visibility(sim: SimServer, ark: SessionClient) -> None:
    """P7: lifecycle and collaboration messages and custom tool calls of the sub-thread only; P8: the
    stream adds session_thread_id on the sub-thread's agent events, history omits it."""
    sid = await sim.create_session()
    (stream_events,) = await _with_streams(sim, ark, sid, "dig [sim:subagent] [sim:custom_tool=fetch]", ())
    created = next(e for e in stream_events if e.type == "session.thread_created")
    thread_id = created.session_thread_id
    assert thread_id.startswith("sthr-") and created.agent_name == "researcher"
    sub_thread_events = [e for e in stream_events if getattr(e, "session_thread_id", None) == thread_id]
    assert {e.type for e in sub_thread_events} == {
        "session.thread_created",
        "session.thread_status_running",
        "agent.custom_tool_use",
    }
    # Nothing private of the sub-thread (thinking, plain replies, spans) shows up.
    assert not any(e.type == "agent.thinking" for e in stream_events)
    custom = next(e for e in stream_events if e.type == "agent.custom_tool_use")
    history = {e.id: e for e in [e async for e in ark.list(sid)]}
    assert history[custom.id].session_thread_id is None  # type: ignore[union-attr]
    assert stream_events[-1].type == "session.status_idle"


async def test_subagent_full_cycle(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    (events,) = await _with_streams(sim, ark, sid, "dig [sim:subagent]", ())
    kinds = [e.type for e in events]
    assert kinds.index("session.thread_created") < kinds.index("agent.thread_message_sent")
    assert kinds.index("agent.thread_message_received") < kinds.index("agent.message")
    received = next(e for e in events if e.type == "agent.thread_message_received")
    assert received.from_agent_name == "researcher"
    thread_idles = [e for e in events if e.type == "session.thread_status_idle"]
    # The LAST thread idle before usage is the main thread's (P9).
    assert thread_idles[-1].session_thread_id != received.from_session_thread_id
    assert kinds[-3:] == ["session.thread_status_idle", "session.usage", "session.status_idle"]


async def test_stream_does_not_replay(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    await ark.send(sid, [user_message("before"), system_message()])
    for _ in range(50):
        if sim.sessions[sid].status == "idle" and sim.sessions[sid].log[-1]["type"] == "session.status_idle":
            break
        await asyncio.sleep(0.02)
    (events,) = await _with_streams(sim, ark, sid, "after", ())
    assert events[0].type == "user.message"
    assert "echo: after" in next(e for e in events if e.type == "agent.message").text


async def test_ping_keepalive_is_sent(sim: SimServer) -> None:
    import httpx

    sid = await sim.create_session()
    async with (
        httpx.AsyncClient(base_url=sim.base_url("ark"), headers={"Authorization": "Bearer test-key"}) as http,
        http.stream("GET", f"/sessions/{sid}/events/stream") as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                assert line == "event: ping"
                break
