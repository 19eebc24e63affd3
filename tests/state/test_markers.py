"""De-duplication markers and ingest's batch admission, against a real redis-server."""

from __future__ import annotations

import asyncio

from pipeline.state import ContextEntry, InboundAdmission, State, context_entry_json


def _entry(i: int) -> bytes:
    return context_entry_json(f"m{i}", f"u{i}", "", str(i), 0.0)


async def test_first_time_is_atomic_under_concurrency(state: State) -> None:
    results = await asyncio.gather(*(state.markers.first_time("in", "msg-1", "k") for _ in range(50)))
    assert results.count(True) == 1


async def test_claim_send_tells_a_replay_from_a_first_attempt(state: State) -> None:
    assert await state.markers.claim_send("answer-1", "k") is None
    assert await state.markers.claim_send("answer-1", "k") == "sending"
    await state.markers.set_marker("sent", "answer-1", "k")
    assert await state.markers.claim_send("answer-1", "k") == "1"


async def test_admit_inbound_keeps_the_window_in_batch_order(state: State) -> None:
    markers = state.markers
    # m0..m3 settle (pushed and marked); m4 triggers: it sees the window before itself.
    items = [InboundAdmission(f"d{i}", "g", entry_json=_entry(i), mark=True) for i in range(4)]
    items.append(InboundAdmission("d4", "g", entry_json=_entry(4), want_window=True))
    results = await markers.admit_inbound(items, context_size=3)
    assert [r.duplicate for r in results] == [False] * 5
    assert [e.message_id for e in results[4].window] == ["m1", "m2", "m3"]
    assert [r.window for r in results[:4]] == [[], [], [], []]
    assert [e.message_id for e in await state.conversations.context("g", 3)] == ["m2", "m3", "m4"]
    # Settled messages are duplicates from now on; the triggering one is not (dispatch marks it).
    again = await markers.admit_inbound(
        [InboundAdmission("d0", "g", entry_json=_entry(0), mark=True), InboundAdmission("d4", "g", want_window=True)],
        context_size=3,
    )
    assert [r.duplicate for r in again] == [True, False]
    assert [e.message_id for e in again[1].window] == ["m2", "m3", "m4"]
    ttl = await markers.redis.execute("TTL", state.keys.marker("in", "d0", "g"))
    assert 0 < ttl <= markers.dedup_ttl
    assert await markers.redis.execute("EXISTS", state.keys.marker("in", "d4", "g")) == 0


async def test_admit_inbound_without_a_window(state: State) -> None:
    results = await state.markers.admit_inbound(
        [
            InboundAdmission("p1", "private", mark=True),
            InboundAdmission("g1", "g", entry_json=_entry(1), want_window=True),
        ],
        context_size=0,
    )
    assert [(r.duplicate, r.window) for r in results] == [(False, []), (False, [])]
    assert await state.markers.redis.execute("EXISTS", state.keys.window("g")) == 0
    assert await state.markers.admit_inbound([], context_size=5) == []


async def test_window_shows_a_replayed_message_once(state: State) -> None:
    # A triggering message replayed before dispatch marked it is pushed again.
    for _ in range(2):
        await state.markers.admit_inbound([InboundAdmission("d7", "g", entry_json=_entry(7), want_window=True)], 5)
    assert [e.message_id for e in await state.conversations.context("g", 5)] == ["m7"]


def test_an_entry_written_without_the_model_reads_back_as_the_model() -> None:
    written = context_entry_json("m:1", "u1", 'Zoë "z"', "hi\n😀", 1764657600123.5)
    assert ContextEntry.model_validate_json(written) == ContextEntry(
        message_id="m:1", user_id="u1", name='Zoë "z"', text="hi\n😀", at_ms=1764657600123.5
    )
    assert written == ContextEntry.model_validate_json(written).model_dump_json().encode()


async def test_a_busy_chat_in_one_call_keeps_a_trimmed_window_with_its_ttl(state: State) -> None:
    markers = state.markers
    items = [InboundAdmission(f"b{i}", "busy", entry_json=_entry(i), mark=True) for i in range(10)]
    items.insert(6, InboundAdmission("t", "busy", entry_json=_entry(99), want_window=True))
    results = await markers.admit_inbound(items, context_size=4)
    assert [e.message_id for e in results[6].window] == ["m2", "m3", "m4", "m5"]  # the newest 4 before it
    assert await markers.redis.execute("LLEN", state.keys.window("busy")) == 4
    assert [e.message_id for e in await state.conversations.context("busy", 4)] == ["m6", "m7", "m8", "m9"]
    assert 0 < await markers.redis.execute("TTL", state.keys.window("busy")) <= markers.mapping_ttl
    # Marked at once: every settled one is a duplicate in the next call.
    again = await markers.admit_inbound(items[:3], context_size=4)
    assert [r.duplicate for r in again] == [True, True, True]
