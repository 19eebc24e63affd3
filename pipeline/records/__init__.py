"""The records carried by Switchboard's topics: the contract of the streams.

Each topic's value is one of these pydantic models; `pipeline/topics/` holds their JSON Schemas, generated
by `switchboard topics schemas` (a test fails when they drift).
"""

from pipeline.records._keys import (
    MAX_ID_CHARS,
    ConversationRef,
    conversation_key,
    join_ids,
    parse_conversation_key,
    split_ids,
)
from pipeline.records.models import (
    FORWARDED_EVENT_TYPES,
    ChatType,
    CommandKind,
    ConversationKey,
    DeadLetter,
    ForwardedEvent,
    InboundMessage,
    OutboundKind,
    OutboundMessage,
    OutboundNote,
    Position,
    ReplyRef,
    Sender,
    SessionCommand,
    SessionEventRecord,
    new_trace_id,
    now_ms,
)

__all__ = [
    "FORWARDED_EVENT_TYPES",
    "MAX_ID_CHARS",
    "ChatType",
    "CommandKind",
    "ConversationKey",
    "ConversationRef",
    "DeadLetter",
    "ForwardedEvent",
    "InboundMessage",
    "OutboundKind",
    "OutboundMessage",
    "OutboundNote",
    "Position",
    "ReplyRef",
    "Sender",
    "SessionCommand",
    "SessionEventRecord",
    "conversation_key",
    "join_ids",
    "new_trace_id",
    "now_ms",
    "parse_conversation_key",
    "split_ids",
]
