"""Keys made of ids: conversation keys, de-duplication ids, rate-limit identifiers.

Ids come from platforms and chat users, and may contain anything, `:` included. A key joins its ids
with `:` after percent-encoding `%` and `:` in each, so `:` only ever separates: no two lists of ids
give the same key (chat `a:b` + user `c` and chat `a` + user `b:c` stay apart). Ids without `%` or
`:` (nearly all real ones) are unchanged, so keys read as before.
"""

from __future__ import annotations

from dataclasses import dataclass

# The longest platform id (chat, user, message, event) ingress accepts. Real ids are far shorter
# (Lark's `oc_…`/`om_…` ~35 characters, Slack's ~11, Telegram's and QQ's numbers ~20); a longer one
# is refused with 400 `id_too_long` rather than made into ever longer Redis keys.
MAX_ID_CHARS = 256

_SEPARATOR = ":"


def encode_id(value: str) -> str:
    """One id as a key component: `%` → `%25`, `:` → `%3A` (nothing else changes)."""
    if "%" not in value and ":" not in value:  # nearly every real id: two scans, no copies
        return value
    return value.replace("%", "%25").replace(":", "%3A")


def decode_id(component: str) -> str:
    """The id `encode_id` encoded. `%` only ever starts `%25` or `%3A` in an encoded id."""
    return component.replace("%3A", ":").replace("%25", "%")


def join_ids(*ids: str) -> str:
    """Ids as one key: each encoded, joined with `:`."""
    return _SEPARATOR.join([encode_id(i) for i in ids])


def split_ids(key: str) -> list[str]:
    """The ids `join_ids` joined."""
    return [decode_id(c) for c in key.split(_SEPARATOR)]


def conversation_key(platform: str, bot_id: str, chat_id: str, user_id: str | None = None) -> str:
    """`platform:bot:chat`, or `platform:bot:chat:user` for one session per user in a group; each
    component encoded by `encode_id`."""
    return join_ids(platform, bot_id, chat_id) if user_id is None else join_ids(platform, bot_id, chat_id, user_id)


@dataclass(frozen=True)
class ConversationRef:
    """A conversation key read back into its ids."""

    platform: str
    bot_id: str
    chat_id: str
    user_id: str | None = None


def parse_conversation_key(key: str) -> ConversationRef:
    """The ids of a conversation key; ValueError when `key` is not one."""
    ids = split_ids(key)
    if len(ids) == 3:
        return ConversationRef(ids[0], ids[1], ids[2])
    if len(ids) == 4:
        return ConversationRef(ids[0], ids[1], ids[2], ids[3])
    raise ValueError(f"not a conversation key (platform:bot:chat[:user]): {key[:100]!r}")
