"""Shared state in Redis: conversation ↔ session, turn state, held messages, streams in flight,
de-duplication markers, the group-context window, the console's chats. All keys live under one
prefix."""

from pipeline.state.console import ConsoleStore, LiveMessage, message_seq
from pipeline.state.exceptions import StateError
from pipeline.state.store import (
    AdmissionResult,
    ContextEntry,
    ConversationState,
    InboundAdmission,
    InflightStream,
    StateStore,
    TurnContext,
)

__all__ = [
    "AdmissionResult",
    "ConsoleStore",
    "ContextEntry",
    "ConversationState",
    "InboundAdmission",
    "InflightStream",
    "LiveMessage",
    "StateError",
    "StateStore",
    "TurnContext",
    "message_seq",
]
