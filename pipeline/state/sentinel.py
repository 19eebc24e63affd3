"""Following a Sentinel-managed primary through failovers: the one watcher both Redis clients use.

A `redis+sentinel://` URL (`redis_url.SentinelTarget`) names a primary that Redis Sentinel may move.
Two clients connect through it: the stores' client (`client.RedisClient`, its own protocol code)
and redis-py's pools (`redis_py.SentinelPrimaryPool`). Each asks the sentinels in its own way
(`ask`: one `SENTINEL MASTER` to one sentinel); what follows from the answers is here, once:

- which sentinel is asked for a new connection's primary: each in turn, the one that answered last
  first (`SentinelWatch.find`);
- which primary the open connections go to, and the failover epoch under which a sentinel named it
  (`SentinelWatch.named`);
- the re-check of open connections: at most once a `PRIMARY_RECHECK`, every sentinel is asked at
  once and the answer under the newest failover epoch counts; a newer epoch naming another server
  means the connections must move (`SentinelWatch.newer`). Sentinels that have not caught up with
  a failover (they learn of it from the others' hello messages, seconds later) name older epochs and
  are outvoted, not followed. An answer not in good standing (`in_good_standing`: the primary
  down, or being failed over from) names nothing; a new connection passes over a sentinel behind
  the newest epoch seen (`SentinelWatch.find`).

Why open connections are re-checked at all: a primary the sentinels failed over from while it was
unreachable (paused, partitioned, too slow to answer their pings) still says `master` when it comes
back, takes every write, and loses them all when the sentinels demote it about 8 s later (a chaos
run lost 11 s of turn state so). Neither client hears of it otherwise: redis-py asks the sentinels
only for a new connection, and `READONLY` comes only after the demotion.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

# Seconds between two checks that the sentinels still name the primary the open connections go to.
PRIMARY_RECHECK = 1.0

# A primary as a sentinel names it: host, port, and the failover epoch (`config-epoch`) that made it so.
Named = tuple[str, int, int]
S = TypeVar("S")


def newer_primary(named: Named, host: str, port: int, epoch: int) -> bool:
    """Whether a sentinel's answer (`host:port` under failover `epoch`) means that connections opened
    to `named` must move. A sentinel that has not caught up with a failover names an older epoch and
    is not followed."""
    return epoch > named[2] and (host, port) != named[:2]


# Flags of a `SENTINEL MASTER` reply under which the address it gives is not a primary to use: down
# as that sentinel sees it, or by the sentinels' agreement, or being failed over from. Mid-failover
# the reply already carries the failover's new epoch with the old primary's address, which a
# re-check would otherwise take for that primary confirmed under the new epoch (and then never
# follow the promoted one, named under the same epoch).
NOT_IN_GOOD_STANDING = frozenset({"s_down", "o_down", "failover_in_progress"})


def in_good_standing(state: Mapping[str, Any]) -> bool:
    """Whether a `SENTINEL MASTER` reply (as field → value) names a primary to connect to."""
    flags = set(str(state.get("flags", "")).split(","))
    return "master" in flags and not flags & NOT_IN_GOOD_STANDING


def named_in(state: Mapping[str, Any]) -> Named:
    """The primary a `SENTINEL MASTER` reply (as field → value) names."""
    return str(state["ip"]), int(state["port"]), int(state.get("config-epoch", 0))


class SentinelWatch(Generic[S]):
    """The sentinels of one master, as one client sees them (`S`: how that client holds a sentinel).

    `ask(sentinel)` is the client's `SENTINEL MASTER`: the primary that sentinel names, or None when
    it does not name one in good standing. `label` starts the warning logged when the primary moves
    (never a password: addresses only)."""

    def __init__(
        self,
        sentinels: Sequence[S],
        ask: Callable[[S], Awaitable[Named | None]],
        *,
        master: str,
        describe: Callable[[S], str],
        label: str,
    ) -> None:
        self._ask = ask
        self._describe = describe
        self._master = master
        self._label = label
        # For a new connection: the one that answered last first.
        self._by_last_answer = list(sentinels)
        # For the re-checks: all of them.
        self._all = tuple(sentinels)
        # The primary the open connections go to, and the epoch under which a sentinel named it.
        self.named: Named | None = None
        # The primary named under the newest failover epoch any sentinel has answered with.
        self.newest: Named | None = None
        self._checked = time.monotonic()
        self._check: asyncio.Task[None] | None = None

    async def find(self, no_primary: Callable[[list[str]], Exception]) -> Named:
        """The primary for a new connection, from the first sentinel that names one under the
        newest failover epoch this watch has seen; raised: `no_primary(problems)` (each
        `host:port: why`) when none did. A sentinel behind a failover the re-check already heard of
        would otherwise send the connection it dropped straight back to the old primary."""
        problems: list[str] = []
        for sentinel in list(self._by_last_answer):
            try:
                named = await self._ask(sentinel)
            except (RedisConnectionError, RedisTimeoutError, ResponseError) as exc:
                problems.append(f"{self._describe(sentinel)}: {exc}")
                continue
            if named is None:
                continue
            if self.newest is not None and named[2] < self.newest[2]:
                problems.append(f"{self._describe(sentinel)}: behind a failover (epoch {named[2]} < {self.newest[2]})")
                continue
            self._answered(sentinel, named)
            return named
        raise no_primary(problems)

    def _answered(self, sentinel: S, named: Named) -> None:
        """`sentinel` named a primary: asked first next time; its epoch the newest seen if it is."""
        self._by_last_answer.remove(sentinel)
        self._by_last_answer.insert(0, sentinel)
        if self.newest is None or named[2] > self.newest[2]:
            self.newest = named

    def due(self) -> bool:
        """Whether a re-check is due (connections are open to a named primary, and the last check
        is `PRIMARY_RECHECK` old); counts as started when it is."""
        now = time.monotonic()
        if self.named is None or now - self._checked < PRIMARY_RECHECK:
            return False
        self._checked = now
        return True

    async def newer(self) -> Named | None:
        """Ask every sentinel at once: the primary the open connections must move to, or None. The
        answer under the newest failover epoch counts; a sentinel that cannot say within
        `PRIMARY_RECHECK` is left out, so a stuck one never holds up the checks."""
        answers = await asyncio.gather(*(self._ask_within_recheck(sentinel) for sentinel in self._all))
        known = [(answer, sentinel) for answer, sentinel in zip(answers, self._all, strict=True) if answer is not None]
        named = None
        if known:
            named, newest_sentinel = max(known, key=lambda pair: pair[0][2])
            self._answered(newest_sentinel, named)
        before = self.named
        if named is None or before is None:
            return None
        if not newer_primary(before, *named):
            if named[:2] == before[:2] and named[2] > before[2]:
                # The same primary under a newer epoch (a failover back to it): a sentinel that
                # still names the one in between is behind, not news.
                self.named = named
            return None
        log.warning(
            "%s: the sentinels now name %s:%d as primary of %s (epoch %d > %d): reconnecting",
            self._label,
            named[0],
            named[1],
            self._master,
            named[2],
            before[2],
        )
        return named

    async def _ask_within_recheck(self, sentinel: S) -> Named | None:
        try:
            async with asyncio.timeout(PRIMARY_RECHECK):
                return await self._ask(sentinel)
        except (RedisError, OSError, TimeoutError):
            return None

    def check_soon(self, follow: Callable[[Named], Awaitable[None]]) -> None:
        """Start a re-check in the background when one is due, and `follow` what it finds. No
        command waits for the sentinels, and one that cannot reach them is not failed."""
        if (self._check is not None and not self._check.done()) or not self.due():
            return
        self._check = asyncio.get_running_loop().create_task(self._recheck(follow), name="redis-primary-recheck")

    async def _recheck(self, follow: Callable[[Named], Awaitable[None]]) -> None:
        named = await self.newer()
        if named is not None:
            await follow(named)

    def close(self) -> None:
        """Stop a background re-check (the client is being closed)."""
        if self._check is not None:
            self._check.cancel()


__all__ = ["PRIMARY_RECHECK", "Named", "SentinelWatch", "in_good_standing", "named_in", "newer_primary"]
