"""Discord's Gateway (transport `gateway`), dialed by the lease's holder.

`GET /gateway/bot` (the bot token) gives the WebSocket URL (`?v=10&encoding=json`). Discord sends
HELLO with `heartbeat_interval`; the first heartbeat goes after a random fraction of it (jitter),
then one per interval carrying the last sequence number seen; a heartbeat whose ACK (op 11) has not
come by the next one means a dead connection (closed, resumed). Then IDENTIFY (token, intents
GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT, the bot entry's `shard`), or RESUME (session id and last
sequence) when Redis holds a session a previous connection, of this worker or another, left.

Dispatches: READY gives the session id and `resume_gateway_url`; `MESSAGE_CREATE` goes through
`DiscordPlatform.parse` (`Link.submit`). Discord has no acknowledgements: what makes the stream
durable is the sequence number a RESUME starts after. It is committed to Redis (under the lease:
a stale holder cannot move it) only once the broker has every message up to it, so a holder that
dies replays, on RESUME by the next, whatever it had not made durable; ingest drops the copies by
message id. A session cannot be resumed for ever: INVALID_SESSION (op 9) with `d: false` (or close
codes 4007, 4009) clears it and the next IDENTIFY starts a new one, and what happened in between is
not replayed (Discord's limit, not ours).

RECONNECT (op 7), INVALID_SESSION with `d: true`, a missing heartbeat ACK or a drop end the
connection; the holder dials again at once and resumes. Switchboard closes with code 4000, never
1000/1001 (which would end the session), so the next holder can resume. Close codes that no
reconnect cures (4004 authentication failed, 4010/4011 sharding, 4012 API version, 4013/4014
intents) end the connection with an error naming the fix; dials of that bot then fail at once on
this worker for `_FATAL_SECONDS`, so the lease moves on instead of a tight loop.

Shards: a bot in more than 2,500 guilds must shard. Each shard is a bot entry of its own (the same
token, its own bot_id and `shard = [i, n]`), so it has its own lease, holder and resume state, like
any bot. Discord sends a guild's events on shard `(guild_id >> 22) % n` and DMs on shard 0. IDENTIFYs
are not paced across holders by `session_start_limit.max_concurrency`: one Discord refuses is
answered with INVALID_SESSION, and the holder IDENTIFYs again after 1 to 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import aiohttp

from pipeline import metrics
from pipeline.connections.base import EVENT, Connection, DialContext, FrameOutcome, Link, Transport
from pipeline.connections.exceptions import GatewayFailed
from pipeline.platforms._common import base_url
from pipeline.platforms.discord import DEFAULT_API_BASE
from pipeline.settings import BotConfig

log = logging.getLogger(__name__)

GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT = 1 << 9, 1 << 12, 1 << 15
INTENTS = GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT
DISPATCH, HEARTBEAT, IDENTIFY, RESUME, RECONNECT, INVALID_SESSION, HELLO, HEARTBEAT_ACK = 0, 1, 2, 6, 7, 9, 10, 11
GATEWAY_QUERY = "?v=10&encoding=json"
MAX_FRAME_BYTES = 16 * 1024 * 1024
# Our close code: not 1000/1001, which would end the session for whoever resumes it.
RESUMABLE_CLOSE = 4000
FATAL_CLOSE_CODES = {
    4004: "authentication failed: the bot token is wrong or was reset",
    4010: "invalid shard: the bot entry's shard = [index, count] does not fit the bot",
    4011: "sharding required: the bot is in too many guilds for one shard; add a bot entry per shard "
    "(the same token, shard = [index, count], count from GET /gateway/bot's `shards`)",
    4012: "invalid API version",
    4013: "invalid intents",
    4014: "disallowed intents: enable the MESSAGE CONTENT intent in the Developer Portal (Bot page)",
}
_NEW_SESSION_CLOSE_CODES = {4007, 4009}  # invalid sequence, session timed out: IDENTIFY again
_FATAL_SECONDS = 300.0
_HELLO_TIMEOUT = 10.0
# Discord asks for a random wait of 1 to 5 seconds after INVALID_SESSION before identifying again.
INVALID_SESSION_WAIT = (1.0, 5.0)
_COMMIT_GRACE = 5.0


@dataclass
class Session:
    session_id: str
    resume_gateway_url: str
    seq: int | None = None

    @classmethod
    def parse(cls, raw: str | None) -> Session | None:
        try:
            data = json.loads(raw or "")
            session = cls(str(data["session_id"]), str(data["resume_gateway_url"]), data.get("seq"))
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.session_id and isinstance(session.seq, int | None) else None


class DiscordGateway(Connection):
    """One Gateway connection of a bot, from HELLO to its close."""

    transport = "gateway"
    channels = frozenset({EVENT})

    def __init__(self, bot: BotConfig, http: aiohttp.ClientSession, url: str, fatal: dict[str, float]) -> None:
        self.bot = bot
        self.http = http
        self.url = url
        self.token = bot.secret("token") or ""
        self._fatal = fatal
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._session: Session | None = None
        self._seen_seq: int | None = None  # the last sequence received (heartbeats carry it)
        self._acked = True
        self._why = ""
        # Sequence numbers read, each with the broker's acknowledgement of its messages (if any),
        # committed in order once acknowledged.
        self._pending: deque[tuple[int, Awaitable[FrameOutcome] | None]] = deque()
        self._more = asyncio.Event()
        self._drained = asyncio.Event()  # set while everything read so far is committed

    async def run(self, link: Link) -> None:
        self._session = Session.parse(await link.resume_state())
        if self._session is not None:
            try:
                self._ws = await self._dial(self._session.resume_gateway_url)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                # The resume URL is gone: a new session, or every later dial would fail the same way.
                log.warning(
                    "%s/%s: resume URL unreachable (%s)", self.bot.platform, self.bot.bot_id, type(exc).__name__
                )
                await self._new_session(link)
        if self._ws is None:
            self._ws = await self._dial(self.url)
        committer = asyncio.create_task(self._commit(link))
        heartbeat: asyncio.Task[None] | None = None
        try:
            hello = await self._ws.receive_json(timeout=_HELLO_TIMEOUT)
            if not isinstance(hello, dict) or hello.get("op") != HELLO:
                raise GatewayFailed("the Gateway did not start with HELLO")
            interval = float(hello["d"]["heartbeat_interval"]) / 1000
            heartbeat = asyncio.create_task(self._heartbeat(interval))
            await (self._resume() if self._session else self._identify())
            await self._read(link)
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await heartbeat  # a send on a closing socket may have ended it first
            await self._finish(committer)
            await self.close()
            if self._why:
                log.info("%s/%s: Gateway connection ended: %s", self.bot.platform, self.bot.bot_id, self._why)

    async def _dial(self, url: str) -> aiohttp.ClientWebSocketResponse:
        return await self.http.ws_connect(url.rstrip("/") + "/" + GATEWAY_QUERY, max_msg_size=MAX_FRAME_BYTES)

    async def _read(self, link: Link) -> None:
        assert self._ws is not None
        while True:
            message = await self._ws.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                if not await self._frame(message.data, link):
                    return
            elif message.type == aiohttp.WSMsgType.ERROR:
                raise message.data
            elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                await self._closed_by_discord(self._ws.close_code, link)
                return
            else:
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "binary_frame").inc()

    async def _frame(self, text: str, link: Link) -> bool:
        """Handle one frame; False: the connection ends (to be dialed again and resumed)."""
        try:
            frame = json.loads(text)
        except ValueError:
            frame = None
        if not isinstance(frame, dict):
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "malformed_frame").inc()
            return True
        op = frame.get("op")
        if op == DISPATCH:
            seq = frame.get("s")
            if isinstance(seq, int):
                self._seen_seq = seq
            kind = frame.get("t")
            ack: Awaitable[FrameOutcome] | None = None
            if kind == "READY":
                self._ready(frame.get("d"))
            elif kind == "RESUMED":
                log.info("%s/%s: Gateway session resumed", self.bot.platform, self.bot.bot_id)
            elif kind == "MESSAGE_CREATE":
                ack = await link.submit(text.encode())
            else:
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "not_message").inc()
            if isinstance(seq, int):
                self._pending.append((seq, ack))
                self._drained.clear()
                self._more.set()
            return True
        if op == HEARTBEAT:  # Discord asks for one now
            await self._send({"op": HEARTBEAT, "d": self._seen_seq})
            return True
        if op == HEARTBEAT_ACK:
            self._acked = True
            link.alive()
            return True
        if op == RECONNECT:
            self._why = "RECONNECT asked"
            return False
        if op == INVALID_SESSION:
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "invalid_session").inc()
            if frame.get("d") is True:
                self._why = "INVALID_SESSION (resumable)"
                return False
            await self._new_session(link)
            await asyncio.sleep(random.uniform(*INVALID_SESSION_WAIT))
            await self._identify()
            return True
        metrics.CONNECTION_FRAMES.labels(self.bot.platform, "meta").inc()
        return True

    def _ready(self, data: Any) -> None:
        data = data if isinstance(data, dict) else {}
        session_id, resume_url = data.get("session_id"), data.get("resume_gateway_url")
        if not isinstance(session_id, str) or not isinstance(resume_url, str):
            raise GatewayFailed("READY without session_id / resume_gateway_url")
        self._session = Session(session_id, resume_url)
        user = data.get("user")
        user_id = user.get("id") if isinstance(user, dict) else None
        if user_id != self.bot.self_id:
            log.error(
                "%s/%s: the token is bot user %s's, but self_id is %s: mentions of the bot will not be "
                "recognised; set self_id to the bot's user id",
                self.bot.platform,
                self.bot.bot_id,
                user_id,
                self.bot.self_id,
            )
        log.info("%s/%s: Gateway session ready", self.bot.platform, self.bot.bot_id)

    async def _new_session(self, link: Link) -> None:
        """Forget the session: the next connection IDENTIFYs."""
        self._session = None
        # A new session numbers its events from 1: a heartbeat between the IDENTIFY and its READY
        # carries null, not the last sequence of the session given up.
        self._seen_seq = None
        self._pending.clear()
        await link.commit_resume_state("{}")

    async def _closed_by_discord(self, code: int | None, link: Link) -> None:
        if self._why:  # we closed it
            return
        self._why = f"closed by Discord ({code})"
        if code in FATAL_CLOSE_CODES:
            self._fatal[self.bot.bot_id] = time.monotonic() + _FATAL_SECONDS
            metrics.CONNECTION_FRAMES.labels(self.bot.platform, "fatal_close").inc()
            message = f"Gateway closed with {code}, {FATAL_CLOSE_CODES[code]}"
            log.error("%s/%s: %s", self.bot.platform, self.bot.bot_id, message)
            raise GatewayFailed(message)
        if code in _NEW_SESSION_CLOSE_CODES:
            await self._new_session(link)

    async def _identify(self) -> None:
        properties = {"os": "linux", "browser": "switchboard", "device": "switchboard"}
        data = {"token": self.token, "intents": INTENTS, "properties": properties, "shard": list(self.bot.shard)}
        await self._send({"op": IDENTIFY, "d": data})

    async def _resume(self) -> None:
        assert self._session is not None
        data = {"token": self.token, "session_id": self._session.session_id, "seq": self._session.seq}
        await self._send({"op": RESUME, "d": data})

    async def _heartbeat(self, interval: float) -> None:
        await asyncio.sleep(interval * random.random())  # jitter: not every client at once
        while True:
            if not self._acked:
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "heartbeat_missed").inc()
                self._why = "no heartbeat ACK"
                await self.close()
                return
            self._acked = False
            await self._send({"op": HEARTBEAT, "d": self._seen_seq})
            await asyncio.sleep(interval)

    async def _commit(self, link: Link) -> None:
        """Commit the session and the last sequence whose messages the broker has, in order."""
        committed: tuple[str, int | None] | None = None
        while True:
            await self._more.wait()
            self._more.clear()
            while self._pending:
                seq, ack = self._pending[0]
                if ack is not None:
                    try:
                        await ack
                    except Exception:  # not durable: end here, the next connection resumes before it
                        self._why = "the broker did not take a message"
                        await self.close()
                        return
                if self._pending and self._pending[0][0] == seq:
                    self._pending.popleft()
                if self._session is not None:
                    self._session.seq = seq
            if self._session is not None and committed != (self._session.session_id, self._session.seq):
                if not await link.commit_resume_state(json.dumps(asdict(self._session))):
                    self._why = "lease lost"
                    await self.close()
                    return
                committed = (self._session.session_id, self._session.seq)
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

    async def _send(self, frame: dict[str, Any]) -> None:
        if self._ws is not None and not self._ws.closed:
            await self._ws.send_str(json.dumps(frame))

    async def close(self) -> None:
        if self._ws is not None and not self._ws.closed:
            with contextlib.suppress(Exception):
                await self._ws.close(code=RESUMABLE_CLOSE)


class DiscordGatewayTransport(Transport):
    """Switchboard dials Discord's Gateway (the URL from `GET {api_base}/gateway/bot`)."""

    platform: ClassVar[str] = "discord"
    name: ClassVar[str] = "gateway"
    dialed: ClassVar[bool] = True
    channels: ClassVar[frozenset[str]] = frozenset({EVENT})

    def __init__(self) -> None:
        self._fatal: dict[str, float] = {}  # bot id → until when dials fail at once

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        if self._fatal.get(bot.bot_id, 0.0) > time.monotonic():
            raise GatewayFailed("the Gateway refused this bot for good a moment ago (see the error above)")
        url = f"{base_url(bot, DEFAULT_API_BASE)}/gateway/bot"
        headers = {"Authorization": f"Bot {bot.secret('token') or ''}"}
        async with context.http.get(url, headers=headers) as response:
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
        if response.status == 401:
            log.error("%s/%s: GET /gateway/bot: 401, the bot token is wrong", bot.platform, bot.bot_id)
            raise GatewayFailed("GET /gateway/bot: 401 Unauthorized (the bot token is wrong)")
        gateway = body.get("url") if isinstance(body, dict) else None
        if response.status != 200 or not isinstance(gateway, str) or not gateway.startswith(("wss://", "ws://")):
            raise GatewayFailed(f"GET /gateway/bot: HTTP {response.status}, no Gateway URL")
        return DiscordGateway(bot, context.http, gateway, self._fatal)


TRANSPORTS: dict[tuple[str, str], Transport] = {("discord", "gateway"): DiscordGatewayTransport()}


__all__ = ["INTENTS", "TRANSPORTS", "DiscordGateway", "DiscordGatewayTransport", "GatewayFailed", "Session"]
