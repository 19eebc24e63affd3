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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedSSLConnection

SENTINEL_PORT = 26379
_SERVER_SCHEMES = {"redis": False, "rediss": True}
_SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
_CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
_SCHEMES = "redis://, rediss://, redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://"


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


def redis_py_pool(url: str, **options: Any) -> ConnectionPool:
    """A redis-py (asyncio) connection pool for `url` with the given pool/connection options: the
    URL's server, or, for a sentinel URL, redis-py's `SentinelConnectionPool`, which asks the
    sentinels for the primary on each new connection and drops a connection that gets `READONLY`."""
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
    return SentinelConnectionPool(target.master, sentinel, **server_options, **options)


# A redis-py (asyncio) client: of one server (or Sentinel's primary), or of a cluster.
RedisPy = Redis | RedisCluster


def redis_py_client(url: str, **options: Any) -> RedisPy:
    """A redis-py (asyncio) client for `url` with the given pool/connection options: over
    `redis_py_pool`, or for a cluster URL redis-py's `RedisCluster` (it routes each command to its
    slot's primary and follows failovers; its pub/sub is plain pub/sub, which a cluster delivers
    from any node to subscribers on every node)."""
    target = parse_redis_url(url)
    if not isinstance(target, ClusterTarget):
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
    published on any node to subscribers on every node."""
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
    "SENTINEL_PORT",
    "ClusterTarget",
    "Endpoint",
    "RedisPy",
    "RedisTarget",
    "SentinelTarget",
    "close_redis_py",
    "parse_redis_url",
    "pubsub",
    "redis_py_client",
    "redis_py_pool",
]
