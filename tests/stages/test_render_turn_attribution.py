"""Render attributes each idle to the oldest turn sent to the session and not yet ended, whatever
"the current turn" in the state says. Against a real Redis; what render produces goes to a
recorder at the producer seam (the broker path is covered by the integration and chaos suites)."""

from __future__ import annotations

import json

import pytest

from pipeline.records import Position, SessionCommand, SessionEventRecord
from pipeline.runtime import reply_policy
from pipeline.segments.media import MediaChecker, MediaSettings
from pipeline.settings import Settings
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.stages.render import RenderStage
from pipeline.stages.tools import ImTools
from pipeline.state import State, TurnRecord
from tests.conftest import connect_state

from .turns import Recorder, round_trips

pytestmark = pytest.mark.usefixtures("close_connected_states")

CONVERSATION = "console:demo:chat-1"
REPLY = json.dumps({"segments": [{"type": "text", "data": {"text": "hi"}}]})


def render_stage(redis_url: str, prefix: str) -> tuple[RenderStage, Recorder]:
    s = Settings(redis_prefix=prefix, console_enabled=True)  # the console bot `demo`
    state = connect_state(redis_url, s.redis_prefix)
    recorder = Recorder()
    stage = RenderStage(
        s,
        state,
        Outputs(recorder),
        Notifier(s),
        {(b.platform, b.bot_id): reply_policy(b, s) for b in s.bots},
        {},
        ImTools(s, state.conversations),
    )
    return stage, recorder


async def send_turn(state: State, message_id: str) -> None:
    """What dispatch records when it sends a user message (a later turn replaces `turn`)."""
    turn = TurnRecord(
        trace_id=f"t-{message_id}",
        platform="console",
        bot_id="demo",
        chat_id="chat-1",
        chat_type="private",
        starter_id="u1",
        reply_to_message_id=f"in-{message_id}",
    )
    await state.conversations.map_session(CONVERSATION, "s1")
    start = await state.conversations.begin_turn(
        CONVERSATION, 0, turn_id=message_id, mode="interrupt", turn=turn, command_json="{}", trace_id=turn.trace_id
    )
    assert start.decision == "start"


async def agent_says(state: State) -> None:
    await state.conversations.update_conversation(CONVERSATION, last_message=REPLY)


def agent_message(event_id: str) -> SessionEventRecord:
    return SessionEventRecord(
        conversation_key=CONVERSATION,
        session_id="s1",
        event={"type": "agent.message", "id": event_id, "content": [{"type": "text", "text": REPLY}]},
    )


def idle(event_id: str) -> SessionEventRecord:
    return SessionEventRecord(
        conversation_key=CONVERSATION,
        session_id="s1",
        event={"type": "session.status_idle", "id": event_id, "stop_reason": {"type": "end_turn"}},
    )


async def test_each_idle_answers_the_oldest_turn_sent(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await send_turn(stage.state, "msg-B")  # sent while A ran (its state replaced A's)
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-1"))
    assert [r.reply_to_message_id for r in recorder.replies()] == ["in-msg-A"]
    assert (await stage.state.conversations.conversation(CONVERSATION)).status == "running"  # B still runs
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-2"))
    assert [r.reply_to_message_id for r in recorder.replies()] == ["in-msg-A", "in-msg-B"]
    assert (await stage.state.conversations.conversation(CONVERSATION)).status == "idle"


async def test_a_replayed_idle_binds_the_same_turn(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await send_turn(stage.state, "msg-B")
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-1"))
    # A crash after the reply but before the handled marker: the idle comes again.
    await stage.state.markers.redis.execute("DEL", stage.state.keys.marker("turnend", "sevt-idle-1", CONVERSATION))
    await stage.handle(idle("sevt-idle-1"))
    replies = recorder.replies()
    assert replies[0].reply_to_message_id == "in-msg-A"
    # The replay's output has the first one's outbound id: egress delivers it once.
    assert len({r.outbound_id for r in replies}) == 1
    assert await stage.state.conversations.turns_in_session(CONVERSATION) == ["msg-B"]  # B was not taken


async def test_an_idle_of_no_turn_in_flight_is_ignored(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await stage.state.conversations.drop_turn(CONVERSATION, "msg-A")  # its send failed; the chat got a notice
    await stage.state.conversations.update_conversation(CONVERSATION, status="idle")
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-late"))  # the session ran it after all
    assert recorder.replies() == []
    assert await stage.state.markers.marker("turnend", "sevt-idle-late", CONVERSATION) == "1"


async def test_held_messages_wait_for_the_last_turn_sent(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await send_turn(stage.state, "msg-B")
    start = await stage.state.conversations.begin_turn(
        CONVERSATION, 0, turn_id="msg-C", mode="merge", turn=TURN_C, command_json="{}", trace_id="t-C"
    )
    assert start.decision == "held"
    await agent_says(stage.state)
    await stage.handle(idle("i1"))
    assert flushes(recorder) == 0  # B still runs: nothing to flush yet
    await agent_says(stage.state)
    await stage.handle(idle("i2"))
    assert flushes(recorder) == 1  # idle now: flush the one held
    assert (await stage.state.conversations.conversation(CONVERSATION)).status == "idle"
    # A crash after the end was written but before the flush reached the broker: the replayed
    # idle finds the flush owed and asks for it again (a repeat is harmless).
    await stage.handle(idle("i2"))
    assert flushes(recorder) == 2


async def test_a_flush_is_started_in_place_once_its_record_is_produced(redis_url: str, redis_prefix: str) -> None:
    """Where dispatch runs in the same worker, render also hands the flush to it at once (the
    record, produced first, stays the durable way: a crash replays it), with the conversation's
    partition; the replayed idle hands it again."""
    stage, recorder = render_stage(redis_url, redis_prefix)
    handed: list[tuple[str, str, int, int]] = []

    async def flush_now(command: SessionCommand, partition: int) -> None:
        handed.append((command.kind, command.conversation_key, partition, flushes(recorder)))

    stage.flush_now = flush_now
    await send_turn(stage.state, "msg-A")
    start = await stage.state.conversations.begin_turn(
        CONVERSATION, 3, turn_id="msg-C", mode="merge", turn=TURN_C, command_json="{}", trace_id="t-C"
    )
    assert start.decision == "held"
    await agent_says(stage.state)
    await stage.handle(idle("i1"), 3)
    assert handed == [("flush", CONVERSATION, 3, 1)]  # after its record
    (record,) = [SessionCommand.model_validate_json(v) for t, v in recorder.records if t == "session.input"]
    await stage.handle(idle("i1"), 3)
    assert handed[1:] == [("flush", CONVERSATION, 3, 2)]
    assert record.kind == "flush" and record.trace_id.startswith("flush-")


async def test_a_message_and_its_idle_in_one_batch_need_no_write_of_their_own(
    redis_url: str, redis_prefix: str
) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    records = [agent_message("sevt-msg-1"), idle("sevt-idle-1")]
    works = await stage.admit(records, [Position("session.events", 0, n) for n in range(2)])
    assert works[1] is None and works[0] is not None  # one work for the conversation, on its first record
    before = round_trips()
    await works[0]()
    (reply,) = recorder.replies()
    assert reply.reply_to_message_id == "in-msg-A"
    assert round_trips() - before == 2  # which turn it ends, then its end: no write for the message


TURN_C = TurnRecord(trace_id="t-C", platform="console", bot_id="demo", chat_id="chat-1", chat_type="private")


def flushes(recorder: Recorder) -> int:
    return sum(1 for t, v in recorder.records if t == "session.input" and b'"flush"' in v)


async def test_stopped_quotes_the_message_whose_turn_it_stopped(redis_url: str, redis_prefix: str) -> None:
    """Like the answers to /reset and to a /stop with nothing running, "Stopped." says what it is
    about: the message whose turn /stop interrupted."""
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await stage.state.conversations.update_conversation(CONVERSATION, interrupted="stop")
    await stage.handle(idle("sevt-idle-1"))
    (notice,) = recorder.replies()
    assert notice.kind == "notice" and notice.segments[0].data.text == "Stopped."  # type: ignore[union-attr]
    assert notice.reply_to_message_id == "in-msg-A"
    assert notice.notes == []


async def test_a_turn_dispatch_ended_after_a_failure_ends_without_a_notice(redis_url: str, redis_prefix: str) -> None:
    """Dispatch interrupts a turn whose custom tool result the session refused, and tells the chat
    itself: the interrupted end says nothing more ("Stopped." would read as the chat's own /stop),
    and the conversation is free for the next message."""
    stage, recorder = render_stage(redis_url, redis_prefix)
    await send_turn(stage.state, "msg-A")
    await agent_says(stage.state)
    await stage.state.conversations.update_conversation(CONVERSATION, interrupted="failed")
    await stage.handle(idle("sevt-idle-1"))
    assert recorder.replies() == []
    after = await stage.state.conversations.conversation(CONVERSATION)
    assert (after.status, after.interrupted, after.last_message) == ("idle", None, None)


async def test_a_reply_says_why_each_of_its_media_was_refused(redis_url: str, redis_prefix: str) -> None:
    """The console shows each "[attachment unavailable]" with its reason: the bounded labels the
    metric counts, in the order of the placeholders."""
    stage, recorder = render_stage(redis_url, redis_prefix)
    stage.media = MediaChecker(MediaSettings())  # no media root: a path is refused, nothing is fetched
    await send_turn(stage.state, "msg-A")
    reply = {
        "segments": [
            {"type": "text", "data": {"text": "two charts:"}},
            {"type": "image", "data": {"media": {"kind": "base64", "value": "not base64!"}}},
            {"type": "image", "data": {"media": {"kind": "path", "value": "/srv/chart.png"}}},
        ]
    }
    await stage.state.conversations.update_conversation(CONVERSATION, last_message=json.dumps(reply))
    await stage.handle(idle("sevt-idle-1"))
    (message,) = recorder.replies()
    texts = [s.data.text for s in message.segments]  # type: ignore[union-attr]
    assert [t.strip() for t in texts] == ["two charts:", "[attachment unavailable]", "[attachment unavailable]"]
    assert message.media_rejected == ["bad_base64", "path_not_allowed"]
    # A reply without refused media carries none (the record stays as older workers wrote it).
    await send_turn(stage.state, "msg-B")
    await agent_says(stage.state)
    await stage.handle(idle("sevt-idle-2"))
    outbound = [json.loads(v) for t, v in recorder.records if t.startswith("im.outbound.")]
    assert len(outbound) == 2 and outbound[1]["segments"][0]["data"]["text"] == "hi"
    assert "media_rejected" not in outbound[1] and outbound[0]["media_rejected"] == ["bad_base64", "path_not_allowed"]
