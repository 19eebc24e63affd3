"""A stand-in for Slack's Socket Mode and Web API, checking requests as Slack does.

- `POST /apps.connections.open` with `Authorization: Bearer <app token>` (an `xapp-` token; anything
  else gets `{"ok": false, "error": "invalid_auth"}` or `not_allowed_token_type`) answers a one-time
  `ws://…/link/?ticket=…` URL; the socket is refused (403) for an unknown or used ticket.
- Each socket gets `hello`; envelopes are built with slack_sdk's `SocketModeRequest`. An
  acknowledgement must be the JSON of slack_sdk's `SocketModeResponse` with the `envelope_id` of an
  envelope sent on that same socket and not acknowledged yet: anything else is kept in `errors`.
- An `events_api` envelope not acknowledged when its socket closes (or within `retry_after`) is sent
  again on an open socket with a new envelope id and `retry_attempt` + 1, as Slack does, at most 3 times.
- `POST /chat.postMessage` is checked with the Web API stand-in's checker (`check_slack`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

from tests.connections.standin_support import ServedSocket, start_app
from tests.connections.standin_support import seen as seen_request
from tests.platforms.conftest import Seen
from tests.platforms.test_slack import check_slack

APP_TOKEN = "xapp-1-A0123456789-0123456789012-0a1b2c3d4e5f6a7b8c9d"


@dataclass
class Socket(ServedSocket):
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)  # envelope id → envelope
    acked: list[str] = field(default_factory=list)
    given_up: set[str] = field(default_factory=set)  # sent again elsewhere


@dataclass
class Envelope:
    envelope_id: str
    socket: int
    message: dict[str, Any]
    sent_at: float
    acked_at: float | None = None


class SlackStandIn:
    def __init__(self, *, app_token: str = APP_TOKEN, retry_after: float = 30.0) -> None:
        self.app_token = app_token
        self.retry_after = retry_after
        self.answer_pings = True  # False: a peer gone silent (WebSocket pings get no pong)
        self.url = ""
        self.opens: list[Seen] = []
        self.sockets: list[Socket] = []
        self.envelopes: dict[str, Envelope] = {}
        self.errors: list[str] = []
        self.posts: list[dict[str, Any]] = []
        self._tickets: set[str] = set()
        self._ids = itertools.count(1)
        self._waiting: list[dict[str, Any]] = []  # envelopes with no socket open to take them
        self._runner: web.AppRunner | None = None
        self._retrier: asyncio.Task[None] | None = None
        self.socket_opened = asyncio.Event()

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/apps.connections.open", self._open)
        app.router.add_get("/link/", self._link)
        app.router.add_post("/chat.postMessage", self._post_message)
        self._runner, self.url = await start_app(app)
        self._retrier = asyncio.create_task(self._retry_unacknowledged())
        return self.url

    async def stop(self) -> None:
        if self._retrier is not None:
            self._retrier.cancel()
        for socket in self.open_sockets():
            await socket.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- Slack's side ------------------------------------------------------------------------------
    async def _open(self, request: web.Request) -> web.Response:
        seen = await seen_request(request)
        self.opens.append(seen)
        authorization = seen.headers.get("authorization", "")
        if not authorization.startswith("Bearer "):
            return web.json_response({"ok": False, "error": "not_authed"})
        token = authorization.removeprefix("Bearer ")
        if not token.startswith("xapp-"):
            return web.json_response({"ok": False, "error": "not_allowed_token_type"})
        if token != self.app_token:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        ws_url = self.url.replace("http://", "ws://") + f"/link/?ticket={ticket}&app_id=A0123456789"
        return web.json_response({"ok": True, "url": ws_url})

    async def _link(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            self.errors.append("a socket dialed with an unknown or used ticket")
            return web.Response(status=403)
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=self.answer_pings)
        await ws.prepare(request)
        socket = Socket(id=next(self._ids), ws=ws, opened=time.monotonic())
        self.sockets.append(socket)
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": len(self.open_sockets()),
                "debug_info": {"host": "applink-standin", "approximate_connection_time": 18060},
                "connection_info": {"app_id": "A0123456789"},
            }
        )
        self.socket_opened.set()
        waiting, self._waiting = self._waiting, []
        for envelope in waiting:
            await self.send_event(envelope["payload"], retry_attempt=envelope["retry_attempt"])
        try:
            async for message in ws:
                if message.type == web.WSMsgType.TEXT:
                    self._acknowledged(socket, message.data)
                elif message.type != web.WSMsgType.PING:  # PING: only when not answering them
                    self.errors.append(f"socket {socket.id}: a {message.type.name} frame")
        finally:
            socket.closed = time.monotonic()
            await self._redeliver_from(socket)
        return ws

    def _acknowledged(self, socket: Socket, text: str) -> None:
        try:
            body = json.loads(text)
            response = SocketModeResponse(envelope_id=body["envelope_id"], payload=body.get("payload"))
        except (ValueError, KeyError, TypeError) as exc:
            self.errors.append(f"socket {socket.id}: not an acknowledgement: {text[:200]} ({exc!r})")
            return
        if response.to_dict() != body:
            self.errors.append(f"socket {socket.id}: fields Slack does not take: {text[:200]}")
        envelope_id = response.envelope_id
        if envelope_id not in socket.sent:
            self.errors.append(f"socket {socket.id}: acknowledged {envelope_id}, not sent on this socket")
            return
        if envelope_id in socket.acked:
            self.errors.append(f"socket {socket.id}: {envelope_id} acknowledged twice")
            return
        socket.acked.append(envelope_id)
        self.envelopes[envelope_id].acked_at = time.monotonic()

    async def _post_message(self, request: web.Request) -> web.Response:
        seen = await seen_request(request)
        try:
            status, answer = check_slack(seen)
        except (AssertionError, KeyError, TypeError) as exc:
            self.errors.append(f"chat.postMessage refused: {exc!r}")
            return web.json_response({"ok": False, "error": "invalid_arguments"})
        if answer.get("ok"):
            self.posts.append(dict(seen.json))
        return web.json_response(answer, status=status)

    # -- what a test makes Slack do ----------------------------------------------------------------
    def waiting(self) -> list[dict[str, Any]]:
        """The envelopes no open socket took, sent on the next one."""
        return list(self._waiting)

    def open_sockets(self) -> list[Socket]:
        return [s for s in self.sockets if s.closed is None and not s.ws.closed]

    async def send_event(self, payload: dict[str, Any], *, retry_attempt: int = 0, socket: Socket | None = None) -> str:
        """An `events_api` envelope on `socket` (default: the newest open one; none open: the event
        waits for the next). Returns its envelope id ("" while it waits)."""
        request = SocketModeRequest(
            type="events_api",
            envelope_id=str(uuid.uuid4()),
            payload=payload,
            accepts_response_payload=False,
            retry_attempt=retry_attempt,
            retry_reason="timeout" if retry_attempt else "",
        )
        retry = {"retry_attempt": retry_attempt, "retry_reason": request.retry_reason}
        return await self.send({**request.to_dict(), "accepts_response_payload": False, **retry}, socket=socket)

    async def send(self, message: dict[str, Any], *, socket: Socket | None = None) -> str:
        open_now = self.open_sockets()
        target = socket or (open_now[-1] if open_now else None)
        if target is None:
            if message.get("type") == "events_api":
                self._waiting.append(message)
            return ""
        envelope_id = str(message.get("envelope_id", ""))
        if envelope_id:
            target.sent[envelope_id] = message
            self.envelopes[envelope_id] = Envelope(envelope_id, target.id, message, time.monotonic())
        try:
            await target.ws.send_json(message)
        except ConnectionError:
            # The peer is gone, and its reader may not have seen it yet: the socket is closed now,
            # so the envelopes sent again go to another socket (or wait for one), as Slack does,
            # not round into this one until their attempts run out.
            if target.closed is None:
                target.closed = time.monotonic()
            await self._redeliver_from(target)
        return envelope_id

    async def disconnect(self, socket: Socket, reason: str) -> None:
        await socket.ws.send_json({"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-standin"}})

    async def _redeliver_from(self, socket: Socket, older_than: float | None = None) -> None:
        now = time.monotonic()
        for envelope_id, message in list(socket.sent.items()):
            if envelope_id in socket.acked or envelope_id in socket.given_up or message.get("type") != "events_api":
                continue
            if older_than is not None and now - self.envelopes[envelope_id].sent_at <= older_than:
                continue
            socket.given_up.add(envelope_id)
            attempt = int(message.get("retry_attempt") or 0) + 1
            if attempt <= 3:
                await self.send_event(message["payload"], retry_attempt=attempt)

    async def _retry_unacknowledged(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            for socket in self.open_sockets():
                await self._redeliver_from(socket, older_than=self.retry_after)

    def acked(self) -> list[str]:
        return [e.envelope_id for e in self.envelopes.values() if e.acked_at is not None]


__all__ = ["APP_TOKEN", "SlackStandIn", "Socket"]
