"""A stand-in Matrix homeserver: the client-server API calls Switchboard makes, each checked the way
a homeserver checks it, with events built by mautrix's typed classes (`MessageEvent`,
`TextMessageEventContent`, `MediaMessageEventContent`, `EncryptedEvent`). mautrix has no type for
`m.mentions` (intentional mentions, spec v1.7): it is added to the serialized content by hand.

Served: `GET /sync` (long polling: `since`, `timeout`, an inline `filter` read by mautrix's `Filter`),
`GET /account/whoami`, `GET /user/{userId}/account_data/m.direct`, `GET /rooms/{id}/joined_members`,
`GET /rooms/{id}/state/m.room.member/{userId}`,
`GET /rooms/{id}/event/{eventId}`, `PUT /rooms/{id}/send/m.room.message/{txnId}` (the content read
back by mautrix; a transaction id seen before for the same access token answers the event it
stored, so a retried send is stored once), `PUT /rooms/{id}/typing/{userId}` and
`POST /_matrix/media/v3/upload`. Every request must carry the bot's access token (401
`M_UNKNOWN_TOKEN` otherwise). A failed check is kept in `errors`.

The event stream is a list; a sync token is `s<position>`. Two syncs waiting at once, the first one's
client still connected, count in `overlaps` (two holders syncing the same bot).

As the homeserver of an application service (`REGISTRATION`, what its registration YAML says): the
`as_token` is accepted as Synapse accepts it, acting as the `user_id` query parameter's user when
that user is the service's sender or in its exclusive `users` namespace and registered (403
`M_FORBIDDEN` otherwise), as the sender without it; a transaction id is remembered per user and
token. `push` sends a transaction to the service (`PUT {url}/_matrix/app/v1/transactions/{txnId}`,
`Authorization: Bearer <hs_token>`, never the legacy query parameter) and checks the answer as
Synapse does: a 2xx with a JSON object, else the transaction is to be sent again.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from mautrix.types import (
    EncryptedEvent,
    EncryptedEventContent,
    EncryptedMegolmEventContent,
    EventID,
    EventType,
    Filter,
    Format,
    InReplyTo,
    MediaMessageEventContent,
    Membership,
    MemberStateEventContent,
    MessageEvent,
    MessageType,
    RelatesTo,
    RelationType,
    RoomID,
    SessionID,
    StateEvent,
    TextMessageEventContent,
    UserID,
)

from .standin_support import start_app

SERVER = "example.org"
BOT_USER = f"@switch:{SERVER}"
ACCESS_TOKEN = "syt_c3dpdGNo_FAKEtokenFORtests_0aBcDe"
DEVICE = "SWITCHBOARD"
# The application service's registration (the homeserver's side of `transport = "appservice"`).
AS_TOKEN = "as_token_c3dpdGNoYm9hcmQ_FAKEforTESTS"
HS_TOKEN = "hs_token_aG9tZXNlcnZlcg_FAKEforTESTS"
AS_SENDER = f"@sb_appservice:{SERVER}"
REGISTRATION: dict[str, Any] = {
    "id": "switchboard",
    "url": "http://switchboard.example/webhooks/matrix/<bot_id>",  # `Homeserver.appservice_url`
    "as_token": AS_TOKEN,
    "hs_token": HS_TOKEN,
    "sender_localpart": "sb_appservice",
    "rate_limited": False,
    "namespaces": {"users": [{"exclusive": True, "regex": re.escape(f"@switch:{SERVER}")}], "aliases": [], "rooms": []},
}
CLIENT = "/_matrix/client/v3"
_REQUESTER = web.RequestKey("requester", str)
_TXN = re.compile(r"[A-Za-z0-9._~-]{1,255}")
_MXC = re.compile(r"mxc://[A-Za-z0-9.:-]+/[A-Za-z0-9_-]+")


def _error(status: int, errcode: str, error: str, **extra: Any) -> web.Response:
    return web.json_response({"errcode": errcode, "error": error, **extra}, status=status)


@dataclass
class Stored:
    """An event Switchboard sent, as stored."""

    room_id: str
    txn_id: str
    event_id: str
    content: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


@dataclass
class Room:
    members: list[str]
    direct_with: str | None = None  # in the bot's m.direct, with this user


class Homeserver:
    def __init__(self) -> None:
        self.url = ""
        self.rooms: dict[str, Room] = {}
        self.stream: list[tuple[str, dict[str, Any]]] = []  # (room id, event), in order
        self.events: dict[str, dict[str, Any]] = {}  # by event id (sent by users and by the bot)
        self.stored: list[Stored] = []  # what the bot sent, once per transaction
        self.txns: dict[str, Stored] = {}
        self.send_attempts: Counter[str] = Counter()  # PUTs per transaction id
        self.syncs: list[dict[str, str]] = []  # the query of each /sync
        self.requests: Counter[str] = Counter()  # "METHOD path" of every request
        self.served: Counter[str] = Counter()  # times each event id was in a sync's answer
        self.uploads: dict[str, bytes] = {}
        self.typing: list[tuple[str, dict[str, Any]]] = []
        self.errors: list[str] = []
        self.overlaps = 0
        self.scripts: dict[str, list[tuple[int, dict[str, Any]]]] = {}  # room → answers to its next sends
        self.registered = {BOT_USER, AS_SENDER}  # users that exist on the homeserver
        self.appservice_url = ""  # the registration's `url`: a worker's /webhooks/matrix/<bot_id>
        self.unavailable = False  # every client-server call answered 502, as behind a failing proxy
        self.pushed: list[tuple[str, int, Any]] = []  # (transaction id, status, answer) of each push
        self._txn_ids = itertools.count(1)
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._waiting: list[web.Request] = []
        self._runner: web.AppRunner | None = None

    # -- what a test does --------------------------------------------------------------------------
    def add_room(self, room_id: str, members: list[str], *, direct_with: str | None = None) -> None:
        self.rooms[room_id] = Room([BOT_USER, *members], direct_with)

    def text_event(
        self,
        room_id: str,
        sender: str,
        body: str,
        *,
        mention: bool = False,
        reply_to: str | None = None,
        event_id: str | None = None,
    ) -> dict[str, Any]:
        """An `m.room.message` `m.text` from `sender`, built by mautrix; `mention`: the bot pilled in
        `formatted_body` and listed in `m.mentions`, as Element sends it."""
        content = TextMessageEventContent(msgtype=MessageType.TEXT, body=body)
        if mention:
            content.body = f"switch: {body}"
            content.format = Format.HTML
            content.formatted_body = f'<a href="https://matrix.to/#/{BOT_USER}">switch</a>: {body}'
        if reply_to:
            content.relates_to = RelatesTo(in_reply_to=InReplyTo(event_id=EventID(reply_to)))
        event = MessageEvent(
            type=EventType.ROOM_MESSAGE,
            room_id=RoomID(room_id),
            event_id=EventID(event_id or f"$ev{next(self._ids)}"),
            sender=UserID(sender),
            timestamp=int(time.time() * 1000),
            content=content,
        ).serialize()
        users = [BOT_USER] if mention else []
        event["content"]["m.mentions"] = {"user_ids": users} if users else {}
        return event

    def encrypted_event(self, room_id: str, sender: str) -> dict[str, Any]:
        content = EncryptedMegolmEventContent(ciphertext="AwgAEoABd2Vhc2Vs", session_id=SessionID("sess1"))
        return EncryptedEvent(
            type=EventType.ROOM_ENCRYPTED,
            room_id=RoomID(room_id),
            event_id=EventID(f"$enc{next(self._ids)}"),
            sender=UserID(sender),
            timestamp=int(time.time() * 1000),
            content=EncryptedEventContent(content),
        ).serialize()

    def member_event(self, room_id: str, user: str) -> dict[str, Any]:
        """The `m.room.member` join of `user`, with a display name (`User` + the localpart)."""
        content = MemberStateEventContent(membership=Membership.JOIN, displayname=f"User {user[1:].split(':')[0]}")
        return StateEvent(
            type=EventType.ROOM_MEMBER,
            room_id=RoomID(room_id),
            event_id=EventID(f"$m{abs(hash((room_id, user)))}"),
            sender=UserID(user),
            timestamp=0,
            state_key=user,
            content=content,
        ).serialize()

    def add(self, room_id: str, event: dict[str, Any]) -> None:
        """Put `event` on the stream (again, when it was there already: a homeserver may repeat one)."""
        self.events[event["event_id"]] = event
        self.stream.append((room_id, event))
        self._changed.set()

    def sent_to(self, room_id: str) -> list[Stored]:
        return [s for s in list(self.stored) if s.room_id == room_id]

    # -- server ------------------------------------------------------------------------------------
    async def start(self) -> Homeserver:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, self.url = await start_app(app)
        return self

    async def stop(self) -> None:
        self._changed.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.requests[f"{request.method} {path}"] += 1
        if "access_token" in request.query:
            self.errors.append(f"{path}: the access token in the query string")
        if self.unavailable:
            return _error(502, "M_UNKNOWN", "Bad gateway")
        requester = self._requester(request)
        if isinstance(requester, web.Response):
            return requester
        request[_REQUESTER] = requester
        if path == "/_matrix/media/v3/upload" and request.method == "POST":
            return await self._upload(request)
        if not path.startswith(CLIENT + "/"):
            self.errors.append(f"{request.method} {path}: not a client-server API path")
            return _error(404, "M_UNRECOGNIZED", "Unrecognized request")
        parts = [unquote(p) for p in path[len(CLIENT) + 1 :].split("/")]
        method = request.method
        if parts == ["sync"] and method == "GET":
            return await self._sync(request)
        if parts == ["account", "whoami"] and method == "GET":
            return web.json_response({"user_id": requester, "device_id": DEVICE})
        if len(parts) == 4 and parts[0] == "user" and parts[2:] == ["account_data", "m.direct"] and method == "GET":
            if parts[1] != requester:
                self.errors.append(f"account data of {parts[1]} asked by {requester}")
                return _error(403, "M_FORBIDDEN", "Cannot get account data for other users.")
            direct: dict[str, list[str]] = {}
            for room_id, each in self.rooms.items():
                if each.direct_with:
                    direct.setdefault(each.direct_with, []).append(room_id)
            return web.json_response(direct) if direct else _error(404, "M_NOT_FOUND", "Account data not found")
        if len(parts) >= 3 and parts[0] == "rooms":
            room_id, what = parts[1], parts[2]
            room = self.rooms.get(room_id)
            if room is None or requester not in room.members:
                self.errors.append(f"{method} {what} in room {room_id} by {requester}, not in it")
                return _error(403, "M_FORBIDDEN", "User not in room")
            if what == "state" and method == "GET" and len(parts) == 5 and parts[3] == "m.room.member":
                if parts[4] not in room.members:
                    return _error(404, "M_NOT_FOUND", "Event not found.")
                return web.json_response(self.member_event(room_id, parts[4])["content"])
            if what == "joined_members" and method == "GET" and len(parts) == 3:
                return web.json_response({"joined": {m: {"display_name": m[1:].split(":")[0]} for m in room.members}})
            if what == "event" and method == "GET" and len(parts) == 4:
                event = self.events.get(parts[3])
                if event is None:
                    return _error(404, "M_NOT_FOUND", "Event not found.")
                return web.json_response(event)
            if what == "send" and method == "PUT" and len(parts) == 5 and parts[3] == "m.room.message":
                return await self._send(request, room_id, parts[4])
            if what == "typing" and method == "PUT" and len(parts) == 4:
                body = await request.json()
                if parts[3] != requester or not isinstance(body.get("typing"), bool):
                    self.errors.append(f"typing: {parts[3]} {body}")
                    return _error(400, "M_INVALID_PARAM", "bad typing")
                self.typing.append((room_id, body))
                return web.json_response({})
        self.errors.append(f"{method} {path}: not served by the stand-in")
        return _error(404, "M_UNRECOGNIZED", "Unrecognized request")

    def _requester(self, request: web.Request) -> str | web.Response:
        """The user a request acts as, checked the way Synapse checks its token: the bot's access
        token; or the application service's `as_token`, as the `user_id` parameter's user."""
        auth = request.headers.get("Authorization")
        where = f"{request.method} {request.path}"
        if auth == f"Bearer {ACCESS_TOKEN}":
            if "user_id" in request.query:
                self.errors.append(f"{where}: user_id with a user's access token")
            return BOT_USER
        if auth != f"Bearer {AS_TOKEN}":
            self.errors.append(f"{where}: no or a wrong access token")
            if auth is None:
                return _error(401, "M_MISSING_TOKEN", "Missing access token.")
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        user = request.query.get("user_id")
        if user is None or user == AS_SENDER:
            return AS_SENDER
        namespaces = REGISTRATION["namespaces"]["users"]
        if not any(re.fullmatch(n["regex"], user) for n in namespaces):
            self.errors.append(f"{where}: masquerading as {user}, outside the namespace")
            return _error(403, "M_FORBIDDEN", "Application service cannot masquerade as this user.")
        if user not in self.registered:
            self.errors.append(f"{where}: masquerading as {user}, not registered")
            return _error(403, "M_FORBIDDEN", "Application service has not registered this user.")
        return user

    async def push(
        self,
        events: list[dict[str, Any]],
        *,
        txn_id: str | None = None,
        token: str | None = HS_TOKEN,
        url: str | None = None,
    ) -> tuple[str, int, Any]:
        """Send a transaction of `events` to the application service as Synapse does; its id (a new
        one unless given: a retry sends the same id with the same events), status and answer.
        `url`: another base than the registration's (another worker behind the same name)."""
        txn = txn_id or str(next(self._txn_ids))
        url = f"{url or self.appservice_url}/_matrix/app/v1/transactions/{txn}"
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with aiohttp.ClientSession() as http, http.put(url, json={"events": events}, headers=headers) as answer:
            raw = await answer.read()
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            status = answer.status
            if 200 <= status < 300 and not (isinstance(body, dict) and answer.content_type == "application/json"):
                self.errors.append(f"transaction {txn}: answered {status} {raw[:200]!r}, not a JSON object")
        for event in events:
            self.events[event["event_id"]] = event
        self.pushed.append((txn, status, body))
        return txn, status, body

    async def _upload(self, request: web.Request) -> web.Response:
        data = await request.read()
        mime = request.headers.get("Content-Type", "")
        if not data or not mime or "/" not in mime:
            self.errors.append(f"upload: {len(data)} bytes of {mime!r}")
            return _error(400, "M_INVALID_PARAM", "bad upload")
        uri = f"mxc://{SERVER}/up{next(self._ids)}"
        self.uploads[uri] = data
        return web.json_response({"content_uri": uri})

    async def _send(self, request: web.Request, room_id: str, txn: str) -> web.Response:
        if not _TXN.fullmatch(txn):
            self.errors.append(f"send: transaction id {txn!r}")
            return _error(400, "M_INVALID_PARAM", "bad transaction id")
        self.send_attempts[txn] += 1
        try:
            content = json.loads(await request.read())
        except ValueError:
            self.errors.append("send: not JSON")
            return _error(400, "M_NOT_JSON", "Content not JSON.")
        problem = _content_problem(content, self)
        if problem:
            self.errors.append(f"send {txn}: {problem}: {content}")
            return _error(400, "M_BAD_JSON", problem)
        requester = request[_REQUESTER]
        stored = self.txns.get(f"{requester} {request.headers.get('Authorization')} {txn}")
        if stored is not None:  # the same transaction again: the event stored the first time
            return web.json_response({"event_id": stored.event_id})
        script = self.scripts.get(room_id)
        if script:
            status, body = script.pop(0)
            return web.json_response(body, status=status)
        event_id = f"$bot{next(self._ids)}"
        stored = Stored(room_id, txn, event_id, content)
        self.txns[f"{requester} {request.headers.get('Authorization')} {txn}"] = stored
        self.stored.append(stored)
        self.events[event_id] = {
            "event_id": event_id,
            "sender": requester,
            "type": "m.room.message",
            "content": content,
        }
        return web.json_response({"event_id": event_id})

    async def _sync(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.syncs.append(query)
        unknown = set(query) - {"since", "timeout", "filter", "full_state", "set_presence"}
        if unknown:
            self.errors.append(f"sync: unknown parameters {sorted(unknown)}")
        timeout = query.get("timeout", "0")
        if not timeout.isdigit():
            self.errors.append(f"sync: timeout {timeout!r}")
            return _error(400, "M_INVALID_PARAM", "timeout must be an integer")
        try:
            Filter.deserialize(json.loads(query.get("filter", "{}")))
        except Exception as exc:  # what mautrix cannot read as a Filter, a homeserver refuses
            self.errors.append(f"sync: filter {exc!r}")
            return _error(400, "M_INVALID_PARAM", "bad filter")
        since = query.get("since")
        start = len(self.stream)
        if since is not None:
            if not (since.startswith("s") and since[1:].isdigit() and int(since[1:]) <= len(self.stream)):
                self.errors.append(f"sync: since {since!r} is no token this server gave")
                return _error(400, "M_INVALID_PARAM", "bad since")
            start = int(since[1:])
        for other in self._waiting:
            if other.transport is not None and not other.transport.is_closing():
                self.overlaps += 1
        self._waiting.append(request)
        try:
            deadline = time.monotonic() + int(timeout) / 1000
            while since is not None and len(self.stream) <= start and time.monotonic() < deadline:
                self._changed.clear()
                waited = asyncio.ensure_future(self._changed.wait())
                await asyncio.wait({waited}, timeout=max(0.0, deadline - time.monotonic()))
                waited.cancel()
        finally:
            self._waiting.remove(request)
        end = len(self.stream)
        rooms: dict[str, Any] = {}
        if since is not None:
            for room_id, event in self.stream[start:end]:
                room = rooms.setdefault(
                    room_id, {"timeline": {"events": [], "limited": False}, "state": {"events": []}}
                )
                room["timeline"]["events"].append(event)
                self.served[event["event_id"]] += 1
                # Lazy-loaded members: the member event of each sender comes with its events.
                member = self.member_event(room_id, event["sender"])
                if member not in room["state"]["events"]:
                    room["state"]["events"].append(member)
        else:  # an initial sync: the last event of each room (history the bot must not answer)
            for room_id, event in self.stream[:end]:
                rooms[room_id] = {"timeline": {"events": [event], "limited": True}}
        return web.json_response({"next_batch": f"s{end}", "rooms": {"join": rooms}, "account_data": {"events": []}})


def _content_problem(content: Any, homeserver: Homeserver) -> str:
    """What a homeserver (and a client reading the event) would refuse in an m.room.message content."""
    if not isinstance(content, dict):
        return "content is not an object"
    if not isinstance(content.get("msgtype"), str) or not isinstance(content.get("body"), str):
        return "msgtype and body are required strings"
    parsed = MessageEvent.deserialize_content(dict(content))
    if not isinstance(parsed, TextMessageEventContent):
        return f"unknown msgtype {content['msgtype']!r}"
    if (parsed.format is None) != (parsed.formatted_body is None):
        return "format and formatted_body go together"
    if parsed.format is not None and parsed.format != Format.HTML:
        return "format is not org.matrix.custom.html"
    mentions = content.get("m.mentions")
    if not isinstance(mentions, dict) or set(mentions) - {"user_ids", "room"}:
        return "m.mentions missing or not {user_ids, room}"
    if mentions.get("room"):
        return "the bot pinged the whole room"
    users = mentions.get("user_ids", [])
    if not isinstance(users, list) or not all(isinstance(u, str) and u.startswith("@") for u in users):
        return "m.mentions.user_ids is not a list of user ids"
    relates = parsed.relates_to
    if relates.in_reply_to is not None and relates.in_reply_to.event_id not in homeserver.events:
        return f"in_reply_to an unknown event {relates.in_reply_to.event_id}"
    if relates.rel_type is not None and relates.rel_type != RelationType.THREAD:
        return f"rel_type {relates.rel_type}"
    if isinstance(parsed, MediaMessageEventContent) and parsed.msgtype.is_media:
        if not (isinstance(parsed.url, str) and _MXC.fullmatch(parsed.url)):
            return "a media message without an mxc:// url"
    return ""


__all__ = [
    "ACCESS_TOKEN",
    "AS_SENDER",
    "AS_TOKEN",
    "BOT_USER",
    "HS_TOKEN",
    "REGISTRATION",
    "SERVER",
    "Homeserver",
    "Stored",
]
