"""The console's API: bots, a chat's messages, the live stream.

Every route needs the bot's token when it has one (`Authorization: Bearer <token>`), the stream
included: the page reads it with `fetch()`, which can send the header (EventSource cannot), so the
token never appears in a URL or a log line. The page and its static files hold no data and are
served without a token; the page asks for one (or takes it from the URL fragment, which browsers
never send) and keeps it.

Reads and the live subscription use the console's own Redis connections: viewers cannot take the
pipeline's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from pipeline import metrics
from pipeline.controls.budget_store import BudgetStore, bot_scope
from pipeline.controls.budgets import SCOPES, Totals, window_at
from pipeline.platforms.console import bearer_ok
from pipeline.settings import BotConfig, Settings
from pipeline.state import message_seq

from ._deps import DEPS, STATIC_DIR, ConsoleDeps
from ._hub import KEEPALIVE_FRAME, Viewer, ViewerLimit, sse_frame

# How long a new stream waits for the worker's subscription (after a Redis outage) before 503.
SUBSCRIBE_WAIT_SECONDS = 5.0
# The longest value of the chat_id parameter (the webhook's own limit).
MAX_CHAT_ID = 200


def add_console_routes(app: web.Application, static: Path) -> None:
    app.router.add_get("/console/api/config", console_config)
    app.router.add_get("/console/api/messages", console_messages)
    app.router.add_get("/console/api/stream", console_stream)
    app.router.add_get("/console/api/usage", console_usage)
    app.router.add_get("/console", redirect_to_console)
    app.router.add_get("/console/", console_page)
    app.router.add_static("/console/static/", static)
    app.router.add_get("/", redirect_to_console)


_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    401: web.HTTPUnauthorized,
    429: web.HTTPTooManyRequests,
    503: web.HTTPServiceUnavailable,
}


def _reject(status: int, reason: str, message: str, **headers: str) -> web.HTTPException:
    """A JSON error, counted by reason."""
    metrics.WEB_REJECTED.labels("console", reason).inc()
    if status == 401:
        headers.setdefault("WWW-Authenticate", 'Bearer realm="switchboard console"')
    body = json.dumps({"error": reason, "detail": message})
    return _ERRORS[status](text=body, content_type="application/json", headers=headers)


def _console_bots(settings: Settings) -> list[BotConfig]:
    return [b for b in settings.bots if b.platform == "console"]


def _authorized_bot(request: web.Request) -> BotConfig:
    """The console bot named by `bot_id` (or the only one), if the request carries its token."""
    settings: Settings = request.app[DEPS].settings
    bot_id = request.query.get("bot_id")
    bot: BotConfig | None
    if bot_id:
        bot = settings.bot("console", bot_id)
    else:
        bots = _console_bots(settings)
        if len(bots) != 1:
            raise _reject(400, "bad_request", "bot_id is required (several console bots are configured)")
        bot = bots[0]
    # An unknown bot and a wrong token look the same to a caller without a token.
    if bot is None or not bearer_ok(bot.secret("token"), request.headers.get("Authorization")):
        raise _reject(401, "unauthorized", "a console bot's token is required: Authorization: Bearer <token>")
    return bot


def _chat_id(request: web.Request) -> str:
    chat_id = request.query.get("chat_id", "")
    if not chat_id:
        raise _reject(400, "bad_request", "chat_id is required")
    if len(chat_id) > MAX_CHAT_ID:
        raise _reject(400, "bad_request", f"chat_id is longer than {MAX_CHAT_ID} characters")
    return chat_id


def _after(request: web.Request) -> int:
    raw = request.query.get("after", "0")
    if not raw.isdigit() or len(raw) > 18:
        raise _reject(400, "bad_request", "after must be a non-negative integer (the last seq received)")
    return int(raw)


def _console(request: web.Request) -> ConsoleDeps:
    console: ConsoleDeps | None = request.app[DEPS].console
    if console is None:
        raise _reject(503, "unavailable", "the console is not running on this worker")
    return console


async def console_config(request: web.Request) -> web.Response:
    """The console bots this caller may use: those without a token, and those whose token it sent."""
    settings: Settings = request.app[DEPS].settings
    authorization = request.headers.get("Authorization")
    bots = _console_bots(settings)
    open_bots = [b for b in bots if b.secret("token") is None]
    unlocked = [b for b in bots if b.secret("token") is not None and bearer_ok(b.secret("token"), authorization)]
    # A token that opens nothing is refused, so the page asks again instead of showing fewer bots.
    if (authorization is not None and not unlocked) or (bots and not open_bots and not unlocked):
        raise _reject(401, "unauthorized", "this console needs a token: Authorization: Bearer <token>")
    body = [
        {
            "bot_id": b.bot_id,
            "self_id": b.self_id,
            "language": b.language,
            "busy_policy": b.busy_policy,
            "admins": b.admins,
            "token_required": b.secret("token") is not None,
        }
        for b in [*open_bots, *unlocked]
    ]
    return web.json_response({"bots": body})


async def console_messages(request: web.Request) -> web.Response:
    bot = _authorized_bot(request)
    chat_id = _chat_id(request)
    console = _console(request)
    try:
        raw = await _read(console, bot.bot_id, chat_id)
    except RedisError as exc:
        raise _reject(503, "unavailable", f"Redis: {type(exc).__name__}") from None
    body = "[" + ",".join(raw) + "]"  # stored JSON objects, passed through
    return web.Response(
        text=f'{{"chat_id": {json.dumps(chat_id)}, "messages": {body}}}',
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


async def console_usage(request: web.Request) -> web.Response:
    """The usage budgets' totals of the chat, of `user_id` (optional) and of the bot in the current
    window, with their limits (None: no limit) and grants: the line above a console chat."""
    bot = _authorized_bot(request)
    chat_id = _chat_id(request)
    user_id = request.query.get("user_id", "")
    if len(user_id) > MAX_CHAT_ID:
        raise _reject(400, "bad_request", f"user_id is longer than {MAX_CHAT_ID} characters")
    console = _console(request)
    store = BudgetStore(console.store.redis, console.store.keys)
    window = window_at(bot.budgets, datetime.now(UTC))
    idents = {"chat": chat_id, "user": user_id, "bot": ""}
    scopes = [scope for scope in SCOPES if idents[scope] or scope == "bot"]
    ref = bot_scope(bot.platform, bot.bot_id)
    try:
        totals = await store.totals([store.totals_key(ref, window, scope, idents[scope]) for scope in scopes])
    except RedisError as exc:
        raise _reject(503, "unavailable", f"Redis: {type(exc).__name__}") from None

    def shown(scope: str, total: Totals) -> dict[str, object]:
        limit = bot.budgets.limit(scope)  # type: ignore[arg-type]  # one of SCOPES
        return {
            "tokens": total.tokens,
            "active_seconds": total.active_ms / 1000,
            "granted_tokens": total.granted_tokens,
            "granted_seconds": total.granted_ms / 1000,
            "limit_tokens": limit.tokens if limit else None,
            "limit_seconds": limit.active_seconds if limit else None,
        }

    # Only a bot with budgets is accounted (docs/controls.md): for another, the totals are not kept.
    body: dict[str, object] = {
        "window": window.label,
        "timezone": bot.budgets.timezone,
        "accounted": bot.budgets.enabled,
    }
    body.update({scope: shown(scope, total) for scope, total in zip(scopes, totals, strict=True)})
    return web.json_response(body, headers={"Cache-Control": "no-store"})


async def console_stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the chat's messages after `after` (a seq), then each new one as it is
    delivered; `: keep-alive` comments in between. The event id is the message's seq."""
    bot = _authorized_bot(request)
    chat_id = _chat_id(request)
    after = _after(request)
    if request.version < (1, 1):
        raise _reject(400, "bad_request", "the stream needs HTTP/1.1 (chunked)")
    console = _console(request)
    try:
        viewer = console.hub.join(bot.bot_id, chat_id)
    except ViewerLimit as exc:
        raise _reject(429, "over_viewer_limit", f"too many console viewers: {exc}", **{"Retry-After": "10"}) from None
    try:
        # Joined before the backlog is read: a delivery in between is queued, not lost.
        try:
            async with asyncio.timeout(SUBSCRIBE_WAIT_SECONDS):
                await console.hub.subscribed.wait()
            backlog = await _read(console, bot.bot_id, chat_id)
        except (TimeoutError, RedisError):
            raise _reject(503, "unavailable", "the console's Redis is unavailable", **{"Retry-After": "3"}) from None
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )
        response.enable_chunked_encoding()  # the hub writes chunks to the connection itself
        await response.prepare(request)
        viewer.connection = request.transport
        viewer.last = after
        with contextlib.suppress(ConnectionError):  # the client left while we wrote
            await _stream(request, response, viewer, backlog)
            # Ended by the worker (shutdown, a slow reader, a lost subscription): the client
            # reconnects with the last seq it has.
            await response.write_eof()
        return response
    finally:
        # Also when the client leaves: aiohttp cancels the handler at once, and the slot is free.
        console.hub.leave(viewer)


async def _stream(request: web.Request, response: web.StreamResponse, viewer: Viewer, backlog: list[str]) -> None:
    """The backlog after `viewer.last`, what arrived meanwhile, then live (the hub writes each
    delivery itself); this handler then only waits for the end."""
    frames = []
    for message in backlog:
        seq = message_seq(message)
        if seq > viewer.last:
            frames.append(sse_frame(seq, message))
            viewer.last = seq
    while True:
        while viewer.pending:  # delivered since we joined (while reading or writing the backlog)
            seq, frame = viewer.pending.popleft()
            if seq == 0:  # a status note
                frames.append(frame)
            elif seq > viewer.last:
                frames.append(frame)
                viewer.last = seq
        if not frames and not viewer.keepalive:
            break
        await response.write(b"".join(frames) or KEEPALIVE_FRAME)
        viewer.keepalive = False
        frames = []
    transport = request.transport
    if transport is None or viewer.ended:
        return
    viewer.go_live(transport)  # nothing is pending, and no await since we looked: nothing is lost
    while not viewer.ended:
        viewer.wake.clear()
        await viewer.wake.wait()


async def _read(console: ConsoleDeps, bot_id: str, chat_id: str) -> list[str]:
    """A chat's messages; once more when the connection broke (after a Redis restart the next call
    connects again)."""
    try:
        return await console.store.messages(bot_id, chat_id)
    except RedisConnectionError:
        return await console.store.messages(bot_id, chat_id)


async def redirect_to_console(_: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/console/")


async def console_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(request.app[STATIC_DIR] / "index.html")
