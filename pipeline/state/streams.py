"""Streams in flight, per partition of session.input: the sessions a worker must hold a stream
for, so that a partition's new owner (after a rebalance or a crash) resumes them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ._codec import cursor_for, text
from .client import Arg, RedisClient
from .conversations import inflight_entry
from .keys import Keys
from .models import InflightStream


class StreamStore:
    def __init__(self, redis: RedisClient, keys: Keys, *, mapping_ttl: int) -> None:
        self.redis = redis
        self.keys = keys
        self.mapping_ttl = mapping_ttl

    async def add_inflight(self, partition: int, stream: InflightStream) -> None:
        key = self.keys.inflight(partition, stream.conversation_key)
        write: list[Sequence[Arg]] = [("HSET", key, stream.session_id, inflight_entry(stream))]
        if self.keys.cluster:  # listed in the partition's index (see `Keys.inflight_index`)
            index = self.keys.inflight_index(partition)
            write += [("SADD", index, stream.conversation_key), ("EXPIRE", index, self.mapping_ttl)]
        await self.redis.pipeline(write)

    async def remove_inflight(self, partition: int, session_id: str, conversation: str) -> None:
        await self.redis.execute("HDEL", self.keys.inflight(partition, conversation), session_id)

    async def inflight(self, partition: int) -> list[InflightStream]:
        """The partition's streams in flight, each with the cursor its conversation last saved."""
        entries = [
            (text(session_id) or "", json.loads(text(value) or "{}"))
            for raw in await self._inflight_hashes(partition)
            for session_id, value in zip(raw[0::2], raw[1::2], strict=True)
        ]
        if not entries:
            return []
        # A turn's end (`finish_turn`) saves the cursor (the idle's id) and drops the entry in one
        # step, possibly between the read above and the cursors'. An entry then read with the new
        # cursor would resume after the idle, where nothing more comes, and count as a turn in
        # flight for ever. So each cursor is read, then the entry again (in this order, in one
        # pipeline): an entry still there was not ended before its cursor was read.
        reads: list[Sequence[Arg]] = []
        for session_id, data in entries:
            conversation = data.get("conversation_key", "")
            reads.append(("HGET", self.keys.conversation(conversation), "cursor"))
            reads.append(("HEXISTS", self.keys.inflight(partition, conversation), session_id))
        replies = await self.redis.pipeline(reads)
        return [
            InflightStream(
                session_id=session_id,
                conversation_key=data.get("conversation_key", ""),
                cursor=cursor_for(text(cursor), session_id),
                trace_id=data.get("trace_id"),
            )
            for (session_id, data), cursor, still in zip(entries, replies[0::2], replies[1::2], strict=True)
            if int(still or 0)
        ]

    async def _inflight_hashes(self, partition: int) -> list[list[Any]]:
        """The partition's in-flight hashes as flat lists: its one hash, or on a cluster those of
        the conversations its index lists (an index entry whose hash is gone is dropped)."""
        if not self.keys.cluster:
            return [await self.redis.execute("HGETALL", self.keys.partition_inflight(partition))]
        index = self.keys.inflight_index(partition)
        listed = [text(c) or "" for c in await self.redis.execute("SMEMBERS", index)]
        if not listed:
            return []
        hashes = await self.redis.pipeline([("HGETALL", self.keys.inflight(partition, c)) for c in listed])
        gone = [c for c, raw in zip(listed, hashes, strict=True) if not raw]
        if gone:
            await self.redis.execute("SREM", index, *gone)
        return [raw for raw in hashes if raw]
