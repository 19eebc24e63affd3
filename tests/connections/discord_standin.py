"""A stand-in for Discord's Gateway (and `GET /gateway/bot`), checking the client as Discord does.

- `GET /gateway/bot` needs `Authorization: Bot <token>` (else 401 with Discord's JSON error) and
  answers the WebSocket URL and `session_start_limit`.
- Each socket starts with HELLO (`heartbeat_interval`). IDENTIFY must carry the token (else close
  4004), the intents GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT computed by discord.py's
  `Intents` (else 4013), `properties` and a shard `[i, shards]` (else 4010); it gets READY with a new session and a
  `resume_gateway_url`. RESUME must name a known session and the token; it gets every dispatch
  after its `seq` again, then RESUMED; an unknown session gets INVALID_SESSION `d: false`.
- A heartbeat must carry a sequence number this session has sent (or null); it is ACKed unless
  `ack_heartbeats` is off. A socket closed by the client with 1000/1001 ends its session.
- Events of a session whose socket is gone are kept and sent on its RESUME, as Discord does.
- The REST API's `POST /channels/{id}/messages` (checked by `check_discord`, answered with
  rate-limit headers; one message per `nonce` as `enforce_nonce` asks; a test can script answers
  per channel: a 429 once, a permanent error) and
  `POST /channels/{id}/typing`.
Anything else is kept in `errors` (the tests assert there are none).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import discord
from aiohttp import WSMsgType, web

from tests.connections.standin_support import ServedSocket, start_app
from tests.connections.standin_support import seen as seen_request
from tests.platforms.conftest import Answer, Seen
from tests.platforms.test_discord import BOT_USER, TOKEN, check_discord

EXPECTED_INTENTS = discord.Intents(guild_messages=True, dm_messages=True, message_content=True).value


@dataclass
class Session:
    session_id: str
    events: list[dict[str, Any]] = field(default_factory=list)  # every dispatch sent, in order
    seq: int = 0
    ended: bool = False


@dataclass
class RestCall:
    channel: str
    seen: Seen
    status: int
    answer: Any
    at: float  # time.monotonic()
    created: bool = True  # False: a nonce seen before, answered with the message it created


@dataclass
class Socket(ServedSocket):
    session: Session | None = None
    shard: int = 0  # the shard its IDENTIFY named
    heartbeats: list[int | None] = field(default_factory=list)
    close_code: int | None = None
    closed_by_discord: bool = False


class DiscordGatewayStandIn:
    def __init__(self, *, token: str = TOKEN, heartbeat_ms: int = 500) -> None:
        self.token = token
        self.heartbeat_ms = heartbeat_ms
        self.shards = 1  # what GET /gateway/bot recommends; IDENTIFY must name [i, shards]
        self.ack_heartbeats = True
        self.close_after_identify: int | None = None  # a close code the next IDENTIFY gets (4014: intents)
        self.url = ""
        self.sockets: list[Socket] = []
        self.sessions: dict[str, Session] = {}
        self.identifies: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.gateway_requests: list[str] = []  # the Authorization header of each GET /gateway/bot
        self.errors: list[str] = []
        self.rest_calls: list[RestCall] = []
        self.scripts: dict[str, deque[Answer]] = {}  # channel → answers given before the checker's
        self.sticky: dict[str, Answer] = {}  # channel → the answer every time
        self.nonces: dict[tuple[str, str], Any] = {}  # (channel, nonce) → the message it created
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/gateway/bot", self._gateway_bot)
        app.router.add_get("/gw/", self._socket)
        app.router.add_get("/resume/", self._socket)
        app.router.add_post("/channels/{channel}/messages", self._create_message)
        app.router.add_post("/channels/{channel}/typing", self._typing)
        app.router.add_route("*", "/webhooks/{application}/{token}/messages/@original", self._interaction_reply)
        app.router.add_post("/webhooks/{application}/{token}", self._interaction_reply)
        self._runner, self.url = await start_app(app)

    async def stop(self) -> None:
        for socket in self.sockets:
            await socket.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- what the tests do -----------------------------------------------------------------------
    def open_sockets(self) -> list[Socket]:
        return [s for s in self.sockets if s.closed is None]

    async def send_message(self, d: dict[str, Any]) -> int:
        """A MESSAGE_CREATE on the open socket; its sequence number."""
        return await self.dispatch("MESSAGE_CREATE", d)

    async def send_routed(self, d: dict[str, Any]) -> int:
        """A MESSAGE_CREATE on the socket of the shard Discord routes it to: a guild's on
        `(guild_id >> 22) % shards`, a DM on shard 0."""
        guild = d.get("guild_id")
        shard = (int(guild) >> 22) % self.shards if guild else 0
        socket = next(s for s in reversed(self.open_sockets()) if s.session is not None and s.shard == shard)
        return await self.dispatch("MESSAGE_CREATE", d, socket)

    async def dispatch(self, kind: str, d: dict[str, Any], socket: Socket | None = None) -> int:
        """An event of the latest session, sent on its socket if one is open (else kept for its RESUME)."""
        if socket is None:
            session = list(self.sessions.values())[-1]
            socket = next((s for s in reversed(self.open_sockets()) if s.session is session), None)
        else:
            assert socket.session is not None, "no session on the socket yet"
            session = socket.session
        session.seq += 1
        frame = {"op": 0, "t": kind, "s": session.seq, "d": d}
        session.events.append(frame)
        if socket is not None:
            await socket.ws.send_json(frame)
        return session.seq

    def messages_to(self, channel: str) -> list[RestCall]:
        return [c for c in self.rest_calls if c.channel == channel]

    async def send_op(self, op: int, d: Any = None) -> None:
        await self.open_sockets()[-1].ws.send_json({"op": op, "d": d})

    async def drop(self, code: int = 4000) -> None:
        """Discord closes the open socket (4000: an unknown error, the client should resume)."""
        socket = self.open_sockets()[-1]
        socket.closed_by_discord = True
        await socket.ws.close(code=code)

    # -- Discord's side --------------------------------------------------------------------------
    async def _create_message(self, request: web.Request) -> web.Response:
        channel = request.match_info["channel"]
        seen = await seen_request(request)
        if request.content_type == "multipart/form-data":
            self.errors.append("multipart is not expected in these tests")
        queue = self.scripts.get(channel)
        answer = queue.popleft() if queue else self.sticky.get(channel)
        if answer is None:
            try:
                answer = check_discord(seen)
            except AssertionError as exc:
                self.errors.append(f"{seen.path}: {exc!r} body={seen.body[:300]!r}")
                answer = (400, {"message": "Invalid Form Body", "code": 50035})
        status, body, *rest = answer
        nonce = seen.json.get("nonce") if isinstance(seen.json, dict) else None
        created = True
        if status == 200 and isinstance(nonce, str):  # `enforce_nonce`: one message per nonce
            key = (channel, nonce)
            created = key not in self.nonces
            body = self.nonces.setdefault(key, body)
        self.rest_calls.append(RestCall(channel, seen, status, body, time.monotonic(), created))
        return web.json_response(body, status=status, headers=rest[0] if rest else None)

    async def _interaction_reply(self, request: web.Request) -> web.Response:
        """An interaction's deferred response edited (PATCH @original) or followed up: recorded
        under the channel `interaction:<token>`."""
        seen = await seen_request(request)
        try:
            answer = check_discord(seen)
        except AssertionError as exc:
            self.errors.append(f"{seen.path}: {exc!r} body={seen.body[:300]!r}")
            answer = (400, {"message": "Invalid Form Body", "code": 50035})
        status, body, *_ = answer
        channel = f"interaction:{request.match_info['token']}"
        self.rest_calls.append(RestCall(channel, seen, status, body, time.monotonic()))
        return web.json_response(body, status=status)

    async def _typing(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bot {self.token}":
            return web.json_response({"message": "401: Unauthorized", "code": 0}, status=401)
        return web.Response(status=204)

    async def _gateway_bot(self, request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization", "")
        self.gateway_requests.append(authorization)
        if authorization != f"Bot {self.token}":
            return web.json_response({"message": "401: Unauthorized", "code": 0}, status=401)
        limit = {"total": 1000, "remaining": 999, "reset_after": 14400000, "max_concurrency": 1}
        ws_url = self.url.replace("http://", "ws://") + "/gw"
        return web.json_response({"url": ws_url, "shards": self.shards, "session_start_limit": limit})

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        if request.query.get("v") != "10" or request.query.get("encoding") != "json":
            self.errors.append(f"Gateway dialed without ?v=10&encoding=json: {request.query_string}")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        socket = Socket(id=len(self.sockets), ws=ws, opened=time.monotonic())
        self.sockets.append(socket)
        await ws.send_json({"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}})
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    self.errors.append(f"a frame that is not text: {message.type}")
                    continue
                await self._frame(socket, json.loads(message.data), request.path)
        finally:
            socket.closed = time.monotonic()
            socket.close_code = ws.close_code
            if socket.session is not None and ws.close_code in (1000, 1001) and not socket.closed_by_discord:
                socket.session.ended = True  # the client ended the session: nobody can resume it
        return ws

    async def _frame(self, socket: Socket, frame: dict[str, Any], path: str) -> None:
        op, d = frame.get("op"), frame.get("d")
        if op == 1:
            sent = socket.session.seq if socket.session else 0
            if not (d is None or (isinstance(d, int) and 0 < d <= sent)):
                self.errors.append(f"heartbeat with sequence {d!r}; sent up to {sent}")
            socket.heartbeats.append(d)
            if self.ack_heartbeats:
                await socket.ws.send_json({"op": 11})
        elif op == 2:
            await self._identify(socket, d if isinstance(d, dict) else {})
        elif op == 6:
            await self._resume(socket, d if isinstance(d, dict) else {}, path)
        else:
            self.errors.append(f"unexpected op {op!r}")

    async def _identify(self, socket: Socket, d: dict[str, Any]) -> None:
        self.identifies.append(d)
        if d.get("token") != self.token:
            await socket.ws.close(code=4004, message=b"Authentication failed.")
            return
        if d.get("intents") != EXPECTED_INTENTS:
            self.errors.append(f"intents {d.get('intents')!r}, expected {EXPECTED_INTENTS}")
            await socket.ws.close(code=4013, message=b"Invalid intent(s).")
            return
        shard = d.get("shard")
        if not (
            isinstance(shard, list) and len(shard) == 2 and shard[1] == self.shards and 0 <= shard[0] < self.shards
        ):
            self.errors.append(f"IDENTIFY with shard {shard!r}; this bot has {self.shards}")
            await socket.ws.close(code=4010, message=b"Invalid shard.")
            return
        if set(d.get("properties") or {}) != {"os", "browser", "device"}:
            self.errors.append(f"IDENTIFY without properties: {d!r}")
        socket.shard = shard[0]
        if self.close_after_identify is not None:
            await socket.ws.close(code=self.close_after_identify, message=b"Disallowed intent(s).")
            return
        session = Session(uuid.uuid4().hex)
        self.sessions[session.session_id] = session
        socket.session = session
        ready = {
            "v": 10,
            "user": {"id": BOT_USER, "username": "switchboard", "discriminator": "0", "bot": True, "avatar": None},
            "guilds": [],
            "session_id": session.session_id,
            "resume_gateway_url": self.url.replace("http://", "ws://") + "/resume",
            "shard": [socket.shard, self.shards],
            "application": {"id": BOT_USER, "flags": 0},
        }
        await self.dispatch("READY", ready, socket)

    async def _resume(self, socket: Socket, d: dict[str, Any], path: str) -> None:
        self.resumes.append(d)
        if path != "/resume/":
            self.errors.append("RESUME sent to the Gateway URL instead of resume_gateway_url")
        if d.get("token") != self.token:
            await socket.ws.close(code=4004, message=b"Authentication failed.")
            return
        session = self.sessions.get(str(d.get("session_id")))
        seq = d.get("seq")
        if session is None or session.ended or not isinstance(seq, int | None) or (seq or 0) > session.seq:
            await socket.ws.send_json({"op": 9, "d": False})
            return
        socket.session = session
        for event in session.events:  # what the client has not seen durable, again
            if event["s"] > (seq or 0):
                await socket.ws.send_json(event)
        await self.dispatch("RESUMED", {}, socket)
