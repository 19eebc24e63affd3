"""The console's chats: delivered messages kept per chat (capped) and published to viewers."""

from __future__ import annotations

from . import scripts
from ._codec import text
from .client import RedisClient
from .keys import Keys

_APPEND = scripts.script("append_console")


class ConsoleStore:
    def __init__(self, redis: RedisClient, keys: Keys, *, mapping_ttl: int, dedup_ttl: int) -> None:
        self.redis = redis
        self.keys = keys
        self.mapping_ttl = mapping_ttl
        self.dedup_ttl = dedup_ttl

    def live_channel(self, bot_id: str) -> str:
        return self.keys.of("console-live", bot_id)

    async def append_console(
        self, bot_id: str, chat_id: str, payload: str, cap: int = 500, *, message_id: str | None = None
    ) -> int:
        """Append to a console chat. With `message_id` the append happens at most once per id (the
        console's own idempotency, like Lark's `uuid`): returns 0 when it was posted before."""
        posted = self.keys.of("console-posted", message_id) if message_id else ""
        count = await self.redis.run_script(
            _APPEND,
            [self.keys.of("console", f"{bot_id}:{chat_id}"), self.live_channel(bot_id), posted],
            [payload, cap, self.mapping_ttl, chat_id, self.dedup_ttl],
        )
        return int(count)

    async def console_messages(self, bot_id: str, chat_id: str) -> list[str]:
        raw = await self.redis.execute("LRANGE", self.keys.of("console", f"{bot_id}:{chat_id}"), 0, -1)
        return [text(v) or "" for v in raw]
