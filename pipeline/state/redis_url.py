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

Parsing only: the clients are `client.RedisClient` (the stores') and `redis_py` (redis-py's), and
both follow a sentinel URL's primary through failovers with `sentinel.SentinelWatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

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


__all__ = [
    "SENTINEL_PORT",
    "ClusterTarget",
    "Endpoint",
    "RedisTarget",
    "SentinelTarget",
    "parse_redis_url",
]
