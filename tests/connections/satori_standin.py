"""A stand-in for a Satori server (as Koishi's `server-satori` behaves), its frames and responses
built with the official SDK's models (`satori-python-core`).

- `GET /v1/events` (WebSocket): the client must speak first with IDENTIFY (op 3) carrying the
  server's token (else the socket is closed with 3000, as Koishi does) and optionally the `sn` to
  resume after, which must be one this server gave (else an error is kept). READY (op 4) lists the
  server's logins (`Ready.dump()`); after it, every event of every login (op 0, with `sn`), to
  every identified socket; PING (op 1) is answered PONG (op 2). Every event is kept, and an
  IDENTIFY with `sn` is sent those after it first, as a server's resume buffer does. Any other op
  is kept in `errors`.
- `POST /v1/message.create`: checked by `check_satori` (the bearer token, the login headers, the
  body, the content through the SDK's parser) and answered with the created `MessageObject`s. A
  test can script answers per channel.
- `GET /v1/proxy/{url}`: a resource of the server (`internal:…`, or a URL under one of the
  `proxy_urls` it announces), as Koishi's server serves them: with the bearer token only (401
  without), a URL of neither kind 403, an unknown one 404. Tests add resources with `resource()`.
Anything else is kept in `errors` (the tests assert there are none).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from satori import Login
from satori.model import LoginPartial, Opcode, Ready

from tests.connections.standin_support import ServedSocket, start_app
from tests.connections.standin_support import seen as seen_request
from tests.platforms.conftest import Answer, Seen
from tests.platforms.test_satori import TOKEN, check_satori, login


@dataclass
class Socket(ServedSocket):
    identified: bool = False
    identify: dict[str, Any] = field(default_factory=dict)
    pings: int = 0
    close_code: int | None = None
    replayed: int = 0  # events sent again on IDENTIFY (those after its `sn`)


@dataclass
class Created:
    channel: str
    seen: Seen
    status: int
    at: float  # time.monotonic()


class SatoriStandIn:
    def __init__(self, *, token: str = TOKEN, logins: list[Login] | None = None) -> None:
        self.token = token
        self.logins = logins if logins is not None else [login()]
        self.url = ""
        self.sockets: list[Socket] = []
        self.events: list[dict[str, Any]] = []  # every event sent, in order (the resume buffer)
        self.identifies: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.created: list[Created] = []
        self.scripts: dict[str, deque[Answer]] = {}  # channel → answers given before the checker's
        self._sn = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.proxy_urls: list[str] = ["https://cdn.discordapp.com/"]
        self.resources: dict[str, tuple[bytes, str]] = {}  # internal: or proxied URL → bytes, MIME type
        self.proxied: list[str] = []  # resources served (with the token)
        self.proxy_refused: list[str] = []  # proxy requests refused for want of the token

    def resource(self, url: str, data: bytes, mime: str) -> str:
        """`url` (an `internal:` URL or one under `proxy_urls`) served by the proxy; the URL."""
        self.resources[url] = (data, mime)
        return url

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/proxy/{url:.+}", self._proxy)
        app.router.add_get("/v1/events", self._socket)
        app.router.add_post("/v1/{method}", self._api)
        self._runner, self.url = await start_app(app)

    async def stop(self) -> None:
        for socket in self.sockets:
            await socket.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- what the tests do -----------------------------------------------------------------------
    def open_sockets(self) -> list[Socket]:
        return [s for s in self.sockets if s.closed is None and s.identified]

    async def send_event(self, event: dict[str, Any]) -> int:
        """An event (an `Event.dump()`) with the next `sn`, to every identified socket; kept."""
        sn = next(self._sn)
        event = dict(event, sn=sn)
        self.events.append(event)
        for socket in self.open_sockets():
            try:
                await socket.ws.send_json({"op": Opcode.EVENT.value, "body": event})
            except ConnectionError:
                # The peer is gone (a holder SIGKILLed) and its reader has not seen it yet. The
                # event is kept: a client that identifies with an older `sn` gets it, as from Satori.
                socket.closed = socket.closed or time.monotonic()
        return sn

    def ready_logins(self) -> list[LoginPartial]:
        return [
            LoginPartial(sn=x.sn, status=x.status, adapter=x.adapter, platform=x.platform, user=x.user)
            for x in self.logins
        ]

    def messages_to(self, channel: str) -> list[Created]:
        return [c for c in self.created if c.channel == channel]

    async def drop(self) -> None:
        for socket in self.open_sockets():
            await socket.ws.close()

    # -- the server's side -----------------------------------------------------------------------
    async def _api(self, request: web.Request) -> web.Response:
        seen = await seen_request(request)
        if request.match_info["method"] != "message.create":
            self.errors.append(f"an API this bridge does not call: {seen.path}")
            return web.Response(status=404)
        channel = seen.json.get("channel_id") if isinstance(seen.json, dict) else None
        queue = self.scripts.get(str(channel))
        answer = queue.popleft() if queue else None
        if answer is None:
            try:
                answer = check_satori(seen)
            except AssertionError as exc:
                self.errors.append(f"{seen.path}: {exc!r} body={seen.body[:300]!r}")
                answer = (400, "Bad Request")
        status, body, *_ = answer
        self.created.append(Created(str(channel), seen, status, time.monotonic()))
        if isinstance(body, str):
            return web.Response(status=status, text=body)
        return web.json_response(body, status=status)

    async def _proxy(self, request: web.Request) -> web.Response:
        url = request.match_info["url"]
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.proxy_refused.append(url)
            return web.Response(status=401, text="invalid token")
        if not url.startswith("internal:") and not any(url.startswith(p) for p in self.proxy_urls):
            return web.Response(status=403, text="forbidden")
        found = self.resources.get(url)
        if found is None:
            return web.Response(status=404, text="not found")
        self.proxied.append(url)
        return web.Response(body=found[0], content_type=found[1])

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        socket = Socket(id=len(self.sockets), ws=ws, opened=time.monotonic())
        self.sockets.append(socket)
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    self.errors.append(f"a frame that is not text: {message.type}")
                    continue
                await self._frame(socket, json.loads(message.data))
        finally:
            socket.closed = time.monotonic()
            socket.close_code = ws.close_code
        return ws

    async def _frame(self, socket: Socket, frame: dict[str, Any]) -> None:
        op, body = frame.get("op"), frame.get("body")
        if op == Opcode.PING:
            if not socket.identified:
                self.errors.append("PING before IDENTIFY")
            socket.pings += 1
            await socket.ws.send_json({"op": Opcode.PONG.value, "body": {}})
        elif op == Opcode.IDENTIFY:
            await self._identify(socket, body if isinstance(body, dict) else {})
        else:
            self.errors.append(f"unexpected op {op!r}")

    async def _identify(self, socket: Socket, body: dict[str, Any]) -> None:
        self.identifies.append(body)
        if socket.identified:
            self.errors.append("a second IDENTIFY on one socket")
        if body.get("token") != self.token:
            await socket.ws.close(code=3000, message=b"invalid token")
            return
        sn = body.get("sn")
        if sn is not None and not (isinstance(sn, int) and 0 < sn <= len(self.events)):
            self.errors.append(f"IDENTIFY with sn {sn!r}; this server gave up to {len(self.events)}")
        socket.identify = body
        await socket.ws.send_json(
            {"op": Opcode.READY.value, "body": Ready(self.ready_logins(), list(self.proxy_urls)).dump()}
        )
        if isinstance(sn, int):
            for event in self.events:  # the events after the client's last, again
                if event["sn"] > sn:
                    await socket.ws.send_json({"op": Opcode.EVENT.value, "body": event})
                    socket.replayed += 1
        socket.identified = True
