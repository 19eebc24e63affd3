"""Streams in flight, per partition of session.input: the sessions a worker must hold a stream
for, so that a partition's new owner (after a rebalance or a crash) resumes them."""

from __future__ import annotations

import json

from redis.asyncio import Redis

from ._codec import cursor_for, text
from .conversations import inflight_entry
from .keys import Keys
from .models import InflightStream


class StreamStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def add_inflight(self, partition: int, stream: InflightStream) -> None:
        await self.redis.hset(self.keys.inflight(partition), stream.session_id, inflight_entry(stream))

    async def remove_inflight(self, partition: int, session_id: str) -> None:
        await self.redis.hdel(self.keys.inflight(partition), session_id)

    async def inflight(self, partition: int) -> list[InflightStream]:
        """The partition's streams in flight, each with the cursor its conversation last saved."""
        raw = await self.redis.hgetall(self.keys.inflight(partition))
        entries = [(text(session_id) or "", json.loads(text(value) or "{}")) for session_id, value in raw.items()]
        if not entries:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for _, data in entries:
                pipe.hget(self.keys.conversation(data.get("conversation_key", "")), "cursor")
            cursors = await pipe.execute()
        return [
            InflightStream(
                session_id=session_id,
                conversation_key=data.get("conversation_key", ""),
                cursor=cursor_for(text(cursor), session_id),
                trace_id=data.get("trace_id"),
            )
            for (session_id, data), cursor in zip(entries, cursors, strict=True)
        ]
