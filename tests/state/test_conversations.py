"""Conversations and turns, against a real redis-server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from pipeline.state import (
    InboundAdmission,
    LiveMessage,
    PendingAction,
    State,
    TurnRecord,
    TurnStart,
    context_entry_json,
    note_message,
    redis_py_client,
)
from pipeline.state import pubsub as redis_pubsub

TURN = TurnRecord(trace_id="t", platform="console", bot_id="b", chat_id="c", chat_type="group", starter_id="u1")


async def begin_start(
    state: State, turn_id: str, mode: str = "merge", *, markers: list[str] | None = None, can_cut: bool = False
) -> TurnStart:
    return await state.conversations.begin_turn(
        "k",
        2,
        turn_id=turn_id,
        mode=mode,  # type: ignore[arg-type]
        turn=TURN.model_copy(update={"trace_id": turn_id}),
        command_json=f'{{"turn": "{turn_id}"}}',
        trace_id=turn_id,
        inbound_markers=markers or [],
        can_cut=can_cut,
    )


async def begin(state: State, turn_id: str, mode: str = "merge", *, markers: list[str] | None = None) -> str:
    return (await begin_start(state, turn_id, mode, markers=markers)).decision


async def test_mapping_expires_and_keeps_to_the_conversation(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("console:b:c", "sess-1")
    assert await conversations.session_for("console:b:c") == "sess-1"
    assert (await conversations.conversation("console:b:c")).session_id == "sess-1"
    ttl = await conversations.redis.execute("TTL", state.keys.session_of("console:b:c"))
    assert 0 < ttl <= 600
    if not state.keys.cluster:  # the test's own database (the cluster is shared, apart by prefix)
        assert all(k.startswith(state.keys.prefix) for k in await conversations.redis.execute("KEYS", "*"))


async def test_unmap_keeps_a_newer_session(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("k", "old")
    await conversations.map_session("k", "new")
    await conversations.unmap_session("k", "old")  # a late notice about the old session
    assert await conversations.session_for("k") == "new"
    await conversations.unmap_session("k", "new")
    assert await conversations.session_for("k") is None


async def test_conversation_state_round_trip(state: State) -> None:
    conversations = state.conversations
    assert (await conversations.conversation("k")).status == "idle"
    pending = [PendingAction(event_id="e1", kind="confirmation", name="bash")]
    await conversations.update_conversation(
        "k", status="requires_action", turn=TURN, pending=pending, interrupted="stop", last_message="hello"
    )
    got = await conversations.conversation("k")
    assert got.status == "requires_action" and got.turn == TURN and got.pending == pending
    assert got.interrupted == "stop" and got.last_message == "hello"
    await conversations.update_conversation("k", last_message=None, interrupted=None)
    got = await conversations.conversation("k")
    assert got.last_message is None and got.interrupted is None
    # A /stop is stored as workers wrote it before the cause was kept, so that they read it still.
    await conversations.update_conversation("k", interrupted="stop")
    assert await state.redis.execute("HGET", state.keys.conversation("k"), "interrupted") in ("1", b"1")
    await conversations.update_conversation("k", interrupted="failed")
    assert (await conversations.conversation("k")).interrupted == "failed"


async def test_begin_turn_needs_a_session_then_starts_and_records_everything(state: State) -> None:
    conversations = state.conversations
    assert await begin(state, "t1", markers=["in-1"]) == "no_session"
    assert await state.markers.marker("in", "in-1", "k") is None  # nothing written yet
    await conversations.map_session("k", "s1")
    start = await conversations.begin_turn(
        "k", 2, turn_id="t1", mode="merge", turn=TURN, command_json="{}", trace_id="t1", inbound_markers=["in-1"]
    )
    assert (start.decision, start.session_id, start.interrupt) == ("start", "s1", False)
    got = await conversations.conversation("k")
    assert got.status == "running" and got.turn == TURN and got.session_id == "s1"
    assert await conversations.turns_in_session("k") == ["t1"]
    assert await state.markers.marker("sent", "t1", "k") == "sending"
    assert await state.markers.marker("in", "in-1", "k") == "1"
    (stream,) = await state.streams.inflight(2)
    assert (stream.session_id, stream.conversation_key, stream.trace_id) == ("s1", "k", "t1")


async def test_a_stream_whose_turn_ends_while_it_is_read_is_not_resumed(
    state: State, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition's new owner reads the streams in flight, then their cursors. A turn that ends in
    between (its cursor saved as the idle's id, its entry dropped, in one step) is not resumed: from
    that cursor nothing more would come, and the stream would count as a turn in flight for ever."""
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    assert await begin(state, "t1", markers=["in-1"]) == "start"
    streams = state.streams
    read_entries = streams._inflight_hashes  # noqa: SLF001 (the step the race falls after)

    async def entries_then_the_turn_ends(partition: int) -> list[list[Any]]:
        entries = await read_entries(partition)
        assert (await conversations.bind_turn_end("k", "idle-1", bind=True)).turn_id == "t1"
        assert await conversations.finish_turn("k", 2, session_id="s1", event_id="idle-1", turn_id="t1") == 0
        return entries

    monkeypatch.setattr(streams, "_inflight_hashes", entries_then_the_turn_ends)
    assert await streams.inflight(2) == []
    monkeypatch.undo()
    assert await streams.inflight(2) == []


async def test_a_session_created_after_no_session_is_mapped_with_the_turns_start(state: State) -> None:
    conversations = state.conversations
    assert await begin(state, "t1") == "no_session"
    start = await conversations.begin_turn(
        "k", 2, turn_id="t1", mode="merge", turn=TURN, command_json=None, trace_id="t1", new_session="s-new"
    )
    assert (start.decision, start.session_id) == ("start", "s-new")
    assert await conversations.session_for("k") == "s-new"
    assert (await conversations.conversation("k")).session_id == "s-new"
    ttl = await conversations.redis.execute("TTL", state.keys.session_of("k"))
    assert 0 < ttl <= 600
    # Mapped meanwhile (another owner during a rebalance): that session carries the turn.
    await conversations.map_session("k2", "s-first")
    other = await conversations.begin_turn(
        "k2", 2, turn_id="t2", mode="merge", turn=TURN, command_json=None, trace_id="t2", new_session="s-late"
    )
    assert (other.decision, other.session_id) == ("start", "s-first")
    assert await conversations.session_for("k2") == "s-first"


async def test_a_replayed_turn_is_resumed_or_skipped_never_started_twice(state: State) -> None:
    await state.conversations.map_session("k", "s1")
    assert await begin(state, "t1") == "start"
    assert await begin(state, "t1") == "resume"  # the send may have been cut short: look it up
    assert await begin(state, "t1", "resume") == "start"  # not posted: record and send it again
    assert await state.conversations.turns_in_session("k") == ["t1"]  # listed once
    await state.markers.set_marker("sent", "t1", "k")
    assert await begin(state, "t1") == "done"


async def test_a_turn_whose_send_failed_and_was_told_comes_back_failed_with_its_notice(state: State) -> None:
    """Dispatch marks a turn failed (with the notice it sent) when the session API refused it: any
    replay, held or flushed or not, and its messages' copies, come back `failed`; only `resume` (an
    operator's replay of the dead letter) starts it."""
    await state.conversations.map_session("k", "s1")
    assert await begin(state, "t1", "queue", markers=["m1"]) == "start"
    assert await state.conversations.drop_turn("k", "t1") == 0
    await state.markers.set_marker("sent", "t1", "k", value="failed:overloaded")
    for mode in ("queue", "merge", "flush", "interrupt"):
        start = await begin_start(state, "t1", mode, markers=["m1"])
        assert (start.decision, start.failure, start.taken) == ("failed", "overloaded", ())
    assert await state.conversations.turns_in_session("k") == []  # nothing recorded
    assert await begin(state, "t1", "resume") == "start"


async def test_busy_session_holds_the_turn_once_and_its_end_flushes_it(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    assert await begin(state, "t1") == "start"
    assert await begin(state, "t2", markers=["in-2"]) == "held"
    assert await begin(state, "t2") == "held"  # a replay is not held twice
    assert await state.markers.marker("in", "in-2", "k") == "1"
    assert [t for t, _ in await conversations.peek_held("k")] == ["t2"]
    assert (await conversations.conversation("k")).held == 1
    assert await begin(state, "t3", "flush") == "busy"
    end = await conversations.bind_turn_end("k", "idle-1", bind=True)
    assert end.handled is None and end.turn_id == "t1" and end.turn is not None
    held = await conversations.finish_turn("k", 2, session_id="s1", event_id="idle-1", turn_id="t1")
    assert held == 1  # the end sees it: flush
    assert (await conversations.conversation("k")).status == "idle"
    assert await state.markers.marker("turnend", "idle-1", "k") == "flush"
    assert await state.markers.marker("sent", "t1", "k") == "1"
    assert await state.streams.inflight(2) == []
    assert await begin(state, "t4") == "behind"  # idle, but t2 waits for its flush: t4 goes after it
    assert [t for t, _ in await conversations.peek_held("k")] == ["t2", "t4"]
    assert await begin(state, "t4") == "behind"  # a replay is not held twice
    assert (await conversations.conversation("k")).held == 2
    assert await begin(state, "t2", "flush") == "start"  # the flush starts the oldest


async def test_a_turn_starts_at_once_when_nothing_is_held(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    assert await begin(state, "t1", "queue") == "start"
    await conversations.bind_turn_end("k", "idle-1", bind=True)
    assert await conversations.finish_turn("k", 2, session_id="s1", event_id="idle-1", turn_id="t1") == 0
    assert await begin(state, "t2", "queue") == "start"


async def test_a_copy_of_a_message_merged_into_another_turn_is_not_sent_again(state: State) -> None:
    """A platform sends m2 again (its first socket closed before the acknowledgement) and both
    copies pass ingest before dispatch marks either. The first is held, then merged with m3 into
    one turn by the flush; the copy comes with a turn id that was never sent under that id."""
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    assert await begin(state, "t1", markers=["in-1"]) == "start"
    assert await begin(state, "t2", markers=["in-2"]) == "held"
    assert await begin(state, "t3", markers=["in-3"]) == "held"
    await conversations.bind_turn_end("k", "idle-1", bind=True)
    assert await conversations.finish_turn("k", 2, session_id="s1", event_id="idle-1", turn_id="t1") == 2
    assert await begin(state, "t23", "flush", markers=["in-2", "in-3"]) == "start"
    await conversations.drop_held("k", 2)
    assert await begin(state, "t2", markers=["in-2"]) == "done"  # busy with t23: not held again
    assert await conversations.peek_held("k") == []
    await state.markers.set_marker("sent", "t23", "k")
    await conversations.bind_turn_end("k", "idle-2", bind=True)
    await conversations.finish_turn("k", 2, session_id="s1", event_id="idle-2", turn_id="t23")
    assert await begin(state, "t2", markers=["in-2"]) == "done"  # idle: not started again
    assert await begin(state, "t3", "interrupt", markers=["in-3"]) == "done"
    assert await conversations.turns_in_session("k") == []  # t1 and t23 ended; nothing new
    # A turn with one message not seen before is a turn of its own.
    assert await begin(state, "t34", markers=["in-3", "in-4"]) == "start"


async def test_interrupt_policy_starts_at_once_and_says_to_interrupt(state: State) -> None:
    await state.conversations.map_session("k", "s1")
    assert await begin(state, "t1", "interrupt") == "start"
    start = await state.conversations.begin_turn(
        "k", 2, turn_id="t2", mode="interrupt", turn=TURN, command_json="{}", trace_id="t2"
    )
    assert start.decision == "start" and start.interrupt
    assert await state.conversations.turns_in_session("k") == ["t1", "t2"]


async def test_an_idle_is_bound_to_one_turn_once_and_replays_see_it_handled(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    await begin(state, "t1", "interrupt")
    await begin(state, "t2", "interrupt")
    first = await conversations.bind_turn_end("k", "idle-1", bind=True)
    again = await conversations.bind_turn_end("k", "idle-1", bind=True)  # a replay before the end
    assert first.turn_id == again.turn_id == "t1"
    # turns remain: the status stays running and nothing is flushed yet
    assert await conversations.finish_turn("k", 2, session_id="s1", event_id="idle-1", turn_id="t1") == -1
    assert (await conversations.conversation("k")).status == "running"
    assert (await conversations.bind_turn_end("k", "idle-1", bind=True)).handled == "1"
    second = await conversations.bind_turn_end("k", "idle-2", bind=True)
    assert second.turn_id == "t2"
    assert await conversations.finish_turn("k", 2, session_id="s1", event_id="idle-2", turn_id="t2") == 0
    assert (await conversations.conversation("k")).status == "idle"
    assert (await conversations.conversation("k")).cursor == "idle-2"


async def test_waiting_on_the_chat_releases_the_stream_and_keeps_the_status(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    await begin(state, "t1")
    end = await conversations.bind_turn_end("k", "idle-ra", bind=False)
    assert end.turn_id is None and end.state.status == "running"
    await conversations.update_conversation("k", status="requires_action")
    await conversations.finish_turn("k", 2, session_id="s1", event_id="idle-ra", turn_id=None, waiting=True)
    assert (await conversations.conversation("k")).status == "requires_action"
    assert await state.streams.inflight(2) == []
    assert await conversations.turns_in_session("k") == ["t1"]  # the turn is not over


async def test_turn_scripts_survive_a_script_flush(state: State) -> None:
    conversations = state.conversations
    redis = conversations.redis
    await conversations.map_session("k", "s1")
    await redis.execute("SCRIPT", "FLUSH")  # as after a restart without AOF
    assert await begin(state, "t1") == "start"
    await redis.execute("SCRIPT", "FLUSH")
    assert (await conversations.bind_turn_end("k", "idle-1", bind=True)).turn_id == "t1"
    await redis.execute("SCRIPT", "FLUSH")
    assert await conversations.finish_turn("k", 0, session_id="s1", event_id="idle-1", turn_id="t1") == 0


async def test_unmap_forgets_turns_and_held_messages(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    await begin(state, "t1")
    await begin(state, "t2")
    await conversations.unmap_session("k")
    assert await conversations.turns_in_session("k") == []
    assert await conversations.peek_held("k") == []


async def test_held_messages_are_taken_oldest_first(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    await begin(state, "t0")
    for i in range(1, 4):
        await begin(state, f"t{i}")
    assert [t for t, _ in await conversations.peek_held("k", 2)] == ["t1", "t2"]
    await conversations.drop_held("k", 2)
    assert [c for _, c in await conversations.peek_held("k")] == ['{"turn": "t3"}']
    assert (await conversations.conversation("k")).held == 1
    assert await conversations.clear_held("k") == 1
    assert await conversations.peek_held("k") == []


async def test_context_window_is_capped_and_oldest_first(state: State) -> None:
    for i in range(7):
        entry = context_entry_json(f"m{i}", f"u{i}", "", str(i), 0.0)
        await state.markers.admit_inbound([InboundAdmission(f"d{i}", "k", entry_json=entry, mark=True)], context_size=5)
    window = await state.conversations.context("k", 5)
    assert [e.message_id for e in window] == ["m2", "m3", "m4", "m5", "m6"]
    assert await state.conversations.context("k", 0) == []


async def test_a_busy_session_asks_for_the_command_before_holding_it(state: State) -> None:
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    assert await begin(state, "t1") == "start"
    asked = await conversations.begin_turn(
        "k", 2, turn_id="t2", mode="queue", turn=TURN, command_json=None, trace_id="t2", inbound_markers=["in-2"]
    )
    assert asked.decision == "hold"
    assert await conversations.peek_held("k") == [] and await state.markers.marker("in", "in-2", "k") is None
    held = await conversations.begin_turn(
        "k", 2, turn_id="t2", mode="queue", turn=TURN, command_json='{"n": 2}', trace_id="t2", inbound_markers=["in-2"]
    )
    assert held.decision == "held" and await conversations.peek_held("k") == [("t2", '{"n": 2}')]
    idle = await conversations.begin_turn(  # a turn that needs no holding never sends its command
        "k2", 2, turn_id="t3", mode="queue", turn=TURN, command_json=None, trace_id="t3"
    )
    assert idle.decision == "no_session"


async def test_begin_turn_publishes_its_note_when_held_and_when_a_flush_starts_it(state: State, state_url: str) -> None:
    """The console's status notes ride on begin_turn: published in the same step, only when the turn
    is newly held or started by a flush, and never without a note (every other platform)."""
    conversations = state.conversations
    subscriber = redis_py_client(state_url, decode_responses=True)
    pubsub = await redis_pubsub(subscriber)
    channel = state.console.channel
    await pubsub.subscribe(channel)

    async def begin_with(turn_id: str, mode: str, note: str, command_json: str | None = "{}") -> str:
        start = await conversations.begin_turn(
            "k",
            2,
            turn_id=turn_id,
            mode=mode,  # type: ignore[arg-type]
            turn=TURN,
            command_json=command_json,
            trace_id=turn_id,
            note=(channel, note_message("b", "c", note, [turn_id])),
        )
        return start.decision

    async def published(count: int) -> list[str]:
        """`count` notes, then proof that no other follows."""
        notes: list[str] = []
        async with asyncio.timeout(5):
            while len(notes) < count:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is not None:
                    live = LiveMessage.parse(message["data"])
                    assert (live.bot_id, live.chat_id, live.seq) == ("b", "c", 0)
                    body = json.loads(live.message)
                    notes.append(f"{body['note']}:{','.join(body['message_ids'])}")
        assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.3) is None
        return notes

    try:
        await conversations.map_session("k", "s1")
        assert await begin_with("t1", "merge", "held") == "start"  # not busy: starts, nothing held
        assert await begin_with("t2", "merge", "held", command_json=None) == "hold"  # asked for the command
        assert await begin_with("t2", "merge", "held") == "held"
        assert await begin_with("t2", "merge", "held") == "held"  # a replay: held before, no second note
        assert await begin(state, "t3") == "held"  # no note given: nothing published
        assert await begin_with("t4", "flush", "merged") == "busy"  # the turn still runs
        await conversations.update_conversation("k", status="idle")
        assert await begin_with("t4", "flush", "merged") == "start"
        assert await published(2) == ["held:t2", "merged:t4"]
    finally:
        await pubsub.aclose()
        await subscriber.aclose()


async def test_a_replayed_merged_turn_some_of_whose_messages_were_taken_comes_back_partial(state: State) -> None:
    """Ingest merged in-1…in-3 into one turn; after a crash its batches split otherwise, and in-1
    went first alone. The merged turn, replayed, names what another turn took, and writes nothing;
    without those it is a turn like any other. A turn that cannot be cut (an older record) is
    decided as before, and a flush never looks (it carries held messages, marked when held)."""
    conversations = state.conversations
    await conversations.map_session("k", "s1")
    assert await begin(state, "t1", markers=["in-1"]) == "start"

    async def cut(turn_id: str, markers: list[str], mode: str = "merge", *, can_cut: bool = True) -> TurnStart:
        return await begin_start(state, turn_id, mode, markers=markers, can_cut=can_cut)

    replayed = await cut("t123", ["in-1", "in-2", "in-3"])
    assert (replayed.decision, replayed.taken, replayed.session_id) == ("partial", (True, False, False), "s1")
    assert await conversations.peek_held("k") == []
    assert await state.markers.markers("in", ["in-2", "in-3"], "k") == [None, None]
    assert (await cut("t23", ["in-2", "in-3"])).decision == "held"  # the rest, behind t1
    assert (await cut("t123", ["in-1", "in-2", "in-3"], "queue")).decision == "done"  # all taken now
    # Taken in the middle, and in the order of the markers.
    assert (await cut("t245", ["in-2", "in-4", "in-5"])).taken == (True, False, False)
    assert (await cut("t425", ["in-4", "in-2", "in-5"])).taken == (False, True, False)
    # Not cut: as before, one marker not set is a turn of its own (held here).
    assert (await cut("t16", ["in-1", "in-6"], can_cut=False)).decision == "held"
    assert (await cut("f", ["in-1", "in-7"], "flush")).decision == "busy"
    assert [turn_id for turn_id, _ in await conversations.peek_held("k")] == ["t23", "t16"]


async def test_begin_turn_publishes_the_start_note_of_a_merged_turn(state: State, state_url: str) -> None:
    """A merged turn that starts at once (its messages merged by ingest) gets the start note; held,
    it gets the held note, as one message's turn does."""
    conversations = state.conversations
    subscriber = redis_py_client(state_url, decode_responses=True)
    pubsub = await redis_pubsub(subscriber)
    channel = state.console.channel
    await pubsub.subscribe(channel)

    async def begin_merged(turn_id: str, ids: list[str]) -> str:
        start = await conversations.begin_turn(
            "k",
            2,
            turn_id=turn_id,
            mode="merge",
            turn=TURN,
            command_json="{}",
            trace_id=turn_id,
            inbound_markers=ids,
            note=(channel, note_message("b", "c", "held", ids)),
            start_note=note_message("b", "c", "merged", ids),
        )
        return start.decision

    try:
        await conversations.map_session("k", "s1")
        assert await begin_merged("t12", ["m1", "m2"]) == "start"
        assert await begin_merged("t34", ["m3", "m4"]) == "held"
        notes: list[str] = []
        async with asyncio.timeout(5):
            while len(notes) < 2:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is not None:
                    body = json.loads(LiveMessage.parse(message["data"]).message)
                    notes.append(f"{body['note']}:{','.join(body['message_ids'])}")
        assert notes == ["merged:m1,m2", "held:m3,m4"]
        assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.3) is None
    finally:
        await pubsub.aclose()
        await subscriber.aclose()
