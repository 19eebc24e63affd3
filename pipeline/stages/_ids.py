"""Stable ids: derived from inbound ids, so a replay produces the same ids again."""

from __future__ import annotations

import hashlib

from pipeline.records import join_ids


def stable_id(prefix: str, *parts: str) -> str:
    # Parts are escaped so the separator inside one (a chat id may hold anything) cannot make two
    # lists of parts hash alike; parts without `%` or the separator, nearly all, hash as they did.
    joined = "\x1f".join(p.replace("%", "%25").replace("\x1f", "%1F") for p in parts)
    digest = hashlib.blake2b(joined.encode(), digest_size=12).hexdigest()
    return f"{prefix}{digest}"


def user_message_id(conversation: str, inbound_ids: list[str]) -> str:
    # `sevt-` is the protocol's event prefix (P4); the client supplies the id (P3).
    return stable_id("sevt-sb-", conversation, *inbound_ids)


def inbound_dedup_id(platform: str, bot_id: str, chat_id: str, message_id: str) -> str:
    """An inbound message's de-duplication id. Message ids are unique per chat on several platforms
    (Slack ts, Telegram), and one message can arrive as two events (Slack app_mention + message)."""
    return join_ids(platform, bot_id, chat_id, message_id)
