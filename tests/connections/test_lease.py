"""The lease per bot connection on a real Redis: acquired only when free (or taken: the newest
accepted connection wins), a fencing token per new holder, renewed only by its holder, released
never for a newer one, and lost by its holder at once when taken or when it cannot renew."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from pipeline.connections._lease import HeldLease
from pipeline.embedded import RedisServer
from pipeline.state import ConnectionStore, Keys, RedisClient

CHANNELS = ("api", "event")


def _record_renewals(store: ConnectionStore) -> list[tuple[float, bool]]:
    """(sent at, answer) of every renewal sent through the real store (a per-test one), in order.

    Lets the tests say *which* renewal noticed a loss (a count) rather than how fast it did (a
    wall-clock figure a loaded machine breaks)."""
    renewals: list[tuple[float, bool]] = []
    renew = store.renew

    async def recording(*args: Any, **kwargs: Any) -> bool:
        sent = time.monotonic()
        ok = await renew(*args, **kwargs)
        renewals.append((sent, ok))
        return ok

    store.renew = recording  # type: ignore[method-assign]
    return renewals


async def test_free_acquisition_then_take_with_growing_fencing_tokens(store: ConnectionStore) -> None:
    first = await store.acquire("onebot", "qq1", CHANNELS, "worker-a", 5000, "dialing", take=False)
    assert first is not None and first.token == 1 and first.previous is None
    # Held: a competitor gets nothing, and the lease is unchanged.
    assert await store.acquire("onebot", "qq1", CHANNELS, "worker-b", 5000, "dialing", take=False) is None
    assert await store.acquire("onebot", "qq1", ("event",), "worker-b", 5000, "dialing", take=False) is None
    [api, event] = await store.holders([("onebot", "qq1", "api"), ("onebot", "qq1", "event")])
    assert api == event and api is not None and (api.holder, api.token, api.state) == ("worker-a", 1, "dialing")
    # A take (an accepted connection) always wins, with a new token, and says whom it replaced.
    taken = await store.acquire("onebot", "qq1", CHANNELS, "worker-b", 5000, "up", take=True)
    assert taken is not None and taken.token == 2
    assert taken.previous is not None and taken.previous.owner == "worker-a|1"
    # Another bot has its own leases and tokens.
    other = await store.acquire("onebot", "qq2", CHANNELS, "worker-a", 5000, "up", take=False)
    assert other is not None and other.token == 1


async def test_only_the_holder_renews_and_releases(store: ConnectionStore) -> None:
    acquired = await store.acquire("onebot", "qq1", CHANNELS, "worker-a", 5000, "dialing", take=False)
    assert acquired is not None
    assert await store.renew("onebot", "qq1", CHANNELS, "worker-a|1", 5000, "up")
    [value] = await store.holders([("onebot", "qq1", "api")])
    assert value is not None and value.state == "up"
    # A stale token (a previous holding of the same worker) neither renews nor releases.
    assert not await store.renew("onebot", "qq1", CHANNELS, "worker-a|0", 5000, "up")
    assert await store.release("onebot", "qq1", CHANNELS, "worker-b|1") == 0
    assert await store.release("onebot", "qq1", CHANNELS, "worker-a|0") == 0
    taken = await store.acquire("onebot", "qq1", CHANNELS, "worker-b", 5000, "up", take=True)
    assert taken is not None
    assert not await store.renew("onebot", "qq1", CHANNELS, "worker-a|1", 5000, "up")
    assert await store.release("onebot", "qq1", CHANNELS, "worker-a|1") == 0  # never the newer holder's
    assert await store.release("onebot", "qq1", CHANNELS, f"worker-b|{taken.token}") == 2
    assert await store.holders([("onebot", "qq1", "api"), ("onebot", "qq1", "event")]) == [None, None]


async def test_renewal_needs_every_channel(store: ConnectionStore) -> None:
    """A universal holder whose api channel was taken by a split-role connection has lost."""
    assert await store.acquire("onebot", "qq1", CHANNELS, "worker-a", 5000, "up", take=False) is not None
    assert await store.acquire("onebot", "qq1", ("api",), "worker-b", 5000, "up", take=True) is not None
    assert not await store.renew("onebot", "qq1", CHANNELS, "worker-a|1", 5000, "up")


async def test_an_unrenewed_lease_expires(store: ConnectionStore) -> None:
    assert await store.acquire("onebot", "qq1", CHANNELS, "worker-a", 300, "up", take=False) is not None
    await asyncio.sleep(0.5)
    again = await store.acquire("onebot", "qq1", CHANNELS, "worker-b", 300, "up", take=False)
    assert again is not None and again.token == 2 and again.previous is None


def _held(store: ConnectionStore, token: int, seconds: float) -> HeldLease:
    return HeldLease(
        store,
        "onebot",
        "qq1",
        CHANNELS,
        holder="worker-a",
        token=token,
        seconds=seconds,
        state="up",
        acquired_at=time.monotonic(),
    )


async def test_a_held_lease_is_kept_then_lost_at_once_when_taken(store: ConnectionStore) -> None:
    acquired = await store.acquire("onebot", "qq1", CHANNELS, "worker-a", 900, "up", take=False)
    assert acquired is not None
    renewals = _record_renewals(store)
    lease = _held(store, acquired.token, 0.9)
    lease.start()
    try:
        await asyncio.sleep(2.0)  # more than twice the lease: only renewals keep it
        assert not lease.lost.is_set()
        kept_by = len(renewals)
        assert kept_by >= 2 and all(ok for _, ok in renewals), renewals
        assert await store.acquire("onebot", "qq1", CHANNELS, "worker-b", 900, "up", take=False) is None
        taken_at = time.monotonic()
        assert await store.acquire("onebot", "qq1", CHANNELS, "worker-b", 900, "up", take=True) is not None
        async with asyncio.timeout(30.0):  # a hang bound only
            await lease.lost.wait()
        assert lease.why_lost == "taken"
        # "At once" is counted, not timed: the renewal that answered "not yours" was the first one
        # sent after the take (a renewal already on its way when the take ran may be it), every
        # earlier one succeeded, and none followed it.
        answers = [ok for _, ok in renewals]
        assert answers[-1] is False and all(answers[:-1]), renewals
        assert len([sent for sent, _ in renewals if sent >= taken_at]) <= 1, (taken_at, renewals)
    finally:
        await lease.release()
    [value] = await store.holders([("onebot", "qq1", "api")])
    assert value is not None and value.holder == "worker-b"  # releasing did not touch the new holder


async def test_a_holder_that_cannot_renew_gives_up_before_redis_lets_anyone_else_in(
    redis_server_factory: Callable[..., Awaitable[RedisServer]], redis_prefix: str
) -> None:
    server: RedisServer = await redis_server_factory()
    quick = RedisClient(server.url, socket_timeout=1, connect_timeout=1)
    blocking = aioredis.Redis.from_url(server.url, decode_responses=True)
    store = ConnectionStore(quick, blocking, Keys(redis_prefix), done_ttl=60)
    # A long lease so that the holder's own margin (5 % of it, 300 ms) is large next to a loaded
    # machine's scheduling delays: the bounds below are the lease's, not a speed.
    seconds = 6.0
    renewals = _record_renewals(store)
    try:
        acquired_at = time.monotonic()
        acquired = await store.acquire("onebot", "qq1", CHANNELS, "worker-a", int(seconds * 1000), "up", take=False)
        assert acquired is not None
        lease = HeldLease(
            store,
            "onebot",
            "qq1",
            CHANNELS,
            holder="worker-a",
            token=acquired.token,
            seconds=seconds,
            state="up",
            acquired_at=acquired_at,
        )
        gave_up_at: list[float] = []
        lose = lease.lose

        def recording_lose(why: str) -> None:
            gave_up_at.append(time.monotonic())
            lose(why)

        lease.lose = recording_lose  # type: ignore[method-assign]
        lease.start()
        await asyncio.sleep(seconds / 3 + 0.5)  # one renewal (every third of the lease) has succeeded
        await server.stop()  # Redis gone: no renewal can succeed
        async with asyncio.timeout(seconds + 30):  # a hang bound only
            await lease.lost.wait()
        assert lease.why_lost == "expired"
        succeeded = [sent for sent, ok in renewals if ok]
        assert succeeded, renewals
        # Redis's lease runs `seconds` from when it *executed* the last successful renewal, which is
        # after it was sent; the holder counts from the sending, minus its margin. So it gives up
        # after most of the lease (it kept the connection while it could) and before Redis's lease
        # can have run out (nobody else could have been let in yet).
        assert seconds * 0.9 <= gave_up_at[0] - succeeded[-1] < seconds, (succeeded, gave_up_at)
        await lease.release()  # Redis unreachable: returns anyway
    finally:
        await quick.aclose()
        await blocking.aclose()


async def test_holders_of_many_leases_in_one_read(store: ConnectionStore, quick_client: RedisClient) -> None:
    await store.acquire("onebot", "a", ("api",), "w1", 5000, "up", take=False)
    await store.acquire("onebot", "b", ("event",), "w2", 5000, "dialing", take=False)
    values = await store.holders([("onebot", "a", "api"), ("onebot", "a", "event"), ("onebot", "b", "event")])
    assert [v.owner if v else None for v in values] == ["w1|1", None, "w2|1"]
    assert values[2] is not None and values[2].state == "dialing"
    keys = store.keys
    assert await quick_client.execute("GET", keys.lease_token("onebot", "a")) == "1"
