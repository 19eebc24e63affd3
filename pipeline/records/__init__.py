"""The records carried by Switchboard's topics: the contract of the streams.

Each topic's value is one of these pydantic models; `pipeline/topics/` holds their JSON Schemas, generated
by `switchboard topics schemas` (a test fails when they drift).
"""

from pipeline.records.models import (
    ChatType,
    CommandKind,
    ConversationKey,
    DeadLetter,
    InboundMessage,
    OutboundKind,
    OutboundMessage,
    ReplyRef,
    Sender,
    SessionCommand,
    SessionEventRecord,
    conversation_key,
    now_ms,
)

__all__ = [
    "ChatType",
    "CommandKind",
    "ConversationKey",
    "DeadLetter",
    "InboundMessage",
    "OutboundKind",
    "OutboundMessage",
    "ReplyRef",
    "Sender",
    "SessionCommand",
    "SessionEventRecord",
    "conversation_key",
    "now_ms",
]
