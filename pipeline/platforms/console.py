"""The console platform: the web page at `/console/` is the chat client.

Inbound: `POST /webhooks/console/{bot_id}` with
`{"chat_id","chat_type":"private"|"group","user_id","user_name","text","message_id"?,"mentions"?,"reply_to"?}`
and, when the bot has a `token` credential, `Authorization: Bearer <token>`. An `is_admin` in the
body is accepted and ignored: a console bot's admins are its configured `admins`.
Mentions: each id of `mentions` written `@id` in the text is a mention in its place (the rest come
first, as chips before the text); `@<self_id>` in the text mentions the bot even when `mentions`
does not list it. The answer says whether the message reaches the agent (`addressed`: private, a
trigger of the bot's policy, or a chat command), decided as ingest decides it.
Outbound: delivered messages are kept in Redis per chat (capped) and published, so any worker's
`GET /console/api/messages?chat_id=…` and the live stream see them. Every segment type is native:
the page renders them all. A message carries its `notes` (`corrected`, `refused`) and
`media_rejected` (why each "attachment unavailable" of a reply was refused) when it has any.
"""

from __future__ import annotations

import hmac
import re
import time
from typing import Any, ClassVar, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.addressing import parse_chat_command, trigger_reason
from pipeline.records import InboundMessage, OutboundMessage, conversation_key, new_trace_id, now_ms
from pipeline.segments import SEGMENT_TYPES
from pipeline.segments.models import MentionData, MentionSegment, TextData, TextSegment
from pipeline.settings import BotConfig

from .base import (
    MediaLoader,
    Platform,
    PlatformCall,
    PlatformProfile,
    SendOutcome,
    WebhookRequest,
    WebhookResult,
)
from .exceptions import WebhookRejected


class ConsoleStore(Protocol):
    async def append(
        self, bot_id: str, chat_id: str, message: dict[str, Any], *, message_id: str | None = None
    ) -> int: ...


def bearer_ok(token: str | None, authorization: str | None) -> bool:
    """Whether an `Authorization` header is `Bearer <token>`, compared in constant time (any
    header passes when there is no token)."""
    if token is None:
        return True
    return authorization is not None and hmac.compare_digest(
        authorization.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode()
    )


class ConsoleWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chat_id: str = Field(min_length=1, max_length=200)
    chat_type: str = Field(pattern="^(private|group)$")
    user_id: str = Field(min_length=1, max_length=200)
    user_name: str = Field(default="", max_length=200)
    text: str = Field(max_length=32_000)
    message_id: str | None = Field(default=None, max_length=200)
    mentions: list[str] = Field(default_factory=list, max_length=100)
    reply_to: str | None = None
    # Sent by older pages; ignored. Admins come from the bot's configuration, never from a request.
    is_admin: bool = False


class ConsolePlatform(Platform):
    name: ClassVar[str] = "console"
    required_credentials = ()  # `token`: optional
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset(SEGMENT_TYPES),
        max_text_chars=100_000,
        max_attachment_bytes=20 * 1024 * 1024,
        markdown=True,
        delivers_once=True,
    )
    store: ConsoleStore | None = None  # bound by the worker at start-up

    def bind(self, store: ConsoleStore) -> None:
        self.store = store

    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        if not bearer_ok(bot.secret("token"), request.header("authorization")):
            raise WebhookRejected(401, "bad_signature")

    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        try:
            body = ConsoleWebhook.model_validate_json(request.body)
        except ValidationError as exc:
            raise WebhookRejected(
                400, "malformed", exc.errors(include_url=False, include_input=False)[0]["msg"]
            ) from None
        chat_type = "group" if body.chat_type == "group" else "private"
        per_user = bot.session_scope == "user" and chat_type == "group"
        text = body.text
        mentions = list(dict.fromkeys(body.mentions))
        # `"@" in text` first: most messages mention nobody, and the pattern costs more than the test.
        if bot.self_id and bot.self_id not in mentions and "@" in text and _mention_pattern([bot.self_id]).search(text):
            mentions.append(bot.self_id)
        # One validation of plain data (in pydantic's core) rather than a model built per field.
        message = InboundMessage.model_validate(
            {
                "platform": self.name,
                "bot_id": bot.bot_id,
                "chat_id": body.chat_id,
                "chat_type": chat_type,
                "sender": {"user_id": body.user_id, "name": body.user_name},
                "message_id": body.message_id or new_trace_id(),
                "text": text,
                "segments": mention_segments(text, mentions)
                if mentions
                else [{"type": "text", "data": {"text": text}}],
                "mentions": mentions,
                "mentions_bot": bot.self_id is not None and bot.self_id in mentions,
                "reply_to": {"message_id": body.reply_to, "is_bot": body.reply_to.startswith("out-")}
                if body.reply_to
                else None,
                "conversation_key": conversation_key(
                    self.name, bot.bot_id, body.chat_id, body.user_id if per_user else None
                ),
                "trace_id": new_trace_id(),
                "sent_at_ms": now_ms(),
                "hops": {"ingress": request.received_at_ms or now_ms()},
            }
        )
        addressed = parse_chat_command(body.text) is not None or trigger_reason(message, bot) is not None
        return WebhookResult(
            messages=[message], body={"ok": True, "message_id": message.message_id, "addressed": addressed}
        )

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        payload: dict[str, Any] = {
            "id": message.outbound_id,
            "kind": message.kind,
            "chat_id": message.chat_id,
            "reply_to": message.reply_to_message_id,
            "segments": [s.model_dump(mode="json") for s in message.segments],
            "trace_id": message.trace_id,
            "hops": message.hops,
        }
        if message.notes:
            payload["notes"] = list(message.notes)
        if message.media_rejected:
            payload["media_rejected"] = list(message.media_rejected)
        return [PlatformCall(method="STORE", path=message.chat_id, json=payload)]

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        if self.store is None:
            return SendOutcome("permanent", reason="console_unbound", detail="no console store bound")
        payload = dict(call.json or {})
        payload["delivered_at"] = time.time() * 1000.0
        try:
            # Posted at most once per outbound id: a send cut short by a crash, replayed, is a no-op.
            await self.store.append(bot.bot_id, call.path, payload, message_id=payload["id"])
        except Exception as exc:  # Redis down: retry like any transient platform failure
            return SendOutcome("retry", reason="store_unavailable", detail=type(exc).__name__)
        return SendOutcome("delivered", platform_message_id=payload["id"])


def _mention_pattern(ids: list[str]) -> re.Pattern[str]:
    """`@id` as a word of its own: not inside an address (`me@bot.com`) nor the start of a longer
    id (`@bob` in `@bobby`); a full stop after it ends a sentence. Longest ids first."""
    alternatives = "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True))
    return re.compile(rf"(?<![\w@.])@({alternatives})(?![\w-]|\.\w)")


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": text}}


def mention_segments(text: str, mentions: list[str]) -> list[Any]:
    """The message as segments: each mentioned id written `@id` in the text becomes a mention in
    its place; mentioned ids the text does not contain come first (the page's chips)."""
    if not mentions:
        return [TextSegment(type="text", data=TextData(text=text))]
    pieces: list[Any] = []
    written: set[str] = set()
    at = 0
    for match in _mention_pattern(mentions).finditer(text):
        if match.start() > at:
            pieces.append(TextSegment(type="text", data=TextData(text=text[at : match.start()])))
        pieces.append(MentionSegment(type="mention", data=MentionData(target=match.group(1))))
        written.add(match.group(1))
        at = match.end()
    if at < len(text) or not any(isinstance(p, TextSegment) for p in pieces):
        pieces.append(TextSegment(type="text", data=TextData(text=text[at:])))
    chips = [MentionSegment(type="mention", data=MentionData(target=m)) for m in mentions if m not in written]
    return [*chips, *pieces]
