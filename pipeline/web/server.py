"""aiohttp application served by every worker, and its server.

Ingress answers a webhook as soon as the broker has the record: verify (401 and nothing else on a
bad signature), parse (400 plus a dead letter on a malformed payload), produce to `im.inbound`.
`/metrics` needs `Authorization: Bearer <SWITCHBOARD_METRICS_TOKEN>` when that is set, and is
refused to everyone when the worker listens beyond loopback without one; `/healthz` and `/readyz`
are open (probes). The console (page, API, stream) is served only when enabled.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.web import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline import hopstamps, metrics
from pipeline.platforms import (
    Platform,
    UnknownPlatform,
    WebhookRejected,
    WebhookRequest,
    get_platform,
    known_platforms,
)
from pipeline.platforms.console import bearer_ok
from pipeline.records import InboundMessage, now_ms
from pipeline.settings import BotConfig, Settings
from pipeline.stages.outputs import Outputs
from pipeline.stages.refused_early import EarlyRefusals
from pipeline.state import ConsoleStore, Keys, RedisClient, close_redis_py, redis_py_client
from pipeline.topics import IM_INBOUND

from ._console import add_console_routes
from ._deps import DEPS, STATIC_DIR, ConsoleDeps, ProduceAcked, WebDeps
from ._exposure import metrics_open
from ._front import ONEBOT_WS_PREFIX, WEBHOOK_METHODS, WEBHOOK_PREFIX, Reply, header_problem, webhook_target
from ._guard import Front, GuardedAppRunner, GuardedSite
from ._hub import ConsoleHub
from .matrix_appservice import add_appservice_routes

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
# Which process answers /healthz: `switchboard up` gives each worker it starts an id and checks it,
# so it never mistakes another program on the port for its own worker.
INSTANCE_ID = os.environ.get("SWITCHBOARD_INSTANCE_ID") or uuid.uuid4().hex
MAX_WEBHOOK_BYTES = 1024 * 1024
# What a dead letter keeps of a webhook body it could not parse: the start of it, and its digest.
DEAD_LETTER_EXCERPT_CHARS = 1000
# Handlers still running this long after the streams were ended are cancelled at shutdown.
SHUTDOWN_SECONDS = 3.0
# The console's Redis connections are named so in CLIENT LIST.
CONSOLE_CLIENT_NAME = "switchboard-console"
PLATFORMS = frozenset(known_platforms())  # metric labels stay bounded: any other name is "unknown"


def build_web_app(deps: WebDeps) -> web.Application:
    app = web.Application(client_max_size=MAX_WEBHOOK_BYTES)
    app[DEPS] = deps
    app[STATIC_DIR] = STATIC
    app.router.add_post("/webhooks/{platform}/{bot_id}", webhook)
    app.router.add_get("/webhooks/{platform}/{bot_id}", webhook, allow_head=False)
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    add_appservice_routes(app)  # Matrix application services: /webhooks/matrix/{bot_id}/_matrix/…
    if deps.settings.console_enabled:
        add_console_routes(app, STATIC)
    return app


class WebServer:
    """The worker's web server: the app behind the connection guard, and the console's own Redis
    connections and live subscription when the console is enabled."""

    def __init__(
        self,
        settings: Settings,
        *,
        produce: ProduceAcked,
        outputs: Outputs,
        ready: Callable[[], Awaitable[dict[str, bool]]],
        add_routes: Callable[[web.Application], None] | None = None,
        refusals: EarlyRefusals | None = None,
    ) -> None:
        self.settings = settings
        self.deps = WebDeps(
            settings=settings,
            produce=produce,
            outputs=outputs,
            ready=ready,
            refusals=refusals if refusals is not None else EarlyRefusals(),
        )
        self._add_routes = add_routes  # more routes (long connections: pipeline/web/connections.py)
        self.port: int | None = None
        self._runner: GuardedAppRunner | None = None

    async def start(self, host: str, port: int) -> int:
        s = self.settings
        if s.console_enabled:
            assert s.redis_url, "redis_url is required"
            # Never the pipeline's connections: the console reads through a client of its own (one
            # connection, every read of a loop turn in one write) and subscribes on a connection of
            # its own, without redis-py's retries, so the hub sees every break and has its viewers
            # catch up.
            client = RedisClient(s.redis_url, name=CONSOLE_CLIENT_NAME)
            store = ConsoleStore(
                client,
                Keys(s.redis_prefix, cluster=client.cluster),
                mapping_ttl=s.mapping_ttl_seconds,
                dedup_ttl=s.dedup_ttl_seconds,
            )
            subscription = redis_py_client(
                s.redis_url,
                max_connections=1,
                decode_responses=True,
                socket_connect_timeout=5,
                health_check_interval=15,
                client_name=CONSOLE_CLIENT_NAME,
            )
            hub = ConsoleHub(store, subscription, s.console_max_viewers)
            await hub.start()
            self.deps.console = ConsoleDeps(store=store, hub=hub)
        app = build_web_app(self.deps)
        if self._add_routes is not None:
            self._add_routes(app)
        self._runner = GuardedAppRunner(
            app,
            max_connections=s.web_max_connections,
            request_timeout=s.web_request_timeout_seconds,
            keepalive_timeout=s.web_keepalive_seconds,
            # A client that leaves cancels its handler at once (a console stream frees its slot).
            handler_cancellation=True,
            shutdown_timeout=SHUTDOWN_SECONDS,
            access_log=None,
        )
        await self._runner.setup()
        await GuardedSite(self._runner, host, port, front=make_front(self.deps, webhooks=s.web_webhook_front)).start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else port
        log.info("web listening on http://%s:%s", host, self.port)
        return self.port

    @property
    def open_connections(self) -> int:
        return self._runner.open_connections if self._runner is not None else 0

    async def stop(self) -> None:
        console = self.deps.console
        if console is not None:
            await console.hub.close()  # open streams end now and do not hold the shutdown
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if console is not None:
            await console.store.redis.aclose()
            await close_redis_py(console.hub.subscriber)
            self.deps.console = None


_TEXT_PLAIN = "text/plain; charset=utf-8"


def bot_target(deps: WebDeps, platform_name: str, bot_id: str, method: str) -> tuple[BotConfig, Platform] | Reply:
    """The bot and platform a webhook is for, or the refusal when there is none to take it."""
    bot = deps.settings.bot(platform_name, bot_id)
    try:
        platform = get_platform(platform_name)
    except UnknownPlatform:
        bot = None
    if bot is None:
        metrics.WEBHOOKS.labels("unknown", "unknown_bot").inc()
        return Reply.json({"error": "unknown bot"}, status=404)
    if bot.transport != "webhook" and bot.transport not in platform.webhooks_beside:
        # Its updates come over its long connection: no second way in.
        metrics.WEBHOOKS.labels(platform_name, "not_a_webhook_bot").inc()
        return Reply.json({"error": f"this bot takes no webhooks (transport {bot.transport})"}, status=404)
    if method not in platform.webhook_methods:
        metrics.WEBHOOKS.labels(platform_name, "method_not_allowed").inc()
        allow = ", ".join(sorted(platform.webhook_methods))
        return Reply.json({"error": "method not allowed"}, status=405, headers={"Allow": allow})
    return bot, platform


async def answer_webhook(deps: WebDeps, bot: BotConfig, platform: Platform, wire: WebhookRequest) -> Reply:
    """Verify, parse and produce one webhook whose bot takes it; the answer for the platform."""
    platform_name = platform.name
    dead_letter_key = f"{platform_name}:{bot.bot_id}"
    try:
        platform.verify(bot, wire)
        await platform.admit(bot, wire)
    except WebhookRejected as exc:
        metrics.WEBHOOKS.labels(platform_name, exc.reason).inc()
        return Reply.json({"error": exc.reason}, status=exc.status)
    try:
        result = platform.parse(bot, wire)
    except WebhookRejected as exc:
        metrics.WEBHOOKS.labels(platform_name, exc.reason).inc()
        await asyncio.shield(_dead_letter(deps, exc.reason, wire.body, exc.detail[:500], dead_letter_key))
        return Reply.json({"error": exc.reason, "detail": exc.detail[:500]}, status=exc.status)
    except Exception as exc:  # a parser bug: an excerpt is kept, the platform told to stop retrying
        log.exception("webhook parser of %s failed", platform_name)
        metrics.WEBHOOKS.labels(platform_name, "parser_error").inc()
        await asyncio.shield(_dead_letter(deps, "parser_error", wire.body, repr(exc)[:500], dead_letter_key))
        return Reply.json({"error": "parser_error"}, status=400)
    if result.messages:
        messages = deps.refusals.screen(bot, result.messages)
        if messages:
            # Shielded: a client that hangs up does not cut the produce short (it retries, and
            # ingest drops the duplicate).
            await asyncio.shield(_produce(deps, messages))
            metrics.child(metrics.INBOUND_ACCEPTED, platform_name).inc(len(messages))
        metrics.child(metrics.WEBHOOKS, platform_name, "accepted").inc()
    else:
        metrics.child(metrics.WEBHOOKS, platform_name, result.ignored or "ignored").inc()
    if result.text is not None:
        return Reply(result.status, result.text.encode(), _TEXT_PLAIN)
    return Reply.json(result.body if result.body is not None else {}, status=result.status)


async def serve_webhook(deps: WebDeps, request: web.BaseRequest, platform_name: str, bot_id: str) -> Reply:
    """One webhook request, from the front or from the app's route: the same steps, the same answer."""
    received = now_ms()
    target = bot_target(deps, platform_name, bot_id, request.method)
    if isinstance(target, Reply):
        return target
    bot, platform = target
    problem = header_problem(request)
    if problem is not None:
        metrics.WEBHOOKS.labels(platform.name, problem).inc()
        return Reply.json({"error": problem}, status=400)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.WEBHOOKS.labels(platform.name, "too_large").inc()
        return Reply.json({"error": "payload too large"}, status=413)
    except RequestPayloadError:  # a body the parser refused (malformed chunks, a bad length)
        metrics.WEBHOOKS.labels(platform.name, "bad_body").inc()
        return Reply.json({"error": "bad_body"}, status=400)
    wire = WebhookRequest(
        headers=request.headers,  # case-insensitive already: `header()` finds any spelling
        body=body,
        query=request.query,
        received_at_ms=received,
        method=request.method,
    )
    return await answer_webhook(deps, bot, platform, wire)


def make_front(deps: WebDeps, *, webhooks: bool) -> Front:
    """What meets every request before the app: webhooks answered here when `webhooks` (the app's
    router and request machinery cost about as much as a filtered message in the pipeline); and,
    either way, the refusals the app would leave uncounted: an `Expect` other than `100-continue`
    on a webhook or handshake path (aiohttp's route answers 417 before any handler), and OneBot
    handshakes whose headers platform code cannot be handed."""

    async def front(request: web.BaseRequest) -> web.StreamResponse | None:
        path = request.path
        if path.startswith(WEBHOOK_PREFIX):
            target = webhook_target(path)
            if target is None:
                return None
            expect = request.headers.get("Expect")
            if expect is not None:
                if expect.lower() == "100-continue":
                    return None  # the app's route says "100 Continue" before it reads the body
                platform = target[0] if target[0] in PLATFORMS else "unknown"
                metrics.WEBHOOKS.labels(platform, "bad_expect").inc()
                return web.json_response({"error": "bad_expect"}, status=417)
            if not webhooks or request.method not in WEBHOOK_METHODS:
                return None
            return (await serve_webhook(deps, request, *target)).response()
        if path.startswith(ONEBOT_WS_PREFIX):
            problem = header_problem(request)
            if problem is None and "Expect" in request.headers:
                problem = "bad_expect"  # a WebSocket handshake has no body to expect
            if problem is not None:
                metrics.CONNECTION_HANDSHAKES.labels("onebot", problem).inc()
                return web.json_response({"error": problem}, status=417 if problem == "bad_expect" else 400)
        return None

    return front


def front_site(runner: GuardedAppRunner, deps: WebDeps, host: str, port: int) -> GuardedSite:
    """A listening site whose webhooks the front answers, and the app the rest."""
    return GuardedSite(runner, host, port, front=make_front(deps, webhooks=True))


async def webhook(request: web.Request) -> web.StreamResponse:
    """The webhook route of the app (with the front on, it sees only what the front leaves)."""
    info = request.match_info
    reply = await serve_webhook(request.app[DEPS], request, info["platform"], info["bot_id"])
    return reply.response()


async def _produce(deps: WebDeps, messages: list[InboundMessage]) -> None:
    if hopstamps.enabled:  # `switchboard bench`'s finer stamps (pipeline/hopstamps.py)
        for m in messages:
            hopstamps.sent(m.hops, "ingest")
    if len(messages) == 1:  # nearly always: no gather (its tasks cost more than the send)
        (message,) = messages
        await deps.produce(IM_INBOUND, message.conversation_key, message.model_dump_json().encode())
        return
    await asyncio.gather(
        *(deps.produce(IM_INBOUND, m.conversation_key, m.model_dump_json().encode()) for m in messages)
    )


async def _dead_letter(deps: WebDeps, reason: str, body: bytes, error: str, key: str) -> None:
    """A body that did not parse: a bounded excerpt, its size and its sha256 (the platform or a
    capture can be matched against the digest), never the whole body."""
    await deps.outputs.dead_letter(
        "ingress",
        reason,
        body[: DEAD_LETTER_EXCERPT_CHARS * 4].decode("utf-8", "replace")[:DEAD_LETTER_EXCERPT_CHARS],
        error=error,
        key=key,
        record_bytes=len(body),
        record_sha256=hashlib.sha256(body).hexdigest(),
    )


async def metrics_view(request: web.Request) -> web.Response:
    settings: Settings = request.app[DEPS].settings
    token = settings.metrics_token
    if not metrics_open(settings) and (
        token is None or not bearer_ok(token.get_secret_value(), request.headers.get("Authorization"))
    ):
        metrics.WEB_REJECTED.labels("metrics", "unauthorized").inc()
        detail = "Authorization: Bearer <SWITCHBOARD_METRICS_TOKEN> is required"
        if token is None:
            detail = "this worker listens beyond loopback and has no SWITCHBOARD_METRICS_TOKEN: set one to scrape"
        return web.json_response(
            {"error": "unauthorized", "detail": detail},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="switchboard metrics"'},
        )
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "instance": INSTANCE_ID})


async def readyz(request: web.Request) -> web.Response:
    deps: WebDeps = request.app[DEPS]
    checks = await deps.ready()
    ok = all(checks.values())
    return web.json_response({"ready": ok, "checks": checks}, status=200 if ok else 503)
