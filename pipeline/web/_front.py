"""The webhook front: plain webhook requests answered without aiohttp's per-request machinery.

A filtered group message costs the worker about 0.1 ms in the pipeline, and aiohttp's request
handling (parser callbacks, request and response objects, a task per request) costs it about as
much again on top. Platforms send webhooks as plain, small HTTP/1.1 requests, so the worker's
listening socket is served by this protocol first: it answers the requests it fully understands
(`POST`/`GET /webhooks/<platform>/<bot>`, HTTP/1.1, one `Content-Length`, well-formed header lines)
itself, with one task per connection, and hands the connection to aiohttp at the first request it
does not take, from that request's first byte, for good. Everything unusual (chunked bodies,
`Expect`, upgrades, HTTP/1.0, percent-encoded paths, oversized heads or bodies, the console, the
probes, `/metrics`) is therefore parsed and answered by aiohttp exactly as before; the front never
guesses where a request ends, so the two can never disagree about it.

The same limits apply on both: the connection cap (shared), the per-request deadline from a
request's first byte, and the keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy
from yarl import URL

from pipeline import metrics

from ._guard import GuardedAppRunner

log = logging.getLogger(__name__)

# A request head longer than this is aiohttp's to answer (it refuses heads over 8,190 bytes a line).
MAX_HEAD_BYTES = 8 * 1024
_PATH = re.compile(rb"/webhooks/([A-Za-z0-9_.~-]+)/([A-Za-z0-9_.~-]+)")
_QUERY = re.compile(rb"[!$&'()*+,\-./0-9:;=?@A-Z_a-z~%]*")
# The bytes a header name may hold (RFC 9110 token), and a head's bytes besides CR LF (a field
# value's visible bytes, obs-text, space and tab): checked with `bytes.translate`, in C.
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_HEAD_BYTES = bytes([9, 13, 10, *range(0x20, 0x7F), *range(0x80, 0x100)])
# Header fields that change how the request is framed or what the connection becomes: aiohttp's.
_HANDED_FIELDS = frozenset({b"transfer-encoding", b"upgrade", b"expect", b"te", b"http2-settings"})
_EMPTY_QUERY: MultiDictProxy[str] = MultiDictProxy(MultiDict())


@dataclass(frozen=True)
class FrontRequest:
    platform: str
    bot_id: str
    method: str
    headers: CIMultiDictProxy[str]
    query: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Reply:
    """What a webhook is answered, through the front or through aiohttp's route."""

    status: int
    body: bytes
    content_type: str = "application/json; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, value: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
        return cls(status, json.dumps(value).encode(), headers=headers or {})

    def response(self) -> web.Response:
        headers = {**self.headers, "Content-Type": self.content_type}
        return web.Response(body=self.body, status=self.status, headers=headers)


Answer = Callable[[FrontRequest], Awaitable[Reply]]


class _Handoff:
    """The next request is aiohttp's: the connection is handed over from its first byte."""


_HANDOFF = _Handoff()


def _parse(buffer: bytearray, max_body: int) -> FrontRequest | _Handoff | None:
    """The next request from `buffer` (consumed), aiohttp's turn, or None when more bytes are needed."""
    end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
    if end < 0:
        return _HANDOFF if len(buffer) > MAX_HEAD_BYTES else None
    head = bytes(buffer[:end])
    lines = head.split(b"\r\n")
    # Only visible bytes, spaces and tabs, and every CR and LF a line's end: else aiohttp's.
    if head.translate(None, _HEAD_BYTES) or head.count(b"\r") != len(lines) - 1 or head.count(b"\n") != len(lines) - 1:
        return _HANDOFF
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1" or parts[0] not in (b"POST", b"GET"):
        return _HANDOFF
    path, _, query = parts[1].partition(b"?")
    target = _PATH.fullmatch(path)
    if target is None or _QUERY.fullmatch(query) is None:
        return _HANDOFF
    fields: list[tuple[str, str]] = []
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name.translate(None, _TOKEN_BYTES):
            return _HANDOFF  # no colon, an empty name, space before the colon, a folded line
        value = value.strip(b" \t")
        lowered = name.lower()
        if lowered == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 9:
                return _HANDOFF
            length = int(value)
        elif lowered in _HANDED_FIELDS or (lowered == b"connection" and b"upgrade" in value.lower()):
            return _HANDOFF
        fields.append((name.decode("ascii"), value.decode("utf-8", "surrogateescape")))
    if length is None:
        if parts[0] == b"POST":
            return _HANDOFF  # a POST without a length is aiohttp's to refuse or read
        length = 0
    if length > max_body:
        return _HANDOFF  # aiohttp answers 413 the way the route always has
    if len(buffer) < end + 4 + length:
        return None
    body = bytes(buffer[end + 4 : end + 4 + length])
    del buffer[: end + 4 + length]
    return FrontRequest(
        platform=target.group(1).decode("ascii"),
        bot_id=target.group(2).decode("ascii"),
        method=parts[0].decode("ascii"),
        headers=CIMultiDictProxy(CIMultiDict(fields)),
        # Decoded exactly as aiohttp decodes a request's query.
        query=URL.build(query_string=query.decode("ascii"), encoded=True).query if query else _EMPTY_QUERY,
        body=body,
    )


_REPLY_CACHE: dict[tuple[int, bytes, str, bool], bytes] = {}


def _reply_bytes(reply: Reply, close: bool) -> bytes:
    """The reply on the wire; the few small replies a platform gets over and over are kept."""
    if reply.headers or len(reply.body) > 256:
        return _encode_reply(reply, close)
    key = (reply.status, reply.body, reply.content_type, close)
    cached = _REPLY_CACHE.get(key)
    if cached is None:
        if len(_REPLY_CACHE) >= 256:
            _REPLY_CACHE.clear()
        cached = _REPLY_CACHE[key] = _encode_reply(reply, close)
    return cached


def _encode_reply(reply: Reply, close: bool) -> bytes:
    head = [
        f"HTTP/1.1 {reply.status} {_reason(reply.status)}",
        f"Content-Type: {reply.content_type}",
        f"Content-Length: {len(reply.body)}",
    ]
    for name, value in reply.headers.items():
        if "\r" in value or "\n" in value:
            raise ValueError(f"reply header {name} holds a line break")
        head.append(f"{name}: {value}")
    if close:
        head.append("Connection: close")
    return "\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + reply.body


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class WebhookFront:
    """What the front's connections share: the answer, aiohttp's server to hand over to, limits."""

    def __init__(
        self,
        runner: GuardedAppRunner,
        answer: Answer,
        *,
        max_body: int,
        keepalive_timeout: float,
        shutdown_timeout: float,
    ) -> None:
        self.runner = runner
        self.answer = answer
        self.max_body = max_body
        self.keepalive_timeout = keepalive_timeout
        self.shutdown_timeout = shutdown_timeout
        self.connections: set[_FrontConnection] = set()
        self.closing = False
        self._sweeping: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeping = asyncio.get_running_loop().create_task(self._sweep(), name="web:front-deadlines")

    async def _sweep(self) -> None:
        """Close the connections past their deadline. One check for all of them, a few times a
        second, rather than a timer armed and cancelled around every request."""
        loop = asyncio.get_running_loop()
        interval = min(1.0, self.runner.limits.request_timeout / 4, self.keepalive_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for connection in [c for c in self.connections if c.deadline <= now]:
                connection.on_deadline()

    def __call__(self) -> asyncio.Protocol:
        return _FrontConnection(self)

    def aiohttp_protocol(self) -> asyncio.Protocol:
        server = self.runner.server
        assert server is not None, "the runner is set up before the site starts"
        return server()

    async def close(self) -> None:
        """Let requests being answered finish (for a while), then close every connection."""
        self.closing = True  # a connection answering a request closes once its answer is out
        if self._sweeping is not None:
            self._sweeping.cancel()
        busy = [c.serving for c in self.connections if c.serving is not None and c.handling]
        for connection in list(self.connections):
            if not connection.handling:
                connection.close()
        if busy:
            await asyncio.wait(busy, timeout=self.shutdown_timeout)
        for connection in list(self.connections):
            connection.close()
        tasks = [c.serving for c in self.connections if c.serving is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _FrontConnection(asyncio.Protocol):
    def __init__(self, front: WebhookFront) -> None:
        self.front = front
        self.limits = front.runner.limits
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.serving: asyncio.Task[None] | None = None
        self.handling = False
        self._eof = False
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        # When the connection is closed unless something happens first, and what it is counted as
        # then ("": an idle keep-alive connection, not counted).
        self.deadline = math.inf
        self.deadline_reason = ""

    # -- asyncio protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        if not self.limits.admit(transport):
            return
        self.transport = transport
        self.front.connections.add(self)
        self.serving = self._loop.create_task(self._serve(), name="web:front")
        self._set_deadline(self.front.keepalive_timeout, "")

    def data_received(self, data: bytes) -> None:
        if not self.buffer and not self.handling and self.deadline_reason != "header_timeout":
            self._set_deadline(self.limits.request_timeout, "header_timeout")  # a request has begun
        self.buffer += data
        if len(self.buffer) > MAX_HEAD_BYTES + self.front.max_body and self.transport is not None:
            self._paused = True  # a whole request is in: no more until it is taken
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return True  # half-closed: the answers being written still go out

    def connection_lost(self, exc: BaseException | None) -> None:
        self._release()
        self.transport = None
        self._wake()

    # -- serving -----------------------------------------------------------------------------------
    async def _serve(self) -> None:
        while self.transport is not None:
            request = _parse(self.buffer, self.front.max_body)
            if request is None:
                if self._eof:
                    self.close()
                    return
                if self.buffer and self.deadline_reason == "header_timeout" and self.buffer.find(b"\r\n\r\n") >= 0:
                    self.deadline_reason = "body_timeout"  # the head is in; the body is awaited
                self._resume()
                await self._wait()
                continue
            if isinstance(request, _Handoff):
                self._handoff()
                return
            self._clear_deadline()
            close = "close" in request.headers.get("Connection", "").lower() or self.front.closing
            self.handling = True
            try:
                reply = await self.front.answer(request)
            except Exception:
                log.exception("web: the webhook front failed answering a request")
                reply = Reply.json({"error": "internal error"}, status=500)
                close = True
            finally:
                self.handling = False
            if self.transport is None:
                return
            close = close or self.front.closing
            self.transport.write(_reply_bytes(reply, close))
            if close:
                self.close()
                return
            if self.buffer:
                self._set_deadline(self.limits.request_timeout, "header_timeout")  # pipelined: begun
            else:
                self._set_deadline(self.front.keepalive_timeout, "")
            self._resume()

    def _handoff(self) -> None:
        """Give the connection, from the request it does not take, to aiohttp's protocol."""
        transport = self.transport
        assert transport is not None
        data, eof = bytes(self.buffer), self._eof
        self.buffer.clear()
        self._release()
        self.transport = None
        protocol = self.front.aiohttp_protocol()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)
        if eof:
            protocol.eof_received()
        if self._paused:
            self._paused = False
            transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- helpers -----------------------------------------------------------------------------------
    def _release(self) -> None:
        self._clear_deadline()
        if self in self.front.connections:  # admitted, and not released yet
            self.front.connections.discard(self)
            self.limits.release()

    def _resume(self) -> None:
        if self._paused and self.transport is not None and len(self.buffer) <= MAX_HEAD_BYTES + self.front.max_body:
            self._paused = False
            self.transport.resume_reading()

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _set_deadline(self, seconds: float, reason: str) -> None:
        self.deadline = self._loop.time() + seconds
        self.deadline_reason = reason

    def _clear_deadline(self) -> None:
        self.deadline = math.inf
        self.deadline_reason = ""

    def on_deadline(self) -> None:
        if self.deadline_reason:  # a request that did not arrive whole in time; else an idle keep-alive
            metrics.WEB_CONNECTIONS_CLOSED.labels(self.deadline_reason).inc()
        self._clear_deadline()
        self.close()


class WebhookFrontSite(web.BaseSite):
    """A TCP site whose connections meet the webhook front first (aiohttp's site extension point)."""

    def __init__(self, runner: GuardedAppRunner, host: str, port: int, *, front: WebhookFront) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._front = front

    @property
    def name(self) -> str:
        return str(URL.build(scheme="http", host=self._host, port=self._port))

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        # asyncio's default backlog of 100 drops the SYNs of a burst of new connections (a platform
        # opening its pool, clients reconnecting after a restart): each then waits 1 s or more for
        # its retransmit. The queue holds as many as the worker admits (the kernel caps it at
        # net.core.somaxconn).
        self._server = await loop.create_server(
            self._front, self._host, self._port, reuse_address=True, backlog=self._front.runner.limits.max_connections
        )
        self._front.start()

    async def stop(self) -> None:
        await super().stop()  # no new connections
        await self._front.close()
