"""Reply deadlines: the turns whose platform closes replies to their message after a while, each
with when its notice is due (`pipeline.stages.deadlines` decides; this keeps them). One sorted set
for the deployment, scanned by every worker; a claim makes one worker at a time handle an entry."""

from __future__ import annotations

from . import scripts
from ._codec import text
from .client import RedisClient
from .keys import Keys

_CLAIM_DEADLINES = scripts.script("claim_deadlines")


class DeadlineStore:
    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def schedule(self, member: str, due_ms: float) -> None:
        await self.redis.execute("ZADD", self.keys.reply_deadlines(), int(due_ms), member)

    async def claim_due(self, now_ms: float, *, claim_ms: int, limit: int) -> list[str]:
        """The members due by `now_ms` (at most `limit`), each claimed for `claim_ms`: removed by
        `remove` once handled, due again after the claim if not."""
        raw = await self.redis.run_script(
            _CLAIM_DEADLINES, [self.keys.reply_deadlines()], [int(now_ms), claim_ms, limit]
        )
        return [text(member) or "" for member in raw]

    async def remove(self, *members: str) -> None:
        if members:
            await self.redis.execute("ZREM", self.keys.reply_deadlines(), *members)
