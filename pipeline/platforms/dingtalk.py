"""DingTalk / 钉钉 (an internal app's robot: HTTP callback or Stream mode in, the robot OpenAPI out).

In, HTTP callback (机器人接收消息): DingTalk POSTs the message as JSON with the headers `timestamp`
(Unix milliseconds) and `sign`, the base64 of HMAC-SHA256 keyed with the app secret over
`timestamp + "\\n" + app secret`. The signature does NOT cover the body: it proves only that the
sender knew the secret at that time, so a captured (timestamp, sign) pair would authenticate any
body until the timestamp is stale. DingTalk allows an hour; Switchboard allows
`replay_window_seconds` (5 minutes by default, at most an hour) and a timestamp at most
`FUTURE_SKEW_S` ahead of its clock, and lets each signature authenticate one body: the first
request to carry it is remembered in Redis with its body's digest (one `SET NX` shared by every
worker, kept as long as the timestamp could still pass), a later one with another body is
`401 replayed_signature`. Stream mode
(`transport = "stream"`, `pipeline.connections.dingtalk`) has no such gap and needs no public URL.
One-to-one chats (`conversationType` "1") come as they are; group chats ("2") only when the robot is
@-mentioned (`isInAtList`). `msgId` is the de-duplication id (a callback is retried when it gets no
answer). Text, richText (text and pictures), picture, audio (with DingTalk's recognition as text),
video and file messages are read; media are kept as their `downloadCode` (a `kind: file` media).
Out: the robot OpenAPI (api.dingtalk.com) with an access token from `/v1.0/oauth2/accessToken`,
cached until shortly before it expires (header `x-acs-dingtalk-access-token`): one-to-one chats by
`oToMessages/batchSend` to the sender's `userIds` (their staff id), groups by `groupMessages/send`
to the `openConversationId`. The per-message `sessionWebhook` is not used: it expires (about 90
minutes) and a reply may come later, from any worker, after a retry.
`msgKey` sampleText or sampleMarkdown (when the reply has markdown); images are uploaded with the
legacy `media/upload` (oapi.dingtalk.com, same token) and sent as sampleImageMsg whose `photoURL` is
the media id; files, audio and video are uploaded and sent as sampleFile (sampleAudio and
sampleVideo need a duration and a cover Switchboard does not have). The robot API cannot @-mention
or quote: mentions are shown as `@name` text, quotes are left out. `api_base` replaces both hosts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from typing import Any, ClassVar

import httpx
from redis.exceptions import RedisError

from pipeline.platforms._common import (
    InboundParts,
    TokenCache,
    arr,
    attachment_unavailable,
    base_url,
    build_inbound,
    dice_text,
    face_text,
    file_name,
    http_outcome,
    load_failure,
    load_json,
    media_placeholder,
    network_outcome,
    notice,
    obj,
    payload_guard,
    require_fresh,
    response_json,
    retry_after_header,
    rps_text,
    same_secret,
    verify_guard,
    with_own_file_ids,
)
from pipeline.platforms._richtext import RichText, split_rich
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
from pipeline.records import OutboundMessage
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
from pipeline.state import Keys, RedisClient
from pipeline.state.exceptions import StateError

DEFAULT_API_BASE = "https://api.dingtalk.com"
DEFAULT_OAPI_BASE = "https://oapi.dingtalk.com"
TOKEN_PATH = "/v1.0/oauth2/accessToken"
PRIVATE_PATH = "/v1.0/robot/oToMessages/batchSend"
GROUP_PATH = "/v1.0/robot/groupMessages/send"
UPLOAD_PATH = "/media/upload"
STREAM_OPEN_PATH = "/v1.0/gateway/connections/open"
BOT_MESSAGE_TOPIC = "/v1.0/im/bot/messages/get"
# msgParam may have 15,000 bytes (groupMessages/send). A CJK character is 3 bytes in UTF-8, and
# JSON escapes grow some: 4,000 characters stay below it.
MAX_TEXT = 4000
MAX_PARAM_BYTES = 15_000
MAX_TITLE = 20  # the markdown title shows in the chat list and notifications
TOKEN_MARGIN_S = 300.0
# DingTalk's throttling answers give no wait; its limits are per second (QPS) and per minute.
RATE_LIMITED_WAIT_S = 2.0
# media/upload: images up to 20 MB, files up to 20 MB (voice 2 MB, video 20 MB).
MAX_UPLOAD_BYTES = 20 * 1024 * 1024

# Legacy (oapi) errcodes: an expired or invalid token, and "busy" / throttled.
_OAPI_TOKEN_INVALID = {40014, 42001, 40001}
_OAPI_RETRY = {-1, 88, 90002, 90018}
# OpenAPI `code`s (HTTP 4xx) that ask for a retry: throttling.
_THROTTLED = re.compile(r"(?i)qpslimit|throttl|ratelimit|flowcontrol|toomanyrequests")

# Media ids of DingTalk's media/upload: `@` then letters, digits, `-` and `_`.
_MEDIA_ID = re.compile(r"@[A-Za-z0-9_-]{8,256}")
FILE_ID_SHAPES = {"image": _MEDIA_ID}
_TIMESTAMP_MS = re.compile(r"[0-9]{10,16}")
# How far a callback's timestamp may be ahead of the receiving worker's clock (clock drift); a
# later one is refused, so no signature stays usable beyond the replay window.
FUTURE_SKEW_S = 60


def callback_sign(secret: str, timestamp: str) -> str:
    """The `sign` header of a callback sent at `timestamp` (Unix milliseconds, as text)."""
    digest = hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def robot_code(bot: BotConfig) -> str:
    """The robot's code: `robot_code`, else the AppKey (an internal app's robot has it as its code)."""
    return bot.secret("robot_code") or bot.secret("client_id") or ""


class DingTalkPlatform(Platform):
    name: ClassVar[str] = "dingtalk"
    required_credentials = ("client_id", "client_secret")
    transports = {"webhook": (), "stream": ()}
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "image", "file", "audio", "video"}),
        max_text_chars=MAX_TEXT,
        max_attachment_bytes=MAX_UPLOAD_BYTES,
        markdown=True,
        # A robot may post 20 messages a minute in one group (more are throttled for 10 minutes);
        # the robot OpenAPI takes about 20 calls a second per app.
        default_chat_limit=RateLimit(count=20, per_seconds=60),
        default_bot_limit=RateLimit(count=20, per_seconds=1),
    )

    def __init__(self) -> None:
        self.tokens = TokenCache(TOKEN_MARGIN_S)
        self._signatures: tuple[RedisClient, Keys] | None = None

    def bind(self, redis: RedisClient | None, keys: Keys | None = None) -> None:
        """Where the signatures already taken are kept (the worker's Redis); None: nowhere, and
        every callback is refused (503) rather than taken without the check."""
        self._signatures = (redis, keys) if redis is not None and keys is not None else None

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        secret = bot.secret("client_secret")
        if not secret:
            raise WebhookRejected(401, "bad_signature", "no client_secret configured")
        timestamp = request.header("timestamp") or ""
        if _TIMESTAMP_MS.fullmatch(timestamp) is None:
            raise WebhookRejected(401, "bad_signature", "no timestamp header (Unix milliseconds)")
        sent = int(timestamp) // 1000
        now = request.received_at_ms / 1000 if request.received_at_ms else time.time()
        if sent - now > FUTURE_SKEW_S:
            raise WebhookRejected(
                401, "stale_timestamp", f"request timestamp is {sent - now:.0f} s ahead; at most {FUTURE_SKEW_S} s"
            )
        require_fresh(bot, request, str(sent))
        expected = callback_sign(secret, timestamp)
        if not same_secret(request.header("sign"), expected):
            raise WebhookRejected(401, "bad_signature")

    async def admit(self, bot: BotConfig, request: WebhookRequest) -> None:
        """A verified callback's signature authenticates one body: the signature does not cover
        the body, so the first request to carry it is marked in Redis with its body's digest
        (shared by every worker, kept as long as the timestamp could still pass), and a later one
        with another body is a forgery. The same body again is DingTalk retrying (or a replay of
        it), which ingest drops by its `msgId`. One round trip; a second only for a repeat."""
        if self._signatures is None:
            raise WebhookRejected(503, "replay_check_unavailable", "no Redis to remember signatures in")
        redis, keys = self._signatures
        sign = request.header("sign") or ""  # verified: the 44 base64 characters of the HMAC
        key = keys.of("dingtalk-sign", f"{bot.bot_id}|{sign}")
        digest = hashlib.sha256(request.body).hexdigest()
        try:
            first = await redis.execute("SET", key, digest, "NX", "EX", bot.replay_window_seconds + FUTURE_SKEW_S)
            taken = None if first is not None else await redis.execute("GET", key)
        except (RedisError, StateError, OSError):
            # Fail closed: DingTalk retries a callback that is not answered with 200.
            raise WebhookRejected(503, "replay_check_unavailable", "Redis unavailable") from None
        if first is None and taken != digest:
            raise WebhookRejected(401, "replayed_signature", "this timestamp and sign came with another body")

    def startup_warnings(self, bot: BotConfig) -> list[str]:
        if bot.transport != "webhook":
            return []
        return [
            "DingTalk's callback signature covers the timestamp, not the body: each signature is taken "
            f"with one body, but for {bot.replay_window_seconds} s a copy of it that arrives before "
            'DingTalk\'s own request authenticates any body (transport = "stream" has no such gap)'
        ]

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        payload = load_json(request.body)
        if not isinstance(payload, dict):
            raise WebhookRejected(400, "malformed_payload", "not a JSON object")
        msgtype = payload.get("msgtype")
        conversation_type = payload.get("conversationType")
        message_id = payload.get("msgId")
        conversation_id = payload.get("conversationId")
        for key, value in (
            ("msgtype", msgtype),
            ("conversationType", conversation_type),
            ("msgId", message_id),
            ("conversationId", conversation_id),
        ):
            if not isinstance(value, str) or not value:
                raise WebhookRejected(400, "malformed_payload", f"field {key!r} missing or not a string")
        assert isinstance(msgtype, str) and isinstance(message_id, str) and isinstance(conversation_id, str)
        if conversation_type not in ("1", "2"):
            raise WebhookRejected(400, "malformed_payload", f"conversationType {str(conversation_type)[:20]!r}")
        group = conversation_type == "2"
        sender_id, staff_id = payload.get("senderId"), payload.get("senderStaffId")
        if not isinstance(sender_id, str) or not sender_id:
            raise WebhookRejected(400, "malformed_payload", "field 'senderId' missing or not a string")
        if staff_id is not None and not isinstance(staff_id, str):
            raise WebhookRejected(400, "malformed_payload", "field 'senderStaffId' not a string")
        own = payload.get("chatbotUserId")
        if isinstance(own, str) and own == sender_id:
            return WebhookResult(ignored="own_message")
        if not group and not staff_id:
            # A one-to-one reply goes to the sender's staff id; someone outside the organisation
            # (no staff id) cannot be written to by the robot API.
            return WebhookResult(ignored="no_staff_id")

        parts = InboundParts()

        def add_media(kind: str, code: Any) -> None:
            if not isinstance(code, str) or not code:
                parts.text(media_placeholder(kind))  # DingTalk sent none: the placeholder alone
                return
            parts.add_media(kind, "file", code)

        content = obj(payload.get("content"))
        if msgtype == "text":
            text = obj(payload.get("text")).get("content")
            if not isinstance(text, str):
                raise WebhookRejected(400, "malformed_payload", "text message without text.content")
            parts.text(text.strip())
        elif msgtype == "richText":
            items = content.get("richText")
            if not isinstance(items, list):
                raise WebhookRejected(400, "malformed_payload", "richText message without content.richText")
            for item in items:
                item = obj(item)
                if isinstance(item.get("text"), str):
                    parts.text(item["text"])
                elif item.get("type") == "picture":
                    add_media("image", item.get("downloadCode") or item.get("pictureDownloadCode"))
        elif msgtype == "picture":
            add_media("image", content.get("downloadCode") or content.get("pictureDownloadCode"))
        elif msgtype in ("audio", "video", "file"):
            add_media(msgtype, content.get("downloadCode"))
            if msgtype == "audio" and isinstance(content.get("recognition"), str):
                parts.text(" " + content["recognition"])  # DingTalk's own transcript of the voice message
            if msgtype == "file" and isinstance(content.get("fileName"), str):
                parts.text(" " + content["fileName"][:200])
        else:
            return WebhookResult(ignored="not_message")
        if not parts.segments:
            return WebhookResult(ignored="empty_message")

        mentions: list[str] = []
        for user in arr(payload.get("atUsers")):
            user = obj(user)
            target = user.get("staffId") or user.get("dingtalkId")
            if isinstance(target, str) and target and target not in mentions and user.get("dingtalkId") != own:
                mentions.append(target)
        in_at_list = payload.get("isInAtList") is True
        created = payload.get("createAt")
        sent_at_ms = float(created) if isinstance(created, int | float) and not isinstance(created, bool) else None
        nick = payload.get("senderNick")
        message = build_inbound(
            self.name,
            bot,
            chat_id=conversation_id if group else str(staff_id),
            chat_type="group" if group else "private",
            user_id=staff_id or sender_id,
            user_name=nick if isinstance(nick, str) else "",
            is_admin=False,
            message_id=message_id,
            text="".join(parts.plain).strip(),
            segments=parts.segments,
            mentions=mentions,
            mentions_bot=group and in_at_list,
            sent_at_ms=sent_at_ms,
        )
        return WebhookResult(messages=[message])

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        group = message.chat_type == "group"
        path = GROUP_PATH if group else PRIVATE_PATH
        target: dict[str, Any] = {"openConversationId": message.chat_id} if group else {"userIds": [message.chat_id]}
        base = {"robotCode": robot_code(bot), **target}

        calls: list[PlatformCall] = []
        pieces: list[str] = []
        markdown = False

        def post(key: str, param: dict[str, Any], **extra: Any) -> None:
            body = {**base, "msgKey": key, "msgParam": json.dumps(param, ensure_ascii=False)}
            calls.append(PlatformCall(method="POST", path=path, json=body, **extra))

        def flush() -> None:
            nonlocal pieces, markdown
            text = "".join(pieces).strip()
            if text:
                for part in _pieces(text, MAX_TEXT):
                    if markdown:
                        post("sampleMarkdown", {"title": _title(part), "text": part})
                    else:
                        post("sampleText", {"content": part})
            pieces, markdown = [], False

        for index, segment in enumerate(with_own_file_ids(bot, message.segments, FILE_ID_SHAPES)):
            if isinstance(segment, TextSegment):
                pieces.append(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                markdown = True
                pieces.append(segment.data.content)
            elif isinstance(segment, MentionSegment):
                pieces.append(f"@{segment.data.target} ")
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                flush()
                media = segment.data.media
                if media.kind == "file":  # a DingTalk media id of an image (others were refused above)
                    post("sampleImageMsg", {"photoURL": media.value})
                else:
                    upload = "image" if segment.type == "image" else "file"
                    meta = {"flow": "upload", "upload_type": upload, "segment": segment.type}
                    calls.append(
                        PlatformCall(
                            method="POST", path=path, json=dict(base), media=media, media_field="media", meta=meta
                        )
                    )
            elif isinstance(segment, DiceSegment):
                pieces.append(dice_text(message.outbound_id, index))
            elif isinstance(segment, RpsSegment):
                pieces.append(rps_text(message.outbound_id, index))
            elif isinstance(segment, FaceSegment):
                pieces.append(face_text(bot, segment.data.id))
            elif isinstance(segment, ShareSegment):
                title = segment.data.title or segment.data.url
                pieces.append(f"{title} ({segment.data.url})" if title != segment.data.url else title)
            elif isinstance(segment, ForwardSegment):
                pieces.append(notice(bot, "forward"))
            # A reply segment: the robot API cannot quote a message; the answer is shown without it.
        flush()
        return calls

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        body = call.json or {}
        if call.meta.get("flow") == "upload" and call.media is not None:
            prepared = await self._uploaded(bot, call, http, load_media)
            if isinstance(prepared, SendOutcome):
                return prepared
            body = {**body, **prepared}
        root = base_url(bot, DEFAULT_API_BASE)
        for attempt in (1, 2):
            token = await self._token(bot, http)
            if isinstance(token, SendOutcome):
                return token
            try:
                response = await http.request(
                    call.method, root + call.path, json=body, headers={"x-acs-dingtalk-access-token": token}
                )
            except httpx.HTTPError as exc:
                return network_outcome(exc)
            outcome = _classify(response)
            if outcome.reason == "token_invalid" and attempt == 1:
                self.tokens.drop(_token_key(bot), token)  # expired early (a new secret): once more, anew
                continue
            return outcome
        raise AssertionError("unreachable")

    async def _token(self, bot: BotConfig, http: httpx.AsyncClient) -> str | SendOutcome:
        root = base_url(bot, DEFAULT_API_BASE)

        async def fetch() -> tuple[str, float] | SendOutcome:
            credentials = {"appKey": bot.secret("client_id") or "", "appSecret": bot.secret("client_secret") or ""}
            try:
                response = await http.post(root + TOKEN_PATH, json=credentials)
            except httpx.HTTPError as exc:
                return network_outcome(exc)
            data = response_json(response) or {}
            token, expires = data.get("accessToken"), data.get("expireIn")
            if response.status_code == 200 and isinstance(token, str) and token:
                return token, float(expires) if isinstance(expires, int | float) else 7200.0
            outcome = _classify(response)
            if outcome.status == "delivered":  # HTTP 200 without a token
                return SendOutcome("retry", reason="bad_response", detail="accessToken: no token in the answer")
            if outcome.status == "permanent":
                outcome.reason = "unauthorized"
            return outcome

        return await self.tokens.get(_token_key(bot), fetch)

    async def _uploaded(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> dict[str, str] | SendOutcome:
        """The message fields of an uploaded attachment (msgKey and msgParam), or the notice in its
        place when it cannot be loaded, or the outcome of a failed upload."""
        assert call.media is not None
        segment_type = str(call.meta.get("segment", "file"))
        try:
            data, mime = await load_media(call.media)
        except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
            text = attachment_unavailable(bot, segment_type, call.media.kind, load_failure(exc))
            return {"msgKey": "sampleText", "msgParam": json.dumps({"content": text}, ensure_ascii=False)}
        upload_type = str(call.meta.get("upload_type", "file"))
        name = file_name(call.media, mime, default=segment_type)
        root = base_url(bot, DEFAULT_OAPI_BASE)
        for attempt in (1, 2):
            token = await self._token(bot, http)
            if isinstance(token, SendOutcome):
                return token
            try:
                response = await http.post(
                    root + UPLOAD_PATH,
                    params={"access_token": token, "type": upload_type},
                    files={"media": (name, data, mime or "application/octet-stream")},
                )
            except httpx.HTTPError as exc:
                outcome = network_outcome(exc)
                outcome.detail = outcome.detail.replace(token, "<token>")  # the legacy API's token is in the URL
                return outcome
            early = http_outcome(response)
            if early is not None:
                return early
            answer = response_json(response) or {}
            errcode = answer.get("errcode")
            media_id = answer.get("media_id")
            if errcode == 0 and isinstance(media_id, str) and media_id:
                if upload_type == "image":
                    return {"msgKey": "sampleImageMsg", "msgParam": json.dumps({"photoURL": media_id})}
                ext = name.rsplit(".", 1)[-1].lower() if "." in name else "file"
                param = {"mediaId": media_id, "fileName": name, "fileType": ext}
                return {"msgKey": "sampleFile", "msgParam": json.dumps(param, ensure_ascii=False)}
            detail = f"media/upload: errcode {errcode}: {str(answer.get('errmsg', ''))[:200]}"
            if errcode in _OAPI_TOKEN_INVALID and attempt == 1:
                self.tokens.drop(_token_key(bot), token)
                continue
            if errcode in _OAPI_RETRY:
                return SendOutcome("retry", reason="rate_limited" if errcode != -1 else "server_error", detail=detail)
            return SendOutcome("permanent", reason="upload_failed", detail=detail)
        return SendOutcome("retry", reason="token_invalid", detail="media/upload: the token was refused twice")


def _token_key(bot: BotConfig) -> tuple[str, ...]:
    return (base_url(bot, DEFAULT_API_BASE), bot.secret("client_id") or "")


def _pieces(text: str, limit: int) -> list[str]:
    """`text` in parts of at most `limit` characters and `MAX_PARAM_BYTES` bytes of JSON, cut at
    line ends or spaces where there are some."""
    out: list[str] = []
    for piece in split_rich(_rich(text), limit):
        part = piece.text
        if len(json.dumps(part, ensure_ascii=False).encode()) > MAX_PARAM_BYTES - 200 and limit > 100:
            out.extend(_pieces(part, limit // 2))
        else:
            out.append(part)
    return out


def _rich(text: str) -> RichText:
    rich = RichText()
    rich.append(text)
    return rich


def _title(markdown: str) -> str:
    """The markdown message's title: its first line, without markdown marks, shortened."""
    first = next((line for line in markdown.splitlines() if line.strip()), "")
    title = re.sub(r"[#*_`>\[\]()!~-]", "", first).strip()
    return (title[: MAX_TITLE - 1] + "…") if len(title) > MAX_TITLE else (title or "…")


def _classify(response: httpx.Response) -> SendOutcome:
    """An OpenAPI answer: HTTP 200 with the result, or 4xx/5xx with `{"code", "message"}`."""
    data = response_json(response) or {}
    code = str(data.get("code") or "")
    detail = f"HTTP {response.status_code} {code}: {str(data.get('message') or response.text)[:300]}".strip()
    if response.status_code == 200:
        # batchSend answers 200 even when a user could not be written to, or was throttled.
        if arr(data.get("flowControlledStaffIdList")):
            return SendOutcome("retry", reason="rate_limited", retry_after=RATE_LIMITED_WAIT_S, detail=detail)
        if arr(data.get("invalidStaffIdList")):
            return SendOutcome("permanent", reason="bad_recipient", detail=detail + " invalidStaffIdList")
        key = data.get("processQueryKey")
        return SendOutcome("delivered", platform_message_id=key if isinstance(key, str) and key else None)
    if response.status_code == 429 or _THROTTLED.search(code):
        wait = retry_after_header(response.headers.get("retry-after"))
        return SendOutcome("retry", reason="rate_limited", retry_after=wait or RATE_LIMITED_WAIT_S, detail=detail)
    if response.status_code == 401 or code.lower().startswith("invalidauthentication"):
        return SendOutcome("retry", reason="token_invalid", detail=detail)
    early = http_outcome(response)
    if early is not None:
        early.detail = detail
        return early
    lowered = code.lower()
    if "staffid" in lowered or "userid" in lowered or "notexist" in lowered or "notfound" in lowered:
        reason = "bad_recipient"
    elif lowered.startswith("forbidden") or response.status_code == 403:
        reason = "forbidden"
    elif lowered.startswith(("invalidparameter", "missingparameter", "param")) or response.status_code == 400:
        reason = "bad_request"
    else:
        reason = "api_error"
    return SendOutcome("permanent", reason=reason, detail=detail)
