"""The stores' Redis client: one connection, commands pipelined automatically, replies parsed in C.

Every command a worker's tasks issue in the same turn of the event loop goes out in one socket
write, and replies come back in order on the same connection (Redis answers a connection's commands
in order). Packing and parsing are hiredis's. Against redis-py's pooled client (a connection taken
and returned per call, Python packing, a retry wrapper and response callbacks per call), a script
call costs 6.8 instead of 133 µs of client CPU at 64 calls in flight, and far fewer system calls
(`bench/redis_client_bench.py`). The connection is single: Redis runs one command at a time anyway.

Failures are redis-py's exception types, so the stages' retry policy is unchanged: the connection
lost or a reply overdue (`socket_timeout`) fails every call waiting on it with `ConnectionError` /
`TimeoutError` (the next call reconnects, with a capped backoff after failed attempts); `-LOADING`
is `BusyLoadingError`, `-NOSCRIPT` `NoScriptError`, other error replies `ResponseError`. A
`-READONLY` reply (the server was demoted to a replica) fails the connection like a loss. No
blocking commands and no pub/sub here.

With a `redis+sentinel://` URL (`pipeline/state/redis_url.py`) every connection starts by asking
the sentinels for the primary (`SENTINEL MASTER`, each sentinel in turn) and checks with `ROLE`
that the server is one; so after a failover the next connection goes to the promoted replica,
without a restart. An open connection is checked too: once a second the sentinels are asked again,
and when they name another server under a newer failover epoch the connection is dropped. Which
sentinel is asked, and what its answer means, is `pipeline/state/sentinel.py`'s `SentinelWatch`,
the same watcher redis-py's pools use (`pipeline/state/redis_py.py`); this client only sends it the
questions, over its own connections.

With a `redis+cluster://` URL the calls go through a router (`pipeline/state/_cluster.py`) to one
such client per primary, each call to the primary of its keys' slot.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
from redis.exceptions import BusyLoadingError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pipeline import metrics
from pipeline.state._cluster import ClusterRouter, slot_of
from pipeline.state.exceptions import StateError
from pipeline.state.redis_url import ClusterTarget, Endpoint, RedisTarget, SentinelTarget, parse_redis_url
from pipeline.state.sentinel import PRIMARY_RECHECK, Named, SentinelWatch, in_good_standing, named_in

log = logging.getLogger(__name__)

Arg = str | bytes | int | float

# Seconds at most between two connection attempts while Redis (or every sentinel) is unreachable.
_CONNECT_BACKOFF_CAP = 0.5


class _ErrorReply(StateError):
    """An error reply as hiredis hands it over (turned into redis-py's types by `_error`)."""


def _error(reply: _ErrorReply) -> Exception:
    message = str(reply)
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    if message.startswith("LOADING"):
        return BusyLoadingError(message)
    return ResponseError(message)


@dataclass(frozen=True)
class Script:
    """A Lua script called by its SHA-1 (loaded once when Redis does not know it)."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


class _Connection(asyncio.Protocol):
    """One connection: a queue of futures answered in order, writes gathered per loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_lost: Any) -> None:
        self._loop = loop
        self._on_lost = on_lost
        self._reader = hiredis.Reader(encoding="utf-8", replyError=_ErrorReply)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        waiting = self._waiting
        while True:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                self.fail(RedisConnectionError(f"Redis protocol error: {exc}"))
                return
            if reply is False:
                return
            if not waiting:  # a reply nobody asked for: the stream is out of step
                self.fail(RedisConnectionError("Redis sent a reply nobody waits for"))
                return
            future = waiting.popleft()
            if isinstance(reply, _ErrorReply) and str(reply).startswith("READONLY"):
                # A replica now (a failover demoted it): this call and every other on the
                # connection fail as a lost connection, and the next one finds the primary.
                log.warning("Redis answered READONLY (a failover?): reconnecting")
                lost = RedisConnectionError("Redis is read-only now (a replica): reconnecting")
                if not future.done():
                    future.set_exception(lost)
                self.fail(lost)
                return
            if not future.done():
                if isinstance(reply, _ErrorReply):
                    future.set_exception(_error(reply))
                else:
                    future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RedisConnectionError(f"connection to Redis lost: {exc!r}" if exc else "Redis closed the connection"))

    def send(self, packed: bytes, replies: int) -> list[asyncio.Future[Any]]:
        """Queue one packed request that gets `replies` replies; written at the end of this turn."""
        if self.closed:
            raise RedisConnectionError("connection to Redis closed")
        futures = [self._loop.create_future() for _ in range(replies)]
        self._waiting.extend(futures)
        self._out.append(packed)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return futures

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or self._transport is None or not self._out:
            return
        data = b"".join(self._out)
        self._out.clear()
        self._transport.write(data)

    @property
    def oldest_waiting(self) -> asyncio.Future[Any] | None:
        return self._waiting[0] if self._waiting else None

    def fail(self, error: Exception) -> None:
        if self.closed:
            return
        self.closed = True
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
        self._out.clear()
        if self._transport is not None:
            self._transport.close()
        self._on_lost(self)


class RedisClient:
    def __init__(
        self,
        url: str | RedisTarget,
        *,
        socket_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "switchboard",
        replica_wait_ms: int = 0,
    ) -> None:
        target = parse_redis_url(url) if isinstance(url, str) else url
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self._ssl = ssl_context or (ssl.create_default_context() if target.tls else None)
        self._name = name
        self.replica_wait_ms = replica_wait_ms
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future[_Connection] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._failed_connects = 0
        self._next_connect = 0.0
        self._sentinel_watch: SentinelWatch[tuple[str, int]] | None = None
        self._cluster: ClusterRouter | None = None
        if isinstance(target, ClusterTarget):
            self._cluster = ClusterRouter(target, self._node_client)
            self.target = target.node(*target.nodes[0])  # never dialled itself
        else:
            self.target = target

    @property
    def target(self) -> Endpoint | SentinelTarget:
        """The server, or the sentinels, the next connection goes through."""
        return self._target

    @target.setter
    def target(self, target: Endpoint | SentinelTarget) -> None:
        self._target = target
        # The sentinels of this target, which the primary is followed through.
        self._sentinel_watch = (
            SentinelWatch(
                target.sentinels,
                self._ask_sentinel,
                master=target.master,
                describe=lambda sentinel: f"{sentinel[0]}:{sentinel[1]}",
                label="Redis",
            )
            if isinstance(target, SentinelTarget)
            else None
        )

    @property
    def cluster(self) -> bool:
        """Whether this is a Redis Cluster's client (the stores then use hash-tagged keys)."""
        return self._cluster is not None

    def slot_of(self, key: str) -> int:
        """The key's hash slot on a cluster (0 on one server): what a batch is split by."""
        return slot_of(key) if self._cluster is not None else 0

    def _node_client(self, endpoint: Endpoint) -> RedisClient:
        return RedisClient(
            endpoint,
            socket_timeout=self.socket_timeout,
            connect_timeout=self.connect_timeout,
            ssl_context=self._ssl,
            name=self._name,
            replica_wait_ms=self.replica_wait_ms,
        )

    # -- calls -----------------------------------------------------------------------------------
    async def execute(self, *args: Arg) -> Any:
        """One command; its reply."""
        if self._cluster is not None:
            return await self._cluster.execute(args)
        metrics.REDIS_ROUND_TRIPS.inc()
        connection = await self._connected()
        (future,) = connection.send(_pack(args), 1)
        return await future

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Several commands in one request; their replies (the first error reply is raised)."""
        if not commands:
            return []
        if self._cluster is not None:
            return await self._cluster.pipeline(commands)
        metrics.REDIS_ROUND_TRIPS.inc()
        connection = await self._connected()
        futures = connection.send(b"".join(_pack(c) for c in commands), len(commands))
        return await _all(futures)

    async def transaction(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """MULTI, the commands, EXEC in one request: EXEC's replies (atomic, in order; on a cluster
        atomic per hash slot)."""
        if self._cluster is not None:
            return await self._cluster.transaction(commands)
        metrics.REDIS_ROUND_TRIPS.inc()
        connection = await self._connected()
        packed = [_pack(("MULTI",))]
        packed += [_pack(c) for c in commands]
        packed.append(_pack(("EXEC",)))
        futures = connection.send(b"".join(packed), len(commands) + 2)
        replies = await _all(futures)
        result = replies[-1]
        if result is None:
            raise ResponseError("transaction aborted")
        for reply in result:
            if isinstance(reply, _ErrorReply):
                raise _error(reply)
        return list(result)

    async def run_script(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """EVALSHA; a script Redis lost (a restart without AOF, SCRIPT FLUSH) is loaded again."""
        if self._cluster is not None:
            return await self._cluster.run_script(script, keys, args)
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.execute("SCRIPT", "LOAD", script.source)
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def replicated(self) -> None:
        """With `replica_wait_ms`: wait until one replica has every write made so far on this
        connection (`WAIT 1 <ms>`), so a failover cannot lose them; counted when none confirmed in
        time (the write stands; it is only less safe)."""
        if self.replica_wait_ms <= 0:
            return
        if self._cluster is not None:
            return await self._cluster.replicated()
        if await self.execute("WAIT", 1, self.replica_wait_ms) < 1:
            metrics.REDIS_UNREPLICATED.inc()

    async def aclose(self) -> None:
        if self._cluster is not None:
            await self._cluster.aclose()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._connection is not None:
            self._connection.fail(RedisConnectionError("client closed"))
            self._connection = None

    # -- connection ------------------------------------------------------------------------------
    async def _connected(self) -> _Connection:
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done():
                self._connecting = None

    async def _connect(self) -> _Connection:
        """A new connection to the server, or to the primary the sentinels name; after a failed
        attempt the next waits a little longer (capped), so a failover is not met with a storm."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self._next_connect - loop.time()))
        try:
            connection = await self._open()
        except (RedisConnectionError, RedisTimeoutError):
            self._failed_connects += 1
            self._next_connect = loop.time() + min(_CONNECT_BACKOFF_CAP, 0.025 * 2**self._failed_connects)
            raise
        self._failed_connects = 0
        self._connection = connection
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch(), name="redis-watchdog")
        return connection

    async def _open(self) -> _Connection:
        target = self.target
        named: Named | None = None
        endpoint = target
        if isinstance(target, SentinelTarget):
            named = await self._primary(target)
            endpoint = target.primary(named[0], named[1])
        assert isinstance(endpoint, Endpoint)
        setup: list[tuple[Arg, ...]] = []
        if endpoint.password is not None:
            auth: tuple[Arg, ...] = ("AUTH", endpoint.password)
            setup.append(("AUTH", endpoint.username, endpoint.password) if endpoint.username else auth)
        if endpoint.db:
            setup.append(("SELECT", endpoint.db))
        setup.append(("CLIENT", "SETNAME", self._name))
        if isinstance(target, SentinelTarget):
            setup.append(("ROLE",))
        connection, replies = await self._dial(endpoint.host, endpoint.port, setup, self._lost)
        if isinstance(target, SentinelTarget) and replies[-1][0] != "master":
            # The sentinels named a server that is not (or no longer) the primary: they have not
            # caught up with a failover yet. The retry asks them again.
            connection.fail(RedisConnectionError("not the primary"))
            raise RedisConnectionError(
                f"Redis at {endpoint.address}, named primary of {target.master} by the sentinels, is a {replies[-1][0]}"
            )
        if named is not None and self._sentinel_watch is not None:
            self._sentinel_watch.named = named
        return connection

    async def _primary(self, target: SentinelTarget) -> Named:
        """The primary's address and the failover epoch that made it so, from the first sentinel
        that knows it (the one that answered last is asked first)."""
        assert self._sentinel_watch is not None  # a sentinel target has one

        def no_primary(problems: list[str]) -> Exception:
            return RedisConnectionError(f"no sentinel named the primary of {target.address}: {'; '.join(problems)}")

        return await self._sentinel_watch.find(no_primary)

    async def _ask_sentinel(self, sentinel: tuple[str, int]) -> Named | None:
        """`SENTINEL MASTER` of this client's master, asked of one sentinel over a connection of
        its own (closed after the answer); None when that sentinel does not think the primary it
        names in good standing (`in_good_standing`)."""
        target = self.target
        assert isinstance(target, SentinelTarget)
        host, port = sentinel
        auth: list[tuple[Arg, ...]] = [("AUTH", target.sentinel_password)] if target.sentinel_password else []
        try:
            connection, replies = await self._dial(
                host, port, [*auth, ("SENTINEL", "MASTER", target.master)], lambda _c: None
            )
        except ResponseError as exc:
            if "no such master" in str(exc).lower():
                raise ResponseError(f"does not know {target.master!r}") from None
            raise
        connection.fail(RedisConnectionError("sentinel asked"))
        state = dict(zip(replies[-1][::2], replies[-1][1::2], strict=True))
        return named_in(state) if in_good_standing(state) else None

    async def _check_primary(self, watch: SentinelWatch[tuple[str, int]]) -> None:
        """Drop the open connection when the watcher finds another primary under a newer epoch."""
        connection = self._connection
        if connection is None or connection.closed:
            return
        named = await watch.newer()
        if named is not None and self._connection is connection:
            connection.fail(RedisConnectionError(f"the sentinels now name {named[0]}:{named[1]} as primary"))

    async def _dial(
        self, host: str, port: int, setup: Sequence[Sequence[Arg]], on_lost: Any
    ) -> tuple[_Connection, list[Any]]:
        """A connection to host:port with the `setup` commands' replies."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop, on_lost),
                    host,
                    port,
                    ssl=self._ssl,
                    server_hostname=host if self._ssl else None,
                )
                try:
                    return connection, await _all(connection.send(b"".join(_pack(c) for c in setup), len(setup)))
                except BaseException:
                    connection.fail(RedisConnectionError("setup failed"))
                    raise
        except TimeoutError as exc:
            raise RedisTimeoutError(f"connecting to Redis at {host}:{port} timed out") from exc
        except OSError as exc:
            raise RedisConnectionError(f"cannot connect to Redis at {host}:{port}: {exc}") from exc

    def _lost(self, connection: _Connection) -> None:
        if self._connection is connection:
            self._connection = None

    async def _watch(self) -> None:
        """A reply overdue by `socket_timeout` means the connection is stuck: fail what waits on it."""
        loop = asyncio.get_running_loop()
        seen: asyncio.Future[Any] | None = None
        since = loop.time()
        interval = min(PRIMARY_RECHECK, self.socket_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            watch = self._sentinel_watch
            if watch is not None and watch.due():
                await self._check_primary(watch)
            connection = self._connection
            oldest = connection.oldest_waiting if connection is not None else None
            if oldest is None or oldest is not seen:
                seen, since = oldest, loop.time()
                continue
            if loop.time() - since >= self.socket_timeout and connection is not None:
                log.warning("no reply from Redis for %.0f s: reconnecting", self.socket_timeout)
                connection.fail(RedisTimeoutError(f"no reply from Redis within {self.socket_timeout} s"))
                seen = None


def _pack(args: Sequence[Arg]) -> bytes:
    # hiredis's stub types its argument as a 1-tuple; it takes any tuple of arguments.
    return hiredis.pack_command(tuple(args))  # type: ignore[arg-type]


async def _all(futures: list[asyncio.Future[Any]]) -> list[Any]:
    """Every future's result; the first failure raised once all are settled (so no reply is left
    unretrieved)."""
    results: list[Any] = []
    error: BaseException | None = None
    for future in futures:
        try:
            results.append(await future)
        except Exception as exc:
            if error is None:
                error = exc
            results.append(None)
    if error is not None:
        raise error
    return results
