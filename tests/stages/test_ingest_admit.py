"""Ingest's batch step against a real Redis: one round trip decides a batch, in offset order.

What ingest produces goes through `Outputs`' producer seam; here a recorder stands in for the
broker (the broker path is covered by the integration suites).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from pipeline.records import InboundMessage, Sender, SessionCommand
from pipeline.settings import Settings
from pipeline.stages.ingest import IngestStage
from pipeline.stages.notices import Notices
from pipeline.stages.outputs import Outputs
from pipeline.state import StateStore
from pipeline.topics import SESSION_INPUT


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[str, str | None, bytes]] = []

    async def __call__(self, topic: str, key: str | None, value: bytes) -> None:
        self.records.append((topic, key, value))

    def turns(self) -> list[SessionCommand]:
        return [SessionCommand.model_validate_json(v) for t, _, v in self.records if t == SESSION_INPUT]


def stage(redis_url: str, prefix: str, **settings: Any) -> tuple[IngestStage, Recorder]:
    s = Settings(redis_prefix=prefix, console_enabled=True, **settings)  # the console bot `demo`
    state = StateStore(aioredis.from_url(redis_url, decode_responses=True), s.redis_prefix)
    recorder = Recorder()
    return IngestStage(s, state, Outputs(recorder), Notices(s), lambda bot, m, w: None), recorder


def msg(i: int, text: str = "chatting", *, chat: str = "g", chat_type: str = "group", **extra: Any) -> InboundMessage:
    return InboundMessage(
        platform=extra.pop("platform", "console"),
        bot_id=extra.pop("bot_id", "demo"),
        chat_id=chat,
        chat_type=chat_type,  # type: ignore[arg-type]
        sender=Sender(user_id=f"u{i}", name=f"user {i}"),
        message_id=f"m{i}",
        text=text,
        conversation_key=f"console:demo:{chat}",
        trace_id=f"t{i}",
        **extra,
    )


async def run(ingest: IngestStage, batch: list[InboundMessage]) -> list[bool]:
    works = await ingest.admit(batch)
    for work in works:
        if work is not None:
            await work()
    return [w is not None for w in works]


async def test_a_batch_settles_chatter_and_keeps_order_for_the_turn(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix, group_context_size=3)
    batch = [
        msg(1),
        msg(2),
        msg(3, "@bot what was said?", mentions_bot=True),
        msg(4),
        msg(5, chat="dm", chat_type="private"),
    ]
    assert await run(ingest, batch) == [False, False, True, False, True]
    turns = recorder.turns()
    assert [t.inbound_ids for t in turns] == [["m3"], ["m5"]]
    # The mention saw the two messages before it, not the one after.
    assert turns[0].known_ids == ["u3", "u1", "u2"]
    window = await ingest.state.context("console:demo:g", 3)
    assert [e.message_id for e in window] == ["m2", "m3", "m4"]


async def test_duplicates_within_and_across_batches_are_dropped(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix)
    mention = msg(7, "@bot hi", mentions_bot=True)
    assert await run(ingest, [msg(6), msg(6), mention, mention]) == [False, False, True, False]
    assert await run(ingest, [msg(6), mention]) == [False, False]
    assert [t.inbound_ids for t in recorder.turns()] == [["m7"]]
    window = await ingest.state.context("console:demo:g", 10)
    assert [e.message_id for e in window] == ["m6", "m7"]


async def test_an_unknown_bot_is_dead_lettered_and_the_rest_go_on(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix)
    assert await run(ingest, [msg(8, bot_id="nobody"), msg(9, "@bot hey", mentions_bot=True)]) == [True, True]
    topics = [t for t, _, _ in recorder.records]
    assert topics == ["im.deadletter", SESSION_INPUT]


async def test_chat_commands_leave_the_window_alone(redis_url: str, redis_prefix: str) -> None:
    ingest, recorder = stage(redis_url, redis_prefix)
    assert await run(ingest, [msg(10, "/stop")]) == [True]
    assert [t.kind for t in recorder.turns()] == ["interrupt"]
    assert await ingest.state.context("console:demo:g", 10) == []
