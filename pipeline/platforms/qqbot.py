"""QQ bot open platform (the official bot API: QQ groups, one-to-one chats, guild channels and
guild direct messages).

In: webhook callbacks signed with Ed25519 (`X-Signature-Ed25519` over `X-Signature-Timestamp` +
body; the key pair comes from a seed made of the bot secret repeated to 32 bytes). Op 13 (callback
URL validation) is answered with `plain_token` and the signature of `event_ts` + `plain_token`.
Events: `GROUP_AT_MESSAGE_CREATE`, `C2C_MESSAGE_CREATE`, `AT_MESSAGE_CREATE` / `MESSAGE_CREATE`
(guild channels) and `DIRECT_MESSAGE_CREATE`. The payload's `id` is the de-duplication id.
Out: an app access token from `getAppAccessToken` (cached per bot until shortly before it expires),
`Authorization: QQBot <token>`; `/v2/groups/{group_openid}/messages`, `/v2/users/{openid}/messages`,
`/channels/{channel_id}/messages`, `/dms/{guild_id}/messages`. Group and one-to-one messages are
passive replies: each carries the user message's `msg_id` and a `msg_seq` derived from the outbound
id and the call's position, so QQ itself refuses a replayed send (code 40054005, taken as delivered).
Images and videos for groups and one-to-one chats are uploaded first (`/v2/…/files`: a URL for QQ
to fetch, other media as `file_data`) and sent as `msg_type` 7 with the `file_info`; in guild
channels an image goes as an `image` URL or a `file_image` upload.
Chat ids carry their scene: `group:<group_openid>`, `c2c:<user_openid>`, `channel:<channel_id>`,
`dm:<guild_id>`.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline import metrics
from pipeline.platforms._common import (
    InboundParts,
    TokenCache,
    arr,
    ascii_value,
    attachment_unavailable,
    base_url,
    build_inbound,
    dice_text,
    face_segment,
    face_text,
    file_name,
    http_outcome,
    load_failure,
    load_json,
    network_outcome,
    notice,
    obj,
    payload_guard,
    reply_segment,
    require_fresh,
    response_json,
    retry_after_header,
    rps_text,
    same_secret,
    verify_guard,
    with_own_file_ids,
)
from pipeline.platforms._richtext import RichText, parse_markdown, split_rich, to_plain
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
from pipeline.records import OutboundMessage, ReplyRef, now_ms
from pipeline.records.models import ChatType
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
    RpsSegment,
    ShareSegment,
    TextSegment,
    VideoSegment,
)
from pipeline.settings import BotConfig, RateLimit

DEFAULT_API_BASE = "https://api.sgroup.qq.com"
DEFAULT_TOKEN_BASE = "https://bots.qq.com"  # `api_base`, when set, serves both
TOKEN_PATH = "/app/getAppAccessToken"
# QQ publishes no length limit for a text message; 2,000 characters keeps well inside what it takes.
MAX_TEXT = 2000
# QQ hands out a new token only in the last 60 s of the old one's life: refreshing earlier would get
# the same token back. 30 s before expiry leaves time for the call that uses it.
TOKEN_MARGIN_S = 30.0

# Passive replies: how long after the user's message, and how many per message (QQ's send docs:
# one-to-one 60 minutes / 5 replies, group 5 minutes / 5 replies, guild channel and DM 5 minutes).
PASSIVE_WINDOW_S = {"group": 300.0, "c2c": 3600.0, "channel": 300.0, "dm": 300.0}
MAX_PASSIVE_REPLIES = {"group": 5, "c2c": 5}
PASSIVE_MARGIN_S = 10.0  # stop a little early: the request itself takes time
_SCENES = ("group", "c2c", "channel", "dm")

# Error codes (QQ's openapi error list and send docs).
_DUPLICATE_SEQ = 40054005  # this msg_id + msg_seq was sent before: the message is already shown
_RATE_LIMITED = {22009, 20028, 1100100, 1100308}
_TOKEN_INVALID = {11241, 11242, 11243, 11244}
_WINDOW_EXPIRED = {304027, 40034005, 40034128, 304103}
_RETRYABLE = {304082, 304083, 11281, 11252, 11263, 306003, 1100300}
_ACCEPTED_FOR_REVIEW = {304023, 304024}  # sent, held for QQ's review: not an error, not resent
_PERMANENT = {
    # Daily quotas of active messages (per channel, per DM user, per bot): no retry helps today.
    304045: "active_quota",
    304049: "active_quota",
    304050: "active_quota",
    304003: "url_not_allowed",
    40054010: "url_not_allowed",
    304020: "file_too_large",
    304026: "reply_target_gone",
    304028: "reply_target_gone",
    304031: "dm_closed",
    304032: "dm_closed",
    40054002: "muted",
    40054003: "not_in_chat",
    1100301: "not_in_chat",
    1100104: "not_in_chat",
    1100101: "content_refused",
    1100103: "content_refused",
    304025: "content_refused",
    11253: "missing_permission",
    11254: "forbidden",
    11265: "bot_banned",
    11251: "unauthorized",
    50006: "bad_request",
    12002: "bad_request",
    50035: "bad_request",
}

# Media a group / one-to-one upload takes (`file_type`): 1 image, 2 video (mp4). Voice (3) must be
# SILK, which an agent's audio is not, and files (4) are not open yet: both get the notice.
_UPLOAD_TYPE = {"image": 1, "video": 2}

# Guild content's inline formats: `<@!123>`/`<@123>` mentions, `<#123>` channels, `<emoji:13>` faces.
_INLINE = re.compile(r"<@!?([A-Za-z0-9_-]{1,128})>|<#([A-Za-z0-9_-]{1,128})>|<emoji:(\d{1,6})>")
_MENTION_TARGET = re.compile(r"[A-Za-z0-9_-]{1,128}")
# What QQ sends as `plain_token` and `event_ts`. Anything else is refused: the answer is a signature
# made with the same key the callbacks are checked with, so answering arbitrary text would sign a
# forged callback (`event_ts` + `plain_token` = timestamp + body).
_PLAIN_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")
_EVENT_TS = re.compile(r"\d{1,20}")


def signing_key(secret: str) -> Ed25519PrivateKey:
    """The key QQ derives from the bot secret: the secret repeated to at least 32 bytes, cut to 32,
    as the Ed25519 seed."""
    seed = secret.encode()
    if not seed:
        raise ValueError("empty bot secret")
    while len(seed) < 32:
        seed *= 2
    return Ed25519PrivateKey.from_private_bytes(seed[:32])


@dataclass(frozen=True)
class _Target:
    scene: str  # group | c2c | channel | dm
    id: str

    @property
    def v2(self) -> bool:
        return self.scene in ("group", "c2c")

    @property
    def messages_path(self) -> str:
        return {
            "group": f"/v2/groups/{self.id}/messages",
            "c2c": f"/v2/users/{self.id}/messages",
            "channel": f"/channels/{self.id}/messages",
            "dm": f"/dms/{self.id}/messages",
        }[self.scene]

    @property
    def files_path(self) -> str:
        return f"/v2/groups/{self.id}/files" if self.scene == "group" else f"/v2/users/{self.id}/files"


def parse_chat_id(chat_id: str) -> _Target:
    scene, _, ident = chat_id.partition(":")
    if scene not in _SCENES or not ident:
        raise ValueError(f"not a qqbot chat id: {chat_id!r} (expected group:/c2c:/channel:/dm: and an id)")
    return _Target(scene, ident)


def passive_deadline_ms(scene: str, route: Mapping[str, str]) -> float | None:
    """The last moment (Unix ms) egress sends a passive reply in `scene` to the message of `route`:
    the scene's window after the message's `at_ms`, less the margin; None without `at_ms`."""
    at_ms = route.get("at_ms", "")
    if not at_ms.isdigit():
        return None
    return int(at_ms) + (PASSIVE_WINDOW_S[scene] - PASSIVE_MARGIN_S) * 1000


def msg_seq(outbound_id: str, index: int) -> int:
    """A stable `msg_seq` for call `index` of an outbound message: the same on every replay, so QQ
    refuses a second send of it; 31 bits, so two calls replying to one message collide with a
    chance of about n²/2³² (n at most 5)."""
    digest = hashlib.sha256(f"{outbound_id}:{index}".encode()).digest()
    return 1 + int.from_bytes(digest[:4], "big") % (2**31 - 2)


class QQBotPlatform(Platform):
    name: ClassVar[str] = "qqbot"
    required_credentials = ("app_id", "app_secret")
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "mention", "image", "video", "reply"}),
        max_text_chars=MAX_TEXT,
        # QQ documents no upload size: a conservative cap.
        max_attachment_bytes=10 * 1024 * 1024,
        markdown=False,
        # Guild channels: 5 messages per second per channel, passive or not; groups and one-to-one
        # chats are bounded by the 5 passive replies per message. Per bot QQ publishes no figure.
        default_chat_limit=RateLimit(count=5, per_seconds=1),
        default_bot_limit=RateLimit(count=20, per_seconds=1),
        # Passive group/one-to-one replies are de-duplicated by QQ (msg_id + msg_seq); guild channel
        # and DM messages and active messages are not: egress keeps its markers.
        delivers_once=False,
        reply_window=True,  # passive replies only within the window after the user's message
    )

    def __init__(self) -> None:
        self._tokens = TokenCache(TOKEN_MARGIN_S)  # keyed by (token URL, app id)
        self._keys: dict[str, Ed25519PrivateKey] = {}  # sha256(secret) → key (derivation is cheap, not free)

    def _key(self, bot: BotConfig) -> Ed25519PrivateKey:
        secret = bot.secret("app_secret") or ""
        cache_key = hashlib.sha256(secret.encode()).hexdigest()
        key = self._keys.get(cache_key)
        if key is None:
            key = self._keys[cache_key] = signing_key(secret)
        return key

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        if not bot.secret("app_secret"):
            raise WebhookRejected(401, "bad_signature", "no app_secret configured")
        app_id = request.header("x-bot-appid")
        if app_id is not None and not same_secret(app_id, bot.secret("app_id") or ""):
            raise WebhookRejected(401, "bad_signature", "X-Bot-Appid is another bot's")
        # Every callback is signed, the URL validation (op 13) too: QQ's SDK (botgo) refuses an
        # unsigned one, and an unsigned request must never reach a topic, not even as a dead letter.
        signature = request.header("x-signature-ed25519")
        timestamp = ascii_value(request.header("x-signature-timestamp"), "X-Signature-Timestamp")
        if not signature or not timestamp:
            raise WebhookRejected(401, "bad_signature", "no X-Signature-Ed25519 / X-Signature-Timestamp")
        try:
            raw = bytes.fromhex(signature)
        except ValueError:
            raise WebhookRejected(401, "bad_signature", "signature is not hex") from None
        if len(raw) != 64 or raw[63] & 224:
            raise WebhookRejected(401, "bad_signature", "signature of the wrong size")
        try:
            self._key(bot).public_key().verify(raw, timestamp + request.body)
        except InvalidSignature:
            raise WebhookRejected(401, "bad_signature") from None
        # Signed, but not a recording: the signature covers the timestamp.
        require_fresh(bot, request, timestamp.decode())

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        payload = load_json(request.body)
        if not isinstance(payload, dict):
            raise WebhookRejected(400, "malformed_payload", "not an object")
        op = payload.get("op")
        if op == 13:
            return self._validation(bot, obj(payload.get("d")))
        if op != 0:
            return WebhookResult(body=_ACK, ignored="not_message")
        kind = payload.get("t")
        scene = _EVENT_SCENES.get(kind) if isinstance(kind, str) else None
        if scene is None:
            return WebhookResult(body=_ACK, ignored="not_message")
        data = payload.get("d")
        if not isinstance(data, dict):
            raise WebhookRejected(400, "malformed_payload", "event without d")
        message_id = data.get("id")
        if not isinstance(message_id, str) or not message_id:
            raise WebhookRejected(400, "malformed_payload", "message without id")
        author = obj(data.get("author"))
        if author.get("bot") is True:
            return WebhookResult(body=_ACK, ignored="bot_sender")
        chat_id, chat_type, user_id = _where(scene, data, author)
        if bot.self_id is not None and user_id == bot.self_id:
            return WebhookResult(body=_ACK, ignored="own_message")

        parts = _Parts(bot.self_id, arr(data.get("mentions")))
        content = data.get("content")
        guild = scene in ("channel", "dm")
        parts.content(content if guild or not isinstance(content, str) else content.strip(), guild=guild)
        for attachment in arr(data.get("attachments")):
            parts.attachment(obj(attachment))
        if not parts.segments:
            return WebhookResult(body=_ACK, ignored="unsupported_message")

        reply_to: ReplyRef | None = None
        reference = obj(data.get("message_reference")).get("message_id")
        if isinstance(reference, str) and reference:
            reply_to = ReplyRef(message_id=reference)
            parts.segments.insert(0, reply_segment(reference))
        sent_at = _timestamp_ms(data.get("timestamp"))
        received = request.received_at_ms or now_ms()
        # Where and since when a passive reply can go: every outbound message of the turn (notices
        # too) replies to this message while QQ allows it.
        route = {"msg_id": message_id, "at_ms": str(int(min(sent_at or received, received)))}
        name = author.get("username") or obj(data.get("member")).get("nick")
        message = build_inbound(
            self.name,
            bot,
            chat_id=chat_id,
            chat_type=chat_type,
            user_id=user_id,
            user_name=name if isinstance(name, str) else "",
            message_id=message_id,
            event_id=str(payload.get("id") or "") or None,
            text="".join(parts.plain).strip(),
            segments=parts.segments,
            mentions=parts.mentions,
            mention_names=parts.names,
            # Group and AT events are sent only when the bot is @-ed; one-to-one and DMs address it.
            mentions_bot=kind != "MESSAGE_CREATE" or parts.mentions_bot,
            reply_to=reply_to,
            route=route,
            sent_at_ms=sent_at,
        )
        return WebhookResult(messages=[message], body=_ACK)

    def _validation(self, bot: BotConfig, data: dict[str, Any]) -> WebhookResult:
        token, event_ts = data.get("plain_token"), data.get("event_ts")
        if not isinstance(token, str) or not _PLAIN_TOKEN.fullmatch(token):
            raise WebhookRejected(400, "malformed_payload", "op 13 without a plain_token of QQ's shape")
        if not isinstance(event_ts, str) or not _EVENT_TS.fullmatch(event_ts):
            raise WebhookRejected(400, "malformed_payload", "op 13 without a numeric event_ts")
        signature = self._key(bot).sign((event_ts + token).encode()).hex()
        return WebhookResult(body={"plain_token": token, "signature": signature}, ignored="url_verification")

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        target = parse_chat_id(message.chat_id)
        reply_id = message.route.get("msg_id") or message.reply_to_message_id
        blocks: list[tuple[str, Any]] = []  # ("text", str) | ("media", segment)
        text: list[str] = []

        def flush() -> None:
            joined = "".join(text)
            text.clear()
            if joined.strip():
                blocks.append(("text", joined))

        # Guild content is parsed for inline formats: what the agent wrote is escaped as QQ
        # documents, and `@everyone` broken, so only the bot's own `<@id>` mentions anyone.
        guild = not target.v2
        inert = _guild_text if guild else _as_is
        for index, segment in enumerate(with_own_file_ids(bot, message.segments, {})):
            if isinstance(segment, TextSegment):
                text.append(inert(segment.data.text))
            elif isinstance(segment, MarkdownSegment):  # QQ markdown needs approved templates
                text.append(inert(to_plain(parse_markdown(segment.data.content))))
            elif isinstance(segment, MentionSegment):
                if target.scene == "channel" and _MENTION_TARGET.fullmatch(segment.data.target):
                    text.append(f"<@{segment.data.target}>")
                # Groups and one-to-one chats have no @ of a member by id: the passive reply already
                # answers the asker's message, so the mention is left out (as is one not of QQ's shape).
            elif isinstance(segment, ImageSegment | VideoSegment | AudioSegment | FileSegment):
                if segment.type == "image" or (segment.type == "video" and target.v2):
                    flush()
                    blocks.append(("media", segment))
                else:
                    media_kind = segment.data.media.kind
                    text.append(attachment_unavailable(bot, segment.type, media_kind, "unsupported_by_platform"))
            elif isinstance(segment, ShareSegment):
                title = segment.data.title
                text.append(inert(f"{title} ({segment.data.url})" if title else segment.data.url))
            elif isinstance(segment, FaceSegment):
                text.append(face_text(bot, segment.data.id))
            elif isinstance(segment, DiceSegment):
                text.append(dice_text(message.outbound_id, index))
            elif isinstance(segment, RpsSegment):
                text.append(rps_text(message.outbound_id, index))
            elif isinstance(segment, ForwardSegment):
                text.append(notice(bot, "forward"))
            # A reply segment: the passive reply's msg_id already says which message it answers.
        flush()

        bodies: list[tuple[dict[str, Any], Media | None, str]] = []
        for block, value in blocks:
            if block == "text":
                for piece in split_rich(RichText(value), MAX_TEXT):
                    bodies.append(
                        ({"content": piece.text, "msg_type": 0} if target.v2 else {"content": piece.text}, None, "text")
                    )
            else:
                body: dict[str, Any] = {"content": " ", "msg_type": 7} if target.v2 else {}
                bodies.append((body, value.data.media, value.type))

        limit = MAX_PASSIVE_REPLIES.get(target.scene)
        if reply_id and limit is not None and len(bodies) > limit and not bot.active_messages:
            # QQ refuses a sixth reply to one message: the last one says the rest could not be sent.
            metrics.NOTICES.labels(self.name, "passive_reply_limit").inc()
            bodies = bodies[: limit - 1]
            bodies.append(({"content": notice(bot, "reply_limit"), "msg_type": 0}, None, "text"))

        deadline = passive_deadline_ms(target.scene, message.route) if reply_id else None
        calls: list[PlatformCall] = []
        for index, (body, media, segment_type) in enumerate(bodies):
            passive = bool(reply_id) and (limit is None or index < limit)
            if passive:
                body["msg_id"] = reply_id
                if target.v2:
                    body["msg_seq"] = msg_seq(message.outbound_id, index)
            meta: dict[str, Any] = {"chat": message.chat_id, "scene": target.scene, "segment": segment_type}
            if reply_id:
                meta["reply_to"] = reply_id
            if passive and deadline is not None:
                meta["passive_until_ms"] = deadline
            if media is not None:
                meta["upload"] = segment_type
            calls.append(PlatformCall(method="POST", path=target.messages_path, json=body, media=media, meta=meta))
        return calls

    def reply_deadline_ms(self, bot: BotConfig, chat_id: str, route: Mapping[str, str]) -> float | None:
        """When egress stops sending passive replies to the message `route` names (`msg_id`, and
        `at_ms`, which parse puts there); None for a route without them."""
        if not route.get("msg_id"):
            return None
        try:
            scene = parse_chat_id(chat_id).scene
        except ValueError:
            return None
        return passive_deadline_ms(scene, route)

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        body = dict(call.json or {})
        if "msg_id" not in body:
            if not bot.active_messages:
                return SendOutcome(
                    "permanent",
                    reason="active_messages_off",
                    detail="the message answers no user message and this bot sends no active messages "
                    "(active_messages = false)",
                )
            if call.meta.get("reply_to"):  # past the 5 replies to its message
                metrics.NOTICES.labels(self.name, "active_fallback").inc()
        deadline = call.meta.get("passive_until_ms")
        if isinstance(deadline, int | float) and now_ms() > deadline:
            expired = self._window_passed(bot, body, call)
            if expired is not None:
                return expired
        token = await self._token(bot, http)
        if isinstance(token, SendOutcome):
            return token
        root = base_url(bot, DEFAULT_API_BASE)
        headers = {"Authorization": f"QQBot {token}", "X-Union-Appid": bot.secret("app_id") or ""}
        target = parse_chat_id(str(call.meta.get("chat", "")))
        try:
            if call.media is not None:
                media_outcome = await self._media(bot, call, http, load_media, root, headers, body, target)
                if isinstance(media_outcome, SendOutcome):
                    return media_outcome
                form = media_outcome
            else:
                form = None
            response = await _post(http, root + call.path, headers, body, form)
            outcome = self._classify(bot, response)
            if outcome.reason == "passive_window_expired" and bot.active_messages and "msg_id" in body:
                _to_active(self.name, body)
                response = await _post(http, root + call.path, headers, body, form)
                outcome = self._classify(bot, response)
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        return outcome

    def _window_passed(self, bot: BotConfig, body: dict[str, Any], call: PlatformCall) -> SendOutcome | None:
        """Past the passive-reply window: an active message when the bot allows them, else a
        permanent failure saying so (QQ refuses every message to the chat without a fresh msg_id)."""
        if bot.active_messages:
            _to_active(self.name, body)
            return None
        scene = str(call.meta.get("scene"))
        return SendOutcome(
            "permanent",
            reason="passive_window_expired",
            detail=(
                f"the {scene} passive-reply window ({PASSIVE_WINDOW_S.get(scene, 300.0) / 60:.0f} min after the "
                "user's message) has passed; active messages are off for this bot (active_messages = false)"
            ),
        )

    async def _media(
        self,
        bot: BotConfig,
        call: PlatformCall,
        http: httpx.AsyncClient,
        load_media: MediaLoader,
        root: str,
        headers: dict[str, str],
        body: dict[str, Any],
        target: _Target,
    ) -> dict[str, tuple[str, bytes, str]] | SendOutcome | None:
        """Puts the call's media into `body` (group/one-to-one: the uploaded `file_info`; guild: an
        `image` URL), or returns the multipart file a guild message sends. A URL is passed to QQ,
        whose servers fetch it (not the operator's network); other media are read here. Unreadable
        media: the notice as text."""
        media = call.media
        assert media is not None
        segment_type = str(call.meta.get("upload", "image"))
        data = b""
        mime = ""
        if media.kind != "url":
            try:
                data, mime = await load_media(media)
            except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
                body["content"] = attachment_unavailable(bot, segment_type, media.kind, load_failure(exc))
                if target.v2:
                    body["msg_type"] = 0
                return None
        if not target.v2:
            if media.kind == "url":
                body["image"] = media.value
                return None
            return {"file_image": (file_name(media, mime, "image"), data, mime or "application/octet-stream")}
        upload: dict[str, Any] = {"file_type": _UPLOAD_TYPE[segment_type], "srv_send_msg": False}
        if media.kind == "url":
            upload["url"] = media.value
        else:
            upload["file_data"] = base64.b64encode(data).decode()
        response = await http.post(root + target.files_path, json=upload, headers=headers)
        reply = response_json(response)
        file_info = reply.get("file_info") if reply else None
        if response.status_code >= 300 or not isinstance(file_info, str):
            outcome = self._classify(bot, response)
            if outcome.status == "delivered":  # a 2xx without file_info
                return SendOutcome("retry", reason="bad_response", detail="upload answered without file_info")
            if outcome.status == "retry" or outcome.reason == "passive_window_expired":
                return outcome
            # Refused for good (a format, a size QQ does not take): the attachment, not the reply, is lost.
            body.pop("media", None)
            body["content"] = attachment_unavailable(bot, segment_type, media.kind, "refused_by_platform")
            body["msg_type"] = 0
            return None
        body["media"] = {"file_info": file_info}
        return None

    # --- token and errors ------------------------------------------------------------------------

    async def _token(self, bot: BotConfig, http: httpx.AsyncClient) -> str | SendOutcome:
        app_id, secret = bot.secret("app_id") or "", bot.secret("app_secret") or ""
        url, _ = key = _token_key(bot)

        async def fetch() -> tuple[str, float] | SendOutcome:
            try:
                response = await http.post(url, json={"appId": app_id, "clientSecret": secret})
            except httpx.HTTPError as exc:
                return network_outcome(exc)
            early = http_outcome(response)
            if early is not None:
                early.detail = f"token: {early.detail}"
                return early
            data = response_json(response) or {}
            token = data.get("access_token")
            if not isinstance(token, str) or not token:
                return SendOutcome(
                    "permanent",
                    reason="unauthorized",
                    detail=f"token: code {data.get('code')}: {data.get('message') or data.get('msg')}",
                )
            try:
                return token, float(data.get("expires_in", 7200))  # QQ sends it as a string
            except (TypeError, ValueError):
                return token, 7200.0

        return await self._tokens.get(key, fetch)

    def _classify(self, bot: BotConfig, response: httpx.Response) -> SendOutcome:
        data = response_json(response)
        code = data.get("code") if data else None
        if 200 <= response.status_code < 300 and data is not None and code in (None, 0):
            message_id = data.get("id")
            return SendOutcome("delivered", platform_message_id=str(message_id) if message_id is not None else None)
        detail = f"HTTP {response.status_code}, code {code}: {(data or {}).get('message') or response.text[:200]}"
        trace = response.headers.get("x-tps-trace-id")
        if trace:
            detail += f" (trace {trace[:64]})"
        if code == _DUPLICATE_SEQ or code in _ACCEPTED_FOR_REVIEW:
            # A replay of a send QQ already took (same msg_id + msg_seq), or a send held for review.
            return SendOutcome("delivered", detail=detail)
        if response.status_code == 429 or code in _RATE_LIMITED:
            retry_after = retry_after_header(response.headers.get("retry-after"))
            return SendOutcome("retry", reason="rate_limited", retry_after=retry_after, detail=detail)
        if response.status_code == 401 or code in _TOKEN_INVALID:
            self._tokens.drop(_token_key(bot))
            return SendOutcome("retry", reason="token_expired", retry_after=0.0, detail=detail)
        if code in _WINDOW_EXPIRED:
            return SendOutcome("permanent", reason="passive_window_expired", detail=detail)
        if response.status_code >= 500 or code in _RETRYABLE or data is None:
            return SendOutcome("retry", reason="server_error", detail=detail)
        reason = _PERMANENT.get(code, "api_error") if isinstance(code, int) else "api_error"
        if reason == "api_error" and response.status_code == 404:
            reason = "not_found"
        return SendOutcome("permanent", reason=reason, detail=detail)


# --- helpers -------------------------------------------------------------------------------------

_ACK = {"op": 12, "d": 0}  # HTTP Callback ACK

_EVENT_SCENES = {
    "GROUP_AT_MESSAGE_CREATE": "group",
    "C2C_MESSAGE_CREATE": "c2c",
    "AT_MESSAGE_CREATE": "channel",
    "MESSAGE_CREATE": "channel",
    "DIRECT_MESSAGE_CREATE": "dm",
}


def _as_is(text: str) -> str:
    return text


def _guild_text(text: str) -> str:
    """Text shown as written in a guild message: `& < >` escaped as QQ's inline format asks, and
    `@everyone` broken with a zero-width space (it would @ the whole guild)."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"@(?=everyone)", "@\u200b", escaped, flags=re.IGNORECASE)


def _guild_unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _token_key(bot: BotConfig) -> tuple[str, str]:
    return base_url(bot, DEFAULT_TOKEN_BASE) + TOKEN_PATH, bot.secret("app_id") or ""


def _to_active(platform: str, body: dict[str, Any]) -> None:
    body.pop("msg_id", None)
    body.pop("msg_seq", None)
    metrics.NOTICES.labels(platform, "active_fallback").inc()


async def _post(
    http: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    files: dict[str, tuple[str, bytes, str]] | None,
) -> httpx.Response:
    if files is None:
        return await http.post(url, json=body, headers=headers)
    form = {k: str(v) for k, v in body.items()}
    return await http.post(url, data=form, files=files, headers=headers)


def _where(scene: str, data: dict[str, Any], author: dict[str, Any]) -> tuple[str, ChatType, str]:
    """Chat id, chat type and sender id of a message event."""
    if scene == "group":
        group = data.get("group_openid") or data.get("group_id")
        user = author.get("member_openid") or author.get("id")
        chat_type: ChatType = "group"
    elif scene == "c2c":
        user = author.get("user_openid") or author.get("id")
        group, chat_type = user, "private"
    elif scene == "channel":
        group, user, chat_type = data.get("channel_id"), author.get("id"), "group"
    else:
        group, user, chat_type = data.get("guild_id"), author.get("id"), "private"
    if not isinstance(group, str) or not group or not isinstance(user, str) or not user:
        raise WebhookRejected(400, "malformed_payload", f"{scene} message without its chat or sender id")
    return f"{scene}:{group}", chat_type, user


def _timestamp_ms(value: Any) -> float | None:
    """QQ's ISO 8601 `timestamp` (`2023-11-06T13:37:18+08:00`) in ms; a number as Unix seconds."""
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value).timestamp() * 1000
        except ValueError:
            return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) * 1000
    return None


class _Parts(InboundParts):
    """Inbound content into segments, plain text and mentioned ids."""

    def __init__(self, self_id: str | None, mentions: list[Any]) -> None:
        super().__init__()
        self.self_id = self_id
        self.known: dict[str, tuple[str, bool]] = {}  # id → (username, is a bot)
        for item in mentions:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                self.known[item["id"]] = (str(item.get("username") or ""), item.get("bot") is True)
        self.mentions_bot = False

    def content(self, value: Any, *, guild: bool) -> None:
        """Message content: inline formats into segments; a guild's escaped `& < >` decoded."""
        if not isinstance(value, str):
            return
        plain = _guild_unescape if guild else _as_is
        pos = 0
        for match in _INLINE.finditer(value):
            self.text(plain(value[pos : match.start()]))
            pos = match.end()
            user, channel, face = match.groups()
            if user:
                name, is_bot = self.known.get(user, ("", False))
                self.mentions_bot = self.mentions_bot or is_bot or user == self.self_id
                self.add_mention(user, name)
            elif channel:
                self.text(f"#{channel}")
            else:
                self.segments.append(face_segment(face))
        self.text(plain(value[pos:]))

    def attachment(self, item: dict[str, Any]) -> None:
        url = item.get("url")
        if not isinstance(url, str) or not url:
            return
        if "://" not in url:  # guild attachments come without a scheme
            url = "https://" + url.lstrip("/")
        ctype = str(item.get("content_type") or "")
        if ctype.startswith("image"):
            kind = "image"
        elif ctype.startswith("video"):
            kind = "video"
        elif ctype.startswith(("voice", "audio")):
            kind = "audio"
        else:
            kind = "file"
        self.add_media(kind, "url", url)
