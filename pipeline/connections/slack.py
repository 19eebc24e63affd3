"""Slack Socket Mode: Switchboard dials Slack instead of taking Events API requests.

`apps.connections.open` (POST, the app-level token `xapp-…` as a bearer token) gives a one-time
`wss://` URL. Slack sends JSON envelopes over it: `hello` when the socket is ready, `events_api`
(its `payload` is the body an Events API request would carry: it goes through `SlackPlatform.parse`,
so an event becomes the same inbound message a webhook makes), `slash_commands` and `interactive`
(the webhook path handles neither: acknowledged, counted, dropped), and `disconnect` (Slack will
close this socket soon: `refresh_requested`, `warning`, `link_disabled`). Every envelope with an
`envelope_id` is acknowledged with `{"envelope_id": …}`; an event only once its messages are on the
broker, so Slack redelivers (the same `event_id`, dropped by ingest) what a dead holder never
acknowledged. Replies stay on the Web API (`chat.postMessage` over HTTP), so a socket carries events
only.

On `disconnect`, a new socket is opened first and the old one is read until Slack closes it (at most
`_RETIRE_SECONDS`): its acknowledgements still go out over it, and nothing it delivers is missed. A
failed open ends the connection; the holder dials again with backoff (`Connections`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable
from typing import ClassVar

import aiohttp

from pipeline import metrics
from pipeline.platforms._common import base_url
from pipeline.platforms.slack import DEFAULT_API_BASE
from pipeline.settings import BotConfig

from ._acks import Acknowledgements
from .base import EVENT, Connection, DialContext, FrameOutcome, Link, Transport
from .exceptions import SocketOpenFailed

log = logging.getLogger(__name__)

PING_SECONDS = 10.0
MAX_FRAME_BYTES = 4 * 1024 * 1024
# A socket Slack asked us to leave is read this long at most after its replacement is up.
_RETIRE_SECONDS = 15.0
_DISCONNECT_REASONS = frozenset({"refresh_requested", "warning", "link_disabled", "socket_mode_disabled"})
_UNHANDLED = frozenset({"slash_commands", "interactive"})


async def open_socket(bot: BotConfig, http: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
    """A new Socket Mode WebSocket of the bot's app. The URL is a credential of its own (it carries
    a ticket): it is never logged."""
    token = bot.secret("app_token") or ""
    url = f"{base_url(bot, DEFAULT_API_BASE)}/apps.connections.open"
    async with http.post(url, headers={"Authorization": f"Bearer {token}"}) as response:
        try:
            body = await response.json(content_type=None)
        except ValueError:
            body = None
    if not isinstance(body, dict) or body.get("ok") is not True:
        error = body.get("error") if isinstance(body, dict) else None
        failure = SocketOpenFailed(f"HTTP {response.status}, {str(error or 'no JSON body')[:60]}")
        log.warning("%s/%s: apps.connections.open refused: %s", bot.platform, bot.bot_id, failure)
        raise failure
    wss = body.get("url")
    if not isinstance(wss, str) or not wss.startswith(("wss://", "ws://")):
        raise SocketOpenFailed("apps.connections.open answered without a WebSocket URL")
    return await http.ws_connect(wss, heartbeat=PING_SECONDS, max_msg_size=MAX_FRAME_BYTES)


class SlackSocket(Connection):
    """One bot's Socket Mode connection: the current socket, and one being retired after a refresh."""

    transport = "socket_mode"
    channels = frozenset({EVENT})

    def __init__(self, bot: BotConfig, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.bot = bot
        self._http = http
        self._ws = ws
        self._sockets: set[aiohttp.ClientWebSocketResponse] = {ws}
        self._acks = Acknowledgements()
        self._closing = False

    async def run(self, link: Link) -> None:
        retiring: set[asyncio.Task[None]] = set()
        try:
            while True:
                refresh = await self._read(self._ws, link)
                if not refresh or self._closing:
                    return
                old = self._ws
                self._ws = await open_socket(self.bot, self._http)  # a failure ends the connection
                self._sockets.add(self._ws)
                metrics.CONNECTION_RECONNECTS.labels(self.bot.platform, self.transport).inc()
                log.info("%s/%s: Socket Mode socket refreshed", self.bot.platform, self.bot.bot_id)
                task = asyncio.create_task(self._retire(old, link))
                retiring.add(task)
                task.add_done_callback(retiring.discard)
        finally:
            for task in list(retiring):
                task.cancel()
            await asyncio.gather(*retiring, return_exceptions=True)

    async def _retire(self, ws: aiohttp.ClientWebSocketResponse, link: Link) -> None:
        """Read what the old socket still delivers until Slack closes it, then close it ourselves."""
        try:
            async with asyncio.timeout(_RETIRE_SECONDS):
                while await self._read(ws, link):  # a second `disconnect` on it changes nothing
                    pass
        except TimeoutError:
            pass
        except Exception as exc:  # its envelopes not acknowledged come again on the new socket
            log.info("%s/%s: the old socket failed: %s", self.bot.platform, self.bot.bot_id, type(exc).__name__)
        await self._acks.settle()
        await ws.close()
        self._sockets.discard(ws)

    async def _read(self, ws: aiohttp.ClientWebSocketResponse, link: Link) -> bool:
        """Handle frames until the socket closes (False) or Slack sends `disconnect` (True)."""
        async for message in ws:
            if self._closing:
                return False
            if message.type == aiohttp.WSMsgType.TEXT:
                if await self._envelope(ws, message.data, link):
                    return True
            elif message.type == aiohttp.WSMsgType.BINARY:
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "binary_frame").inc()
            elif message.type == aiohttp.WSMsgType.ERROR:
                raise message.data
        return False

    async def _envelope(self, ws: aiohttp.ClientWebSocketResponse, text: str, link: Link) -> bool:
        """One envelope; True when it is Slack's `disconnect`."""
        try:
            envelope = json.loads(text)
        except ValueError:
            envelope = None
        if not isinstance(envelope, dict):
            await link.submit(text.encode())  # the parser counts and dead-letters it
            return False
        kind = envelope.get("type")
        envelope_id = envelope.get("envelope_id")
        if kind == "hello":
            link.alive()
            log.info(
                "%s/%s: Socket Mode socket ready (%s open for this app)",
                self.bot.platform,
                self.bot.bot_id,
                envelope.get("num_connections", "?"),
            )
            return False
        if kind == "disconnect":
            reason = envelope.get("reason")
            label = reason if reason in _DISCONNECT_REASONS else "other"
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, f"disconnect_{label}").inc()
            log.info("%s/%s: Slack asks to reconnect (%s)", self.bot.platform, self.bot.bot_id, label)
            return True
        if not isinstance(envelope_id, str) or not envelope_id:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "no_envelope_id").inc()
            return False
        if kind == "events_api":
            payload = envelope.get("payload")
            body = json.dumps(payload, ensure_ascii=False).encode()
            self._acks.after(self._ack_when_durable(await link.submit(body), ws, envelope_id))
            return False
        # The webhook path takes neither slash commands nor interactions: acknowledged (or Slack
        # shows the user an error and retries) and dropped, counted.
        metrics.CONNECTION_FRAMES.labels(self.bot.platform, kind if kind in _UNHANDLED else "unknown_envelope").inc()
        await self._ack(ws, envelope_id)
        return False

    async def _ack_when_durable(
        self, durable: Awaitable[FrameOutcome], ws: aiohttp.ClientWebSocketResponse, envelope_id: str
    ) -> None:
        try:
            await durable
        except Exception:  # not on the broker: no acknowledgement, so Slack sends it again
            return
        await self._ack(ws, envelope_id)

    async def _ack(self, ws: aiohttp.ClientWebSocketResponse, envelope_id: str) -> None:
        try:
            if ws.closed:
                raise ConnectionResetError
            await ws.send_str(json.dumps({"envelope_id": envelope_id}))
        except Exception:  # the socket closed first: Slack redelivers; ingest drops the copy
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "ack_lost").inc()

    async def close(self) -> None:
        """Stop taking envelopes, let acknowledgements of what was read go out, close every socket."""
        self._closing = True
        if any(not ws.closed for ws in self._sockets):  # else no acknowledgement can go out anyway
            await self._acks.settle()
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close()


class SlackSocketMode(Transport):
    platform: ClassVar[str] = "slack"
    name: ClassVar[str] = "socket_mode"
    dialed: ClassVar[bool] = True
    channels: ClassVar[frozenset[str]] = frozenset({EVENT})

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        return SlackSocket(bot, context.http, await open_socket(bot, context.http))


TRANSPORTS: dict[tuple[str, str], Transport] = {("slack", "socket_mode"): SlackSocketMode()}


__all__ = ["TRANSPORTS", "SlackSocket", "SlackSocketMode", "SocketOpenFailed", "open_socket"]
