"""Matrix's application-service transport (`transport = "appservice"`): the homeserver pushes.

The bot's registration names `url: https://<switchboard>/webhooks/matrix/<bot_id>`; the homeserver
appends the Application Service API's paths to it, so every worker serves, for each such bot:

- `PUT /_matrix/app/v1/transactions/{txnId}`: a batch of events (`{"events": [...]}`). Each
  `m.room.message` becomes the same frame the `/sync` holder makes (`RoomView`: direct rooms,
  who wrote the replied event, display names from member events, else looked up, as a lazy-loading
  sync brings them) and `MatrixPlatform.parse` maps
  it exactly as on `sync`; `m.room.encrypted` gets the same notice. Answered `200 {}` once the
  broker has every message. A transaction id this worker finished before is answered `200 {}` at
  once; one retried at another worker is parsed again and ingest drops the copies by event id. A
  lookup the homeserver could not answer (network, 5xx) is answered 503, and the homeserver sends
  the transaction again later.
- `GET /_matrix/app/v1/users/{userId}` and `GET /_matrix/app/v1/rooms/{roomAlias}`: 404
  `M_NOT_FOUND` (Switchboard creates no users or rooms on demand).
- `POST /_matrix/app/v1/ping`: `200 {}` (the homeserver checking the `hs_token` for the
  application service's ping).
- anything else below the `url`: 404 `M_UNRECOGNIZED` (405 for a known path with another method),
  as the spec says; the legacy paths without `/_matrix/app/v1` among them (the spec's homeservers
  try the versioned ones first, and use them).

Every request is authenticated before its path is looked at or its body read: `Authorization:
Bearer <hs_token>` (the spec since v1.4), compared in constant time; none is 401 `M_UNAUTHORIZED`,
another token 403 `M_FORBIDDEN`. The legacy `access_token` query parameter is not accepted alone (a
token in a query string ends up in proxies' access logs; homeservers send the header, and Synapse
adds the parameter only with `use_appservice_legacy_authorization`, off by default); when a
homeserver sends both, they must match (the spec asks it). Each
refusal is counted in `switchboard_webhooks_total{platform="matrix"}`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from pipeline import metrics
from pipeline.connections.exceptions import PollFailed
from pipeline.connections.matrix import ClientApi, Refused, RoomView, direct_rooms_of
from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.records import InboundMessage
from pipeline.settings import BotConfig
from pipeline.topics import IM_INBOUND

from ._deps import DEPS, WebDeps
from ._front import header_problem

log = logging.getLogger(__name__)

ROUTE = "/webhooks/matrix/{bot_id}/{tail:.+}"
# Synapse sends at most 100 events (and 100 ephemeral ones) a transaction, each at most 64 KiB.
MAX_TRANSACTION_BYTES = 16 * 1024 * 1024
_SEEN_TRANSACTIONS = 1000  # transaction ids a worker remembers per bot
_DIRECT_REFRESH_SECONDS = 60.0  # `m.direct` is not pushed: read again this often
_DEAD_LETTER_CHARS = 1000
_PLATFORM = "matrix"


def _error(status: int, errcode: str, error: str, outcome: str) -> web.Response:
    metrics.WEBHOOKS.labels(_PLATFORM, outcome).inc()
    return web.json_response({"errcode": errcode, "error": error}, status=status)


def auth_refusal(bot: BotConfig, headers: Any, query: Any) -> tuple[int, str, str, str] | None:
    """(status, errcode, error, outcome) when the request does not carry the bot's `hs_token`."""
    expected = (bot.secret("hs_token") or "").encode()
    header = headers.get("Authorization")
    legacy = query.get("access_token")
    if header is None:
        if legacy is not None:
            return 401, "M_UNAUTHORIZED", "the hs_token goes in the Authorization header", "missing_token"
        return 401, "M_UNAUTHORIZED", "no Authorization header", "missing_token"
    scheme, _, token = header.partition(" ")
    given = token.strip().encode("utf-8", "surrogateescape")
    ok = scheme.lower() == "bearer" and bool(expected) and hmac.compare_digest(given, expected)
    if legacy is not None:  # both sent: both must be the token
        ok = hmac.compare_digest(legacy.encode("utf-8", "surrogateescape"), expected) and ok
    if not ok:
        return 403, "M_FORBIDDEN", "bad hs_token", "bad_token"
    return None


@dataclass
class AppserviceBot:
    """One bot's state on this worker: its rooms (as the sync holder keeps them) and the
    transactions it finished."""

    bot: BotConfig
    view: RoomView
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    direct_read_at: float | None = None

    async def refresh_direct(self) -> None:
        now = time.monotonic()
        if self.direct_read_at is not None and now - self.direct_read_at < _DIRECT_REFRESH_SECONDS:
            return
        user = quote(self.bot.self_id or "", safe="")
        try:
            content = await self.view.api.call("GET", f"/user/{user}/account_data/m.direct", 15.0)
        except Refused as refused:
            if refused.reason != "bad_request":  # 404 M_NOT_FOUND: no direct rooms yet
                raise
            content = {}
        self.view.direct_rooms = direct_rooms_of(content)
        self.direct_read_at = now


class Appservices:
    """The application-service bots of a worker, made on their first request, and the HTTP
    session their lookups share (closed with the app)."""

    def __init__(self) -> None:
        self.bots: dict[str, AppserviceBot] = {}
        self.http: aiohttp.ClientSession | None = None

    def of(self, bot: BotConfig) -> AppserviceBot:
        state = self.bots.get(bot.bot_id)
        if state is None:
            if self.http is None:
                self.http = aiohttp.ClientSession()
            state = self.bots[bot.bot_id] = AppserviceBot(bot, RoomView(ClientApi(bot, self.http), set()))
        return state

    async def close(self, _: web.Application | None = None) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None


APPSERVICES = web.AppKey("matrix_appservices", Appservices)


def add_appservice_routes(app: web.Application) -> None:
    app[APPSERVICES] = appservices = Appservices()
    app.on_cleanup.append(appservices.close)
    app.router.add_route("*", ROUTE, serve)


async def serve(request: web.Request) -> web.StreamResponse:
    deps: WebDeps = request.app[DEPS]
    bot = deps.settings.bot(_PLATFORM, request.match_info["bot_id"])
    if bot is None or bot.transport != "appservice":
        return _error(404, "M_UNRECOGNIZED", "no application service here", "unknown_bot")
    problem = header_problem(request)
    if problem is not None:
        return _error(400, "M_INVALID_PARAM", problem, problem)
    refusal = auth_refusal(bot, request.headers, request.query)
    if refusal is not None:
        status, errcode, error, outcome = refusal
        return _error(status, errcode, error, outcome)
    parts = request.match_info["tail"].split("/")
    method = request.method
    if parts[:3] != ["_matrix", "app", "v1"] or len(parts) < 4:  # the legacy paths too: not served
        return _error(404, "M_UNRECOGNIZED", "Unrecognized request", "unrecognized")
    what, rest = parts[3], parts[4:]
    if what == "transactions" and len(rest) == 1 and rest[0]:
        if method != "PUT":
            return _error(405, "M_UNRECOGNIZED", "Unrecognized request", "method_not_allowed")
        return await _transaction(request, deps, request.app[APPSERVICES].of(bot), rest[0])
    if what in ("users", "rooms") and len(rest) == 1 and rest[0]:
        if method != "GET":
            return _error(405, "M_UNRECOGNIZED", "Unrecognized request", "method_not_allowed")
        # Switchboard creates no users or rooms when the homeserver asks about one.
        return _error(404, "M_NOT_FOUND", f"no such {what[:-1]} here", "query")
    if what == "ping" and not rest:
        if method != "POST":
            return _error(405, "M_UNRECOGNIZED", "Unrecognized request", "method_not_allowed")
        metrics.WEBHOOKS.labels(_PLATFORM, "ping").inc()
        return web.json_response({})
    return _error(404, "M_UNRECOGNIZED", "Unrecognized request", "unrecognized")


async def _read(request: web.Request) -> bytes | None:
    """The body, or None past `MAX_TRANSACTION_BYTES` (read after the token was checked)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > MAX_TRANSACTION_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _transaction(request: web.Request, deps: WebDeps, state: AppserviceBot, txn: str) -> web.StreamResponse:
    bot = state.bot
    async with state.lock:  # a retry while the first attempt still runs waits for it, then is a no-op
        if txn in state.seen:
            metrics.WEBHOOKS.labels(_PLATFORM, "redelivered").inc()
            return web.json_response({})
        try:
            body = await _read(request)
        except aiohttp.ClientPayloadError:
            return _error(400, "M_BAD_JSON", "bad body", "bad_body")
        if body is None:
            return _error(413, "M_TOO_LARGE", "transaction too large", "too_large")
        try:
            transaction = json.loads(body)
        except ValueError:
            transaction = None
        events = transaction.get("events") if isinstance(transaction, dict) else None
        if not isinstance(events, list):
            await _dead_letter(deps, bot, "malformed_payload", body, "not a transaction (no events list)")
            return _error(400, "M_BAD_JSON", "not a transaction: an object with an events list", "malformed_payload")
        try:
            messages = await _messages(deps, state, events)
        except (Refused, PollFailed) as exc:
            # PollFailed: the homeserver refused the as_token, which no retry cures: said at ERROR.
            level = logging.ERROR if isinstance(exc, PollFailed) else logging.WARNING
            log.log(level, "%s/%s: transaction %s not taken, a lookup failed: %s", _PLATFORM, bot.bot_id, txn, exc)
            return _error(503, "M_UNKNOWN", "a lookup failed; send the transaction again", "lookup_failed")
        produced = deps.refusals.screen(state.bot, messages)
        if produced:
            # Shielded: a homeserver that hangs up does not cut the produce short (it retries, and
            # ingest drops the copies).
            await asyncio.shield(_produce(deps, produced))
            metrics.child(metrics.INBOUND_ACCEPTED, _PLATFORM).inc(len(produced))
        metrics.WEBHOOKS.labels(_PLATFORM, "accepted" if messages else "ignored").inc()
        state.seen[txn] = None
        while len(state.seen) > _SEEN_TRANSACTIONS:
            state.seen.popitem(last=False)
        return web.json_response({})


async def _messages(deps: WebDeps, state: AppserviceBot, events: list[Any]) -> list[InboundMessage]:
    """The inbound messages of a transaction's events, in order, as the sync holder makes them."""
    bot, view = state.bot, state.view
    platform = get_platform(_PLATFORM)
    messages: list[InboundMessage] = []
    for event in events:
        room_id = event.get("room_id") if isinstance(event, dict) else None
        if not isinstance(room_id, str) or not isinstance(event, dict):
            continue  # not a room event (the spec's `events` are all room events)
        kind = event.get("type")
        if kind == "m.room.member" and isinstance(event.get("state_key"), str):
            view.member(room_id, event, changed=True)
        elif kind == "m.room.encrypted":
            await view.encrypted(room_id)
        elif kind == "m.room.message" and event.get("sender") != bot.self_id:
            await state.refresh_direct()
            sender = event.get("sender")
            if isinstance(sender, str):
                await view.learn_name(room_id, sender)
            frame = await view.frame(room_id, event)
            try:
                result = platform.parse(bot, WebhookRequest(headers={}, body=frame))
            except WebhookRejected as exc:  # one bad event: kept, the others go on
                metrics.WEBHOOKS.labels(_PLATFORM, exc.reason).inc()
                await _dead_letter(deps, bot, exc.reason, frame, exc.detail[:500])
                continue
            messages.extend(result.messages)
    return messages


async def _produce(deps: WebDeps, messages: list[InboundMessage]) -> None:
    await asyncio.gather(
        *(deps.produce(IM_INBOUND, m.conversation_key, m.model_dump_json().encode()) for m in messages)
    )


async def _dead_letter(deps: WebDeps, bot: BotConfig, reason: str, body: bytes, error: str) -> None:
    """What could not be parsed: an excerpt, its size and its sha256, never the whole body."""
    await asyncio.shield(
        deps.outputs.dead_letter(
            "ingress",
            reason,
            body[: _DEAD_LETTER_CHARS * 4].decode("utf-8", "replace")[:_DEAD_LETTER_CHARS],
            error=error,
            key=f"{_PLATFORM}:{bot.bot_id}",
            record_bytes=len(body),
            record_sha256=hashlib.sha256(body).hexdigest(),
        )
    )


__all__ = ["MAX_TRANSACTION_BYTES", "ROUTE", "add_appservice_routes", "auth_refusal"]
