"""The load generator's HTTP/1.1 client: keep-alive connections and nothing else.

Why not aiohttp's client: the generator shares two cores with the worker it measures, and
aiohttp's client spends 350 to 650 µs of CPU per webhook on this kind of VM (its request and response
objects, the connector's bookkeeping, a stream reader per response), more than the worker's own
ingress. So a filtered-traffic run measured the generator, not the worker. This client writes
each request as one prepared ``bytes`` and reads the answer with a protocol callback: a status
line, ``Content-Length`` or chunked bodies, keep-alive unless the server says ``close``. One request
at a time per connection (no pipelining), as platforms' webhook senders do.
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit

from pipeline.errors import SwitchboardError


class HttpClientError(SwitchboardError, OSError):
    """The connection failed or the answer was not HTTP/1.1 this client understands."""


class _Connection(asyncio.Protocol):
    def __init__(self, pool: _HostPool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[int] | None = None
        self.closed = False
        self.reused = False  # has answered a request before (the server may have closed it idle)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def request(self, data: bytes) -> asyncio.Future[int]:
        assert self._transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(data)
        return self._waiter

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._waiter is None:
            if self._buffer.strip():
                self._fail(HttpClientError("bytes from the server with no request outstanding"))
            return
        try:
            answer = _parse_response(self._buffer)
        except HttpClientError as exc:
            self._fail(exc)
            return
        if answer is None:
            return  # not whole yet
        status, used, keep_alive = answer
        del self._buffer[:used]
        waiter, self._waiter = self._waiter, None
        if not waiter.done():
            waiter.set_result(status)
        self.reused = True
        if keep_alive and not self._buffer:
            self._pool.release(self)
        else:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(HttpClientError(f"connection closed before the answer: {exc or 'EOF'}"))
        self._waiter = None

    def _fail(self, exc: HttpClientError) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self._waiter = None
        self.close()

    def close(self) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._transport is not None:
            self._transport.close()


def _parse_response(buffer: bytearray) -> tuple[int, int, bool] | None:
    """(status, bytes used, keep-alive) of the whole response at the buffer's start, or None while
    it is incomplete."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise HttpClientError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(rest[:3])
    length: int | None = None
    chunked = False
    keep_alive = version == "HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        value = value.strip()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding":
            chunked = "chunked" in value.lower()
        elif name == "connection":
            keep_alive = "close" not in value.lower() and (keep_alive or "keep-alive" in value.lower())
    body_start = end + 4
    if chunked:
        used = _chunked_end(buffer, body_start)
        return None if used is None else (status, used, keep_alive)
    if length is None:
        if status in (204, 304) or 100 <= status < 200:
            return status, body_start, keep_alive
        raise HttpClientError(f"HTTP {status} without Content-Length or chunked body")
    if len(buffer) < body_start + length:
        return None
    return status, body_start + length, keep_alive


def _chunked_end(buffer: bytearray, at: int) -> int | None:
    """Where a chunked body starting at ``at`` ends (after its trailer), or None if not whole."""
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size_text = bytes(buffer[at:line_end]).split(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpClientError(f"bad chunk size {size_text[:20]!r}") from None
        at = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", at - 2)
            return None if trailer_end < 0 else trailer_end + 4
        if len(buffer) < at + size + 2:
            return None
        at += size + 2


class _HostPool:
    def __init__(self) -> None:
        self.idle: deque[_Connection] = deque()
        self.open: set[_Connection] = set()

    def release(self, connection: _Connection) -> None:
        if not connection.closed:
            self.idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        self.open.discard(connection)
        if connection in self.idle:
            self.idle.remove(connection)


class KeepAliveClient:
    """POSTs over a pool of keep-alive connections per server, at most ``limit`` open in all (a
    request beyond them waits for one to come free)."""

    def __init__(self, *, limit: int = 256, headers: dict[str, str] | None = None) -> None:
        self._limit = asyncio.Semaphore(limit)
        self._pools: dict[tuple[str, int], _HostPool] = {}
        self._head_extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())

    async def post(self, url: str, body: bytes) -> int:
        """POST ``body`` to ``url`` (http only); returns the status. A reused connection the server
        had already closed is replaced once at no cost; anything else raises HttpClientError or
        OSError (a refused connection)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http:// URLs with a host: {url!r}")
        host, port = parts.hostname, parts.port or 80
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        data = (
            f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n{self._head_extra}Content-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = _HostPool()
        async with self._limit:
            while pool.idle:
                connection = pool.idle.popleft()
                if connection.closed:
                    continue
                try:
                    return await _exchange(connection, data)
                except HttpClientError:
                    if not connection.reused:
                        raise
                    # The server closed it while idle; a fresh connection takes the request.
                    break
            loop = asyncio.get_running_loop()
            _, connection = await loop.create_connection(lambda: _Connection(pool), host, port)
            pool.open.add(connection)
            return await _exchange(connection, data)

    async def close(self) -> None:
        for pool in self._pools.values():
            for connection in pool.open | set(pool.idle):
                connection.close()
        self._pools.clear()


async def _exchange(connection: _Connection, data: bytes) -> int:
    try:
        return await connection.request(data)
    except BaseException:
        connection.close()  # a late answer must not meet the next request (a timeout cancels here)
        raise
