"""Long connections: the lease per bot connection channel (which worker holds it, with a fencing
token) and the queue of actions any worker asks the holder to run over the connection.

A lease is a key per channel whose value is `holder|token|state`, set with an expiry and extended by
its holder (`scripts/lease_*.lua`). Actions are a list per bot: senders push a request and wait on
a reply list of their own; the holder pops requests (blocking, on a connection of its own), checks
its fencing token and whether the action already ran (`scripts/claim_action.lua`), runs it and
pushes the answer. A polled transport's offset (how far its updates are durable) is a key per
bot that only the lease's holder may write (`scripts/commit_offset.lua`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from . import scripts
from ._codec import text
from .client import RedisClient
from .exceptions import StateError
from .keys import Keys
from .redis_py import RedisPy

LeaseState = Literal["dialing", "up"]


@dataclass(frozen=True)
class LeaseValue:
    """What a lease key holds."""

    holder: str
    token: int
    state: str

    @property
    def owner(self) -> str:
        """`holder|token`: what renewals and releases compare against."""
        return f"{self.holder}|{self.token}"

    @classmethod
    def parse(cls, raw: str | None) -> LeaseValue | None:
        if not raw:
            return None
        holder, _, rest = raw.partition("|")
        token, _, state = rest.partition("|")
        return cls(holder, int(token), state) if token.isdigit() else None


@dataclass(frozen=True)
class Acquired:
    token: int
    previous: LeaseValue | None  # who held the first channel before (a take), if anyone


@dataclass(frozen=True)
class ActionClaim:
    # run: send it (now marked as being sent); done: it ended before (`outcome`); mine: this holder
    # sent it already; unknown: an earlier holder sent it and never recorded how it ended; fenced:
    # the lease is not this holder's any more.
    kind: Literal["run", "done", "mine", "unknown", "fenced"]
    outcome: str | None = None


_ACQUIRE = scripts.script("lease_acquire")
_RENEW = scripts.script("lease_renew")
_RELEASE = scripts.script("lease_release")
_CLAIM_ACTION = scripts.script("claim_action")
_COMMIT_OFFSET = scripts.script("commit_offset")


class ConnectionStore:
    """`redis`: the stores' client, for scripts and quick commands. `blocking`: a redis-py client
    of its own (the stores' client takes no blocking commands), whose socket timeout is above every
    wait, for the pops that wait for an action or an answer."""

    def __init__(self, redis: RedisClient, blocking: RedisPy, keys: Keys, *, done_ttl: int) -> None:
        self.redis = redis
        self.blocking = blocking
        self.keys = keys
        self.done_ttl = done_ttl

    def _leases(self, platform: str, bot_id: str, channels: Sequence[str]) -> list[str]:
        return [self.keys.lease(platform, bot_id, c) for c in channels]

    # -- leases ----------------------------------------------------------------------------------
    async def acquire(
        self,
        platform: str,
        bot_id: str,
        channels: Sequence[str],
        holder: str,
        ttl_ms: int,
        state: LeaseState,
        *,
        take: bool,
    ) -> Acquired | None:
        """Hold `channels` of the bot: only if nobody does (`take=False`), or in any case. None when
        another holder has one of them."""
        token, previous = await self.redis.run_script(
            _ACQUIRE,
            [self.keys.lease_token(platform, bot_id), *self._leases(platform, bot_id, channels)],
            [holder, ttl_ms, state, "take" if take else "free"],
        )
        if int(token) == 0:
            return None
        return Acquired(int(token), LeaseValue.parse(text(previous)))

    async def renew(
        self, platform: str, bot_id: str, channels: Sequence[str], owner: str, ttl_ms: int, state: LeaseState
    ) -> bool:
        """Extend the leases if every one is still `owner`'s (`holder|token`); False: lost."""
        return bool(
            await self.redis.run_script(_RENEW, self._leases(platform, bot_id, channels), [owner, ttl_ms, state])
        )

    async def release(self, platform: str, bot_id: str, channels: Sequence[str], owner: str) -> int:
        return int(await self.redis.run_script(_RELEASE, self._leases(platform, bot_id, channels), [owner]))

    async def holders(self, leases: Sequence[tuple[str, str, str]]) -> list[LeaseValue | None]:
        """The value of each (platform, bot id, channel) lease, None where nobody holds it."""
        if not leases:
            return []
        raw = await self.redis.execute("MGET", *(self.keys.lease(p, b, c) for p, b, c in leases))
        return [LeaseValue.parse(text(v)) for v in raw]

    # -- actions ---------------------------------------------------------------------------------
    async def push_action(self, platform: str, bot_id: str, request: str, queue_ttl_ms: int) -> None:
        """Queue a request for the bot's holder. The queue expires when nobody has asked for a
        while, so the requests of a bot nobody holds do not pile up."""
        key = self.keys.actions(platform, bot_id)
        await self.redis.pipeline([("LPUSH", key, request), ("PEXPIRE", key, queue_ttl_ms)])

    async def give_back(self, platform: str, bot_id: str, request: str) -> None:
        """Put a request taken by a holder that lost its lease back at the head of the queue."""
        await self.redis.execute("RPUSH", self.keys.actions(platform, bot_id), request)

    async def next_action(self, platform: str, bot_id: str, timeout: float) -> str | None:
        """The oldest queued request, waiting up to `timeout` seconds for one."""
        popped = await self.blocking.brpop([self.keys.actions(platform, bot_id)], timeout=timeout)
        return text(popped[1]) if popped else None

    async def claim_action(self, platform: str, bot_id: str, channel: str, owner: str, request_id: str) -> ActionClaim:
        """What to do with a request (`scripts/claim_action.lua`); `run` marks it as being sent."""
        raw = await self.redis.run_script(
            _CLAIM_ACTION,
            [self.keys.lease(platform, bot_id, channel), self.keys.action_done(platform, bot_id, request_id)],
            [owner, self.done_ttl],
        )
        kind = text(raw[0])
        if kind == "done":
            return ActionClaim("done", text(raw[1]))
        if kind in ("run", "mine", "unknown", "fenced"):
            return ActionClaim(kind)  # type: ignore[arg-type]  # one of the literals, checked
        raise StateError(f"claim_action answered {kind!r}")

    async def answer(
        self,
        reply_id: str,
        answer: str,
        ttl_ms: int,
        *,
        platform: str,
        bot_id: str,
        request_id: str,
        final: bool | None,
    ) -> None:
        """Push the answer for its sender. `final`: keep it as the action's outcome (a repeat gets
        it); False: forget the action ran (a repeat runs it again); None: leave the record alone."""
        key = self.keys.action_reply(reply_id)
        commands: list[tuple[str | int, ...]] = [("LPUSH", key, answer), ("PEXPIRE", key, ttl_ms)]
        marker = self.keys.action_done(platform, bot_id, request_id)
        if final:
            commands.insert(0, ("SET", marker, f"done:{answer}", "EX", self.done_ttl))
        elif final is False:
            commands.insert(0, ("DEL", marker))
        await self.redis.pipeline(commands)

    async def wait_answer(self, reply_id: str, timeout: float) -> str | None:
        popped = await self.blocking.blpop([self.keys.action_reply(reply_id)], timeout=timeout)
        return text(popped[1]) if popped else None

    # -- offsets of polled transports --------------------------------------------------------------
    async def committed_offset(self, platform: str, bot_id: str) -> int | None:
        """Where the bot's next poll starts (None: nothing committed yet)."""
        raw = text(await self.redis.execute("GET", self.keys.offset(platform, bot_id)))
        return int(raw) if raw is not None and raw.lstrip("-").isdigit() else None

    async def commit_offset(self, platform: str, bot_id: str, channel: str, owner: str, offset: int) -> bool:
        """Record the offset if the lease of `channel` is still `owner`'s (`holder|token`); False:
        the lease was lost and nothing was written."""
        keys = [self.keys.lease(platform, bot_id, channel), self.keys.offset(platform, bot_id)]
        return bool(await self.redis.run_script(_COMMIT_OFFSET, keys, [owner, offset]))

    # -- resumable sessions (Discord's Gateway) ----------------------------------------------------
    async def resume_state(self, platform: str, bot_id: str) -> str | None:
        """The session state the last holder recorded (None: none)."""
        return text(await self.redis.execute("GET", self.keys.resume(platform, bot_id)))

    async def commit_resume_state(self, platform: str, bot_id: str, channel: str, owner: str, state: str) -> bool:
        """Record the session state if the lease of `channel` is still `owner`'s; False: the lease
        was lost and nothing was written (the same fencing as an offset)."""
        keys = [self.keys.lease(platform, bot_id, channel), self.keys.resume(platform, bot_id)]
        return bool(await self.redis.run_script(_COMMIT_OFFSET, keys, [owner, state]))


__all__ = ["Acquired", "ActionClaim", "ConnectionStore", "LeaseState", "LeaseValue"]
