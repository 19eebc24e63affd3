"""De-duplication markers (inbound messages seen, sends confirmed, turn ends handled, outbound
messages delivered) and ingest's batch admission, which keeps the group-context window too."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from . import scripts
from ._codec import text, window
from .client import RedisClient
from .keys import Keys
from .models import AdmissionResult, InboundAdmission

_ADMIT_INBOUND = scripts.script("admit_inbound")


class MarkerStore:
    def __init__(self, redis: RedisClient, keys: Keys, *, mapping_ttl: int, dedup_ttl: int) -> None:
        self.redis = redis
        self.keys = keys
        self.mapping_ttl = mapping_ttl
        self.dedup_ttl = dedup_ttl

    # `scope`: what the marker belongs to (see `Keys.marker`): its hash tag on a cluster.
    async def marker(self, kind: str, ident: str, scope: str) -> str | None:
        return text(await self.redis.execute("GET", self.keys.marker(kind, ident, scope)))

    async def markers(self, kind: str, idents: list[str], scope: str) -> list[str | None]:
        if not idents:
            return []
        return [text(v) for v in await self.redis.execute("MGET", *(self.keys.marker(kind, i, scope) for i in idents))]

    async def set_marker(self, kind: str, ident: str, scope: str, value: str = "1", ttl: int | None = None) -> None:
        await self.redis.execute("SET", self.keys.marker(kind, ident, scope), value, "EX", ttl or self.dedup_ttl)

    async def set_markers(
        self, kind: str, idents: list[str], scope: str, value: str = "1", ttl: int | None = None
    ) -> None:
        ttl = ttl or self.dedup_ttl
        await self.redis.pipeline([("SET", self.keys.marker(kind, i, scope), value, "EX", ttl) for i in idents])

    async def first_time(self, kind: str, ident: str, scope: str, ttl: int | None = None) -> bool:
        """True the first time `ident` is seen (sets the marker atomically)."""
        key = self.keys.marker(kind, ident, scope)
        return await self.redis.execute("SET", key, "1", "NX", "EX", ttl or self.dedup_ttl) is not None

    async def claim_send(self, marker_id: str, conversation: str) -> str | None:
        """Before a send: the marker's previous value (None: first attempt, now marked `sending`)."""
        key = self.keys.marker("sent", marker_id, conversation)
        previous, _ = await self.redis.transaction([("GET", key), ("SET", key, "sending", "NX", "EX", self.dedup_ttl)])
        if previous is None:  # on a replica too before the send (see `RedisClient.replicated`)
            await self.redis.replicated()
        return text(previous)

    async def admit_inbound(self, items: list[InboundAdmission], context_size: int) -> list[AdmissionResult]:
        """De-duplicate a batch of inbound messages and keep the group-context window, in one
        atomic round trip and in the given order (see `scripts/admit_inbound.lua`). On a cluster,
        one script call per slot (a message's marker and window share its conversation's), sent
        together: atomic per conversation, which is all the window needs.

        Per item: a duplicate (its marker exists) changes nothing. Otherwise the window before the
        message is returned when asked for, the message is pushed onto its chat's window when it
        carries an entry, and its marker is set when `mark` (a message that produces nothing is
        marked at once; a user turn is marked by dispatch when it starts or is held).
        """
        if not items:
            return []
        raw: list[Any]
        if not self.keys.cluster:  # one server: the whole batch in one call, nothing to split
            raw = await self._admit(items, range(len(items)), context_size)
        else:
            batches: dict[int, list[int]] = {}  # slot → the items' positions, in order
            for position, item in enumerate(items):
                batches.setdefault(self.redis.slot_of(self.keys.window(item.conversation)), []).append(position)
            replies = await asyncio.gather(
                *(self._admit(items, positions, context_size) for positions in batches.values())
            )
            raw = [None] * len(items)
            for positions, reply in zip(batches.values(), replies, strict=True):
                for position, one in zip(positions, reply, strict=True):
                    raw[position] = one
        results = []
        for reply in raw:
            status = int(reply[0])  # 0: a duplicate; 2: over its context quota, not pushed
            entries = window(reply[1:]) if len(reply) > 1 else []
            results.append(AdmissionResult(duplicate=status == 0, window=entries, unkept=status == 2))
        return results

    async def _admit(self, items: list[InboundAdmission], positions: Sequence[int], context_size: int) -> list[Any]:
        keys: list[str] = []
        args: list[Any] = [self.dedup_ttl, max(context_size, 0), self.mapping_ttl]
        for item in (items[p] for p in positions):
            keys.append(self.keys.marker("in", item.dedup_id, item.conversation))
            keys.append(self.keys.window(item.conversation))
            push = item.entry_json is not None and context_size > 0
            read = item.want_window and context_size > 0
            quota = item.quota if push else None
            flags = ("w" if read else "") + ("p" if push else "") + ("m" if item.mark else "") + ("c" if quota else "")
            args.append(flags or "-")
            args.append(item.entry_json if push and item.entry_json is not None else "")
            if quota is not None:
                keys.append(self.keys.scoped("ctxquota", item.conversation, f"{item.conversation}:{quota.chat}"))
                keys.append(self.keys.scoped("ctxquota", item.conversation, f"{item.conversation}:{quota.user}"))
                args += [quota.chat_limit, quota.chat_ms, quota.user_limit, quota.user_ms]
        return list(await self.redis.run_script(_ADMIT_INBOUND, keys, args))
