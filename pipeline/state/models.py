"""What the state stores hold and return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field

ConversationStatus = Literal["idle", "running", "requires_action"]


class ContextEntry(BaseModel):
    """One recent group message, for the agent's context and the known mention targets."""

    model_config = ConfigDict(extra="ignore")

    message_id: str
    user_id: str
    name: str = ""
    text: str = ""
    at_ms: float = 0.0


def context_entry_json(message_id: str, user_id: str, name: str, text: str, at_ms: float) -> bytes:
    """A `ContextEntry` as the window stores it, from fields already validated (an inbound
    message's). Ingest writes one per group message: building and dumping the model cost about
    four times as much."""
    return pydantic_core.to_json(
        {"message_id": message_id, "user_id": user_id, "name": name, "text": text, "at_ms": at_ms}
    )


class PendingAction(BaseModel):
    """A tool waiting on the chat: a confirmation (`ask`) or a custom tool result."""

    model_config = ConfigDict(extra="ignore")

    event_id: str
    kind: Literal["confirmation", "custom_tool"]
    name: str = ""
    input: dict[str, Any] = Field(default_factory=dict)
    session_thread_id: str | None = None


class TurnRecord(BaseModel):
    """A user turn dispatch sent: where its answer goes and what the agent may mention."""

    model_config = ConfigDict(extra="ignore")

    trace_id: str
    platform: str
    bot_id: str
    chat_id: str
    chat_type: Literal["private", "group"]
    starter_id: str | None = None
    known_ids: list[str] = Field(default_factory=list)
    reply_to_message_id: str | None = None
    route: dict[str, str] = Field(default_factory=dict)
    hops: dict[str, float] = Field(default_factory=dict)
    inbound_ids: list[str] = Field(default_factory=list)


InterruptCause = Literal["stop", "failed"]


class ConversationState(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: ConversationStatus = "idle"
    session_id: str | None = None
    turn: TurnRecord | None = None
    last_message: str | None = None
    last_message_id: str | None = None
    pending: list[PendingAction] = Field(default_factory=list)
    tools: dict[str, PendingAction] = Field(default_factory=dict)
    # Why the running turn was interrupted, until it ends: `stop` (the chat's /stop: the end is
    # told "stopped"), `failed` (dispatch, after the session refused a custom tool's result: the
    # chat was told of the failure, the end is silent).
    interrupted: InterruptCause | None = None
    held: int = 0
    # The last event id processed on this conversation's session stream (saved once per turn).
    cursor: str | None = None


@dataclass(frozen=True)
class ContextQuota:
    """How many messages per window the chat, and the sender in it, may add to the chat's
    group-context window (`[bots.limits]` `chat_messages`, `user_messages`): counter ids that name
    their window (`chat:<index>`, `user:<id>:<index>`), a limit (0: none) and the window in ms."""

    chat: str
    chat_limit: int
    chat_ms: int
    user: str
    user_limit: int
    user_ms: int


@dataclass(frozen=True)
class InboundAdmission:
    """One inbound message for `MarkerStore.admit_inbound`."""

    dedup_id: str
    conversation: str
    entry_json: bytes | None = None  # pushed onto the group-context window (`context_entry_json`)
    want_window: bool = False  # return the window as it was before this message
    mark: bool = False  # set the de-duplication marker now
    quota: ContextQuota | None = None  # pushed only within it, and counted in it


@dataclass(frozen=True)
class AdmissionResult:
    duplicate: bool
    window: list[ContextEntry] = field(default_factory=list)
    unkept: bool = False  # over its context quota: not pushed onto the window


@dataclass
class InflightStream:
    """A session whose stream a worker must hold: routing and where to resume."""

    session_id: str
    conversation_key: str
    cursor: str | None = None
    trace_id: str | None = None


Decision = Literal["start", "held", "behind", "hold", "busy", "done", "partial", "resume", "no_session", "failed"]


@dataclass(frozen=True)
class TurnStart:
    """What `ConversationStore.begin_turn` decided for a user turn."""

    decision: Decision
    session_id: str | None = None
    cursor: str | None = None
    # The session was busy and the bot's policy is `interrupt`: send user.interrupt first.
    interrupt: bool = False
    # `partial`: per inbound message of the turn, whether another turn already took it (its marker
    # is set), in the order of `inbound_ids`.
    taken: tuple[bool, ...] = ()
    # `failed`: the notice the chat was told instead when this turn's send failed.
    failure: str | None = None


@dataclass(frozen=True)
class TurnEnd:
    """What render learns when an idle arrives: whether it was handled before, the conversation's
    state, and the turn it ends (bound once: a replayed idle binds the same turn)."""

    handled: str | None
    state: ConversationState
    turn_id: str | None = None
    turn: TurnRecord | None = None
