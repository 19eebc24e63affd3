"""`SentinelWatch`'s reading of the sentinels' answers, the part both Redis clients share.

No Redis here: `ask` is the answer each sentinel gives, as the clients' own `SENTINEL MASTER` would
return it. The answers that are hard to stage with real sentinels (one behind the others, a failover
back to the same server, one that hangs) are given directly; `tests/state/test_sentinel.py` follows
real failovers through both clients (`-k failed_over`).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from pipeline.state.sentinel import PRIMARY_RECHECK, Named, SentinelWatch, in_good_standing, newer_primary

A, B, C = ("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26379)
# A sentinel's answer: the primary it names, None (none in good standing), an error, or a float: it
# hangs that many seconds.
Answer = Named | Exception | float | None


def _watch(answers: dict[tuple[str, int], Answer]) -> SentinelWatch[tuple[str, int]]:
    """A watch of sentinels A, B, C whose answers are `answers`."""

    async def ask(sentinel: tuple[str, int]) -> Named | None:
        answer = answers[sentinel]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, float):
            await asyncio.sleep(answer)
            return None
        return answer

    return SentinelWatch((A, B, C), ask, master="main", describe=lambda s: f"{s[0]}:{s[1]}", label="test")


def test_only_a_newer_epoch_naming_another_server_moves_connections() -> None:
    named = ("p1", 6379, 5)
    assert newer_primary(named, "p2", 6379, 6)
    assert not newer_primary(named, "p2", 6379, 4)  # a sentinel behind the failover
    assert not newer_primary(named, "p2", 6379, 5)
    assert not newer_primary(named, "p1", 6379, 7)  # the same server


async def test_find_asks_the_sentinel_that_answered_last_first() -> None:
    answers: dict[tuple[str, int], Answer] = {
        A: RedisConnectionError("refused"),
        B: None,  # names no primary in good standing
        C: ("p1", 6379, 1),
    }
    watch = _watch(answers)
    assert await watch.find(lambda problems: RedisConnectionError("; ".join(problems))) == ("p1", 6379, 1)
    answers[A] = ("p2", 6379, 2)
    # C answered last: asked first, before A (which would name p2 now).
    assert await watch.find(lambda problems: RedisConnectionError("; ".join(problems))) == ("p1", 6379, 1)
    answers.update({A: RedisConnectionError("refused"), C: RedisConnectionError("timed out")})
    with pytest.raises(RedisConnectionError, match=r"10\.0\.0\.3:26379: timed out; 10\.0\.0\.1:26379: refused"):
        await watch.find(lambda problems: RedisConnectionError("; ".join(problems)))


async def test_a_recheck_asks_every_sentinel_and_follows_only_the_newest_failover() -> None:
    answers: dict[tuple[str, int], Answer] = {
        A: ("p2", 6379, 2),  # behind: names the server in between a failover away and one back
        B: ("p0", 6379, 1),  # behind: names the server before the failover
        C: ("p1", 6379, 3),  # the same server as the connections, under a newer epoch
    }
    watch = _watch(answers)
    watch.named = ("p1", 6379, 1)
    # A failover away and back: the newest epoch names the same server, so nothing moves; the epoch
    # is remembered ...
    assert await watch.newer() is None
    assert watch.named == ("p1", 6379, 3)
    # ... so that A, still naming the server in between (epoch 2), is behind, not news, even alone.
    answers.update({B: RedisConnectionError("refused"), C: 30.0})
    assert await watch.newer() is None
    assert watch.named == ("p1", 6379, 3)
    # One sentinel that knows of a newer failover to another server is enough, whatever the others say.
    answers.update({A: ("p2", 6379, 2), B: ("p3", 6380, 4), C: ("p1", 6379, 3)})
    assert await watch.newer() == ("p3", 6380, 4)


async def test_a_sentinel_that_hangs_is_skipped_within_the_recheck_interval() -> None:
    watch = _watch({A: ("p1", 6379, 1), B: 30.0, C: ("p1", 6379, 1)})
    watch.named = ("p1", 6379, 1)
    t0 = time.monotonic()
    assert await watch.newer() is None  # B hangs
    assert time.monotonic() - t0 < PRIMARY_RECHECK + 0.5


async def test_a_background_recheck_is_due_once_per_interval_and_follows_what_it_finds() -> None:
    watch = _watch({A: ("p2", 6379, 2), B: ("p2", 6379, 2), C: ("p2", 6379, 2)})
    followed: list[Named] = []

    async def follow(named: Named) -> None:
        followed.append(named)

    watch.check_soon(follow)
    assert not watch.due()  # nothing named yet: no connection to re-check
    watch.named = ("p1", 6379, 1)
    await asyncio.sleep(PRIMARY_RECHECK)  # an interval since the watch began
    watch.check_soon(follow)
    watch.check_soon(follow)  # not due again
    await asyncio.sleep(0.05)
    assert followed == [("p2", 6379, 2)]
    watch.close()


def test_a_primary_down_or_being_failed_over_from_is_not_in_good_standing() -> None:
    assert in_good_standing({"flags": "master"})
    # Mid-failover a sentinel already gives the new epoch with the old primary's address.
    assert not in_good_standing({"flags": "s_down,o_down,master,failover_in_progress", "config-epoch": "1"})
    assert not in_good_standing({"flags": "s_down,master"})
    assert not in_good_standing({"flags": "slave"})


async def test_find_passes_over_a_sentinel_behind_a_failover_a_recheck_heard_of() -> None:
    answers: dict[tuple[str, int], Answer] = {A: ("p1", 6379, 1), B: ("p2", 6380, 2), C: ("p1", 6379, 1)}
    watch = _watch(answers)
    watch.named = ("p1", 6379, 1)
    assert await watch.newer() == ("p2", 6380, 2)
    answers[B] = RedisConnectionError("refused")
    # A and C have not caught up: the connection dropped for the move must not go back to p1.
    with pytest.raises(RedisConnectionError, match="behind a failover"):
        await watch.find(lambda problems: RedisConnectionError("; ".join(problems)))
    answers[C] = ("p2", 6380, 2)
    assert await watch.find(lambda problems: RedisConnectionError("; ".join(problems))) == ("p2", 6380, 2)
