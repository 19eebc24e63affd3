"""Record models for every topic (see docs/architecture.md, "Topics").

Records are keyed by the conversation key `platform:bot:chat` (or `platform:bot:chat:user` for
per-user sessions in a group), each id encoded so that `:` only separates (`_keys.py`). Each record
carries `hops`: wall-clock milliseconds at which each stage handled the turn, so end-to-end and
per-stage latency can be measured from records alone.
"""

from __future__ import annotations

import random
import time
from typing import Annotated, Any, Literal, NamedTuple, get_args

from pydantic import BaseModel, ConfigDict, Field

from pipeline.segments import Segment
from pipeline.session.models import (
    AgentCustomToolUse,
    AgentMCPToolUse,
    AgentMessage,
    AgentToolUse,
    SessionDeleted,
    SessionError,
    SessionStatusIdle,
    SessionStatusTerminated,
    SessionUsage,
)

ChatType = Literal["private", "group"]
ConversationKey = str
OutboundKind = Literal["reply", "notice", "progress", "confirmation"]
# Facts about how a reply came to be, for a platform that can show them (the console does):
# `corrected`: the agent's reply broke the contract and the one correction call fixed it.
# `refused`: this notice refuses the chat command it quotes (an /allow or /deny from someone who may
# not answer): the console shows it to that person only, and the confirmation stays open.
OutboundNote = Literal["corrected", "refused"]
CommandKind = Literal[
    "user_turn",  # user.message (+ system.message) built from one or more inbound messages
    "interrupt",  # /stop: user.interrupt
    "tool_confirmation",  # /allow, /deny answering a requires_action
    "tool_result",  # user.custom_tool_result answering an agent.custom_tool_use
    "flush",  # the session went idle: send what dispatch holds (merge/queue policies)
]


def now_ms() -> float:
    return time.time() * 1000.0


def new_trace_id() -> str:
    """A random 128-bit id for tracing a message through the pipeline (not a secret: Python's
    generator is enough, and ten times cheaper than `uuid4`, which asks the kernel each time)."""
    return f"{random.getrandbits(128):032x}"


class Position(NamedTuple):
    """Where a consumed record came from (its topic, partition and offset)."""

    topic: str
    partition: int
    offset: int


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sender(_Record):
    user_id: str
    name: str = ""
    # Chat admins may answer any tool confirmation (policy in ingest).
    is_admin: bool = False


class ReplyRef(_Record):
    """The message a user replied to, when the platform says so."""

    message_id: str
    user_id: str | None = None
    text: str | None = None
    is_bot: bool = False


class InboundMessage(_Record):
    """`im.inbound`: one platform message, parsed and platform-neutral."""

    platform: str
    bot_id: str
    chat_id: str
    chat_type: ChatType
    sender: Sender
    message_id: str
    # Platform event id used for de-duplication when it differs from the message id (Lark, Slack).
    event_id: str | None = None
    text: str
    # The message as neutral segments (mentions, media, reply); `text` is its plain rendering.
    segments: list[Segment] = Field(default_factory=list)
    mentions: list[str] = Field(default_factory=list)
    # Display names of mentioned users by id (as in `mentions`), where the platform gives them.
    mention_names: dict[str, str] = Field(default_factory=dict)
    mentions_bot: bool = False
    reply_to: ReplyRef | None = None
    # Platform-specific routing the egress needs back (Slack thread_ts, Telegram thread id, …).
    route: dict[str, str] = Field(default_factory=dict)
    conversation_key: ConversationKey
    trace_id: str
    sent_at_ms: float | None = None
    hops: dict[str, float] = Field(default_factory=dict)


class SessionCommand(_Record):
    """`session.input`: what dispatch must do with a conversation's session."""

    kind: CommandKind
    conversation_key: ConversationKey
    platform: str
    bot_id: str
    chat_id: str
    chat_type: ChatType
    # Empty for a turn whose session dispatch must create (ingest could not resolve one).
    session_id: str | None = None
    # Client events exactly as they go on the wire (P1: type + business fields), stable ids set.
    events: list[dict[str, Any]] = Field(default_factory=list)
    # For user turns: the IM reply contract and turn context, sent as the paired system.message.
    system_text: str | None = None
    inbound_ids: list[str] = Field(default_factory=list)
    # A user turn merged from several messages: how many of its content blocks each inbound message
    # contributed, aligned with `inbound_ids` (dispatch takes out messages a replay finds taken).
    # Empty for one message's turn, and then left out of the record, as older workers read it.
    parts: list[int] = Field(default_factory=list, exclude_if=lambda parts: not parts)
    sender: Sender | None = None
    # Ids the agent may mention this turn (S5): sender, replied-to author, group context.
    known_ids: list[str] = Field(default_factory=list)
    reply_to_message_id: str | None = None
    route: dict[str, str] = Field(default_factory=dict)
    trace_id: str
    hops: dict[str, float] = Field(default_factory=dict)


# The server events render acts on: the session stream forwards these and keeps the rest of a
# turn's events (status, spans, thinking, tool results, thread events) out of Kafka. The turn's
# `session.usage` goes with its idle, for the usage budgets.
ForwardedEvent = Annotated[
    AgentMessage
    | AgentToolUse
    | AgentMCPToolUse
    | AgentCustomToolUse
    | SessionError
    | SessionStatusIdle
    | SessionStatusTerminated
    | SessionDeleted
    | SessionUsage,
    Field(discriminator="type"),
]
FORWARDED_EVENT_TYPES: frozenset[str] = frozenset(
    cls.model_fields["type"].default for cls in get_args(get_args(ForwardedEvent)[0])
)


class SessionEventRecord(_Record):
    """`session.events`: one server event (typed, as the session server sent it), with the routing
    of its conversation."""

    conversation_key: ConversationKey
    session_id: str
    event: ForwardedEvent
    trace_id: str | None = None
    hops: dict[str, float] = Field(default_factory=dict)


class OutboundMessage(_Record):
    """`im.outbound.<platform>`: validated segments to deliver to one chat."""

    outbound_id: str  # stable: a replay must not deliver it twice
    kind: OutboundKind
    platform: str
    bot_id: str
    chat_id: str
    chat_type: ChatType
    conversation_key: ConversationKey
    segments: list[Segment]
    reply_to_message_id: str | None = None
    route: dict[str, str] = Field(default_factory=dict)
    trace_id: str | None = None
    hops: dict[str, float] = Field(default_factory=dict)
    # Left out of the record when empty: a record without notes is what older workers read.
    notes: list[OutboundNote] = Field(default_factory=list, exclude_if=lambda notes: not notes)
    # Why each media of the reply was replaced by the "attachment unavailable" text, in order: the
    # bounded rejection labels of `switchboard_media_rejected_total` (a platform may show them).
    media_rejected: list[str] = Field(default_factory=list, exclude_if=lambda reasons: not reasons)


class DeadLetter(_Record):
    """`im.deadletter`: what a stage could not process, with why and where it came from."""

    stage: str
    reason: str
    error: str = ""
    attempts: int = 1
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    # The original value, as text (it may not have parsed); of a webhook body, or of an original
    # over 64 KiB (`pipeline.stages.outputs`), an excerpt.
    record: str
    # Of the whole original when `record` is an excerpt: its size in bytes and its sha256 (hex).
    record_bytes: int | None = None
    record_sha256: str | None = None
    at_ms: float = Field(default_factory=now_ms)
