"""OneBot v11 over WebSocket: forward (Switchboard dials the implementation's WebSocket server) and
reverse (the implementation dials a worker), per the v11 spec's `communication/ws.md`,
`ws-reverse.md` and `authorization.md`.

One socket carries both channels (the universal role, and the forward `/` endpoint), or, reverse
only, one of them (`X-Client-Role: Event` or `API`). Event frames are the HTTP POST reports
unsigned: they go through `OneBotPlatform.parse`. Actions are `{"action", "params", "echo"}`; the
response carries the same `echo` and has the HTTP API's body shape (`retcode` 1400 to 1404 where HTTP
would give a status). Meta events are handled here and never produced: `heartbeat` proves the
connection alive (and tells how often the next should come), `lifecycle` is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

import aiohttp
from aiohttp import web
from redis.exceptions import RedisError

from pipeline import metrics
from pipeline.platforms._common import same_secret
from pipeline.platforms.onebot import DEFAULT_WS_URL, response_outcome
from pipeline.settings import BotConfig
from pipeline.state import ConnectionStore
from pipeline.state.exceptions import StateError

from .base import API, EVENT, ActionAnswer, Connection, DialContext, Link, Transport
from .exceptions import ConnectionsError, Refused

log = logging.getLogger(__name__)

# WebSocket pings (RFC 6455) every this many seconds; no pong within half of it closes the socket:
# a peer that vanished without closing (power loss, a cut path) is noticed in seconds.
PING_SECONDS = 10.0
MAX_FRAME_BYTES = 4 * 1024 * 1024
# Without a heartbeat frame for this many of its announced intervals, the socket is taken for dead.
_MISSED_HEARTBEATS = 3

ROLES: dict[str, frozenset[str]] = {
    "universal": frozenset({EVENT, API}),
    "event": frozenset({EVENT}),
    "api": frozenset({API}),
}


class _Closed(ConnectionsError):
    """The socket closed before the action's response came."""


class OneBotSocket(Connection):
    """One OneBot WebSocket, either side's (aiohttp's client and server sockets share the calls)."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse | web.WebSocketResponse,
        *,
        transport: str,
        channels: frozenset[str],
        bot: BotConfig,
    ) -> None:
        self.ws = ws
        self.transport = transport
        self.channels = channels
        self.bot = bot
        self._responses: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._send_lock = asyncio.Lock()
        self._heartbeat_seconds: float | None = None

    async def run(self, link: Link) -> None:
        try:
            while True:
                timeout = self._heartbeat_seconds * _MISSED_HEARTBEATS if self._heartbeat_seconds else None
                try:
                    message = await self.ws.receive(timeout=timeout)
                except TimeoutError:
                    log.warning(
                        "%s/%s: no heartbeat for %.0f s; closing the socket",
                        self.bot.platform,
                        self.bot.bot_id,
                        timeout,
                    )
                    return
                if message.type == aiohttp.WSMsgType.TEXT:
                    await self._frame(message.data, link)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    metrics.CONNECTION_FRAMES.labels(self.bot.platform, "binary_frame").inc()
                elif message.type == aiohttp.WSMsgType.ERROR:
                    raise message.data
                elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                    return
        finally:
            for future in self._responses.values():
                if not future.done():
                    future.set_exception(_Closed())

    async def _frame(self, text: str, link: Link) -> None:
        try:
            frame = json.loads(text)
        except ValueError:
            frame = None  # the parser counts and dead-letters it
        if isinstance(frame, dict) and "post_type" not in frame and "echo" in frame:
            self._response(frame)
            return
        if isinstance(frame, dict) and frame.get("post_type") == "meta_event":
            self._meta(frame, link)
            return
        if EVENT not in self.channels:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "event_on_api_socket").inc()
            return
        await link.submit(text.encode())

    def _response(self, frame: dict[str, Any]) -> None:
        echo = frame.pop("echo")
        future = self._responses.get(echo) if isinstance(echo, str) else None
        if future is None or future.done():
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "unmatched_response").inc()
            return
        future.set_result(frame)

    def _meta(self, frame: dict[str, Any], link: Link) -> None:
        kind = frame.get("meta_event_type")
        if kind == "heartbeat":
            interval = frame.get("interval")
            if isinstance(interval, int | float) and not isinstance(interval, bool) and interval > 0:
                self._heartbeat_seconds = max(1.0, interval / 1000)
            link.alive()
            return
        metrics.CONNECTION_FRAMES.labels(self.bot.platform, "meta").inc()
        if kind == "lifecycle":
            log.info("%s/%s: lifecycle %s", self.bot.platform, self.bot.bot_id, str(frame.get("sub_type"))[:20])

    async def call(self, action: str, params: Mapping[str, Any], timeout: float) -> ActionAnswer:
        if API not in self.channels:
            return ActionAnswer(error="no_api", detail="this socket carries events only")
        echo = uuid.uuid4().hex
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._responses[echo] = future
        try:
            frame = json.dumps({"action": action, "params": params, "echo": echo}, ensure_ascii=False)
            try:
                async with self._send_lock:
                    await self.ws.send_str(frame)
            except Exception as exc:  # closing or closed: nothing was written, it may be sent again
                return ActionAnswer(error="not_connected", detail=type(exc).__name__)
            # Written: without a response nobody knows whether QQ posted it, so it is final (a repeat
            # gets this answer instead of posting it twice).
            try:
                async with asyncio.timeout(timeout):
                    response = await future
            except TimeoutError:
                detail = f"{action}: no response within {timeout:.0f} s"
                return ActionAnswer(error="outcome_unknown", detail=detail, final=True)
            except _Closed:
                detail = f"{action}: the socket closed before the response"
                return ActionAnswer(error="outcome_unknown", detail=detail, final=True)
        finally:
            self._responses.pop(echo, None)
        # The implementation answered: unless it asks for a retry, a repeat must not run it again.
        return ActionAnswer(response=response, final=response_outcome(response).status != "retry")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()


class OneBotForward(Transport):
    """Switchboard dials the implementation's WebSocket server (NapCat `websocketServers`), at its
    universal endpoint, with the access token as a bearer token (never in the URL, which proxies log)."""

    platform: ClassVar[str] = "onebot"
    name: ClassVar[str] = "ws-forward"
    dialed: ClassVar[bool] = True

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        headers = {}
        token = bot.secret("access_token")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if bot.self_id:
            headers["X-Self-ID"] = bot.self_id
        ws = await context.http.ws_connect(
            bot.api_base or DEFAULT_WS_URL, headers=headers, heartbeat=PING_SECONDS, max_msg_size=MAX_FRAME_BYTES
        )
        return OneBotSocket(ws, transport=self.name, channels=ROLES["universal"], bot=bot)


class OneBotReverse(Transport):
    """The implementation dials a worker (NapCat `websocketClients`): `GET /onebot/ws/{bot_id}`,
    or `/onebot/ws/{bot_id}/event` and `/api` for the split roles (see `pipeline.web.connections`)."""

    platform: ClassVar[str] = "onebot"
    name: ClassVar[str] = "ws-reverse"
    dialed: ClassVar[bool] = False


def reverse_handshake(
    bot: BotConfig, headers: Mapping[str, str], query: Mapping[str, str], path_role: str | None
) -> frozenset[str]:
    """The channels an incoming reverse connection carries, or `Refused`: the access token as
    `Authorization: Bearer …` or `?access_token=…` (401 `missing_token` when neither is given,
    `bad_token` when it differs), the role of `X-Client-Role` agreeing with
    the path (400), `X-Self-ID` naming the bot's own QQ number when one is configured (403).
    `headers` have lower-case names."""
    expected = bot.secret("access_token") or ""
    given = ""
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        given = authorization[7:].strip()
    elif "access_token" in query:
        given = query["access_token"]
    # Compared as bytes: a header value with non-ASCII characters is a 401, never an exception.
    if not same_secret(given, expected):
        # Told apart because they have different fixes: an implementation sending no token at all
        # lacks the `token` setting; one sending the wrong token has a stale or mistyped one.
        raise Refused(401, "bad_token" if given else "missing_token")
    header_role = headers.get("x-client-role", "").strip().lower() or None
    if header_role is not None and header_role not in ROLES:
        raise Refused(400, "bad_role")
    if path_role is not None and header_role is not None and header_role != path_role:
        raise Refused(400, "bad_role")
    role = path_role or header_role or "universal"
    self_id = headers.get("x-self-id", "").strip()
    if bot.self_id and self_id and self_id != bot.self_id:
        raise Refused(403, "self_id_mismatch")
    return ROLES[role]


async def reverse_admission(store: ConnectionStore, bot: BotConfig, channels: frozenset[str], peer: str | None) -> None:
    """Before an authenticated reverse socket takes the bot's lease: the newest socket wins, but a
    replacement is logged (WARNING, the peer's address, never the token) and counted, and a socket
    of one role (`/event` or `/api`) never replaces a universal one, which would leave the bot with
    half a connection (an `/event` socket taking over: no replies can be sent). Refused: 409."""
    universal = sorted(ROLES["universal"])
    try:
        held = await store.holders([(bot.platform, bot.bot_id, channel) for channel in universal])
    except (RedisError, StateError, OSError):
        return  # the lease itself is refused then (`Connections.accept` closes the socket)
    holders = dict(zip(universal, held, strict=True))
    if not any(holders[channel] is not None for channel in channels):
        return
    api, event = holders[API], holders[EVENT]
    held_universal = api is not None and event is not None and api.owner == event.owner
    role = "+".join(sorted(channels))
    if held_universal and channels != ROLES["universal"]:
        metrics.CONNECTION_REPLACEMENTS.labels(bot.platform, bot.bot_id, "refused_partial").inc()
        log.warning(
            "%s/%s: reverse WebSocket of the %s role only, from %s, refused: a universal one holds the bot",
            bot.platform,
            bot.bot_id,
            role,
            peer or "an unknown peer",
        )
        raise Refused(409, "would_replace_universal")
    metrics.CONNECTION_REPLACEMENTS.labels(bot.platform, bot.bot_id, "replaced").inc()
    log.warning(
        "%s/%s: a reverse WebSocket (%s) from %s replaces the one holding the bot (the newest wins)",
        bot.platform,
        bot.bot_id,
        role,
        peer or "an unknown peer",
    )


TRANSPORTS: dict[tuple[str, str], Transport] = {("onebot", t.name): t for t in (OneBotForward(), OneBotReverse())}


__all__ = [
    "TRANSPORTS",
    "OneBotForward",
    "OneBotReverse",
    "OneBotSocket",
    "Refused",
    "reverse_admission",
    "reverse_handshake",
]
