"""redis-py (asyncio) clients of `SWITCHBOARD_REDIS_URL`, for what the stores' client does not do:
blocking waits (the long connections' action queues) and pub/sub (the console's subscription).

A server URL gets redis-py's own pool; a cluster URL redis-py's `RedisCluster`; a sentinel URL a
`SentinelPrimaryPool`: redis-py's `SentinelConnectionPool`, which asks the sentinels for the primary
on each new connection and drops a connection that gets `READONLY`, and which also re-checks open
connections through the sentinel watcher the stores' client uses (`sentinel.SentinelWatch`): a
primary the sentinels failed over from while it was unreachable comes back still calling itself the
primary, and every write it takes until they demote it (about 8 s) is thrown away.

Only redis-py's public API and its documented points of extension are used: the pool's
`get_master_address`, `get_connection`, `release`, `reset` and `disconnect`, the `PubSub`'s
`parse_response`, and `Redis.pubsub`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedSSLConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from pipeline.state.redis_url import ClusterTarget, Endpoint, SentinelTarget, parse_redis_url
from pipeline.state.sentinel import Named, SentinelWatch, named_in


class SentinelPrimaryPool(SentinelConnectionPool):
    """redis-py's `SentinelConnectionPool` of a primary, which also re-checks open connections.

    When a connection is taken or given back (or a subscription reads), a re-check is started in
    the background if one is due (`SentinelWatch.check_soon`); when it finds another primary under
    a newer failover epoch, the idle connections are closed and those in use are closed when given
    back, and each reconnects to the new primary.
    """

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        # Before redis-py's constructor, which may call `reset`.
        self._watch: SentinelWatch[Redis] = SentinelWatch(
            tuple(sentinel_manager.sentinels),
            self._ask,
            master=service_name,
            describe=_sentinel_address,
            label="redis-py",
        )
        super().__init__(service_name, sentinel_manager, **kwargs)

    def reset(self) -> None:
        super().reset()
        self._watch.named = None

    async def get_master_address(self) -> tuple[str, int]:
        """The primary for a new connection: the first sentinel that names one in good standing
        (the one that answered last asked first), with the epoch the re-checks compare against."""

        def no_primary(problems: list[str]) -> Exception:
            why = f" : {', '.join(problems)}" if problems else ""
            return MasterNotFoundError(f"No master found for {self.service_name!r}{why}")

        named = await self._watch.find(no_primary)
        await self._follow(named)
        return named[0], named[1]

    async def get_connection(self, *args: Any, **options: Any) -> AbstractConnection:
        self.recheck_soon()
        return await super().get_connection(*args, **options)

    async def release(self, connection: AbstractConnection) -> None:
        if self.left_behind(connection):
            # Taken before the sentinels named another primary: closed, so that its next user
            # reconnects (to the primary named now) instead of writing to the one failed over from.
            await connection.disconnect()
        await super().release(connection)
        self.recheck_soon()

    async def disconnect(self, inuse_connections: bool = True) -> None:
        if inuse_connections:  # the pool is being closed
            self._watch.close()
        await super().disconnect(inuse_connections)

    def left_behind(self, connection: AbstractConnection) -> bool:
        """Whether `connection` is open to another server than the primary named now."""
        named = self._watch.named
        return (
            isinstance(connection, Connection)
            and connection.is_connected
            and named is not None
            and (connection.host, connection.port) != named[:2]
        )

    @property
    def primary_address(self) -> str:
        """`host:port` of the primary named now (what logs and errors name; never a password)."""
        named = self._watch.named
        return f"{named[0]}:{named[1]}" if named is not None else "?"

    def recheck_soon(self) -> None:
        """Start a re-check of the primary in the background when one is due."""
        self._watch.check_soon(self._follow)

    async def _follow(self, named: Named) -> None:
        self._watch.named = named
        if self.master_address != named[:2]:
            self.master_address = named[:2]
            # Idle connections reconnect, to this primary, when next taken (as redis-py does).
            await super().disconnect(inuse_connections=False)

    async def _ask(self, sentinel: Redis) -> Named | None:
        """The primary `sentinel` names (`SENTINEL MASTER`) and the failover epoch that made it so;
        None when it does not think that primary in good standing (redis-py's `check_master_state`:
        down, or too few other sentinels seen)."""
        state = await sentinel.sentinel_master(self.service_name)
        if not isinstance(state, dict) or not self.sentinel_manager.check_master_state(state, self.service_name):
            return None
        return named_in(state)


class SentinelPrimaryPubSub(PubSub):
    """A subscription of a `SentinelPrimaryPool`'s primary. It holds its connection for its lifetime
    (never given back to the pool), so it checks before each read: once the sentinels name another
    primary, the read fails with `ConnectionError` and the connection is closed. Messages published
    on the new primary did not reach it meanwhile, so the caller is told, as of a lost connection; a
    later read reconnects to the new primary and subscribes again (redis-py's `on_connect`).
    A `listen()` on a quiet channel reads only when a message comes, so it is checked only then."""

    async def parse_response(self, block: bool = True, timeout: float = 0) -> Any:
        pool, connection = self.connection_pool, self.connection
        if isinstance(pool, SentinelPrimaryPool) and connection is not None:
            pool.recheck_soon()
            if pool.left_behind(connection):
                await connection.disconnect()
                raise RedisConnectionError(f"the sentinels now name {pool.primary_address} as primary: subscribe again")
        return await super().parse_response(block=block, timeout=timeout)


class _SentinelPrimaryRedis(Redis):
    """redis-py's client over a `SentinelPrimaryPool`: its subscriptions check the primary too."""

    def pubsub(self, **kwargs: Any) -> PubSub:
        # The subscription gets its own default event dispatcher, as a `PubSub` made without one
        # does: the client's is a default one too (these clients take no streaming credential
        # provider, the only thing its listeners serve).
        return SentinelPrimaryPubSub(self.connection_pool, **kwargs)


def _sentinel_address(sentinel: Redis) -> str:
    options = sentinel.connection_pool.connection_kwargs
    return f"{options.get('host')}:{options.get('port')}"


def redis_py_pool(url: str, **options: Any) -> ConnectionPool:
    """A redis-py (asyncio) connection pool for `url` with the given pool/connection options: the
    URL's server, or, for a sentinel URL, a `SentinelPrimaryPool`."""
    target = parse_redis_url(url)
    if isinstance(target, ClusterTarget):
        raise ValueError("a redis+cluster:// URL has no single connection pool: use redis_py_client")
    if isinstance(target, Endpoint):
        return ConnectionPool.from_url(url, **options)
    return _sentinel_pool(target, **options)


def _sentinel_pool(target: SentinelTarget, **options: Any) -> SentinelPrimaryPool:
    sentinel_options = {k: v for k, v in options.items() if k.startswith("socket_")}
    if target.sentinel_password:
        sentinel_options["password"] = target.sentinel_password
    if target.tls:
        sentinel_options["ssl"] = True
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_options)
    server_options: dict[str, Any] = {"db": target.db, "username": target.username, "password": target.password}
    if target.tls:
        server_options["connection_class"] = SentinelManagedSSLConnection
    return SentinelPrimaryPool(target.master, sentinel, **server_options, **options)


# A redis-py (asyncio) client: of one server (or Sentinel's primary), or of a cluster.
RedisPy = Redis | RedisCluster


def redis_py_client(url: str, **options: Any) -> RedisPy:
    """A redis-py (asyncio) client for `url` with the given pool/connection options: over
    `redis_py_pool`, or for a cluster URL redis-py's `RedisCluster` (it routes each command to its
    slot's primary and follows failovers; its pub/sub is plain pub/sub, which a cluster delivers
    from any node to subscribers on every node)."""
    target = parse_redis_url(url)
    if isinstance(target, SentinelTarget):
        return _SentinelPrimaryRedis(connection_pool=_sentinel_pool(target, **options))
    if isinstance(target, Endpoint):
        return Redis(connection_pool=redis_py_pool(url, **options))
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        username=target.username,
        password=target.password,
        ssl=target.tls,
        **options,
    )


async def pubsub(client: RedisPy) -> PubSub:
    """A pub/sub of `client`; of a cluster client after it (re)reads the slot map, as a subscription
    that broke may have lost its node to a failover. Plain pub/sub: a cluster delivers a message
    published on any node to subscribers on every node. Of a sentinel URL's client, a
    `SentinelPrimaryPubSub`: a read fails with `ConnectionError` once the sentinels name another
    primary than the one it is subscribed on."""
    if isinstance(client, RedisCluster):
        await client.initialize()
        await client.nodes_manager.initialize()
    return client.pubsub(ignore_subscribe_messages=True)


async def listen(
    client: RedisPy,
    channel: str,
    on_message: Callable[[Any], None],
    *,
    subscribed: asyncio.Event,
    on_lost: Callable[[Exception], None],
    running: Callable[[], bool] = lambda: True,
    poll_seconds: float = 1.0,
) -> None:
    """Subscribe to `channel` and hand each message's data to `on_message`, while `running()`.
    After a break (or an error from `on_message`) `subscribed` is cleared, `on_lost` told, and it
    subscribes again (after 0.2 s, doubling to 5 s): messages published meanwhile are lost to it.
    `subscribed` is set while a subscription is live."""
    backoff = 0.2
    while running():
        subscription: PubSub | None = None
        try:
            subscription = await pubsub(client)
            await subscription.subscribe(channel)
            subscribed.set()
            backoff = 0.2
            while running():
                message = await subscription.get_message(ignore_subscribe_messages=True, timeout=poll_seconds)
                if message is not None and message.get("type") == "message":
                    on_message(message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            subscribed.clear()
            on_lost(exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        finally:
            subscribed.clear()
            if subscription is not None:
                with contextlib.suppress(Exception):
                    await subscription.aclose()


async def close_redis_py(client: RedisPy) -> None:
    """Close a redis-py client and every connection it opened."""
    await client.aclose()
    if isinstance(client, Redis):
        await client.connection_pool.disconnect()


__all__ = [
    "RedisPy",
    "SentinelPrimaryPool",
    "SentinelPrimaryPubSub",
    "close_redis_py",
    "listen",
    "pubsub",
    "redis_py_client",
    "redis_py_pool",
]
