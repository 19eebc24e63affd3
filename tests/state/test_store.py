"""The Redis state, against a real redis-server."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from pipeline.state import ContextEntry, InboundAdmission, InflightStream, StateStore, TurnContext
from pipeline.state.store import PendingAction


async def store(redis_url: str, prefix: str, **kwargs: int) -> StateStore:
    return StateStore(aioredis.from_url(redis_url, decode_responses=True), prefix, **kwargs)


async def test_mapping_is_two_way_and_expires(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix, mapping_ttl=60)
    await state.map_session("console:b:c", "sess-1")
    assert await state.session_for("console:b:c") == "sess-1"
    assert await state.conversation_for("sess-1") == "console:b:c"
    ttl = await state.redis.ttl(state.key("c2s", "console:b:c"))
    assert 0 < ttl <= 60
    assert all(k.startswith(redis_prefix) for k in await state.redis.keys("*"))


async def test_unmap_keeps_a_newer_session(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    await state.map_session("k", "old")
    await state.map_session("k", "new")
    await state.unmap_session("k", "old")  # a late notice about the old session
    assert await state.session_for("k") == "new"
    await state.unmap_session("k", "new")
    assert await state.session_for("k") is None
    assert await state.conversation_for("new") is None


async def test_conversation_state_round_trip(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    assert (await state.conversation("k")).status == "idle"
    turn = TurnContext(
        trace_id="t",
        platform="console",
        bot_id="b",
        chat_id="c",
        chat_type="group",
        starter_id="u1",
        known_ids=["u1", "u2"],
    )
    pending = [PendingAction(event_id="e1", kind="confirmation", name="bash")]
    await state.update_conversation(
        "k", status="requires_action", turn=turn, pending=pending, interrupted=True, last_message="hello"
    )
    got = await state.conversation("k")
    assert got.status == "requires_action" and got.turn == turn and got.pending == pending
    assert got.interrupted and got.last_message == "hello"
    await state.update_conversation("k", last_message=None, interrupted=False)
    got = await state.conversation("k")
    assert got.last_message is None and not got.interrupted


async def test_held_messages_fifo_take_one_or_all(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    await state.update_conversation("k", status="running")
    for i in range(4):
        assert await state.hold_if_busy("k", f"cmd{i}")
    assert (await state.conversation("k")).held == 4
    assert await state.take_held("k", 1) == ["cmd0"]
    assert (await state.conversation("k")).held == 3
    assert await state.take_held("k") == ["cmd1", "cmd2", "cmd3"]
    assert await state.take_held("k") == []
    assert (await state.conversation("k")).held == 0


async def test_a_message_is_never_held_after_the_turn_ended(redis_url: str, redis_prefix: str) -> None:
    """Hold and turn end are atomic against each other: the held message is flushed or not held."""
    state = await store(redis_url, redis_prefix)
    assert not await state.hold_if_busy("k", "cmd")  # no turn at all: the caller starts one
    await state.update_conversation("k", status="running")
    assert await state.hold_if_busy("k", "early")
    assert await state.finish_turn("k", "sevt-idle-1", status="idle") == 1  # the end sees it: flush
    assert not await state.hold_if_busy("k", "late")  # after the end: the caller starts a turn
    assert await state.take_held("k") == ["early"]
    assert await state.marker("turnend", "sevt-idle-1") == "1"


async def test_first_time_is_atomic_under_concurrency(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    results = await asyncio.gather(*(state.first_time("in", "msg-1") for _ in range(50)))
    assert results.count(True) == 1


async def test_inflight_streams_per_partition(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    await state.add_inflight(3, InflightStream("s1", "k1", cursor=None, trace_id="t1"))
    await state.add_inflight(3, InflightStream("s2", "k2", cursor="sevt-9"))
    await state.add_inflight(4, InflightStream("s3", "k3"))
    got = {s.session_id: s for s in await state.inflight(3)}
    assert set(got) == {"s1", "s2"} and got["s2"].cursor == "sevt-9" and got["s1"].conversation_key == "k1"
    await state.remove_inflight(3, "s1")
    assert [s.session_id for s in await state.inflight(3)] == ["s2"]


async def test_context_window_is_capped_and_oldest_first(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    for i in range(7):
        entry = ContextEntry(message_id=f"m{i}", user_id=f"u{i}", text=str(i))
        await state.admit_inbound([InboundAdmission(f"d{i}", "k", entry=entry, mark=True)], context_size=5)
    window = await state.context("k", 5)
    assert [e.message_id for e in window] == ["m2", "m3", "m4", "m5", "m6"]
    assert await state.context("k", 0) == []


def _entry(i: int) -> ContextEntry:
    return ContextEntry(message_id=f"m{i}", user_id=f"u{i}", text=str(i))


async def test_admit_inbound_keeps_the_window_in_batch_order(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    # m0..m3 settle (pushed and marked); m4 triggers: it sees the window before itself.
    items = [InboundAdmission(f"d{i}", "g", entry=_entry(i), mark=True) for i in range(4)]
    items.append(InboundAdmission("d4", "g", entry=_entry(4), want_window=True))
    results = await state.admit_inbound(items, context_size=3)
    assert [r.duplicate for r in results] == [False] * 5
    assert [e.message_id for e in results[4].window] == ["m1", "m2", "m3"]
    assert [r.window for r in results[:4]] == [[], [], [], []]
    assert [e.message_id for e in await state.context("g", 3)] == ["m2", "m3", "m4"]
    # Settled messages are duplicates from now on; the triggering one is not (marked after output).
    again = await state.admit_inbound(
        [InboundAdmission("d0", "g", entry=_entry(0), mark=True), InboundAdmission("d4", "g", want_window=True)],
        context_size=3,
    )
    assert [r.duplicate for r in again] == [True, False]
    assert [e.message_id for e in again[1].window] == ["m2", "m3", "m4"]
    ttl = await state.redis.ttl(state.key("dedup:in", "d0"))
    assert 0 < ttl <= state.dedup_ttl
    assert await state.redis.exists(state.key("dedup:in", "d4")) == 0


async def test_admit_inbound_without_a_window(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    results = await state.admit_inbound(
        [InboundAdmission("p1", "private", mark=True), InboundAdmission("g1", "g", entry=_entry(1), want_window=True)],
        context_size=0,
    )
    assert [(r.duplicate, r.window) for r in results] == [(False, []), (False, [])]
    assert await state.redis.exists(state.key("ctx", "g")) == 0
    assert await state.admit_inbound([], context_size=5) == []


async def test_window_shows_a_replayed_message_once(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    # A triggering message replayed after a crash is pushed again (its marker was never set).
    for _ in range(2):
        await state.admit_inbound([InboundAdmission("d7", "g", entry=_entry(7), want_window=True)], context_size=5)
    assert [e.message_id for e in await state.context("g", 5)] == ["m7"]


async def test_turns_are_listed_once_and_bound_once(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    stream = InflightStream(session_id="s", conversation_key="k")
    for turn_id in ("a", "b", "a"):  # "a" again: a replayed dispatch
        await state.start_turn("k", 0, stream, turn_id=turn_id, status="running")
    assert await state.turns_in_session("k") == ["a", "b"]
    assert await state.bind_turn_end("k", "idle-1") is None  # no context stored for these ids
    assert await state.turns_in_session("k") == ["b"]
    assert await state.drop_turn("k", "b") == 0
    assert await state.bind_turn_end("k", "idle-2") is None
    await state.unmap_session("k")
    assert await state.redis.exists(state.key("turns", "k")) == 0


async def test_turn_scripts_survive_a_script_flush(redis_url: str, redis_prefix: str) -> None:
    state = await store(redis_url, redis_prefix)
    stream = InflightStream(session_id="s", conversation_key="k")
    await state.redis.script_flush()  # as after a restart without AOF
    await state.start_turn("k", 0, stream, turn_id="a", status="running")
    assert await state.turns_in_session("k") == ["a"]
    await state.redis.script_flush()
    assert await state.bind_turn_end("k", "idle-1") is None
    await state.redis.script_flush()
    assert await state.finish_turn("k", "idle-1") == 0
    assert (await state.conversation("k")).status == "idle"
