"""The load generator's keep-alive HTTP client, against a real aiohttp server (the worker's webhook
server falls back to aiohttp, and the front answers the same way)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from pipeline.bench._http import HttpClientError, KeepAliveClient


class Server:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None, bytes]] = []
        self.peers: set[tuple[str, int]] = set()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, *, keepalive_timeout: float = 75.0) -> None:
        app = web.Application()
        app.router.add_post("/webhooks/console/bot", self.echo)
        app.router.add_post("/close", self.close_after)
        app.router.add_post("/chunked", self.chunked)
        app.router.add_post("/busy", self.busy)
        self.runner = web.AppRunner(app, keepalive_timeout=keepalive_timeout)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def _note(self, request: web.Request, body: bytes) -> None:
        self.requests.append((request.method, request.path_qs, request.headers.get("Content-Type"), body))
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            self.peers.add(tuple(peer[:2]))

    async def echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        self._note(request, body)
        return web.json_response({"ok": True, "n": len(body)})

    async def close_after(self, request: web.Request) -> web.Response:
        self._note(request, await request.read())
        return web.Response(text="bye", headers={"Connection": "close"})

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        self._note(request, await request.read())
        response = web.StreamResponse(status=202)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b"first ", b"second"):
            await response.write(part)
        await response.write_eof()
        return response

    async def busy(self, request: web.Request) -> web.Response:
        self._note(request, await request.read())
        return web.Response(status=503, text="try later")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    await s.start()
    yield s
    await s.stop()


async def test_posts_reuse_keep_alive_connections_and_carry_the_body_and_headers(server: Server) -> None:
    client = KeepAliveClient(limit=4, headers={"Content-Type": "application/json"})
    try:
        statuses = await asyncio.gather(
            *(client.post(f"{server.url}/webhooks/console/bot", b'{"i": %d}' % i) for i in range(40))
        )
    finally:
        await client.close()
    assert statuses == [200] * 40
    assert sorted(body for *_, body in server.requests) == sorted(b'{"i": %d}' % i for i in range(40))
    assert {(method, path, ctype) for method, path, ctype, _ in server.requests} == {
        ("POST", "/webhooks/console/bot", "application/json")
    }
    assert 1 <= len(server.peers) <= 4  # at most `limit` connections, each reused


async def test_status_codes_close_and_chunked_answers_are_read_whole(server: Server) -> None:
    client = KeepAliveClient(limit=1)
    try:
        assert await client.post(f"{server.url}/busy", b"x") == 503
        assert await client.post(f"{server.url}/chunked", b"x") == 202
        assert await client.post(f"{server.url}/close", b"x") == 200  # the server closes this one…
        assert await client.post(f"{server.url}/webhooks/console/bot", b"y") == 200  # …a new one follows
        assert await client.post(f"{server.url}/nowhere", b"z") == 404
    finally:
        await client.close()
    assert len(server.requests) == 4  # the 404 never reached a handler
    assert len(server.peers) == 2  # one connection until the close, then one more


async def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error() -> None:
    server = Server()
    await server.start(keepalive_timeout=0.2)
    client = KeepAliveClient(limit=1)
    try:
        assert await client.post(f"{server.url}/webhooks/console/bot", b"1") == 200
        await asyncio.sleep(0.6)  # the server drops the idle connection
        assert await client.post(f"{server.url}/webhooks/console/bot", b"2") == 200
    finally:
        await client.close()
        await server.stop()
    assert [body for *_, body in server.requests] == [b"1", b"2"]
    assert len(server.peers) == 2


async def test_a_refused_connection_and_a_garbled_answer_raise() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        client = KeepAliveClient()
        with pytest.raises(OSError):
            await client.post(f"http://127.0.0.1:{port}/webhooks/console/bot", b"{}")

    async def garble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        writer.close()

    garbler = await asyncio.start_server(garble, "127.0.0.1", 0)
    port = garbler.sockets[0].getsockname()[1]
    try:
        with pytest.raises(HttpClientError, match="status line"):
            await client.post(f"http://127.0.0.1:{port}/x", b"{}")
        with pytest.raises(ValueError, match="http://"):
            await client.post("https://example.org/x", b"{}")
    finally:
        await client.close()
        garbler.close()
        await garbler.wait_closed()
