"""Connection limits of the worker's web server: requests must arrive whole in time, and the
number of open connections is bounded.

aiohttp reads headers without a deadline of its own (its keep-alive timer is an hour by default),
so a client that sends half a request holds a connection for as long as it likes. Here every
connection gets a deadline when the first byte of a request arrives: headers and body must be in
by then, or the connection is closed. Connections beyond the cap are closed as they are accepted.
Both are counted in `switchboard_web_connections_closed_total`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from pipeline import metrics


class ConnectionLimits:
    """Shared by every connection of the worker's listening socket (aiohttp's and the front's)."""

    def __init__(self, max_connections: int, request_timeout: float) -> None:
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.open = 0

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection in, or close it (and count that) when the cap is reached."""
        if self.open >= self.max_connections:
            metrics.WEB_CONNECTIONS_CLOSED.labels("over_limit").inc()
            transport.close()
            return False
        self.open += 1
        metrics.WEB_CONNECTIONS_OPEN.set(self.open)
        return True

    def release(self) -> None:
        self.open -= 1
        metrics.WEB_CONNECTIONS_OPEN.set(self.open)


class _GuardedHandler(RequestHandler):
    """aiohttp's connection protocol with a per-request deadline and the connection cap."""

    def __init__(self, manager: _GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = manager.limits
        self._admitted = False
        self._deadline: asyncio.TimerHandle | None = None
        self._request: web.BaseRequest | None = None  # in progress, its headers in
        self._data_in_request = False  # bytes arrived while a request was handled (pipelining)

    # -- asyncio protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._limits.admit(transport):
            return
        self._admitted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._limits.release()
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._request is not None:
            self._data_in_request = True
        elif self._deadline is None and data:
            self._arm()
        super().data_received(data)

    # -- requests ----------------------------------------------------------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        """Its headers are in; the body must still arrive before the deadline."""
        if self._deadline is None:  # a pipelined request whose bytes came in during the last one
            self._arm()
        self._request = request
        self._data_in_request = False

    def request_finished(self) -> None:
        self._request = None
        self._disarm()
        if self._data_in_request:  # the next request has begun: its deadline runs from now
            self._arm()

    def _arm(self) -> None:
        self._deadline = self._loop.call_later(self._limits.request_timeout, self._on_deadline)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _on_deadline(self) -> None:
        self._deadline = None
        request = self._request
        if request is None:
            reason = "header_timeout"
        elif request.content.is_eof():
            return  # the whole request is in: the handler may take as long as it needs
        else:
            reason = "body_timeout"
        metrics.WEB_CONNECTIONS_CLOSED.labels(reason).inc()
        if self.transport is not None:
            self.transport.close()


class _GuardedServer(web.Server):
    """aiohttp's low-level server, making guarded connections and telling them of requests."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        handle = self.request_handler

        async def tracked(request: web.BaseRequest) -> web.StreamResponse:
            protocol = request.protocol
            if isinstance(protocol, _GuardedHandler):
                protocol.request_started(request)
            try:
                return await handle(request)
            finally:
                if isinstance(protocol, _GuardedHandler):
                    protocol.request_finished()

        self.request_handler = tracked

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """`web.AppRunner` whose server applies the request deadline and the connection cap."""

    def __init__(self, app: web.Application, *, max_connections: int, request_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._limits = ConnectionLimits(max_connections, request_timeout)

    @property
    def limits(self) -> ConnectionLimits:
        return self._limits

    @property
    def open_connections(self) -> int:
        return self._limits.open

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        # The same server aiohttp built for the app (handler, request factory, settings), with
        # guarded connections.
        return _GuardedServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            limits=self._limits,
            **plain._kwargs,
        )
