"""Shared state in Redis: conversation ↔ session, turn state, held messages, streams in flight,
de-duplication markers, the group-context window. All keys live under one prefix."""

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
    "ContextEntry",
    "ConversationState",
    "InboundAdmission",
    "InflightStream",
    "StateError",
    "StateStore",
    "TurnContext",
]
