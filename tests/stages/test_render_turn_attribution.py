"""Render attributes each idle to the oldest turn sent to the session and not yet ended, whatever
"the current turn" in the state says. Against a real Redis; what render produces goes to a
recorder at the producer seam (the broker path is covered by the integration and chaos suites)."""

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
REPLY = json.dumps({"segments": [{"type": "text", "data": {"text": "hi"}}]})


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes]] = []

    async def __call__(self, topic: str, key: str | None, value: bytes) -> None:
        self.records.append((topic, value))

    def replies(self) -> list[OutboundMessage]:
        return [OutboundMessage.model_validate_json(v) for t, v in self.records if t.startswith("im.outbound.")]


def render_stage(redis_url: str, prefix: str) -> tuple[RenderStage, Recorder]:
    s = Settings(redis_prefix=prefix, console_enabled=True)  # the console bot `demo`
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
    return stage, recorder


async def send_turn(state: StateStore, message_id: str) -> None:
    """What dispatch records when it sends a user message (a later turn replaces `turn`)."""
    turn = TurnContext(
        trace_id=f"t-{message_id}",
        platform="console",
        bot_id="demo",
        chat_id="chat-1",
        chat_type="private",
        starter_id="u1",
        reply_to_message_id=f"in-{message_id}",
    )
    stream = InflightStream(session_id="s1", conversation_key=CONVERSATION)
    await state.start_turn(CONVERSATION, 0, stream, turn_id=message_id, status="running", turn=turn, session_id="s1")


async def agent_says(state: StateStore) -> None:
    await state.update_conversation(CONVERSATION, last_message=REPLY)


def idle(event_id: str) -> SessionEventRecord:
    return SessionEventRecord(
        conversation_key=CONVERSATION,
        session_id="s1",
        event={"type": "session.status_idle", "id": event_id, "stop_reason": {"type": "end_turn"}},
        event_type="session.status_idle",
        event_id=event_id,
    )


async def test_each_idle_answers_the_oldest_turn_sent(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await send_turn(stage.state, "msg-B")  # sent while A ran (its state replaced A's)
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-1"))
    assert [r.reply_to_message_id for r in recorder.replies()] == ["in-msg-A"]
    assert (await stage.state.conversation(CONVERSATION)).status == "running"  # B still runs
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-2"))
    assert [r.reply_to_message_id for r in recorder.replies()] == ["in-msg-A", "in-msg-B"]
    assert (await stage.state.conversation(CONVERSATION)).status == "idle"


async def test_a_replayed_idle_binds_the_same_turn(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await send_turn(stage.state, "msg-B")
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-1"))
    # A crash after the reply but before the handled marker: the idle comes again.
    await stage.state.clear_marker("turnend", "sevt-idle-1")
    await stage.handle(idle("sevt-idle-1"))
    replies = recorder.replies()
    assert replies[0].reply_to_message_id == "in-msg-A"
    # The replay's output has the first one's outbound id: egress delivers it once.
    assert len({r.outbound_id for r in replies}) == 1
    assert await stage.state.turns_in_session(CONVERSATION) == ["msg-B"]  # B was not taken


async def test_an_idle_of_no_turn_in_flight_is_ignored(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await stage.state.drop_turn(CONVERSATION, "msg-A")  # its send failed; the chat got a notice
    await stage.state.update_conversation(CONVERSATION, status="idle")
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-late"))  # the session ran it after all
    assert recorder.replies() == []
    assert await stage.state.marker("turnend", "sevt-idle-late") == "1"


async def test_held_messages_wait_for_the_last_turn_sent(redis_url: str, redis_prefix: str) -> None:
    stage, _ = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await send_turn(stage.state, "msg-B")
    assert await stage.state.hold_if_busy(CONVERSATION, '{"held": 1}')
    assert await stage.state.bind_turn_end(CONVERSATION, "i1") is not None
    assert await stage.state.finish_turn(CONVERSATION, None) == -1  # B still runs: nothing to flush
    assert await stage.state.bind_turn_end(CONVERSATION, "i2") is not None
    assert await stage.state.finish_turn(CONVERSATION, None) == 1  # idle now: flush the one held
    assert (await stage.state.conversation(CONVERSATION)).status == "idle"
