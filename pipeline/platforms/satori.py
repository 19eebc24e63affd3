"""Satori (a protocol whose servers, Koishi's `server-satori` among them, bridge QQ, KOOK, Discord,
Telegram, LINE, Matrix… behind one WebSocket and one HTTP API).

One bot entry is one *login* of a Satori server: the login's platform (`credentials.platform`, e.g.
`discord`) and its user id (`self_id`). A server with several logins gets one bot entry per login;
each entry holds its own connection and takes only the events of its login (the others are counted
`other_login` and dropped), so each login has its own lease, conversations and rate limits.

In, with `transport = "websocket"` (`pipeline.connections.satori`): the events of the server's
`/v1/events` WebSocket, each `message-created` event's body through `parse` here. With
`transport = "webhook"`: the server's WebHook POSTs to `/webhooks/satori/{bot_id}`, authenticated by
`Authorization: Bearer <token>` (the server's token), the same event bodies. A message in a channel
whose type is not DIRECT is a group message, addressed to the bot when it mentions it
(`<at id="self_id"/>`) or quotes one of its messages; a DIRECT one always is. The login's own
messages are ignored.
Message content is Satori's element syntax (XML-like, HTML's escapes): read with the standard
library's HTML tokenizer (`html.parser`), so entities and attributes are decoded as the spec asks.
Elements: text, `at` (a mention; `type="all"` as text), `quote` (a reply), `img`/`audio`/`video`/
`file` (media by http(s) URL; the server's own, `internal:` or under its `/v1/proxy/`, read by
Switchboard with the token for the session, `fetch_media`; `data:` sources as the placeholder),
`sharp`, `a`, `br`, `p`, formatting elements (their text); any other element is read as its
children's text, as the spec says a client should.
Out: `POST {api_base}/v1/message.create` with `Authorization: Bearer <token>` and the login's headers
(`Satori-Platform`, `Satori-User-ID`, and the v1.0 names `X-Platform`, `X-Self-ID` for older
servers, as the official SDK sends them). Text is escaped (`&`, `<`, `>`, and `"` in attributes), so
nothing an agent writes becomes an element; markdown becomes `<b>`, `<i>`, `<s>`, `<code>`, `<a>`;
mentions `<at id/>`; the reply `<quote id/>` in the first message. Media are read by Switchboard
(the SSRF-guarded loader) and sent inline as `data:` URLs, one message each: a URL an agent gives
is never handed to the server to fetch on the operator's network. `kind: file` has no meaning across
Satori's platforms: the notice. Satori itself publishes no limits; the underlying platform's apply.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from html.parser import HTMLParser
from typing import Any, ClassVar
from urllib.parse import quote

import httpx

from pipeline.platforms._common import (
    InboundParts,
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
    read_capped,
    reply_segment,
    response_json,
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
from pipeline.records import OutboundMessage, ReplyRef
from pipeline.records.models import ChatType
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

# Koishi's server-satori serves under `/satori` of its port (5140): set api_base to that base.
DEFAULT_API_BASE = "http://127.0.0.1:5140"
API_VERSION = "/v1"
MAX_TEXT = 4000  # Satori sets none; the platforms behind it do (QQ about 4,500, Discord 2,000)
MAX_ATTACHMENT = 8 * 1024 * 1024  # inline as a data: URL in the JSON body
DIRECT = 1  # Channel.type of a private chat
INTERNAL = "internal:"  # a resource only the server can read (`internal:{platform}/{self_id}/…`)

_MEDIA_ELEMENT = {"image": "img", "audio": "audio", "video": "video", "file": "file"}
_MEDIA_IN = {"img": "image", "image": "image", "audio": "audio", "video": "video", "file": "file"}
# Elements that contain no text of the message.
_SILENT = {"author", "button", "script", "style"}
# Elements that never hold others (written `<at …>` without a closing tag by lenient servers).
_EMPTY = {"at", "sharp", "br", "img", "image", "audio", "video", "file", "emoji"}
_STATUS_REASONS = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "unsupported_api", 413: "too_large"}


class SatoriPlatform(Platform):
    name: ClassVar[str] = "satori"
    fetches_media: ClassVar[bool] = True
    # `platform`: the login's platform, as the server's READY names it (`discord`, `qq`, `onebot`…).
    required_credentials = ("platform",)
    # A webhook must be authenticated; the WebSocket is dialed by Switchboard (a token the server
    # wants: a warning without one, like OneBot's ws-forward).
    transports = {"webhook": ("token",), "websocket": ()}
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "mention", "reply", "image", "audio", "video", "file", "share"}),
        max_text_chars=MAX_TEXT,
        max_attachment_bytes=MAX_ATTACHMENT,
        markdown=True,
        # Satori publishes no limits; QQ (the most common login) trips risk control above these.
        default_chat_limit=RateLimit(count=20, per_seconds=60),
        default_bot_limit=RateLimit(count=5, per_seconds=1),
    )

    def settings_problems(self, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
        self_id = entry.get("self_id")
        if not isinstance(self_id, str | int) or not str(self_id):
            # The login's user id: which of the server's logins this entry is, and its mentions.
            return [("self_id", "required for Satori: the login's user id (READY's `login.user.id`)")]
        return []

    def startup_warnings(self, bot: BotConfig) -> list[str]:
        if bot.secret("token"):
            return []
        return [
            "no token credential: Switchboard identifies to the Satori server without one; set the "
            "server's token (Koishi: server-satori's `token`) here and there, or anyone who reaches "
            "the server can read the bot's events and send as it"
        ]

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        token = bot.secret("token") or ""
        authorization = request.header("authorization") or ""
        given = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        if not token or not same_secret(given, token):
            raise WebhookRejected(401, "bad_signature", "Authorization is not the bearer token")

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        opcode = request.header("satori-opcode")
        if opcode is not None and opcode.strip() != "0":  # a webhook's META: logins changed
            return WebhookResult(ignored="meta")
        event = load_json(request.body)
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise WebhookRejected(400, "malformed_payload", "event without type")
        if not self._own_login(bot, event):
            return WebhookResult(ignored="other_login")
        if event["type"] != "message-created":
            return WebhookResult(ignored="not_message")
        return self._message(bot, event)

    @staticmethod
    def _own_login(bot: BotConfig, event: dict[str, Any]) -> bool:
        login = obj(event.get("login"))
        platform = login.get("platform", event.get("platform"))
        self_id = obj(login.get("user")).get("id", event.get("self_id"))
        return platform == bot.secret("platform") and str(self_id) == bot.self_id

    def _message(self, bot: BotConfig, event: dict[str, Any]) -> WebhookResult:
        message, channel = obj(event.get("message")), obj(event.get("channel"))
        user = obj(event.get("user")) or obj(message.get("user"))
        message_id, channel_id, user_id = message.get("id"), channel.get("id"), user.get("id")
        if not all(isinstance(v, str) and v for v in (message_id, channel_id, user_id)):
            raise WebhookRejected(400, "malformed_payload", "message-created without message.id/channel.id/user.id")
        assert isinstance(message_id, str) and isinstance(channel_id, str) and isinstance(user_id, str)
        if user_id == bot.self_id:
            return WebhookResult(ignored="own_message")
        reader = read_content(message.get("content"), bot.self_id or "", proxy_prefix(bot))
        parts = reader.parts
        reply_to = reader.reply_to
        quoted = obj(message.get("quote"))
        if reply_to is None and isinstance(quoted.get("id"), str) and quoted["id"]:
            author = obj(quoted.get("user")).get("id")
            text = "".join(read_content(quoted.get("content"), bot.self_id or "").parts.plain).strip()
            reply_to = ReplyRef(
                message_id=quoted["id"],
                user_id=author if isinstance(author, str) else None,
                text=text or None,
                is_bot=author == bot.self_id,
            )
            parts.segments.insert(0, reply_segment(quoted["id"]))
        chat_type: ChatType = "private" if _is_direct(channel, event) else "group"
        member = obj(event.get("member")) or obj(message.get("member"))
        mentions = list(dict.fromkeys(parts.mentions))
        mentions_bot = reader.mentions_bot or (reply_to is not None and reply_to.is_bot)
        guild_id = obj(event.get("guild")).get("id")
        route = {"guild_id": str(guild_id)} if guild_id else {}
        inbound = build_inbound(
            self.name,
            bot,
            chat_id=channel_id,
            chat_type=chat_type,
            user_id=user_id,
            user_name=_name(member, user),
            message_id=message_id,
            text="".join(parts.plain).strip(),
            segments=parts.segments,
            mentions=mentions,
            mention_names=parts.names,
            mentions_bot=mentions_bot,
            reply_to=reply_to,
            route=route,
            sent_at_ms=_ms(message.get("created_at")) or _ms(event.get("timestamp")),
        )
        return WebhookResult(messages=[inbound])

    async def fetch_media(
        self, bot: BotConfig, media: Media, http: httpx.AsyncClient, guarded: GuardedFetch, max_bytes: int
    ) -> bytes:
        """An `internal:` resource or one under the server's `/v1/proxy/`: read from the server (the
        address the operator set, so not through the SSRF guard, which refuses a server on loopback)
        with the token and the login's headers. Any other URL is not the server's to give."""
        prefix = proxy_prefix(bot)
        if media.kind != "file":
            raise MediaUnavailable("unsupported_by_platform")
        if media.value.startswith(INTERNAL):
            url = prefix + quote(media.value, safe=":/@")
        elif media.value.startswith(prefix):
            url = media.value
        else:
            raise MediaUnavailable("url_not_allowed")
        return await read_capped(http, url, api_headers(bot), max_bytes)

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        reply_to = message.reply_to_message_id
        for segment in message.segments:
            if isinstance(segment, ReplySegment):
                reply_to = segment.data.message_id
        calls: list[PlatformCall] = []
        rich = RichText()

        def add(content: str, meta: dict[str, Any] | None = None, media: Media | None = None) -> None:
            if not calls and reply_to:
                content = f'<quote id="{escape_attr(reply_to)}"/>' + content
            body = {"channel_id": message.chat_id, "content": content}
            calls.append(PlatformCall("POST", "/message.create", json=body, media=media, meta=meta or {}))

        def flush() -> None:
            nonlocal rich
            if not rich.is_blank():
                # Escapes make the content longer than the text (`&` is five characters): room for
                # that, so a piece is never cut inside an element.
                for text in pieces_within(rich, MAX_TEXT, to_elements, MAX_TEXT * 5):
                    add(text)
            rich = RichText()

        # Satori's platforms share no file ids: `kind: file` is the notice.
        for index, segment in enumerate(with_own_file_ids(bot, message.segments, {})):
            if isinstance(segment, TextSegment):
                rich.append(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                rich.extend(parse_markdown(segment.data.content))
            elif isinstance(segment, MentionSegment):
                rich.append(f"@{segment.data.target}", "mention", user=segment.data.target)
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                flush()
                add("", {"segment": segment.type}, segment.data.media)
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
        body = dict(call.json or {})
        if call.media is not None:
            segment_type = str(call.meta.get("segment", "file"))
            try:
                data, mime = await load_media(call.media)
            except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
                text = attachment_unavailable(bot, segment_type, call.media.kind, load_failure(exc))
                body["content"] += escape_text(text)
            else:
                body["content"] += media_element(segment_type, data, mime, file_name(call.media, mime))
        url = base_url(bot, DEFAULT_API_BASE) + API_VERSION + call.path
        try:
            response = await http.post(url, json=body, headers=api_headers(bot))
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        return _classify(response)


def proxy_prefix(bot: BotConfig) -> str:
    """Where the server proxies resources: `{api_base}/v1/proxy/`, followed by the resource's URL."""
    return base_url(bot, DEFAULT_API_BASE) + API_VERSION + "/proxy/"


def api_headers(bot: BotConfig) -> dict[str, str]:
    """The headers of every HTTP API call: the token, and which login acts (both spellings)."""
    platform, self_id = bot.secret("platform") or "", bot.self_id or ""
    headers = {"Satori-Platform": platform, "Satori-User-ID": self_id, "X-Platform": platform, "X-Self-ID": self_id}
    token = bot.secret("token")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _classify(response: httpx.Response) -> SendOutcome:
    outcome = http_outcome(response)
    if outcome is not None:
        return outcome
    status = response.status_code
    if 200 <= status < 300:
        try:
            created = response.json()
        except ValueError:
            created = None
        first = created[0] if isinstance(created, list) and created else None
        message_id = first.get("id") if isinstance(first, dict) else None
        return SendOutcome("delivered", platform_message_id=str(message_id) if message_id else None)
    body = response_json(response)
    message = str((body or {}).get("message") or response.text[:200])
    return SendOutcome(
        "permanent", reason=_STATUS_REASONS.get(status, "api_error"), detail=f"HTTP {status}: {message}"[:500]
    )


# --- elements --------------------------------------------------------------------------------------


def escape_text(text: str) -> str:
    """Text shown as written: `&`, `<`, `>` escaped, so no element can be formed from it."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_attr(value: str) -> str:
    """An attribute value inside double quotes."""
    return escape_text(value).replace('"', "&quot;")


def to_elements(rich: RichText) -> str:
    """Satori content: escaped text, formatting as elements, mentions as `<at id/>`."""
    tags = {"bold": "b", "italic": "i", "strike": "s", "code": "code"}

    def wrap(span: Span, inner: str, raw: str) -> str:
        if span.kind == "mention":
            return f'<at id="{escape_attr(span.user)}"/>' if span.user else inner
        if span.kind == "link":
            return f'<a href="{escape_attr(span.url)}">{inner}</a>' if span.url else inner
        if span.kind == "pre":
            return f"<code>{escape_text(raw)}</code>"
        tag = tags.get(span.kind)
        return f"<{tag}>{inner}</{tag}>" if tag else inner

    return render_tree(rich, escape_text, wrap)


def media_element(segment_type: str, data: bytes, mime: str, name: str) -> str:
    """An `img`/`audio`/`video`/`file` element with the bytes inline as a `data:` URL."""
    tag = _MEDIA_ELEMENT.get(segment_type, "file")
    src = f"data:{mime or 'application/octet-stream'};base64,{base64.b64encode(data).decode()}"
    title = f' title="{escape_attr(name)}"' if tag == "file" else ""
    return f'<{tag} src="{escape_attr(src)}"{title}/>'


class ContentReader(HTMLParser):
    """Satori message content into segments, mentions and the reply. Entities in text and
    attributes are decoded by the tokenizer (`convert_charrefs`)."""

    def __init__(self, self_id: str, proxy: str = "") -> None:
        super().__init__(convert_charrefs=True)
        self.self_id = self_id
        self.proxy = proxy  # the server's `/v1/proxy/` URL prefix: media there are the server's own
        self.parts = InboundParts()
        self.mentions_bot = False
        self.reply_to: ReplyRef | None = None
        self._stack: list[str] = []
        self._quote: dict[str, Any] | None = None  # the quote being read: its id, author, text
        self._links: list[tuple[int, str]] = []  # each open `a`: len(plain) where it started, its href

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._element(tag, {k: v or "" for k, v in attrs}, closed=False)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._element(tag, {k: v or "" for k, v in attrs}, closed=True)

    def handle_endtag(self, tag: str) -> None:
        if tag not in self._stack:
            return  # a stray closing tag: nothing to close
        while self._stack:
            open_tag = self._stack.pop()
            self._closed(open_tag)
            if open_tag == tag:
                return

    def handle_data(self, data: str) -> None:
        if any(tag in _SILENT for tag in self._stack):
            return
        if self._quote is not None:
            self._quote["text"] += data
            return
        self.parts.text(data)

    def _element(self, tag: str, attrs: dict[str, str], *, closed: bool) -> None:
        if self._quote is not None:  # inside a quote: only who wrote it matters
            if tag == "author" and attrs.get("id"):
                self._quote["author"] = attrs["id"]
            if not closed:
                self._stack.append(tag)
            return
        if tag == "at":
            self._at(attrs)
        elif tag == "sharp":
            self.parts.text(f"#{attrs.get('name') or attrs.get('id', '')}")
        elif tag in _MEDIA_IN:
            kind, src = _MEDIA_IN[tag], attrs.get("src") or attrs.get("url") or ""
            if src.startswith(INTERNAL) or (self.proxy and src.startswith(self.proxy)):
                # The server's own resources: read by Switchboard with the token (`fetch_media`).
                self.parts.add_media(kind, "file", src)
            elif src.startswith(("http://", "https://")):
                self.parts.add_media(kind, "url", src)
            else:  # data: sources and anything else
                self.parts.text(media_placeholder(kind))
        elif tag == "quote":
            self._quote = {"id": attrs.get("id", ""), "author": "", "text": ""}
            if closed:
                self._closed("quote")
        elif tag == "br":
            self.parts.text("\n")
        elif tag == "p" and self.parts.plain and not self.parts.plain[-1].endswith("\n"):
            self.parts.text("\n")
        elif tag == "emoji":
            self.parts.text(f":{attrs['name']}:" if attrs.get("name") else media_placeholder("emoji"))
        elif tag == "a":
            self._links.append((len(self.parts.plain), attrs.get("href", "")))
            if closed:
                self._closed("a")
        if not closed and tag not in _EMPTY:
            self._stack.append(tag)

    def _closed(self, tag: str) -> None:
        if tag == "quote" and self._quote is not None:
            quote, self._quote = self._quote, None
            if quote["id"] and self.reply_to is None:
                self.parts.segments.insert(0, reply_segment(quote["id"]))
                self.reply_to = ReplyRef(
                    message_id=quote["id"],
                    user_id=quote["author"] or None,
                    text=quote["text"].strip() or None,
                    is_bot=bool(quote["author"]) and quote["author"] == self.self_id,
                )
        elif tag == "p":
            self.parts.text("\n")
        elif tag == "a" and self._links:
            started, href = self._links.pop()
            if started == len(self.parts.plain) and href:
                self.parts.text(href)  # a link without text: its address

    def _at(self, attrs: dict[str, str]) -> None:
        target, kind = attrs.get("id", ""), attrs.get("type", "")
        if kind in ("all", "here"):
            self.parts.text(f"@{kind}")
        elif target == self.self_id and target:
            # How the message addressed the bot (`mentions_bot`), not part of what was said.
            self.mentions_bot = True
            self.parts.mentions.append(target)
        elif target:
            self.parts.add_mention(target, attrs.get("name", ""))
        elif attrs.get("name"):
            self.parts.text(f"@{attrs['name']}")


def read_content(content: Any, self_id: str, proxy: str = "") -> ContentReader:
    """Satori content (a string of elements) read; anything else read as empty."""
    reader = ContentReader(self_id, proxy)
    reader.feed(content if isinstance(content, str) else "")
    reader.close()
    return reader


def _is_direct(channel: dict[str, Any], event: dict[str, Any]) -> bool:
    kind = channel.get("type")
    if isinstance(kind, int) and not isinstance(kind, bool):
        return kind == DIRECT
    return not obj(event.get("guild")).get("id")  # servers before v1.1 may leave the type out


def _name(member: dict[str, Any], user: dict[str, Any]) -> str:
    for value in (member.get("nick"), member.get("name"), user.get("nick"), user.get("name")):
        if isinstance(value, str) and value:
            return value
    return ""


def _ms(value: Any) -> float | None:
    """A Satori timestamp (Unix milliseconds) as a float."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


__all__ = [
    "API_VERSION",
    "DEFAULT_API_BASE",
    "ContentReader",
    "SatoriPlatform",
    "api_headers",
    "escape_attr",
    "escape_text",
    "media_element",
    "to_elements",
]
