"""Matrix `/sync` long polling (transport `sync`), dialed by the lease's holder.

`GET /_matrix/client/v3/sync?since=<token>&timeout=<ms>` waits until something happens in the bot's
rooms and answers with it and `next_batch`, where the next sync starts. That token is the stream's
position: the holder keeps it in Redis under the bot's lease (`Link.commit_resume_state`; a stale
holder cannot move it), committed only once the broker has every message of the answer it ends. A
holder that dies in between leaves the previous token: the next holder syncs from there, reads
those events again, and ingest drops the copies by event id.

A bot with no token in Redis (its first sync ever) does not read the rooms' history: the first sync
(`timeout=0`, a timeline of one event) only gives the token to start from; then only new events.

Dial: `GET /account/whoami` (the access token works and is the bot's `self_id`) and the bot's
`m.direct` account data. Each `m.room.message` of a joined room is one frame for
`MatrixPlatform.parse`, with whether the room is direct (listed in `m.direct`, or two joined
members: `summary`, else `GET /rooms/{id}/joined_members` once per room) and, for a reply, who wrote
the event replied to (`GET /rooms/{id}/event/{eventId}`), so a reply to the bot is known as one.

What a frame needs to know of the rooms is kept by `RoomView`, which the application-service
transport (`pipeline.web.matrix_appservice`) uses too, so both make the same frames.

Encrypted rooms: Switchboard holds no Olm/Megolm keys, so an `m.room.encrypted` event cannot be read.
It is counted (`switchboard_connection_frames_total{platform="matrix",outcome="encrypted"}`), logged
(a warning at most once a minute per bot), and the room gets one `m.notice` saying the bot cannot
read it (notice key `matrix_encrypted`), once per room per holder; its transaction id is made from
the room id, so the homeserver stores a notice sent again by another holder soon after only once.

Invites are not accepted: an operator joins the bot to the rooms it serves (any Matrix user could
otherwise pull it into a room). A `limited` timeline (more events since the last sync than it
holds) skipped events: counted (`outcome="gap"`) and logged, not fetched back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections import OrderedDict
from typing import Any, ClassVar
from urllib.parse import quote

import aiohttp

from pipeline import metrics
from pipeline.platforms._common import warn_limited
from pipeline.platforms.matrix import CLIENT, client_auth
from pipeline.settings import BotConfig

from .base import EVENT, Connection, DialContext, Link, Transport
from .exceptions import ConnectionsError, PollFailed

log = logging.getLogger(__name__)

# What the bot needs of a sync: messages (and encrypted ones, to say it cannot read them), member
# changes (a room becoming or ceasing to be two people), the `m.direct` account data; no presence,
# typing or receipts.
SYNC_FILTER = {
    "presence": {"types": []},
    "account_data": {"types": ["m.direct"]},
    "room": {
        "timeline": {"types": ["m.room.message", "m.room.encrypted", "m.room.member"], "limit": 100},
        "state": {"types": ["m.room.member"], "lazy_load_members": True},
        "ephemeral": {"types": []},
        "account_data": {"types": []},
    },
}
# The first sync of a bot: only its `next_batch` is used, so as little as the homeserver will send.
FIRST_FILTER = {
    "presence": {"types": []},
    "account_data": {"types": []},
    "room": {"timeline": {"limit": 1}, "state": {"types": []}, "ephemeral": {"types": []}},
}
_HTTP_TIMEOUT_SECONDS = 15.0  # an HTTP call's timeout; /sync gets it on top of its own wait
_MAX_BACKOFF = 30.0
_CACHE = 10_000  # rooms whose member count, events whose sender, a holder remembers
_NOTICES = {
    "en": "This room is end-to-end encrypted, and this bot cannot read encrypted messages. "
    "Talk to it in a room without encryption.",
    "zh": "[此房间启用了端到端加密 机器人无法读取加密消息 请在未加密的房间中与它对话]",
}


class Refused(ConnectionsError):
    """A call that failed and may be tried again after `backoff`; `reason` is a metric label."""

    def __init__(self, reason: str, detail: str, backoff: float | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.backoff = backoff


class ClientApi:
    """Calls of one bot's client-server API, authenticated as the bot (`client_auth`: its access
    token, or the application service's `as_token` acting as the bot's user)."""

    def __init__(self, bot: BotConfig, http: aiohttp.ClientSession) -> None:
        self.bot = bot
        self.http = http
        self.root = (bot.api_base or "").rstrip("/") + CLIENT
        self.headers, self.params = client_auth(bot)

    async def call(
        self, method: str, path: str, timeout: float, *, params: dict[str, str] | None = None, body: Any = None
    ) -> dict[str, Any]:
        """The JSON answer of a successful call, or `Refused` / `PollFailed`."""
        try:
            async with self.http.request(
                method,
                self.root + path,
                params={**self.params, **(params or {})},
                json=body,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                status, raw = response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Refused("network", f"{type(exc).__name__}: {exc}"[:300]) from None
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise Refused("bad_response", f"HTTP {status}: not a JSON object")
        if 200 <= status < 300:
            return data
        errcode, error = str(data.get("errcode") or ""), str(data.get("error") or "")[:300]
        if status == 429 or errcode == "M_LIMIT_EXCEEDED":
            retry_ms = data.get("retry_after_ms")
            backoff = retry_ms / 1000 if isinstance(retry_ms, int | float) and not isinstance(retry_ms, bool) else None
            raise Refused("rate_limited", f"{errcode} {error}", backoff)
        if status >= 500:
            raise Refused("server_error", f"HTTP {status} {errcode}")
        if status == 401 or errcode in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN"):
            metrics.CONNECTION_POLL_ERRORS.labels(self.bot.platform, self.bot.bot_id, "unauthorized").inc()
            token = "as_token" if self.bot.transport == "appservice" else "access_token"
            raise PollFailed(f"{method} {path.split('?')[0]}: HTTP {status} {errcode} (is the {token} right?)")
        raise Refused("bad_request", f"{path.split('?')[0]}: HTTP {status} {errcode} {error}", None)


class RoomView:
    """What one bot knows of its rooms, to make a frame of a message event the way both transports
    do: which rooms are direct (`m.direct`, or two joined members), who wrote the events replied to,
    the members' display names; and the rooms told they are encrypted. Lookups go to the
    client-server API (`api`); what they find is remembered (bounded)."""

    def __init__(self, api: ClientApi, direct_rooms: set[str]) -> None:
        self.api = api
        self.bot = api.bot
        self.direct_rooms = direct_rooms
        self.members: OrderedDict[str, int] = OrderedDict()  # room → joined members
        self.senders: OrderedDict[str, str] = OrderedDict()  # event id → sender
        self.names: OrderedDict[str, str] = OrderedDict()  # "room user" → display name
        self.noticed: set[str] = set()  # rooms told they are encrypted

    async def frame(self, room_id: str, event: dict[str, Any]) -> bytes:
        """The frame `MatrixPlatform.parse` reads for an `m.room.message` event of `room_id`."""
        frame = {
            "room_id": room_id,
            "direct": await self.is_direct(room_id),
            "event": event,
            "reply_sender": await self.reply_sender(room_id, event),
            "sender_name": self.names.get(f"{room_id} {event.get('sender')}") or None,
        }
        return json.dumps(frame, ensure_ascii=False).encode()

    async def learn_name(self, room_id: str, user: str) -> None:
        """Look up a sender's display name no member event gave (`appservice`: the homeserver
        pushes member events only as they happen, not with each sender as a lazy-loading sync
        does): `GET /rooms/{id}/state/m.room.member/{user}`, remembered, "" for none."""
        key = f"{room_id} {user}"
        if key in self.names:
            return
        path = f"/rooms/{quote(room_id, safe='')}/state/m.room.member/{quote(user, safe='')}"
        try:
            content = await self.api.call("GET", path, _HTTP_TIMEOUT_SECONDS)
        except Refused as refused:
            if refused.reason != "bad_request":  # no such member (left, never joined): no name
                raise
            content = {}
        name = content.get("displayname")
        remember(self.names, key, name[:100] if isinstance(name, str) else "")

    def member(self, room_id: str, event: dict[str, Any], *, changed: bool) -> None:
        """A member event: the display name remembered; one in the timeline (someone joined or
        left) makes the room's member count stale, unless the sync's summary gave it."""
        user, content = event.get("state_key"), _dict(event.get("content"))
        name = content.get("displayname")
        if isinstance(user, str) and isinstance(name, str) and name:
            remember(self.names, f"{room_id} {user}", name[:100])
        if changed:
            self.members.pop(room_id, None)

    async def is_direct(self, room_id: str) -> bool:
        if room_id in self.direct_rooms:
            return True
        count = self.members.get(room_id)
        if count is None:
            try:
                answer = await self.api.call(
                    "GET", f"/rooms/{quote(room_id, safe='')}/joined_members", _HTTP_TIMEOUT_SECONDS
                )
            except Refused as refused:
                if refused.reason != "bad_request":
                    raise
                return False  # refused for good (the bot left meanwhile): a group, never a retry loop
            count = len(_dict(answer.get("joined")))
            remember(self.members, room_id, count)
        return count == 2

    async def reply_sender(self, room_id: str, event: dict[str, Any]) -> str | None:
        relates = _dict(_dict(event.get("content")).get("m.relates_to"))
        parent = _dict(relates.get("m.in_reply_to")).get("event_id")
        if not isinstance(parent, str) or not parent:
            return None
        sender = self.senders.get(parent)
        if sender is None:
            try:
                answer = await self.api.call(
                    "GET", f"/rooms/{quote(room_id, safe='')}/event/{quote(parent, safe='')}", _HTTP_TIMEOUT_SECONDS
                )
            except Refused as refused:
                if refused.reason != "bad_request":  # gone, or not visible to the bot: no author
                    raise
                return None
            sender = answer.get("sender") if isinstance(answer.get("sender"), str) else ""
            remember(self.senders, parent, sender)
        return sender or None

    async def encrypted(self, room_id: str) -> None:
        """An `m.room.encrypted` event: counted (on either transport), logged, the room told once."""
        bot = self.bot
        metrics.CONNECTION_FRAMES.labels(bot.platform, "encrypted").inc()
        warn_limited(
            f"matrix-encrypted:{bot.bot_id}",
            "%s/%s: an encrypted event in room %s cannot be read (Switchboard does not decrypt); the room is told once",
            bot.platform,
            bot.bot_id,
            room_id,
            logger=log,
        )
        if room_id in self.noticed or len(self.noticed) >= _CACHE:
            return
        self.noticed.add(room_id)
        text = bot.notices.get("matrix_encrypted") or _NOTICES.get(bot.language, _NOTICES["en"])
        txn = "sb.e2ee." + hashlib.sha256(room_id.encode()).hexdigest()[:32]
        with contextlib.suppress(Refused):  # a courtesy: the event is counted and logged anyway
            await self.api.call(
                "PUT",
                f"/rooms/{quote(room_id, safe='')}/send/m.room.message/{txn}",
                _HTTP_TIMEOUT_SECONDS,
                body={"msgtype": "m.notice", "body": text, "m.mentions": {}},
            )


def remember(cache: OrderedDict[str, Any], key: str, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _CACHE:
        cache.popitem(last=False)


class MatrixSyncer(Connection):
    """One holder's `/sync` loop: `run` syncs until closed; no actions (replies go over HTTP)."""

    transport = "sync"
    channels = frozenset({EVENT})

    def __init__(self, api: ClientApi, direct_rooms: set[str]) -> None:
        self.api = api
        self.bot = api.bot
        self.timeout_ms = api.bot.poll_timeout_seconds * 1000
        self.view = RoomView(api, direct_rooms)
        self._closed = asyncio.Event()
        self._call: asyncio.Task[Any] | None = None

    async def run(self, link: Link) -> None:
        since = await link.resume_state()
        failures = 0
        while not self._closed.is_set():
            params = {"timeout": str(self.timeout_ms), "filter": json.dumps(SYNC_FILTER, separators=(",", ":"))}
            if since:
                params["since"] = since
            else:  # the bot's first sync ever: only where to start, no history
                params = {"timeout": "0", "filter": json.dumps(FIRST_FILTER, separators=(",", ":"))}
            self._call = asyncio.ensure_future(
                self.api.call("GET", "/sync", self.timeout_ms / 1000 + _HTTP_TIMEOUT_SECONDS, params=params)
            )
            try:
                answer = await self._call
            except asyncio.CancelledError:
                if self._closed.is_set():
                    return
                raise
            except Refused as refused:
                failures += 1
                if not await self._refused(refused, failures):
                    return
                continue
            next_batch = answer.get("next_batch")
            if not isinstance(next_batch, str) or not next_batch:
                failures += 1
                if not await self._refused(Refused("bad_response", "no next_batch"), failures):
                    return
                continue
            failures = 0
            if since:
                try:
                    await self._deliver(answer, link)
                except Refused as refused:  # a lookup failed: sync the same answer again
                    failures += 1
                    if not await self._refused(refused, failures):
                        return
                    continue
            else:
                log.info("%s/%s: first sync; the rooms' history is skipped", self.bot.platform, self.bot.bot_id)
            if not await link.commit_resume_state(next_batch):
                log.warning("%s/%s: the lease was lost; syncing stops", self.bot.platform, self.bot.bot_id)
                return
            since = next_batch

    async def _deliver(self, answer: dict[str, Any], link: Link) -> None:
        """Submit the answer's messages in order and wait until the broker has them all."""
        for event in _list(_dict(answer.get("account_data")).get("events")):
            if isinstance(event, dict) and event.get("type") == "m.direct":
                self.view.direct_rooms = direct_rooms_of(_dict(event.get("content")))
        acknowledgements = []
        for room_id, room in _dict(_dict(answer.get("rooms")).get("join")).items():
            if not isinstance(room, dict):
                continue
            summary = _dict(room.get("summary")).get("m.joined_member_count")
            if isinstance(summary, int):
                remember(self.view.members, room_id, summary)
            timeline = _dict(room.get("timeline"))
            if timeline.get("limited") is True:
                metrics.CONNECTION_FRAMES.labels(self.bot.platform, "gap").inc()
                warn_limited(
                    f"matrix-gap:{self.bot.bot_id}",
                    "%s/%s: a sync's timeline was limited: events of a busy room were skipped",
                    self.bot.platform,
                    self.bot.bot_id,
                    logger=log,
                )
            for event in _list(_dict(room.get("state")).get("events")):
                if isinstance(event, dict) and event.get("type") == "m.room.member":
                    self.view.member(room_id, event, changed=False)  # lazy-loaded: who the senders are
            for event in _list(timeline.get("events")):
                if not isinstance(event, dict):
                    continue
                kind = event.get("type")
                if kind == "m.room.member":
                    self.view.member(room_id, event, changed=not isinstance(summary, int))
                elif kind == "m.room.encrypted":
                    await self.view.encrypted(room_id)
                elif kind == "m.room.message" and event.get("sender") != self.bot.self_id:
                    acknowledgements.append(await link.submit(await self.view.frame(room_id, event)))
        # Raises when the broker could not take them: the token stays, they are synced again.
        await asyncio.gather(*acknowledgements)

    async def _refused(self, refused: Refused, failures: int) -> bool:
        """Count and log a failed call, wait, and say whether to sync again."""
        platform, bot_id = self.bot.platform, self.bot.bot_id
        metrics.CONNECTION_POLL_ERRORS.labels(platform, bot_id, refused.reason).inc()
        backoff = refused.backoff if refused.backoff is not None else min(_MAX_BACKOFF, 0.5 * 2**failures)
        if refused.reason == "bad_request":  # no retry cures it: say what to do
            log.error(
                "%s/%s: the homeserver refused the sync (%s); again in %.0f s. If it no longer knows the "
                "saved since token (a homeserver restored from a backup), delete the Redis key "
                "resume:matrix:%s (under the deployment's prefix): the next sync starts afresh, skipping "
                "what came before",
                platform,
                bot_id,
                refused,
                backoff,
                bot_id,
            )
        else:
            log.warning("%s/%s: sync failed (%s); again in %.1f s", platform, bot_id, refused, backoff)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(backoff):
                await self._closed.wait()
        if self._closed.is_set():
            return False
        if refused.reason == "network":
            metrics.CONNECTION_RECONNECTS.labels(platform, self.transport).inc()
        return True

    async def close(self) -> None:
        self._closed.set()
        if self._call is not None and not self._call.done():
            self._call.cancel()  # a long sync would otherwise run on past the lease


class MatrixSync(Transport):
    """Switchboard syncs with the homeserver (`api_base`)."""

    platform: ClassVar[str] = "matrix"
    name: ClassVar[str] = "sync"
    dialed: ClassVar[bool] = True
    channels: ClassVar[frozenset[str]] = frozenset({EVENT})

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        """`whoami` (the token works, and is the bot's), then the bot's `m.direct` rooms."""
        api = ClientApi(bot, context.http)
        try:
            whoami = await api.call("GET", "/account/whoami", _HTTP_TIMEOUT_SECONDS)
            if whoami.get("user_id") != bot.self_id:
                raise PollFailed(
                    f"the access_token is {whoami.get('user_id')!r}'s, not the bot's self_id {bot.self_id!r}"
                )
            try:
                direct = await api.call(
                    "GET", f"/user/{quote(bot.self_id or '', safe='')}/account_data/m.direct", _HTTP_TIMEOUT_SECONDS
                )
            except Refused as refused:
                if refused.reason != "bad_request":  # 404 M_NOT_FOUND: no direct rooms yet
                    raise
                direct = {}
        except Refused as refused:
            metrics.CONNECTION_POLL_ERRORS.labels(bot.platform, bot.bot_id, refused.reason).inc()
            log.warning("%s/%s: sync could not start: %s", bot.platform, bot.bot_id, refused)
            raise PollFailed(str(refused)) from None
        except PollFailed as failed:
            log.error("%s/%s: sync could not start: %s", bot.platform, bot.bot_id, failed)
            raise
        return MatrixSyncer(api, direct_rooms_of(direct))


def direct_rooms_of(content: dict[str, Any]) -> set[str]:
    """The room ids of `m.direct` content (user id → rooms)."""
    return {room for rooms in content.values() if isinstance(rooms, list) for room in rooms if isinstance(room, str)}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


TRANSPORTS: dict[tuple[str, str], Transport] = {("matrix", "sync"): MatrixSync()}


__all__ = [
    "FIRST_FILTER",
    "SYNC_FILTER",
    "TRANSPORTS",
    "ClientApi",
    "MatrixSync",
    "MatrixSyncer",
    "Refused",
    "RoomView",
    "direct_rooms_of",
]
