"""Matrix (the client-server API of a homeserver: Synapse, Dendrite, Conduit…).

In: room events read by `/sync` (transport `sync`, `pipeline.connections.matrix`) or pushed by the
homeserver to an application service (transport `appservice`, `pipeline.web.matrix_appservice`),
one frame per `m.room.message` event, made alike on both (`RoomView`):
`{"room_id", "direct", "event", "reply_sender", "sender_name"}` — the event
as the homeserver sent it, whether the room is a direct chat (listed in the bot's `m.direct` account
data, or with two joined members), who wrote the event it replies to, which the holder looked up,
and the sender's display name in the room, when a member event gave it. A
direct room is a private chat, any other a group. The bot is addressed by a mention
(`m.mentions.user_ids`; from a client without intentional mentions, a pill
`<a href="https://matrix.to/#/@bot:server">` in `formatted_body`, or its user id in `body`) or by a
reply to one of its messages. `m.notice` (what bots send), edits (`m.replace`) and the bot's own
events start no turn. Media arrive as their `mxc://` URI (a `kind: file` media the agent can send
back as it is).
Out (as the bot: its access token, or the `as_token` with `user_id`, `client_auth`):
`PUT /_matrix/client/v3/rooms/{roomId}/send/m.room.message/{txnId}`, the transaction id made
from the outbound id and the call's index, so a send retried after an unknown outcome is stored
once by the homeserver. Text as `body` plus `formatted_body` (`org.matrix.custom.html`): markdown,
links and mention pills; `m.mentions` always present, listing the users mentioned and never `room`,
so an `@room` an agent writes pings nobody. Replies with `m.relates_to` `m.in_reply_to` (inside the
thread, `rel_type: m.thread`, when the message came in one). Media other than an `mxc://` URI are
loaded through the SSRF-guarded loader and uploaded (`POST /_matrix/media/v3/upload`) first.
Encrypted rooms (`m.room.encrypted` events) cannot be read: see `pipeline.connections.matrix`.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Mapping
from html.parser import HTMLParser
from typing import Any, ClassVar
from urllib.parse import quote, unquote

import httpx

from pipeline.platforms._common import (
    InboundParts,
    attachment_unavailable,
    build_inbound,
    dice_text,
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
    response_json,
    retry_after_header,
    rps_text,
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

CLIENT = "/_matrix/client/v3"
UPLOAD_PATH = "/_matrix/media/v3/upload"
HTML_FORMAT = "org.matrix.custom.html"
# Characters of plain text per message. An event may be 64 KiB in all, `body` and `formatted_body`
# together; the HTML of a piece is kept within `_MAX_HTML_CHARS` (split again if escapes grew it).
MAX_TEXT = 4000
_MAX_HTML_CHARS = 16_000
MAX_ATTACHMENT = 50 * 1024 * 1024  # Synapse's default `max_upload_size`
# A user id `@localpart:server`; a room id `!opaque:server` (room versions 12+: `!opaque`).
USER_ID = re.compile(r"@[^\s:/]{1,255}:[A-Za-z0-9.:\[\]-]{1,255}")
ROOM_ID = re.compile(r"![^\s/]{1,255}")
# An `mxc://server/media-id` content URI: the platform's own file id.
MXC = re.compile(r"mxc://[A-Za-z0-9.:\[\]-]{1,255}/[A-Za-z0-9_-]{1,255}")
FILE_ID_SHAPES = {"image": MXC, "audio": MXC, "video": MXC, "file": MXC}
_PILL = re.compile(r"https://matrix\.to/#/(@[^/?]+)")
# Transaction ids: unreserved URL characters only, so the path needs no escaping.
_TXN_UNSAFE = re.compile(r"[^A-Za-z0-9._~-]")

_MEDIA_MSGTYPES = {"m.image": "image", "m.file": "file", "m.audio": "audio", "m.video": "video"}
_MSGTYPE_OF = {"image": "m.image", "file": "m.file", "audio": "m.audio", "video": "m.video"}
# Matrix error codes no retry changes, as bounded reason labels.
_PERMANENT_ERRCODES = {
    "M_FORBIDDEN": "forbidden",
    "M_UNKNOWN_TOKEN": "unauthorized",
    "M_MISSING_TOKEN": "unauthorized",
    "M_NOT_FOUND": "not_found",
    "M_TOO_LARGE": "too_large",
    "M_BAD_JSON": "bad_request",
    "M_NOT_JSON": "bad_request",
    "M_INVALID_PARAM": "bad_request",
    "M_UNKNOWN": "bad_request",
}


def txn_id(outbound_id: str, index: int) -> str:
    """The transaction id of an outbound message's `index`th call: the same on every retry, by any
    worker, so the homeserver stores the event once."""
    safe = _TXN_UNSAFE.sub("_", outbound_id)
    if len(safe) > 200:  # never truncated into another message's id: a digest stands for the rest
        safe = safe[:100] + "." + hashlib.sha256(outbound_id.encode()).hexdigest()[:32]
    return f"sb.{safe}.{index}"


def send_path(room_id: str, txn: str) -> str:
    return f"{CLIENT}/rooms/{quote(room_id, safe='')}/send/m.room.message/{txn}"


def client_auth(bot: BotConfig) -> tuple[dict[str, str], dict[str, str]]:
    """The headers and query parameters that authenticate a client-server API call as the bot: its
    `access_token` (transport `sync`), or the application service's `as_token` acting as the bot's
    user (`appservice`: `user_id` names it; the spec lets an application service act as its sender
    or any user of its namespace this way). Tokens go in the header only, never a query string."""
    if bot.transport == "appservice":
        return {"Authorization": f"Bearer {bot.secret('as_token') or ''}"}, {"user_id": bot.self_id or ""}
    return {"Authorization": f"Bearer {bot.secret('access_token') or ''}"}, {}


class MatrixPlatform(Platform):
    name: ClassVar[str] = "matrix"
    # `sync`: `/sync` long polling held by one worker (`pipeline.connections.matrix`), with the bot
    # account's `access_token`. `appservice`: the homeserver pushes transactions to any worker
    # (`pipeline.web.matrix_appservice`), authenticated by the `hs_token`; sends use the `as_token`.
    transports = {"sync": ("access_token",), "appservice": ("hs_token", "as_token")}
    pushed_transports = frozenset({"appservice"})
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "mention", "reply", "image", "audio", "video", "file"}),
        max_text_chars=MAX_TEXT,
        max_attachment_bytes=MAX_ATTACHMENT,
        max_caption_chars=MAX_TEXT,
        markdown=True,
        # Synapse's default `rc_message` lets a user send 0.2 messages a second after a burst of 10;
        # a bot's operator usually lifts it (the admin API's `override_ratelimit`). These defaults
        # stay under the burst per room and near Synapse's rate per bot; a 429 says how long to wait.
        default_chat_limit=RateLimit(count=10, per_seconds=10),
        default_bot_limit=RateLimit(count=10, per_seconds=10),
    )

    def settings_problems(self, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        self_id = entry.get("self_id")
        if not (isinstance(self_id, str) and USER_ID.fullmatch(self_id)):
            # Without it the bot's own events and mentions of it cannot be told from others'.
            problems.append(("self_id", "required for Matrix: the bot's full user id, @name:server"))
        api_base = entry.get("api_base")
        if not (isinstance(api_base, str) and api_base.startswith(("https://", "http://"))):
            problems.append(("api_base", "required for Matrix: the homeserver's client-server API URL, https://…"))
        return problems

    # --- in --------------------------------------------------------------------------------------

    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        # Frames come from the sync holder and the application-service route, which hand them to
        # `parse` themselves; `/webhooks/matrix/{bot}` itself takes nothing (`transports` has no
        # `webhook`; the application service's paths are below it, `pipeline.web.matrix_appservice`).
        raise WebhookRejected(401, "bad_signature", "Matrix bots take no plain webhooks")

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        frame = load_json(request.body)
        if not isinstance(frame, dict) or not isinstance(frame.get("event"), dict):
            raise WebhookRejected(400, "malformed_payload", "not a Matrix frame (no event)")
        room_id, event = frame.get("room_id"), frame["event"]
        if not isinstance(room_id, str) or not ROOM_ID.fullmatch(room_id):
            raise WebhookRejected(400, "malformed_payload", "room_id missing or not a room id")
        event_id, sender = event.get("event_id"), event.get("sender")
        if not isinstance(event_id, str) or not event_id or not isinstance(sender, str) or not sender:
            raise WebhookRejected(400, "malformed_payload", "event_id or sender missing")
        if event.get("type") != "m.room.message":
            return WebhookResult(ignored="not_message")
        if sender == bot.self_id:
            return WebhookResult(ignored="own_message")
        content = obj(event.get("content"))
        relates = obj(content.get("m.relates_to"))
        if relates.get("rel_type") == "m.replace":
            return WebhookResult(ignored="edit")
        msgtype = content.get("msgtype")
        if msgtype == "m.notice":  # what bots send: answering them would let two bots talk for ever
            return WebhookResult(ignored="notice")
        body = content.get("body")
        if not isinstance(body, str):
            return WebhookResult(ignored="unsupported_message")  # redacted, or not a message

        parent = obj(relates.get("m.in_reply_to")).get("event_id")
        # In a thread, `is_falling_back` marks `m.in_reply_to` as a fallback for clients without
        # threads (it points at the thread's latest event), not a reply the user chose.
        fallback = relates.get("rel_type") == "m.thread" and relates.get("is_falling_back") is True
        in_reply_to = parent if isinstance(parent, str) and parent and not fallback else None
        is_reply = in_reply_to is not None
        parts = InboundParts()
        if msgtype in _MEDIA_MSGTYPES:
            url = content.get("url")
            kind = _MEDIA_MSGTYPES[msgtype]
            if isinstance(url, str) and MXC.fullmatch(url):
                parts.add_media(kind, "file", url)
            else:  # an encrypted attachment (`file`), or a URL that is no content URI
                parts.text(f"[{kind}]")
            filename = content.get("filename")
            if isinstance(filename, str) and filename and filename != body:
                parts.text(" " + body)  # the body is a caption when a file name is given apart
        elif msgtype in ("m.text", "m.emote"):
            formatted = content.get("formatted_body")
            if content.get("format") == HTML_FORMAT and isinstance(formatted, str):
                _read_html(formatted, parts)
            else:
                parts.text(_strip_reply_fallback(body) if is_reply else body)
            if msgtype == "m.emote":
                parts.plain.insert(0, "* ")
        else:
            return WebhookResult(ignored="unsupported_message")
        if not parts.segments and not parts.plain:
            return WebhookResult(ignored="unsupported_message")

        mentions_bot = bot.self_id is not None and bot.self_id in parts.mentions
        declared = content.get("m.mentions")
        if isinstance(declared, dict):  # intentional mentions: the list is what counts
            users = [u for u in declared.get("user_ids") or [] if isinstance(u, str)]
            for user in users:
                if user not in parts.mentions:
                    parts.mentions.append(user)
            mentions_bot = bot.self_id is not None and bot.self_id in users
        elif not mentions_bot and _names_bot(bot, body):
            mentions_bot = True  # a client without m.mentions: the user id or display name typed out

        reply_to: ReplyRef | None = None
        if in_reply_to is not None:
            reply_sender = frame.get("reply_sender")
            author = reply_sender if isinstance(reply_sender, str) and reply_sender else None
            is_bot = author is not None and author == bot.self_id
            reply_to = ReplyRef(message_id=in_reply_to, user_id=author, is_bot=is_bot)
            parts.segments.insert(0, reply_segment(in_reply_to))
        route: dict[str, str] = {}
        if relates.get("rel_type") == "m.thread" and isinstance(relates.get("event_id"), str):
            route["thread_root"] = relates["event_id"]

        ts = event.get("origin_server_ts")
        message = build_inbound(
            self.name,
            bot,
            chat_id=room_id,
            chat_type="private" if frame.get("direct") is True else "group",
            user_id=sender,
            user_name=_name(frame.get("sender_name"), sender),
            message_id=event_id,
            event_id=event_id,
            text="".join(parts.plain).strip(),
            segments=parts.segments,
            mentions=parts.mentions,
            mention_names=parts.names,
            mentions_bot=mentions_bot,
            reply_to=reply_to,
            route=route,
            sent_at_ms=float(ts) if isinstance(ts, int) and not isinstance(ts, bool) else None,
        )
        return WebhookResult(messages=[message])

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        room_id = message.chat_id
        reply_id = message.reply_to_message_id
        thread_root = message.route.get("thread_root")
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
                if USER_ID.fullmatch(target):
                    rich.append(target[1:].split(":", 1)[0], "mention", user=target)
                else:
                    rich.append(target if target.startswith("@") else f"@{target}")
            elif isinstance(segment, ReplySegment):
                reply_id = reply_id or segment.data.message_id
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                flush()
                blocks.append(("media", segment))
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

        contents: list[tuple[dict[str, Any], Any]] = []
        for kind, value in blocks:
            if kind == "text":
                for piece in _pieces(value):
                    contents.append((_text_content(piece), None))
            else:
                # No mentions in a media message: clients notify nobody for it.
                contents.append(({"msgtype": _MSGTYPE_OF[value.type], "body": value.type, "m.mentions": {}}, value))

        calls: list[PlatformCall] = []
        for index, (content, segment) in enumerate(contents):
            relation = _relation(reply_id if index == 0 else None, thread_root)
            if relation:
                content["m.relates_to"] = relation
            path = send_path(room_id, txn_id(message.outbound_id, index))
            if segment is None:
                calls.append(PlatformCall(method="PUT", path=path, json=content))
            else:
                calls.append(
                    PlatformCall(
                        method="PUT", path=path, json=content, media=segment.data.media, meta={"segment": segment.type}
                    )
                )
        return calls

    async def send(
        self, bot: BotConfig, call: PlatformCall, http: httpx.AsyncClient, load_media: MediaLoader
    ) -> SendOutcome:
        root = (bot.api_base or "").rstrip("/")
        headers, params = client_auth(bot)
        content = dict(call.json or {})
        media = call.media
        try:
            if media is not None:
                if media.kind == "file":  # an mxc:// URI (`with_own_file_ids` let no other through)
                    content["url"] = media.value
                    content["body"] = file_name(media, None, default=str(content.get("body") or "file"))
                else:
                    segment_type = str(call.meta.get("segment", "file"))
                    uploaded = await _upload(bot, root, (headers, params), media, http, load_media, segment_type)
                    if isinstance(uploaded, SendOutcome):
                        if uploaded.status != "permanent" or uploaded.reason != "media_unavailable":
                            return uploaded
                        # The media could not be read: the notice instead, in the same transaction.
                        relation = (call.json or {}).get("m.relates_to")
                        content = {"msgtype": "m.text", "body": uploaded.detail, "m.mentions": {}}
                        if relation:
                            content["m.relates_to"] = relation
                    else:
                        url, name, mime, size = uploaded
                        content.update(url=url, body=name, filename=name, info={"mimetype": mime, "size": size})
            response = await http.request(call.method, root + call.path, json=content, headers=headers, params=params)
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        return _classify(response)

    async def typing(self, bot: BotConfig, chat_id: str, http: httpx.AsyncClient) -> None:
        if not bot.self_id:
            return
        url = (
            f"{(bot.api_base or '').rstrip('/')}{CLIENT}/rooms/{quote(chat_id, safe='')}"
            f"/typing/{quote(bot.self_id, safe='')}"
        )
        headers, params = client_auth(bot)
        try:
            await http.put(url, json={"typing": True, "timeout": 30_000}, headers=headers, params=params)
        except httpx.HTTPError:
            pass  # a typing indicator is a courtesy


# --- inbound HTML ----------------------------------------------------------------------------------


class _BodyReader(HTMLParser):
    """`formatted_body` → text and mention segments: a pill (`<a href="https://matrix.to/#/@u:s">`)
    is a mention; the reply fallback (`<mx-reply>`) is left out; line breaks and paragraphs become
    newlines; every other tag is dropped, its text kept."""

    def __init__(self, parts: InboundParts) -> None:
        super().__init__(convert_charrefs=True)
        self.parts = parts
        self.skip = 0  # depth inside <mx-reply>
        self.pill: str | None = None
        self.pill_text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "mx-reply":
            self.skip += 1
        elif self.skip:
            return
        elif tag == "a":
            match = _PILL.match(dict(attrs).get("href") or "")
            if match and USER_ID.fullmatch(unquote(match.group(1))):
                self.pill, self.pill_text = unquote(match.group(1)), []
        elif tag in ("br", "p", "div", "li", "tr") and self.parts.plain:
            self.parts.text("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "mx-reply":
            self.skip = max(0, self.skip - 1)
        elif not self.skip and tag == "a" and self.pill is not None:
            name = "".join(self.pill_text).strip().lstrip("@")
            self.parts.add_mention(self.pill, name)
            self.pill = None

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.pill is not None:
            self.pill_text.append(data)
        else:
            self.parts.text(data)


def _names_bot(bot: BotConfig, body: str) -> bool:
    """Whether a body names the bot the way Matrix's legacy mention rules look for: its user id, or
    its display name (`username` in the bots file) as a word."""
    if bot.self_id and bot.self_id in body:
        return True
    name = (bot.username or "").strip()
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", body, re.IGNORECASE) is not None


def _name(given: Any, user_id: str) -> str:
    """The sender's display name the holder saw in the room, else the localpart of the user id."""
    return given if isinstance(given, str) and given else user_id[1:].split(":", 1)[0]


def _read_html(formatted: str, parts: InboundParts) -> None:
    reader = _BodyReader(parts)
    reader.feed(formatted)
    reader.close()


def _strip_reply_fallback(body: str) -> str:
    """A reply's `body` without the quoted lines older clients put first (`> <@u:s> text`)."""
    lines = body.split("\n")
    if not lines or not lines[0].startswith("> "):
        return body
    i = 0
    while i < len(lines) and lines[i].startswith(">"):
        i += 1
    return "\n".join(lines[i + 1 if i < len(lines) and not lines[i] else i :])


# --- outbound --------------------------------------------------------------------------------------


def to_html(rich: RichText) -> str:
    """`formatted_body`: the subset of HTML Matrix clients render; mentions as pills."""
    tags = {"bold": "strong", "italic": "em", "strike": "del", "code": "code"}

    def wrap(span: Span, inner: str, raw: str) -> str:
        if span.kind == "mention" and span.user:
            href = html.escape("https://matrix.to/#/" + quote(span.user, safe="@:"), quote=True)
            return f'<a href="{href}">{inner}</a>'
        if span.kind == "link" and span.url:
            return f'<a href="{html.escape(span.url, quote=True)}">{inner}</a>'
        if span.kind == "pre":
            lang = f' class="language-{html.escape(span.language, quote=True)}"' if span.language else ""
            return f"<pre><code{lang}>{html.escape(raw, quote=False)}</code></pre>"
        if span.kind == "code":
            return f"<code>{html.escape(raw, quote=False)}</code>"
        tag = tags.get(span.kind)
        return f"<{tag}>{inner}</{tag}>" if tag else inner

    return render_tree(rich, lambda t: html.escape(t, quote=False).replace("\n", "<br/>"), wrap)


def _pieces(rich: RichText) -> list[RichText]:
    """`rich` cut into messages whose HTML stays within the limit."""
    out: list[RichText] = []
    limit = MAX_TEXT
    for piece in split_rich(rich, limit):
        if len(to_html(piece)) > _MAX_HTML_CHARS:
            out.extend(split_rich(piece, limit // 4))
        else:
            out.append(piece)
    return out


def _text_content(piece: RichText) -> dict[str, Any]:
    users = sorted({s.user for s in piece.spans if s.kind == "mention" and s.user})
    content: dict[str, Any] = {"msgtype": "m.text", "body": to_plain(piece)}
    if piece.spans:
        content["format"] = HTML_FORMAT
        content["formatted_body"] = to_html(piece)
    # Always present: with it, clients notify only the users listed (never the room for `@room`).
    content["m.mentions"] = {"user_ids": users} if users else {}
    return content


def _relation(reply_id: str | None, thread_root: str | None) -> dict[str, Any]:
    relation: dict[str, Any] = {}
    if thread_root:
        relation = {"rel_type": "m.thread", "event_id": thread_root}
        # A threaded message that answers no particular one points at the thread's last (the
        # root) for clients without threads, and says it is only a fallback.
        relation["m.in_reply_to"] = {"event_id": reply_id or thread_root}
        if not reply_id:
            relation["is_falling_back"] = True
    elif reply_id:
        relation["m.in_reply_to"] = {"event_id": reply_id}
    return relation


async def _upload(
    bot: BotConfig,
    root: str,
    auth: tuple[dict[str, str], dict[str, str]],
    media: Media,
    http: httpx.AsyncClient,
    load_media: MediaLoader,
    segment_type: str,
) -> tuple[str, str, str, int] | SendOutcome:
    """Load the media (SSRF-guarded) and upload it to the content repository: its mxc URI, file
    name, MIME type and size; or the outcome (`media_unavailable` carries the notice text)."""
    try:
        data, mime = await load_media(media)
    except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
        text = attachment_unavailable(bot, segment_type, media.kind, load_failure(exc))
        return SendOutcome("permanent", reason="media_unavailable", detail=text)
    name = file_name(media, mime)
    mime = mime or "application/octet-stream"
    headers, params = auth
    response = await http.post(
        root + UPLOAD_PATH,
        params={**params, "filename": name},
        content=data,
        headers={**headers, "Content-Type": mime},
    )
    data_json = response_json(response)
    uri = data_json.get("content_uri") if data_json else None
    if response.status_code == 200 and isinstance(uri, str) and MXC.fullmatch(uri):
        return uri, name, mime, len(data)
    return _classify(response)


def _classify(response: httpx.Response) -> SendOutcome:
    data = response_json(response) or {}
    if 200 <= response.status_code < 300:
        event_id = data.get("event_id")
        return SendOutcome("delivered", platform_message_id=event_id if isinstance(event_id, str) else None)
    errcode = str(data.get("errcode") or "")
    error = str(data.get("error") or "")[:300]
    detail = f"HTTP {response.status_code} {errcode}: {error}".strip()
    if response.status_code == 429 or errcode == "M_LIMIT_EXCEEDED":
        retry_ms = data.get("retry_after_ms")
        after = retry_after_header(response.headers.get("retry-after"))
        if isinstance(retry_ms, int | float) and not isinstance(retry_ms, bool):
            after = float(retry_ms) / 1000
        return SendOutcome("retry", reason="rate_limited", retry_after=after, detail=detail)
    generic = http_outcome(response)
    if generic is not None:
        generic.detail = detail
        return generic
    reason = _PERMANENT_ERRCODES.get(errcode) or {401: "unauthorized", 403: "forbidden", 404: "not_found"}.get(
        response.status_code, "bad_request"
    )
    return SendOutcome("permanent", reason=reason, detail=detail)


__all__ = ["FILE_ID_SHAPES", "MatrixPlatform", "client_auth", "send_path", "to_html", "txn_id"]
