"""The worker's listening socket: aiohttp reads every request, a guard around each connection keeps
the deadlines and the cap.

Every byte is parsed by aiohttp's HTTP parser (llhttp, in C); nothing here reads the bytes. Each
connection is aiohttp's own protocol (`web.Server()`) wrapped in a `_Guard`, an asyncio protocol
that passes every event through and keeps the account:

* **Deadline.** A connection must deliver a whole request (head and body) within
  `request_timeout` of the moment it could start one: when it was accepted, or when its previous
  request's handler returned. Whatever it is doing then (silent, kept alive between requests,
  halfway through a head, halfway through a body, a body the handler did not read), it is closed and
  counted in `switchboard_web_connections_closed_total{reason}`: `idle_timeout` (no byte of a
  request), `header_timeout`, `body_timeout`. Idle keep-alive connections therefore live at most
  `min(keepalive_timeout, request_timeout)`: a socket that sends nothing must not hold a slot for
  the keep-alive time. A request whose bytes are all in is never cut: its handler (a console stream,
  a WebSocket) may run as long as it needs. Time the event loop was held up (the check itself came
  late) is not the client's: the deadlines move on by it (`switchboard_web_deadlines_deferred_total`).
* **Cap.** At most `max_connections` connections hold a slot. A connection accepted at the cap
  takes the slot of the connection that has waited longest without a whole request (silent ones
  first, then those halfway through one), which is closed (`evicted`): slots held by clients that
  send nothing cannot keep anyone out. When every slot holds a request being answered (long streams,
  slow handlers), a few connections beyond the cap are still accepted for the probes only
  (`/healthz`, `/readyz`, `/metrics`); any other request on them gets 503 and the connection is
  closed (`over_limit`), as are connections beyond those.
* **Refusals by the parser** (a malformed request line or header, a smuggling shape, an overlong
  line) are answered 400 by aiohttp; aiohttp would log each as an ERROR with a traceback. They are
  counted in `switchboard_web_rejected_total{surface="http", reason="bad_request"}` and logged at
  DEBUG with the error's class only (no request bytes), as hostile input on an open port is routine.

Only public interfaces are used: `web.AppRunner` (its `server` property, `shutdown`),
`web.Server` (its handler, request factory and protocol factory), `web.BaseSite` (`start`/`stop`),
and the asyncio protocol and transport methods.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from aiohttp import web
from aiohttp.http import HttpProcessingError
from yarl import URL

from pipeline import metrics

# Requests a reserved connection may make: the probes, which must get through a full worker.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Connections beyond the cap, while every slot holds a request being answered: probes only.
PROBE_RESERVE = 8
# The longest a deadline check may come late: the sweep runs this often at most.
MAX_SWEEP_SECONDS = 1.0

# What a request meets before the app: a response, or None for the app's routes.
Front = Callable[[web.BaseRequest], Awaitable[web.StreamResponse | None]]


class ConnectionLimits:
    """The cap, the deadline, and the connections holding slots (oldest first)."""

    def __init__(self, max_connections: int, request_timeout: float) -> None:
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        # Insertion-ordered: the order connections were admitted in.
        self.admitted: dict[_Guard, None] = {}
        self.reserved: dict[_Guard, None] = {}

    @property
    def open(self) -> int:
        return len(self.admitted) + len(self.reserved)

    def admit(self, guard: _Guard) -> bool:
        """Give `guard` a slot (taking one from a connection without a whole request when the cap is
        reached), a probe-only place beyond the cap, or nothing (the caller closes it)."""
        if len(self.admitted) >= self.max_connections:
            victim = _victim(self.admitted)
            if victim is not None:
                victim.close_for("evicted")
        if len(self.admitted) < self.max_connections:
            self.admitted[guard] = None
        else:
            if len(self.reserved) >= PROBE_RESERVE:
                victim = _victim(self.reserved)  # a probe's connection, kept alive after its answer
                if victim is not None:
                    victim.close_for("evicted")
            if len(self.reserved) >= PROBE_RESERVE:
                metrics.WEB_CONNECTIONS_CLOSED.labels("over_limit").inc()
                return False
            self.reserved[guard] = None
            guard.probe_only = True
        metrics.WEB_CONNECTIONS_OPEN.set(self.open)
        return True

    def release(self, guard: _Guard) -> None:
        if guard in self.admitted:
            del self.admitted[guard]
        elif guard in self.reserved:
            del self.reserved[guard]
        else:
            return  # released already (evicted, then lost)
        metrics.WEB_CONNECTIONS_OPEN.set(self.open)


def _victim(guards: Iterable[_Guard]) -> _Guard | None:
    """The connection that has waited longest for a request that is not whole, one that sent nothing
    of it first. None when every one holds a request being answered."""
    silent: _Guard | None = None
    receiving: _Guard | None = None
    for guard in guards:  # only at the cap: the scan is the rare path
        if guard.answering():
            continue
        if not guard.started and guard.current is None:
            if silent is None or guard.idle_since < silent.idle_since:
                silent = guard
        elif receiving is None or guard.idle_since < receiving.idle_since:
            receiving = guard
    return silent or receiving


class _Guard(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the deadline and the slot outside."""

    __slots__ = (
        "current",
        "deadline",
        "handling",
        "idle_since",
        "inner",
        "limits",
        "listener",
        "probe_only",
        "started",
        "transport",
    )

    def __init__(self, listener: _Listener) -> None:
        self.listener = listener
        self.limits = listener.limits
        self.inner = listener.server()
        self.transport: asyncio.Transport | None = None
        self.deadline = math.inf
        self.idle_since = 0.0
        # The request being answered, or whose body is still arriving after its handler returned.
        self.current: web.BaseRequest | None = None
        self.handling = False
        self.started = False  # bytes of the next request have arrived
        self.probe_only = False

    # -- asyncio protocol: everything passes through -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.limits.admit(self):
            transport.close()
            return
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self._idle(self.listener.loop.time())
        self.listener.guards.add(self)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        current = self.current
        if current is None or current.content.is_eof():
            self.started = True  # not the current request's body: the next request's bytes
        self.inner.data_received(data)

    def eof_received(self) -> None:
        # aiohttp keeps nothing half-open: returning None lets the transport close after EOF.
        if self.transport is not None:
            self.inner.eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.limits.release(self)
        self.listener.guards.discard(self)
        if self.transport is not None:
            self.transport = None
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- requests ----------------------------------------------------------------------------------
    def begin(self, request: web.BaseRequest) -> None:
        """Its head is in (the handler starts); whole when the body is too."""
        self.current = request
        self.handling = True
        self.started = False
        if request.content.is_eof():
            self.deadline = math.inf

    def end(self, request: web.BaseRequest) -> None:
        """Its handler returned: the next request's time starts now."""
        self.handling = False
        if request.content.is_eof():
            self.current = None
        self._idle(self.listener.loop.time())

    def answering(self) -> bool:
        """A whole request is being answered: the connection is not to be cut."""
        current = self.current
        return self.handling and current is not None and current.content.is_eof()

    def _idle(self, now: float) -> None:
        self.idle_since = now
        self.deadline = now + self.listener.idle_timeout

    def on_deadline(self) -> None:
        current = self.current
        if current is not None and not current.content.is_eof():
            reason = "body_timeout"
        elif self.handling:
            self.deadline = math.inf  # the body completed in time; the handler runs on
            return
        elif self.started:
            reason = "header_timeout"
        else:
            reason = "idle_timeout"
        self.close_for(reason)

    def close_for(self, reason: str) -> None:
        metrics.WEB_CONNECTIONS_CLOSED.labels(reason).inc()
        self.limits.release(self)
        self.deadline = math.inf
        if self.transport is not None:
            self.transport.close()


class _ServerLog(logging.LoggerAdapter):
    """The logger of the guarded server's connections: a request the parser refused is counted and
    logged at DEBUG (its error's class only), not as an ERROR with a traceback; everything else (a
    handler's exception: a bug) is logged as aiohttp logs it."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if self._refused(exc_info):
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        # aiohttp logs a bad method on a connection's first request at DEBUG, with the error.
        if self._refused(kwargs.get("exc_info")):
            return
        super().debug(msg, *args, **kwargs)

    def _refused(self, exc_info: Any) -> bool:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1] if exc_info is True else None
        if not isinstance(exc, HttpProcessingError):
            return False
        metrics.WEB_REJECTED.labels("http", "bad_request").inc()
        self.logger.debug("web: refused a malformed request (%s)", type(exc).__name__)
        return True


class _Listener:
    """One listening socket: aiohttp's server for the app (with `front` before it), its guards and
    the deadline sweep."""

    def __init__(self, runner: GuardedAppRunner, front: Front | None) -> None:
        app_server = runner.server
        assert app_server is not None, "the runner is set up before its sites start"
        self.loop = asyncio.get_running_loop()
        self.limits = runner.limits
        self.idle_timeout = min(runner.keepalive_timeout, runner.limits.request_timeout)
        self.guards: set[_Guard] = set()
        self.closing = False
        app_handler = app_server.request_handler

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            transport = request.transport
            guard = transport.get_protocol() if transport is not None else None
            if not isinstance(guard, _Guard):
                return await app_handler(request)  # the client left already
            guard.begin(request)
            try:
                if guard.probe_only and request.path not in PROBE_PATHS:
                    metrics.WEB_CONNECTIONS_CLOSED.labels("over_limit").inc()
                    response: web.StreamResponse = web.json_response(
                        {"error": "the worker is at its connection limit"}, status=503
                    )
                    response.force_close()
                    return response
                answered = await front(request) if front is not None else None
                response = answered if answered is not None else await app_handler(request)
                if self.closing:
                    response.force_close()  # told so (`Connection: close`) while the worker stops
                return response
            finally:
                guard.end(request)

        self.server = web.Server(
            handle,
            request_factory=app_server.request_factory,  # the app's requests (web.Request)
            handler_cancellation=app_server.handler_cancellation,
            # aiohttp's own idle timer stays behind the guard's, which counts what it closes.
            keepalive_timeout=self.idle_timeout * 2 + 1,
            # Bodies are handed over as sent: no decompression of what a client claims is gzip.
            auto_decompress=False,
            access_log=None,
            logger=_ServerLog(logging.getLogger("pipeline.web.http"), {}),
        )
        self.socket: asyncio.Server | None = None
        self._sweeping: asyncio.Task[None] | None = None

    def __call__(self) -> asyncio.Protocol:
        return _Guard(self)

    async def start(self, host: str, port: int) -> None:
        # asyncio's default backlog of 100 drops the SYNs of a burst of new connections (a platform
        # opening its pool, clients reconnecting after a restart): each then waits 1 s or more for
        # its retransmit. The queue holds as many as the worker admits (the kernel caps it at
        # net.core.somaxconn).
        self.socket = await self.loop.create_server(
            self, host, port, reuse_address=True, backlog=self.limits.max_connections
        )
        self._sweeping = self.loop.create_task(self._sweep(), name="web:deadlines")

    async def _sweep(self) -> None:
        """Close the connections past their deadline: one check for all of them, a few times a
        second, rather than a timer armed and cancelled around every request."""
        interval = min(MAX_SWEEP_SECONDS, self.idle_timeout / 4)
        last = self.loop.time()
        while True:
            await asyncio.sleep(interval)
            now = self.loop.time()
            late, last = now - last - interval, now
            if late > interval:
                # The loop was held up (a long callback, a starved process): what clients sent
                # meanwhile may still be unread, and a request that arrived in time would be cut
                # as silent (reset, with its bytes unread). That time is not theirs: the deadlines
                # move on by it, and the connections are judged once the loop has read its sockets.
                metrics.WEB_DEADLINES_DEFERRED.inc()
                for guard in self.guards:
                    guard.deadline += late
                continue
            for guard in [g for g in self.guards if g.deadline <= now]:
                guard.on_deadline()

    def stop_accepting(self) -> None:
        """No new connections; idle ones are closed now, busy ones once their answer is out."""
        self.closing = True
        if self.socket is not None:
            self.socket.close()
        self.server.pre_shutdown()

    async def shutdown(self, timeout: float) -> None:
        """Let the handlers still running finish (for `timeout` at most), then close everything."""
        await self.server.shutdown(timeout)
        if self._sweeping is not None:
            self._sweeping.cancel()
            await asyncio.gather(self._sweeping, return_exceptions=True)
        for guard in list(self.guards):
            if guard.transport is not None:
                guard.transport.close()

    def addresses(self) -> list[Any]:
        sockets = self.socket.sockets if self.socket is not None else ()
        return [sock.getsockname() for sock in sockets]


class GuardedAppRunner(web.AppRunner):
    """`web.AppRunner` whose sites (`GuardedSite`) serve the app behind the guard."""

    def __init__(
        self,
        app: web.Application,
        *,
        max_connections: int,
        request_timeout: float,
        keepalive_timeout: float = 75.0,
        shutdown_timeout: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, keepalive_timeout=keepalive_timeout, shutdown_timeout=shutdown_timeout, **kwargs)
        self.limits = ConnectionLimits(max_connections, request_timeout)
        self.keepalive_timeout = keepalive_timeout
        self.shutdown_timeout = shutdown_timeout
        self.listeners: list[_Listener] = []

    @property
    def open_connections(self) -> int:
        return self.limits.open

    @property
    def addresses(self) -> list[Any]:
        return [*super().addresses, *(a for listener in self.listeners for a in listener.addresses())]

    async def shutdown(self) -> None:
        """aiohttp's order: the sites have stopped accepting and closed idle connections; the app's
        `on_shutdown` ends long handlers (streams, WebSockets); then the rest get `shutdown_timeout`
        to finish, and are cancelled."""
        await super().shutdown()
        await asyncio.gather(*(listener.shutdown(self.shutdown_timeout) for listener in self.listeners))
        self.listeners.clear()


class GuardedSite(web.BaseSite):
    """A TCP site of a `GuardedAppRunner`: its connections are guarded, and `front` (when given)
    sees each request before the app does."""

    def __init__(self, runner: GuardedAppRunner, host: str, port: int, *, front: Front | None = None) -> None:
        super().__init__(runner)
        self.runner = runner
        self.host = host
        self.port = port
        self.front = front
        self.listener: _Listener | None = None

    @property
    def name(self) -> str:
        return str(URL.build(scheme="http", host=self.host, port=self.port))

    async def start(self) -> None:
        await super().start()
        listener = _Listener(self.runner, self.front)
        await listener.start(self.host, self.port)
        self.runner.listeners.append(listener)
        self.listener = listener

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.stop_accepting()
        await super().stop()
