"""OneBot v11 (QQ through NapCat, Lagrange.OneBot, LLOneBot, go-cqhttp).

In: HTTP event reporting ("HTTP POST"), signed with `X-Signature: sha1=<hex HMAC-SHA1 of the body>`
when the implementation has a `secret`. Private and group `message` events, in the array or the
CQ-code string message format.
Out: the HTTP API (`send_private_msg` / `send_group_msg`), `Authorization: Bearer <access_token>`.
Or, with `transport = "ws-reverse"` / `"ws-forward"`, both over one WebSocket held by one worker
(`pipeline.connections.onebot`): its event frames go through `parse` here, and `send` hands the
action to the holder, wherever it is (`bind`).
Media go as bytes (`base64://…`) read by Switchboard: the implementations read any local path and
fetch any URL they are given, on the operator's machine and network, so a URL is fetched through
the SSRF guard here and never passed on. A `kind: file` value is passed only in the shape of the
implementations' own file ids.

Chat ids carry their kind (`private_<user>` / `group_<group>`) because QQ user numbers and group
numbers share one number space: without it a private chat and a group could share a conversation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import httpx

from pipeline.platforms._common import (
    SegmentData,
    attachment_unavailable,
    base_url,
    build_inbound,
    face_id_str,
    face_segment,
    face_text,
    http_outcome,
    load_failure,
    load_json,
    media_dict,
    media_placeholder,
    media_segment,
    mention_segment,
    missing_credential,
    network_outcome,
    notice,
    obj,
    payload_guard,
    reply_segment,
    response_json,
    same_secret,
    text_segment,
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
    SendStatus,
    WebhookRequest,
    WebhookResult,
)
from pipeline.platforms.exceptions import WebhookRejected
from pipeline.records import OutboundMessage, ReplyRef
from pipeline.records.models import ChatType
from pipeline.segments.media import spaced_placeholder
from pipeline.segments.models import (
    AudioSegment,
    DiceSegment,
    FaceSegment,
    FileSegment,
    ForwardSegment,
    ImageSegment,
    MarkdownSegment,
    Media,
    MediaKind,
    MentionSegment,
    ReplySegment,
    RpsSegment,
    ShareSegment,
    TextSegment,
    VideoSegment,
)
from pipeline.settings import BotConfig, RateLimit

DEFAULT_API_BASE = "http://127.0.0.1:3000"  # NapCat's default HTTP server port
DEFAULT_WS_URL = "ws://127.0.0.1:3001"  # NapCat's default WebSocket server port (transport ws-forward)
WS_TRANSPORTS = ("ws-reverse", "ws-forward")

# The file ids OneBot implementations report for received media and take back: NapCat's are 32 hex
# digits (a UUID without dashes), optionally followed by the image's file name extension; go-cqhttp's
# the MD5 in hex with `.image`/`.video`/`.amr`. Never a scheme or a path: NapCat reads any existing
# local path (it checks the file system before anything else), go-cqhttp joins the value to its cache
# directory.
_FILE_ID = re.compile(r"[0-9A-Fa-f]{32,128}(?:\.[A-Za-z0-9]{1,8})?")
FILE_ID_SHAPES = {"image": _FILE_ID, "audio": _FILE_ID, "video": _FILE_ID, "file": _FILE_ID}

# Segments QQ shows only alone in a message: each becomes its own send call.
_STANDALONE = {"record", "video", "file", "forward", "dice", "rps", "share"}
_MEDIA_TYPE = {"image": "image", "audio": "record", "video": "video", "file": "file"}

# retcode → (status, reason). 1400-1404 mirror the HTTP statuses (used over WebSocket); 100-201 are
# the codes documented by the CQHTTP lineage that most implementations kept. Anything else failed.
_RETCODES: dict[int, tuple[SendStatus, str]] = {
    100: ("permanent", "bad_request"),
    102: ("permanent", "failed"),
    103: ("permanent", "failed"),
    104: ("permanent", "unauthorized"),
    201: ("retry", "server_error"),
    1400: ("permanent", "bad_request"),
    1401: ("permanent", "unauthorized"),
    1403: ("permanent", "unauthorized"),
    1404: ("permanent", "unsupported_api"),
}


class HeldActionAnswer(Protocol):
    @property
    def response(self) -> Mapping[str, Any] | None: ...
    @property
    def error(self) -> str: ...
    @property
    def detail(self) -> str: ...
    @property
    def final(self) -> bool: ...


class HeldActions(Protocol):
    """Runs an action over the bot's held connection, from any worker (`pipeline.connections`)."""

    async def call(
        self, bot: BotConfig, action: str, params: Mapping[str, Any], request_id: str
    ) -> HeldActionAnswer: ...


class OneBotPlatform(Platform):
    name: ClassVar[str] = "onebot"
    required_credentials = ()  # per transport: `secret` (webhook), `access_token` (ws-reverse)
    # A reverse WebSocket is an endpoint on every worker that carries the bot's replies: never open.
    # A webhook without `secret` would take any request from anyone who knows its URL.
    transports = {"webhook": ("secret",), "ws-reverse": ("access_token",), "ws-forward": ()}
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset(
            {"text", "mention", "image", "audio", "video", "file", "reply", "forward", "face", "dice", "rps", "share"}
        ),
        max_text_chars=4000,
        max_attachment_bytes=30 * 1024 * 1024,
        markdown=False,
        # QQ publishes no bot limit; these stay below what trips its risk control in practice.
        default_chat_limit=RateLimit(count=20, per_seconds=60),
        default_bot_limit=RateLimit(count=5, per_seconds=1),
    )

    actions: HeldActions | None = None  # bound by the worker at start-up

    def bind(self, actions: HeldActions) -> None:
        self.actions = actions

    def settings_problems(self, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
        transport, api_base = entry.get("transport", "webhook"), entry.get("api_base")
        if not isinstance(api_base, str) or not api_base:
            return []
        websocket = api_base.startswith(("ws://", "wss://"))
        if transport == "ws-forward" and not websocket:
            return [("api_base", "ws-forward dials the implementation's WebSocket server: a ws:// or wss:// URL")]
        if transport == "webhook" and websocket:
            return [("api_base", "a webhook bot calls the implementation's HTTP API: an http:// or https:// URL")]
        return []

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        secret = bot.secret("secret")
        if not secret:  # required for webhook bots; a bot on a WebSocket takes no unsigned posts either
            raise WebhookRejected(401, "bad_signature", "no secret configured for this bot's webhook")
        given = (request.header("x-signature") or "").lower()
        expected = "sha1=" + hmac.new(secret.encode(), request.body, hashlib.sha1).hexdigest()
        if not same_secret(given, expected):
            raise WebhookRejected(401, "bad_signature")

    def startup_warnings(self, bot: BotConfig) -> list[str]:
        if bot.transport == "ws-forward":
            return missing_credential(
                bot,
                "access_token",
                "the implementation's WebSocket server, which Switchboard dials, accepts anyone who can "
                "reach it. Set access_token here and the same token in its WebSocket server settings",
            )
        return []  # webhook, ws-reverse: their credential is required (checked with the settings)

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        event = load_json(request.body)
        if not isinstance(event, dict):
            raise WebhookRejected(400, "malformed_payload", "event is not an object")
        post_type = event.get("post_type")
        if not isinstance(post_type, str):
            raise WebhookRejected(400, "malformed_payload", "no post_type")
        if post_type != "message":
            return WebhookResult(ignored="not_message")
        message_type = event.get("message_type")
        user_id = _id(event.get("user_id"))
        message_id = _id(event.get("message_id"))
        if message_type not in ("private", "group") or user_id is None or message_id is None:
            raise WebhookRejected(400, "malformed_payload", "message event without type/user/message id")
        self_id = bot.self_id or _id(event.get("self_id"))
        if user_id == self_id:
            return WebhookResult(ignored="own_message")
        raw = event.get("message")
        if isinstance(raw, str):
            items = parse_cq(raw)
        elif isinstance(raw, list) and all(isinstance(x, dict) for x in raw):
            items = raw
        else:
            raise WebhookRejected(400, "malformed_payload", "message is neither a string nor an array")

        chat_type: ChatType
        if message_type == "group":
            group_id = _id(event.get("group_id"))
            if group_id is None:
                raise WebhookRejected(400, "malformed_payload", "group message without group_id")
            chat_id, chat_type = f"group_{group_id}", "group"
        else:
            chat_id, chat_type = f"private_{user_id}", "private"

        sender = obj(event.get("sender"))
        segments: list[SegmentData] = []
        text: list[str] = []
        mentions: list[str] = []
        names: dict[str, str] = {}  # some implementations send the name with an `at`
        reply_to: ReplyRef | None = None
        for item in items:
            kind = item.get("type")
            data = obj(item.get("data"))
            if kind == "text":
                value = str(data.get("text", ""))
                if value:
                    segments.append(text_segment(value))
                    text.append(value)
            elif kind == "at":
                qq = str(data.get("qq", ""))
                if qq == "all":
                    text.append("@all")
                    continue
                if not qq:
                    continue
                mentions.append(qq)
                if qq == self_id:
                    # The bot's own mention is how the message addressed it (`mentions_bot`), not
                    # part of what was said: the agent would read a bare `@10001`. Ingest drops a
                    # mention of `bot.self_id`, but a bot may leave that unset and learn its number
                    # from the event, so it is left out here.
                    continue
                segments.append(mention_segment(qq))
                if isinstance(data.get("name"), str) and data["name"]:
                    names[qq] = data["name"]
                text.append(f"@{data.get('name') or qq}")
            elif kind == "reply":
                rid = _id(data.get("id"))
                if rid is not None:
                    segments.append(reply_segment(rid))
                    reply_to = ReplyRef(message_id=rid)
            elif kind in ("image", "record", "video", "file"):
                media = _media_in(data)
                if media is None:
                    continue
                neutral = {"record": "audio"}.get(kind, kind)
                segments.append(media_segment(neutral, *media))
                text.append(media_placeholder(neutral))
            elif kind == "face":
                face_id = data.get("id")
                if isinstance(face_id, str | int) and not isinstance(face_id, bool):
                    segments.append(face_segment(face_id))
                    text.append(face_text(bot, face_id))
            elif isinstance(kind, str):
                text.append(media_placeholder(kind))
        mentions_bot = self_id is not None and self_id in mentions
        time_s = event.get("time")
        message = build_inbound(
            self.name,
            bot,
            chat_id=chat_id,
            chat_type=chat_type,
            user_id=user_id,
            user_name=str(sender.get("card") or sender.get("nickname") or ""),
            is_admin=sender.get("role") in ("owner", "admin"),
            message_id=message_id,
            text="".join(text).strip(),
            segments=segments,
            mentions=mentions,
            mention_names=names,
            mentions_bot=mentions_bot,
            reply_to=reply_to,
            sent_at_ms=float(time_s) * 1000 if isinstance(time_s, int | float) else None,
        )
        return WebhookResult(messages=[message])

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        target_field, target = _target(message.chat_id, message.chat_type)
        api = "/send_group_msg" if target_field == "group_id" else "/send_private_msg"
        limit = self.profile.max_text_chars
        messages: list[list[dict[str, Any]]] = []
        current: list[dict[str, Any]] = []
        current_len = 0
        reply_id = message.reply_to_message_id

        def flush() -> None:
            nonlocal current, current_len
            if current:
                messages.append(current)
            current, current_len = [], 0

        def add_text(value: str) -> None:
            nonlocal current_len
            if not value:
                return
            if current_len + len(value) > limit:
                pieces = [p.text for p in split_rich(RichText(value), limit)] or [value]
                if current and current_len + len(pieces[0]) > limit:
                    flush()
                for piece in pieces[:-1]:
                    current.append(_seg("text", text=piece))
                    flush()
                value = pieces[-1]
            current.append(_seg("text", text=value))
            current_len += len(value)

        for segment in with_own_file_ids(bot, message.segments, FILE_ID_SHAPES):
            if isinstance(segment, TextSegment):
                add_text(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                add_text(to_plain(parse_markdown(segment.data.content)))
            elif isinstance(segment, MentionSegment):
                current.append(_seg("at", qq=segment.data.target))
            elif isinstance(segment, ReplySegment):
                reply_id = reply_id or segment.data.message_id
            elif isinstance(segment, FaceSegment):
                current.append(_seg("face", id=face_id_str(segment.data.id)))
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                ob_type = _MEDIA_TYPE[segment.type]
                seg = _seg(ob_type, file="")
                seg["_media"] = {**media_dict(segment.data.media), "segment": segment.type}
                if ob_type == "file":
                    seg["data"]["name"] = _file_name(segment.data.media)
                if ob_type in _STANDALONE:
                    flush()
                    messages.append([seg])
                else:
                    current.append(seg)
            elif isinstance(segment, ForwardSegment):
                flush()
                messages.append([_seg("forward", id=segment.data.forward_id)])
            elif isinstance(segment, DiceSegment | RpsSegment):
                flush()
                messages.append([_seg(segment.type)])
            elif isinstance(segment, ShareSegment):
                flush()
                messages.append([_seg("share", url=segment.data.url, title=segment.data.title)])
        flush()

        calls: list[PlatformCall] = []
        for index, msg in enumerate(messages):
            replied = any(c.meta.get("replied") for c in calls)
            if reply_id and msg[0]["type"] not in _STANDALONE and not replied:
                msg.insert(0, _seg("reply", id=reply_id))
            load: list[dict[str, Any]] = []
            for position, seg in enumerate(msg):
                media = seg.pop("_media", None)
                if media is None:
                    continue
                segment_type = media.pop("segment")
                if media["kind"] == "file":  # an id of the implementation's own shape (checked above)
                    seg["data"]["file"] = media["value"]
                else:  # url, path, base64: read (and fetched) by Switchboard at send time, sent as bytes
                    load.append({"position": position, "media": media, "segment": segment_type})
            # `call_id`: one id per call of this message, stable across retries and replays: over a held
            # connection, the action of a call asked for again is answered, not run twice.
            meta: dict[str, Any] = {
                "index": index,
                "replied": msg[0]["type"] == "reply",
                "call_id": f"{message.outbound_id}:{index}",
            }
            if load:
                meta["load"] = load
            body = {target_field: target, "message": msg}
            calls.append(PlatformCall(method="POST", path=api, json=body, meta=meta))
        return calls

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        body = dict(call.json or {})
        message = [dict(seg, data=dict(seg["data"])) for seg in body.get("message", [])]
        unavailable: list[int] = []
        for item in call.meta.get("load", []):
            position = item["position"]
            media = Media(**item["media"])
            try:
                blob, _mime = await load_media(media)
            except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
                attachment_unavailable(bot, item["segment"], media.kind, load_failure(exc))
                unavailable.append(position)
                continue
            message[position]["data"]["file"] = "base64://" + base64.b64encode(blob).decode()
        for position in unavailable:
            message[position] = _seg("text", text=_placeholder_at(bot, message, position, set(unavailable)))
        body["message"] = message
        if bot.transport in WS_TRANSPORTS:
            return await self._send_held(bot, call, body)
        headers = {}
        token = bot.secret("access_token")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = base_url(bot, DEFAULT_API_BASE) + call.path
        try:
            response = await http.request(call.method, url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        outcome = http_outcome(response)
        if outcome is not None:
            return outcome
        if response.status_code in (401, 403):
            return SendOutcome("permanent", reason="unauthorized", detail=f"HTTP {response.status_code}")
        if response.status_code == 404:
            return SendOutcome("permanent", reason="unsupported_api", detail=f"HTTP 404 {call.path}")
        if response.status_code >= 400:  # 400 bad body, 406 bad content type
            return SendOutcome("permanent", reason="bad_request", detail=f"HTTP {response.status_code}")
        data = response_json(response)
        if data is None:
            return SendOutcome("retry", reason="bad_response", detail=response.text[:200])
        return response_outcome(data)

    async def _send_held(self, bot: BotConfig, call: PlatformCall, body: dict[str, Any]) -> SendOutcome:
        """The action over the bot's WebSocket, held by one worker (maybe another one)."""
        if self.actions is None:
            return SendOutcome("retry", reason="no_holder", detail="this process routes no actions")
        request_id = str(call.meta.get("call_id") or uuid.uuid4().hex)
        answer = await self.actions.call(bot, call.path.lstrip("/"), body, request_id)
        if answer.response is None:
            # No holder or no answer in time: retried. Sent without a response (`outcome_unknown`):
            # final, since sending it again could post it twice.
            status: SendStatus = "permanent" if answer.final else "retry"
            return SendOutcome(status, reason=answer.error or "no_answer", detail=answer.detail[:500])
        return response_outcome(answer.response)


def response_outcome(data: Mapping[str, Any]) -> SendOutcome:
    """An action's response (the HTTP API's body, or a WebSocket frame: the same shape)."""
    status = data.get("status")
    if status in ("ok", "async"):  # async: accepted, to be sent by the implementation
        result = data.get("data")
        message_id = result.get("message_id") if isinstance(result, dict) else None
        return SendOutcome("delivered", platform_message_id=str(message_id) if message_id is not None else None)
    retcode = data.get("retcode")
    detail = f"retcode {retcode}: {data.get('message') or data.get('wording') or data.get('msg') or ''}"
    if isinstance(retcode, int) and retcode in _RETCODES:
        verdict, reason = _RETCODES[retcode]
        return SendOutcome(verdict, reason=reason, detail=detail[:500])
    # Any other failure (QQ refused, risk control, muted): a re-send would not help and could
    # post twice if the implementation actually sent it, so it is final.
    return SendOutcome("permanent", reason="failed", detail=detail[:500])


# --- helpers -------------------------------------------------------------------------------------


def _id(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _seg(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, "data": data}


def _shown(seg: dict[str, Any]) -> str:
    # What a OneBot segment shows inline, for spacing: its text, "" for a reply reference.
    if seg["type"] == "text":
        return str(seg["data"].get("text", ""))
    return "" if seg["type"] == "reply" else "x"


def _placeholder_at(bot: BotConfig, message: list[dict[str, Any]], position: int, placeholders: set[int]) -> str:
    """The notice for the media at `position`, set apart from the segments around it."""
    before = next((t for t in (_shown(s) for s in reversed(message[:position])) if t), None)
    after = None
    for later in range(position + 1, len(message)):
        if later in placeholders:
            break  # it sets itself apart
        if shown := _shown(message[later]):
            after = shown
            break
    return spaced_placeholder(notice(bot, "attachment_unavailable"), before, after)


def _target(chat_id: str, chat_type: str) -> tuple[str, int | str]:
    kind, _, number = chat_id.rpartition("_")
    if not kind:
        kind = chat_type
    field = "group_id" if kind == "group" else "user_id"
    return field, int(number) if number.isdigit() else number


def _media_in(data: dict[str, Any]) -> tuple[MediaKind, str] | None:
    """The kind and value of an inbound media segment's `Media`."""
    url = data.get("url")
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        return "url", url
    file = data.get("file") or data.get("file_id")
    if isinstance(file, str) and file:
        if file.startswith(("http://", "https://")):
            return "url", file
        return "file", file
    return None


def _file_name(media: Media) -> str:
    # The last element of a url/path, as a bare name: no separators, not hidden, not `..`.
    tail = media.value.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1].rsplit("\\", 1)[-1].replace("\0", "")
    return tail[:100] if media.kind in ("url", "path") and tail and not tail.startswith(".") else "file"


# CQ code: `[CQ:type,key=value,...]`; text escapes & [ ], parameter values also escape `,`.
_CQ = re.compile(r"\[CQ:([A-Za-z0-9_.-]+)((?:,[^,\]]*)*)\]")


def _unescape(value: str) -> str:
    return value.replace("&#44;", ",").replace("&#91;", "[").replace("&#93;", "]").replace("&amp;", "&")


def parse_cq(raw: str) -> list[dict[str, Any]]:
    """The CQ-code string format into the array format."""
    out: list[dict[str, Any]] = []
    pos = 0
    for match in _CQ.finditer(raw):
        if match.start() > pos:
            out.append(_seg("text", text=_unescape(raw[pos : match.start()])))
        data: dict[str, str] = {}
        for param in match.group(2).split(",")[1:]:
            key, _, value = param.partition("=")
            if key:
                data[key] = _unescape(value)
        out.append({"type": match.group(1), "data": data})
        pos = match.end()
    if pos < len(raw):
        out.append(_seg("text", text=_unescape(raw[pos:])))
    return out


def cq_escape(text: str, *, param: bool = False) -> str:
    out = text.replace("&", "&amp;").replace("[", "&#91;").replace("]", "&#93;")
    return out.replace(",", "&#44;") if param else out
