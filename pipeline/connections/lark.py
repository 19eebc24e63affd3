"""Lark/Feishu long connection ("长连接"): Switchboard dials Lark's event WebSocket instead of taking
event callbacks, as the official SDK's `lark_oapi.ws.Client` does.

`POST {api_base}/callback/ws/endpoint` with `{"AppID", "AppSecret"}` gives the socket's URL (a
credential of its own: never logged; its `service_id` goes into every ping) and a `ClientConfig`:
how often to ping and how to pace reconnects. Frames are protobuf `Frame`s (`_frame`) in binary
messages. Control frames: our `ping` every `PingInterval` seconds, Lark's `pong` (which may carry a
new `ClientConfig`). Data frames carry headers `type`, `message_id`, `sum`, `seq`, `trace_id`; a
message split in `sum` parts is put together by `message_id` and `seq`. An `event` is the JSON an
event callback carries (unencrypted): it goes through `LarkPlatform.parse`, so it becomes the same
inbound message a webhook makes. Each event is answered by sending its frame back with a `biz_rt`
header and the payload `{"code": 200}` (the acknowledgement), only once its messages are on the
broker; `{"code": 500}` when they could not be produced, so Lark delivers it again (ingest drops a
copy by event id). `card` frames (card callbacks) are counted and not answered, as the SDK does.

When the socket drops, the holder dials again after a random part of `ReconnectNonce` seconds, then
every `ReconnectInterval` seconds, at most `ReconnectCount` times (`-1`: no limit) and never more
than `_RECONNECTS_PER_HOLD` times before it lets `Connections` take over (which backs off, and
after three failed dials lets the lease go so another worker may try).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import aiohttp

from pipeline import metrics
from pipeline.platforms._common import base_url
from pipeline.platforms.lark import DEFAULT_API_BASE
from pipeline.settings import BotConfig

from . import _frame
from ._acks import Acknowledgements
from ._frame import CONTROL, DATA, Frame
from .base import EVENT, Connection, DialContext, FrameOutcome, Link, Transport
from .exceptions import EndpointFailed, FrameError

log = logging.getLogger(__name__)

ENDPOINT_PATH = "/callback/ws/endpoint"
MAX_FRAME_BYTES = 4 * 1024 * 1024
# WebSocket pings (RFC 6455) besides Lark's own ping frames, as the SDK's `websockets` client sends
# them (every 20 s): a path that died silently is noticed in seconds, not at the next ping frame.
PING_SECONDS = 20.0
# Parts of a split message wait this long for the rest (the SDK's cache keeps them 5 s).
_PARTS_SECONDS = 5.0
_PARTS_PENDING = 256
# Reconnects inside one hold; then `Connections` dials (with backoff, and may let the lease go).
_RECONNECTS_PER_HOLD = 3


@dataclass
class ClientConfig:
    """What Lark tells its clients (the SDK's defaults until it does), in seconds."""

    reconnect_count: int = -1
    reconnect_interval: float = 120.0
    reconnect_nonce: float = 30.0
    ping_interval: float = 120.0

    def update(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            return
        for name, key, low in (
            ("reconnect_count", "ReconnectCount", -1),
            ("reconnect_interval", "ReconnectInterval", 0),
            ("reconnect_nonce", "ReconnectNonce", 0),
            ("ping_interval", "PingInterval", 1),
        ):
            value = raw.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= low:
                setattr(self, name, int(value) if name == "reconnect_count" else float(value))


@dataclass(frozen=True)
class _Socket:
    ws: aiohttp.ClientWebSocketResponse
    service_id: int


async def open_socket(bot: BotConfig, http: aiohttp.ClientSession, config: ClientConfig) -> _Socket:
    """Ask the endpoint for a URL (updating `config`) and dial it."""
    body = {"AppID": bot.secret("app_id") or "", "AppSecret": bot.secret("app_secret") or ""}
    url = base_url(bot, DEFAULT_API_BASE) + ENDPOINT_PATH
    async with http.post(url, json=body, headers={"locale": "zh"}) as response:
        try:
            answer = await response.json(content_type=None)
        except ValueError:
            answer = None
    if response.status != 200 or not isinstance(answer, dict) or answer.get("code") != 0:
        code = answer.get("code") if isinstance(answer, dict) else None
        message = answer.get("msg") if isinstance(answer, dict) else None
        failure = EndpointFailed(f"HTTP {response.status}, code {code}: {str(message or '')[:80]}")
        log.warning("%s/%s: the long-connection endpoint refused: %s", bot.platform, bot.bot_id, failure)
        raise failure
    data = answer.get("data") if isinstance(answer.get("data"), dict) else {}
    assert isinstance(data, dict)
    config.update(data.get("ClientConfig"))
    wss = data.get("URL")
    if not isinstance(wss, str) or not wss.startswith(("wss://", "ws://")):
        raise EndpointFailed("the endpoint answered without a WebSocket URL")
    try:
        service_id = int(parse_qs(urlsplit(wss).query)["service_id"][0])
    except (KeyError, ValueError) as exc:
        raise EndpointFailed("the endpoint's URL has no service_id") from exc
    ws = await http.ws_connect(wss, heartbeat=PING_SECONDS, max_msg_size=MAX_FRAME_BYTES)
    return _Socket(ws, service_id)


class LarkSocket(Connection):
    transport = "long_connection"
    channels = frozenset({EVENT})

    def __init__(self, bot: BotConfig, http: aiohttp.ClientSession, socket: _Socket, config: ClientConfig) -> None:
        self.bot = bot
        self._http = http
        self._socket = socket
        self._config = config
        self._parts: dict[str, tuple[float, list[bytes | None]]] = {}
        self._acks = Acknowledgements()
        self._send_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._reconfigured = asyncio.Event()

    async def run(self, link: Link) -> None:
        reconnects = 0
        while True:
            await self._hold_socket(link)
            if self._closed.is_set():
                return
            reconnects += 1
            if reconnects > _RECONNECTS_PER_HOLD or (0 <= self._config.reconnect_count < reconnects):
                return  # `Connections` dials again, with its own backoff
            if reconnects == 1:
                await self._pause(random.uniform(0, self._config.reconnect_nonce))
            else:
                await self._pause(self._config.reconnect_interval)
            if self._closed.is_set():
                return
            metrics.CONNECTION_RECONNECTS.labels(self.bot.platform, self.transport).inc()
            try:
                self._socket = await open_socket(self.bot, self._http, self._config)
            except Exception as exc:
                log.warning("%s/%s: reconnect failed: %s", self.bot.platform, self.bot.bot_id, type(exc).__name__)
                continue
            reconnects = 0
            log.info("%s/%s: long connection made again", self.bot.platform, self.bot.bot_id)

    async def _hold_socket(self, link: Link) -> None:
        pinger = asyncio.create_task(self._ping(self._socket))
        try:
            async for message in self._socket.ws:
                if self._closed.is_set():
                    return
                if message.type == aiohttp.WSMsgType.BINARY:
                    await self._frame(message.data, link)
                elif message.type == aiohttp.WSMsgType.TEXT:
                    metrics.CONNECTION_FRAMES.labels(self.bot.platform, "text_frame").inc()
                elif message.type == aiohttp.WSMsgType.ERROR:
                    log.warning("%s/%s: socket error", self.bot.platform, self.bot.bot_id)
                    return
        finally:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger
            if not self._closed.is_set():  # else `close` lets the answers out first
                with contextlib.suppress(Exception):
                    await self._socket.ws.close()

    async def _ping(self, socket: _Socket) -> None:
        """A ping frame at once and every `PingInterval` (Lark may change it in a pong)."""
        ping = _frame.encode(Frame(service=socket.service_id, method=CONTROL, headers=(("type", "ping"),)))
        while True:
            try:
                await self._send(socket, ping)
            except Exception:
                return  # the reader sees the socket close
            while True:  # a pong with a new `PingInterval` restarts the wait with it
                self._reconfigured.clear()
                try:
                    async with asyncio.timeout(self._config.ping_interval):
                        await self._reconfigured.wait()
                except TimeoutError:
                    break

    async def _frame(self, data: bytes, link: Link) -> None:
        try:
            frame = _frame.decode(data)
        except FrameError as exc:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "malformed_frame").inc()
            log.warning("%s/%s: not a frame: %s", self.bot.platform, self.bot.bot_id, exc)
            return
        kind = frame.header("type")
        if frame.method == CONTROL:
            if kind == "pong":
                link.alive()
                if frame.payload:
                    with contextlib.suppress(ValueError):
                        self._config.update(json.loads(frame.payload))
                        self._reconfigured.set()
            return
        if frame.method != DATA:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "unknown_frame").inc()
            return
        payload = self._whole(frame)
        if payload is None:
            return
        if kind != "event":  # `card`: card callbacks, which the webhook path does not take either
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "card" if kind == "card" else "unknown_frame").inc()
            return
        started = time.monotonic()
        durable = await link.submit(payload)
        self._acks.after(self._answer(self._socket, frame, durable, started))

    def _whole(self, frame: Frame) -> bytes | None:
        """The payload of a message, once all its parts came (None until then)."""
        try:
            total, seq = int(frame.header("sum") or "1"), int(frame.header("seq") or "0")
        except ValueError:
            total, seq = 0, -1
        if total <= 1:
            return frame.payload or b""
        message_id = frame.header("message_id") or ""
        if not 0 <= seq < total or total > 1024 or not message_id:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "malformed_frame").inc()
            return None
        now = time.monotonic()
        for key, (since, _) in list(self._parts.items()):  # parts whose rest never came
            if now - since > _PARTS_SECONDS:
                del self._parts[key]
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "parts_expired").inc()
        if message_id not in self._parts and len(self._parts) >= _PARTS_PENDING:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "parts_overflow").inc()
            return None
        since, parts = self._parts.setdefault(message_id, (now, [None] * total))
        if len(parts) != total:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "malformed_frame").inc()
            return None
        parts[seq] = frame.payload or b""
        if any(part is None for part in parts):
            return None
        del self._parts[message_id]
        return b"".join(part for part in parts if part is not None)

    async def _answer(self, socket: _Socket, frame: Frame, durable: Awaitable[FrameOutcome], started: float) -> None:
        try:
            await durable
            code = 200
        except Exception:  # not on the broker: Lark is told, and delivers it again
            code = 500
        elapsed = str(int((time.monotonic() - started) * 1000))
        answer = frame.answered(json.dumps({"code": code}).encode(), biz_rt=elapsed)
        try:
            await self._send(socket, _frame.encode(answer))
        except Exception:  # the socket closed first: Lark delivers it again; ingest drops the copy
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "ack_lost").inc()

    async def _send(self, socket: _Socket, data: bytes) -> None:
        if socket.ws.closed:
            raise ConnectionResetError("socket closed")
        async with self._send_lock:
            await socket.ws.send_bytes(data)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._closed.wait()

    async def close(self) -> None:
        """Stop taking frames, let the answers of what was read go out, close the socket."""
        self._closed.set()
        if not self._socket.ws.closed:  # else no answer can go out anyway
            await self._acks.settle()
        with contextlib.suppress(Exception):
            await self._socket.ws.close()


class LarkLongConnection(Transport):
    platform: ClassVar[str] = "lark"
    name: ClassVar[str] = "long_connection"
    dialed: ClassVar[bool] = True
    channels: ClassVar[frozenset[str]] = frozenset({EVENT})

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        config = ClientConfig()
        socket = await open_socket(bot, context.http, config)
        return LarkSocket(bot, context.http, socket, config)


TRANSPORTS: dict[tuple[str, str], Transport] = {("lark", "long_connection"): LarkLongConnection()}


__all__ = ["TRANSPORTS", "ClientConfig", "EndpointFailed", "LarkLongConnection", "LarkSocket", "open_socket"]
