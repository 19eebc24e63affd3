"""`SWITCHBOARD_REDIS_URL`: one parser for both clients (the stores' `RedisClient` and redis-py's).

Three forms:

- `redis://[[user]:password@]host[:port][/db]` (`rediss://` for TLS): one Redis server;
- `redis+sentinel://[[user]:password@]host1[:port1][,host2[:port2],…]/master-name[/db][?sentinel_password=…]`
  (`rediss+sentinel://` for TLS to the sentinels and the servers): the primary of `master-name`
  as Redis Sentinel reports it, followed through failovers. Sentinel ports default to 26379.
  This is the form of the `Redis-Sentinel-Url` package and of redis-vl, Prefect and docket.
- `redis+cluster://[[user]:password@]host1[:port1][,host2[:port2],…]` (`rediss+cluster://` for
  TLS): a Redis Cluster, reached through any of the given nodes (ports default to 6379); the
  client learns the slot map from them (`CLUSTER SLOTS`) and follows failovers. No database
  number: a cluster has only database 0.

The credentials authenticate to the Redis servers (primary and replicas); the sentinels get
`sentinel_password` when it is given (sentinels with `requirepass`), else no credentials.

redis-py's clients of a sentinel URL (`redis_py_pool`, `redis_py_client`) re-check an open
connection as the stores' client does (`pipeline/state/client.py`): a primary the sentinels failed
over from while it was unreachable comes back still calling itself the primary, and every write it
takes until the sentinels demote it (about 8 s) is thrown away. See `SentinelPrimaryPool`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

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
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

SENTINEL_PORT = 26379
_SERVER_SCHEMES = {"redis": False, "rediss": True}
_SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
_CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
_SCHEMES = "redis://, rediss://, redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://"
# Seconds between two checks that the sentinels still name the primary an open connection goes to
# (the stores' client and redis-py's pools alike).
PRIMARY_RECHECK = 1.0


def newer_primary(named: tuple[str, int, int], host: str, port: int, epoch: int) -> bool:
    """Whether a sentinel's answer (`host:port` under failover `epoch`) means that connections opened
    to `named` (host, port, the epoch that named it) must move. A sentinel that has not caught up
    with a failover names an older epoch and is not followed."""
    return epoch > named[2] and (host, port) != named[:2]


@dataclass(frozen=True)
class Endpoint:
    """One Redis server (a `redis://` URL, or the primary a sentinel named)."""

    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        """`redis://[[user]:password@]host[:port][/db]`, or `rediss://` for TLS."""
        target = parse_redis_url(url)
        if not isinstance(target, Endpoint):
            what = "sentinels" if isinstance(target, SentinelTarget) else "a cluster"
            raise ValueError(f"a {url.partition(':')[0]}:// URL names {what}, not one server")
        return target

    @property
    def address(self) -> str:
        """`host:port`: what errors and logs name (never the credentials)."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class SentinelTarget:
    """The primary of `master` as the `sentinels` report it."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    sentinel_password: str | None = None

    def primary(self, host: str, port: int) -> Endpoint:
        return Endpoint(host, port, self.db, self.username, self.password, self.tls)

    @property
    def address(self) -> str:
        """`master-name via host:port,…`: what errors and logs name (never the credentials)."""
        return f"{self.master} via {','.join(f'{h}:{p}' for h, p in self.sentinels)}"


@dataclass(frozen=True)
class ClusterTarget:
    """A Redis Cluster, found through any of its `nodes`."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    tls: bool = False

    def node(self, host: str, port: int) -> Endpoint:
        return Endpoint(host, port, 0, self.username, self.password, self.tls)

    @property
    def address(self) -> str:
        """`cluster via host:port,…`: what errors and logs name (never the credentials)."""
        return f"cluster via {','.join(f'{h}:{p}' for h, p in self.nodes)}"


RedisTarget = Endpoint | SentinelTarget | ClusterTarget


def parse_redis_url(url: str) -> RedisTarget:
    """The server or sentinel set a Redis URL names; a `ValueError` naming what is wrong (never
    the password)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or not (scheme in _SERVER_SCHEMES or scheme in _SENTINEL_SCHEMES or scheme in _CLUSTER_SCHEMES):
        raise ValueError(f"not a {_SCHEMES} URL: {scheme}://…")
    userinfo, at, location = rest.rpartition("@")
    if not at:
        userinfo, location = "", rest
    username, colon, password = userinfo.partition(":")
    credentials = {
        "username": unquote(username) if username else None,
        "password": unquote(password) if colon and password else None,
    }
    location, _, query = location.partition("?")
    netloc, _, path = location.partition("/")
    path = path.strip("/")
    if scheme in _SERVER_SCHEMES:
        parts = urlsplit(f"redis://{netloc}")
        return Endpoint(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            db=_db(path, url_scheme=scheme),
            tls=_SERVER_SCHEMES[scheme],
            **credentials,
        )
    if scheme in _CLUSTER_SCHEMES:
        nodes = tuple(_host_port(member, scheme, 6379) for member in netloc.split(",") if member)
        if not nodes:
            raise ValueError(f"{scheme}:// URL without nodes (host1:6379,host2:6379,…)")
        if path or query:
            raise ValueError(f"{scheme}:// URL: a cluster has no database number and takes no options")
        return ClusterTarget(nodes, tls=_CLUSTER_SCHEMES[scheme], **credentials)
    sentinels = tuple(_host_port(member, scheme, SENTINEL_PORT) for member in netloc.split(",") if member)
    if not sentinels:
        raise ValueError(f"{scheme}:// URL without sentinels (host1:26379,host2:26379,…)")
    master, _, db = path.partition("/")
    if not master:
        raise ValueError(f"{scheme}:// URL without the master's name (…/master-name[/db])")
    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - {"sentinel_password"})
    if unknown:
        raise ValueError(f"{scheme}:// URL: unknown option {unknown[0]!r} (known: sentinel_password)")
    sentinel_password = options.get("sentinel_password", [""])[-1] or None
    return SentinelTarget(
        sentinels,
        master,
        _db(db, url_scheme=scheme),
        tls=_SENTINEL_SCHEMES[scheme],
        sentinel_password=sentinel_password,
        **credentials,
    )


def _db(text: str, *, url_scheme: str) -> int:
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"{url_scheme}:// URL: the database must be a number, not {text!r}")
    return int(text)


def _host_port(member: str, scheme: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(f"redis://{member}")
    try:
        port = parts.port or default_port
    except ValueError as exc:
        raise ValueError(
            f"{scheme}:// URL: bad {'node' if default_port == 6379 else 'sentinel'} address {member!r}"
        ) from exc
    return parts.hostname or "127.0.0.1", port


class SentinelPrimaryPool(SentinelConnectionPool):
    """redis-py's `SentinelConnectionPool` of a primary, which also re-checks open connections.

    redis-py asks the sentinels only for a new connection, and leaves an open one only on a
    `READONLY` reply; a primary the sentinels failed over from while it was unreachable answers no
    such thing until they demote it (about 8 s after it is back), and throws away every write it took
    by then. So, as the stores' client does: at most once a `PRIMARY_RECHECK`, when a connection is
    taken or given back (or a subscription reads), one sentinel (each in turn) is asked in the
    background; when it names another primary under a newer failover epoch, the idle connections
    are closed and those in use are closed when given back, and each reconnects to the new primary.
    """

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)
        # The primary the connections go to, and the failover epoch under which a sentinel named it.
        self._named: tuple[str, int, int] | None = None
        # A fixed order for the checks' turns (redis-py moves the sentinel that answered first).
        self._sentinels: tuple[Redis, ...] = tuple(sentinel_manager.sentinels)
        self._turn = 0
        self._checked = time.monotonic()
        self._check: asyncio.Task[None] | None = None

    def reset(self) -> None:
        super().reset()
        self._named = None

    async def get_master_address(self) -> tuple[str, int]:
        """The primary for a new connection: redis-py's choice (the first sentinel that names one in
        good standing, asked first next time), with the epoch the re-checks compare against."""
        problems: list[str] = []
        for sentinel in list(self.sentinel_manager.sentinels):
            try:
                named = await self._ask(sentinel)
            except (RedisConnectionError, RedisTimeoutError, ResponseError) as exc:
                problems.append(f"{_sentinel_address(sentinel)} - {exc!r}")
                continue
            if named is None:
                continue
            self.sentinel_manager.sentinels.remove(sentinel)
            self.sentinel_manager.sentinels.insert(0, sentinel)
            await self._follow(named)
            return named[0], named[1]
        why = f" : {', '.join(problems)}" if problems else ""
        raise MasterNotFoundError(f"No master found for {self.service_name!r}{why}")

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
        if inuse_connections and self._check is not None:  # the pool is being closed
            self._check.cancel()
        await super().disconnect(inuse_connections)

    def left_behind(self, connection: AbstractConnection) -> bool:
        """Whether `connection` is open to another server than the primary named now."""
        return (
            isinstance(connection, Connection)
            and connection.is_connected
            and self._named is not None
            and (connection.host, connection.port) != self._named[:2]
        )

    @property
    def primary_address(self) -> str:
        """`host:port` of the primary named now (what logs and errors name; never a password)."""
        return f"{self._named[0]}:{self._named[1]}" if self._named is not None else "?"

    def recheck_soon(self) -> None:
        """Start a check of the primary when one is due. In the background: no command waits for the
        sentinels, and one that cannot reach them is not failed (the next check asks another)."""
        now = time.monotonic()
        if self._named is None or now - self._checked < PRIMARY_RECHECK:
            return
        if self._check is not None and not self._check.done():
            return
        self._checked = now
        self._check = asyncio.get_running_loop().create_task(self._recheck(), name="redis-py-primary-recheck")

    async def _recheck(self) -> None:
        self._turn += 1
        sentinel = self._sentinels[self._turn % len(self._sentinels)]
        try:
            async with asyncio.timeout(PRIMARY_RECHECK):  # a stuck sentinel does not hold up the checks
                named = await self._ask(sentinel)
        except (RedisError, OSError, TimeoutError):
            return  # this sentinel cannot say; the next check asks another
        before = self._named
        if named is None or before is None:
            return
        if not newer_primary(before, *named):
            if named[:2] == before[:2] and named[2] > before[2]:
                # The same primary under a newer epoch (a failover back to it): a sentinel that
                # still names the one in between is behind, not news.
                self._named = named
            return
        log.warning(
            "redis-py: the sentinels now name %s:%d as primary of %s (epoch %d > %d): reconnecting",
            named[0],
            named[1],
            self.service_name,
            named[2],
            before[2],
        )
        await self._follow(named)

    async def _follow(self, named: tuple[str, int, int]) -> None:
        self._named = named
        if self.master_address != named[:2]:
            self.master_address = named[:2]
            # Idle connections reconnect, to this primary, when next taken (as redis-py does).
            await super().disconnect(inuse_connections=False)

    async def _ask(self, sentinel: Redis) -> tuple[str, int, int] | None:
        """The primary `sentinel` names (`SENTINEL MASTER`) and the failover epoch that made it so;
        None when it does not think that primary in good standing (redis-py's `check_master_state`:
        down, or too few other sentinels seen)."""
        state = await sentinel.sentinel_master(self.service_name)
        if not isinstance(state, dict) or not self.sentinel_manager.check_master_state(state, self.service_name):
            return None
        return str(state["ip"]), int(state["port"]), int(state.get("config-epoch", 0))


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
        return SentinelPrimaryPubSub(self.connection_pool, event_dispatcher=self._event_dispatcher, **kwargs)


def _sentinel_address(sentinel: Redis) -> str:
    options = sentinel.connection_pool.connection_kwargs
    return f"{options.get('host')}:{options.get('port')}"


def redis_py_pool(url: str, **options: Any) -> ConnectionPool:
    """A redis-py (asyncio) connection pool for `url` with the given pool/connection options: the
    URL's server, or, for a sentinel URL, a `SentinelPrimaryPool`: redis-py's
    `SentinelConnectionPool` (it asks the sentinels for the primary on each new connection and drops
    a connection that gets `READONLY`) that also moves open connections once a newer failover named
    another primary."""
    target = parse_redis_url(url)
    if isinstance(target, ClusterTarget):
        raise ValueError("a redis+cluster:// URL has no single connection pool: use redis_py_client")
    if isinstance(target, Endpoint):
        return ConnectionPool.from_url(url, **options)
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
        return _SentinelPrimaryRedis(connection_pool=redis_py_pool(url, **options))
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


async def close_redis_py(client: RedisPy) -> None:
    """Close a redis-py client and every connection it opened."""
    await client.aclose()
    if isinstance(client, Redis):
        await client.connection_pool.disconnect()


__all__ = [
    "PRIMARY_RECHECK",
    "SENTINEL_PORT",
    "ClusterTarget",
    "Endpoint",
    "RedisPy",
    "RedisTarget",
    "SentinelPrimaryPool",
    "SentinelPrimaryPubSub",
    "SentinelTarget",
    "close_redis_py",
    "newer_primary",
    "parse_redis_url",
    "pubsub",
    "redis_py_client",
    "redis_py_pool",
]
