"""Inputs of the reply contract: the turn context, the per-bot policy, the platform capabilities."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from pipeline.segments.leaks import DEFAULT_SCANNER, LeakAction, LeakScanner
from pipeline.segments.models import SEGMENT_TYPES
from pipeline.segments.notices import DEFAULT_CATALOG, NoticeCatalog

ChatType = Literal["private", "group", "channel"]


class OutputMode(StrEnum):
    SEGMENTS = "segments"  # default IM mode: the `{"segments": [...]}` contract
    PLAIN = "plain"  # S19 `outputSchema: false`: the text is sent as text, no mention conversion
    CALLER_SCHEMA = "caller_schema"  # S20: the caller's own contract; never guessed to be segments


class MentionPolicy(StrEnum):
    PLAIN = "plain"  # unknown target → `@target` as text, no notification (default)
    REJECT = "reject"  # unknown target → the reply is invalid
    ALLOW = "allow"  # any target is mentioned


@dataclass(frozen=True, slots=True)
class Member:
    """A chat member the agent may mention: platform user id and display name (may be empty)."""

    user_id: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class RepliedMessage:
    """The message the user replied to (quoted), when there is one."""

    message_id: str
    author_id: str
    author_name: str = ""
    text: str = ""


@dataclass(frozen=True)
class TurnContext:
    """What the host knows about this turn; the only source of mentionable ids (S5, S7)."""

    bot_id: str
    platform: str
    chat_type: ChatType
    sender_id: str
    sender_name: str = ""
    chat_id: str = ""
    language: str | None = None  # overrides the policy's language when set
    replied_to: RepliedMessage | None = None
    # Members seen in the group-context window.
    context_members: tuple[Member, ...] = ()
    # Ids returned by a member-lookup tool during this turn.
    looked_up_member_ids: frozenset[str] = frozenset()
    # The bot's own endpoint ids / peer roles: never user ids, never mentionable (S7).
    bot_self_ids: frozenset[str] = frozenset()

    def mentionable_ids(self) -> frozenset[str]:
        ids = {self.sender_id, *(m.user_id for m in self.context_members), *self.looked_up_member_ids}
        if self.replied_to is not None:
            ids.add(self.replied_to.author_id)
        ids.discard("")
        return frozenset(ids - self.bot_self_ids)


@dataclass(frozen=True)
class ReplyPolicy:
    """Per-bot reply handling. Build once per bot (the scanner and catalog are compiled here)."""

    language: str = "en"
    output_mode: OutputMode = OutputMode.SEGMENTS
    mention_policy: MentionPolicy = MentionPolicy.PLAIN
    leak_action: LeakAction = LeakAction.REDACT
    leak_scanner: LeakScanner = DEFAULT_SCANNER
    notices: NoticeCatalog = DEFAULT_CATALOG
    # CALLER_SCHEMA mode: the caller's JSON Schema; when set the output must validate against it.
    caller_schema: Mapping[str, Any] | None = None


ALL_SEGMENT_TYPES: frozenset[str] = frozenset(SEGMENT_TYPES)


@dataclass(frozen=True)
class Capabilities:
    """What a platform can send. Media of an unsupported type become an "attachment unavailable"."""

    supported_segment_types: frozenset[str] = ALL_SEGMENT_TYPES
    max_attachment_bytes: int = 20 * 1024 * 1024
    # Optional per-segment-type limits (e.g. Telegram photos 10 MB, documents 50 MB).
    max_bytes_by_type: Mapping[str, int] = field(default_factory=dict)

    def limit_for(self, segment_type: str) -> int:
        specific = self.max_bytes_by_type.get(segment_type, self.max_attachment_bytes)
        return min(specific, self.max_attachment_bytes)
