"""Lark / Feishu (event subscription 2.0 + IM v1 API).

In: event callbacks, optionally encrypted (`{"encrypt": …}`: AES-256-CBC, key = SHA-256 of the
encrypt key, IV = the first 16 bytes), signed when an encrypt key is set
(`X-Lark-Signature` = hex SHA-256 of timestamp + nonce + encrypt key + body), carrying the app's
verification token. URL verification answers the challenge. `im.message.receive_v1` in p2p and
group chats; the header's `event_id` is the de-duplication id (Lark redelivers on timeouts).
Out: a tenant access token (cached until shortly before it expires), then
`POST /open-apis/im/v1/messages?receive_id_type=chat_id` or `…/messages/{id}/reply`, as `text` or
`post` (with `at` and `md` elements); images and files are uploaded first for their keys (URLs are
fetched here, through the SSRF guard). A `kind: file` value passes only as an existing key of Lark's
shape: `img_…` for images, `file_…` for the rest. Each send carries a `uuid` derived from the
outbound id, so Lark itself drops a duplicate send.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any, ClassVar

import httpx

from pipeline.platforms._common import (
    InboundParts,
    TokenCache,
    arr,
    ascii_value,
    attachment_unavailable,
    base_url,
    build_inbound,
    dice_text,
    face_text,
    file_name,
    http_outcome,
    load_failure,
    load_json,
    missing_credential,
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

DEFAULT_API_BASE = "https://open.feishu.cn"  # Lark (international): https://open.larksuite.com
TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
MESSAGES_PATH = "/open-apis/im/v1/messages"
# Text messages may be 150 KB and posts 30 KB of request body; 6,000 characters stay below both
# even at 4 UTF-8 bytes per character.
MAX_TEXT = 6000
TOKEN_MARGIN_S = 300.0  # refresh this long before the token expires

_RATE_LIMITED = {99991400, 230020}
_TOKEN_INVALID = {99991661, 99991663, 99991664, 99991665, 99991668}
_SERVER_ERRORS = {1, 2200, 230099, 99991401, 99991402}
_PERMANENT = {
    230001: "bad_request",
    230002: "not_in_chat",
    230006: "bot_disabled",
    230011: "reply_target_gone",
    230013: "forbidden",
    230017: "forbidden",
    230025: "msg_too_long",
    230028: "forbidden",
    234001: "bad_request",
    234006: "file_too_large",
    10003: "unauthorized",
    10014: "unauthorized",
    99991672: "missing_scope",
    99991679: "missing_scope",
}


# Keys Lark gives for uploaded resources: `img_v2_041b…` (images), `file_v3_00a1…` (files, audio,
# video); older keys have no version part. Anything else is not Lark's and is not sent.
_IMAGE_KEY = re.compile(r"img_(?:v\d+_)?[A-Za-z0-9_-]{6,200}")
_FILE_KEY = re.compile(r"file_(?:v\d+_)?[A-Za-z0-9_-]{6,200}")
FILE_ID_SHAPES = {"image": _IMAGE_KEY, "audio": _FILE_KEY, "video": _FILE_KEY, "file": _FILE_KEY}


class LarkPlatform(Platform):
    name: ClassVar[str] = "lark"
    required_credentials = ("app_id", "app_secret")
    # The long connection (`pipeline.connections.lark`): events over a WebSocket Switchboard dials
    # with the app's id and secret; no event callbacks, so no token or key to check them with.
    transports = {"webhook": (("verification_token", "encrypt_key"),), "long_connection": ()}
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "mention", "image", "file", "reply", "share"}),
        max_text_chars=MAX_TEXT,
        max_attachment_bytes=30 * 1024 * 1024,  # files 30 MB (images 10 MB)
        markdown=True,
        # Sending messages: 5 per second into one chat or to one user (shared by the chat's bots),
        # and 50 per second (1,000 per minute) per app.
        default_chat_limit=RateLimit(count=5, per_seconds=1),
        default_bot_limit=RateLimit(count=50, per_seconds=1),
    )

    def __init__(self) -> None:
        self._tokens = TokenCache(TOKEN_MARGIN_S)  # per (api base, app id)

    # --- in --------------------------------------------------------------------------------------

    def _open(self, bot: BotConfig, body: bytes) -> dict[str, Any]:
        """The event as plain JSON (decrypted when it came encrypted)."""
        return self._read(bot, body)[0]

    def _read(self, bot: BotConfig, body: bytes) -> tuple[dict[str, Any], bool]:
        """The event as plain JSON, and whether it came encrypted (so made with the encrypt key)."""
        outer = load_json(body)
        if not isinstance(outer, dict):
            raise WebhookRejected(400, "malformed_payload", "not an object")
        encrypted = outer.get("encrypt")
        if encrypted is None:
            return outer, False
        key = bot.secret("encrypt_key")
        if not isinstance(encrypted, str) or not key:
            raise WebhookRejected(400, "malformed_payload", "encrypted event but no encrypt_key configured")
        try:
            plain = decrypt(key, encrypted)
        except ValueError as exc:
            raise WebhookRejected(400, "bad_encryption", str(exc)) from exc
        inner = load_json(plain)
        if not isinstance(inner, dict):
            raise WebhookRejected(400, "malformed_payload", "decrypted event is not an object")
        return inner, True

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        token = bot.secret("verification_token")
        encrypt_key = bot.secret("encrypt_key")
        if not token and not encrypt_key:
            raise WebhookRejected(401, "bad_signature", "no verification_token or encrypt_key configured")
        signature = request.header("x-lark-signature")
        # Checked before decrypting, so a forged body costs no AES work and always gets a 401.
        if encrypt_key and signature is not None:
            timestamp = ascii_value(request.header("x-lark-request-timestamp"), "X-Lark-Request-Timestamp")
            # Without it, a captured request would be taken again once its event id has left the
            # de-duplication window.
            require_fresh(bot, request, timestamp.decode())
            nonce = ascii_value(request.header("x-lark-request-nonce"), "X-Lark-Request-Nonce")
            digest = hashlib.sha256(timestamp + nonce + encrypt_key.encode() + request.body).hexdigest()
            if not same_secret(signature, digest):
                raise WebhookRejected(401, "bad_signature")
        event, encrypted = self._read(bot, request.body)
        header = obj(event.get("header"))
        given = header.get("token") if event.get("schema") else event.get("token")
        is_challenge = event.get("type") == "url_verification"
        # Only the URL challenge comes unsigned; it proves itself with the verification token, or,
        # without one, by having been encrypted with the encrypt key. A plain unsigned challenge
        # proves nothing: it is refused here, before it could be answered or dead-lettered.
        if encrypt_key and signature is None and not is_challenge:
            raise WebhookRejected(401, "bad_signature", "unsigned event")
        if encrypt_key and signature is None and not token and not encrypted:
            raise WebhookRejected(401, "bad_signature", "unsigned challenge in plain text")
        if token and (is_challenge or not encrypt_key or given is not None):
            if not isinstance(given, str) or not same_secret(given, token):
                raise WebhookRejected(401, "bad_token")

    def startup_warnings(self, bot: BotConfig) -> list[str]:
        if bot.transport != "webhook":
            return []  # nothing posts to its webhook
        return missing_credential(
            bot,
            "encrypt_key",
            "Lark does not sign its requests, so a captured request can be replayed once its event id "
            "has left the de-duplication window. Set encrypt_key",
        )

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        event = self._open(bot, request.body)
        if event.get("type") == "url_verification":
            challenge = event.get("challenge")
            if not isinstance(challenge, str):
                raise WebhookRejected(400, "malformed_payload", "url_verification without challenge")
            return WebhookResult(body={"challenge": challenge}, ignored="url_verification")
        header = event.get("header")
        if event.get("schema") != "2.0" or not isinstance(header, dict):
            return WebhookResult(ignored="not_message")
        event_type = header.get("event_type")
        if event_type != "im.message.receive_v1":
            return WebhookResult(ignored="not_message")
        body = event.get("event")
        if not isinstance(body, dict):
            raise WebhookRejected(400, "malformed_payload", "no event body")
        sender = obj(body.get("sender"))
        if sender.get("sender_type") not in (None, "user"):
            return WebhookResult(ignored="bot_sender")
        sender_ids = obj(sender.get("sender_id"))
        msg = body.get("message")
        if not isinstance(msg, dict):
            raise WebhookRejected(400, "malformed_payload", "no message")
        message_id, chat_id, open_id = msg.get("message_id"), msg.get("chat_id"), sender_ids.get("open_id")
        if not all(isinstance(v, str) and v for v in (message_id, chat_id, open_id)):
            raise WebhookRejected(400, "malformed_payload", "message without id/chat/sender open_id")
        assert isinstance(message_id, str) and isinstance(chat_id, str) and isinstance(open_id, str)
        if bot.self_id is not None and open_id == bot.self_id:
            return WebhookResult(ignored="own_message")
        try:
            content = json.loads(msg.get("content") or "{}")
        except (TypeError, json.JSONDecodeError) as exc:
            raise WebhookRejected(400, "malformed_payload", f"content is not JSON: {exc}") from exc
        if not isinstance(content, dict):
            raise WebhookRejected(400, "malformed_payload", "content is not an object")

        # Mentions come as placeholders (`@_user_1`) resolved through `message.mentions`.
        keys: dict[str, tuple[str, str]] = {}
        for mention in arr(msg.get("mentions")):
            # An empty key would match everywhere in the text (and never advance past it).
            if isinstance(mention, dict) and isinstance(mention.get("key"), str) and mention["key"]:
                ids = obj(mention.get("id"))
                keys[mention["key"]] = (str(ids.get("open_id") or ""), str(mention.get("name") or ""))
        parts = _Parts(keys)
        message_type = msg.get("message_type")
        if message_type == "text":
            parts.text_with_mentions(str(content.get("text") or ""))
        elif message_type == "post":
            parts.post(content)
        elif message_type == "image" and isinstance(content.get("image_key"), str):
            parts.media("image", content["image_key"])
        elif message_type in ("file", "audio", "media") and isinstance(content.get("file_key"), str):
            neutral = {"file": "file", "audio": "audio", "media": "video"}[message_type]
            parts.media(neutral, content["file_key"])
        else:
            return WebhookResult(ignored="unsupported_message")

        reply_to: ReplyRef | None = None
        parent = msg.get("parent_id")
        if isinstance(parent, str) and parent:
            reply_to = ReplyRef(message_id=parent)
            parts.segments.insert(0, reply_segment(parent))
        route: dict[str, str] = {}
        for key in ("thread_id", "root_id"):
            if isinstance(msg.get(key), str) and msg[key]:
                route[key] = msg[key]
        created = msg.get("create_time")
        mentions = [m for m in parts.mentions if m]
        message = build_inbound(
            self.name,
            bot,
            chat_id=chat_id,
            chat_type="private" if msg.get("chat_type") == "p2p" else "group",
            user_id=open_id,
            message_id=message_id,
            event_id=str(header.get("event_id") or "") or None,
            text="".join(parts.plain).strip(),
            segments=parts.segments,
            mentions=mentions,
            mention_names=parts.names,
            mentions_bot=bot.self_id is not None and bot.self_id in mentions,
            reply_to=reply_to,
            route=route,
            sent_at_ms=float(created) if isinstance(created, str) and created.isdigit() else None,
        )
        return WebhookResult(messages=[message])

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        reply_id = message.reply_to_message_id
        in_thread = False
        if not reply_id and message.route.get("thread_id") and message.route.get("root_id"):
            reply_id, in_thread = message.route["root_id"], True  # stay in the topic thread
        for segment in message.segments:
            if not reply_id and isinstance(segment, ReplySegment):
                reply_id = segment.data.message_id
        locale = "en_us" if bot.language == "en" else "zh_cn"
        builder = _PostBuilder(MAX_TEXT)
        # (msg_type, content, media to upload first, upload kind)
        bodies: list[tuple[str, dict[str, Any], Media | None, str | None]] = []

        def flush() -> None:
            for rich, paragraphs in builder.take():
                if rich:
                    for part in _fit_post(paragraphs, locale):
                        bodies.append(("post", {locale: {"title": "", "content": part}}, None, None))
                else:
                    text = "\n".join("".join(e["text"] for e in para) for para in paragraphs)
                    bodies.append(("text", {"text": text}, None, None))

        for index, segment in enumerate(with_own_file_ids(bot, message.segments, FILE_ID_SHAPES)):
            if isinstance(segment, TextSegment):
                builder.text(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                builder.markdown(segment.data.content)
            elif isinstance(segment, MentionSegment):
                builder.element({"tag": "at", "user_id": segment.data.target}, 1)
            elif isinstance(segment, ShareSegment):
                link = {"tag": "a", "text": segment.data.title or segment.data.url, "href": segment.data.url}
                builder.element(link, len(segment.data.title))
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                flush()
                item = segment.data.media
                if isinstance(segment, ImageSegment):
                    if item.kind == "file":
                        bodies.append(("image", {"image_key": item.value}, None, None))
                    else:
                        bodies.append(("image", {}, item, f"image:{segment.type}"))
                elif item.kind == "file":
                    bodies.append(("file", {"file_key": item.value}, None, None))
                else:  # audio and video go as files: Lark's audio/media types need opus/mp4 and a cover
                    bodies.append(("file", {}, item, f"file:{segment.type}"))
            elif isinstance(segment, DiceSegment):
                builder.text(dice_text(message.outbound_id, index))
            elif isinstance(segment, RpsSegment):
                builder.text(rps_text(message.outbound_id, index))
            elif isinstance(segment, FaceSegment):
                builder.text(face_text(bot, segment.data.id))
            elif isinstance(segment, ForwardSegment):
                builder.text(notice(bot, "forward"))
        flush()

        calls: list[PlatformCall] = []
        for n, (msg_type, content, media, upload) in enumerate(bodies):
            body: dict[str, Any] = {
                "msg_type": msg_type,
                "content": json.dumps(content, ensure_ascii=False),
                "uuid": hashlib.sha256(f"{message.outbound_id}:{n}".encode()).hexdigest()[:40],
            }
            if reply_id:
                path = f"{MESSAGES_PATH}/{reply_id}/reply"
                if in_thread:
                    body["reply_in_thread"] = True
            else:
                path = f"{MESSAGES_PATH}?receive_id_type=chat_id"
                body["receive_id"] = message.chat_id
            meta: dict[str, Any] = {}
            if upload:
                kind, _, segment_type = upload.partition(":")
                meta = {"upload": kind, "segment": segment_type}
                upload = kind
            calls.append(PlatformCall(method="POST", path=path, json=body, media=media, media_field=upload, meta=meta))
            if not in_thread:
                reply_id = None  # only the first message quotes; the thread keeps them all together
        return calls

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        root = base_url(bot, DEFAULT_API_BASE)
        token = await self._token(bot, http, root)
        if isinstance(token, SendOutcome):
            return token
        headers = {"Authorization": f"Bearer {token}"}
        body = dict(call.json or {})
        try:
            if call.media is not None and call.meta.get("upload"):
                uploaded = await self._upload(bot, call, http, load_media, root, headers)
                if isinstance(uploaded, SendOutcome):
                    return uploaded
                if isinstance(uploaded, str):  # unreadable media: the notice goes in its place
                    body["msg_type"] = "text"
                    body["content"] = json.dumps({"text": uploaded}, ensure_ascii=False)
                else:
                    body["content"] = json.dumps(uploaded, ensure_ascii=False)
            response = await http.request(call.method, root + call.path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        outcome, data = self._classify(bot, root, response)
        if outcome is not None:
            return outcome
        result = obj(data.get("data"))
        return SendOutcome("delivered", platform_message_id=result.get("message_id"))

    async def _upload(
        self,
        bot: BotConfig,
        call: PlatformCall,
        http: httpx.AsyncClient,
        load_media: MediaLoader,
        root: str,
        headers: dict[str, str],
    ) -> dict[str, str] | SendOutcome | str:
        """The uploaded resource's key, an outcome to return, or the notice text for unreadable media."""
        assert call.media is not None
        try:
            data, mime = await load_media(call.media)
        except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
            segment_type = str(call.meta.get("segment", call.meta["upload"]))
            return attachment_unavailable(bot, segment_type, call.media.kind, load_failure(exc))
        name = file_name(call.media, mime)
        if call.meta["upload"] == "image":
            response = await http.post(
                root + "/open-apis/im/v1/images",
                data={"image_type": "message"},
                files={"image": (name, data, mime or "application/octet-stream")},
                headers=headers,
            )
            key_name = "image_key"
        else:
            response = await http.post(
                root + "/open-apis/im/v1/files",
                data={"file_type": _file_type(mime, name), "file_name": name},
                files={"file": (name, data, mime or "application/octet-stream")},
                headers=headers,
            )
            key_name = "file_key"
        outcome, reply = self._classify(bot, root, response)
        if outcome is not None:
            return outcome
        result = obj(reply.get("data"))
        key = result.get(key_name)
        if not isinstance(key, str):
            return SendOutcome("retry", reason="bad_response", detail=f"upload without {key_name}")
        return {key_name: key}

    # --- token and errors ------------------------------------------------------------------------

    async def _token(self, bot: BotConfig, http: httpx.AsyncClient, root: str) -> str | SendOutcome:
        app_id, secret = bot.secret("app_id") or "", bot.secret("app_secret") or ""

        async def fetch() -> tuple[str, float] | SendOutcome:
            try:
                response = await http.post(root + TOKEN_PATH, json={"app_id": app_id, "app_secret": secret})
            except httpx.HTTPError as exc:
                return network_outcome(exc)
            early = http_outcome(response)
            if early is not None:
                return early
            data = response_json(response) or {}
            token, expire = data.get("tenant_access_token"), data.get("expire")
            if data.get("code") != 0 or not isinstance(token, str):
                return SendOutcome(
                    "permanent", reason="unauthorized", detail=f"token: code {data.get('code')}: {data.get('msg')}"
                )
            return token, float(expire) if isinstance(expire, int | float) else 7200.0

        return await self._tokens.get((root, app_id), fetch)

    def _classify(
        self, bot: BotConfig, root: str, response: httpx.Response
    ) -> tuple[SendOutcome | None, dict[str, Any]]:
        data = response_json(response)
        code = data.get("code") if data else None
        retry_after = retry_after_header(response.headers.get("x-ogw-ratelimit-reset"))
        if data is not None and code == 0:
            return None, data
        detail = f"code {code}: {data.get('msg') if data else response.text[:200]}"
        if response.status_code == 429 or code in _RATE_LIMITED:
            retry_after = (
                retry_after if retry_after is not None else retry_after_header(response.headers.get("retry-after"))
            )
            return SendOutcome("retry", reason="rate_limited", retry_after=retry_after, detail=detail), {}
        if code in _TOKEN_INVALID:
            self._tokens.drop((root, bot.secret("app_id") or ""))
            return SendOutcome("retry", reason="token_expired", retry_after=0.0, detail=detail), {}
        if response.status_code >= 500 or code in _SERVER_ERRORS or data is None:
            return SendOutcome("retry", reason="server_error", detail=detail), {}
        reason = _PERMANENT.get(code, "api_error") if isinstance(code, int) else "api_error"
        return SendOutcome("permanent", reason=reason, detail=detail), {}


# --- helpers -------------------------------------------------------------------------------------


def decrypt(encrypt_key: str, encrypted: str) -> bytes:
    """Lark's event encryption: AES-256-CBC, key SHA-256(encrypt_key), IV first block, PKCS#7."""
    try:
        raw = base64.b64decode(encrypted, validate=True)
    except ValueError as exc:
        raise ValueError("encrypt is not base64") from exc
    if len(raw) < 32 or len(raw) % 16:
        raise ValueError("bad ciphertext length")
    key = hashlib.sha256(encrypt_key.encode()).digest()
    plain = _aes_cbc_decrypt(key, raw[:16], raw[16:])
    pad = plain[-1]
    if not 1 <= pad <= 16 or plain[-pad:] != bytes([pad]) * pad:
        raise ValueError("bad padding (wrong encrypt_key?)")
    return plain[:-pad]


def _aes_cbc_decrypt(key: bytes, iv: bytes, data: bytes) -> bytes:
    # Either AES library will do; neither is a hard dependency of the other platforms.
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        try:
            from Crypto.Cipher import AES
        except ImportError as exc:
            raise ValueError("no AES library installed (cryptography or pycryptodome)") from exc
        return bytes(AES.new(key, AES.MODE_CBC, iv).decrypt(data))
    decryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor()
    return decryptor.update(data) + decryptor.finalize()


def _file_type(mime: str | None, name: str) -> str:
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if mime == "video/mp4" or ext == "mp4":
        return "mp4"
    if ext in ("pdf", "doc", "xls", "ppt"):
        return ext
    if ext in ("docx", "xlsx", "pptx"):
        return ext[:-1]
    if mime == "audio/ogg" or ext == "opus":
        return "opus"
    return "stream"


class _Parts(InboundParts):
    """Inbound content into segments, plain text and mentioned open_ids."""

    def __init__(self, keys: dict[str, tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def mention(self, open_id: str, name: str) -> None:
        if not open_id:  # `@_all`, or a user outside the tenant
            self.text(f"@{name or 'all'}")
            return
        self.add_mention(open_id, name)

    def text_with_mentions(self, value: str) -> None:
        pos = 0
        # Longest keys first so `@_user_10` is not read as `@_user_1` + "0".
        ordered = sorted(self.keys, key=len, reverse=True)
        while pos < len(value):
            hits = [(value.find(k, pos), k) for k in ordered]
            hits = [(at, k) for at, k in hits if at >= 0]
            if not hits:
                break
            at, key = min(hits, key=lambda h: (h[0], -len(h[1])))
            self.text(value[pos:at])
            self.mention(*self.keys[key])
            pos = at + len(key)
        self.text(value[pos:])

    def media(self, kind: str, key: str) -> None:
        self.add_media(kind, "file", key)

    def post(self, content: dict[str, Any]) -> None:
        if "content" not in content:  # `{"zh_cn": {...}}` form: take the first locale
            content = next((v for v in content.values() if isinstance(v, dict)), {})
        title = content.get("title")
        if isinstance(title, str) and title:
            self.text(title + "\n")
        paragraphs = arr(content.get("content"))
        for n, para in enumerate(paragraphs):
            if n:
                self.text("\n")
            for el in para if isinstance(para, list) else []:
                if not isinstance(el, dict):
                    continue
                tag = el.get("tag")
                if tag in ("text", "md", "code_block"):
                    self.text(str(el.get("text") or ""))
                elif tag == "a":
                    self.text(f"{el.get('text') or ''} ({el.get('href') or ''})")
                elif tag == "at":
                    uid = str(el.get("user_id") or "")
                    open_id, name = self.keys.get(uid, (uid if uid.startswith("ou_") else "", ""))
                    self.mention(open_id, name or str(el.get("user_name") or ""))
                elif tag == "img" and isinstance(el.get("image_key"), str):
                    self.media("image", el["image_key"])
                elif tag == "media" and isinstance(el.get("file_key"), str):
                    self.media("video", el["file_key"])
                elif tag == "emotion":
                    self.text(f"[{el.get('emoji_type') or 'emoji'}]")


class _PostBuilder:
    """Inline segments into Lark messages: a `text` message when it is only text, else a `post`
    (paragraphs of `text`/`at`/`a` elements; markdown as `md` elements, one per paragraph as Lark
    requires), cut into several messages at the length limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.done: list[tuple[bool, list[list[dict[str, Any]]]]] = []
        self._reset()

    def _reset(self) -> None:
        self.paragraphs: list[list[dict[str, Any]]] = [[]]
        self.size = 0
        self.rich = False

    def _cut(self) -> None:
        paragraphs = [p for p in self.paragraphs]
        while paragraphs and not paragraphs[-1]:
            paragraphs.pop()
        while paragraphs and not paragraphs[0]:
            paragraphs.pop(0)
        if any(any(el.get("tag") != "text" or el.get("text", "").strip() for el in p) for p in paragraphs):
            self.done.append((self.rich, paragraphs))
        self._reset()

    def _add(self, element: dict[str, Any], size: int) -> None:
        if self.size and self.size + size > self.limit:
            self._cut()
        self.paragraphs[-1].append(element)
        self.size += size

    def text(self, value: str) -> None:
        for n, line in enumerate(value.split("\n")):
            if n:
                self.paragraphs.append([])
                self.size += 1
            for piece in _pieces(line, self.limit):
                self._add({"tag": "text", "text": piece}, len(piece))

    def element(self, element: dict[str, Any], size: int) -> None:
        self._add(element, size)
        self.rich = True

    def markdown(self, content: str) -> None:
        for piece in split_rich(RichText(content), self.limit):
            if self.size and self.size + len(piece.text) > self.limit:
                self._cut()
            if self.paragraphs[-1]:
                self.paragraphs.append([])
            self.paragraphs[-1].append({"tag": "md", "text": piece.text})
            self.paragraphs.append([])
            self.size += len(piece.text)
            self.rich = True

    def take(self) -> list[tuple[bool, list[list[dict[str, Any]]]]]:
        self._cut()
        done, self.done = self.done, []
        return done


MAX_POST_BYTES = 28 * 1024  # Lark allows 30 KB of request body for a post


def _fit_post(paragraphs: list[list[dict[str, Any]]], locale: str) -> list[list[list[dict[str, Any]]]]:
    """Paragraphs cut into posts whose body stays under Lark's 30 KB. Counting characters is not
    enough: every element and every paragraph adds JSON, and the content is JSON inside JSON."""
    content = {locale: {"title": "", "content": paragraphs}}
    size = len(json.dumps(json.dumps(content, ensure_ascii=False), ensure_ascii=False).encode())
    if size <= MAX_POST_BYTES or len(paragraphs) < 2:
        return [paragraphs]
    half = len(paragraphs) // 2
    return _fit_post(paragraphs[:half], locale) + _fit_post(paragraphs[half:], locale)


def _pieces(line: str, limit: int) -> list[str]:
    if len(line) <= limit:
        return [line] if line else []
    return [p.text for p in split_rich(RichText(line), limit)]
