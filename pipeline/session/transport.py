"""The HTTP transport under `SessionClient`: httpx's API on aiohttp's connection handling.

httpx's own pool (httpcore) costs several times more CPU per request than aiohttp's; measured here
(`bench/session_bench.py`-style GET loop, client and server in one process): 1,433 µs vs 318 µs per
request. `httpx-aiohttp` keeps the httpx surface (and `MockTransport` for tests) and sends through
aiohttp. One mapping is tightened: a connection that drops after the request was written is an
unknown outcome (the server may have acted), never "not sent", so a send is looked up before it is
repeated (P3).
"""

from __future__ import annotations

import ssl

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport


class SessionTransport(AiohttpTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
                raise  # never connected: nothing was sent
            raise httpx.RemoteProtocolError(f"connection lost: {cause!r}", request=request) from cause


def session_transport(max_connections: int | None, ssl_context: ssl.SSLContext | None = None) -> SessionTransport:
    """`ssl_context`: share one; building a context costs tens of milliseconds (and stream pools
    are created per shard)."""
    return SessionTransport(
        verify=ssl_context or httpx.create_ssl_context(),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=None),
    )
