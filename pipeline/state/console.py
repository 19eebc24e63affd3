"""The console's chats in Redis: what each console chat was sent, and the live channel.

Keys (under the deployment's prefix): `console:<bot>:<chat>` the chat's delivered messages, oldest
first, capped; `console-seq:<bot>:<chat>` the chat's last sequence number; `console-posted:<id>`
the once-per-outbound-id marker. Every append stamps the message with the chat's next sequence
number (`"seq"`, the stream's event id) and publishes it once on `console-live`, one channel for
every bot: a worker subscribes once and fans deliveries out to its viewers in memory.

A live message is `<header>\\n<message>`: the header a JSON array `[bot_id, chat_id, seq]`, the
message the stored JSON object itself (neither contains a raw newline). A header with seq 0 carries
a status note instead (`note_message`): what became of people's messages (held while the bot is
busy, released or merged into one turn, dropped by /stop). Notes are neither stored nor numbered:
the page shows what it sees live, and keeps it with the messages it sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from . import scripts
from ._codec import text
from .client import RedisClient
from .keys import Keys

# How many messages a console chat keeps.
CHAT_CAP = 500
_APPEND = scripts.script("append_console")


@dataclass(frozen=True)
class LiveMessage:
    """A delivery as published on the live channel."""

    bot_id: str
    chat_id: str
    seq: int
    message: str  # the stored JSON object

    @classmethod
    def parse(cls, data: str | bytes) -> LiveMessage:
        """Raises ValueError for anything the append script did not publish."""
        text = data.decode() if isinstance(data, bytes) else data
        header, sep, message = text.partition("\n")
        bot_id, chat_id, seq = json.loads(header) if sep else (None, None, None)
        if not (isinstance(bot_id, str) and isinstance(chat_id, str) and isinstance(seq, int)):
            raise ValueError("not a console live message")
        return cls(bot_id, chat_id, seq, message)


# The notes a page may receive (`note_message`).
NOTES = frozenset({"held", "released", "merged", "dropped"})


def note_message(bot_id: str, chat_id: str, note: str, message_ids: list[str]) -> str:
    """A status note about inbound messages of a console chat, as published on the live channel."""
    if note not in NOTES:
        raise ValueError(f"unknown console note {note!r}")
    body = json.dumps({"note": note, "message_ids": message_ids}, ensure_ascii=False)
    return json.dumps([bot_id, chat_id, 0], ensure_ascii=False) + "\n" + body


def message_seq(message: str) -> int:
    """The sequence number of a stored message (0 for one stored before they had one)."""
    try:
        value = json.loads(message).get("seq", 0)
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


class ConsoleStore:
    """Console chats on one Redis client. Egress appends through the stores' client; the web side
    reads through a client of its own (and subscribes on a connection of its own), so viewers
    never wait behind the pipeline's commands nor take its connections."""

    def __init__(self, redis: RedisClient, keys: Keys, *, mapping_ttl: int, dedup_ttl: int) -> None:
        self.redis = redis
        self.keys = keys
        self.mapping_ttl = mapping_ttl
        self.dedup_ttl = dedup_ttl

    @property
    def channel(self) -> str:
        return f"{self.keys.prefix}console-live"

    def _chat_key(self, kind: str, bot_id: str, chat_id: str, ident: str | None = None) -> str:
        return self.keys.scoped(kind, f"{bot_id}:{chat_id}", ident)

    async def append(self, bot_id: str, chat_id: str, message: dict[str, Any], *, message_id: str | None = None) -> int:
        """Append a message (a JSON object) to a console chat and publish it. With `message_id`, at
        most once per id (the console's own idempotency, like Lark's `uuid`). Returns the message's
        sequence number in its chat, or 0 when it was posted before."""
        payload = json.dumps({k: v for k, v in message.items() if k != "seq"}, ensure_ascii=False)
        if payload == "{}":
            raise ValueError("a console message is a non-empty JSON object")
        posted = (
            self._chat_key("console-posted", bot_id, chat_id, message_id)
            if message_id
            else self.keys.absent(f"{bot_id}:{chat_id}")
        )
        seq = await self.redis.run_script(
            _APPEND,
            [
                self._chat_key("console", bot_id, chat_id),
                self._chat_key("console-seq", bot_id, chat_id),
                posted,
            ],
            [payload, CHAT_CAP, self.mapping_ttl, self.dedup_ttl, json.dumps([bot_id, chat_id]), self.channel],
        )
        return int(seq)

    async def publish_note(self, bot_id: str, chat_id: str, note: str, message_ids: list[str]) -> None:
        """A status note to the chat's viewers (nothing is stored)."""
        await self.redis.execute("PUBLISH", self.channel, note_message(bot_id, chat_id, note, message_ids))

    async def messages(self, bot_id: str, chat_id: str) -> list[str]:
        """The chat's messages, oldest first, as stored (JSON objects with their `seq`)."""
        raw = await self.redis.execute("LRANGE", self._chat_key("console", bot_id, chat_id), 0, -1)
        return [text(v) or "" for v in raw]
