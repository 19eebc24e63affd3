"""A worker's shared resources and its stage handlers, independent of Faust.

`Runtime` opens Redis, the session client and provisioner, the platform HTTP client, the media
checker and the correction client once, and builds the stage handlers over them. Tests build it
directly against real Redis and the simulator; the Faust app (`pipeline.worker`) drives it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import httpx
from pydantic import BaseModel, SecretStr

from pipeline.connections import Connections, open_connections
from pipeline.errors import ConfigurationError
from pipeline.platforms import Platform, get_platform
from pipeline.platforms.console import ConsolePlatform
from pipeline.platforms.dingtalk import DingTalkPlatform
from pipeline.platforms.onebot import OneBotPlatform
from pipeline.records import InboundMessage
from pipeline.redact import url_passwords
from pipeline.segments import (
    Capabilities,
    CorrectionSettings,
    Corrector,
    LeakAction,
    LeakScanner,
    Media,
    MediaChecker,
    MediaSettings,
    MentionPolicy,
    NoticeCatalog,
    OutputMode,
    ReplyPolicy,
    SafeFetcher,
    TurnContext,
    build_im_prompt,
)
from pipeline.segments.context import Member, RepliedMessage
from pipeline.segments.leaks import MIN_CONFIGURED_SECRET_LENGTH, Secret
from pipeline.session import (
    AnthropicProvisioner,
    ArkOpenAPIProvisioner,
    Provisioner,
    SessionClient,
    StaticPoolProvisioner,
)
from pipeline.settings import BotConfig, Settings
from pipeline.stages.deadlines import ReplyDeadlines
from pipeline.stages.dispatch import DispatchStage
from pipeline.stages.egress import EgressStage
from pipeline.stages.inbound_media import InboundMedia
from pipeline.stages.ingest import IngestStage, member_names
from pipeline.stages.leakguard import LeakGuard
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs, Send
from pipeline.stages.refused_early import EarlyRefusals, RefusalBroadcast
from pipeline.stages.render import FlushNow, RenderStage, budgeted_bot
from pipeline.stages.streams import StreamRegistry
from pipeline.stages.tools import ImTools
from pipeline.state import ContextEntry, State, redis_py_client
from pipeline.web import WebServer, check_worker_settings, exposure_warnings
from pipeline.web.connections import add_connection_routes
from pipeline.web.server import INSTANCE_ID

log = logging.getLogger(__name__)


def _secrets_of(model: BaseModel, where: str) -> Iterator[Secret]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            yield Secret(value.get_secret_value(), f"{where}{name}")
        elif isinstance(value, str):
            # The passwords of URL settings (Redis, Kafka SASL, API bases): the ones the banner and
            # the logs hide (pipeline.redact).
            for password in url_passwords(value):
                yield Secret(password, f"{where}{name} (password in the URL)")


def deployment_secrets(settings: Settings) -> list[Secret]:
    """Every secret of the deployment, named by where it is configured: each bot's credentials and
    secret fields, every secret setting (session, correction and Ark keys, …) and the passwords in
    URL settings (Redis, Kafka). Any bot's output is checked for all of them."""
    secrets = list(_secrets_of(settings, "setting "))
    for bot in settings.bots:
        where = f"bot {bot.platform}/{bot.bot_id}"
        for name, value in bot.credentials.items():
            secrets.append(Secret(value.get_secret_value(), f"{where}, credential '{name}'"))
        secrets.extend(_secrets_of(bot, f"{where}, field "))
    return secrets


def leak_scanner(settings: Settings) -> LeakScanner:
    """The deployment's leak scanner; warns once for each secret too short to match everywhere."""
    scanner = LeakScanner(deployment_secrets(settings))
    for source in scanner.short_secrets:
        log.warning(
            "leak check: %s is shorter than %d characters (after normalisation); it is matched only as "
            "a whole word, not inside other text. Use a longer secret",
            source,
            MIN_CONFIGURED_SECRET_LENGTH,
        )
    return scanner


def reply_policy(bot: BotConfig, settings: Settings, scanner: LeakScanner | None = None) -> ReplyPolicy:
    """The segments contract's per-bot policy. `scanner` holds every secret of the deployment
    (`leak_scanner`); built from `settings` when not given."""
    return ReplyPolicy(
        language=bot.language,
        output_mode=OutputMode.SEGMENTS if bot.output_schema else OutputMode.PLAIN,
        mention_policy=MentionPolicy(bot.mention_policy),
        leak_action=LeakAction.BLOCK if bot.leak_policy == "block" else LeakAction.REDACT,
        leak_scanner=scanner if scanner is not None else LeakScanner(deployment_secrets(settings)),
        notices=NoticeCatalog(bot_overrides={bot.bot_id: {bot.language: dict(bot.notices)}} if bot.notices else {}),
    )


def reply_context(bot: BotConfig, message: InboundMessage, window: list[ContextEntry]) -> TurnContext:
    """The turn context of the prompt. Its members: everyone the message mentions (first, so the
    prompt's member cap never drops them, even when they never spoke in the window), then the
    window's speakers; each with the name the platform or the window gave, to mention them back."""
    names = member_names(message, window)
    replied = None
    if message.reply_to is not None and message.reply_to.user_id:
        author = message.reply_to.user_id
        replied = RepliedMessage(
            message_id=message.reply_to.message_id,
            author_id=author,
            author_name=names.get(author, ""),
            text=message.reply_to.text or "",
        )
    not_members = {message.sender.user_id, bot.self_id}
    ids = [i for i in (*message.mentions, *(e.user_id for e in window)) if i and i not in not_members]
    members = tuple(Member(user_id=i, name=names.get(i, "")) for i in dict.fromkeys(ids))
    return TurnContext(
        bot_id=bot.bot_id,
        platform=bot.platform,
        chat_type=message.chat_type,
        sender_id=message.sender.user_id,
        sender_name=message.sender.name,
        chat_id=message.chat_id,
        replied_to=replied,
        context_members=members,
        bot_self_ids=frozenset({bot.self_id} if bot.self_id else ()),
    )


class Runtime:
    def __init__(
        self,
        settings: Settings,
        send: Send,
        *,
        produce_acked: Send | None = None,
        consuming: Callable[[], bool] | None = None,
    ) -> None:
        self.settings = settings
        # Whether the worker's stages are consuming (the Faust app's first rebalance has ended);
        # a `ready()` check when given.
        self._consuming = consuming
        self._send = send
        self.outputs = Outputs(send)
        self._produce_acked = produce_acked or send
        self.started = False
        self.started_event = asyncio.Event()
        self.web: WebServer | None = None
        self.web_port: int | None = None
        self._deadline_check: asyncio.Task[None] | None = None
        # Set by the worker's app where dispatch and render run together (see `RenderStage._flush`).
        self.flush_now: FlushNow | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        assert s.redis_url, "redis_url is required"
        log.info("event loop: %s", type(asyncio.get_running_loop()).__module__)
        # Two Redis clients, each for what the other cannot do. This one, the stores' (one pipelined
        # connection, pipeline/state/client.py), carries every stage's reads and writes; a blocking
        # command would stall all of them, so the long connections' waits get a redis-py client
        # of their own below. (The web server's console opens its own two, pipeline/web.)
        self.state = State.connect(
            s.redis_url,
            s.redis_prefix,
            mapping_ttl=s.mapping_ttl_seconds,
            dedup_ttl=s.dedup_ttl_seconds,
            replica_wait_ms=s.redis_replica_wait_ms,
        )
        self.notifier = Notifier(s)
        self.session_client = SessionClient(
            api_key=s.session_api_key.get_secret_value() if s.session_api_key else "",
            profile=s.session_profile,
            base_url=s.session_base_url,
            timeout=s.session_timeout_seconds,
            max_connections=s.session_max_connections,
        )
        self.provisioner = self._provisioner()
        self.streams = StreamRegistry(
            self.state.streams,
            self.session_client,
            self.outputs,
            accounts_usage=lambda conversation: budgeted_bot(s, conversation) is not None,
        )
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(30.0, connect=5.0), limits=httpx.Limits(max_connections=200)
        )
        self.fetcher = SafeFetcher()
        self.media = MediaChecker(MediaSettings(media_root=s.media_root, max_bytes=s.media_max_bytes), self.fetcher)
        self.corrector = (
            Corrector(
                CorrectionSettings(
                    endpoint_url=s.correction_base_url.rstrip("/") + "/chat/completions",
                    model=s.correction_model,
                    api_key=s.correction_api_key.get_secret_value() if s.correction_api_key else "",
                    timeout_s=s.correction_timeout_seconds,
                )
            )
            if s.correction_base_url
            else None
        )
        self.leak_scanner = leak_scanner(s)
        self.policies = {(b.platform, b.bot_id): reply_policy(b, s, self.leak_scanner) for b in s.bots}
        self.platforms: dict[str, Platform] = {name: get_platform(name) for name in s.platforms}
        for bot in s.bots:
            for warning in self.platforms[bot.platform].startup_warnings(bot):
                log.warning("%s bot %r: %s", bot.platform, bot.bot_id, warning)
        console = self.platforms.get("console")
        if isinstance(console, ConsolePlatform):
            # Egress appends deliveries through the pipeline's connections; viewers read through
            # the web server's own (pipeline/web).
            console.bind(self.state.console)
        dingtalk = self.platforms.get("dingtalk")
        if isinstance(dingtalk, DingTalkPlatform):
            dingtalk.bind(self.state.redis, self.state.keys)  # each webhook signature taken once
        capabilities = {
            name: Capabilities(
                supported_segment_types=p.profile.native_segments | {"text"},
                max_attachment_bytes=p.profile.max_attachment_bytes,
            )
            for name, p in self.platforms.items()
        }
        self.deadlines = ReplyDeadlines(s, self.state, self.outputs, self.notifier, self.platforms)
        self.inbound_media = InboundMedia(self.platforms, self.http, self._guarded_fetch, s.media_max_bytes)
        # The triggers ingest finds over a turn limit, dropped by this worker's edge as they come in.
        self.refusals = EarlyRefusals()
        self.ingest = IngestStage(s, self.state, self.outputs, self.notifier, self._prompt, refusals=self.refusals)
        self.dispatch = DispatchStage(
            s,
            self.state,
            self.session_client,
            self.provisioner,
            self.streams,
            self.outputs,
            self.notifier,
            typing=self._typing,
            deadlines=self.deadlines,
            media=self.inbound_media.resolve,
        )
        self.render = RenderStage(
            s,
            self.state,
            self.outputs,
            self.notifier,
            self.policies,
            capabilities,
            ImTools(s, self.state.conversations),
            corrector=self.corrector,
            media=self.media,
            deadlines=self.deadlines,
            flush_now=self.flush_now,
        )
        self.egress = EgressStage(
            s,
            self.state.deliveries,
            self.outputs,
            self.http,
            self.load_media,
            leak_guard=LeakGuard(self.leak_scanner, self.notifier),
        )
        # Long connections: waits for actions and their answers block a Redis connection each, so
        # they get a pool of their own (redis-py's) whose socket timeout is above every wait.
        self.blocking_redis = redis_py_client(
            s.redis_url,
            max_connections=s.redis_max_connections,
            decode_responses=True,
            socket_timeout=s.connection_action_timeout_seconds + 10,
            socket_connect_timeout=5,
        )
        self.connections: Connections = open_connections(
            s,
            self.state.redis,
            self.blocking_redis,
            self._send,
            self.outputs,
            holder=INSTANCE_ID,
            refusals=self.refusals,
        )
        onebot = self.platforms.get("onebot")
        if isinstance(onebot, OneBotPlatform):
            onebot.bind(self.connections.router)
        await self.connections.start()
        self.refusal_broadcast = RefusalBroadcast(
            self.refusals, self.state.redis, self.blocking_redis, f"{s.redis_prefix}refused-early"
        )
        self.refusal_broadcast.start()
        # Every worker checks the reply deadlines (a claim gives each due turn to one of them).
        self._deadline_check = (
            asyncio.create_task(self.deadlines.run(), name="reply-deadlines") if self.deadlines.watching else None
        )
        self.started = True
        self.started_event.set()

    async def start_web(self, host: str, port: int) -> int:
        check_worker_settings(self.settings)
        for warning in exposure_warnings(self.settings):
            log.warning("%s", warning)
        self.web = WebServer(
            self.settings,
            produce=self._produce_acked,
            outputs=self.outputs,
            ready=self.ready,
            add_routes=lambda app: add_connection_routes(app, self.connections),
            refusals=self.refusals,
        )
        self.web_port = await self.web.start(host, port)
        return self.web_port

    async def stop(self) -> None:
        if self.web is not None:
            await self.web.stop()  # first: open console streams end at once and never hold the stop
            self.web = None
        if not self.started:
            return
        if self._deadline_check is not None:
            self._deadline_check.cancel()
            await asyncio.gather(self._deadline_check, return_exceptions=True)
        await self.connections.stop()
        await self.refusal_broadcast.stop()
        await self.blocking_redis.aclose()
        await self.streams.close()
        await self.session_client.aclose()
        await self.http.aclose()
        await self.media.aclose()
        await self.ingest.close()  # the moderation hook's client, if a bot has a hook
        if self.corrector is not None:
            await self.corrector.aclose()
        await self.state.redis.aclose()
        self.started = False

    async def ready(self) -> dict[str, bool]:
        """`/readyz`: the runtime started, Redis answers and, in a worker, the stages consume (a
        message accepted now is answered without waiting for the consumer group's join)."""
        checks = {"started": self.started}
        if self._consuming is not None:
            checks["consuming"] = self._consuming()
        try:
            checks["redis"] = (await self.state.redis.execute("PING")) == "PONG" if self.started else False
        except Exception:
            checks["redis"] = False
        return checks

    # -- pieces --------------------------------------------------------------------------------
    def _provisioner(self) -> Provisioner:
        s = self.settings
        if s.session_provisioner == "static":
            return StaticPoolProvisioner(s.session_static_ids)
        if s.session_provisioner == "ark-openapi":
            if not (s.ark_access_key and s.ark_secret_key):
                # `switchboard worker` refuses to start without them (pipeline.preflight); a runtime
                # built in code without a session API (the default profile is Ark) starts, and
                # only creating a session fails, as it would with any other missing credential.
                return _Unprovisioned(
                    "the ark-openapi provisioner needs SWITCHBOARD_ARK_ACCESS_KEY and SWITCHBOARD_ARK_SECRET_KEY"
                )
            return ArkOpenAPIProvisioner(
                access_key=s.ark_access_key.get_secret_value(),
                secret_key=s.ark_secret_key.get_secret_value(),
                endpoint=s.ark_openapi_url or "https://open.volcengineapi.com",
                agent_id=s.session_agent_id,
            )
        return AnthropicProvisioner(
            self.session_client, agent=s.session_agent_id, environment_id=s.session_environment_id
        )

    async def _typing(self, bot: BotConfig, chat_id: str, route: Mapping[str, str]) -> None:
        """Best effort: a platform's "typing…" while the turn runs; never delays or fails a turn."""
        platform = self.platforms.get(bot.platform)
        if platform is None:
            return
        try:
            async with asyncio.timeout(2.0):
                await platform.typing_on(bot, chat_id, route, self.http)
        except Exception:
            log.debug("typing indicator failed for %s", bot.platform, exc_info=True)

    def _prompt(self, bot: BotConfig, message: InboundMessage, window: list[ContextEntry]) -> str | None:
        return build_im_prompt(reply_context(bot, message, window), self.policies[(bot.platform, bot.bot_id)])

    async def _guarded_fetch(self, url: str, max_bytes: int, headers: Mapping[str, str]) -> bytes:
        """Inbound platform media: a GET through the SSRF guard with the platform's headers."""
        return (await self.fetcher.fetch(url, max_bytes, headers)).data

    async def load_media(self, media: Media) -> tuple[bytes, str]:
        """Egress: a media reference's bytes and sniffed type, through the same guards as render."""
        return await self.media.load(media)


class _Unprovisioned:
    """A provisioner whose settings are incomplete: every call says what is missing."""

    def __init__(self, problem: str) -> None:
        self.problem = problem

    async def create_session(self, **params: Any) -> str:
        raise ConfigurationError(self.problem)

    async def delete_session(self, session_id: str) -> None:
        raise ConfigurationError(self.problem)


SendFn = Callable[[str, str | None, bytes], Awaitable[None]]
