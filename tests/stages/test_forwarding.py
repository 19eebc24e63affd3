"""The session stream forwards what render acts on (and the usage budgets count), typed, and nothing else."""

from __future__ import annotations

from pipeline.records import FORWARDED_EVENT_TYPES, SessionEventRecord
from pipeline.session.models import SessionError, SessionStatusIdle, UnknownStopReason, parse_server_event
from pipeline.stages.streams import forwardable


def test_render_gets_messages_tool_calls_errors_and_turn_ends_only() -> None:
    assert FORWARDED_EVENT_TYPES == {
        "agent.message",
        "agent.tool_use",
        "agent.mcp_tool_use",
        "agent.custom_tool_use",
        "session.error",
        "session.status_idle",
        "session.status_terminated",
        "session.deleted",
        "session.usage",
    }
    for kept_out in (
        {"type": "session.status_running"},
        {"type": "span.model_request_start"},
        {"type": "agent.thinking", "content": []},
        {"type": "user.message", "content": [{"type": "text", "text": "hi"}]},
        {"type": "session.thread_status_idle", "session_thread_id": "sthr-1"},
        {"type": "no.such_event"},
    ):
        assert forwardable(parse_server_event(kept_out)) is None


def test_a_forwarded_event_round_trips_typed_through_its_record() -> None:
    event = forwardable(
        parse_server_event(
            {
                "type": "session.status_idle",
                "id": "sevt-1",
                "stop_reason": {"type": "requires_action", "event_ids": ["a"]},
            }
        )
    )
    assert event is not None
    record = SessionEventRecord(conversation_key="console:demo:c", session_id="s1", event=event)
    again = SessionEventRecord.model_validate_json(record.model_dump_json(exclude_none=True))
    assert again == record and isinstance(again.event, SessionStatusIdle)


def test_a_malformed_turn_end_still_ends_the_turn() -> None:
    idle = forwardable(parse_server_event({"type": "session.status_idle", "id": "sevt-2", "stop_reason": 5}))
    assert isinstance(idle, SessionStatusIdle) and isinstance(idle.stop_reason, UnknownStopReason)
    assert idle.id == "sevt-2"
    error = forwardable(parse_server_event({"type": "session.error", "id": "sevt-3", "error": "boom"}))
    assert isinstance(error, SessionError) and error.id == "sevt-3"
    assert forwardable(parse_server_event({"type": "agent.message", "content": 7})) is None
