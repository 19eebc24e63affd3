"""WeCom / 企业微信 (a self-built app's callback and message API; the AI bot's JSON callback).

In, the self-built app (自建应用): WeCom calls the callback URL with `msg_signature`, `timestamp`
and `nonce` in the query. The URL check is a GET with an encrypted `echostr`; messages are POSTed
as XML whose `<Encrypt>` holds the encrypted message XML. The signature is the hex SHA-1 of the
sorted token, timestamp, nonce and ciphertext; the ciphertext is AES-256-CBC with the 43-character
EncodingAESKey (base64 plus `=`; IV = the key's first 16 bytes), PKCS#7 padded to 32 bytes, and
holds 16 random bytes, a 4-byte big-endian length, the message and the receiver id (the corp id).
The app receives one-to-one messages only; `MsgId` is the de-duplication id (WeCom calls again when
it gets no answer in 5 seconds). XML is read with the standard library's expat, refusing any
document type declaration: WeCom's XML has none, so no entity is ever declared or expanded.
In, the AI bot (智能机器人, API mode), where group chats come from (a callback when the bot is
@-mentioned): the same URL check and crypto with the receiver id "" and the bot's own token and key
(`aibot_token`, `aibot_encoding_aes_key`), and a JSON body `{"encrypt": …}`. A request is told apart
by which token its signature matches.
Out: an access token from `gettoken` (cached per corp and app until shortly before it expires,
fetched once however many sends wait; 40014/42001 drop it and the call is made once more with a new
one), then `message/send` to a user or `appchat/send` to an app group chat, as `text`, `markdown`,
`news` (a shared link), `image` or `file` (uploaded first with `media/upload` for a `media_id`).
A message to the AI bot is answered once through its callback's `response_url` (markdown; valid one
hour, for one call), so a reply there is one message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit
from xml.parsers import expat

import httpx
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

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
    media_placeholder,
    network_outcome,
    notice,
    obj,
    payload_guard,
    require_fresh,
    response_json,
    rps_text,
    same_secret,
    verify_guard,
    with_own_file_ids,
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
from pipeline.records import OutboundMessage
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

DEFAULT_API_BASE = "https://qyapi.weixin.qq.com"
TOKEN_PATH = "/cgi-bin/gettoken"
SEND_PATH = "/cgi-bin/message/send"
APPCHAT_PATH = "/cgi-bin/appchat/send"
UPLOAD_PATH = "/cgi-bin/media/upload"
# message/send and appchat/send: text and markdown content at most 2,048 UTF-8 bytes each.
MAX_TEXT_BYTES = 2048
MAX_MARKDOWN_BYTES = 2048
# The AI bot's response_url takes one markdown message; 4,096 bytes as the message-push bot allows.
MAX_RESPONSE_BYTES = 4096
MAX_NEWS_TITLE_BYTES = 128
TOKEN_MARGIN_S = 300.0  # refresh this long before the token expires
# WeCom says nothing of when to try again after 45009/45033; its limits are per minute and hour.
RATE_LIMITED_WAIT_S = 3.0
MAX_UPLOAD_BYTES = {"image": 10 * 1024 * 1024, "file": 20 * 1024 * 1024}

_TOKEN_INVALID = {40014, 42001}
_RATE_LIMITED = {45009, 45033}
_SERVER_ERRORS = {-1}  # system busy
_PERMANENT = {
    40001: "unauthorized",  # invalid corp secret
    40013: "unauthorized",  # invalid corp id
    40003: "bad_recipient",  # invalid user id
    81013: "bad_recipient",  # user, department and tag all invalid
    86003: "chat_not_found",
    40056: "bad_agent",  # invalid agent id
    60020: "ip_not_allowed",  # the server's IP is not in the app's trusted IPs
    48002: "forbidden",  # API forbidden
    60011: "forbidden",  # no privilege
    44004: "empty_content",
    45002: "msg_too_long",
    40004: "bad_media",
    40005: "bad_media",
    40006: "file_too_large",
    40007: "bad_media_id",
    40009: "file_too_large",
    40058: "bad_request",
}

# `media_id`s of WeCom's temporary media: letters, digits, `_`, `-`, `@` and `.`, no path or scheme.
_MEDIA_ID = re.compile(r"[A-Za-z0-9_@.-]{16,256}")

# What WeCom posts is small: one encrypted message or event (a text message's content is at most
# 2,048 bytes; the events' XML a few kilobytes), base64 in a short envelope. 64 KiB leaves ten
# times that and bounds what an unsigned request can make the worker read before it is refused.
MAX_CALLBACK_BYTES = 64 * 1024
# A URL check's echostr decrypts to a random token of digits (WeCom's example: 1616140317555161061);
# letters, `_` and `-` are allowed too. Never `<` or `{`: no message decrypts to one of these.
_ECHOSTR = re.compile(rb"[A-Za-z0-9_-]{1,128}")
# Its ciphertext: 16 random bytes, the length, at most 128 bytes, the receiver id, padded, base64.
MAX_ECHOSTR_CHARS = 512
# `<Encrypt>` of the app's XML, its base64 as CDATA or as text.
_ENCRYPT_ELEMENT = re.compile(rb"<Encrypt>\s*(?:<!\[CDATA\[([A-Za-z0-9+/=]+)\]\]>|([A-Za-z0-9+/=]+))\s*</Encrypt>")
FILE_ID_SHAPES = {"image": _MEDIA_ID, "file": _MEDIA_ID, "audio": _MEDIA_ID, "video": _MEDIA_ID}

Surface = Literal["app", "aibot"]


@dataclass(frozen=True)
class _Keys:
    """The credentials a callback was signed with, and whose receiver id it must carry."""

    surface: Surface
    token: str
    encoding_aes_key: str
    receive_id: str


class WeComPlatform(Platform):
    name: ClassVar[str] = "wecom"
    required_credentials = ("corp_id", "corp_secret", "agent_id", "token", "encoding_aes_key")
    webhook_methods = frozenset({"GET", "POST"})  # GET: the callback URL check
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "image", "file", "share"}),
        max_text_chars=MAX_TEXT_BYTES // 3,  # characters that fit even at 3 UTF-8 bytes each
        max_attachment_bytes=MAX_UPLOAD_BYTES["file"],  # images 10 MB
        markdown=True,
        # An app may send a member at most 30 messages a minute (WeCom drops the rest unsent), and a
        # corp may call one API 10,000 times a minute.
        default_chat_limit=RateLimit(count=30, per_seconds=60),
        default_bot_limit=RateLimit(count=10_000, per_seconds=60),
    )

    def __init__(self) -> None:
        self._tokens = TokenCache(TOKEN_MARGIN_S)  # per (api base, corp id, agent id)

    # --- in --------------------------------------------------------------------------------------

    def _keys(self, bot: BotConfig, request: WebhookRequest) -> tuple[_Keys, str]:
        """Which credentials signed the request (401 if none did), and its ciphertext.

        Nothing of an unsigned request is parsed: the ciphertext is found by a bounded scan of a
        body of at most `MAX_CALLBACK_BYTES`, and the signature over it checked first."""
        if len(request.body) > MAX_CALLBACK_BYTES:
            raise WebhookRejected(413, "too_large", f"a WeCom callback has at most {MAX_CALLBACK_BYTES} bytes")
        query = request.query
        signature, timestamp, nonce = (query.get(k) or "" for k in ("msg_signature", "timestamp", "nonce"))
        if not (signature and timestamp and nonce):
            raise WebhookRejected(401, "bad_signature", "msg_signature, timestamp or nonce missing")
        # The signature's inputs go through `.encode()`: values with other characters are no
        # signature WeCom made.
        ascii_value(timestamp, "timestamp")
        ascii_value(nonce, "nonce")
        encrypted = _ciphertext(request)
        for keys in _candidates(bot):
            expected = msg_signature(keys.token, timestamp, nonce, encrypted)
            if same_secret(signature, expected):
                # Checked only for a genuine signature: a recording is refused, a forgery is a 401 anyway.
                require_fresh(bot, request, timestamp)
                return keys, encrypted
        raise WebhookRejected(401, "bad_signature")

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        keys, encrypted = self._keys(bot, request)
        if request.method == "GET":
            # The URL check signs the same four values as a message, so a captured message's
            # signature, timestamp, nonce and ciphertext replayed as a GET pass the check above.
            # Only an echostr is answered: WeCom's is a short random token, never XML or JSON.
            _echo(keys, encrypted)

    def startup_warnings(self, bot: BotConfig) -> list[str]:
        """Credentials that would have WeCom's callbacks refused (named, never shown)."""
        warnings = []
        for name in ("encoding_aes_key", "aibot_encoding_aes_key"):
            value = bot.secret(name)
            if value is not None:
                try:
                    _aes_key(value)
                except ValueError:
                    warnings.append(f"{name} is not 43 characters of base64: every callback it signs is refused")
        if (bot.secret("aibot_token") is None) != (bot.secret("aibot_encoding_aes_key") is None):
            warnings.append("aibot_token and aibot_encoding_aes_key go together: the AI bot's callbacks are refused")
        return warnings

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        keys, encrypted = self._keys(bot, request)
        if request.method == "GET":
            return WebhookResult(text=_echo(keys, encrypted), ignored="url_verification")
        plain = _open(keys, encrypted)
        if keys.surface == "aibot":
            return self._parse_aibot(bot, plain)
        return self._parse_app(bot, plain)

    def _parse_app(self, bot: BotConfig, plain: bytes) -> WebhookResult:
        fields = _parse_xml(plain)
        msg_type = fields.get("MsgType")
        if msg_type == "event" or msg_type is None:
            return WebhookResult(text="", ignored="not_message")
        if fields.get("AgentID") not in (None, bot.secret("agent_id")):
            return WebhookResult(text="", ignored="other_agent")
        user, msg_id = fields.get("FromUserName") or "", fields.get("MsgId") or ""
        if not user or not msg_id:
            raise WebhookRejected(400, "malformed_payload", "message without FromUserName or MsgId")
        if bot.self_id is not None and user == bot.self_id:
            return WebhookResult(text="", ignored="own_message")
        parts = _Parts()
        if msg_type == "text":
            parts.text(fields.get("Content") or "")
        elif msg_type in ("image", "voice", "video") and fields.get("MediaId"):
            parts.media({"image": "image", "voice": "audio", "video": "video"}[msg_type], fields["MediaId"])
        elif msg_type == "location":
            label = fields.get("Label") or ""
            parts.text(f"[location] {label} ({fields.get('Location_X')}, {fields.get('Location_Y')})".strip())
        elif msg_type == "link":
            parts.text(f"{fields.get('Title') or ''} ({fields.get('Url') or ''})")
        else:
            return WebhookResult(text="", ignored="unsupported_message")
        created = fields.get("CreateTime") or ""
        sent_at_ms = float(created) * 1000 if created.isdigit() else None
        return self._message(
            bot, parts, chat_id=user, chat_type="private", user=user, msg_id=msg_id, sent_at_ms=sent_at_ms
        )

    def _parse_aibot(self, bot: BotConfig, plain: bytes) -> WebhookResult:
        payload = load_json(plain)
        if not isinstance(payload, dict):
            raise WebhookRejected(400, "malformed_payload", "the decrypted callback is not an object")
        msg_type = payload.get("msgtype")
        if msg_type in (None, "event", "stream"):  # events, and WeCom asking for a stream's next part
            return WebhookResult(text="", ignored="not_message")
        msg_id, user = payload.get("msgid"), obj(payload.get("from")).get("userid")
        response_url = payload.get("response_url")
        if not all(isinstance(v, str) and v for v in (msg_id, user, response_url)):
            raise WebhookRejected(400, "malformed_payload", "callback without msgid, from.userid or response_url")
        assert isinstance(msg_id, str) and isinstance(user, str) and isinstance(response_url, str)
        if not _same_origin(response_url, base_url(bot, DEFAULT_API_BASE)):
            raise WebhookRejected(400, "malformed_payload", "response_url is not on the WeCom API host")
        group = payload.get("chattype") == "group"
        chat_id = payload.get("chatid") if group else user
        if not isinstance(chat_id, str) or not chat_id:
            raise WebhookRejected(400, "malformed_payload", "group callback without chatid")
        parts = _Parts(strip_mention=bot.username)
        quote = obj(payload.get("quote"))
        if quote:
            quoted = _Parts()
            quoted.item(quote)
            if quoted.plain:
                parts.text("> " + "".join(quoted.plain).strip().replace("\n", "\n> ") + "\n")
        if msg_type == "mixed":
            for item in arr(obj(payload.get("mixed")).get("msg_item")):
                parts.item(obj(item))
        elif msg_type in ("text", "image", "voice", "file"):
            parts.item(payload)
        else:
            return WebhookResult(text="", ignored="unsupported_message")
        return self._message(
            bot,
            parts,
            chat_id=chat_id,
            chat_type="group" if group else "private",
            user=user,
            msg_id=msg_id,
            mentions=[bot.self_id] if group and bot.self_id else [],
            # WeCom calls the AI bot's URL from a group only when the bot is @-mentioned.
            mentions_bot=group,
            route={"response_url": response_url},
        )

    def _message(
        self,
        bot: BotConfig,
        parts: _Parts,
        *,
        chat_id: str,
        chat_type: ChatType,
        user: str,
        msg_id: str,
        mentions: list[str] | None = None,
        mentions_bot: bool = False,
        route: dict[str, str] | None = None,
        sent_at_ms: float | None = None,
    ) -> WebhookResult:
        message = build_inbound(
            self.name,
            bot,
            chat_id=chat_id,
            chat_type=chat_type,
            user_id=user,
            message_id=msg_id,
            event_id=msg_id,  # WeCom's message id is also what a redelivery repeats
            text="".join(parts.plain).strip(),
            segments=parts.segments,
            mentions=mentions or [],
            mentions_bot=mentions_bot,
            route=route,
            sent_at_ms=sent_at_ms,
        )
        return WebhookResult(messages=[message], text="")

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        response_url = message.route.get("response_url")
        if response_url and message.kind in ("notice", "progress"):
            # The AI bot's response_url takes one message: kept for the reply (or a confirmation).
            return []
        segments = with_own_file_ids(bot, message.segments, {} if response_url else FILE_ID_SHAPES)
        builder = _Builder(bot, message.outbound_id)
        for index, segment in enumerate(segments):
            builder.add(index, segment)
        if response_url:
            return [_response_call(response_url, builder.as_markdown(MAX_RESPONSE_BYTES))]
        target: dict[str, Any]
        if message.chat_type == "group":
            path, target = APPCHAT_PATH, {"chatid": message.chat_id}
        else:
            path, target = SEND_PATH, {"touser": message.chat_id, "agentid": _agent_id(bot)}
        calls: list[PlatformCall] = []
        for kind, payload, media, segment_type in builder.bodies():
            body = {**target, "msgtype": kind, kind: payload}
            meta: dict[str, Any] = {}
            if media is not None:
                meta = {"upload": kind, "segment": segment_type}
            calls.append(PlatformCall(method="POST", path=path, json=body, media=media, media_field=kind, meta=meta))
        return calls

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        root = base_url(bot, DEFAULT_API_BASE)
        if call.meta.get("response_url"):
            return await self._respond(bot, call, http, root)
        body = dict(call.json or {})
        if call.media is not None and call.meta.get("upload"):
            kind = str(call.meta["upload"])
            try:
                data, mime = await load_media(call.media)
            except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
                segment_type = str(call.meta.get("segment", kind))
                shown = attachment_unavailable(bot, segment_type, call.media.kind, load_failure(exc))
                body = {k: v for k, v in body.items() if k not in ("msgtype", kind)}
                body.update(msgtype="text", text={"content": shown})
            else:
                if kind == "image" and len(data) > MAX_UPLOAD_BYTES["image"]:  # too big for an image: a file
                    del body[kind]
                    kind = body["msgtype"] = "file"
                name = file_name(call.media, mime)

                def upload(token: str) -> Awaitable[httpx.Response]:
                    return http.post(
                        root + UPLOAD_PATH,
                        params={"access_token": token, "type": kind},
                        files={"media": (name, data, mime or "application/octet-stream")},
                    )

                outcome, reply = await self._with_token(bot, http, root, upload)
                if outcome is not None:
                    return outcome
                media_id = reply.get("media_id")
                if not isinstance(media_id, str) or not media_id:
                    return SendOutcome("retry", reason="bad_response", detail="media/upload without media_id")
                body[kind] = {"media_id": media_id}

        def post(token: str) -> Awaitable[httpx.Response]:
            return _post_json(http, root + call.path, body, {"access_token": token})

        outcome, reply = await self._with_token(bot, http, root, post)
        if outcome is not None:
            return outcome
        invalid = [
            str(reply.get(k)) for k in ("invaliduser", "invalidparty", "invalidtag", "unlicenseduser") if reply.get(k)
        ]
        if invalid:  # errcode 0, but the one recipient was not reached
            return SendOutcome("permanent", reason="bad_recipient", detail=f"invalid recipient: {', '.join(invalid)}")
        msgid = reply.get("msgid")
        return SendOutcome("delivered", platform_message_id=str(msgid) if msgid else None)

    async def _respond(self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, root: str) -> SendOutcome:
        url = str(call.meta["response_url"])
        if not _same_origin(url, root):  # a route is data: never post to another host
            return SendOutcome("permanent", reason="bad_request", detail="response_url is not on the WeCom API host")
        try:
            response = await _post_json(http, url, call.json or {})
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        outcome, _ = _classify(response)
        return outcome or SendOutcome("delivered")

    # --- token and errors ------------------------------------------------------------------------

    async def _with_token(
        self,
        bot: BotConfig,
        http: httpx.AsyncClient,
        root: str,
        request: Callable[[str], Awaitable[httpx.Response]],
    ) -> tuple[SendOutcome | None, dict[str, Any]]:
        """`request` made with the access token; once more with a new token if WeCom says the
        cached one expired or is invalid (it can be revoked before its expiry)."""
        for attempt in range(2):
            token = await self._token(bot, http, root)
            if isinstance(token, SendOutcome):
                return token, {}
            try:
                response = await request(token)
            except httpx.HTTPError as exc:
                return network_outcome(exc), {}
            outcome, reply = _classify(response)
            if outcome is not None and outcome.reason == "token_expired":
                self._drop_token(bot, root, token)
                if attempt == 0:
                    continue
            return outcome, reply
        raise AssertionError("unreachable")

    def _token_key(self, bot: BotConfig, root: str) -> tuple[str, str, str]:
        return (root, bot.secret("corp_id") or "", bot.secret("agent_id") or "")

    def _drop_token(self, bot: BotConfig, root: str, token: str) -> None:
        self._tokens.drop(self._token_key(bot, root), token)

    async def _token(self, bot: BotConfig, http: httpx.AsyncClient, root: str) -> str | SendOutcome:
        params = {"corpid": bot.secret("corp_id") or "", "corpsecret": bot.secret("corp_secret") or ""}

        async def fetch() -> tuple[str, float] | SendOutcome:
            try:
                response = await http.get(root + TOKEN_PATH, params=params)
            except httpx.HTTPError as exc:
                return network_outcome(exc)
            outcome, data = _classify(response)
            if outcome is not None:
                if outcome.reason == "token_expired":  # not an answer gettoken gives; never loop on it
                    outcome = SendOutcome("retry", reason="server_error", detail=outcome.detail)
                outcome.detail = f"gettoken: {outcome.detail}"
                return outcome
            token, expires = data.get("access_token"), data.get("expires_in")
            if not isinstance(token, str) or not token:
                return SendOutcome("retry", reason="bad_response", detail="gettoken without access_token")
            return token, float(expires) if isinstance(expires, int | float) else 7200.0

        return await self._tokens.get(self._token_key(bot, root), fetch)


# --- crypto (WeCom's callback encryption; the AI bot's is the same) ------------------------------


def msg_signature(token: str, timestamp: str, nonce: str, encrypted: str) -> str:
    return hashlib.sha1("".join(sorted((token, timestamp, nonce, encrypted))).encode()).hexdigest()


def _aes_key(encoding_aes_key: str) -> bytes:
    try:
        key = base64.b64decode(encoding_aes_key + "=", validate=True)
    except ValueError:
        key = b""
    if len(encoding_aes_key) != 43 or len(key) != 32:
        raise ValueError("encoding_aes_key is not 43 characters of base64")
    return key


def decrypt(encoding_aes_key: str, encrypted: str) -> tuple[bytes, str]:
    """The message and the receiver id in a ciphertext."""
    key = _aes_key(encoding_aes_key)
    try:
        raw = base64.b64decode(encrypted, validate=True)
    except ValueError:
        raise ValueError("the ciphertext is not base64") from None
    if not raw or len(raw) % 16:
        raise ValueError("bad ciphertext length")
    decryptor = Cipher(algorithms.AES(key), modes.CBC(key[:16])).decryptor()
    plain = decryptor.update(raw) + decryptor.finalize()
    pad = plain[-1]
    if not 1 <= pad <= 32 or plain[-pad:] != bytes([pad]) * pad:
        raise ValueError("bad padding (wrong encoding_aes_key?)")
    content = plain[16:-pad]
    if len(content) < 4:
        raise ValueError("no message length")
    (length,) = struct.unpack(">I", content[:4])
    if length > len(content) - 4:
        raise ValueError("message length beyond the ciphertext")
    try:
        receive_id = content[4 + length :].decode()
    except UnicodeDecodeError:
        raise ValueError("the receiver id is not UTF-8") from None
    return content[4 : 4 + length], receive_id


def encrypt(encoding_aes_key: str, message: bytes, receive_id: str) -> str:
    """The ciphertext WeCom would send (and expects in a passive reply)."""
    key = _aes_key(encoding_aes_key)
    content = os.urandom(16) + struct.pack(">I", len(message)) + message + receive_id.encode()
    pad = 32 - len(content) % 32
    encryptor = Cipher(algorithms.AES(key), modes.CBC(key[:16])).encryptor()
    return base64.b64encode(encryptor.update(content + bytes([pad]) * pad) + encryptor.finalize()).decode()


def _open(keys: _Keys, encrypted: str) -> bytes:
    """The message in a signed ciphertext, which must name the bot's receiver id."""
    try:
        plain, receive_id = decrypt(keys.encoding_aes_key, encrypted)
    except ValueError as exc:
        raise WebhookRejected(400, "bad_encryption", str(exc)) from None
    # Decrypted text and configured ids: both encode. The AI bot's receiver id is "".
    if not hmac.compare_digest(receive_id.encode(), keys.receive_id.encode()):
        raise WebhookRejected(400, "bad_encryption", "the receiver id is not this bot's")
    return plain


def _echo(keys: _Keys, encrypted: str) -> str:
    """The plain echostr of a signed URL check, or 400: a ciphertext of anything else (a message
    replayed as a GET) is never decrypted for the caller."""
    if len(encrypted) > MAX_ECHOSTR_CHARS:
        raise WebhookRejected(400, "not_echostr", f"echostr longer than {MAX_ECHOSTR_CHARS} characters")
    plain = _open(keys, encrypted)
    if _ECHOSTR.fullmatch(plain) is None:
        raise WebhookRejected(400, "not_echostr", "the decrypted echostr is not a short token")
    return plain.decode("ascii")


def _ciphertext(request: WebhookRequest) -> str:
    """The ciphertext a callback's signature covers: the GET's `echostr`, the AI bot's
    `{"encrypt": …}`, or the one `<Encrypt>` element of the app's XML, found without parsing it."""
    encrypted: object
    if request.method == "GET":
        encrypted = request.query.get("echostr") or ""
    elif request.body.lstrip().startswith(b"{"):
        envelope = load_json(request.body)  # at most MAX_CALLBACK_BYTES: bounded work
        encrypted = envelope.get("encrypt") if isinstance(envelope, dict) else None
    else:
        found = _ENCRYPT_ELEMENT.findall(request.body)
        encrypted = (found[0][0] or found[0][1]).decode("ascii") if len(found) == 1 else None
    if not isinstance(encrypted, str) or not encrypted:
        raise WebhookRejected(400, "malformed_payload", "no ciphertext (echostr, Encrypt or encrypt)")
    ascii_value(encrypted, "the ciphertext")  # base64: any other character is no signed value
    return encrypted


def _candidates(bot: BotConfig) -> list[_Keys]:
    keys = []
    token, aes_key = bot.secret("token"), bot.secret("encoding_aes_key")
    if token and aes_key:
        keys.append(_Keys("app", token, aes_key, bot.secret("corp_id") or ""))
    token, aes_key = bot.secret("aibot_token"), bot.secret("aibot_encoding_aes_key")
    if token and aes_key:
        keys.append(_Keys("aibot", token, aes_key, ""))  # an internal AI bot's receiver id is ""
    return keys


def _parse_xml(body: bytes) -> dict[str, str]:
    """The text of the root element's children (`<xml><MsgType>text</MsgType>…</xml>`). Any
    document type declaration is refused, so no entity can be declared, expanded or fetched."""
    fields: dict[str, str] = {}
    path: list[str] = []
    text: list[str] = []

    def refuse(*_args: Any) -> int:
        raise WebhookRejected(400, "malformed_payload", "XML with a document type declaration")

    def start(name: str, _attrs: dict[str, str]) -> None:
        path.append(name)
        text.clear()

    def end(name: str) -> None:
        if len(path) == 2:
            fields[name] = "".join(text)
        path.pop()
        text.clear()

    def data(value: str) -> None:
        if len(path) == 2:
            text.append(value)

    # The encoding is fixed: an `encoding=` declaration naming an unknown or odd codec would
    # otherwise raise LookupError or UnicodeError from inside expat.
    parser = expat.ParserCreate("utf-8")
    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.ExternalEntityRefHandler = refuse
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = data
    try:
        parser.Parse(body, True)
    except (expat.ExpatError, LookupError, ValueError) as exc:  # ValueError covers UnicodeError
        raise WebhookRejected(400, "malformed_payload", f"XML: {exc}"[:300]) from None
    return fields


def _same_origin(url: str, root: str) -> bool:
    a, b = urlsplit(url), urlsplit(root)
    return a.scheme in ("https", "http") and (a.scheme, a.netloc) == (b.scheme, b.netloc)


def _agent_id(bot: BotConfig) -> int | str:
    value = bot.secret("agent_id") or ""
    return int(value) if value.isdigit() else value


def _post_json(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], params: dict[str, str] | None = None
) -> Awaitable[httpx.Response]:
    # UTF-8 as is, not escaped: WeCom's limits count the content's bytes.
    return http.post(
        url,
        params=params,
        content=json.dumps(body, ensure_ascii=False).encode(),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )


def _response_call(response_url: str, content: str) -> PlatformCall:
    body = {"msgtype": "markdown", "markdown": {"content": content}}
    return PlatformCall(method="POST", path="", json=body, meta={"response_url": response_url})


def _classify(response: httpx.Response) -> tuple[SendOutcome | None, dict[str, Any]]:
    """(None, body) when WeCom said errcode 0; else the outcome, the errmsg in its detail."""
    early = http_outcome(response)
    if early is not None:
        return early, {}
    data = response_json(response)
    if data is None:
        return SendOutcome("retry", reason="bad_response", detail=f"HTTP {response.status_code}"), {}
    code = data.get("errcode", 0)
    if code == 0:
        return None, data
    detail = f"errcode {code}: {str(data.get('errmsg'))[:300]}"
    if code in _TOKEN_INVALID:
        return SendOutcome("retry", reason="token_expired", retry_after=0.0, detail=detail), {}
    if code in _RATE_LIMITED:
        return SendOutcome("retry", reason="rate_limited", retry_after=RATE_LIMITED_WAIT_S, detail=detail), {}
    if code in _SERVER_ERRORS:
        return SendOutcome("retry", reason="server_error", detail=detail), {}
    reason = _PERMANENT.get(code, "api_error") if isinstance(code, int) else "api_error"
    return SendOutcome("permanent", reason=reason, detail=detail), {}


def split_utf8(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` UTF-8 bytes, cut after a line break or a space where one
    is in the piece's last half, never inside a character."""
    pieces: list[str] = []
    while len(text.encode()) > limit:
        # The longest prefix within the limit (characters are 1 to 4 bytes).
        end = len(text.encode()[:limit].decode("utf-8", "ignore"))
        cut = max(text.rfind("\n", 0, end), text.rfind(" ", 0, end))
        cut = cut + 1 if cut >= end // 2 else end
        pieces.append(text[:cut])
        text = text[cut:]
    if text:
        pieces.append(text)
    return [p for p in pieces if p.strip()]


def _truncate_utf8(text: str, limit: int) -> str:
    if len(text.encode()) <= limit:
        return text
    return text.encode()[: limit - len("…".encode())].decode("utf-8", "ignore") + "…"


class _Parts(InboundParts):
    """Inbound content into segments and plain text."""

    def __init__(self, strip_mention: str | None = None) -> None:
        super().__init__()
        self.strip_mention = f"@{strip_mention}" if strip_mention else None

    def text(self, value: str) -> None:
        if self.strip_mention and value.startswith(self.strip_mention):
            value = value[len(self.strip_mention) :].lstrip()  # the AI bot's own @name, once
            self.strip_mention = None
        super().text(value)

    def media(self, kind: str, media_id: str) -> None:
        self.add_media(kind, "file", media_id)

    def item(self, item: dict[str, Any]) -> None:
        """One AI bot message item. Its images and files are URLs of encrypted content (each with its
        own key): shown as placeholders, not fetched."""
        kind = item.get("msgtype")
        if kind == "text":
            self.text(str(obj(item.get("text")).get("content") or ""))
        elif kind == "voice":  # WeCom gives the transcript
            self.text(str(obj(item.get("voice")).get("content") or ""))
        elif kind in ("image", "file"):
            self.text(media_placeholder(str(kind)))


class _Builder:
    """Segments into WeCom message bodies: runs of inline content as `text` (or `markdown` once a
    markdown segment is in the run), cut at the byte limits; media and links as their own messages."""

    def __init__(self, bot: BotConfig, outbound_id: str) -> None:
        self.bot = bot
        self.outbound_id = outbound_id
        self.items: list[tuple[str, Any, Media | None, str]] = []  # (msgtype, payload, media, segment)
        self.run: list[str] = []
        self.markdown = False

    def inline(self, value: str) -> None:
        self.run.append(value)

    def flush(self) -> None:
        content = "".join(self.run)
        if content.strip():
            self.items.append(("markdown" if self.markdown else "text", content, None, ""))
        self.run, self.markdown = [], False

    def add(self, index: int, segment: Any) -> None:
        if isinstance(segment, TextSegment):
            self.inline(segment.data.text)
        elif isinstance(segment, MarkdownSegment):
            self.inline(segment.data.content)
            self.markdown = True
        elif isinstance(segment, MentionSegment):
            self.inline(f"@{segment.data.target}")  # an app message cannot @-mention
        elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
            self.flush()
            media = segment.data.media
            kind = "image" if isinstance(segment, ImageSegment) else "file"  # voice needs AMR, video MP4
            self.items.append((kind, {"media_id": media.value} if media.kind == "file" else None, media, segment.type))
        elif isinstance(segment, ShareSegment):
            self.flush()
            self.items.append(("news", segment.data, None, segment.type))
        elif isinstance(segment, DiceSegment):
            self.inline(dice_text(self.outbound_id, index))
        elif isinstance(segment, RpsSegment):
            self.inline(rps_text(self.outbound_id, index))
        elif isinstance(segment, FaceSegment):
            self.inline(face_text(self.bot, segment.data.id))
        elif isinstance(segment, ForwardSegment):
            self.inline(notice(self.bot, "forward"))
        # reply: WeCom cannot quote; the one-to-one chat (or the AI bot's answer) says what it answers

    def bodies(self) -> list[tuple[str, dict[str, Any], Media | None, str]]:
        self.flush()
        out: list[tuple[str, dict[str, Any], Media | None, str]] = []
        for kind, payload, media, segment_type in self.items:
            if kind in ("text", "markdown"):
                limit = MAX_TEXT_BYTES if kind == "text" else MAX_MARKDOWN_BYTES
                out.extend((kind, {"content": piece}, None, "") for piece in split_utf8(payload, limit))
            elif kind == "news":
                title = _truncate_utf8(payload.title or payload.url, MAX_NEWS_TITLE_BYTES)
                out.append(("news", {"articles": [{"title": title, "url": payload.url}]}, None, ""))
            elif payload is not None:  # an existing media_id
                out.append((kind, payload, None, segment_type))
            else:
                out.append((kind, {}, media, segment_type))
        return out

    def as_markdown(self, limit: int) -> str:
        """Everything as one markdown message (the AI bot's one answer): media as the notice."""
        self.flush()
        parts: list[str] = []
        for kind, payload, media, segment_type in self.items:
            if kind in ("text", "markdown"):
                parts.append(payload)
            elif kind == "news":
                parts.append(f"[{payload.title or payload.url}]({payload.url})")
            elif media is not None:
                parts.append(attachment_unavailable(self.bot, segment_type, media.kind, "unsupported_by_platform"))
        return _truncate_utf8("\n".join(p for p in parts if p.strip()) or " ", limit)
