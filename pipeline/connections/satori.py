"""Satori's event WebSocket (transport `websocket`), dialed by the lease's holder.

`{api_base}/v1/events` (http → ws). The client speaks first: IDENTIFY (op 3) with the token and,
when Redis holds one, the `sn` of the last event a holder made durable: the server sends again the
events after it that it still has. The server answers READY (op 4) with its logins; an entry whose
login (`credentials.platform`, `self_id`) is not among them is logged as an error (a typo, or the
login is offline: its events would never come). Then EVENT (op 0) frames, each with its `sn`; a
`message-created` event of this entry's login goes through `SatoriPlatform.parse` (`Link.submit`),
the rest are counted. META (op 5) frames (logins changed, proxy URLs) are counted.

PING (op 1) every `PING_SECONDS`; each is answered PONG (op 2). No frame at all for
`_SILENT_PINGS` pings means a dead path: the socket is closed and dialed again.

Satori has no acknowledgements: what makes the stream durable is the `sn` the next IDENTIFY resumes
after. It is committed to Redis under the lease (a stale holder cannot move it) only once the broker
has every message up to it, so a holder that dies mid-traffic leaves the last durable `sn`, and the
next holder, on this worker or another, is sent everything after it again; ingest drops the copies
by message id. How far back a server can resume is its own limit (Koishi keeps a buffer of recent
events); what it no longer has is not replayed. Actions (replies) go over the HTTP API from any
worker (`SatoriPlatform.send`), not over this socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable
from typing import Any, ClassVar

import aiohttp

from pipeline import metrics
from pipeline.platforms._common import base_url
from pipeline.platforms.satori import API_VERSION, DEFAULT_API_BASE
from pipeline.settings import BotConfig

from .base import EVENT, Connection, DialContext, FrameOutcome, Link, Transport
from .exceptions import ConnectionsError

log = logging.getLogger(__name__)

EVENT_OP, PING, PONG, IDENTIFY, READY, META = 0, 1, 2, 3, 4, 5
PING_SECONDS = 10.0
MAX_FRAME_BYTES = 16 * 1024 * 1024
_READY_TIMEOUT = 10.0
_SILENT_PINGS = 3
_COMMIT_GRACE = 5.0
_REFUSED_SECONDS = 30.0


class IdentifyRefused(ConnectionsError):
    """The server closed the socket instead of answering IDENTIFY with READY (a wrong token)."""


def events_url(bot: BotConfig) -> str:
    base = base_url(bot, DEFAULT_API_BASE)
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return base + API_VERSION + "/events"


class SatoriSocket(Connection):
    transport = "websocket"
    channels = frozenset({EVENT})

    def __init__(self, bot: BotConfig, ws: aiohttp.ClientWebSocketResponse, refused: dict[str, float]) -> None:
        self.bot = bot
        self.ws = ws
        self._refused = refused
        self._why = ""
        # `sn`s read, each with the broker's acknowledgement of its messages (if any), committed in
        # order once acknowledged.
        self._pending: deque[tuple[int, Awaitable[FrameOutcome] | None]] = deque()
        self._more = asyncio.Event()
        self._drained = asyncio.Event()
        self._heard = asyncio.Event()  # any frame since the last ping

    async def run(self, link: Link) -> None:
        committer = asyncio.create_task(self._commit(link))
        pinger: asyncio.Task[None] | None = None
        try:
            sn = _resume_sn(await link.resume_state())
            identify: dict[str, Any] = {"token": self.bot.secret("token") or ""}
            if sn is not None:
                identify["sn"] = sn
            await self.ws.send_str(json.dumps({"op": IDENTIFY, "body": identify}))
            await self._ready()
            pinger = asyncio.create_task(self._ping())
            await self._read(link)
        finally:
            if pinger is not None:
                pinger.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await pinger
            await self._finish(committer)
            await self.close()
            if self._why:
                log.info("%s/%s: event socket ended: %s", self.bot.platform, self.bot.bot_id, self._why)

    async def _ready(self) -> None:
        message = await self.ws.receive(timeout=_READY_TIMEOUT)
        if message.type != aiohttp.WSMsgType.TEXT:
            code = self.ws.close_code
            log.error(
                "%s/%s: the Satori server closed the socket (%s) instead of READY: is the token right?",
                self.bot.platform,
                self.bot.bot_id,
                code,
            )
            # Dials of this bot fail at once for a while, so the lease moves on with backoff
            # instead of a tight loop of refused IDENTIFYs.
            self._refused[self.bot.bot_id] = time.monotonic() + _REFUSED_SECONDS
            raise IdentifyRefused(f"no READY (close code {code})")
        frame = json.loads(message.data)
        if not isinstance(frame, dict) or frame.get("op") != READY:
            raise IdentifyRefused("the server did not answer IDENTIFY with READY")
        body = frame.get("body") if isinstance(frame.get("body"), dict) else {}
        assert isinstance(body, dict)
        logins = body.get("logins") if isinstance(body.get("logins"), list) else []
        assert isinstance(logins, list)
        platform = self.bot.secret("platform")
        ours = [
            login
            for login in logins
            if isinstance(login, dict)
            and login.get("platform", platform) == platform
            and str((login.get("user") or {}).get("id", login.get("self_id"))) == self.bot.self_id
        ]
        if not ours:
            log.error(
                "%s/%s: the Satori server has no login %s/%s (it has %d): its messages will not come; "
                "check credentials.platform and self_id",
                self.bot.platform,
                self.bot.bot_id,
                platform,
                self.bot.self_id,
                len(logins),
            )
        log.info("%s/%s: Satori event socket ready", self.bot.platform, self.bot.bot_id)

    async def _read(self, link: Link) -> None:
        while True:
            message = await self.ws.receive()
            self._heard.set()
            if message.type == aiohttp.WSMsgType.TEXT:
                await self._frame(message.data, link)
            elif message.type == aiohttp.WSMsgType.ERROR:
                raise message.data
            elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                self._why = self._why or f"closed by the server ({self.ws.close_code})"
                return
            else:
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "binary_frame").inc()

    async def _frame(self, text: str, link: Link) -> None:
        try:
            frame = json.loads(text)
        except ValueError:
            frame = None
        if not isinstance(frame, dict):
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "malformed_frame").inc()
            return
        op = frame.get("op")
        if op == PONG:
            link.alive()
            return
        if op != EVENT_OP:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "meta").inc()
            return
        body = frame.get("body")
        if not isinstance(body, dict):
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "malformed_frame").inc()
            return
        sn = body.get("sn", body.get("id"))  # `id` before Satori v1.2
        ack: Awaitable[FrameOutcome] | None = None
        if body.get("type") == "message-created":
            ack = await link.submit(json.dumps(body, ensure_ascii=False).encode())
        else:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "not_message").inc()
        if isinstance(sn, int) and not isinstance(sn, bool):
            self._pending.append((sn, ack))
            self._drained.clear()
            self._more.set()

    async def _ping(self) -> None:
        silent = 0
        while True:
            self._heard.clear()
            await self.ws.send_str(json.dumps({"op": PING}))
            await asyncio.sleep(PING_SECONDS)
            silent = 0 if self._heard.is_set() else silent + 1
            if silent >= _SILENT_PINGS:
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "heartbeat_missed").inc()
                self._why = f"nothing heard for {silent} pings"
                await self.close()
                return

    async def _commit(self, link: Link) -> None:
        """Commit the last `sn` whose messages the broker has, in order."""
        committed: int | None = None
        while True:
            await self._more.wait()
            self._more.clear()
            last = committed
            while self._pending:
                sn, ack = self._pending[0]
                if ack is not None:
                    try:
                        await ack
                    except Exception:  # not durable: stop here, the next IDENTIFY resumes before it
                        self._why = "the broker did not take a message"
                        await self.close()
                        return
                self._pending.popleft()
                last = sn
            if last is not None and last != committed:
                if not await link.commit_resume_state(json.dumps({"sn": last})):
                    self._why = "lease lost"
                    await self.close()
                    return
                committed = last
            if not self._pending:
                self._drained.set()

    async def _finish(self, committer: asyncio.Task[None]) -> None:
        """Let the acknowledgements in flight be committed, then stop committing."""
        self._more.set()
        if self._pending:
            drained = asyncio.ensure_future(self._drained.wait())
            await asyncio.wait({drained, committer}, timeout=_COMMIT_GRACE, return_when=asyncio.FIRST_COMPLETED)
            drained.cancel()
        committer.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await committer

    async def close(self) -> None:
        if not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.ws.close()


def _resume_sn(raw: str | None) -> int | None:
    try:
        sn = json.loads(raw or "").get("sn")
    except (ValueError, AttributeError):
        return None
    return sn if isinstance(sn, int) and not isinstance(sn, bool) else None


class SatoriWebSocket(Transport):
    """Switchboard dials the Satori server's event WebSocket."""

    platform: ClassVar[str] = "satori"
    name: ClassVar[str] = "websocket"
    dialed: ClassVar[bool] = True
    channels: ClassVar[frozenset[str]] = frozenset({EVENT})

    def __init__(self) -> None:
        self._refused: dict[str, float] = {}  # bot id → until when dials fail at once

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        if self._refused.get(bot.bot_id, 0.0) > time.monotonic():
            raise IdentifyRefused("the Satori server refused this bot's IDENTIFY a moment ago (see the error above)")
        ws = await context.http.ws_connect(events_url(bot), max_msg_size=MAX_FRAME_BYTES)
        return SatoriSocket(bot, ws, self._refused)


TRANSPORTS: dict[tuple[str, str], Transport] = {("satori", "websocket"): SatoriWebSocket()}


__all__ = ["TRANSPORTS", "IdentifyRefused", "SatoriSocket", "SatoriWebSocket", "events_url"]
