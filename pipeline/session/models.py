"""Pydantic v2 models of the session event protocol (docs/session-protocol.md).

Every polymorphic object is a tagged union on ``type`` (P2) whose discriminator falls back to an
``Unknown*`` variant holding the raw JSON, so a server that adds an event or block type never
breaks parsing. Server events keep unknown fields (``extra="allow"``) for forward compatibility.

Parsing goes through TypeAdapters built once at import time (hot path: every SSE frame).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)


class _Model(BaseModel):
    # Server payloads may grow fields: keep them rather than fail or drop them.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class _Unknown(BaseModel):
    """Shared shape of the fallback variants: the ``type`` plus the untouched JSON object."""

    model_config = ConfigDict(extra="ignore")

    type: str = ""
    raw: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _capture_raw(cls, data: Any) -> Any:
        if isinstance(data, dict) and "raw" not in data:
            return {"type": str(data.get("type", "")), "raw": data}
        return data

    @model_serializer
    def _dump_raw(self) -> dict[str, Any]:
        return self.raw


def _tagged(known: frozenset[str], unknown_tag: str = "unknown") -> Discriminator:
    """Discriminate on ``type``; anything not in ``known`` goes to the ``unknown`` variant."""

    def pick(value: Any) -> str:
        tag = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return tag if isinstance(tag, str) and tag in known else unknown_tag

    return Discriminator(pick)


# --------------------------------------------------------------------------- content blocks


class Base64Source(_Model):
    type: Literal["base64"] = "base64"
    media_type: str
    data: str


class UrlSource(_Model):
    type: Literal["url"] = "url"
    url: str


class FileSource(_Model):
    type: Literal["file"] = "file"
    file_id: str


class PlainTextSource(_Model):
    """Plain-text document source (``document`` blocks only)."""

    type: Literal["text"] = "text"
    media_type: str = "text/plain"
    data: str


class UnknownSource(_Unknown):
    pass


Fps = Annotated[float, Field(ge=0.2, le=5)]


class Base64VideoSource(_Model):
    type: Literal["base64"] = "base64"
    media_type: Literal["video/mp4", "video/x-msvideo", "video/quicktime"]
    data: str
    fps: Fps | None = None


class UrlVideoSource(_Model):
    type: Literal["url"] = "url"
    url: str
    fps: Fps | None = None


class FileVideoSource(_Model):
    type: Literal["file"] = "file"
    file_id: str
    fps: Fps | None = None


ImageSource = Annotated[
    Annotated[Base64Source, Tag("base64")]
    | Annotated[UrlSource, Tag("url")]
    | Annotated[FileSource, Tag("file")]
    | Annotated[UnknownSource, Tag("unknown")],
    _tagged(frozenset({"base64", "url", "file"})),
]
DocumentSource = Annotated[
    Annotated[PlainTextSource, Tag("text")]
    | Annotated[Base64Source, Tag("base64")]
    | Annotated[UrlSource, Tag("url")]
    | Annotated[FileSource, Tag("file")]
    | Annotated[UnknownSource, Tag("unknown")],
    _tagged(frozenset({"text", "base64", "url", "file"})),
]
VideoSource = Annotated[
    Annotated[Base64VideoSource, Tag("base64")]
    | Annotated[UrlVideoSource, Tag("url")]
    | Annotated[FileVideoSource, Tag("file")]
    | Annotated[UnknownSource, Tag("unknown")],
    _tagged(frozenset({"base64", "url", "file"})),
]


class TextBlock(_Model):
    type: Literal["text"] = "text"
    text: str


class ImageBlock(_Model):
    type: Literal["image"] = "image"
    source: ImageSource


class DocumentBlock(_Model):
    type: Literal["document"] = "document"
    source: DocumentSource
    title: str | None = None
    context: str | None = None


class VideoBlock(_Model):
    """Ark extension: video input, ``fps`` in [0.2, 5] (omitted = model default)."""

    type: Literal["video"] = "video"
    source: VideoSource


class SearchResultCitations(_Model):
    enabled: bool


class SearchResultBlock(_Model):
    """Tool results only: ``source`` is the result URL (a plain string, unlike media blocks)."""

    type: Literal["search_result"] = "search_result"
    source: str
    title: str
    content: list[TextBlock]
    citations: SearchResultCitations


class UnknownBlock(_Unknown):
    pass


_BLOCK_TYPES = frozenset({"text", "image", "document", "video", "search_result"})

ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[DocumentBlock, Tag("document")]
    | Annotated[VideoBlock, Tag("video")]
    | Annotated[SearchResultBlock, Tag("search_result")]
    | Annotated[UnknownBlock, Tag("unknown")],
    _tagged(_BLOCK_TYPES),
]


def text_of(blocks: list[ContentBlock] | None, sep: str = "") -> str:
    """Concatenate the text blocks of a content list (other blocks are skipped)."""
    if not blocks:
        return ""
    return sep.join(b.text for b in blocks if isinstance(b, TextBlock))


# --------------------------------------------------------------------------- shared sub-objects


class EndTurn(_Model):
    type: Literal["end_turn"] = "end_turn"


class RequiresAction(_Model):
    type: Literal["requires_action"] = "requires_action"
    event_ids: list[str] = Field(default_factory=list)


class RetriesExhausted(_Model):
    type: Literal["retries_exhausted"] = "retries_exhausted"


class BudgetReached(_Model):
    """Anthropic only."""

    type: Literal["budget_reached"] = "budget_reached"


class UnknownStopReason(_Unknown):
    pass


StopReason = Annotated[
    Annotated[EndTurn, Tag("end_turn")]
    | Annotated[RequiresAction, Tag("requires_action")]
    | Annotated[RetriesExhausted, Tag("retries_exhausted")]
    | Annotated[BudgetReached, Tag("budget_reached")]
    | Annotated[UnknownStopReason, Tag("unknown")],
    _tagged(frozenset({"end_turn", "requires_action", "retries_exhausted", "budget_reached"})),
]


class RetryStatus(_Model):
    type: str  # retrying | exhausted | terminal


class SessionErrorDetail(_Model):
    """Error types are open-ended strings (model_overloaded_error, billing_error, ...)."""

    type: str
    message: str = ""
    retry_status: RetryStatus
    mcp_server_name: str | None = None
    vault_id: str | None = None
    credential_id: str | None = None


class CacheCreation(_Model):
    ephemeral_1h_input_tokens: int = 0
    ephemeral_5m_input_tokens: int = 0


class ServerToolUse(_Model):
    web_fetch_requests: int = 0
    web_search_requests: int = 0
    general_search_requests: int = 0  # Ark
    visual_search_requests: int = 0  # Ark


class UsageSnapshot(_Model):
    active_seconds: float = 0.0
    cache_creation: CacheCreation = Field(default_factory=CacheCreation)
    cache_read_input_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    server_tool_use: ServerToolUse = Field(default_factory=ServerToolUse)


class ModelUsage(_Model):
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    speed: Literal["standard", "fast"] | None = None  # Ark


# --------------------------------------------------------------------------- events


class _Event(_Model):
    """Common fields: generated by the server (P1); None on events the client builds."""

    id: str | None = None
    processed_at: str | None = None  # RFC 3339, kept verbatim: never sort or dedup by it (P10)


# client -> server (the server echoes them back into history and the stream)


class UserMessage(_Event):
    type: Literal["user.message"] = "user.message"
    content: list[ContentBlock]
    session_id: str | None = None


class SystemMessage(_Event):
    type: Literal["system.message"] = "system.message"
    content: list[TextBlock] = Field(min_length=1)


class UserInterrupt(_Event):
    type: Literal["user.interrupt"] = "user.interrupt"
    session_thread_id: str | None = None


class UserToolConfirmation(_Event):
    type: Literal["user.tool_confirmation"] = "user.tool_confirmation"
    result: Literal["allow", "deny"]
    tool_use_id: str
    deny_message: str | None = None
    session_thread_id: str | None = None


class UserToolResult(_Event):
    type: Literal["user.tool_result"] = "user.tool_result"
    tool_use_id: str
    content: list[ContentBlock] = Field(default_factory=list)
    is_error: bool | None = None
    session_thread_id: str | None = None


class UserCustomToolResult(_Event):
    type: Literal["user.custom_tool_result"] = "user.custom_tool_result"
    custom_tool_use_id: str
    content: list[ContentBlock] = Field(default_factory=list)
    is_error: bool | None = None
    session_thread_id: str | None = None


# agent events


class AgentMessage(_Event):
    type: Literal["agent.message"] = "agent.message"
    content: list[ContentBlock] = Field(default_factory=list)

    @property
    def text(self) -> str:
        return text_of(self.content)


class AgentThinking(_Event):
    type: Literal["agent.thinking"] = "agent.thinking"
    content: list[ContentBlock] = Field(default_factory=list)


class AgentToolUse(_Event):
    type: Literal["agent.tool_use"] = "agent.tool_use"
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    evaluated_permission: str | None = None  # allow | ask | deny
    session_thread_id: str | None = None

    @property
    def skill_name(self) -> str | None:
        """A Skill load is an agent.tool_use: ``skill`` → input.name, ``Skill`` → input.skill."""
        if self.name == "skill":
            value = self.input.get("name")
        elif self.name == "Skill":
            value = self.input.get("skill")
        else:
            return None
        return value if isinstance(value, str) else None


class AgentToolResult(_Event):
    type: Literal["agent.tool_result"] = "agent.tool_result"
    tool_use_id: str
    # None with is_error False = "loaded, body not visible" (skills), not an empty result.
    content: list[ContentBlock] | None = None
    is_error: bool = False
    session_thread_id: str | None = None


class AgentMCPToolUse(_Event):
    type: Literal["agent.mcp_tool_use"] = "agent.mcp_tool_use"
    mcp_server_name: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    evaluated_permission: str | None = None
    session_thread_id: str | None = None


class AgentMCPToolResult(_Event):
    type: Literal["agent.mcp_tool_result"] = "agent.mcp_tool_result"
    mcp_tool_use_id: str
    content: list[ContentBlock] | None = None
    is_error: bool = False
    session_thread_id: str | None = None


class AgentCustomToolUse(_Event):
    type: Literal["agent.custom_tool_use"] = "agent.custom_tool_use"
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    session_thread_id: str | None = None


class AgentThreadMessageReceived(_Event):
    type: Literal["agent.thread_message_received"] = "agent.thread_message_received"
    content: list[ContentBlock] = Field(default_factory=list)
    from_session_thread_id: str | None = None
    from_agent_name: str | None = None  # empty = main agent


class AgentThreadMessageSent(_Event):
    type: Literal["agent.thread_message_sent"] = "agent.thread_message_sent"
    content: list[ContentBlock] = Field(default_factory=list)
    to_session_thread_id: str | None = None
    to_agent_name: str | None = None


class AgentThreadContextCompacted(_Event):
    type: Literal["agent.thread_context_compacted"] = "agent.thread_context_compacted"
    session_thread_id: str | None = None


# session events


class SessionError(_Event):
    type: Literal["session.error"] = "session.error"
    error: SessionErrorDetail


class SessionDeleted(_Event):
    type: Literal["session.deleted"] = "session.deleted"


class SessionThreadCreated(_Event):
    type: Literal["session.thread_created"] = "session.thread_created"
    agent_name: str = ""
    session_thread_id: str


class SessionStatusRunning(_Event):
    type: Literal["session.status_running"] = "session.status_running"


class SessionUsage(_Event):
    type: Literal["session.usage"] = "session.usage"
    usage: UsageSnapshot = Field(default_factory=UsageSnapshot)


class SessionStatusIdle(_Event):
    type: Literal["session.status_idle"] = "session.status_idle"
    stop_reason: StopReason


class SessionStatusRescheduled(_Event):
    type: Literal["session.status_rescheduled"] = "session.status_rescheduled"


class SessionStatusTerminated(_Event):
    type: Literal["session.status_terminated"] = "session.status_terminated"


class _ThreadStatus(_Event):
    agent_name: str = ""
    session_thread_id: str = ""


class SessionThreadStatusRunning(_ThreadStatus):
    type: Literal["session.thread_status_running"] = "session.thread_status_running"


class SessionThreadStatusIdle(_ThreadStatus):
    type: Literal["session.thread_status_idle"] = "session.thread_status_idle"
    stop_reason: StopReason | None = None


class SessionThreadStatusRescheduled(_ThreadStatus):
    type: Literal["session.thread_status_rescheduled"] = "session.thread_status_rescheduled"


class SessionThreadStatusTerminated(_ThreadStatus):
    type: Literal["session.thread_status_terminated"] = "session.thread_status_terminated"


class SpanModelRequestStart(_Event):
    type: Literal["span.model_request_start"] = "span.model_request_start"


class SpanModelRequestEnd(_Event):
    type: Literal["span.model_request_end"] = "span.model_request_end"
    model_config = ConfigDict(protected_namespaces=())
    model_request_start_id: str = ""
    model_usage: ModelUsage = Field(default_factory=ModelUsage)
    is_error: bool | None = None


# preview frames (stream only, P6)


class PreviewTarget(_Model):
    type: str  # agent.message | agent.thinking
    id: str


class EventStart(_Event):
    type: Literal["event_start"] = "event_start"
    event: PreviewTarget


class ContentDelta(_Model):
    """``content`` is one text block (spec) or a list of them (Ark CLI); both are accepted."""

    type: str = "content_delta"
    index: int | None = None
    content: TextBlock | list[TextBlock] | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, list):
            return "".join(b.text for b in self.content)
        return self.content.text


class EventDelta(_Event):
    type: Literal["event_delta"] = "event_delta"
    event_id: str
    delta: ContentDelta


class UnknownEvent(_Unknown):
    """A type this client does not know, or a known type that failed validation (``error`` set)."""

    error: str | None = None

    @property
    def id(self) -> str | None:
        value = self.raw.get("id")
        return value if isinstance(value, str) else None

    @property
    def processed_at(self) -> str | None:
        value = self.raw.get("processed_at")
        return value if isinstance(value, str) else None


ClientEvent = Annotated[
    Annotated[UserMessage, Tag("user.message")]
    | Annotated[SystemMessage, Tag("system.message")]
    | Annotated[UserInterrupt, Tag("user.interrupt")]
    | Annotated[UserToolConfirmation, Tag("user.tool_confirmation")]
    | Annotated[UserToolResult, Tag("user.tool_result")]
    | Annotated[UserCustomToolResult, Tag("user.custom_tool_result")],
    Field(discriminator="type"),
]
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(
    {
        "user.message",
        "system.message",
        "user.interrupt",
        "user.tool_confirmation",
        "user.tool_result",
        "user.custom_tool_result",
    }
)


class UnparsedEvent(BaseModel):
    """A server event whose caller asked only for its type and id (`SessionClient.subscribe(...,
    parse=...)`): on a busy stream most events are only counted and passed over, and a full parse
    costs more than everything else done with them."""

    type: str
    id: str | None = None


PREVIEW_TYPES: frozenset[str] = frozenset({"event_start", "event_delta"})
TERMINAL_TYPES: frozenset[str] = frozenset({"session.deleted", "session.status_terminated"})

ServerEvent = Union[  # noqa: UP007 - a runtime Union: the parser's variant table is derived from it
    UserMessage,
    SystemMessage,
    UserInterrupt,
    UserToolConfirmation,
    UserToolResult,
    UserCustomToolResult,
    AgentMessage,
    AgentThinking,
    AgentToolUse,
    AgentToolResult,
    AgentMCPToolUse,
    AgentMCPToolResult,
    AgentCustomToolUse,
    AgentThreadMessageReceived,
    AgentThreadMessageSent,
    AgentThreadContextCompacted,
    SessionError,
    SessionDeleted,
    SessionThreadCreated,
    SessionStatusRunning,
    SessionUsage,
    SessionStatusIdle,
    SessionStatusRescheduled,
    SessionStatusTerminated,
    SessionThreadStatusRunning,
    SessionThreadStatusIdle,
    SessionThreadStatusRescheduled,
    SessionThreadStatusTerminated,
    SpanModelRequestStart,
    SpanModelRequestEnd,
    EventStart,
    EventDelta,
    UnknownEvent,
]

# The tag → variant table is derived from the union above (one list of variants, not two).
_SERVER_VARIANTS: dict[str, type[BaseModel]] = {
    cls.model_fields["type"].default: cls for cls in get_args(ServerEvent) if cls is not UnknownEvent
}
SERVER_EVENT_TYPES: frozenset[str] = frozenset(_SERVER_VARIANTS)

_server_union = Annotated[  # type: ignore[valid-type]
    Union[
        (
            *(Annotated[cls, Tag(tag)] for tag, cls in _SERVER_VARIANTS.items()),
            Annotated[UnknownEvent, Tag("unknown")],
        )
    ],
    _tagged(SERVER_EVENT_TYPES),
]
_SERVER_ADAPTER: TypeAdapter[Any] = TypeAdapter(_server_union)  # type: ignore[arg-type]
_SERVER_LIST_ADAPTER: TypeAdapter[Any] = TypeAdapter(list[_server_union])  # type: ignore[valid-type]
_CLIENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(ClientEvent)


def parse_server_event(data: dict[str, Any]) -> ServerEvent:
    """Parse one server event or preview frame. Never raises: an unknown type, or a known type that
    fails validation, comes back as :class:`UnknownEvent` (with ``error`` set in the second case)."""
    try:
        event: ServerEvent = _SERVER_ADAPTER.validate_python(data)
        return event
    except (ValidationError, TypeError, ValueError) as exc:
        raw = data if isinstance(data, dict) else {"data": data}
        return UnknownEvent(type=str(raw.get("type", "")), raw=raw, error=str(exc))


def parse_server_event_json(payload: str | bytes) -> ServerEvent:
    """Parse one SSE ``data:`` payload; non-object or invalid JSON yields an UnknownEvent."""
    try:
        event: ServerEvent = _SERVER_ADAPTER.validate_json(payload)
        return event
    except ValidationError as exc:
        import json

        try:
            data = json.loads(payload)
        except ValueError:
            return UnknownEvent(type="", raw={"data": str(payload)}, error=str(exc))
        if not isinstance(data, dict):
            return UnknownEvent(type="", raw={"data": data}, error=str(exc))
        return parse_server_event(data)


def parse_server_events(items: list[dict[str, Any]]) -> list[ServerEvent]:
    """Parse a page of events; falls back to one-by-one parsing when one item is malformed."""
    try:
        events: list[ServerEvent] = _SERVER_LIST_ADAPTER.validate_python(items)
        return events
    except ValidationError:
        return [parse_server_event(item) for item in items]


def parse_client_event(data: dict[str, Any]) -> ClientEvent:
    """Validate a client event (raises ValidationError: the sim uses this to reject bad input)."""
    event: ClientEvent = _CLIENT_ADAPTER.validate_python(data)
    return event


def serialize_client_event(event: BaseModel) -> dict[str, Any]:
    """Wire form of a client event (P1): ``type`` and business fields only, no None fields, never the
    server-generated ``processed_at``; ``id`` only on user.message, as the client's stable id (P3)."""
    body = event.model_dump(mode="json", exclude_none=True, exclude={"processed_at"})
    if body.get("type") != "user.message":
        body.pop("id", None)
    return body
