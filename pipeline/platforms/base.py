"""The small interface every platform module implements.

A platform: verifies a webhook, parses it into `InboundMessage`s, renders validated segments into
its wire-format calls within its capabilities (pure), and sends one call with its API, saying
whether it was delivered, should be retried (and when), or failed for good.
Rate limits, retries, idempotency and dead letters belong to the egress stage, not here.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import httpx

from pipeline.records import InboundMessage, OutboundMessage
from pipeline.segments import Media
from pipeline.segments.exceptions import MediaUnavailable
from pipeline.settings import BotConfig, RateLimit

from .exceptions import WebhookRejected

__all__ = [
    "GuardedFetch",
    "MediaLoader",
    "Platform",
    "PlatformCall",
    "PlatformProfile",
    "SendOutcome",
    "WebhookRejected",
    "WebhookRequest",
    "WebhookResult",
]


@dataclass(frozen=True)
class WebhookRequest:
    # Looked up by lower-cased name: lower-cased keys, or a case-insensitive mapping (aiohttp's).
    headers: Mapping[str, str]
    body: bytes
    query: Mapping[str, str] = field(default_factory=dict)
    received_at_ms: float = 0.0
    method: str = "POST"

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class WebhookResult:
    """Messages to produce, and what to answer the platform at once."""

    messages: list[InboundMessage] = field(default_factory=list)
    status: int = 200
    body: Any = None  # JSON-serialisable (a URL-verification challenge), or None for `{}`
    # Answered as plain text instead of `body` when set (WeCom: the decrypted echostr, or "").
    text: str | None = None
    # Why nothing was produced, when nothing was (a non-message event, a redelivery): a metric label.
    ignored: str | None = None


@dataclass(frozen=True)
class PlatformProfile:
    """What a platform can show, for rendering and media checks."""

    native_segments: frozenset[str]
    max_text_chars: int
    max_attachment_bytes: int
    max_caption_chars: int = 0
    markdown: bool = False
    default_chat_limit: RateLimit | None = None
    default_bot_limit: RateLimit | None = None
    # The platform itself posts a message at most once per outbound id (egress keeps no markers).
    delivers_once: bool = False
    # Replies to a user message can be sent only for a while after it (`Platform.reply_deadline_ms`):
    # a turn still running shortly before then gets a notice (`pipeline.stages.deadlines`).
    reply_window: bool = False


@dataclass
class PlatformCall:
    """One API call of the platform, ready to send. `media` is loaded at send time."""

    method: str
    path: str
    json: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    media: Media | None = None
    media_field: str | None = None
    # Calls of one outbound message after which a later call needs a result (an upload's key).
    meta: dict[str, Any] = field(default_factory=dict)


SendStatus = Literal["delivered", "retry", "permanent"]


@dataclass
class SendOutcome:
    status: SendStatus
    reason: str = ""  # short, bounded vocabulary: a metric label and dead-letter reason
    retry_after: float | None = None
    platform_message_id: str | None = None
    detail: str = ""  # the platform's error description, for the dead letter (never a metric label)


# Loads a media reference into bytes and a detected MIME type (SSRF-guarded, size-limited).
MediaLoader = Callable[[Media], Awaitable[tuple[bytes, str]]]

# GET a URL through the SSRF guard with these headers (sent to the URL's origin only): at most
# `max_bytes` bytes, or `MediaUnavailable`. What a platform reads its inbound media with.
GuardedFetch = Callable[[str, int, Mapping[str, str]], Awaitable[bytes]]


class Platform(abc.ABC):
    name: ClassVar[str]
    profile: ClassVar[PlatformProfile]
    #: Credentials a bot of this platform must have, checked when the settings load (a worker with
    #: one missing would fail every webhook or send). A tuple entry: at least one of those names.
    required_credentials: ClassVar[tuple[str | tuple[str, ...], ...]] = ()
    #: HTTP methods its webhook takes (WeCom checks its callback URL with a GET); others get a 405.
    webhook_methods: ClassVar[frozenset[str]] = frozenset({"POST"})
    #: The transports a bot of this platform may name (`transport` in the bots file), each with the
    #: credentials it needs beyond `required_credentials`. Every platform takes webhooks; a long
    #: connection (held by one worker at a time, `pipeline.connections`) is offered per platform.
    transports: ClassVar[Mapping[str, tuple[str | tuple[str, ...], ...]]] = {"webhook": ()}
    #: Long-connection transports whose bots still take webhooks (Discord: messages over the
    #: Gateway, slash commands at the interactions endpoint). Default: none, one way in per bot.
    webhooks_beside: ClassVar[frozenset[str]] = frozenset()
    #: Transports on which the platform pushes to routes of its own on every worker, as a webhook
    #: does, with no connection to hold (Matrix `appservice`): no lease, any worker answers.
    pushed_transports: ClassVar[frozenset[str]] = frozenset()
    #: Inbound media of `kind: file` (the platform's own reference) are read by `fetch_media` and
    #: handed to the session as content (`pipeline.stages.inbound_media`). Default: not read.
    fetches_media: ClassVar[bool] = False

    @abc.abstractmethod
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        """Raise `WebhookRejected(401, …)` unless the request is authentic."""

    async def admit(self, bot: BotConfig, request: WebhookRequest) -> None:  # noqa: B027
        """After `verify`, a check of an authentic webhook that needs shared state (DingTalk: a
        signature is taken once). Raise `WebhookRejected` to refuse it. Default: nothing."""

    @abc.abstractmethod
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        """Parse a verified webhook. Raise `WebhookRejected(400, …)` on a malformed payload."""

    @abc.abstractmethod
    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        """Turn validated segments into API calls, within `profile` (pure, no I/O)."""

    @abc.abstractmethod
    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        """Perform one call. Never raises for HTTP or platform errors: classify them instead."""

    def reply_deadline_ms(self, bot: BotConfig, chat_id: str, route: Mapping[str, str]) -> float | None:
        """The last moment (Unix ms) a reply to the user message `route` names can be sent, on a
        platform whose profile has `reply_window`; None where the message sets no such limit (the
        default: replies can go at any time)."""
        return None

    async def typing(self, bot: BotConfig, chat_id: str, http: httpx.AsyncClient) -> None:  # noqa: B027
        """Show that the bot is working, where the platform can. Default: nothing."""

    async def typing_on(self, bot: BotConfig, chat_id: str, route: Mapping[str, str], http: httpx.AsyncClient) -> None:
        """`typing` for a turn answering the user message `route` names (WhatsApp ties its typing
        indicator to that message). Default: `typing`."""
        await self.typing(bot, chat_id, http)

    async def fetch_media(
        self, bot: BotConfig, media: Media, http: httpx.AsyncClient, guarded: GuardedFetch, max_bytes: int
    ) -> bytes:
        """The bytes of one inbound media item of `kind: file`, at most `max_bytes`, on a platform
        with `fetches_media`. Raises `MediaUnavailable` with a reason of `REJECTION_REASONS`."""
        raise MediaUnavailable("unsupported_by_platform")

    def settings_problems(self, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(field, problem) for a bots-file entry whose fields do not fit together (a transport and
        an address of the wrong kind), checked when the settings load. Default: none."""
        return []

    def startup_warnings(self, bot: BotConfig) -> list[str]:
        """What leaves this bot's webhook open, said once when a worker starts. Default: nothing."""
        return []
