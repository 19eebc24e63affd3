"""A stand-in for Lark's long-connection service, checking requests as Lark does.

- `POST /callback/ws/endpoint` with the JSON `{"AppID", "AppSecret"}` of the app answers (in the
  shape lark_oapi's `EndpointResp` reads) a one-time `ws://…/ws?device_id=…&service_id=…&ticket=…`
  URL and a `ClientConfig`; wrong credentials get a non-zero code.
- Frames both ways are lark_oapi's own protobuf `Frame` (`lark_oapi.ws.pb.pbbp2_pb2`): a ping must be a
  control frame with `type: ping` and the URL's `service_id`, and is answered with a pong (carrying
  `pong_config` when set); a data frame sent back must answer an event sent on that socket, once,
  with its `message_id`, a `biz_rt` header and a JSON payload with a `code`. Anything else is kept
  in `errors`.
- An event not answered `200` when its socket closes is pushed again on the next socket (Lark
  retries an event push that got no success answer), with a new `message_id`.
- The Open API for replies: a tenant token from `/open-apis/auth/v3/tenant_access_token/internal`
  (each one issued stays valid: every worker fetches its own), `POST /open-apis/im/v1/messages` and
  `…/messages/{message_id}/reply` (to a message it sent), checked with the Open API stand-in's
  checker (`tests/platforms/test_lark.py`).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from lark_oapi.core.json import JSON
from lark_oapi.ws.model import EndpointResp
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

from tests.connections.standin_support import ServedSocket, start_app
from tests.connections.standin_support import seen as seen_request
from tests.platforms.conftest import FakeApi, Seen
from tests.platforms.test_lark import APP_ID, APP_SECRET
from tests.platforms.test_lark import LarkStandIn as LarkOpenApi

SERVICE_ID = 32417
TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
MESSAGES_PATH = "/open-apis/im/v1/messages"


class _OpenApi(LarkOpenApi):
    """The Open API stand-in's checks, with every token issued valid (one per worker process)."""

    def _auth(self, seen: Seen) -> bool:
        issued = {f"Bearer t-{n}" for n in range(1, self.tokens_issued + 1)}
        return seen.headers.get("authorization") in issued


@dataclass
class Answer:
    message_id: str
    code: int
    frame: Frame
    at: float


@dataclass
class Socket(ServedSocket):
    pings: list[float] = field(default_factory=list)
    sent: dict[str, Frame] = field(default_factory=dict)  # message id → the last part sent
    answers: list[Answer] = field(default_factory=list)
    events: dict[str, dict[str, Any]] = field(default_factory=dict)  # message id → the event


class LarkStandIn:
    def __init__(self, *, client_config: dict[str, int] | None = None) -> None:
        self.client_config = client_config or {
            "ReconnectCount": -1,
            "ReconnectInterval": 1,
            "ReconnectNonce": 0,
            "PingInterval": 120,
        }
        self.pong_config: dict[str, int] | None = None
        self.answer_pings = True  # False: a peer gone silent (WebSocket pings get no pong)
        self.url = ""
        self.endpoint_requests: list[dict[str, Any]] = []
        self.sockets: list[Socket] = []
        self.errors: list[str] = []
        self.pushed_again = 0
        self._tickets: set[str] = set()
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._waiting: list[dict[str, Any]] = []  # events with no socket open to take them
        self.open_api = _OpenApi(FakeApi())
        self.posts: list[dict[str, Any]] = []  # message bodies the Open API posted, with the chat id
        self._chats: dict[str, str] = {}  # message id of an event sent → its chat id

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/callback/ws/endpoint", self._endpoint)
        app.router.add_get("/ws", self._socket)
        app.router.add_post(TOKEN_PATH, self._open_api_call)
        app.router.add_post(MESSAGES_PATH, self._open_api_call)
        app.router.add_post(MESSAGES_PATH + "/{message_id}/reply", self._open_api_call)
        self._runner, self.url = await start_app(app)
        return self.url

    async def stop(self) -> None:
        for socket in self.open_sockets():
            await socket.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def open_sockets(self) -> list[Socket]:
        return [s for s in self.sockets if s.closed is None and not s.ws.closed]

    # -- Lark's side -------------------------------------------------------------------------------
    async def _endpoint(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        self.endpoint_requests.append({"headers": dict(request.headers), "body": body})
        if not isinstance(body, dict) or body.get("AppID") != APP_ID or body.get("AppSecret") != APP_SECRET:
            return web.json_response({"code": 403, "msg": "app id or secret is invalid"})
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        ws_url = (
            self.url.replace("http://", "ws://")
            + f"/ws?device_id=7{ticket[:8]}&access_key={uuid.uuid4().hex}&service_id={SERVICE_ID}&ticket={ticket}"
        )
        answer = {"code": 0, "msg": "success", "data": {"URL": ws_url, "ClientConfig": self.client_config}}
        parsed = JSON.unmarshal(json.dumps(answer), EndpointResp)  # what the SDK would read
        assert parsed.data.URL == ws_url and parsed.data.ClientConfig.PingInterval == self.client_config["PingInterval"]
        return web.json_response(answer)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets or request.query.get("service_id") != str(SERVICE_ID):
            self.errors.append("a socket dialed with an unknown or used ticket")
            return web.Response(status=403, headers={"handshake-status": "403", "handshake-msg": "forbidden"})
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=self.answer_pings)
        await ws.prepare(request)
        socket = Socket(id=next(self._ids), ws=ws, opened=time.monotonic())
        self.sockets.append(socket)
        waiting, self._waiting = self._waiting, []
        for event in waiting:
            await self.send_event(event, socket=socket)
        try:
            async for message in ws:
                if message.type == web.WSMsgType.PING:  # only when not answering them
                    continue
                if message.type != web.WSMsgType.BINARY:
                    self.errors.append(f"socket {socket.id}: a {message.type.name} frame")
                    continue
                await self._frame(socket, message.data)
        finally:
            socket.closed = time.monotonic()
            answered = {a.message_id for a in socket.answers if a.code == 200}
            for message_id, event in list(socket.events.items()):
                if message_id not in answered:
                    self.pushed_again += 1
                    await self.send_event(event)
        return ws

    async def _open_api_call(self, request: web.Request) -> web.Response:
        seen = await seen_request(request)
        checker = self.open_api.token if request.path == TOKEN_PATH else self.open_api.create
        repeats = len(self.open_api.repeated)
        try:
            status, answer = checker(seen)
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            self.errors.append(f"{request.path} refused: {exc!r}")
            return web.json_response({"code": 230001, "msg": "stand-in check failed"}, status=400)
        if len(self.open_api.repeated) > repeats:  # a uuid sent before: Lark posts nothing
            return web.json_response(answer, status=status)
        if request.path != TOKEN_PATH and answer.get("code") == 0:
            replied_to = request.match_info.get("message_id")
            if replied_to is not None and replied_to not in self._chats:
                self.errors.append(f"a reply to {replied_to}, which Lark never sent")
                return web.json_response({"code": 230011, "msg": "message not found"}, status=400)
            chat = self._chats[replied_to] if replied_to is not None else seen.json["receive_id"]
            self.posts.append({**seen.json, "receive_id": chat})
        return web.json_response(answer, status=status)

    async def _frame(self, socket: Socket, data: bytes) -> None:
        frame = Frame()
        try:
            frame.ParseFromString(data)
        except Exception as exc:
            self.errors.append(f"socket {socket.id}: not a Frame: {exc!r}")
            return
        headers = {h.key: h.value for h in frame.headers}
        if frame.method == 0:
            if headers.get("type") != "ping" or frame.service != SERVICE_ID:
                self.errors.append(f"socket {socket.id}: control frame {headers} service {frame.service}")
                return
            socket.pings.append(time.monotonic())
            pong = Frame(SeqID=0, LogID=0, service=SERVICE_ID, method=0)
            header = pong.headers.add()
            header.key, header.value = "type", "pong"
            if self.pong_config is not None:
                pong.payload = json.dumps(self.pong_config).encode()
            await socket.ws.send_bytes(pong.SerializeToString())
            return
        message_id = headers.get("message_id", "")
        sent = socket.sent.get(message_id)
        if sent is None:
            self.errors.append(f"socket {socket.id}: answered {message_id!r}, not sent on this socket")
            return
        if any(a.message_id == message_id for a in socket.answers):
            self.errors.append(f"socket {socket.id}: {message_id} answered twice")
            return
        if "biz_rt" not in headers or headers.get("type") != "event" or frame.SeqID != sent.SeqID:
            self.errors.append(f"socket {socket.id}: the answer is not the event's frame: {headers}")
        try:
            code = int(json.loads(frame.payload)["code"])
        except (ValueError, KeyError, TypeError):
            self.errors.append(f"socket {socket.id}: answer payload {frame.payload[:100]!r}")
            return
        socket.answers.append(Answer(message_id, code, frame, time.monotonic()))

    # -- what a test makes Lark do -----------------------------------------------------------------
    async def send_event(
        self,
        event: dict[str, Any],
        *,
        parts: int = 1,
        order: list[int] | None = None,
        kind: str = "event",
        socket: Socket | None = None,
    ) -> str:
        """`event` as a data frame (split in `parts`, sent in `order`) on the newest open socket."""
        open_now = self.open_sockets()
        target = socket or (open_now[-1] if open_now else None)
        if target is None:
            self._waiting.append(event)
            return ""
        message_id = uuid.uuid4().hex
        if kind == "event":
            target.events[message_id] = event
            message = event.get("event", {}).get("message", {}) if isinstance(event.get("event"), dict) else {}
            if isinstance(message, dict) and "message_id" in message:
                self._chats[message["message_id"]] = message.get("chat_id", "")
        payload = json.dumps(event, ensure_ascii=False).encode()
        size = -(-len(payload) // parts)
        chunks = [payload[i * size : (i + 1) * size] for i in range(parts)]
        seq_id = next(self._seq)
        for seq in order or list(range(parts)):
            frame = Frame(SeqID=seq_id, LogID=seq_id * 10, service=SERVICE_ID, method=1, payload=chunks[seq])
            for key, value in (
                ("type", kind),
                ("message_id", message_id),
                ("sum", str(parts)),
                ("seq", str(seq)),
                ("trace_id", uuid.uuid4().hex[:16]),
            ):
                header = frame.headers.add()
                header.key, header.value = key, value
            target.sent[message_id] = frame
            try:
                await target.ws.send_bytes(frame.SerializeToString())
            except ConnectionError:
                # The socket's peer is gone (a holder SIGKILLed) and its close not yet read: as Lark,
                # the event goes again on the next socket. The socket's reader does that for every
                # event not answered once it sees the close; if it already has, it is done here.
                if kind == "event" and target.closed is not None:
                    self.pushed_again += 1
                    await self.send_event(event)
                break
        return message_id


__all__ = ["SERVICE_ID", "LarkStandIn", "Socket"]
