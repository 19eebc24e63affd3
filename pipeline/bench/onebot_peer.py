"""A stand-in OneBot v11 implementation (what NapCat does on the wire), for the benchmarks and tests.

Both WebSocket directions of the v11 spec (`communication/ws.md`, `ws-reverse.md`,
`authorization.md`):

- forward (`serve`): a WebSocket server whose `/` endpoint (universal), `/event` and `/api` take the
  access token as `Authorization: Bearer …` or `?access_token=…` and answer 401 otherwise; every
  event goes to every connected event socket, as NapCat's server does;
- reverse (`dial`): a client that connects to one of the given worker URLs (round robin over those
  that answer: the load balancer), with `X-Self-ID`, `X-Client-Role` and the bearer token, and
  reconnects after `reconnect_interval` when the socket closes; universal, or two sockets for the
  `Event` and `API` roles.

On each new socket it sends the `lifecycle`/`connect` meta event, then a `heartbeat` every
`heartbeat_interval`. Actions (`{"action", "params", "echo"}`) are answered with the same `echo`,
after `check_action` (which raises on a request the real implementation would refuse: the answer
is then `retcode` 1400). Events queued while no event socket is open wait for the next one, and a
send counts as delivered only when written to an open socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

ActionCheck = Callable[[str, Mapping[str, Any]], None]
# (action, params) → the response body (without `echo`), or None for the default success.
ActionAnswerer = Callable[[str, Mapping[str, Any]], dict[str, Any] | None]


@dataclass
class Action:
    action: str
    params: dict[str, Any]
    socket: int
    at: float  # time.monotonic()
    response: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.response.get("status") in ("ok", "async")


@dataclass
class Socket:
    id: int
    role: str  # universal | event | api
    peer: str  # the worker URL (reverse) or the client's address (forward)
    opened: float
    closed: float | None = None


class OneBotPeer:
    def __init__(
        self,
        *,
        self_id: int = 10001000,
        access_token: str = "",
        heartbeat_interval: float = 5.0,
        reconnect_interval: float = 0.5,
        check_action: ActionCheck | None = None,
    ) -> None:
        self.self_id = self_id
        self.access_token = access_token
        self.heartbeat_interval = heartbeat_interval
        self.reconnect_interval = reconnect_interval
        self.check_action = check_action
        self.answer: ActionAnswerer | None = None
        self.sockets: list[Socket] = []
        self.actions: list[Action] = []
        self.refused: list[str] = []  # forward: handshakes refused, by reason
        self.errors: list[str] = []  # requests the real implementation would refuse
        self.delivered: list[tuple[dict[str, Any], int, float]] = []  # (event, socket id, time)
        self.url = ""
        self._ids = itertools.count(1)
        self._messages = itertools.count(30_001)
        self._open: dict[int, tuple[aiohttp.ClientWebSocketResponse | web.WebSocketResponse, Socket]] = {}
        self._queued: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None
        self._stopping = False

    # -- forward: a WebSocket server Switchboard dials ------------------------------------------
    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application()
        app.router.add_get("/", self._accept)
        app.router.add_get("/{role:event|api}", self._accept)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.url = f"ws://{host}:{self._runner.addresses[0][1]}"
        return self.url

    async def _accept(self, request: web.Request) -> web.StreamResponse:
        authorization = request.headers.get("Authorization", "")
        given = authorization[7:] if authorization.startswith("Bearer ") else request.query.get("access_token", "")
        if self.access_token and not hmac.compare_digest(given, self.access_token):
            self.refused.append("bad_token")
            return web.json_response({"status": "failed", "retcode": 1401}, status=401)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        role = request.match_info.get("role", "universal")
        await self._hold(ws, role, request.remote or "")
        return ws

    # -- reverse: a client that dials the workers -----------------------------------------------
    def dial(self, urls: list[str] | Callable[[], list[str]], *, roles: tuple[str, ...] = ("Universal",)) -> None:
        """Keep one socket per role connected to one of `urls` (tried in turn; a callable is asked
        again before each dial, for a changing set of workers)."""
        self._http = self._http or aiohttp.ClientSession()
        for role in roles:
            self._spawn(self._dial_forever(urls, role))

    async def _dial_forever(self, urls: list[str] | Callable[[], list[str]], role: str) -> None:
        assert self._http is not None
        turn = itertools.count()
        while not self._stopping:
            current = urls() if callable(urls) else urls
            if not current:  # no worker is up: the load balancer has nowhere to send it
                await asyncio.sleep(self.reconnect_interval)
                continue
            url = current[next(turn) % len(current)]
            headers = {"X-Self-ID": str(self.self_id), "X-Client-Role": role}
            if self.access_token:
                headers["Authorization"] = f"Bearer {self.access_token}"
            try:
                ws = await self._http.ws_connect(url, headers=headers, autoping=True)
            except (aiohttp.ClientError, OSError):
                await asyncio.sleep(self.reconnect_interval)
                continue
            await self._hold(ws, role.lower(), url)
            await asyncio.sleep(self.reconnect_interval)

    # -- both directions --------------------------------------------------------------------------
    async def _hold(self, ws: aiohttp.ClientWebSocketResponse | web.WebSocketResponse, role: str, peer: str) -> None:
        socket = Socket(next(self._ids), role, peer, time.monotonic())
        self.sockets.append(socket)
        self._open[socket.id] = (ws, socket)
        heart = asyncio.ensure_future(self._heartbeats(ws))
        try:
            await ws.send_json(self._meta("lifecycle", sub_type="connect"))
            self._changed.set()
            await self._flush()
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await self._request(ws, socket, message.data)
        except (aiohttp.ClientError, ConnectionResetError, RuntimeError):
            pass
        finally:
            heart.cancel()
            socket.closed = time.monotonic()
            self._open.pop(socket.id, None)
            self._changed.set()
            with contextlib.suppress(Exception):
                await ws.close()

    async def _heartbeats(self, ws: aiohttp.ClientWebSocketResponse | web.WebSocketResponse) -> None:
        with contextlib.suppress(Exception):
            while not ws.closed:
                await asyncio.sleep(self.heartbeat_interval)
                await ws.send_json(
                    self._meta(
                        "heartbeat", status={"online": True, "good": True}, interval=int(self.heartbeat_interval * 1000)
                    )
                )

    async def _request(
        self, ws: aiohttp.ClientWebSocketResponse | web.WebSocketResponse, socket: Socket, text: str
    ) -> None:
        frame = json.loads(text)
        echo = frame.get("echo")
        action, params = str(frame.get("action", "")), dict(frame.get("params") or {})
        if socket.role == "event":
            self.errors.append(f"an action on an event socket: {action}")
            return
        record = Action(action, params, socket.id, time.monotonic())
        try:
            if self.check_action is not None:
                self.check_action(action, params)
            answer = self.answer(action, params) if self.answer is not None else None
            response = answer or {"status": "ok", "retcode": 0, "data": {"message_id": next(self._messages)}}
        except Exception as exc:  # a request the real implementation refuses
            self.errors.append(f"{action}: {exc!r} params={json.dumps(params, ensure_ascii=False)[:300]}")
            response = {"status": "failed", "retcode": 1400, "data": None, "message": "stand-in check failed"}
        record.response = response
        self.actions.append(record)
        await ws.send_json({**response, "echo": echo})

    def _meta(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {
            "time": int(time.time()),
            "self_id": self.self_id,
            "post_type": "meta_event",
            "meta_event_type": kind,
            **fields,
        }

    # -- events -------------------------------------------------------------------------------------
    async def send_event(self, event: dict[str, Any]) -> None:
        """Push an event to every open event socket, or keep it for the next one."""
        self._queued.append(event)
        await self._flush()

    async def _flush(self) -> None:
        targets = [(ws, s) for ws, s in list(self._open.values()) if s.role in ("universal", "event")]
        while self._queued and targets:
            event = self._queued.pop(0)
            for ws, socket in targets:
                try:
                    await ws.send_json(event)
                except (aiohttp.ClientError, ConnectionResetError, RuntimeError):
                    continue
                self.delivered.append((event, socket.id, time.monotonic()))

    # -- reading ------------------------------------------------------------------------------------
    def open_sockets(self) -> list[Socket]:
        return [s for _, s in self._open.values()]

    def replies(self) -> list[Action]:
        """Message actions the stand-in accepted."""
        return [a for a in self.actions if a.action in ("send_private_msg", "send_group_msg", "send_msg") and a.ok]

    async def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self._changed.wait()

    # -- lifecycle ----------------------------------------------------------------------------------
    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drop(self) -> None:
        """Close every open socket (the implementation restarting); reverse sockets dial again."""
        for ws, _ in list(self._open.values()):
            with contextlib.suppress(Exception):
                await ws.close()

    async def stop(self) -> None:
        self._stopping = True
        await self.drop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()


__all__ = ["Action", "OneBotPeer", "Socket"]
