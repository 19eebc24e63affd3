"""Event models: tagged unions (P2), unknown types kept, P1 serialisation, Ark extensions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pipeline.session import models as m
from pipeline.session.models import parse_client_event, parse_server_event, serialize_client_event

BLOCKS: list[dict[str, Any]] = [
    {"type": "text", "text": "hi"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
    {"type": "image", "source": {"type": "file", "file_id": "file-1"}},
    {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
        "title": "T",
        "context": "C",
    },
    {"type": "document", "source": {"type": "url", "url": "https://x/doc.pdf"}},
    {"type": "document", "source": {"type": "file", "file_id": "file-2"}},
    {"type": "video", "source": {"type": "base64", "media_type": "video/mp4", "data": "AAAA", "fps": 0.2}},
    {"type": "video", "source": {"type": "url", "url": "https://x/v.mov", "fps": 5}},
    {"type": "video", "source": {"type": "file", "file_id": "file-3"}},
    {
        "type": "search_result",
        "source": "https://example.com",
        "title": "Example",
        "content": [{"type": "text", "text": "snippet"}],
        "citations": {"enabled": True},
    },
]

SERVER_EVENTS: list[dict[str, Any]] = [
    {"type": "agent.message", "content": [{"type": "text", "text": "a"}]},
    {"type": "agent.thinking", "content": [{"type": "text", "text": "hmm"}]},
    {"type": "agent.tool_use", "name": "skill", "input": {"name": "pdf"}, "evaluated_permission": "allow"},
    {"type": "agent.tool_result", "tool_use_id": "sevt-1", "is_error": False},
    {
        "type": "agent.mcp_tool_use",
        "mcp_server_name": "gh",
        "name": "search",
        "input": {},
        "evaluated_permission": "ask",
    },
    {
        "type": "agent.mcp_tool_result",
        "mcp_tool_use_id": "sevt-2",
        "content": [{"type": "text", "text": "r"}],
        "is_error": False,
    },
    {"type": "agent.custom_tool_use", "name": "draw", "input": {"q": 1}, "session_thread_id": "sthr-1"},
    {"type": "agent.thread_message_received", "content": [], "from_session_thread_id": "sthr-1", "from_agent_name": ""},
    {"type": "agent.thread_message_sent", "content": [], "to_session_thread_id": "sthr-1", "to_agent_name": "r"},
    {"type": "agent.thread_context_compacted"},
    {
        "type": "session.error",
        "error": {
            "type": "mcp_connection_failed_error",
            "message": "x",
            "retry_status": {"type": "terminal"},
            "mcp_server_name": "gh",
        },
    },
    {"type": "session.deleted"},
    {"type": "session.thread_created", "agent_name": "r", "session_thread_id": "sthr-1"},
    {"type": "session.status_running"},
    {
        "type": "session.usage",
        "usage": {
            "active_seconds": 1.5,
            "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
            "cache_read_input_tokens": 1,
            "input_tokens": 2,
            "output_tokens": 3,
            "server_tool_use": {
                "web_fetch_requests": 0,
                "web_search_requests": 1,
                "general_search_requests": 2,
                "visual_search_requests": 3,
            },
        },
    },
    {"type": "session.status_idle", "stop_reason": {"type": "requires_action", "event_ids": ["sevt-3"]}},
    {"type": "session.status_idle", "stop_reason": {"type": "budget_reached"}},
    {"type": "session.status_rescheduled"},
    {"type": "session.status_terminated"},
    {"type": "session.thread_status_running", "agent_name": "a", "session_thread_id": "sthr-1"},
    {
        "type": "session.thread_status_idle",
        "agent_name": "a",
        "session_thread_id": "sthr-1",
        "stop_reason": {"type": "end_turn"},
    },
    {"type": "session.thread_status_rescheduled", "agent_name": "a", "session_thread_id": "sthr-1"},
    {"type": "session.thread_status_terminated", "agent_name": "a", "session_thread_id": "sthr-1"},
    {"type": "span.model_request_start"},
    {
        "type": "span.model_request_end",
        "model_request_start_id": "sevt-4",
        "model_usage": {
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "input_tokens": 1,
            "output_tokens": 2,
            "speed": "fast",
        },
        "is_error": False,
    },
    {"type": "event_start", "event": {"type": "agent.thinking", "id": "sevt-5"}},
    {
        "type": "event_delta",
        "event_id": "sevt-5",
        "delta": {"type": "content_delta", "index": 0, "content": {"type": "text", "text": "x"}},
    },
    {"type": "user.message", "content": BLOCKS[:10]},
    {"type": "user.tool_result", "tool_use_id": "sevt-1", "content": BLOCKS},
]


@pytest.mark.parametrize("raw", SERVER_EVENTS, ids=lambda raw: raw["type"])
def test_every_server_event_round_trips(raw: dict[str, Any]) -> None:
    stamped = {"id": "sevt-abc", "processed_at": "2026-04-01T00:00:00.000001Z", **raw}
    event = parse_server_event(stamped)
    assert not isinstance(event, m.UnknownEvent), getattr(event, "error", None)
    assert event.type == raw["type"]
    assert event.model_dump(mode="json", exclude_none=True) == stamped


@pytest.mark.parametrize(
    "block", BLOCKS, ids=lambda b: f"{b['type']}-{b['source']['type'] if isinstance(b.get('source'), dict) else ''}"
)
def test_every_block_parses_to_its_class(block: dict[str, Any]) -> None:
    event = parse_server_event({"type": "user.tool_result", "id": "x", "tool_use_id": "t", "content": [block]})
    assert isinstance(event, m.UserToolResult)
    assert not isinstance(event.content[0], m.UnknownBlock)
    assert event.content[0].model_dump(mode="json", exclude_none=True) == block


def test_unknown_event_and_block_are_kept_raw() -> None:
    raw = {"type": "session.future_thing", "id": "sevt-9", "processed_at": "t", "payload": {"a": [1]}}
    event = parse_server_event(raw)
    assert isinstance(event, m.UnknownEvent)
    assert event.raw == raw and event.id == "sevt-9" and event.error is None
    assert event.model_dump() == raw
    message = parse_server_event({"type": "agent.message", "id": "x", "content": [{"type": "hologram", "z": 1}]})
    assert isinstance(message, m.AgentMessage)
    assert isinstance(message.content[0], m.UnknownBlock)
    assert message.content[0].raw == {"type": "hologram", "z": 1}


def test_unknown_fields_are_kept_for_forward_compatibility() -> None:
    event = parse_server_event({"type": "session.status_running", "id": "x", "new_field": 3})
    assert event.model_dump()["new_field"] == 3


def test_malformed_known_event_does_not_raise() -> None:
    event = parse_server_event({"type": "session.status_idle", "id": "x"})  # stop_reason missing
    assert isinstance(event, m.UnknownEvent) and event.error
    assert isinstance(m.parse_server_event_json(b"not json"), m.UnknownEvent)
    assert isinstance(m.parse_server_event_json(b"[1, 2]"), m.UnknownEvent)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["type", "id", "content", "stop_reason", "event", "delta", "error", "usage"]),
        st.one_of(
            st.none(),
            st.integers(),
            st.text(max_size=5),
            st.sampled_from(sorted(m.SERVER_EVENT_TYPES)),
            st.lists(st.integers(), max_size=2),
        ),
    )
)
def test_parse_server_event_never_raises(raw: dict[str, Any]) -> None:
    parse_server_event(raw)


def test_video_fps_bounds() -> None:
    for fps in (0.1, 5.5):
        with pytest.raises(ValidationError):
            m.VideoBlock(source=m.UrlVideoSource(url="u", fps=fps))
    with pytest.raises(ValidationError):
        m.VideoBlock.model_validate(
            {"type": "video", "source": {"type": "base64", "media_type": "video/webm", "data": "A"}}
        )
    assert m.VideoBlock(source=m.UrlVideoSource(url="u", fps=0.2)).source.fps == 0.2  # type: ignore[union-attr]


def test_client_serialisation_is_type_and_business_fields_only() -> None:
    """P1: no id/processed_at/None fields, except the caller's stable user.message id (P3)."""
    message = m.UserMessage(id="stable-1", processed_at="t", content=[m.TextBlock(text="hi")])
    assert serialize_client_event(message) == {
        "type": "user.message",
        "id": "stable-1",
        "content": [{"type": "text", "text": "hi"}],
    }
    assert serialize_client_event(m.UserMessage(content=[m.TextBlock(text="x")])) == {
        "type": "user.message",
        "content": [{"type": "text", "text": "x"}],
    }
    confirmation = m.UserToolConfirmation(id="server-id", result="allow", tool_use_id="sevt-1")
    assert serialize_client_event(confirmation) == {
        "type": "user.tool_confirmation",
        "result": "allow",
        "tool_use_id": "sevt-1",
    }
    assert serialize_client_event(m.UserInterrupt()) == {"type": "user.interrupt"}
    result = m.UserCustomToolResult(custom_tool_use_id="sevt-2", content=[m.TextBlock(text="ok")], is_error=True)
    assert serialize_client_event(result) == {
        "type": "user.custom_tool_result",
        "custom_tool_use_id": "sevt-2",
        "content": [{"type": "text", "text": "ok"}],
        "is_error": True,
    }


def test_client_event_validation() -> None:
    with pytest.raises(ValidationError):
        parse_client_event({"type": "system.message", "content": []})  # at least one text block
    with pytest.raises(ValidationError):
        parse_client_event({"type": "user.tool_confirmation", "result": "maybe", "tool_use_id": "x"})
    assert isinstance(parse_client_event({"type": "user.interrupt", "session_thread_id": "sthr-1"}), m.UserInterrupt)


def test_delta_shapes_and_helpers() -> None:
    spec_shape = m.ContentDelta.model_validate(
        {"type": "content_delta", "index": 1, "content": {"type": "text", "text": "ab"}}
    )
    ark_shape = m.ContentDelta.model_validate(
        {"type": "content_delta", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    )
    assert spec_shape.text == ark_shape.text == "ab"
    skill = m.AgentToolUse(name="Skill", input={"skill": "pptx"})
    assert skill.skill_name == "pptx"
    assert m.AgentToolUse(name="bash").skill_name is None
    loaded = parse_server_event({"type": "agent.tool_result", "id": "x", "tool_use_id": "y", "is_error": False})
    assert isinstance(loaded, m.AgentToolResult) and loaded.content is None  # loaded, body not visible
