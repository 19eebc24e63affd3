"""Streams in flight, per partition of session.input: the sessions a worker must hold a stream
for, so that a partition's new owner (after a rebalance or a crash) resumes them."""

from __future__ import annotations

import json

from ._codec import cursor_for, text
from .client import RedisClient
from .conversations import inflight_entry
from .keys import Keys
from .models import InflightStream


class StreamStore:
    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def add_inflight(self, partition: int, stream: InflightStream) -> None:
        await self.redis.execute("HSET", self.keys.inflight(partition), stream.session_id, inflight_entry(stream))

    async def remove_inflight(self, partition: int, session_id: str) -> None:
        await self.redis.execute("HDEL", self.keys.inflight(partition), session_id)

    async def inflight(self, partition: int) -> list[InflightStream]:
        """The partition's streams in flight, each with the cursor its conversation last saved."""
        raw = await self.redis.execute("HGETALL", self.keys.inflight(partition))
        pairs = zip(raw[0::2], raw[1::2], strict=True)
        entries = [(text(session_id) or "", json.loads(text(value) or "{}")) for session_id, value in pairs]
        if not entries:
            return []
        cursors = await self.redis.pipeline(
            [("HGET", self.keys.conversation(data.get("conversation_key", "")), "cursor") for _, data in entries]
        )
        return [
            InflightStream(
                session_id=session_id,
                conversation_key=data.get("conversation_key", ""),
                cursor=cursor_for(text(cursor), session_id),
                trace_id=data.get("trace_id"),
            )
            for (session_id, data), cursor in zip(entries, cursors, strict=True)
        ]
