"""WhatsApp Cloud API (Meta's Graph API).

In: the webhook's verification GET (`hub.mode=subscribe`, `hub.verify_token` = the bot's
`verify_token`, answered with `hub.challenge` as plain text), and POSTs signed with
`X-Hub-Signature-256` (`sha256=` and the hex HMAC-SHA256 of the raw body with the app secret),
checked before anything reads the body. `messages` changes for the bot's phone number become
messages: one-to-one chats, and groups where the Groups API delivers their messages (`group_id`).
`statuses` callbacks (sent, delivered, read, failed) never start a turn. Inbound media are the
media's id (`kind: file`), read when the turn goes to the session (`fetch_media`: the id's URL from
`GET /{media-id}`, then its bytes, both with the token, the second through the SSRF guard). While a
turn runs, the message it answers is marked read with the typing indicator (`typing_on`).
Out: `POST /{phone_number_id}/messages` (Bearer token): `text` (WhatsApp's own *bold* _italic_
~strike~ formatting), `image`/`audio`/`video`/`document` by `link` (a URL WhatsApp's servers fetch)
or by the `id` of media uploaded first (`POST /{phone_number_id}/media`, bytes read here through
the SSRF-guarded loader), `reaction` for an answer that is one emoji, and `context.message_id` so
the first message quotes the one it answers. Free-form messages reach a user only within 24 hours of
their last message (the customer-service window); past it WhatsApp wants an approved template,
which an agent's answer is not: such a message is dead-lettered `outside_service_window`, before
any call when the answered message is older than that, or on WhatsApp's error 131047.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from pipeline.platforms._common import (
    InboundParts,
    arr,
    ascii_value,
    attachment_unavailable,
    base_url,
    build_inbound,
    dice_text,
    face_id_str,
    face_text,
    file_name,
    load_failure,
    load_json,
    network_outcome,
    notice,
    obj,
    payload_guard,
    read_capped,
    reply_segment,
    response_json,
    retry_after_header,
    rps_text,
    same_secret,
    verify_guard,
    with_own_file_ids,
)
from pipeline.platforms._richtext import RichText, Span, parse_markdown, pieces_within, render_tree
from pipeline.platforms.base import (
    GuardedFetch,
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
from pipeline.segments.exceptions import MediaUnavailable
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

DEFAULT_API_BASE = "https://graph.facebook.com/v23.0"
MAX_TEXT = 4096  # characters of a text message's body
SERVICE_WINDOW_S = 24 * 3600.0  # free-form messages only this long after the user's last message
# WhatsApp's media ids are numbers: a value of another shape is never passed on.
_MEDIA_ID = re.compile(r"\d{6,32}")
FILE_ID_SHAPES = {"image": _MEDIA_ID, "audio": _MEDIA_ID, "video": _MEDIA_ID, "file": _MEDIA_ID}
# What Meta sends as `hub.challenge` (a number); it is echoed back, so nothing else is.
_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{1,128}")
_BSUID = re.compile(r"[A-Z]{2}\.\d{1,64}")
_SEGMENT_MEDIA = {"image": "image", "audio": "audio", "video": "video", "file": "document"}
_INBOUND_MEDIA = {"image": "image", "video": "video", "audio": "audio", "document": "file", "sticker": "image"}

# Graph API error codes (WhatsApp Cloud API error codes reference).
_OUTSIDE_WINDOW = 131047  # re-engagement: more than 24 hours since the user's last message
_RETRY = {
    4: "rate_limited",  # application request limit
    80007: "rate_limited",  # WABA rate limit
    130429: "rate_limited",  # throughput limit of the phone number
    131056: "rate_limited",  # pair rate limit: too many messages to one user
    131048: "rate_limited",  # spam rate limit
    131000: "server_error",
    131016: "server_error",  # service unavailable
    2: "server_error",
    1: "server_error",
}
_PERMANENT = {
    190: "unauthorized",  # the access token expired or is invalid
    10: "forbidden",
    200: "forbidden",
    131005: "forbidden",
    100: "bad_request",
    131008: "bad_request",
    131009: "bad_request",
    131051: "bad_request",
    131026: "undeliverable",  # not a WhatsApp user, an old client, or terms not accepted
    133010: "not_registered",
    131052: "media_failed",
    131053: "media_failed",
    368: "blocked",
    131031: "blocked",
    131021: "bad_recipient",  # sender and recipient are the same number
}


def service_window_deadline_ms(route: Mapping[str, str]) -> float | None:
    """Until when a free-form message answering the message of `route` can go; None without one."""
    at_ms = route.get("at_ms", "")
    return int(at_ms) + SERVICE_WINDOW_S * 1000 if at_ms.isdigit() else None


class WhatsAppPlatform(Platform):
    name: ClassVar[str] = "whatsapp"
    fetches_media: ClassVar[bool] = True
    required_credentials = ("access_token", "app_secret", "verify_token", "phone_number_id")
    webhook_methods: ClassVar[frozenset[str]] = frozenset({"GET", "POST"})
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "image", "audio", "video", "file", "reply", "face"}),
        max_text_chars=MAX_TEXT,
        # Uploads: images 5 MB, audio and video 16 MB, documents 100 MB; the largest is checked here,
        # WhatsApp refuses the rest (131053), which becomes the notice.
        max_attachment_bytes=100 * 1024 * 1024,
        markdown=True,
        # The pair rate limit: about one message every 6 s to one user, with short bursts (131056
        # beyond it); 80 messages per second per phone number by default (Cloud API throughput).
        default_chat_limit=RateLimit(count=10, per_seconds=60),
        default_bot_limit=RateLimit(count=80, per_seconds=1),
        # WhatsApp has no idempotency key for sends: egress keeps its markers.
        delivers_once=False,
    )

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        if request.method == "GET":
            # The subscription check: only Meta (and the operator) know the verify token.
            token = request.query.get("hub.verify_token")
            if request.query.get("hub.mode") != "subscribe" or not same_secret(token, bot.secret("verify_token") or ""):
                raise WebhookRejected(401, "bad_token", "hub.mode is not subscribe or hub.verify_token differs")
            return
        secret = bot.secret("app_secret")
        if not secret:
            raise WebhookRejected(401, "bad_signature", "no app_secret configured")
        given = ascii_value(request.header("x-hub-signature-256"), "X-Hub-Signature-256")
        expected = "sha256=" + hmac.new(secret.encode(), request.body, hashlib.sha256).hexdigest()
        if not same_secret(given.lower(), expected):
            raise WebhookRejected(401, "bad_signature")

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        if request.method == "GET":
            challenge = request.query.get("hub.challenge", "")
            if not _CHALLENGE.fullmatch(challenge):
                raise WebhookRejected(400, "malformed_payload", "hub.challenge missing or not of Meta's shape")
            return WebhookResult(text=challenge, ignored="url_verification")
        payload = load_json(request.body)
        if not isinstance(payload, dict) or not isinstance(payload.get("entry"), list):
            raise WebhookRejected(400, "malformed_payload", "no entry")
        if payload.get("object") != "whatsapp_business_account":
            return WebhookResult(ignored="not_message")
        phone_number_id = bot.secret("phone_number_id")
        received = request.received_at_ms or now_ms()
        messages: list[InboundMessage] = []
        statuses = False
        for entry in payload["entry"]:
            for change in arr(obj(entry).get("changes")):
                change = obj(change)
                value = obj(change.get("value"))
                if change.get("field") != "messages":
                    continue
                # One app may subscribe several phone numbers to one URL: only this bot's count.
                if obj(value.get("metadata")).get("phone_number_id") != phone_number_id:
                    continue
                statuses = statuses or bool(value.get("statuses"))
                names = {
                    str(c.get(key)): str(obj(c.get("profile")).get("name") or "")
                    for c in arr(value.get("contacts"))
                    if isinstance(c, dict)
                    for key in ("wa_id", "user_id")
                    if c.get(key)
                }
                for item in arr(value.get("messages")):
                    if not isinstance(item, dict):
                        raise WebhookRejected(400, "malformed_payload", "a message is not an object")
                    message = self._message(bot, item, names, received)
                    if message is not None:
                        messages.append(message)
        if messages:
            return WebhookResult(messages=messages)
        return WebhookResult(ignored="status" if statuses else "not_message")

    def _message(
        self, bot: BotConfig, item: dict[str, Any], names: dict[str, str], received: float
    ) -> InboundMessage | None:
        message_id = item.get("id")
        if not isinstance(message_id, str) or not message_id:
            raise WebhookRejected(400, "malformed_payload", "message without id")
        sender = item.get("from") or item.get("from_user_id")
        if not isinstance(sender, str) or not sender:
            raise WebhookRejected(400, "malformed_payload", "message without from")
        group = item.get("group_id")
        in_group = isinstance(group, str) and bool(group)
        kind = item.get("type")
        parts = InboundParts()
        if kind == "text":
            parts.text(str(obj(item.get("text")).get("body") or ""))
        elif kind in _INBOUND_MEDIA:
            media = obj(item.get(kind))
            media_id = media.get("id")
            if not isinstance(media_id, str) or not media_id:
                raise WebhookRejected(400, "malformed_payload", f"{kind} without id")
            parts.add_media(_INBOUND_MEDIA[kind], "file", media_id)
            caption = media.get("caption")
            if isinstance(caption, str) and caption:
                parts.text(" " + caption)
        elif kind == "location":
            place = obj(item.get("location"))
            label = " ".join(str(place.get(k) or "") for k in ("name", "address")).strip()
            parts.text(f"[location: {label} ({place.get('latitude')}, {place.get('longitude')})]")
        elif kind == "interactive":
            answer = obj(item.get("interactive"))
            choice = obj(answer.get("button_reply")) or obj(answer.get("list_reply"))
            parts.text(str(choice.get("title") or ""))
        elif kind == "button":
            parts.text(str(obj(item.get("button")).get("text") or ""))
        else:
            # Reactions, edits, revokes, contacts, system and unsupported messages start no turn.
            return None
        if not parts.segments:
            return None

        mentions_bot = not in_group
        segments, plain = parts.segments, parts.plain
        if in_group and bot.self_id:
            # In a group the bot is addressed by `@<its phone number>` in the text.
            tag = f"@{bot.self_id.lstrip('+')}"
            for segment in segments:
                if segment["type"] == "text" and tag in segment["data"]["text"]:
                    mentions_bot = True
                    segment["data"]["text"] = _without(segment["data"]["text"], tag)
            plain = [_without(p, tag) for p in plain]
            segments = [s for s in segments if s["type"] != "text" or s["data"]["text"]]

        reply_to: ReplyRef | None = None
        context = obj(item.get("context"))
        quoted = context.get("id")
        if isinstance(quoted, str) and quoted:
            author = context.get("from")
            is_bot = isinstance(author, str) and bool(bot.self_id) and author == (bot.self_id or "").lstrip("+")
            reply_to = ReplyRef(message_id=quoted, user_id=author if isinstance(author, str) else None, is_bot=is_bot)
            segments.insert(0, reply_segment(quoted))
        timestamp = item.get("timestamp")
        sent_at = float(timestamp) * 1000 if isinstance(timestamp, str) and timestamp.isdigit() else None
        route = {"at_ms": str(int(min(sent_at or received, received))), "message_id": message_id}
        return build_inbound(
            self.name,
            bot,
            chat_id=group if isinstance(group, str) and in_group else sender,
            chat_type="group" if in_group else "private",
            user_id=sender,
            user_name=names.get(sender, ""),
            message_id=message_id,
            event_id=message_id,  # a wamid is unique: a redelivered webhook carries the same one
            text="".join(plain).strip(),
            segments=segments,
            mentions=[],
            mentions_bot=mentions_bot,
            reply_to=reply_to,
            route=route,
            sent_at_ms=sent_at,
        )

    async def fetch_media(
        self, bot: BotConfig, media: Media, http: httpx.AsyncClient, guarded: GuardedFetch, max_bytes: int
    ) -> bytes:
        """An inbound media id's bytes: `GET /{media-id}` (with the token, for this phone number)
        gives a short-lived URL, its size and its SHA-256; that URL is read with the token too,
        through the SSRF guard (unless it is on the API's own origin, an address the operator set)."""
        if media.kind != "file" or not _MEDIA_ID.fullmatch(media.value):
            raise MediaUnavailable("file_id_shape")
        root = base_url(bot, DEFAULT_API_BASE)
        headers = {"Authorization": f"Bearer {bot.secret('access_token') or ''}"}
        try:
            response = await http.get(
                f"{root}/{media.value}",
                params={"phone_number_id": bot.secret("phone_number_id") or ""},
                headers=headers,
            )
        except httpx.TimeoutException:
            raise MediaUnavailable("timeout") from None
        except httpx.HTTPError:
            raise MediaUnavailable("transport_error") from None
        if response.status_code != 200:
            raise MediaUnavailable(f"http_{response.status_code}")
        info = response_json(response) or {}
        url, size, digest = info.get("url"), str(info.get("file_size") or ""), info.get("sha256")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise MediaUnavailable("bad_url")
        if size.isdigit() and int(size) > max_bytes:
            raise MediaUnavailable("too_large")  # not downloaded at all
        if httpx.URL(url).netloc == httpx.URL(root).netloc and httpx.URL(url).scheme == httpx.URL(root).scheme:
            data = await read_capped(http, url, headers, max_bytes)
        else:
            data = await guarded(url, max_bytes, headers)
        if isinstance(digest, str) and digest and hashlib.sha256(data).hexdigest() != digest.lower():
            raise MediaUnavailable("checksum_mismatch")
        return data

    async def typing_on(self, bot: BotConfig, chat_id: str, route: Mapping[str, str], http: httpx.AsyncClient) -> None:
        """WhatsApp's typing indicator: the answered message marked read with `typing_indicator`
        (shown until the answer, or 25 s). A turn answering no particular message shows none."""
        message_id = route.get("message_id")
        if not message_id:
            return
        url = base_url(bot, DEFAULT_API_BASE) + "/" + (bot.secret("phone_number_id") or "") + "/messages"
        body = {
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": message_id,
            "typing_indicator": {"type": "text"},
        }
        headers = {"Authorization": f"Bearer {bot.secret('access_token') or ''}"}
        try:
            await http.post(url, json=body, headers=headers)
        except httpx.HTTPError:
            pass  # best effort: a missing indicator is not worth an error

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        segments = with_own_file_ids(bot, message.segments, FILE_ID_SHAPES)
        answered = message.route.get("message_id") or message.reply_to_message_id
        base: dict[str, Any] = {
            "messaging_product": "whatsapp",
            "recipient_type": "group" if message.chat_type == "group" else "individual",
        }
        if message.chat_type != "group" and _BSUID.fullmatch(message.chat_id):
            base["recipient"] = message.chat_id  # a user known by business-scoped id only
        else:
            base["to"] = message.chat_id
        # The window is the user's; in a group only WhatsApp's own answer (131047) says it closed.
        window = service_window_deadline_ms(message.route) if message.chat_type == "private" else None
        meta: dict[str, Any] = {"window_until_ms": window}

        # An answer that is one emoji, to a message: a reaction on it.
        shown = [s for s in segments if not isinstance(s, ReplySegment)]
        if answered and len(shown) == 1 and isinstance(shown[0], FaceSegment):
            emoji = face_text(bot, face_id_str(shown[0].data.id))
            if len(emoji) <= 4 and not emoji.startswith("["):
                body = {**base, "type": "reaction", "reaction": {"message_id": answered, "emoji": emoji}}
                return [PlatformCall(method="POST", path="/messages", json=body, meta=meta)]

        bodies: list[dict[str, Any]] = []
        rich = RichText()

        def flush() -> None:
            nonlocal rich
            # The formatting marks and link addresses count too: a piece they make too long is cut again.
            for piece in pieces_within(rich, MAX_TEXT, _formatted, MAX_TEXT):
                if piece.strip():
                    bodies.append({"type": "text", "text": {"body": piece, "preview_url": False}})
            rich = RichText()

        for index, segment in enumerate(segments):
            if isinstance(segment, TextSegment):
                rich.append(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                rich.extend(parse_markdown(segment.data.content))
            elif isinstance(segment, MentionSegment):
                rich.append(f"@{segment.data.target}")
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                flush()
                media = segment.data.media
                kind = _SEGMENT_MEDIA[segment.type]
                if media.kind == "url" and media.value.startswith(("https://", "http://")):
                    bodies.append({"type": kind, kind: {"link": media.value}})
                elif media.kind == "file":  # a WhatsApp media id (its shape checked above)
                    bodies.append({"type": kind, kind: {"id": media.value}})
                else:  # bytes read here and uploaded first (send)
                    bodies.append({"type": kind, kind: {}, "_upload": {"media": media, "segment": segment.type}})
            elif isinstance(segment, FaceSegment):
                rich.append(face_text(bot, segment.data.id))
            elif isinstance(segment, ShareSegment):
                title = segment.data.title
                rich.append(f"{title} ({segment.data.url})" if title else segment.data.url)
            elif isinstance(segment, DiceSegment):
                rich.append(dice_text(message.outbound_id, index))
            elif isinstance(segment, RpsSegment):
                rich.append(rps_text(message.outbound_id, index))
            elif isinstance(segment, ForwardSegment):
                rich.append(notice(bot, "forward"))
        flush()

        # The first message quotes the one it answers: in a group, always (who is answered is not
        # obvious there); in a one-to-one chat when the agent asked for it (a reply segment).
        quote = next((s.data.message_id for s in segments if isinstance(s, ReplySegment)), None)
        if quote is None and message.chat_type == "group":
            quote = answered
        calls = []
        for position, body in enumerate(bodies):
            call_meta = dict(meta)
            upload = body.pop("_upload", None)
            full = {**base, **body}
            if position == 0 and quote:
                full["context"] = {"message_id": quote}
            attached: Media | None = None
            if upload is not None:
                attached = upload["media"]
                call_meta["upload"] = body["type"]
                call_meta["segment"] = upload["segment"]
            calls.append(PlatformCall(method="POST", path="/messages", json=full, media=attached, meta=call_meta))
        return calls

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        window = call.meta.get("window_until_ms")
        if isinstance(window, int | float) and now_ms() > window:
            return SendOutcome(
                "permanent",
                reason="outside_service_window",
                detail="more than 24 hours since the user's message: WhatsApp takes only an approved template "
                "message now, which an agent's answer is not",
            )
        root = base_url(bot, DEFAULT_API_BASE) + "/" + (bot.secret("phone_number_id") or "")
        headers = {"Authorization": f"Bearer {bot.secret('access_token') or ''}"}
        body = dict(call.json or {})
        try:
            if call.media is not None:
                uploaded = await self._upload(bot, call, http, load_media, root, headers)
                if isinstance(uploaded, SendOutcome):
                    return uploaded
                kind = str(call.meta["upload"])
                if uploaded is None:  # unreadable: the notice in its place
                    segment_type = str(call.meta.get("segment", "file"))
                    text = attachment_unavailable(bot, segment_type, call.media.kind, "unreadable")
                    body.pop(kind, None)
                    body.update(type="text", text={"body": text})
                else:
                    body[kind] = {"id": uploaded}
            response = await http.post(root + call.path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        return _classify(response)

    async def _upload(
        self,
        bot: BotConfig,
        call: PlatformCall,
        http: httpx.AsyncClient,
        load_media: MediaLoader,
        root: str,
        headers: dict[str, str],
    ) -> str | SendOutcome | None:
        """The media id of the call's media uploaded to WhatsApp; None when it cannot be read."""
        assert call.media is not None
        try:
            data, mime = await load_media(call.media)
        except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
            segment_type = str(call.meta.get("segment", "file"))
            attachment_unavailable(bot, segment_type, call.media.kind, load_failure(exc))
            return None
        mime = mime or "application/octet-stream"
        files = {"file": (file_name(call.media, mime), data, mime)}
        form = {"messaging_product": "whatsapp", "type": mime}
        response = await http.post(root + "/media", data=form, files=files, headers=headers)
        outcome = _classify(response)
        if outcome.status != "delivered":
            return outcome
        media_id = (response_json(response) or {}).get("id")
        if not isinstance(media_id, str) or not media_id:
            return SendOutcome("retry", reason="bad_response", detail="media upload answered without an id")
        return media_id


def _classify(response: httpx.Response) -> SendOutcome:
    data = response_json(response) or {}
    if 200 <= response.status_code < 300 and "error" not in data:
        sent = [m for m in arr(data.get("messages")) if isinstance(m, dict)]
        return SendOutcome("delivered", platform_message_id=str(sent[0].get("id")) if sent else None)
    error = obj(data.get("error"))
    code = error.get("code")
    details = obj(error.get("error_data")).get("details")
    detail = f"HTTP {response.status_code}, code {code}: {error.get('message') or response.text[:200]}"
    if details:
        detail += f" ({str(details)[:300]})"
    if error.get("fbtrace_id"):
        detail += f" (fbtrace {str(error['fbtrace_id'])[:64]})"
    if code == _OUTSIDE_WINDOW:
        return SendOutcome("permanent", reason="outside_service_window", detail=detail)
    if isinstance(code, int) and code in _RETRY:
        # The pair rate limit asks for a pause before the next message to that user.
        pause = retry_after_header(response.headers.get("retry-after"))
        if pause is None and code == 131056:
            pause = 6.0
        return SendOutcome("retry", reason=_RETRY[code], retry_after=pause, detail=detail)
    if response.status_code == 429:
        return SendOutcome(
            "retry",
            reason="rate_limited",
            retry_after=retry_after_header(response.headers.get("retry-after")),
            detail=detail,
        )
    if response.status_code >= 500 or (not data and response.status_code >= 400 and response.status_code != 404):
        return SendOutcome("retry", reason="server_error", detail=detail)
    if isinstance(code, int) and code in _PERMANENT:
        return SendOutcome("permanent", reason=_PERMANENT[code], detail=detail)
    reason = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found"}
    return SendOutcome("permanent", reason=reason.get(response.status_code, "api_error"), detail=detail)


def _without(text: str, tag: str) -> str:
    """`text` without the mention `tag` (and the space after it)."""
    return text.replace(tag + " ", "").replace(tag, "").strip()


def _formatted(piece: RichText) -> str:
    """WhatsApp's own formatting: *bold*, _italic_, ~strike~, `code`, ```pre```; links as `text (url)`."""
    marks = {"bold": "*", "italic": "_", "strike": "~", "code": "`"}

    def wrap(span: Span, inner: str, raw: str) -> str:
        if span.kind in marks and inner.strip():
            mark = marks[span.kind]
            return f"{mark}{inner}{mark}"
        if span.kind == "pre":
            return f"```{raw}```"
        if span.kind == "link" and span.url and span.url != raw:
            return f"{inner} ({span.url})"
        return inner

    return render_tree(piece, lambda text: text, wrap)
