"""Dispatch holds a message for a busy session in the same round trip that decides it, releases
held messages in order, and answers each message once when the session API refuses its turn.
Against a real Redis and, where something is sent, the session simulator; what dispatch produces
goes to a recorder at the producer seam."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prometheus_client import REGISTRY

from pipeline import metrics
from pipeline.controls.overload import OverloadConfig
from pipeline.records import DeadLetter, Position, SessionCommand, now_ms
from pipeline.session import SessionClient, StaticPoolProvisioner
from pipeline.session.models import AgentCustomToolUse, AgentToolUse, UserMessage
from pipeline.session.retry import RetryPolicy
from pipeline.settings import BotConfig, Settings
from pipeline.sim import SimServer, SimSettings
from pipeline.sim.settings import Faults
from pipeline.stages._ids import user_message_id
from pipeline.stages.dispatch import DispatchStage, merge_turns, turn_message_id
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.stages.streams import StreamRegistry
from pipeline.state import LiveMessage, PendingAction, State, TurnRecord, redis_py_client
from pipeline.state import pubsub as redis_pubsub
from tests.metric_values import current
from tests.sim.helpers import collect_until

from .turns import Recorder, round_trips, running_turn

CONVERSATION = "console:demo:group-1"


def command(inbound: str) -> SessionCommand:
    return SessionCommand(
        kind="user_turn",
        conversation_key=CONVERSATION,
        platform="console",
        bot_id="demo",
        chat_id="group-1",
        chat_type="group",
        events=[{"type": "user.message", "id": f"msg-{inbound}", "content": [{"type": "text", "text": inbound}]}],
        inbound_ids=[inbound],
        trace_id=f"t-{inbound}",
        hops={"ingress": now_ms()},  # just received: within the overload bound
    )


@asynccontextmanager
async def busy_dispatch(redis_url: str, redis_prefix: str) -> AsyncIterator[tuple[DispatchStage, State, Recorder]]:
    """Dispatch for bot `demo` (merges while busy), its conversation's session running turn msg-A."""
    settings = Settings(redis_prefix=redis_prefix, console_enabled=True)
    state = State.connect(redis_url, settings.redis_prefix)
    recorder = Recorder()
    outputs = Outputs(recorder)
    client = SessionClient(api_key="unused", base_url="http://127.0.0.1:9")  # never called: nothing is sent
    stage = DispatchStage(
        settings,
        state,
        client,
        StaticPoolProvisioner(["s1"]),
        StreamRegistry(state.streams, client, outputs),
        outputs,
        Notifier(settings),
    )
    running = TurnRecord(trace_id="t-A", platform="console", bot_id="demo", chat_id="group-1", chat_type="group")
    await running_turn(state, CONVERSATION, running, "msg-A", session_id="s1")
    try:
        yield stage, state, recorder
    finally:
        await client.aclose()
        await state.redis.aclose()


async def test_a_message_to_a_busy_session_is_held_in_one_round_trip(redis_url: str, redis_prefix: str) -> None:
    async with busy_dispatch(redis_url, redis_prefix) as (stage, state, recorder):
        held = command("m-B")
        before = round_trips()
        await stage.handle(held, 0)
        assert round_trips() - before == 1  # decided and held together: no second call for the command
        ((turn_id, raw),) = await state.conversations.peek_held(CONVERSATION)
        assert turn_id == turn_message_id(held)
        kept = SessionCommand.model_validate_json(raw)
        assert kept.events == held.events and kept.inbound_ids == ["m-B"]
        assert "held" in kept.hops  # the busy wait is measured from here
        assert (await state.conversations.conversation(CONVERSATION)).held == 1
        # A replay of the same message is recognised, not held twice.
        await stage.handle(command("m-B"), 0)
        assert len(await state.conversations.peek_held(CONVERSATION)) == 1
        assert [t for t, _ in recorder.records] == []  # nothing produced: no notice, no dead letter


async def test_a_copy_of_a_message_merged_into_a_sent_turn_is_skipped(redis_url: str, redis_prefix: str) -> None:
    """Both copies of m-B passed ingest before dispatch marked either (a platform's redelivery).
    The first was held, and the flush sent it merged with m-C under another id: the copy is a
    replay, neither held again nor sent."""
    async with busy_dispatch(redis_url, redis_prefix) as (stage, state, recorder):
        await stage.handle(command("m-B"), 0)
        await stage.handle(command("m-C"), 0)
        assert len(await state.conversations.peek_held(CONVERSATION)) == 2
        # The flush's merged turn, recorded as dispatch records it, and its held commands dropped.
        merged = TurnRecord(trace_id="t-BC", platform="console", bot_id="demo", chat_id="group-1", chat_type="group")
        await running_turn(state, CONVERSATION, merged, "msg-BC", session_id="s1")
        await state.conversations.drop_held(CONVERSATION, 2)
        skipped = REGISTRY.get_sample_value(
            "switchboard_session_calls_total", {"call": "user_turn", "outcome": "replay_skipped"}
        )
        await stage.handle(command("m-B"), 0)
        assert await state.conversations.peek_held(CONVERSATION) == []
        assert (await state.conversations.conversation(CONVERSATION)).held == 0
        after = REGISTRY.get_sample_value(
            "switchboard_session_calls_total", {"call": "user_turn", "outcome": "replay_skipped"}
        )
        assert (after or 0.0) - (skipped or 0.0) == 1
        assert [t for t, _ in recorder.records] == []


async def test_a_message_arriving_before_the_owed_flush_goes_behind_the_held_one(
    redis_url: str, redis_prefix: str
) -> None:
    """Queue policy: A runs, B is held; A ends (a flush is now owed and on its way through the
    topic), and C reaches dispatch before that flush. C must not overtake B: it is held behind it,
    and dispatch flushes B at once. The late flush then finds the session busy and does nothing."""
    async with sim_dispatch(redis_url, redis_prefix, queue_settings(redis_prefix)) as (
        stage,
        state,
        client,
        session_id,
    ):
        running = TurnRecord(trace_id="t-A", platform="console", bot_id="demo", chat_id="group-1", chat_type="group")
        await running_turn(state, CONVERSATION, running, "msg-A", session_id=session_id)
        await stage.handle(command("m-B"), 0)
        conversations = state.conversations
        await conversations.bind_turn_end(CONVERSATION, "idle-A", bind=True)
        owed = await conversations.finish_turn(
            CONVERSATION, 0, session_id=session_id, event_id="idle-A", turn_id="msg-A"
        )
        assert owed == 1  # A's end owes a flush for B

        await stage.handle(command("m-C"), 0)
        assert [t for t, _ in await conversations.peek_held(CONVERSATION)] == ["msg-m-C"]
        assert await conversations.turns_in_session(CONVERSATION) == ["msg-m-B"]
        sent = [e.id async for e in client.list(session_id, order="asc") if e.type == "user.message"]
        assert sent == ["msg-m-B"]

        flush = command("flush").model_copy(update={"kind": "flush", "events": [], "inbound_ids": []})
        await stage.handle(flush, 0)  # the owed flush, late: B runs, so C keeps waiting
        assert [t for t, _ in await conversations.peek_held(CONVERSATION)] == ["msg-m-C"]
        sent = [e.id async for e in client.list(session_id, order="asc") if e.type == "user.message"]
        assert sent == ["msg-m-B"]


async def test_a_chats_messages_in_a_row_are_held_in_two_round_trips(redis_url: str, redis_prefix: str) -> None:
    """A flooding chat's batch: the first message as usual, the rest decided in one round trip, in
    order; a replay of the batch holds nothing twice."""
    async with busy_dispatch(redis_url, redis_prefix) as (stage, state, _):
        batch = [command(f"m-{i}") for i in range(5)]
        works = await stage.admit(batch, [Position("session.input", 0, i) for i in range(5)])
        assert [w is None for w in works] == [False, True, True, True, True]
        before = round_trips()
        first = works[0]
        assert first is not None
        await first()
        assert round_trips() - before == 2
        held = await state.conversations.peek_held(CONVERSATION)
        assert [turn_id for turn_id, _ in held] == [turn_message_id(c) for c in batch]
        await first()  # the batch replayed
        assert len(await state.conversations.peek_held(CONVERSATION)) == 5
        assert (await state.conversations.conversation(CONVERSATION)).held == 5


async def test_a_failed_flush_after_a_chats_messages_in_a_row_tells_the_chat(redis_url: str, redis_prefix: str) -> None:
    """The batched path's flush (idle with messages held, found on a later message of the run) fails
    at the session API as `handle`'s calls do: the record is dead-lettered and the chat told, the
    error not left to the stage's generic handling (which would tell nobody)."""
    settings = Settings(redis_prefix=redis_prefix, console_enabled=True)
    state = State.connect(redis_url, settings.redis_prefix)
    recorder = Recorder()
    outputs = Outputs(recorder)
    # Unreachable, and not retried: the flush fails at once.
    client = SessionClient(api_key="unused", base_url="http://127.0.0.1:9", retry=RetryPolicy(max_attempts=1))
    stage = DispatchStage(
        settings,
        state,
        client,
        StaticPoolProvisioner(["s1"]),
        StreamRegistry(state.streams, client, outputs),
        outputs,
        Notifier(settings),
    )
    try:
        running = TurnRecord(trace_id="t-A", platform="console", bot_id="demo", chat_id="group-1", chat_type="group")
        await running_turn(state, CONVERSATION, running, "msg-A", session_id="s1")
        await stage.handle(command("m-B"), 0)  # held behind A
        conversations = state.conversations
        await conversations.bind_turn_end(CONVERSATION, "idle-A", bind=True)
        assert await conversations.finish_turn(CONVERSATION, 0, session_id="s1", event_id="idle-A", turn_id="msg-A")
        # B again (a replay: done), then C: idle with B held, so C goes behind it and B is flushed.
        batch = [command("m-B"), command("m-C")]
        works = await stage.admit(batch, [Position("session.input", 0, i) for i in range(2)])
        first = works[0]
        assert first is not None and works[1] is None
        await first()
        letters = [DeadLetter.model_validate_json(v) for t, v in recorder.records if t == "im.deadletter"]
        assert [letter.reason for letter in letters] == ["session_api_error"]
        assert [reply.kind for reply in recorder.replies()] == ["notice"]  # provider_error
    finally:
        await client.aclose()
        await state.redis.aclose()


@asynccontextmanager
async def sim_dispatch(
    redis_url: str,
    redis_prefix: str,
    settings: Settings | None = None,
    *,
    faults: Faults | None = None,
    recorder: Recorder | None = None,
) -> AsyncIterator[tuple[DispatchStage, State, SessionClient, str]]:
    """Dispatch against the session simulator, one session; by default for bot `demo` (merges
    while busy). With `faults`, the simulator's (changed by the test as it goes) and a client that
    tries each call once."""
    settings = settings or Settings(redis_prefix=redis_prefix, console_enabled=True)
    state = State.connect(redis_url, settings.redis_prefix)
    sim_settings = SimSettings(api_key="k", seed=7, faults=faults or Faults())
    async with SimServer(sim_settings) as sim:
        session_id = await sim.create_session()
        retry = RetryPolicy(max_attempts=1) if faults is not None else None
        client = SessionClient(api_key="k", base_url=sim.base_url("ark"), retry=retry)
        outputs = Outputs(recorder or Recorder())
        stage = DispatchStage(
            settings,
            state,
            client,
            StaticPoolProvisioner([session_id]),
            StreamRegistry(state.streams, client, outputs),
            outputs,
            Notifier(settings),
        )
        try:
            yield stage, state, client, session_id
        finally:
            await stage.streams.close()
            await client.aclose()
            await state.redis.aclose()


async def received(client: SessionClient, session_id: str) -> list[tuple[str | None, list[str]]]:
    """What the session received: each user.message's id and texts, in order."""
    return [
        (e.id, [getattr(block, "text", "") for block in e.content])
        async for e in client.list(session_id, order="asc")
        if isinstance(e, UserMessage)
    ]


async def end_turn(state: State, session_id: str, turn_id: str, idle: str) -> int:
    """The turn's end as render writes it; returns how many held messages it owes a flush."""
    await state.conversations.bind_turn_end(CONVERSATION, idle, bind=True)
    return await state.conversations.finish_turn(CONVERSATION, 0, session_id=session_id, event_id=idle, turn_id=turn_id)


def flush_command() -> SessionCommand:
    return command("flush").model_copy(update={"kind": "flush", "events": [], "inbound_ids": []})


async def test_a_replayed_merged_turn_sends_only_the_messages_no_turn_took(redis_url: str, redis_prefix: str) -> None:
    """Ingest merged a chat's messages into one turn; after a crash its batches split otherwise, so
    the replayed merged turn carries messages another turn already took. Dispatch sends (or holds)
    only the rest, under the id derived from them: the session receives each message once. Both
    ways in: `handle`, and the batched path (`_user_turns`)."""
    async with sim_dispatch(redis_url, redis_prefix) as (stage, state, client, session_id):
        cut = REGISTRY.get_sample_value(
            "switchboard_session_calls_total", {"call": "user_turn", "outcome": "replay_cut"}
        )
        await stage.handle(command("m-1"), 0)  # the replay's first batch: m-1 alone
        assert await end_turn(state, session_id, "msg-m-1", "idle-1") == 0
        await stage.handle(merge_turns([command("m-1"), command("m-2")]), 0)  # then m-1 and m-2 merged
        only_m2 = user_message_id(CONVERSATION, ["m-2"])
        assert await received(client, session_id) == [("msg-m-1", ["m-1"]), (only_m2, ["m-2"])]
        assert await state.conversations.turns_in_session(CONVERSATION) == [only_m2]

        # Batched: m-3 (held behind m-2), then m-2…m-4 merged: m-2 started, m-3 held, m-4 new.
        batch = [command("m-3"), merge_turns([command("m-2"), command("m-3"), command("m-4")])]
        works = await stage.admit(batch, [Position("session.input", 0, i) for i in range(2)])
        first = works[0]
        assert first is not None and works[1] is None
        await first()
        held = await state.conversations.peek_held(CONVERSATION)
        assert [turn_id for turn_id, _ in held] == ["msg-m-3", user_message_id(CONVERSATION, ["m-4"])]
        rest = SessionCommand.model_validate_json(held[1][1])
        assert (rest.inbound_ids, rest.parts) == (["m-4"], [])
        assert [b["text"] for b in rest.events[0]["content"]] == ["m-4"]

        assert await end_turn(state, session_id, only_m2, "idle-2") == 2
        await stage.handle(flush_command(), 0)
        m3_m4 = user_message_id(CONVERSATION, ["m-3", "m-4"])
        assert await received(client, session_id) == [
            ("msg-m-1", ["m-1"]),
            (only_m2, ["m-2"]),
            (m3_m4, ["m-3", "m-4"]),
        ]
        after = REGISTRY.get_sample_value(
            "switchboard_session_calls_total", {"call": "user_turn", "outcome": "replay_cut"}
        )
        assert (after or 0.0) - (cut or 0.0) == 2


async def test_a_flush_takes_held_turns_up_to_the_merge_windows_messages(redis_url: str, redis_prefix: str) -> None:
    """Held turns merged by ingest carry several messages each: a flush takes whole held turns up
    to `merge_window_max` messages (20), at least one, and leaves the rest for the next turn."""
    async with sim_dispatch(redis_url, redis_prefix) as (stage, state, client, session_id):
        await stage.handle(command("m-0"), 0)  # running: what follows is held
        sizes = (25, 8, 8, 8)
        for i, size in enumerate(sizes):
            await stage.handle(merge_turns([command(f"m-{i + 1}-{j}") for j in range(size)]), 0)
        assert (await state.conversations.conversation(CONVERSATION)).held == 4
        previous = "msg-m-0"
        for n, expected in enumerate(([25], [8, 8], [8]), start=1):
            assert await end_turn(state, session_id, previous, f"idle-{n}") > 0
            await stage.handle(flush_command(), 0)
            last_id, texts = (await received(client, session_id))[-1]
            assert last_id is not None and len(texts) == sum(expected)
            previous = last_id
        assert await state.conversations.peek_held(CONVERSATION) == []
        assert len(await received(client, session_id)) == 4


async def test_a_flush_merges_only_held_messages_of_one_thread(redis_url: str, redis_prefix: str) -> None:
    """Held messages of the room and of a thread of it are released in turns of their own, in the
    order held, each answered where it was asked."""
    thread = {"thread_id": "root-1"}
    async with sim_dispatch(redis_url, redis_prefix) as (stage, state, client, session_id):
        await stage.handle(command("m-0"), 0)  # running: what follows is held
        for inbound, route in (("m-1", {}), ("m-2", {}), ("m-3", thread), ("m-4", thread), ("m-5", {})):
            await stage.handle(command(inbound).model_copy(update={"route": route}), 0)
        previous = "msg-m-0"
        for n, expected in enumerate((["m-1", "m-2"], ["m-3", "m-4"], ["m-5"]), start=1):
            assert await end_turn(state, session_id, previous, f"idle-{n}") > 0
            await stage.handle(flush_command(), 0)
            last_id, texts = (await received(client, session_id))[-1]
            assert texts == expected
            assert last_id is not None
            previous = last_id
        assert await state.conversations.peek_held(CONVERSATION) == []


async def test_the_console_notes_messages_merged_by_ingest(redis_url: str, redis_prefix: str) -> None:
    """A console chat's messages merged by ingest: `merged` when their turn starts at once, `held`
    (all of them, in one note) when the session is busy, then `merged` again when released."""
    async with sim_dispatch(redis_url, redis_prefix) as (stage, state, client, session_id):
        subscriber = redis_py_client(redis_url, decode_responses=True)
        pubsub = await redis_pubsub(subscriber)
        await pubsub.subscribe(state.console.channel)

        async def notes(count: int) -> list[tuple[str, list[str]]]:
            got: list[tuple[str, list[str]]] = []
            async with asyncio.timeout(5):
                while len(got) < count:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                    if message is not None:
                        body = json.loads(LiveMessage.parse(message["data"]).message)
                        got.append((body["note"], body["message_ids"]))
            assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.3) is None
            return got

        try:
            first = merge_turns([command("m-1"), command("m-2")])
            await stage.handle(first, 0)
            second = merge_turns([command("m-3"), command("m-4")])
            await stage.handle(second, 0)  # busy with the first: held
            assert await notes(2) == [("merged", ["m-1", "m-2"]), ("held", ["m-3", "m-4"])]
            assert await end_turn(state, session_id, turn_message_id(first), "idle-1") == 1
            await stage.handle(flush_command(), 0)
            assert await notes(1) == [("merged", ["m-3", "m-4"])]
            assert [texts for _, texts in await received(client, session_id)] == [["m-1", "m-2"], ["m-3", "m-4"]]
        finally:
            await pubsub.aclose()
            await subscriber.aclose()


@dataclass
class FailingDispatch:
    """Dispatch against the simulator whose `faults` the test changes as it goes (each call tried
    once), and what it produced."""

    stage: DispatchStage
    state: State
    client: SessionClient
    session_id: str
    faults: Faults
    recorder: Recorder


@asynccontextmanager
async def failing_dispatch(
    redis_url: str, redis_prefix: str, settings: Settings | None = None
) -> AsyncIterator[FailingDispatch]:
    faults, recorder = Faults(), Recorder()
    async with sim_dispatch(redis_url, redis_prefix, settings, faults=faults, recorder=recorder) as (
        stage,
        state,
        client,
        session_id,
    ):
        yield FailingDispatch(stage, state, client, session_id, faults, recorder)


def queue_settings(redis_prefix: str) -> Settings:
    bot = BotConfig(platform="console", bot_id="demo", self_id="bot", busy_policy="queue")
    return Settings(redis_prefix=redis_prefix, bots=[bot])


async def test_a_held_turn_whose_send_fails_is_told_once_and_never_sent_after(
    redis_url: str, redis_prefix: str
) -> None:
    """Queue policy: A runs, B is held; A ends, and C arrives before the owed flush, so C goes behind
    B and B is flushed at once, while the session API answers 429. The chat is told, once for each
    message (B's notice answers B, not C), and neither is held any longer: neither is sent later,
    when the API recovers, after its notice (a notice and then the reply was a message answered
    twice). C, behind B, is tried in its turn too."""
    async with failing_dispatch(redis_url, redis_prefix, queue_settings(redis_prefix)) as failing:
        stage, state, client, session_id = failing.stage, failing.state, failing.client, failing.session_id
        faults, recorder = failing.faults, failing.recorder
        conversations = state.conversations
        running = TurnRecord(trace_id="t-A", platform="console", bot_id="demo", chat_id="group-1", chat_type="group")
        await running_turn(state, CONVERSATION, running, "msg-A", session_id=session_id)
        await stage.handle(command("m-B"), 0)  # held behind A
        assert await end_turn(state, session_id, "msg-A", "idle-A") == 1
        faults.update({"rate_429": 1.0, "retry_after": 0})
        await stage.handle(command("m-C"), 0)  # behind B: B is flushed now, and fails
        notices = recorder.replies()
        assert [(n.kind, n.reply_to_message_id, n.trace_id) for n in notices] == [
            ("notice", None, "t-m-B"),
            ("notice", None, "t-m-C"),
        ]
        assert await conversations.peek_held(CONVERSATION) == []
        assert (await conversations.conversation(CONVERSATION)).status == "idle"
        letters = [DeadLetter.model_validate_json(v) for t, v in recorder.records if t == "im.deadletter"]
        assert [letter.reason for letter in letters] == ["session_api_error", "session_api_error"]

        faults.update({"rate_429": 0.0})
        await stage.handle(flush_command(), 0)  # A's owed flush, late: nothing is held
        for replayed in ("m-B", "m-C"):  # the records again (a crash before their commit)
            await stage.handle(command(replayed), 0)
        assert await received(client, session_id) == []
        again = recorder.replies()[len(notices) :]
        assert [n.outbound_id for n in again] == [n.outbound_id for n in notices]  # the same notices: sent once


async def test_a_turn_whose_send_failed_is_told_again_on_a_replay_not_sent(redis_url: str, redis_prefix: str) -> None:
    """A user turn's send fails (500) and the chat is told. The record is replayed (the worker died
    before committing it) when the API has recovered: the replay produces the same notice again
    (its id is stable, so egress sends it once), never the turn: a reply after "try again later"
    would answer the message twice. An operator's replay of its dead letter sends it."""
    async with failing_dispatch(redis_url, redis_prefix) as failing:
        stage, client, session_id = failing.stage, failing.client, failing.session_id
        faults, recorder = failing.faults, failing.recorder
        faults.update({"rate_500": 1.0})
        await stage.handle(command("m-1"), 0)
        (notice,) = recorder.replies()
        faults.update({"rate_500": 0.0})
        await stage.handle(command("m-1"), 0)
        assert [n.outbound_id for n in recorder.replies()] == [notice.outbound_id] * 2
        assert await received(client, session_id) == []

        (letter,) = [DeadLetter.model_validate_json(v) for t, v in recorder.records if t == "im.deadletter"]
        replayed = SessionCommand.model_validate_json(letter.record)
        replayed.hops["replay"] = now_ms()
        await stage.handle(replayed, 0)
        assert await received(client, session_id) == [("msg-m-1", ["m-1"])]


async def test_a_confirmation_whose_send_fails_can_be_given_again(redis_url: str, redis_prefix: str) -> None:
    """The agent asks to confirm a tool; the chat's /allow cannot be delivered (the session API
    answers 500). The chat is told, and the conversation waits on the chat again, as before the
    answer (its pending confirmation kept, the stream released): a second /allow is delivered.
    (Rewritten before the send, the state had dropped the confirmation and said `running`, so the
    second /allow found nothing to confirm and the conversation stayed busy for good.)"""
    async with failing_dispatch(redis_url, redis_prefix) as failing:
        stage, state, client, session_id = failing.stage, failing.state, failing.client, failing.session_id
        faults, recorder = failing.faults, failing.recorder
        conversations = state.conversations
        ask = command("m-1")
        ask.events[0]["content"] = [{"type": "text", "text": "[sim:confirm_tool] please"}]
        await stage.handle(ask, 0)
        *_, asking = await collect_until(client, session_id, after=None, stop_types=("agent.tool_use",), within=5)
        assert isinstance(asking, AgentToolUse)
        pending = [PendingAction(event_id=str(asking.id), kind="confirmation", name="shell")]
        # As render leaves it when the session waits on the chat: the stream released.
        await stage.streams.untrack(0, session_id, CONVERSATION)
        await conversations.update_conversation(CONVERSATION, status="requires_action", pending=pending)

        def allow(inbound: str) -> SessionCommand:
            event = {"type": "user.tool_confirmation", "tool_use_id": pending[0].event_id, "result": "allow"}
            return command(inbound).model_copy(update={"kind": "tool_confirmation", "events": [event]})

        faults.update({"rate_500": 1.0})
        await stage.handle(allow("m-2"), 0)
        assert [(n.kind, n.trace_id) for n in recorder.replies()] == [("notice", "t-m-2")]
        after = await conversations.conversation(CONVERSATION)
        assert (after.status, after.pending) == ("requires_action", pending)
        assert stage.streams.open_streams == 0

        faults.update({"rate_500": 0.0})
        await stage.handle(allow("m-3"), 0)
        confirmed = [e async for e in client.list(session_id) if e.type == "user.tool_confirmation"]
        assert len(confirmed) == 1
        assert (await conversations.conversation(CONVERSATION)).status == "running"


async def test_held_messages_too_old_for_a_turn_are_told_once(redis_url: str, redis_prefix: str) -> None:
    """Merge policy, overload bound 0.3 s: B is held, then C. A flush that arrives while A still
    runs (a late one) finds B too old: B is told `overloaded`, C stays held. When A ends and C is
    too old as well, C is told, and B not again (it was still in the queue, and a notice over B and
    C under a new id would have answered B twice)."""
    overload = OverloadConfig(max_wait_seconds=0.3)
    bot = BotConfig(platform="console", bot_id="demo", self_id="bot", busy_policy="merge", overload=overload)
    settings = Settings(redis_prefix=redis_prefix, bots=[bot])
    recorder = Recorder()
    async with sim_dispatch(redis_url, redis_prefix, settings, recorder=recorder) as (stage, state, client, session_id):
        running = TurnRecord(trace_id="t-A", platform="console", bot_id="demo", chat_id="group-1", chat_type="group")
        await running_turn(state, CONVERSATION, running, "msg-A", session_id=session_id)
        told = current(metrics.OVERLOADED.labels("console", "demo"))
        await stage.handle(command("m-B"), 0)
        await asyncio.sleep(0.4)
        await stage.handle(command("m-C"), 0)
        await stage.handle(flush_command(), 0)  # late: A runs
        assert current(metrics.OVERLOADED.labels("console", "demo")) - told == 1
        await asyncio.sleep(0.4)
        assert await end_turn(state, session_id, "msg-A", "idle-A") > 0
        await stage.handle(flush_command(), 0)
        assert current(metrics.OVERLOADED.labels("console", "demo")) - told == 2  # B once, C once
        assert [n.trace_id for n in recorder.replies()] == ["t-m-B", "t-m-C"]
        assert len({n.outbound_id for n in recorder.replies()}) == 2
        assert await state.conversations.peek_held(CONVERSATION) == []
        assert await received(client, session_id) == []


async def test_a_held_turn_marked_failed_goes_alone_and_is_told_again(redis_url: str, redis_prefix: str) -> None:
    """Merge policy. B's flush failed and B was told, and the worker died before B's entry left the
    queue (its sent marker says failed; the entry is still held), with C held after it. The replayed
    flush tells B again under the same notice, alone, and sends C in a turn of its own: B merged
    into C's turn would reach the agent after its notice."""
    async with failing_dispatch(redis_url, redis_prefix) as failing:
        stage, state, client, session_id = failing.stage, failing.state, failing.client, failing.session_id
        running = TurnRecord(trace_id="t-A", platform="console", bot_id="demo", chat_id="group-1", chat_type="group")
        await running_turn(state, CONVERSATION, running, "msg-A", session_id=session_id)
        await stage.handle(command("m-B"), 0)
        await stage.handle(command("m-C"), 0)
        await state.markers.set_marker("sent", "msg-m-B", CONVERSATION, value="failed:provider_error")
        assert await end_turn(state, session_id, "msg-A", "idle-A") == 2
        await stage.handle(flush_command(), 0)
        assert [(n.kind, n.trace_id) for n in failing.recorder.replies()] == [("notice", "t-m-B")]
        assert await received(client, session_id) == [("msg-m-C", ["m-C"])]
        assert await state.conversations.peek_held(CONVERSATION) == []


async def test_a_held_turn_marked_failed_is_told_its_failure_again_however_old(
    redis_url: str, redis_prefix: str
) -> None:
    """As above, with B older than the overload bound by the time of the replayed flush: B is
    told what it was told (the failure, under the same notice id), not `overloaded` under another."""
    overload = OverloadConfig(max_wait_seconds=0.3)
    bot = BotConfig(platform="console", bot_id="demo", self_id="bot", busy_policy="merge", overload=overload)
    async with failing_dispatch(redis_url, redis_prefix, Settings(redis_prefix=redis_prefix, bots=[bot])) as failing:
        stage, state, client, session_id = failing.stage, failing.state, failing.client, failing.session_id
        running = TurnRecord(trace_id="t-A", platform="console", bot_id="demo", chat_id="group-1", chat_type="group")
        await running_turn(state, CONVERSATION, running, "msg-A", session_id=session_id)
        told = current(metrics.OVERLOADED.labels("console", "demo"))
        await stage.handle(command("m-B"), 0)
        await state.markers.set_marker("sent", "msg-m-B", CONVERSATION, value="failed:provider_error")
        await asyncio.sleep(0.4)
        await stage.handle(command("m-C"), 0)
        assert await end_turn(state, session_id, "msg-A", "idle-A") == 2
        await stage.handle(flush_command(), 0)
        (notice,) = failing.recorder.replies()
        assert notice.trace_id == "t-m-B"
        assert notice.segments[0].data.text == stage.notifier.text(bot, "provider_error")  # type: ignore[union-attr]
        assert current(metrics.OVERLOADED.labels("console", "demo")) == told
        assert await received(client, session_id) == [("msg-m-C", ["m-C"])]


@asynccontextmanager
async def waiting_on_custom_tool(
    redis_url: str, redis_prefix: str
) -> AsyncIterator[tuple[FailingDispatch, PendingAction]]:
    """Dispatch against the simulator, its session waiting on a custom tool's result, the
    conversation as render leaves it then (the stream released)."""
    async with failing_dispatch(redis_url, redis_prefix) as failing:
        stage, state, client, session_id = failing.stage, failing.state, failing.client, failing.session_id
        ask = command("m-1")
        ask.events[0]["content"] = [{"type": "text", "text": "[sim:custom_tool=lookup] the weather"}]
        await stage.handle(ask, 0)
        *_, use = await collect_until(client, session_id, after=None, stop_types=("agent.custom_tool_use",), within=5)
        assert isinstance(use, AgentCustomToolUse)
        pending = PendingAction(event_id=str(use.id), kind="custom_tool", name="lookup")
        await stage.streams.untrack(0, session_id, CONVERSATION)
        await state.conversations.update_conversation(CONVERSATION, status="requires_action", pending=[pending])
        yield failing, pending


def tool_result(pending: PendingAction, content: list[dict[str, object]]) -> SessionCommand:
    event = {"type": "user.custom_tool_result", "custom_tool_use_id": pending.event_id, "content": content}
    return command("m-1").model_copy(update={"kind": "tool_result", "events": [event], "inbound_ids": []})


async def test_a_custom_tool_result_the_session_refuses_ends_the_turn(redis_url: str, redis_prefix: str) -> None:
    """Render ran the agent's custom tool; the session refuses its result (400). Nothing else
    would ever answer that tool use, so the turn is interrupted: the chat is told once (the
    failure), the turn's end is marked as dispatch's (render takes it silently) and the stream
    held for it. (Before, the conversation stayed waiting on a result that never came: every
    later message was held until the chat's /stop.)"""
    async with waiting_on_custom_tool(redis_url, redis_prefix) as (failing, pending):
        stage, state, client, session_id = failing.stage, failing.state, failing.client, failing.session_id
        recorder = failing.recorder
        await stage.handle(tool_result(pending, [{"type": "text", "text": 5}]), 0)
        assert [(n.kind, n.trace_id) for n in recorder.replies()] == [("notice", "t-m-1")]
        bot = stage.settings.bot("console", "demo")
        assert bot is not None
        assert recorder.replies()[0].segments[0].data.text == stage.notifier.text(bot, "provider_error")  # type: ignore[union-attr]
        after = await state.conversations.conversation(CONVERSATION)
        assert (after.status, after.pending, after.interrupted) == ("running", [], "failed")
        assert stage.streams.open_streams == 1
        events = [e.type async for e in client.list(session_id)]
        assert events[events.index("user.interrupt") :][-1] == "session.status_idle"
        (letter,) = [DeadLetter.model_validate_json(v) for t, v in recorder.records if t == "im.deadletter"]
        assert letter.reason == "session_api_error"


async def test_a_custom_tool_result_refused_while_the_api_is_down_waits_for_stop(
    redis_url: str, redis_prefix: str
) -> None:
    """When the interrupt is refused too (the session API answers 500 to everything), the
    conversation stays as it was, waiting on the result: the chat is told, and its /stop (or an
    operator's replay of the dead letter) ends it once the API is back."""
    async with waiting_on_custom_tool(redis_url, redis_prefix) as (failing, pending):
        stage, state, client, session_id = failing.stage, failing.state, failing.client, failing.session_id
        faults, recorder = failing.faults, failing.recorder
        faults.update({"rate_500": 1.0})
        await stage.handle(tool_result(pending, [{"type": "text", "text": "sunny"}]), 0)
        assert [(n.kind, n.trace_id) for n in recorder.replies()] == [("notice", "t-m-1")]
        after = await state.conversations.conversation(CONVERSATION)
        assert (after.status, after.pending, after.interrupted) == ("requires_action", [pending], None)
        assert stage.streams.open_streams == 0
        faults.update({"rate_500": 0.0})
        await stage.handle(command("m-2").model_copy(update={"kind": "interrupt", "events": []}), 0)
        events = [e.type async for e in client.list(session_id)]
        assert events[events.index("user.interrupt") :][-1] == "session.status_idle"


async def test_a_refused_custom_tool_result_read_again_leaves_the_ended_turn_as_it_was(
    redis_url: str, redis_prefix: str
) -> None:
    """The refused result's record is read again after dispatch ended its turn (a rebalance before
    the record was acknowledged): the session refuses it again, and the conversation, the turn's
    stream included, stays as dispatch left it, so the interrupted end still reaches render. (Put
    back as if waiting on the chat, the stream was released: the turn stayed `running` for good.)
    The chat is told under the same notice id (egress sends it once)."""
    async with waiting_on_custom_tool(redis_url, redis_prefix) as (failing, pending):
        stage, state, recorder = failing.stage, failing.state, failing.recorder
        refused = tool_result(pending, [{"type": "text", "text": 5}])
        await stage.handle(refused, 0)
        await stage.handle(refused, 0)
        after = await state.conversations.conversation(CONVERSATION)
        assert (after.status, after.pending, after.interrupted) == ("running", [], "failed")
        assert stage.streams.open_streams == 1
        assert len({n.outbound_id for n in recorder.replies()}) == 1
