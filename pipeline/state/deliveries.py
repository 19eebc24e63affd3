"""Outbound deliveries: which messages (and which of their platform calls) a replay already
delivered, and the sliding rate windows per chat and per bot that every worker shares.

Both are answered by one script before each platform call (`scripts/claim_delivery.lua`): a
sorted set per window holds the times of the calls made in it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from . import scripts
from ._codec import text
from .client import RedisClient
from .keys import Keys


@dataclass(frozen=True)
class RateWindow:
    """At most `limit` calls per `seconds`, under `identifier` (shared by all workers)."""

    identifier: str
    limit: int
    seconds: float


@dataclass(frozen=True)
class Claim:
    delivered: list[str | None]  # per marker asked for: its value, or None when not delivered
    wait: float  # seconds until a slot frees (0: slots taken, or nothing to take)


_CLAIM_DELIVERY = scripts.script("claim_delivery")


class DeliveryStore:
    def __init__(self, redis: RedisClient, keys: Keys, *, dedup_ttl: int) -> None:
        self.redis = redis
        self.keys = keys
        self.dedup_ttl = dedup_ttl

    async def claim(self, bot: str, marker_ids: Sequence[str], windows: Sequence[RateWindow]) -> Claim:
        """The delivered markers of `marker_ids`, and a slot in every window unless the first
        marker (the message's) says it was delivered before. `bot` (`platform:bot`) scopes them all
        (one slot on a cluster)."""
        args: list[str | int | float] = [len(marker_ids), int(time.time() * 1000), f"{random.getrandbits(64):016x}"]
        for window in windows:
            args += [window.limit, int(window.seconds * 1000)]
        keys = [
            *(self.keys.marker("out", m, bot) for m in marker_ids),
            *(self.keys.rate_window(w.identifier, bot) for w in windows),
        ]
        raw = await self.redis.run_script(_CLAIM_DELIVERY, keys, args)
        return Claim(delivered=[text(v) for v in raw[:-1]], wait=max(0.0, float(raw[-1]) / 1000.0))

    async def mark_delivered(self, bot: str, marker_ids: Sequence[str]) -> None:
        """Marked delivered; on a replica too when the client waits for one (a marker lost in a
        failover would let a replay post again)."""
        await self.redis.pipeline(
            [("SET", self.keys.marker("out", m, bot), "1", "EX", self.dedup_ttl) for m in marker_ids]
        )
        await self.redis.replicated()
