"""Telegram Bot API.

In: webhook `Update`s, authenticated by `X-Telegram-Bot-Api-Secret-Token` (the `secret_token` given
to `setWebhook`, credential `webhook_secret`), or the same `Update`s from `getUpdates` long polling
(transport `polling`, `pipeline.connections.telegram`), parsed by the same `parse`. `message`
updates in private chats and groups.
Out: `sendMessage` with `entities` (never `parse_mode`: entities need no escaping, and the agent's
markdown cannot break a message), `sendPhoto`/`sendAudio`/`sendVideo`/`sendDocument` (a URL or a
file_id as is, other media uploaded as multipart), `sendDice`; `reply_parameters` for replies.
Telegram fetches a URL on its own servers, not on the operator's network; when it cannot, the bytes
are fetched here through the SSRF guard and uploaded. A `kind: file` value must have the shape of a
file_id (base64url characters only), never a URL or an `attach://` reference.
Lengths and entity offsets are UTF-16 code units, as Telegram counts them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from pipeline.platforms._common import (
    SegmentData,
    attachment_unavailable,
    base_url,
    build_inbound,
    face_text,
    file_name,
    http_outcome,
    load_failure,
    load_json,
    media_placeholder,
    media_segment,
    mention_segment,
    network_outcome,
    notice,
    obj,
    payload_guard,
    reply_segment,
    response_json,
    rps_text,
    same_secret,
    text_segment,
    verify_guard,
    with_own_file_ids,
)
from pipeline.platforms._richtext import (
    RichText,
    parse_markdown,
    split_rich,
    to_telegram_entities,
    utf16_len,
    utf16_slice,
)
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
    MentionSegment,
    ReplySegment,
    RpsSegment,
    ShareSegment,
    TextSegment,
    VideoSegment,
)
from pipeline.settings import BotConfig, RateLimit

DEFAULT_API_BASE = "https://api.telegram.org"
MAX_TEXT = 4096
MAX_CAPTION = 1024
MAX_PHOTO_UPLOAD = 10 * 1024 * 1024  # larger photos go as documents

# A Bot API file_id: base64url characters (`AgACAgIAAxkBAAIB…`); a URL or `attach://…` never matches.
_FILE_ID = re.compile(r"[A-Za-z0-9_-]{8,512}")
FILE_ID_SHAPES = {"image": _FILE_ID, "audio": _FILE_ID, "video": _FILE_ID, "file": _FILE_ID}

# The fields of a Message that carry media, in the order they are read, and their segment types.
_MEDIA_FIELDS = (
    ("photo", "image"),
    ("document", "file"),
    ("audio", "audio"),
    ("voice", "audio"),
    ("video", "video"),
    ("video_note", "video"),
    ("animation", "video"),
)
_MEDIA_KEYS = frozenset(key for key, _ in _MEDIA_FIELDS)

_MEDIA_METHOD = {
    "image": ("/sendPhoto", "photo"),
    "audio": ("/sendAudio", "audio"),
    "video": ("/sendVideo", "video"),
    "file": ("/sendDocument", "document"),
}


class TelegramPlatform(Platform):
    name: ClassVar[str] = "telegram"
    required_credentials = ("token",)
    # `polling`: getUpdates long polling (`pipeline.connections.telegram`), held by one worker.
    # A webhook without `webhook_secret` would take any request from anyone who knows its URL.
    transports = {"webhook": ("webhook_secret",), "polling": ()}
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "mention", "image", "audio", "video", "file", "reply", "dice"}),
        max_text_chars=MAX_TEXT,
        max_attachment_bytes=50 * 1024 * 1024,
        max_caption_chars=MAX_CAPTION,
        markdown=True,
        # Bot API FAQ: no more than 20 messages per minute in one group (1/s in a private chat),
        # about 30 messages per second overall.
        default_chat_limit=RateLimit(count=20, per_seconds=60),
        default_bot_limit=RateLimit(count=30, per_seconds=1),
    )

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        secret = bot.secret("webhook_secret")
        if not secret:  # required for webhook bots; a polling bot takes no unsigned posts either
            raise WebhookRejected(401, "bad_signature", "no webhook_secret configured for this bot")
        if not same_secret(request.header("x-telegram-bot-api-secret-token"), secret):
            raise WebhookRejected(401, "bad_signature")

    def settings_problems(self, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
        if entry.get("transport", "webhook") == "polling":
            return []
        # An entry may be a whole `BotConfig` dumped: only values other than the defaults count.
        given = {"delete_webhook": entry.get("delete_webhook") not in (None, False)}
        given["poll_timeout_seconds"] = entry.get("poll_timeout_seconds") not in (None, 30)
        return [(field, 'applies to transport = "polling" only') for field, set_ in given.items() if set_]

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        update = load_json(request.body)
        if not isinstance(update, dict) or not isinstance(update.get("update_id"), int):
            raise WebhookRejected(400, "malformed_payload", "not an Update (no update_id)")
        msg = update.get("message")
        if msg is None:
            return WebhookResult(ignored="not_message")
        if not isinstance(msg, dict):
            raise WebhookRejected(400, "malformed_payload", "message is not an object")
        chat = msg.get("chat")
        if not isinstance(chat, dict) or not isinstance(chat.get("id"), int):
            raise WebhookRejected(400, "malformed_payload", "message without chat.id")
        if not isinstance(msg.get("message_id"), int):
            raise WebhookRejected(400, "malformed_payload", "message without message_id")
        chat_kind = chat.get("type")
        if chat_kind not in ("private", "group", "supergroup"):
            return WebhookResult(ignored="unsupported_chat")
        author = msg.get("from") if isinstance(msg.get("from"), dict) else None
        if author is None:  # an anonymous admin or a channel speaking in a group
            author = obj(msg.get("sender_chat"))
        author_id = author.get("id")
        if not isinstance(author_id, int):
            raise WebhookRejected(400, "malformed_payload", "message without a sender")
        if bot.self_id is not None and str(author_id) == bot.self_id:
            return WebhookResult(ignored="own_message")

        text = msg.get("text")
        entities = msg.get("entities")
        if text is None:
            text, entities = msg.get("caption"), msg.get("caption_entities")
        text = text if isinstance(text, str) else ""
        entities = [e for e in entities if isinstance(e, dict)] if isinstance(entities, list) else []
        text, segments, mentions, names, mentions_bot = self._text_segments(bot, text, entities)

        plain = [text] if text else []
        # Most messages are text alone: one set test rather than seven look-ups.
        media_fields = _MEDIA_FIELDS if not msg.keys().isdisjoint(_MEDIA_KEYS) else ()
        for media_key, kind in media_fields:
            media = msg.get(media_key)
            if media_key == "photo" and isinstance(media, list) and media:
                media = max(media, key=lambda p: p.get("width", 0) * p.get("height", 0) if isinstance(p, dict) else 0)
            if isinstance(media, dict) and isinstance(media.get("file_id"), str):
                segments.append(media_segment(kind, "file", media["file_id"]))
                plain.append(media_placeholder(kind))
                if media_key == "document" and msg.get("animation"):
                    break  # an animation is also reported as a document
        if not segments and not plain:
            return WebhookResult(ignored="unsupported_message")

        route: dict[str, str] = {}
        thread_id = msg.get("message_thread_id")
        if msg.get("is_topic_message") and isinstance(thread_id, int):
            route["message_thread_id"] = str(thread_id)
        reply_to: ReplyRef | None = None
        parent = msg.get("reply_to_message")
        # In a forum topic every message "replies" to the topic's first message: not a real reply.
        if isinstance(parent, dict) and not (route and parent.get("message_id") == thread_id):
            parent_from = obj(parent.get("from"))
            parent_author = parent_from.get("id")
            reply_to = ReplyRef(
                message_id=str(parent.get("message_id")),
                user_id=str(parent_author) if parent_author is not None else None,
                text=parent.get("text") or parent.get("caption"),
                is_bot=bot.self_id is not None and str(parent_author) == bot.self_id,
            )
            segments.insert(0, reply_segment(reply_to.message_id))

        name = " ".join(str(author.get(k)) for k in ("first_name", "last_name") if author.get(k))
        message = build_inbound(
            self.name,
            bot,
            chat_id=str(chat["id"]),
            chat_type="private" if chat_kind == "private" else "group",
            user_id=str(author_id),
            user_name=name or str(author.get("title") or ""),
            message_id=str(msg["message_id"]),
            event_id=str(update["update_id"]),
            text=" ".join(plain).strip(),
            segments=segments,
            mentions=mentions,
            mention_names=names,
            mentions_bot=mentions_bot,
            reply_to=reply_to,
            route=route,
            sent_at_ms=float(msg["date"]) * 1000 if isinstance(msg.get("date"), int) else None,
        )
        return WebhookResult(messages=[message])

    @staticmethod
    def _text_segments(
        bot: BotConfig, text: str, entities: list[dict[str, Any]]
    ) -> tuple[str, list[SegmentData], list[str], dict[str, str], bool]:
        """The text (a command addressed to this bot without its `@bot` suffix), its segments, the
        mentioned ids with the names Telegram gives, and whether the bot is addressed."""
        username = (bot.username or "").lstrip("@").lower()
        segments: list[SegmentData] = []
        mentions: list[str] = []
        names: dict[str, str] = {}
        mentions_bot = False
        pos = 0  # UTF-16 units
        total = utf16_len(text)
        command, command_end = "", 0  # `/ask` of `/ask@this_bot …`, and where its entity ends

        def add_text(end: int) -> None:
            if end > pos:
                chunk = utf16_slice(text, pos, end - pos)
                if segments and segments[-1]["type"] == "text":  # after a shortened command
                    chunk = segments.pop()["data"]["text"] + chunk
                segments.append(text_segment(chunk))

        for entity in sorted(entities, key=lambda e: e.get("offset", 0)):
            kind, offset, length = entity.get("type"), entity.get("offset"), entity.get("length")
            if not isinstance(offset, int) or not isinstance(length, int) or offset < pos or offset + length > total:
                continue
            label = utf16_slice(text, offset, length)
            if kind == "bot_command" and offset == 0:
                name, at, addressed = label.partition("@")
                if not addressed or addressed.lower() == username:
                    mentions_bot = True
                    if at:  # `/ask@this_bot`: the agent and the command-prefix trigger see `/ask`
                        command, command_end = name, length
                        segments.append(text_segment(name))
                        pos = length
                continue
            if kind == "mention":
                target = label  # `@username`: Telegram links it when the agent writes it back
                if username and label[1:].lower() == username:
                    mentions_bot = True
                    target = bot.self_id or label
            elif kind == "text_mention" and isinstance(entity.get("user"), dict):
                user = entity["user"]
                target = str(user.get("id"))
                mentions_bot = mentions_bot or (bot.self_id is not None and target == bot.self_id)
                full_name = " ".join(str(user[k]) for k in ("first_name", "last_name") if user.get(k))
                names[target] = full_name or label
            else:
                continue
            add_text(offset)
            segments.append(mention_segment(target))
            mentions.append(target)
            pos = offset + length
        add_text(total)
        if command:
            text = command + utf16_slice(text, command_end, total - command_end)
        return text, segments, mentions, names, mentions_bot

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        chat_id = _chat_id(message.chat_id)
        base: dict[str, Any] = {"chat_id": chat_id}
        thread = message.route.get("message_thread_id")
        if thread and thread.isdigit():
            base["message_thread_id"] = int(thread)
        reply_id = message.reply_to_message_id

        # Blocks in order: runs of inline text, media, dice.
        blocks: list[tuple[str, Any]] = []
        rich = RichText()

        def flush() -> None:
            nonlocal rich
            if not rich.is_blank():
                blocks.append(("text", rich))
            rich = RichText()

        for index, segment in enumerate(with_own_file_ids(bot, message.segments, FILE_ID_SHAPES)):
            if isinstance(segment, TextSegment):
                rich.append(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                rich.extend(parse_markdown(segment.data.content))
            elif isinstance(segment, MentionSegment):
                target = segment.data.target
                if target.lstrip("-").isdigit():
                    rich.append(f"@{target}", "mention", user=target)
                else:  # an @username: Telegram links it itself
                    rich.append(target if target.startswith("@") else f"@{target}")
            elif isinstance(segment, ReplySegment):
                reply_id = reply_id or segment.data.message_id
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                flush()
                blocks.append(("media", segment))
            elif isinstance(segment, DiceSegment):
                flush()
                blocks.append(("dice", None))
            elif isinstance(segment, RpsSegment):
                rich.append(rps_text(message.outbound_id, index))
            elif isinstance(segment, FaceSegment):
                rich.append(face_text(bot, segment.data.id))
            elif isinstance(segment, ShareSegment):
                rich.append(segment.data.title or segment.data.url, "link", url=segment.data.url)
            elif isinstance(segment, ForwardSegment):
                rich.append(notice(bot, "forward"))
        flush()

        calls: list[PlatformCall] = []

        def add(path: str, payload: dict[str, Any], **extra: Any) -> None:
            nonlocal reply_id
            body = {**base, **payload}
            if reply_id and reply_id.isdigit():
                # Sent even if the quoted message is gone: a lost quote must not lose the reply.
                body["reply_parameters"] = {"message_id": int(reply_id), "allow_sending_without_reply": True}
                reply_id = None
            calls.append(PlatformCall(method="POST", path=path, json=body, **extra))

        i = 0
        while i < len(blocks):
            kind, value = blocks[i]
            if kind == "text":
                for piece in split_rich(value, MAX_TEXT, utf16=True):
                    add("/sendMessage", _text_payload("text", "entities", piece))
            elif kind == "dice":
                add("/sendDice", {"emoji": "🎲"})
            else:
                path, field = _MEDIA_METHOD[value.type]
                payload: dict[str, Any] = {}
                # The text right after a media item becomes its caption when it fits: same order.
                if i + 1 < len(blocks) and blocks[i + 1][0] == "text":
                    caption = blocks[i + 1][1]
                    pieces = split_rich(caption, MAX_CAPTION, utf16=True)
                    if len(pieces) == 1:
                        payload = _text_payload("caption", "caption_entities", pieces[0])
                        i += 1
                add(path, payload, media=value.data.media, media_field=field, meta={"segment": value.type})
            i += 1
        return calls

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        token = bot.secret("token") or ""
        root = f"{base_url(bot, DEFAULT_API_BASE)}/bot{token}"
        payload = dict(call.json or {})
        media, field = call.media, call.media_field
        if media is None or not field:
            return await _post(http, root + call.path, token, json_body=payload)
        if media.kind in ("url", "file"):
            # Telegram fetches a URL itself and knows its file_ids: nothing to upload.
            outcome = await _post(http, root + call.path, token, json_body={**payload, field: media.value})
            if not (media.kind == "url" and outcome.reason == "bad_request" and _fetch_failed(outcome.detail)):
                return outcome
            # Telegram could not fetch the URL (size limit, its fetcher blocked): upload it ourselves.
        try:
            data, mime = await load_media(media)
        except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
            segment_type = str(call.meta.get("segment", "file"))
            text = attachment_unavailable(bot, segment_type, media.kind, load_failure(exc))
            # The caption stays, after the notice (its entities shifted past it).
            caption, entities = payload.pop("caption", None), payload.pop("caption_entities", None)
            if caption:
                text += "\n"
                if entities:
                    shift = utf16_len(text)
                    payload["entities"] = [{**e, "offset": e["offset"] + shift} for e in entities]
                text += caption
            payload["text"] = text
            return await _post(http, root + "/sendMessage", token, json_body=payload)
        path = call.path
        if field == "photo" and len(data) > MAX_PHOTO_UPLOAD:
            path, field = "/sendDocument", "document"
        form = {k: v if isinstance(v, str) else json.dumps(v) for k, v in payload.items()}
        files = {field: (file_name(media, mime), data, mime or "application/octet-stream")}
        return await _post(http, root + path, token, form=form, files=files)

    async def typing(self, bot: BotConfig, chat_id: str, http: httpx.AsyncClient) -> None:
        url = f"{base_url(bot, DEFAULT_API_BASE)}/bot{bot.secret('token') or ''}/sendChatAction"
        try:
            await http.post(url, json={"chat_id": _chat_id(chat_id), "action": "typing"})
        except httpx.HTTPError:
            pass  # best effort: a missing typing indicator is not worth an error


async def _post(
    http: httpx.AsyncClient,
    url: str,
    token: str,
    *,
    json_body: dict[str, Any] | None = None,
    form: dict[str, str] | None = None,
    files: dict[str, tuple[str, bytes, str]] | None = None,
) -> SendOutcome:
    try:
        if files is not None:
            response = await http.post(url, data=form, files=files)
        else:
            response = await http.post(url, json=json_body)
    except httpx.HTTPError as exc:
        outcome = network_outcome(exc)
        if token:  # the token is part of the URL: keep it out of dead letters
            outcome.detail = outcome.detail.replace(token, "<token>")
        return outcome
    return _outcome(response)


def _fetch_failed(description: str) -> bool:
    lowered = description.lower()
    return "http url" in lowered or "url content" in lowered or "web page" in lowered


def _chat_id(chat_id: str) -> int | str:
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def _text_payload(text_key: str, entities_key: str, piece: RichText) -> dict[str, Any]:
    payload: dict[str, Any] = {text_key: piece.text}
    entities = to_telegram_entities(piece)
    if entities:
        payload[entities_key] = entities
    return payload


def _outcome(response: httpx.Response) -> SendOutcome:
    data = response_json(response)
    if data is None:
        return http_outcome(response) or SendOutcome(
            "permanent", reason="bad_response", detail=f"HTTP {response.status_code}: {response.text[:200]}"
        )
    if data.get("ok") is True:
        result = data.get("result")
        message_id = result.get("message_id") if isinstance(result, dict) else None
        return SendOutcome("delivered", platform_message_id=str(message_id) if message_id is not None else None)
    code: int = data["error_code"] if isinstance(data.get("error_code"), int) else response.status_code
    description = str(data.get("description") or "")
    params = obj(data.get("parameters"))
    lowered = description.lower()
    if code == 429 or "retry_after" in params:
        retry_after = params.get("retry_after")
        return SendOutcome(
            "retry",
            reason="rate_limited",
            retry_after=float(retry_after) if isinstance(retry_after, int | float) else None,
            detail=description,
        )
    if code >= 500:
        return SendOutcome("retry", reason="server_error", detail=description)
    if "migrate_to_chat_id" in params:
        return SendOutcome(
            "permanent", reason="chat_migrated", detail=f"{description} (to {params['migrate_to_chat_id']})"
        )
    if code == 403:
        reason = "blocked" if "blocked" in lowered or "deactivated" in lowered else "forbidden"
        return SendOutcome("permanent", reason=reason, detail=description)
    if code == 400 and "chat not found" in lowered:
        return SendOutcome("permanent", reason="chat_not_found", detail=description)
    if code in (401, 404):
        return SendOutcome("permanent", reason="unauthorized", detail=description)
    return SendOutcome("permanent", reason="bad_request", detail=description)
