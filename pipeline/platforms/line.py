"""LINE Messaging API.

In: webhooks signed with `X-Line-Signature` (base64 of HMAC-SHA256 of the raw body with the channel
secret), checked before anything reads the body. A webhook carries several events; `message` events
from a user (one-to-one), a group or a room (a multi-person chat without a group) become messages,
every other event (follow, join, postback, unsend…) is ignored. Each event's `webhookEventId` is
its de-duplication id: LINE redelivers an event it saw no 200 for with the same id
(`deliveryContext.isRedelivery`), and ingest drops the copy. Mentions come as
`message.mention.mentionees` (UTF-16 `index`/`length` into the text; `isSelf` marks the bot).
Out: `POST /v2/bot/message/reply` with the event's reply token while it is valid (single use, about
a minute), else `POST /v2/bot/message/push`, which counts against the channel's monthly quota, and
only when the bot allows it (`active_messages`); otherwise the message is dead-lettered with
`reply_token_expired`. A push carries `X-Line-Retry-Key` derived from the outbound id, so LINE
itself refuses to post a retried push twice. Up to 5 message objects per call. Text with mentions
goes as `textV2` with `{name}` substitutions; the first text quotes the user's message
(`quoteToken`). Images pass as HTTPS URLs that LINE's servers fetch (LINE has no upload for
messages). The loading animation (`/v2/bot/chat/loading/start`) is the typing indicator of
one-to-one chats. Chat ids are LINE's own: `U…` users, `C…` groups, `R…` rooms.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from pipeline import metrics
from pipeline.platforms._common import (
    InboundParts,
    arr,
    attachment_unavailable,
    base_url,
    build_inbound,
    dice_text,
    face_text,
    http_outcome,
    load_json,
    network_outcome,
    notice,
    obj,
    payload_guard,
    reply_segment,
    response_json,
    retry_after_header,
    rps_text,
    same_secret,
    verify_guard,
    with_own_file_ids,
)
from pipeline.platforms._richtext import RichText, Span, parse_markdown, render_tree, split_rich, to_plain
from pipeline.platforms.base import (
    MediaLoader,
    Platform,
    PlatformCall,
    PlatformProfile,
    SendOutcome,
    WebhookRequest,
    WebhookResult,
)
from pipeline.platforms.exceptions import WebhookRejected
from pipeline.records import InboundMessage, OutboundMessage, ReplyRef, now_ms
from pipeline.records.models import ChatType
from pipeline.segments.models import (
    AudioSegment,
    DiceSegment,
    FaceSegment,
    FileSegment,
    ForwardSegment,
    ImageSegment,
    MarkdownSegment,
    MentionSegment,
    RpsSegment,
    ShareSegment,
    TextSegment,
    VideoSegment,
)
from pipeline.settings import BotConfig, RateLimit

DEFAULT_API_BASE = "https://api.line.me"
REPLY_PATH = "/v2/bot/message/reply"
PUSH_PATH = "/v2/bot/message/push"
LOADING_PATH = "/v2/bot/chat/loading/start"
MAX_TEXT = 5000  # characters of a text / textV2 message
MAX_MESSAGES_PER_CALL = 5  # message objects in one reply or push
MAX_SUBSTITUTIONS = 100  # textV2
# A reply token must be used within about a minute of the webhook; stop using it a little earlier,
# the request itself takes time.
REPLY_TOKEN_S = 60.0
REPLY_TOKEN_MARGIN_S = 10.0
LOADING_SECONDS = 20  # a multiple of 5, 5 to 60; shown until the answer arrives or this passes

# LINE user, group and room ids: a letter and 32 hex digits.
_USER_ID = re.compile(r"U[0-9a-f]{32}")
_CHAT_ID = re.compile(r"[UCR][0-9a-f]{32}")
_SOURCES: dict[str, tuple[str, ChatType]] = {"user": ("userId", "private"), "group": ("groupId", "group")}
_SOURCES["room"] = ("roomId", "group")
_MEDIA_TYPES = {"image": "image", "video": "video", "audio": "audio", "file": "file"}


def reply_token_deadline_ms(route: Mapping[str, str]) -> float | None:
    """The last moment (Unix ms) egress uses the reply token of `route`; None without one."""
    at_ms = route.get("at_ms", "")
    if not route.get("reply_token") or not at_ms.isdigit():
        return None
    return int(at_ms) + (REPLY_TOKEN_S - REPLY_TOKEN_MARGIN_S) * 1000


def retry_key(outbound_id: str, index: int) -> str:
    """The push's `X-Line-Retry-Key`: a UUID, the same on every replay of the call."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"switchboard:line:{outbound_id}:{index}"))


class LinePlatform(Platform):
    name: ClassVar[str] = "line"
    required_credentials = ("channel_secret", "channel_access_token")
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "mention", "image", "reply"}),
        max_text_chars=MAX_TEXT,
        # LINE fetches an image's URL itself: its limit for an image message's original is 10 MB.
        max_attachment_bytes=10 * 1024 * 1024,
        markdown=False,
        # The Messaging API allows 2,000 requests per second per channel for sending; LINE names no
        # per-chat figure. A modest per-chat pace keeps a runaway turn from flooding one chat.
        default_chat_limit=RateLimit(count=10, per_seconds=1),
        default_bot_limit=RateLimit(count=2000, per_seconds=1),
        # A retried push carries the same X-Line-Retry-Key, but a reply token cannot be checked
        # again: egress keeps its markers.
        delivers_once=False,
        reply_window=True,  # the reply token: single use, about a minute
    )

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        secret = bot.secret("channel_secret")
        if not secret:
            raise WebhookRejected(401, "bad_signature", "no channel_secret configured")
        digest = hmac.new(secret.encode(), request.body, hashlib.sha256).digest()
        if not same_secret(request.header("x-line-signature"), base64.b64encode(digest)):
            raise WebhookRejected(401, "bad_signature")

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        payload = load_json(request.body)
        if not isinstance(payload, dict) or not isinstance(payload.get("events"), list):
            raise WebhookRejected(400, "malformed_payload", "no events")
        # `destination`: the bot's own user id (the channel's), for mentions when self_id is unset.
        destination = payload.get("destination")
        self_ids = {i for i in (bot.self_id, destination) if isinstance(i, str) and i}
        received = request.received_at_ms or now_ms()
        messages = []
        for event in payload["events"]:
            if not isinstance(event, dict):
                raise WebhookRejected(400, "malformed_payload", "an event is not an object")
            if event.get("type") != "message" or event.get("mode") == "standby":
                continue  # standby: another channel (a module) answers this chat
            message = self._message(bot, event, self_ids, received)
            if message is not None:
                messages.append(message)
        # An empty `events` list is LINE's "Verify" button in the console: answered 200, nothing made.
        return WebhookResult(messages=messages, ignored=None if messages else "not_message")

    def _message(
        self, bot: BotConfig, event: dict[str, Any], self_ids: set[str], received: float
    ) -> InboundMessage | None:
        content = event.get("message")
        if not isinstance(content, dict) or not isinstance(content.get("id"), str) or not content["id"]:
            raise WebhookRejected(400, "malformed_payload", "message event without message.id")
        source = event.get("source")
        if not isinstance(source, dict) or source.get("type") not in _SOURCES:
            raise WebhookRejected(400, "malformed_payload", "message event without a user, group or room source")
        id_field, chat_type = _SOURCES[source["type"]]
        chat_id, user_id = source.get(id_field), source.get("userId")
        if not isinstance(chat_id, str) or not chat_id:
            raise WebhookRejected(400, "malformed_payload", f"{source['type']} source without {id_field}")
        if not isinstance(user_id, str) or not user_id:
            user_id = "unknown"  # LINE leaves it out for a group member who has not consented
        if user_id in self_ids:
            return None

        parts = InboundParts()
        mentions_bot = False
        kind = content.get("type")
        if kind == "text":
            mentions_bot = _read_text(parts, str(content.get("text") or ""), content.get("mention"), self_ids)
        elif kind in _MEDIA_TYPES:
            provider = obj(content.get("contentProvider"))
            url = provider.get("originalContentUrl")
            if provider.get("type") == "external" and isinstance(url, str) and url.startswith("https://"):
                parts.add_media(_MEDIA_TYPES[kind], "url", url)
            else:  # LINE's own content, by message id (`/v2/bot/message/{id}/content`)
                parts.add_media(_MEDIA_TYPES[kind], "file", content["id"])
        elif kind == "sticker":
            words = [w for w in arr(content.get("keywords")) if isinstance(w, str)][:3]
            parts.text(f"[sticker{': ' + ', '.join(words) if words else ''}]")
        elif kind == "location":
            place = " ".join(str(content.get(k) or "") for k in ("title", "address")).strip()
            parts.text(f"[location: {place} ({content.get('latitude')}, {content.get('longitude')})]")
        else:
            return None

        reply_to: ReplyRef | None = None
        quoted = content.get("quotedMessageId")
        if isinstance(quoted, str) and quoted:
            reply_to = ReplyRef(message_id=quoted)
            parts.segments.insert(0, reply_segment(quoted))
        timestamp = event.get("timestamp")
        sent_at = float(timestamp) if isinstance(timestamp, int | float) and not isinstance(timestamp, bool) else None
        route = {"at_ms": str(int(min(sent_at or received, received)))}
        token = event.get("replyToken")
        if isinstance(token, str) and token:
            route["reply_token"] = token
        quote_token = content.get("quoteToken")
        if isinstance(quote_token, str) and quote_token:
            route["quote_token"] = quote_token
        event_id = event.get("webhookEventId")
        return build_inbound(
            self.name,
            bot,
            chat_id=chat_id,
            chat_type=chat_type,
            user_id=user_id,
            message_id=content["id"],
            event_id=event_id if isinstance(event_id, str) and event_id else None,
            text="".join(parts.plain).strip(),
            segments=parts.segments,
            mentions=parts.mentions,
            mention_names=parts.names,
            mentions_bot=chat_type == "private" or mentions_bot,
            reply_to=reply_to,
            route=route,
            sent_at_ms=sent_at,
        )

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        objects: list[dict[str, Any]] = []
        rich = RichText()
        group = message.chat_type == "group"

        def flush() -> None:
            nonlocal rich
            for piece in split_rich(rich, MAX_TEXT):
                if not piece.is_blank():
                    objects.append(_text_object(piece))
            rich = RichText()

        for index, segment in enumerate(with_own_file_ids(bot, message.segments, {})):
            if isinstance(segment, TextSegment):
                rich.append(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                rich.extend(parse_markdown(segment.data.content))
            elif isinstance(segment, MentionSegment):
                target = segment.data.target
                # Only group and room members can be mentioned, by their user id.
                if group and _USER_ID.fullmatch(target):
                    rich.append(f"@{target}", "mention", user=target)
                else:
                    rich.append(f"@{target}")
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                media = segment.data.media
                https = media.kind == "url" and media.value.startswith("https://")
                if isinstance(segment, ImageSegment) and https:
                    flush()
                    objects.append({"type": "image", "originalContentUrl": media.value, "previewImageUrl": media.value})
                elif https:
                    # Audio needs its duration and video a preview image, which Switchboard does not
                    # have; files cannot be sent at all: the link, which LINE shows as one.
                    _apart(rich, media.value, "link", url=media.value)
                else:  # LINE has no upload for messages: only a URL its servers fetch can be shown
                    _apart(rich, attachment_unavailable(bot, segment.type, media.kind, "unsupported_by_platform"))
            elif isinstance(segment, ShareSegment):
                title = segment.data.title
                rich.append(f"{title} ({segment.data.url})" if title else segment.data.url)
            elif isinstance(segment, FaceSegment):
                rich.append(face_text(bot, segment.data.id))
            elif isinstance(segment, DiceSegment):
                rich.append(dice_text(message.outbound_id, index))
            elif isinstance(segment, RpsSegment):
                rich.append(rps_text(message.outbound_id, index))
            elif isinstance(segment, ForwardSegment):
                rich.append(notice(bot, "forward"))
            # A reply segment: the first text quotes the user's message (its quote token) instead.
        flush()

        # In a group the answer quotes the message it answers (in a one-to-one chat it is plain).
        quote = message.route.get("quote_token") if group else None
        if quote and (message.reply_to_message_id or any(s.type == "reply" for s in message.segments)):
            first_text = next((o for o in objects if o["type"] in ("text", "textV2")), None)
            if first_text is not None:
                first_text["quoteToken"] = quote

        calls: list[PlatformCall] = []
        deadline = reply_token_deadline_ms(message.route)
        for index in range(0, len(objects), MAX_MESSAGES_PER_CALL):
            batch = objects[index : index + MAX_MESSAGES_PER_CALL]
            meta: dict[str, Any] = {"to": message.chat_id, "retry_key": retry_key(message.outbound_id, len(calls))}
            if index == 0 and deadline is not None:
                # The reply token answers one call only: the first; the rest are pushes.
                meta["reply_until_ms"] = deadline
                body: dict[str, Any] = {"replyToken": message.route["reply_token"], "messages": batch}
                calls.append(PlatformCall(method="POST", path=REPLY_PATH, json=body, meta=meta))
            else:
                if message.route.get("reply_token"):
                    meta["answers"] = "user_message"
                body = {"to": message.chat_id, "messages": batch}
                calls.append(PlatformCall(method="POST", path=PUSH_PATH, json=body, meta=meta))
        return calls

    def reply_deadline_ms(self, bot: BotConfig, chat_id: str, route: Mapping[str, str]) -> float | None:
        """When the reply token of the message `route` names stops being used; None without one."""
        return reply_token_deadline_ms(route)

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        root = base_url(bot, DEFAULT_API_BASE)
        headers = {"Authorization": f"Bearer {bot.secret('channel_access_token') or ''}"}
        path, body = call.path, dict(call.json or {})
        try:
            if path == REPLY_PATH:
                deadline = call.meta.get("reply_until_ms")
                if isinstance(deadline, int | float) and now_ms() <= deadline:
                    outcome = _classify(await http.post(root + REPLY_PATH, json=body, headers=headers))
                    if outcome.reason != "reply_token_invalid":
                        return outcome
                # Expired, or used already (an earlier message of the turn, a notice): push instead.
                if not bot.active_messages:
                    return SendOutcome(
                        "permanent",
                        reason="reply_token_expired",
                        detail="the reply token of the user's message is used or expired (about a minute); "
                        "pushes are off for this bot (active_messages = false)",
                    )
                metrics.NOTICES.labels(self.name, "push_fallback").inc()
                body = {"to": call.meta["to"], "messages": body["messages"]}
            elif not bot.active_messages:
                why = "past the 5 message objects of one reply" if call.meta.get("answers") else "no user message"
                return SendOutcome(
                    "permanent",
                    reason="active_messages_off",
                    detail=f"a push is needed ({why}) and pushes are off for this bot (active_messages = false)",
                )
            push_headers = {**headers, "X-Line-Retry-Key": str(call.meta["retry_key"])}
            return _classify(await http.post(root + PUSH_PATH, json=body, headers=push_headers))
        except httpx.HTTPError as exc:
            return network_outcome(exc)

    async def typing(self, bot: BotConfig, chat_id: str, http: httpx.AsyncClient) -> None:
        if not chat_id.startswith("U"):
            return  # the loading animation exists for one-to-one chats only
        url = base_url(bot, DEFAULT_API_BASE) + LOADING_PATH
        headers = {"Authorization": f"Bearer {bot.secret('channel_access_token') or ''}"}
        try:
            await http.post(url, json={"chatId": chat_id, "loadingSeconds": LOADING_SECONDS}, headers=headers)
        except httpx.HTTPError:
            pass  # best effort


def _classify(response: httpx.Response) -> SendOutcome:
    data = response_json(response) or {}
    text = str(data.get("message") or response.text[:200])
    detail = f"HTTP {response.status_code}: {text}"
    details = [d for d in arr(data.get("details")) if isinstance(d, dict)]
    if details:
        detail += " (" + "; ".join(f"{d.get('property')}: {d.get('message')}" for d in details[:3]) + ")"
    request_id = response.headers.get("x-line-request-id")
    if request_id:
        detail += f" (request {request_id[:64]})"
    if response.status_code == 200:
        sent = [m for m in arr(data.get("sentMessages")) if isinstance(m, dict)]
        return SendOutcome("delivered", platform_message_id=str(sent[0].get("id")) if sent else None)
    if response.status_code == 409 and response.headers.get("x-line-accepted-request-id"):
        # A push with this retry key was accepted before: the message is already in the chat.
        return SendOutcome("delivered", detail=detail)
    if response.status_code == 429 and "monthly limit" in text.lower():
        return SendOutcome("permanent", reason="push_quota", detail=detail)
    early = http_outcome(response)
    if early is not None:
        early.detail = detail
        early.retry_after = early.retry_after or retry_after_header(response.headers.get("retry-after"))
        return early
    if response.status_code == 400 and "reply token" in text.lower():
        return SendOutcome("permanent", reason="reply_token_invalid", detail=detail)
    reason = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 413: "too_large"}
    return SendOutcome("permanent", reason=reason.get(response.status_code, "api_error"), detail=detail)


def _apart(rich: RichText, text: str, kind: Any = None, **attrs: str) -> None:
    """`text` set apart by a space from the text before it (a notice or a link in place of media)."""
    if rich.text and not rich.text[-1].isspace():
        rich.append(" ")
    rich.append(text, kind, **attrs)


def _text_object(piece: RichText) -> dict[str, Any]:
    """A `text` message, or a `textV2` one whose mentions are `{m0}`… substitutions."""
    mentions = [s for s in piece.spans if s.kind == "mention" and s.user]
    if not mentions:
        return {"type": "text", "text": to_plain(piece)}
    substitution: dict[str, Any] = {}
    users: dict[str, str] = {}  # user id → its key, so a user mentioned twice has one key

    def wrap(span: Span, inner: str, raw: str) -> str:
        if span.kind == "mention" and span.user:
            key = users.get(span.user)
            if key is None and len(substitution) < MAX_SUBSTITUTIONS:
                key = users[span.user] = f"m{len(substitution)}"
                substitution[key] = {"type": "mention", "mentionee": {"type": "user", "userId": span.user}}
            if key is not None:
                return "{" + key + "}"
        if span.kind == "link" and span.url and span.url != raw:
            return f"{inner} ({_escape(span.url)})"
        return inner

    # textV2 reads `{…}` as a substitution: the text's own braces are doubled.
    return {"type": "textV2", "text": render_tree(piece, _escape, wrap), "substitution": substitution}


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _read_text(parts: InboundParts, text: str, mention: Any, self_ids: set[str]) -> bool:
    """A text message into segments, its mentionees (UTF-16 `index`/`length`) as mentions; whether
    the bot is one of them. A mention of the bot is left out of the text (it addressed the bot)."""
    spans: list[tuple[int, int, dict[str, Any]]] = []
    for item in arr(obj(mention).get("mentionees")):
        if not isinstance(item, dict):
            continue
        index, length = item.get("index"), item.get("length")
        if isinstance(index, int) and isinstance(length, int) and index >= 0 and length > 0:
            spans.append((index, length, item))
    spans.sort(key=lambda s: s[0])
    units = text.encode("utf-16-le")
    mentions_bot = False
    after_bot = False  # the text right after a mention of the bot: its leading spaces go with it
    pos = 0

    def add_text(value: str) -> None:
        parts.text(value.lstrip() if after_bot else value)

    for index, length, item in spans:
        if index * 2 < pos or (index + length) * 2 > len(units):
            continue  # overlapping or outside the text: not LINE's
        add_text(units[pos : index * 2].decode("utf-16-le", "replace"))
        written = units[index * 2 : (index + length) * 2].decode("utf-16-le", "replace")
        pos = (index + length) * 2
        user = item.get("userId")
        after_bot = item.get("isSelf") is True or (isinstance(user, str) and user in self_ids)
        if after_bot:
            mentions_bot = True
        elif item.get("type") == "user" and isinstance(user, str) and _CHAT_ID.fullmatch(user):
            parts.add_mention(user, written.removeprefix("@"))
        else:  # `@All`, or a member LINE did not name: the text as written
            parts.text(written)
    add_text(units[pos:].decode("utf-16-le", "replace"))
    return mentions_bot
