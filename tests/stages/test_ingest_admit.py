"""Ingest's batch step against a real Redis: one round trip decides a batch, in offset order.

What ingest produces goes through `Outputs`' producer seam; here a recorder stands in for the
broker (the broker path is covered by the integration suites).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pipeline.controls.moderation import ModerationConfig, ModerationHook
from pipeline.platforms import WebhookRequest
from pipeline.platforms.console import ConsolePlatform
from pipeline.records import (
    ConversationRef,
    InboundMessage,
    OutboundMessage,
    Sender,
    SessionCommand,
    parse_conversation_key,
)
from pipeline.segments.models import ImageSegment, Media, MediaData
from pipeline.settings import BotConfig, Settings
from pipeline.stages._ids import inbound_dedup_id, user_message_id
from pipeline.stages.ingest import IngestStage
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.stages.work import SharedWork
from pipeline.state import AdmissionResult, ContextEntry, InboundAdmission
from pipeline.state.markers import MarkerStore
from pipeline.topics import SESSION_INPUT
from tests.conftest import connect_state
from tests.controls.moderation_hook import ModerationStandIn

from .turns import round_trips

pytestmark = pytest.mark.usefixtures("close_connected_states")


def metric_value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[str, str | None, bytes]] = []

    async def __call__(self, topic: str, key: str | None, value: bytes) -> None:
        self.records.append((topic, key, value))

    def turns(self) -> list[SessionCommand]:
        return [SessionCommand.model_validate_json(v) for t, _, v in self.records if t == SESSION_INPUT]


def stage(redis_url: str, prefix: str, **settings: Any) -> tuple[IngestStage, Recorder]:
    s = Settings(redis_prefix=prefix, console_enabled=True, **settings)  # the console bot `demo`
    state = connect_state(redis_url, s.redis_prefix)
    recorder = Recorder()
    return IngestStage(s, state, Outputs(recorder), Notifier(s), lambda bot, m, w: None), recorder


def msg(i: int, text: str = "chatting", *, chat: str = "g", chat_type: str = "group", **extra: Any) -> InboundMessage:
    return InboundMessage(
        platform=extra.pop("platform", "console"),
        bot_id=extra.pop("bot_id", "demo"),
        chat_id=chat,
        chat_type=chat_type,
        sender=Sender(user_id=f"u{i}", name=f"user {i}"),
        message_id=f"m{i}",
        text=text,
        conversation_key=f"console:demo:{chat}",
        trace_id=f"t{i}",
        **extra,
    )


async def run(ingest: IngestStage, recorder: Recorder, batch: list[InboundMessage]) -> list[bool]:
    """Admit a batch and run what remains: per message, whether it produced a record (a turn, a
    command's output, a dead letter)."""
    produced = []
    shared: set[SharedWork] = set()
    for work in await ingest.admit(batch):
        before = len(recorder.records)
        if isinstance(work, SharedWork):
            if work not in shared:
                shared.add(work)
                await work.run()
        elif work is not None:
            await work()
        produced.append(len(recorder.records) > before)
    return produced


async def test_a_batch_settles_chatter_and_keeps_order_for_the_turn(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix, group_context_size=3)
    batch = [
        msg(1),
        msg(2),
        msg(3, "@bot what was said?", mentions_bot=True),
        msg(4),
        msg(5, chat="dm", chat_type="private"),
    ]
    assert await run(ingest, recorder, batch) == [False, False, True, False, True]
    turns = recorder.turns()
    assert [t.inbound_ids for t in turns] == [["m3"], ["m5"]]
    # The mention saw the two messages before it, not the one after.
    assert turns[0].known_ids == ["u3", "u1", "u2"]
    window = await ingest.state.conversations.context("console:demo:g", 3)
    assert [e.message_id for e in window] == ["m2", "m3", "m4"]


async def test_duplicates_within_and_across_batches_are_dropped(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix)
    mention = msg(7, "@bot hi", mentions_bot=True)
    assert await run(ingest, recorder, [msg(6), msg(6), mention, mention]) == [False, False, True, False]
    # Before dispatch has taken the turn, a redelivered mention produces it again: dispatch drops
    # the copy by its stable id (and marks the message seen in the step that starts or holds it).
    assert await run(ingest, recorder, [msg(6), mention]) == [False, True]
    turns = recorder.turns()
    assert [t.inbound_ids for t in turns] == [["m7"], ["m7"]]
    assert turns[0].events[0]["id"] == turns[1].events[0]["id"]
    await mark_as_dispatch_does(ingest, turns[:1])
    assert await run(ingest, recorder, [msg(6), mention]) == [False, False]
    window = await ingest.state.conversations.context("console:demo:g", 10)
    assert [e.message_id for e in window] == ["m6", "m7"]


async def test_an_unknown_bot_is_dead_lettered_and_the_rest_go_on(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix)
    assert await run(ingest, recorder, [msg(8, bot_id="nobody"), msg(9, "@bot hey", mentions_bot=True)]) == [True, True]
    topics = [t for t, _, _ in recorder.records]
    assert topics == ["im.deadletter", SESSION_INPUT]


async def test_chat_commands_leave_the_window_alone(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix)
    assert await run(ingest, recorder, [msg(10, "/stop")]) == [True]
    assert [t.kind for t in recorder.turns()] == ["interrupt"]
    assert await ingest.state.conversations.context("console:demo:g", 10) == []


def console_message(bot: BotConfig, chat: str, user: str, message_id: str, text: str, **extra: Any) -> InboundMessage:
    """Parsed by the console platform, as ingress does: the record carries its conversation key."""
    body = {"chat_id": chat, "chat_type": "group", "user_id": user, "message_id": message_id, "text": text, **extra}
    [message] = ConsolePlatform().parse(bot, WebhookRequest(headers={}, body=json.dumps(body).encode())).messages
    return message


async def test_ids_with_a_colon_keep_their_conversations_apart(redis_url: str, redis_prefix: str) -> None:
    # Per-user sessions: chat "a:b" + user "c" and chat "a" + user "b:c" were both "console:demo:a:b:c",
    # one session, one context window, one de-duplication id for the same message id.
    bot = BotConfig(platform="console", bot_id="demo", self_id="bot", session_scope="user")
    ingest, recorder = stage(redis_url, redis_prefix, bots=[bot])
    first = [console_message(bot, "a:b", "c", "m1", "chatting"), console_message(bot, "a", "b:c", "m1", "chatting")]
    assert await run(ingest, recorder, first) == [False, False]  # chatter: nothing produced
    asks = [
        console_message(bot, "a:b", "c", "m2", "@bot hi", mentions=["bot"]),
        console_message(bot, "a", "b:c", "m2", "@bot hi", mentions=["bot"]),
    ]
    assert await run(ingest, recorder, asks) == [True, True]

    one, other = recorder.turns()
    assert one.conversation_key != other.conversation_key
    assert parse_conversation_key(one.conversation_key) == ConversationRef("console", "demo", "a:b", "c")
    assert parse_conversation_key(other.conversation_key) == ConversationRef("console", "demo", "a", "b:c")
    # Each turn saw its own window only.
    assert one.known_ids == ["c"] and other.known_ids == ["b:c"]
    redis = ingest.state.markers.redis
    windows = sorted(await redis.execute("KEYS", f"{redis_prefix}ctx:*"))
    assert windows == sorted(ingest.state.keys.window(t.conversation_key) for t in (one, other))
    for turn in (one, other):
        [entry_m1, entry_m2] = await ingest.state.conversations.context(turn.conversation_key, 10)
        assert (entry_m1.message_id, entry_m2.message_id) == ("m1", "m2")
        assert entry_m1.user_id == turn.sender.user_id  # type: ignore[union-attr]
    # Two messages, not one and its duplicate: two markers for the chatter (the asks: below).
    assert len(await redis.execute("KEYS", f"{redis_prefix}dedup:in:*")) == 2
    await mark_as_dispatch_does(ingest, recorder.turns())
    assert len(await redis.execute("KEYS", f"{redis_prefix}dedup:in:*")) == 4


async def mark_as_dispatch_does(ingest: IngestStage, turns: list[SessionCommand]) -> None:
    """Dispatch marks a turn's inbound messages seen when it starts or holds the turn."""
    for turn in turns:
        for message_id in turn.inbound_ids:
            await ingest.state.markers.set_marker(
                "in", inbound_dedup_id(turn.platform, turn.bot_id, turn.chat_id, message_id), turn.conversation_key
            )


async def test_a_message_id_with_a_colon_is_not_taken_for_another_chats_message(
    redis_url: str, redis_prefix: str
) -> None:
    # Chat "g:1" + message "m" and chat "g" + message "1:m" shared the de-duplication id "console:demo:g:1:m".
    bot = BotConfig(platform="console", bot_id="demo", self_id="bot")
    ingest, recorder = stage(redis_url, redis_prefix, bots=[bot])
    assert await run(ingest, recorder, [console_message(bot, "g:1", "u1", "m", "@bot one", mentions=["bot"])]) == [True]
    assert await run(ingest, recorder, [console_message(bot, "g", "u2", "1:m", "@bot two", mentions=["bot"])]) == [True]
    assert [(t.chat_id, t.inbound_ids) for t in recorder.turns()] == [("g:1", ["m"]), ("g", ["1:m"])]
    await mark_as_dispatch_does(ingest, recorder.turns())
    markers = await ingest.state.markers.redis.execute("KEYS", f"{redis_prefix}dedup:in:*")
    assert sorted(markers) == [
        f"{redis_prefix}dedup:in:console:demo:g%3A1:m",
        f"{redis_prefix}dedup:in:console:demo:g:1%3Am",
    ]
    # The same message again is still a duplicate.
    assert await run(ingest, recorder, [console_message(bot, "g", "u2", "1:m", "@bot two", mentions=["bot"])]) == [
        False
    ]


async def test_chatter_waits_to_share_the_next_turns_round_trip(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix, ingest_admission_linger_ms=1000)
    before = round_trips()
    (chatter,) = await ingest.admit([msg(1)])
    # its record is acknowledged once it is admitted, not before
    assert chatter is not None and not isinstance(chatter, SharedWork)
    waiting = asyncio.ensure_future(chatter())
    await asyncio.sleep(0.05)
    assert not waiting.done() and round_trips() == before  # nothing sent yet
    assert await run(ingest, recorder, [msg(2, "@bot what was said?", mentions_bot=True)]) == [True]
    await asyncio.wait_for(waiting, 1)
    assert round_trips() - before == 1  # the chatter went with the turn's admission
    (turn,) = recorder.turns()
    assert turn.known_ids == ["u2", "u1"]  # and before it: the turn saw it in its window
    window = await ingest.state.conversations.context("console:demo:g", 10)
    assert [e.message_id for e in window] == ["m1", "m2"]  # oldest first


async def test_chatter_alone_is_admitted_when_the_linger_is_over(redis_url: str, redis_prefix: str) -> None:
    ingest, _ = stage(redis_url, redis_prefix, ingest_admission_linger_ms=50)
    before = round_trips()
    first = await ingest.admit([msg(1)])
    second = await ingest.admit([msg(2), msg(1)])  # a second batch joins the first's wait
    works = [w for w in first + second if w is not None and not isinstance(w, SharedWork)]
    assert len(works) == 3
    await asyncio.wait_for(asyncio.gather(*(w() for w in works)), 2)
    assert round_trips() - before == 1
    window = await ingest.state.conversations.context("console:demo:g", 10)
    assert [e.message_id for e in window] == ["m1", "m2"]  # the repeated m1 was a duplicate
    assert await ingest.state.markers.marker("in", inbound_dedup_id("console", "demo", "g", "m2"), "console:demo:g")


async def test_a_large_batch_of_chatter_is_started_and_settles_with_one_shared_work(
    redis_url: str, redis_prefix: str
) -> None:
    ingest, recorder = stage(redis_url, redis_prefix, ingest_admission_linger_ms=1000, group_context_size=30)
    before = round_trips()
    filtered = metric_value("switchboard_inbound_filtered_total", platform="console")
    works = await ingest.admit([msg(i) for i in range(20)] + [msg(3)])  # m3 twice in the batch
    (shared,) = set(works[:20])
    assert isinstance(shared, SharedWork) and works[20] is None
    assert round_trips() == before  # started, not waited for
    # The next batch goes on before Redis answers; a turn's admission goes after the chatter's.
    assert await run(ingest, recorder, [msg(20, "@bot what was said?", mentions_bot=True)]) == [True]
    (turn,) = recorder.turns()
    assert "u19" in turn.known_ids  # its window has the chatter before it
    await asyncio.wait_for(shared.run(), 2)
    window = await ingest.state.conversations.context("console:demo:g", 50)
    assert [e.message_id for e in window] == [f"m{i}" for i in range(21)]
    assert metric_value("switchboard_inbound_filtered_total", platform="console") - filtered == 20


async def test_without_a_linger_chatter_settles_in_its_own_round_trip(redis_url: str, redis_prefix: str) -> None:
    ingest, _ = stage(redis_url, redis_prefix, ingest_admission_linger_ms=0)
    assert await ingest.admit([msg(1)]) == [None]
    assert [e.message_id for e in await ingest.state.conversations.context("console:demo:g", 5)] == ["m1"]


class FailingOnce(MarkerStore):
    """The real store, whose first admission fails as if Redis had gone away for a moment."""

    failed = False

    async def admit_inbound(self, items: list[InboundAdmission], context_size: int) -> list[AdmissionResult]:
        if not self.failed:
            self.failed = True
            raise ConnectionError("Redis went away")
        return await super().admit_inbound(items, context_size)


async def test_chatter_whose_shared_call_failed_is_admitted_alone_on_retry(redis_url: str, redis_prefix: str) -> None:
    ingest, _ = stage(redis_url, redis_prefix, ingest_admission_linger_ms=20)
    markers = ingest.state.markers
    ingest.admissions = type(ingest.admissions)(
        FailingOnce(markers.redis, markers.keys, mapping_ttl=markers.mapping_ttl, dedup_ttl=markers.dedup_ttl),
        10,
        linger=0.02,
    )
    (work,) = await ingest.admit([msg(1)])
    assert work is not None and not isinstance(work, SharedWork)
    try:
        await asyncio.wait_for(work(), 1)
    except ConnectionError:  # what the worker's handling retries
        await asyncio.wait_for(work(), 1)
    else:
        raise AssertionError("the shared call's failure reached no work")
    assert [e.message_id for e in await ingest.state.conversations.context("console:demo:g", 5)] == ["m1"]


async def test_a_chats_turns_in_a_row_produce_in_one_work_in_order(redis_url: str, redis_prefix: str) -> None:
    """A flooding chat's triggering messages of one batch wait for the broker once, together, as
    one merged turn (bot `demo` merges); a command of the chat ends the run, so the order of its
    records is kept."""
    ingest, recorder = stage(redis_url, redis_prefix)
    batch = [
        msg(1, "@bot a", mentions_bot=True),
        msg(2, "@bot b", mentions_bot=True),
        msg(3, "@bot other chat", chat="h", mentions_bot=True),
        msg(4, "/stop"),
        msg(5, "@bot c", mentions_bot=True),
        msg(6, "@bot d", mentions_bot=True),
    ]
    works = await ingest.admit(batch)
    assert [w is None for w in works] == [False, True, False, False, False, True]
    assert await run(ingest, recorder, batch) == [True, False, True, True, True, False]
    produced = recorder.turns()
    assert [(t.kind, t.inbound_ids) for t in produced if t.chat_id == "g"] == [
        ("user_turn", ["m1", "m2"]),
        ("interrupt", ["m4"]),
        ("user_turn", ["m5", "m6"]),
    ]
    assert [t.inbound_ids for t in produced if t.chat_id == "h"] == [["m3"]]


def prompting(ingest: IngestStage) -> list[str]:
    """Give the stage a system text that names the message it was built for; returns the list of
    messages it was built for."""
    built: list[str] = []

    def prompt(bot: BotConfig, message: InboundMessage, window: list[ContextEntry]) -> str:
        built.append(message.message_id)
        return f"context of {message.message_id}"

    ingest.prompt = prompt
    return built


async def test_a_merging_bots_triggers_in_a_row_are_one_record(redis_url: str, redis_prefix: str) -> None:
    """Bot `demo` merges: a chat's triggers of one batch are one user turn, merged as dispatch
    merges held turns, with each message's share of the content blocks. Chatter in between does
    not end the run (it produces nothing), and is context for the triggers after it."""
    ingest, recorder = stage(redis_url, redis_prefix, group_context_size=5)
    built = prompting(ingest)
    image = ImageSegment(type="image", data=MediaData(media=Media(kind="url", value="https://img.example/a.png")))
    batch = [
        msg(1, "@bot one", mentions_bot=True),
        msg(2),
        msg(3, "@bot two", mentions_bot=True, segments=[image]),
        msg(4, "@bot three", mentions_bot=True),
    ]
    merged_before = metric_value("switchboard_messages_merged_total", platform="console", where="ingest")
    triggered = metric_value("switchboard_turns_triggered_total", platform="console", reason="mention")
    assert await run(ingest, recorder, batch) == [True, False, False, False]
    (turn,) = recorder.turns()
    assert turn.kind == "user_turn" and turn.inbound_ids == ["m1", "m3", "m4"]
    assert turn.parts == [1, 2, 1]
    (event,) = turn.events
    assert event["id"] == user_message_id("console:demo:g", ["m1", "m3", "m4"])
    content = event["content"]
    assert [block["type"] for block in content] == ["text", "text", "image", "text"]
    assert content[0]["text"].startswith("[user 1 (u1)] ") and content[0]["text"].endswith("one")
    assert content[1]["text"].startswith("[user 3 (u3)] ") and content[1]["text"].endswith("two")
    assert content[2]["source"] == {"type": "url", "url": "https://img.example/a.png"}
    assert content[3]["text"].startswith("[user 4 (u4)] ") and content[3]["text"].endswith("three")
    # The newest message's context, sender and quote; the first's hop times; everyone it saw.
    assert turn.system_text == "context of m4" and built == ["m4"]
    assert turn.reply_to_message_id == "m4" and turn.trace_id == "t4"
    assert turn.sender is not None and turn.sender.user_id == "u4"
    assert turn.hops == batch[0].hops
    assert turn.known_ids == ["u1", "u3", "u2", "u4"]  # each message's, in the order first seen
    merged = metric_value("switchboard_messages_merged_total", platform="console", where="ingest")
    assert merged - merged_before == 3
    after = metric_value("switchboard_turns_triggered_total", platform="console", reason="mention")
    assert after - triggered == 3  # each message still counts as a trigger


async def test_a_merged_turn_carries_at_most_the_merge_window(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix, merge_window_max=2)
    batch = [msg(i, f"@bot {i}", mentions_bot=True) for i in range(1, 6)]
    assert await run(ingest, recorder, batch) == [True, False, False, False, False]
    turns = recorder.turns()
    assert [t.inbound_ids for t in turns] == [["m1", "m2"], ["m3", "m4"], ["m5"]]
    assert [t.parts for t in turns] == [[1, 1], [1, 1], []]  # one message's turn: no parts
    assert b'"parts"' not in recorder.records[-1][2]  # left out of the record, as older workers read it


async def test_messages_in_different_threads_are_not_merged(redis_url: str, redis_prefix: str) -> None:
    """A merged turn is answered once, where its newest message was: a mention in the room and one in
    a thread of it (another route) stay turns of their own, each answered where it was asked."""
    ingest, recorder = stage(redis_url, redis_prefix)
    thread = {"thread_id": "root-1"}
    batch = [
        msg(1, "@bot in the room", mentions_bot=True),
        msg(2, "@bot in the thread", mentions_bot=True, route=thread),
        msg(3, "@bot in the thread again", mentions_bot=True, route=thread),
        msg(4, "@bot back in the room", mentions_bot=True),
    ]
    assert await run(ingest, recorder, batch) == [True, False, False, False]
    turns = recorder.turns()
    assert [t.inbound_ids for t in turns] == [["m1"], ["m2", "m3"], ["m4"]]
    assert [t.route for t in turns] == [{}, thread, {}]


async def test_a_queueing_bot_keeps_one_record_per_trigger(redis_url: str, redis_prefix: str) -> None:
    bot = BotConfig(platform="console", bot_id="demo", self_id="bot", busy_policy="queue")
    ingest, recorder = stage(redis_url, redis_prefix, bots=[bot])
    built = prompting(ingest)
    batch = [msg(i, f"@bot {i}", mentions_bot=True) for i in range(1, 4)]
    assert await run(ingest, recorder, batch) == [True, False, False]  # still one work, one broker wait
    turns = recorder.turns()
    assert [t.inbound_ids for t in turns] == [["m1"], ["m2"], ["m3"]]
    assert [t.system_text for t in turns] == ["context of m1", "context of m2", "context of m3"]
    assert built == ["m1", "m2", "m3"]


HOOK_SECRET = "ingest-hook-secret-0123"


async def test_the_moderation_hook_is_asked_for_each_message_of_a_run(redis_url: str, redis_prefix: str) -> None:
    """A run of triggers is merged only from what the hook lets through: the stopped one gets its
    notice, is taken out of the window, and is marked seen once the notice is in the broker."""
    async with ModerationStandIn(HOOK_SECRET) as hook:
        moderation = ModerationConfig(inbound="notice", hook=ModerationHook(url=hook.url, secret=HOOK_SECRET))
        bot = BotConfig(platform="console", bot_id="demo", self_id="bot", language="en", moderation=moderation)
        ingest, recorder = stage(redis_url, redis_prefix, bots=[bot], group_context_size=5)
        batch = [
            msg(1, "@bot fine", mentions_bot=True),
            msg(2, "@bot forbidden words", mentions_bot=True),
            msg(3, "@bot fine too", mentions_bot=True),
        ]
        try:
            assert await run(ingest, recorder, batch) == [True, False, False]
        finally:
            await ingest.close()
        assert sorted(hook.asked) == ["@bot fine", "@bot fine too", "@bot forbidden words"]  # asked at once
    (turn,) = recorder.turns()
    assert turn.inbound_ids == ["m1", "m3"] and turn.parts == [1, 1]
    (notice,) = [OutboundMessage.model_validate_json(v) for t, _, v in recorder.records if t.startswith("im.outbound.")]
    assert notice.kind == "notice" and notice.reply_to_message_id == "m2"
    window = await ingest.state.conversations.context("console:demo:g", 5)
    assert [e.message_id for e in window] == ["m1", "m3"]
    markers = ingest.state.markers
    assert await markers.marker("in", inbound_dedup_id("console", "demo", "g", "m2"), "console:demo:g")
    # The turn's messages are marked by dispatch, when it starts or holds the turn.
    assert not await markers.marker("in", inbound_dedup_id("console", "demo", "g", "m1"), "console:demo:g")
