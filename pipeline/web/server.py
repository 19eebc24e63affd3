"""aiohttp application served by every worker.

Ingress answers a webhook as soon as the broker has the record: verify (401 and nothing else on a
bad signature), parse (400 plus a dead letter on a malformed payload), produce to `im.inbound`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.asyncio.client import PubSub

from pipeline import metrics
from pipeline.platforms import UnknownPlatform, WebhookRejected, WebhookRequest, get_platform
from pipeline.records import now_ms
from pipeline.settings import Settings
from pipeline.stages.outputs import Outputs
from pipeline.state import State
from pipeline.topics import IM_INBOUND

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
# Which process answers /healthz: `switchboard up` gives each worker it starts an id and checks it,
# so it never mistakes another program on the port for its own worker.
INSTANCE_ID = os.environ.get("SWITCHBOARD_INSTANCE_ID") or uuid.uuid4().hex
MAX_WEBHOOK_BYTES = 1024 * 1024

# (topic, key, value) → awaited until the broker acknowledged the record.
ProduceAcked = Callable[[str, str | None, bytes], Awaitable[None]]


@dataclass
class WebDeps:
    settings: Settings
    state: State
    produce: ProduceAcked
    outputs: Outputs
    ready: Callable[[], Awaitable[dict[str, bool]]]
    # redis-py's client, for the console's live channel (pub/sub is not the stores' client's job).
    pubsub: Callable[[], PubSub]


def build_web_app(deps: WebDeps) -> web.Application:
    app = web.Application(client_max_size=MAX_WEBHOOK_BYTES)
    app["deps"] = deps
    app.router.add_post("/webhooks/{platform}/{bot_id}", webhook)
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/console/api/messages", console_messages)
    app.router.add_get("/console/api/stream", console_stream)
    app.router.add_get("/console/api/config", console_config)
    app.router.add_get("/console", redirect_to_console)
    app.router.add_get("/console/", console_page)
    app.router.add_static("/console/static/", STATIC)
    app.router.add_get("/", redirect_to_console)
    return app


async def webhook(request: web.Request) -> web.StreamResponse:
    deps: WebDeps = request.app["deps"]
    platform_name = request.match_info["platform"]
    bot_id = request.match_info["bot_id"]
    received = now_ms()
    bot = deps.settings.bot(platform_name, bot_id)
    try:
        platform = get_platform(platform_name)
    except UnknownPlatform:
        bot = None
    if bot is None:
        metrics.WEBHOOKS.labels("unknown", "unknown_bot").inc()
        return web.json_response({"error": "unknown bot"}, status=404)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.WEBHOOKS.labels(platform_name, "too_large").inc()
        return web.json_response({"error": "payload too large"}, status=413)
    wire = WebhookRequest(
        headers={k.lower(): v for k, v in request.headers.items()},
        body=body,
        query=dict(request.query),
        received_at_ms=received,
    )
    try:
        platform.verify(bot, wire)
    except WebhookRejected as exc:
        metrics.WEBHOOKS.labels(platform_name, exc.reason).inc()
        return web.json_response({"error": exc.reason}, status=exc.status)
    try:
        result = platform.parse(bot, wire)
    except WebhookRejected as exc:
        metrics.WEBHOOKS.labels(platform_name, exc.reason).inc()
        await deps.outputs.dead_letter(
            "ingress",
            exc.reason,
            body.decode("utf-8", "replace")[:100_000],
            error=exc.detail[:500],
            key=f"{platform_name}:{bot_id}",
        )
        return web.json_response({"error": exc.reason, "detail": exc.detail[:500]}, status=exc.status)
    except Exception as exc:  # a parser bug: the payload is kept, the platform told to stop retrying
        log.exception("webhook parser of %s failed", platform_name)
        metrics.WEBHOOKS.labels(platform_name, "parser_error").inc()
        await deps.outputs.dead_letter(
            "ingress",
            "parser_error",
            body.decode("utf-8", "replace")[:100_000],
            error=repr(exc)[:500],
            key=f"{platform_name}:{bot_id}",
        )
        return web.json_response({"error": "parser_error"}, status=400)
    if len(result.messages) == 1:  # nearly always: no gather (its tasks cost more than the send)
        (message,) = result.messages
        await deps.produce(IM_INBOUND, message.conversation_key, message.model_dump_json().encode())
    elif result.messages:
        await asyncio.gather(
            *(deps.produce(IM_INBOUND, m.conversation_key, m.model_dump_json().encode()) for m in result.messages)
        )
    if result.messages:
        metrics.INBOUND_ACCEPTED.labels(platform_name).inc(len(result.messages))
        metrics.WEBHOOKS.labels(platform_name, "accepted").inc()
    else:
        metrics.WEBHOOKS.labels(platform_name, result.ignored or "ignored").inc()
    body_out = result.body if result.body is not None else {}
    return web.json_response(body_out, status=result.status)


async def metrics_view(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "instance": INSTANCE_ID})


async def readyz(request: web.Request) -> web.Response:
    deps: WebDeps = request.app["deps"]
    checks = await deps.ready()
    ok = all(checks.values())
    return web.json_response({"ready": ok, "checks": checks}, status=200 if ok else 503)


def _console_bot(request: web.Request) -> str:
    deps: WebDeps = request.app["deps"]
    bot_id = request.query.get("bot_id")
    if bot_id:
        return bot_id
    for bot in deps.settings.bots:
        if bot.platform == "console":
            return bot.bot_id
    raise web.HTTPNotFound(text="no console bot configured")


async def console_messages(request: web.Request) -> web.Response:
    deps: WebDeps = request.app["deps"]
    chat_id = request.query.get("chat_id")
    if not chat_id:
        return web.json_response({"error": "chat_id is required"}, status=400)
    raw = await deps.state.console.console_messages(_console_bot(request), chat_id)
    return web.json_response({"chat_id": chat_id, "messages": [json.loads(r) for r in raw]})


async def console_stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the chat's delivered messages, pushed as they are delivered."""
    deps: WebDeps = request.app["deps"]
    chat_id = request.query.get("chat_id")
    if not chat_id:
        return web.json_response({"error": "chat_id is required"}, status=400)
    bot_id = _console_bot(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    sent = int(request.query.get("after", "0"))
    pubsub = deps.pubsub()
    await pubsub.subscribe(deps.state.console.live_channel(bot_id))
    try:
        while True:
            raw = await deps.state.console.console_messages(bot_id, chat_id)
            for index in range(sent, len(raw)):
                await response.write(f"id: {index + 1}\nevent: message\ndata: {raw[index]}\n\n".encode())
            sent = max(sent, len(raw))
            # Wake on the next delivery anywhere (or every 15 s to send a keep-alive).
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=15.0)
            if message is None:
                await response.write(b": keep-alive\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        await pubsub.aclose()
    return response


async def console_config(request: web.Request) -> web.Response:
    deps: WebDeps = request.app["deps"]
    bots = [
        {"bot_id": b.bot_id, "self_id": b.self_id, "language": b.language, "busy_policy": b.busy_policy}
        for b in deps.settings.bots
        if b.platform == "console"
    ]
    return web.json_response({"bots": bots})


async def redirect_to_console(_: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/console/")


async def console_page(_: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")
