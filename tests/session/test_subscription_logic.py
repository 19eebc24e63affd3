"""Subscription resume logic (open stream, read history after cursor, dedup by id) and preview
accumulation, over httpx.MockTransport."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.session import Preview, RetryPolicy, SessionClient
from pipeline.session.models import EventDelta, EventStart, parse_server_event
from pipeline.session.previews import PreviewAccumulator


def ev(frame_or_event_id: str, kind: str = "session.status_running", **fields: Any) -> dict[str, Any]:
    return {"type": kind, "id": frame_or_event_id, "processed_at": "2026-01-01T00:00:00Z", **fields}


def sse(*events: dict[str, Any], ping: bool = True) -> bytes:
    frames = [b"event: ping\ndata: {}\n\n"] if ping else []
    frames += [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]
    return b"".join(frames)


def message(event_id: str, text: str) -> dict[str, Any]:
    return ev(event_id, "agent.message", content=[{"type": "text", "text": text}])


def start(frame_id: str, target: str) -> dict[str, Any]:
    return ev(frame_id, "event_start", event={"type": "agent.message", "id": target})


def delta(frame_id: str, target: str, text: str, index: int = 0, ark_shape: bool = False) -> dict[str, Any]:
    content: Any = [{"type": "text", "text": text}] if ark_shape else {"type": "text", "text": text}
    return ev(
        frame_id, "event_delta", event_id=target, delta={"type": "content_delta", "index": index, "content": content}
    )


class ScriptedServer:
    """Per connection: (history after the cursor, stream body). Records the cursors asked for."""

    def __init__(self, connections: list[tuple[list[dict[str, Any]], bytes]]) -> None:
        self.connections = connections
        self.stream_count = 0
        self.history_after: list[str | None] = []
        self.stream_params: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/stream"):
            self.stream_params.append(str(request.url.params))
            self.stream_count += 1
            if self.stream_count > len(self.connections):
                return httpx.Response(503)
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=self.connections[self.stream_count - 1][1]
            )
        self.history_after.append(request.url.params.get("after"))
        history = self.connections[self.stream_count - 1][0]
        return httpx.Response(200, json={"data": history, "next_page": None})


def make_client(server: ScriptedServer) -> SessionClient:
    return SessionClient(
        api_key="k",
        base_url="http://sim.test/api/v3",
        transport=httpx.MockTransport(server),
        retry=RetryPolicy(max_attempts=2, base_delay=0),
    )


async def collect(client: SessionClient, **options: Any) -> tuple[list[Any], Any]:
    subscription = client.subscribe("s", reconnect_base=0, **options)
    items: list[Any] = []
    async for item in subscription:
        items.append(Preview(item.event_id, item.event_type, list(item.parts)) if isinstance(item, Preview) else item)
    return items, subscription


async def test_resume_dedups_overlap_and_keeps_server_order() -> None:
    server = ScriptedServer(
        [
            # Connection 1: history has e1,e2; the stream (opened first) also carries e2, then e3.
            ([ev("e1"), ev("e2")], sse(ev("e2"), ev("e3"))),
            # Connection 2 (the stream ended without a terminal event): resume after e3.
            ([ev("e4")], sse(ev("e4"), ev("e5", "session.usage"), ev("e6", "session.deleted"))),
        ]
    )
    async with make_client(server) as client:
        items, subscription = await collect(client)
    assert [i.id for i in items] == ["e1", "e2", "e3", "e4", "e5", "e6"]
    assert server.history_after == [None, "e3"]
    assert subscription.cursor == "e6" and subscription.finished and subscription.reconnects == 1


async def test_same_processed_at_is_never_deduplicated() -> None:
    """P10: usage and idle share processed_at; both are delivered, in server order."""
    server = ScriptedServer(
        [
            (
                [],
                sse(
                    ev("sevt-usg-sevt-i", "session.usage"),
                    ev("sevt-i", "session.status_idle", stop_reason={"type": "end_turn"}),
                    ev("d", "session.deleted"),
                ),
            )
        ]
    )
    async with make_client(server) as client:
        items, _ = await collect(client)
    assert [i.type for i in items] == ["session.usage", "session.status_idle", "session.deleted"]


async def test_previews_accumulate_and_final_message_replaces_them() -> None:
    stream = sse(
        start("p1", "m1"),
        delta("p2", "m1", "Hel"),
        delta("p3", "m1", "lo", ark_shape=True),
        message("m1", "Hello"),
        ev("end", "session.status_terminated"),
    )
    server = ScriptedServer([([], stream)])
    async with make_client(server) as client:
        items, subscription = await collect(client, deltas=True)
    previews = [i for i in items if isinstance(i, Preview)]
    assert [p.text for p in previews] == ["", "Hel", "Hello"]
    assert all(p.event_id == "m1" for p in previews)
    assert [i.id for i in items if not isinstance(i, Preview)] == ["m1", "end"]
    assert subscription.cursor == "end"  # preview frame ids never become the cursor
    assert server.stream_params == ["event_deltas=agent.message"]


async def test_previews_dropped_without_deltas_and_for_events_history_delivered() -> None:
    stream = sse(start("p1", "m1"), delta("p2", "m1", "x"), message("m1", "x"), ev("end", "session.deleted"))
    server = ScriptedServer([([message("m1", "x")], stream)])
    async with make_client(server) as client:
        items, _ = await collect(client, deltas=True)
    assert [i.id for i in items] == ["m1", "end"]


async def test_dedup_memory_is_released_after_the_overlap() -> None:
    server = ScriptedServer([([ev("e1"), ev("e2")], sse(ev("e1"), ev("e2"), ev("e3"), ev("end", "session.deleted")))])
    async with make_client(server) as client:
        _, subscription = await collect(client)
    assert len(subscription._overlap) == 0  # noqa: SLF001


def test_accumulator_indexes_and_bounds() -> None:
    accumulator = PreviewAccumulator(max_open=2)
    for target in ("a", "b", "c"):
        accumulator.apply(parse_server_event(start(f"s-{target}", target)))  # type: ignore[arg-type]
    assert len(accumulator) == 2
    frame = parse_server_event(delta("d1", "c", "second", index=1))
    assert isinstance(frame, EventDelta)
    preview = accumulator.apply(frame)
    assert preview.parts == ["", "second"]
    assert accumulator.finish("c") is preview and accumulator.finish("c") is None
    assert isinstance(parse_server_event(start("x", "y")), EventStart)


@st.composite
def drop_schedules(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, int]]]:
    """A session of n events and the connections a subscriber makes: for each, the stream covers
    events[s:e] (opened at s, dropped after e) and the history read after the cursor returns up to h,
    with cursor <= s <= h <= e (the stream opens before history is read)."""
    total = draw(st.integers(min_value=1, max_value=40))
    connections: list[tuple[int, int, int]] = []
    cursor = 0
    while cursor < total:
        stream_start = draw(st.integers(min_value=cursor, max_value=total))
        history_end = draw(st.integers(min_value=stream_start, max_value=total))
        stream_end = draw(st.integers(min_value=history_end, max_value=total))
        if stream_end == cursor:
            stream_end = history_end = min(cursor + 1, total)
            stream_start = min(stream_start, history_end)
        connections.append((stream_start, history_end, stream_end))
        cursor = stream_end
    return total, connections


@settings(max_examples=50, deadline=None)
@given(drop_schedules())
async def test_resume_property_no_loss_no_duplicates_order_kept(
    schedule: tuple[int, list[tuple[int, int, int]]],
) -> None:
    total, plan = schedule
    events = [ev(f"e{n}") for n in range(total)] + [ev("end", "session.deleted")]
    scripted: list[tuple[list[dict[str, Any]], bytes]] = []
    cursor = 0
    for index, (stream_start, history_end, stream_end) in enumerate(plan):
        last = index == len(plan) - 1
        stream_events = events[stream_start : stream_end + (1 if last else 0)]
        scripted.append((events[cursor:history_end], sse(*stream_events)))
        cursor = stream_end
    server = ScriptedServer(scripted)
    async with make_client(server) as client:
        items, _ = await collect(client)
    assert [i.id for i in items] == [e["id"] for e in events]


async def test_events_outside_parse_come_with_their_type_and_id_only() -> None:
    server = ScriptedServer(
        [
            (
                [],
                sse(
                    ev("e1", "session.status_running"),
                    message("e2", "hi"),
                    ev("e3", "session.usage", usage={"input_tokens": 3}),
                    ev("e4", "session.status_idle", stop_reason={"type": "end_turn"}),
                    ev("e5", "session.deleted"),  # terminal: always parsed, so the subscription ends
                ),
            )
        ]
    )
    async with make_client(server) as client:
        items, subscription = await collect(client, parse=frozenset({"agent.message", "session.status_idle"}))
    assert [(type(i).__name__, i.type, i.id) for i in items] == [
        ("UnparsedEvent", "session.status_running", "e1"),
        ("AgentMessage", "agent.message", "e2"),
        ("UnparsedEvent", "session.usage", "e3"),
        ("SessionStatusIdle", "session.status_idle", "e4"),
        ("SessionDeleted", "session.deleted", "e5"),
    ]
    assert subscription.cursor == "e5" and subscription.finished


async def test_a_server_without_event_names_gets_every_event_parsed() -> None:
    frames = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in (ev("e1"), ev("e2", "session.deleted")))
    async with make_client(ScriptedServer([([], frames)])) as client:
        items, _ = await collect(client, parse=frozenset({"agent.message"}))
    assert [type(i).__name__ for i in items] == ["SessionStatusRunning", "SessionDeleted"]
