"""DingTalk Stream mode (transport `stream`), dialed by the lease's holder.

The holder asks `POST /v1.0/gateway/connections/open` (api.dingtalk.com, or `api_base`) with the
app's clientId and clientSecret and the one subscription it reads (CALLBACK
`/v1.0/im/bot/messages/get`, the robot's messages) for an `endpoint` and a one-time `ticket`, and
opens the WebSocket `endpoint?ticket=…`. Every frame is JSON with `specVersion`, `type`, `headers`
(`messageId`, `topic`, …) and `data` (a JSON string):
- SYSTEM `ping`: answered at once with its own headers and data; `disconnect`: DingTalk is about to
  close the socket (a redeploy): the holder closes it and dials again with a new ticket.
- CALLBACK of the robot topic: `data` is the message the HTTP callback would carry; it goes through
  the same parser (`DingTalkPlatform.parse`, without the signature: the socket is the app's own) and
  is acknowledged (`code` 200 with the frame's `messageId`) only once the broker has what it
  produced. A frame that could not be produced is not acknowledged: DingTalk sends it again, and
  ingest drops a copy by `msgId`. A malformed message is dead-lettered, then acknowledged.
- Anything else (an EVENT, another topic) is answered 404 and counted, never produced.
The ticket is a credential for one connection: it is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, ClassVar
from urllib.parse import quote_plus

import aiohttp

from pipeline import metrics
from pipeline.platforms._common import base_url
from pipeline.platforms.dingtalk import BOT_MESSAGE_TOPIC, DEFAULT_API_BASE, STREAM_OPEN_PATH
from pipeline.settings import BotConfig

from ._acks import Acknowledgements
from .base import EVENT, Connection, DialContext, FrameOutcome, Link, Transport
from .exceptions import StreamOpenFailed

log = logging.getLogger(__name__)

# WebSocket pings every this many seconds (no pong within half of it closes the socket); DingTalk
# also pings at the protocol level (SYSTEM `ping`).
PING_SECONDS = 10.0
MAX_FRAME_BYTES = 4 * 1024 * 1024
_OPEN_TIMEOUT = 10.0
_ACK_OK = 200
_ACK_UNKNOWN = 404


class DingTalkStream(Connection):
    transport = "stream"
    channels = frozenset({EVENT})

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, bot: BotConfig) -> None:
        self.ws = ws
        self.bot = bot
        self._send_lock = asyncio.Lock()
        self._acks = Acknowledgements()

    async def run(self, link: Link) -> None:
        try:
            while True:
                message = await self.ws.receive()
                if message.type == aiohttp.WSMsgType.TEXT:
                    if await self._frame(message.data, link) == "disconnect":
                        return
                elif message.type == aiohttp.WSMsgType.BINARY:
                    metrics.CONNECTION_FRAMES.labels(self.bot.platform, "binary_frame").inc()
                elif message.type == aiohttp.WSMsgType.ERROR:
                    raise message.data
                elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                    return
        finally:
            # Acknowledgements of frames the broker took before the socket ended are still sent if
            # they can be; the others are redelivered by DingTalk to the next connection.
            await self._acks.settle()

    async def _frame(self, text: str, link: Link) -> str:
        try:
            frame = json.loads(text)
        except ValueError:
            frame = None
        if not isinstance(frame, dict) or not isinstance(frame.get("headers"), dict):
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "malformed_frame").inc()
            return ""
        headers: dict[str, Any] = frame["headers"]
        kind, topic = frame.get("type"), headers.get("topic")
        if kind == "SYSTEM":
            if topic == "ping":
                link.alive()
                echo = frame.get("data")
                await self._answer(_ACK_OK, headers, echo if isinstance(echo, str) else "")
                return ""
            if topic == "disconnect":
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "disconnect").inc()
                log.info("%s/%s: DingTalk asks to reconnect", self.bot.platform, self.bot.bot_id)
                return "disconnect"
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "system").inc()
            return ""
        data = frame.get("data")
        if kind != "CALLBACK" or topic != BOT_MESSAGE_TOPIC or not isinstance(data, str):
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "not_subscribed").inc()
            await self._answer(_ACK_UNKNOWN, headers, json.dumps({"response": None}), message="unknown topic")
            return ""
        acknowledged = await link.submit(data.encode())
        self._acks.after(self._ack_when_durable(acknowledged, headers))
        return ""

    async def _ack_when_durable(self, acknowledged: Any, headers: dict[str, Any]) -> None:
        try:
            outcome: FrameOutcome = await acknowledged
        except Exception:  # not produced (counted by the sink): no ack, DingTalk sends it again
            return
        del outcome
        await self._answer(_ACK_OK, headers, json.dumps({"response": None}))

    async def _answer(self, code: int, headers: dict[str, Any], data: str, message: str = "OK") -> None:
        reply = {
            "code": code,
            "headers": {"contentType": "application/json", "messageId": str(headers.get("messageId", ""))},
            "message": message,
            "data": data,
        }
        with contextlib.suppress(Exception):  # the socket is closing: DingTalk redelivers what is unacked
            async with self._send_lock:
                await self.ws.send_str(json.dumps(reply, ensure_ascii=False))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()


class DingTalkStreamMode(Transport):
    """Switchboard dials DingTalk's Stream gateway (`api_base`, default `https://api.dingtalk.com`)."""

    platform: ClassVar[str] = "dingtalk"
    name: ClassVar[str] = "stream"
    dialed: ClassVar[bool] = True
    channels: ClassVar[frozenset[str]] = frozenset({EVENT})

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        endpoint, ticket = await self._open(bot, context.http)
        separator = "&" if "?" in endpoint else "?"
        try:
            ws = await context.http.ws_connect(
                f"{endpoint}{separator}ticket={quote_plus(ticket)}",
                heartbeat=PING_SECONDS,
                max_msg_size=MAX_FRAME_BYTES,
            )
        except aiohttp.ClientError as exc:
            # aiohttp's errors name the URL, which holds the ticket.
            raise StreamOpenFailed(f"the Stream WebSocket did not open: {type(exc).__name__}") from None
        return DingTalkStream(ws, bot)

    async def _open(self, bot: BotConfig, http: aiohttp.ClientSession) -> tuple[str, str]:
        body = {
            "clientId": bot.secret("client_id") or "",
            "clientSecret": bot.secret("client_secret") or "",
            "subscriptions": [{"type": "CALLBACK", "topic": BOT_MESSAGE_TOPIC}],
            "ua": "switchboard",
        }
        url = base_url(bot, DEFAULT_API_BASE) + STREAM_OPEN_PATH
        async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=_OPEN_TIMEOUT)) as response:
            status, text = response.status, await response.text()
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        answer = answer if isinstance(answer, dict) else {}
        endpoint, ticket = answer.get("endpoint"), answer.get("ticket")
        if status != 200 or not isinstance(endpoint, str) or not isinstance(ticket, str) or not endpoint or not ticket:
            code = str(answer.get("code") or "")[:80]
            message = str(answer.get("message") or "")[:200]
            log.warning(
                "%s/%s: connections/open refused: HTTP %d %s %s", bot.platform, bot.bot_id, status, code, message
            )
            raise StreamOpenFailed(f"connections/open: HTTP {status} {code}")
        if not endpoint.startswith(("wss://", "ws://")):
            raise StreamOpenFailed("connections/open: the endpoint is not a WebSocket URL")
        return endpoint, ticket


TRANSPORTS: dict[tuple[str, str], Transport] = {("dingtalk", "stream"): DingTalkStreamMode()}


__all__ = ["TRANSPORTS", "DingTalkStream", "DingTalkStreamMode", "StreamOpenFailed"]
