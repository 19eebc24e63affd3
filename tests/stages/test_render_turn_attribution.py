"""Render ends only the turn an idle belongs to (the stream tags each event with its turn's
user.message id). Against a real Redis; what render produces goes to a recorder at the producer
seam (the broker path is covered by the integration and chaos suites)."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from pipeline.records import OutboundMessage, SessionEventRecord
from pipeline.runtime import reply_policy
from pipeline.settings import Settings
from pipeline.stages.notices import Notices
from pipeline.stages.outputs import Outputs
from pipeline.stages.render import RenderStage
from pipeline.stages.tools import ImTools
from pipeline.state import InflightStream, StateStore, TurnContext

CONVERSATION = "console:demo:chat-1"


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes]] = []

    async def __call__(self, topic: str, key: str | None, value: bytes) -> None:
        self.records.append((topic, value))

    def replies(self) -> list[OutboundMessage]:
        return [OutboundMessage.model_validate_json(v) for t, v in self.records if t.startswith("im.outbound.")]


async def render_with_turn(redis_url: str, prefix: str, turn_message_id: str) -> tuple[RenderStage, Recorder]:
    s = Settings(redis_prefix=prefix)
    state = StateStore(aioredis.from_url(redis_url, decode_responses=True), s.redis_prefix)
    recorder = Recorder()
    stage = RenderStage(
        s,
        state,
        Outputs(recorder),
        Notices(s),
        {(b.platform, b.bot_id): reply_policy(b, s) for b in s.bots},
        {},
        ImTools(s, state),
    )
    turn = TurnContext(
        trace_id="t",
        platform="console",
        bot_id="demo",
        chat_id="chat-1",
        chat_type="private",
        starter_id="u1",
        reply_to_message_id=f"in-{turn_message_id}",
        message_id=turn_message_id,
    )
    stream = InflightStream(session_id="s1", conversation_key=CONVERSATION)
    await state.start_turn(CONVERSATION, 0, stream, status="running", turn=turn, session_id="s1")
    await state.update_conversation(
        CONVERSATION, last_message=json.dumps({"segments": [{"type": "text", "data": {"text": "hi"}}]})
    )
    return stage, recorder


def idle(event_id: str, turn_message_id: str | None) -> SessionEventRecord:
    return SessionEventRecord(
        conversation_key=CONVERSATION,
        session_id="s1",
        event={"type": "session.status_idle", "id": event_id, "stop_reason": {"type": "end_turn"}},
        event_type="session.status_idle",
        event_id=event_id,
        turn_message_id=turn_message_id,
    )


async def test_an_idle_of_an_earlier_turn_does_not_end_the_running_one(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = await render_with_turn(redis_url, redis_prefix, "msg-B")
    await stage.handle(idle("sevt-idle-A", "msg-A"))  # replayed after the crash: turn A's end
    assert recorder.replies() == []
    state = await stage.state.conversation(CONVERSATION)
    assert state.status == "running" and state.turn is not None and state.turn.message_id == "msg-B"
    assert await stage.state.marker("turnend", "sevt-idle-A") == "1"  # not looked at again


async def test_the_running_turns_own_idle_ends_it_with_its_reply(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = await render_with_turn(redis_url, redis_prefix, "msg-B")
    await stage.handle(idle("sevt-idle-B", "msg-B"))
    (reply,) = recorder.replies()
    assert reply.kind == "reply" and reply.reply_to_message_id == "in-msg-B"
    assert (await stage.state.conversation(CONVERSATION)).status == "idle"


async def test_an_idle_without_a_turn_tag_is_handled_as_before(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = await render_with_turn(redis_url, redis_prefix, "msg-B")
    await stage.handle(idle("sevt-idle-X", None))  # a stream that has not shown the user.message
    assert [r.kind for r in recorder.replies()] == ["reply"]
