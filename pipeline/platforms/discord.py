"""Discord (Gateway and interactions in, REST API v10 out).

In, over the Gateway (`pipeline.connections.discord`, transport `gateway`): `MESSAGE_CREATE`
dispatch frames go through `parse` like a webhook body. A message in a guild channel is addressed
to the bot when it mentions the bot's user (`<@id>`, `self_id`) or replies to one of its messages;
a DM (no `guild_id`) always is. Messages of bots (this one included) and system messages (joins,
pins) are ignored.
In, the interactions endpoint (webhook): requests signed with Ed25519 (`X-Signature-Ed25519` over
`X-Signature-Timestamp` + body, the application's `public_key`); PING is answered with PONG; a slash
command (type 2) is answered with a deferred response (the user sees "thinking…") and becomes a
message with the command's text (`/name option=value …`). Its reply edits that deferred response
(`PATCH /webhooks/{application}/{token}/messages/@original`), later pieces are follow-ups; the
interaction token in the route is valid for 15 minutes. Other interaction types (components,
autocomplete, modals) are acknowledged and not produced.
Out: `POST /channels/{id}/messages` with `Authorization: Bot <token>`: Discord markdown (native),
`<@id>` mentions, at most 2,000 characters per message (longer text is split), the first piece a
reply (`message_reference`) to the message answered, each with a nonce derived from the outbound
id (`enforce_nonce`: Discord posts a repeat within minutes only once). `allowed_mentions` is always
`{"parse": [], "users": [the mention segments' ids]}`: no text an agent writes pings @everyone,
@here, a role or a user it was not allowed to mention. Media are uploaded as attachments
(multipart: `payload_json` + `files[0]`). Rate limits: the per-route buckets Discord announces
(`X-RateLimit-Bucket`, `-Remaining`, `-Reset-After`) and the global limit are kept per worker; a
send into an exhausted bucket waits without calling Discord, and a 429's `retry_after` (JSON,
seconds) is honoured. 401/403/404 and Discord's permanent error codes (50001 Missing Access, 50013
Missing Permissions, 10003 Unknown Channel, …) are dead-lettered with Discord's message.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from pipeline.platforms._common import (
    InboundParts,
    arr,
    ascii_value,
    attachment_unavailable,
    base_url,
    build_inbound,
    dice_text,
    face_text,
    file_name,
    load_failure,
    load_json,
    media_kind,
    network_outcome,
    notice,
    obj,
    payload_guard,
    reply_segment,
    require_fresh,
    response_json,
    rps_text,
    text_segment,
    verify_guard,
    with_own_file_ids,
)
from pipeline.platforms._richtext import RichText, Span, hug, parse_markdown, pieces_within, render_tree
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
from pipeline.records import OutboundMessage, ReplyRef
from pipeline.segments.models import (
    AudioSegment,
    DiceSegment,
    FaceSegment,
    FileSegment,
    ForwardSegment,
    ImageSegment,
    MarkdownSegment,
    Media,
    MentionSegment,
    ReplySegment,
    RpsSegment,
    ShareSegment,
    TextSegment,
    VideoSegment,
)
from pipeline.settings import BotConfig, RateLimit

DEFAULT_API_BASE = "https://discord.com/api/v10"
MAX_TEXT = 2000
MAX_ATTACHMENT = 10 * 1024 * 1024  # a bot's upload limit in a server without boosts
MAX_ALLOWED_USERS = 100  # Discord refuses `allowed_mentions.users` longer than this

# Message types that are a person talking: DEFAULT and REPLY (the rest are joins, pins, boosts…).
_USER_MESSAGE_TYPES = {0, 19}
# Interaction types and response types.
_PING, _APPLICATION_COMMAND = 1, 2
_PONG, _DEFERRED_CHANNEL_MESSAGE = 1, 5
# Discord's JSON error codes that no retry changes, as bounded reason labels.
_PERMANENT_CODES = {
    10003: "unknown_channel",
    10008: "unknown_message",
    10015: "unknown_webhook",
    10062: "unknown_interaction",
    20001: "bots_cannot_use",
    40005: "request_too_large",
    50001: "missing_access",
    50006: "empty_message",
    50007: "cannot_dm_user",
    50013: "missing_permissions",
    50027: "invalid_webhook_token",  # an interaction token older than 15 minutes
    50035: "invalid_form_body",
    160005: "thread_locked",
}
_STATUS_REASONS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 413: "too_large"}

# Tokens of Discord message content: user (`<@id>`, `<@!id>`), role and channel mentions, custom
# emoji, timestamps.
_TOKEN = re.compile(r"<(@!?|@&|#)(\d{1,20})>|<a?:(\w{1,32}):\d{1,20}>")
_SNOWFLAKE = re.compile(r"\d{1,20}")
# Characters Discord markdown gives a meaning anywhere; and at the start of a line.
_ESCAPE = re.compile(r"([\\*_~`|<>\[\]])")
_LINE_START = re.compile(r"^(\s*)([#>-]|\d+\.)", re.MULTILINE)


class DiscordPlatform(Platform):
    name: ClassVar[str] = "discord"
    required_credentials = ("token",)
    # The interactions endpoint needs the application's public key; the Gateway only the token.
    transports = {"webhook": ("public_key",), "gateway": ()}
    # A Gateway bot's slash commands still come to the interactions endpoint (refused without a
    # public_key, like every unsigned request).
    webhooks_beside = frozenset({"gateway"})
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "mention", "reply", "image", "audio", "video", "file"}),
        max_text_chars=MAX_TEXT,
        max_attachment_bytes=MAX_ATTACHMENT,
        max_caption_chars=MAX_TEXT,
        markdown=True,
        # Create Message: 5 per 5 s per channel; the global limit: 50 requests per second per bot.
        default_chat_limit=RateLimit(count=5, per_seconds=5),
        default_bot_limit=RateLimit(count=50, per_seconds=1),
    )

    def __init__(self) -> None:
        self.limits = RateLimits()

    def settings_problems(self, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
        self_id = entry.get("self_id")
        if not (isinstance(self_id, str | int) and _SNOWFLAKE.fullmatch(str(self_id))):
            # Without it a mention of the bot cannot be told from any other.
            return [("self_id", "required for Discord: the bot's user id (its application id), digits")]
        return []

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        key = bot.secret("public_key")
        if not key:
            raise WebhookRejected(401, "bad_signature", "no public_key configured")
        timestamp = ascii_value(request.header("x-signature-timestamp"), "X-Signature-Timestamp")
        try:
            signature = bytes.fromhex(request.header("x-signature-ed25519") or "")
            public_key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(key))
        except ValueError:
            raise WebhookRejected(
                401, "bad_signature", "signature or public_key is not hex of the right length"
            ) from None
        try:
            public_key.verify(signature, timestamp + request.body)
        except InvalidSignature:
            raise WebhookRejected(401, "bad_signature") from None
        require_fresh(bot, request, timestamp.decode())

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        payload = load_json(request.body)
        if not isinstance(payload, dict):
            raise WebhookRejected(400, "malformed_payload", "not a JSON object")
        if "op" in payload:  # a Gateway frame (only the Gateway transport submits those)
            if payload.get("op") != 0 or payload.get("t") != "MESSAGE_CREATE":
                return WebhookResult(ignored="not_message")
            message = payload.get("d")
            if not isinstance(message, dict):
                raise WebhookRejected(400, "malformed_payload", "MESSAGE_CREATE without d")
            return self._message(bot, message)
        return self._interaction(bot, payload)

    def _message(self, bot: BotConfig, d: dict[str, Any]) -> WebhookResult:
        author = obj(d.get("author"))
        message_id, channel_id, user_id = d.get("id"), d.get("channel_id"), author.get("id")
        if not all(isinstance(v, str) and v for v in (message_id, channel_id, user_id)):
            raise WebhookRejected(400, "malformed_payload", "message without id/channel_id/author.id")
        assert isinstance(message_id, str) and isinstance(channel_id, str) and isinstance(user_id, str)
        if user_id == bot.self_id:
            return WebhookResult(ignored="own_message")
        if author.get("bot") or d.get("webhook_id"):
            return WebhookResult(ignored="bot_or_subtype")
        if d.get("type", 0) not in _USER_MESSAGE_TYPES:
            return WebhookResult(ignored="not_message")
        guild_id = d.get("guild_id")
        names = {str(u["id"]): _display_name(u) for u in arr(d.get("mentions")) if isinstance(u, dict) and "id" in u}
        content = d.get("content")
        parts = _parse_content(content if isinstance(content, str) else "", names)
        for attachment in arr(d.get("attachments")):
            if isinstance(attachment, dict) and isinstance(attachment.get("url"), str):
                parts.add_media(media_kind(str(attachment.get("content_type") or "")), "url", attachment["url"])
        segments, plain, mentions = parts.segments, parts.plain, list(dict.fromkeys(parts.mentions))

        reply_to: ReplyRef | None = None
        reference = obj(d.get("message_reference"))
        referenced = obj(d.get("referenced_message"))
        replied_id = reference.get("message_id") or referenced.get("id")
        if isinstance(replied_id, str) and replied_id:
            replied_author = obj(referenced.get("author")).get("id")
            replied_text = referenced.get("content")
            reply_to = ReplyRef(
                message_id=replied_id,
                user_id=replied_author if isinstance(replied_author, str) else None,
                text=replied_text if isinstance(replied_text, str) and replied_text else None,
                is_bot=bot.self_id is not None and replied_author == bot.self_id,
            )
            segments.insert(0, reply_segment(replied_id))
        mentions_bot = (bot.self_id is not None and bot.self_id in mentions) or (
            reply_to is not None and reply_to.is_bot
        )
        route = {"guild_id": guild_id} if isinstance(guild_id, str) and guild_id else {}
        inbound = build_inbound(
            self.name,
            bot,
            chat_id=channel_id,
            chat_type="group" if route else "private",
            user_id=user_id,
            user_name=_display_name(author, obj(d.get("member"))),
            message_id=message_id,
            text="".join(plain).strip(),
            segments=segments,
            mentions=mentions,
            mention_names=names,
            mentions_bot=mentions_bot,
            reply_to=reply_to,
            route=route,
            sent_at_ms=_timestamp_ms(d.get("timestamp")),
        )
        return WebhookResult(messages=[inbound])

    def _interaction(self, bot: BotConfig, payload: dict[str, Any]) -> WebhookResult:
        kind = payload.get("type")
        if kind == _PING:
            return WebhookResult(body={"type": _PONG}, ignored="ping")
        if not isinstance(kind, int) or isinstance(kind, bool):
            raise WebhookRejected(400, "malformed_payload", "interaction without type")
        if kind != _APPLICATION_COMMAND:
            # Components, autocomplete, modals: nothing the agent is asked; acknowledged (deferred).
            return WebhookResult(
                body={"type": 6 if kind in (3, 5) else _DEFERRED_CHANNEL_MESSAGE}, ignored="not_message"
            )
        interaction_id, token, application_id, channel_id = (
            payload.get("id"),
            payload.get("token"),
            payload.get("application_id"),
            payload.get("channel_id") or obj(payload.get("channel")).get("id"),
        )
        member = obj(payload.get("member"))
        user = obj(member.get("user")) or obj(payload.get("user"))
        user_id = user.get("id")
        fields = (interaction_id, token, application_id, channel_id, user_id)
        if not all(isinstance(v, str) and v for v in fields):
            raise WebhookRejected(400, "malformed_payload", "command without id/token/application_id/channel/user")
        data = obj(payload.get("data"))
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise WebhookRejected(400, "malformed_payload", "command without data.name")
        text = _command_text(name, arr(data.get("options")))
        guild_id = payload.get("guild_id")
        route = {"interaction_token": str(token), "application_id": str(application_id)}
        if isinstance(guild_id, str) and guild_id:
            route["guild_id"] = guild_id
        inbound = build_inbound(
            self.name,
            bot,
            chat_id=str(channel_id),
            chat_type="group" if "guild_id" in route else "private",
            user_id=str(user_id),
            user_name=_display_name(user, member),
            message_id=str(interaction_id),
            text=text,
            segments=[text_segment(text)],
            mentions=[],
            # A slash command is addressed to this application by construction.
            mentions_bot=True,
            route=route,
        )
        return WebhookResult(messages=[inbound], body={"type": _DEFERRED_CHANNEL_MESSAGE})

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        reply_to = message.reply_to_message_id
        users: list[str] = []
        for segment in message.segments:
            if isinstance(segment, ReplySegment):
                reply_to = segment.data.message_id
            elif isinstance(segment, MentionSegment) and _SNOWFLAKE.fullmatch(segment.data.target):
                if segment.data.target not in users:
                    users.append(segment.data.target)
        allowed = {"parse": [], "users": users[:MAX_ALLOWED_USERS], "replied_user": False}
        interaction = message.route.get("interaction_token")
        calls: list[PlatformCall] = []
        rich = RichText()

        def add(body: dict[str, Any], media: Media | None = None, segment_type: str = "") -> None:
            body["allowed_mentions"] = allowed
            if interaction:  # the first message edits the deferred response, the rest follow up
                app = message.route.get("application_id", "")
                edit = not calls
                path = f"/webhooks/{app}/{interaction}" + ("/messages/@original" if edit else "")
                method = "PATCH" if edit else "POST"
            else:
                if not calls and reply_to:
                    body["message_reference"] = {"message_id": reply_to, "fail_if_not_exists": False}
                # Discord creates one message per nonce within a few minutes: a send repeated after
                # a crash between Discord's answer and egress's marker returns the first message.
                body["nonce"] = _nonce(message.outbound_id, len(calls))
                body["enforce_nonce"] = True
                path, method = f"/channels/{message.chat_id}/messages", "POST"
            meta = {"segment": segment_type} if media is not None else {}
            calls.append(
                PlatformCall(method=method, path=path, json=body, media=media, media_field="files[0]", meta=meta)
            )

        def flush() -> None:
            nonlocal rich
            for text in pieces_within(rich, MAX_TEXT, to_discord_markdown, MAX_TEXT):
                add({"content": text})
            rich = RichText()

        for index, segment in enumerate(with_own_file_ids(bot, message.segments, {})):
            if isinstance(segment, TextSegment):
                rich.append(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                rich.extend(parse_markdown(segment.data.content))
            elif isinstance(segment, MentionSegment):
                rich.append(f"@{segment.data.target}", "mention", user=segment.data.target)
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                flush()  # `kind: file` was replaced by the notice above: Discord has no reusable file ids
                add({"content": ""}, segment.data.media, segment.type)
            elif isinstance(segment, DiceSegment):
                rich.append(dice_text(message.outbound_id, index))
            elif isinstance(segment, RpsSegment):
                rich.append(rps_text(message.outbound_id, index))
            elif isinstance(segment, FaceSegment):
                rich.append(face_text(bot, segment.data.id))
            elif isinstance(segment, ShareSegment):
                rich.append(segment.data.title or segment.data.url, "link", url=segment.data.url)
            elif isinstance(segment, ForwardSegment):
                rich.append(notice(bot, "forward"))
        flush()
        return calls

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        route = self.limits.route(bot, call)
        wait = self.limits.wait(route)
        if wait > 0:  # the bucket is empty until its reset: Discord would answer 429
            return SendOutcome("retry", reason="rate_limited", retry_after=wait, detail="bucket exhausted")
        headers = {"Authorization": f"Bot {bot.secret('token') or ''}"}
        body = dict(call.json or {})
        url = base_url(bot, DEFAULT_API_BASE) + call.path
        try:
            if call.media is not None:
                try:
                    data, mime = await load_media(call.media)
                except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
                    segment_type = str(call.meta.get("segment", "file"))
                    body["content"] = attachment_unavailable(bot, segment_type, call.media.kind, load_failure(exc))
                    response = await http.request(call.method, url, json=body, headers=headers)
                else:
                    name = file_name(call.media, mime)
                    body["attachments"] = [{"id": 0, "filename": name}]
                    response = await http.request(
                        call.method,
                        url,
                        data={"payload_json": json.dumps(body)},
                        files={"files[0]": (name, data, mime or "application/octet-stream")},
                        headers=headers,
                    )
            else:
                response = await http.request(call.method, url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        self.limits.update(route, response)
        return _classify(response)

    async def typing(self, bot: BotConfig, chat_id: str, http: httpx.AsyncClient) -> None:
        url = f"{base_url(bot, DEFAULT_API_BASE)}/channels/{chat_id}/typing"
        try:
            await http.post(url, headers={"Authorization": f"Bot {bot.secret('token') or ''}"})
        except httpx.HTTPError:
            pass  # a typing indicator is a courtesy


# --- rate limits -----------------------------------------------------------------------------------


@dataclass
class _Bucket:
    remaining: int = 1
    reset_at: float = 0.0  # time.monotonic()


@dataclass
class RateLimits:
    """Discord's rate limits as its headers announce them, in this worker's memory: which bucket
    each route is in (`X-RateLimit-Bucket`), what is left of it until when, and the bot's global
    limit after a global 429. Buckets are per route and major parameter (the channel, or the
    interaction's webhook). Other workers learn a limit from their own 429s; egress's Redis windows
    (the profile's defaults) keep the whole deployment under the documented limits."""

    buckets_of: dict[str, str] = field(default_factory=dict)  # route → bucket id
    buckets: dict[str, _Bucket] = field(default_factory=dict)  # bucket id + major parameter → state
    global_until: dict[str, float] = field(default_factory=dict)  # bot → time.monotonic()

    @staticmethod
    def route(bot: BotConfig, call: PlatformCall) -> tuple[str, str, str]:
        """(bot, route, major parameter) of a call: `/channels/123/messages` → route `POST
        /channels/{}/messages`, major `123`."""
        parts = call.path.strip("/").split("/")
        major = "/".join(parts[:3]) if parts[0] == "webhooks" else "/".join(parts[:2])
        template = re.sub(r"/\d{5,}|/webhooks/[^/]+/[^/]+", "/{}", call.path)
        return bot.bot_id, f"{call.method} {template}", major

    def wait(self, route: tuple[str, str, str]) -> float:
        bot, template, major = route
        now = time.monotonic()
        wait = self.global_until.get(bot, 0.0) - now
        bucket_id = self.buckets_of.get(f"{bot} {template}")
        bucket = self.buckets.get(f"{bucket_id} {major}") if bucket_id else None
        if bucket is not None and bucket.remaining <= 0:
            wait = max(wait, bucket.reset_at - now)
        return max(0.0, wait)

    def update(self, route: tuple[str, str, str], response: httpx.Response) -> None:
        bot, template, major = route
        headers = response.headers
        now = time.monotonic()
        if response.status_code == 429:
            body = response_json(response) or {}
            is_global = body.get("global") is True or headers.get("x-ratelimit-global", "").lower() == "true"
            if is_global:
                self.global_until[bot] = now + _retry_after(response, body)
        bucket_id = headers.get("x-ratelimit-bucket")
        if not bucket_id:
            return
        self.buckets_of[f"{bot} {template}"] = bucket_id
        try:
            remaining = int(headers.get("x-ratelimit-remaining", "1"))
            reset_after = float(headers.get("x-ratelimit-reset-after", "0"))
        except ValueError:
            return
        self.buckets[f"{bucket_id} {major}"] = _Bucket(remaining, now + reset_after)


def _retry_after(response: httpx.Response, body: Mapping[str, Any]) -> float:
    """A 429's wait: the body's `retry_after` (seconds, a float), else the `Retry-After` header."""
    value = body.get("retry_after")
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    try:
        return max(0.0, float(response.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


def _classify(response: httpx.Response) -> SendOutcome:
    status = response.status_code
    body = response_json(response) or {}
    if 200 <= status < 300:
        return SendOutcome("delivered", platform_message_id=str(body.get("id") or "") or None)
    message = str(body.get("message") or response.text[:200])
    code = body.get("code")
    detail = f"HTTP {status}, code {code}: {message}"[:500] if code is not None else f"HTTP {status}: {message}"[:500]
    if status == 429:
        return SendOutcome("retry", reason="rate_limited", retry_after=_retry_after(response, body), detail=detail)
    if status >= 500:
        return SendOutcome("retry", reason="server_error", detail=detail)
    reason = _PERMANENT_CODES.get(code) if isinstance(code, int) else None
    return SendOutcome("permanent", reason=reason or _STATUS_REASONS.get(status, "api_error"), detail=detail)


# --- text ------------------------------------------------------------------------------------------


def escape_markdown(text: str) -> str:
    """Plain text shown as written: Discord's markdown characters escaped with a backslash."""
    return _LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), _ESCAPE.sub(r"\\\1", text))


def to_discord_markdown(rich: RichText) -> str:
    """Discord markdown. Markers hug non-space characters, so whitespace is moved outside."""
    markers = {"bold": "**", "italic": "*", "strike": "~~"}

    def wrap(span: Span, inner: str, raw: str) -> str:
        if span.kind == "mention":
            return f"<@{span.user}>" if span.user and _SNOWFLAKE.fullmatch(span.user) else inner
        if span.kind == "link" and span.url:
            url = span.url.replace(")", "%29").replace(" ", "%20")
            return f"[{inner}]({url})" if raw and raw != span.url else url
        if span.kind == "pre":
            fence = "```"
            body = raw.replace("```", "`\u200b``")
            return f"{fence}{span.language or ''}\n{body}\n{fence}"
        if span.kind == "code":
            ticks = "``" if "`" in raw else "`"
            return f"{ticks} {raw} {ticks}" if ticks == "``" else f"`{raw}`"
        return hug(inner, markers.get(span.kind, ""))

    return render_tree(rich, escape_markdown, wrap)


def _nonce(outbound_id: str, index: int) -> str:
    """A stable nonce per message of an outbound record (Discord takes at most 25 characters)."""
    return hashlib.sha256(f"{outbound_id}:{index}".encode()).hexdigest()[:25]


def _display_name(user: Mapping[str, Any], member: Mapping[str, Any] | None = None) -> str:
    for value in ((member or {}).get("nick"), user.get("global_name"), user.get("username")):
        if isinstance(value, str) and value:
            return value
    return ""


def _parse_content(text: str, names: dict[str, str]) -> InboundParts:
    """Discord message content into segments: user mentions as mention segments; role and channel
    mentions and custom emoji as readable text."""
    parts = InboundParts()
    pos = 0
    for match in _TOKEN.finditer(text):
        parts.text(text[pos : match.start()])
        pos = match.end()
        sigil, ident, emoji = match.groups()
        if emoji is not None:
            parts.text(f":{emoji}:")
        elif sigil in ("@", "@!"):
            parts.add_mention(ident, names.get(ident) or ident)
        elif sigil == "@&":
            parts.text(f"@role:{ident}")
        else:
            parts.text(f"#channel:{ident}")
    parts.text(text[pos:])
    return parts


def _command_text(name: str, options: list[Any]) -> str:
    """`/name sub option=value …` from a command's (possibly nested) options."""
    words = [f"/{name}"]
    for option in options:
        if not isinstance(option, dict) or not isinstance(option.get("name"), str):
            continue
        if "value" in option:
            words.append(f"{option['name']}={option['value']}")
        else:  # a subcommand or group: its name, then its own options
            words.append(_command_text(option["name"], arr(option.get("options")))[1:])
    return " ".join(words)


def _timestamp_ms(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp() * 1000
    except ValueError:
        return None
