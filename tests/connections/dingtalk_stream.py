"""A stand-in of DingTalk's Stream gateway: `POST /v1.0/gateway/connections/open` checks the app's
clientId and clientSecret and the subscription and hands out a one-time ticket; the WebSocket at the
endpoint it names takes only such a ticket. The test pushes frames (robot messages as CALLBACK
frames, SYSTEM ping and disconnect), each read back by the dingtalk-stream SDK's frame models, and
reads the acknowledgements the client sent, checked in the shape the SDK's `AckMessage` gives."""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from dingtalk_stream.frames import CallbackMessage, SystemMessage

from tests.platforms.test_dingtalk import CLIENT_ID, CLIENT_SECRET

TOPIC = "/v1.0/im/bot/messages/get"


@dataclass
class StreamGateway:
    url: str = ""
    opens: list[dict[str, Any]] = field(default_factory=list)
    tickets: dict[str, bool] = field(default_factory=dict)  # ticket -> used
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    acks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refused_sockets: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None

    async def start(
        self, other_paths: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
    ) -> StreamGateway:
        """Serve the gateway; `other_paths` answers every other path (the robot OpenAPI stand-in, so
        that one `api_base` serves both, as api.dingtalk.com does)."""
        app = web.Application()
        app.router.add_post("/v1.0/gateway/connections/open", self._open)
        app.router.add_get("/connect", self._socket)
        if other_paths is not None:
            app.router.add_route("*", "/{tail:.*}", other_paths)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        for ws in list(self.sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _open(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.opens.append(body)
        if body.get("clientId") != CLIENT_ID or body.get("clientSecret") != CLIENT_SECRET:
            return web.json_response(
                {"code": "InvalidAuthentication", "message": "clientId or clientSecret"}, status=401
            )
        if {"type": "CALLBACK", "topic": TOPIC} not in body.get("subscriptions", []):
            self.errors.append(f"subscriptions without the robot topic: {body.get('subscriptions')}")
            return web.json_response({"code": "invalidParameter", "message": "subscriptions"}, status=400)
        ticket = secrets.token_urlsafe(24) + "+/="  # characters that must be escaped in the query
        self.tickets[ticket] = False
        endpoint = self.url.replace("http://", "ws://") + "/connect"
        return web.json_response({"endpoint": endpoint, "ticket": ticket})

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if self.tickets.get(ticket) is not False:  # unknown or used
            self.refused_sockets += 1
            return web.Response(status=401, text="bad ticket")
        self.tickets[ticket] = True
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.append(ws)
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    continue
                ack = json.loads(message.data)
                try:
                    check_ack(ack)
                except AssertionError as exc:
                    self.errors.append(f"ack {ack}: {exc}")
                self.acks.append(ack)
        finally:
            self.sockets.remove(ws)
        return ws

    @property
    def live(self) -> web.WebSocketResponse | None:
        return self.sockets[-1] if self.sockets else None

    async def push(self, frame: dict[str, Any]) -> str:
        ws = self.live
        assert ws is not None, "no connection"
        await ws.send_str(json.dumps(frame, ensure_ascii=False))
        return str(frame["headers"]["messageId"])

    def callback(self, message: dict[str, Any], topic: str = TOPIC) -> dict[str, Any]:
        frame = {
            "specVersion": "1.0",
            "type": "CALLBACK",
            "headers": {
                "appId": "app-1",
                "connectionId": "conn-1",
                "contentType": "application/json",
                "messageId": f"msg-frame-{next(self._ids)}",
                "time": "1700000000000",
                "topic": topic,
            },
            "data": json.dumps(message, ensure_ascii=False),
        }
        parsed = CallbackMessage.from_dict(frame)  # the SDK reads the frame as DingTalk sends it
        assert parsed.headers.topic == topic and parsed.data == message
        return frame

    def system(self, topic: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        frame = {
            "specVersion": "1.0",
            "type": "SYSTEM",
            "headers": {
                "contentType": "application/json",
                "messageId": f"sys-{next(self._ids)}",
                "time": "1700000000000",
                "topic": topic,
            },
            "data": json.dumps(data or {}),
        }
        assert SystemMessage.from_dict(frame).headers.topic == topic
        return frame

    def acks_for(self, message_id: str) -> list[dict[str, Any]]:
        return [a for a in self.acks if a.get("headers", {}).get("messageId") == message_id]

    async def wait_ack(self, message_id: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.acks_for(message_id):
            assert asyncio.get_running_loop().time() < deadline, f"no ack for {message_id}"
            await asyncio.sleep(0.02)
        return self.acks_for(message_id)[0]


def check_ack(ack: dict[str, Any]) -> None:
    """An acknowledgement in the shape the SDK's AckMessage.to_dict gives."""
    assert set(ack) == {"code", "headers", "message", "data"}, ack
    assert isinstance(ack["code"], int) and isinstance(ack["message"], str)
    assert ack["headers"].get("contentType") == "application/json" and ack["headers"].get("messageId")
    assert isinstance(ack["data"], str)
    json.loads(ack["data"])
