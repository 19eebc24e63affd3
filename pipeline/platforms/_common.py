"""Helpers shared by the platform modules: inbound record building, JSON reading, HTTP outcome
classification and the text fallbacks for segments a platform cannot show."""

from __future__ import annotations

import asyncio
import email.utils
import functools
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, ParamSpec, TypeVar

import httpx

from pipeline import metrics
from pipeline.platforms.base import SendOutcome, WebhookRequest
from pipeline.platforms.exceptions import WebhookRejected
from pipeline.records import MAX_ID_CHARS, InboundMessage, ReplyRef, conversation_key, new_trace_id, now_ms
from pipeline.records.models import ChatType
from pipeline.segments.exceptions import MediaUnavailable
from pipeline.segments.fetch import capped_body
from pipeline.segments.media import rejection_label, with_placeholders
from pipeline.segments.models import MEDIA_SEGMENT_TYPES, Media, MediaKind, Segment
from pipeline.settings import BotConfig

log = logging.getLogger("pipeline.platforms")

# --- inbound -------------------------------------------------------------------------------------


def load_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise WebhookRejected(400, "malformed_json", str(exc)[:200]) from None


P = ParamSpec("P")
R = TypeVar("R")


def payload_guard(fn: Callable[P, R]) -> Callable[P, R]:
    """Webhook bodies are untrusted: a value of an unexpected type that slips past the parser's
    checks becomes a 400, never a crash of the ingress (fuzzed webhooks: 0 crashes)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except WebhookRejected:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            # ValueError covers pydantic's ValidationError (a record field of the wrong type).
            raise WebhookRejected(400, "malformed_payload", f"{type(exc).__name__}: {exc}"[:300]) from None

    return wrapper


def require(obj: Any, key: str, kind: type | tuple[type, ...], reason: str = "malformed_payload") -> Any:
    """`obj[key]`, or a 400 naming the missing/mistyped field."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise WebhookRejected(400, reason, f"field {key!r} missing or not {_names(kind)}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    return "/".join(k.__name__ for k in _as_tuple(kind))


def missing_credential(bot: BotConfig, credential: str, consequence: str) -> list[str]:
    """A start-up warning when `credential` is not set: its name and what its absence leaves open."""
    return [] if bot.secret(credential) else [f"no {credential} credential: {consequence}"]


def require_fresh(bot: BotConfig, request: WebhookRequest, timestamp: str | None) -> None:
    """A signed request's timestamp (Unix seconds) within `bot.replay_window_seconds` of its receipt,
    else 401: the signature proves who sent it, the timestamp that it is not a recording."""
    # Unix seconds have 10 digits until the year 2286: a longer number is no timestamp (and one of
    # hundreds of digits would overflow the float arithmetic below).
    if not timestamp or len(timestamp) > 12 or not timestamp.isascii() or not timestamp.isdigit():
        raise WebhookRejected(401, "bad_signature", "no request timestamp")
    sent = int(timestamp)
    now = request.received_at_ms / 1000 if request.received_at_ms else time.time()
    if abs(now - sent) > bot.replay_window_seconds:
        raise WebhookRejected(
            401,
            "stale_timestamp",
            f"request timestamp {sent} is {now - sent:.0f} s from now; at most {bot.replay_window_seconds} s allowed",
        )


# --- request authentication ----------------------------------------------------------------------

# A header or query value the web front decoded as UTF-8 with `surrogateescape`: it may hold any
# character. Secrets, signatures, timestamps and nonces of every platform are ASCII, so a value
# that is not is refused before it reaches `str.encode()` or `hmac.compare_digest` (both raise on
# it: a 500 and a traceback instead of a 401).


def ascii_value(value: str | None, what: str) -> bytes:
    """`value` (a header or query value that goes into a signature) as ASCII bytes; "" when absent.
    A value with any other character is a 401: it cannot be what the platform signed."""
    try:
        return (value or "").encode("ascii")
    except UnicodeEncodeError:
        raise WebhookRejected(401, "bad_signature", f"{what} is not ASCII") from None


def same_secret(given: str | bytes | None, expected: str | bytes) -> bool:
    """Whether a secret or signature a request carries equals `expected`, in constant time, compared
    as bytes. An absent, empty or non-ASCII value never matches (and never raises)."""
    if not given or not expected:
        return False
    try:
        a = given if isinstance(given, bytes) else given.encode("ascii")
        b = expected if isinstance(expected, bytes) else expected.encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(a, b)


_WARNED_AT: dict[str, float] = {}
WARNING_INTERVAL_S = 60.0  # one warning per platform and kind a minute at most


def warn_limited(key: str, message: str, *args: object, logger: logging.Logger = log) -> None:
    """A WARNING at most once per `WARNING_INTERVAL_S` per `key`: a flood of bad requests is counted
    by a metric, not written to the log request by request."""
    now = time.monotonic()
    last = _WARNED_AT.get(key)
    if last is not None and now - last < WARNING_INTERVAL_S:
        return
    if len(_WARNED_AT) > 10_000:  # keys are platform, bot and reason: bounded, but never let it grow
        _WARNED_AT.clear()
    _WARNED_AT[key] = now
    logger.warning(message, *args)


def verify_guard(fn: Callable[P, None]) -> Callable[P, None]:
    """A platform's `verify`: the request is untrusted, so a value of an unexpected type or
    encoding that slips past its checks is a 401 (counted as `bad_signature`, with one warning a
    minute at most), never an exception that reaches the web front as a 500 and a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except WebhookRejected:
            raise
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            IndexError,
            LookupError,
            RecursionError,
            ArithmeticError,
        ) as exc:
            # ValueError covers UnicodeError; LookupError an unknown codec; ArithmeticError a number
            # too large for the arithmetic done on it.
            name = fn.__qualname__.split(".")[0]
            warn_limited(
                f"verify:{name}:{type(exc).__name__}",
                "%s: a request the check could not read (%s)",
                name,
                type(exc).__name__,
            )
            raise WebhookRejected(401, "bad_signature", f"unreadable request ({type(exc).__name__})") from None

    return wrapper


# Inbound segments are plain dicts of the segment models' shape, validated once with the whole
# record by `build_inbound`: one validation of plain data in pydantic's core costs a fraction of a
# model (and its data model) built one by one per segment. Every value put in them is already a str
# (or a face id's int), so deferring the validation changes no outcome.
SegmentData = dict[str, Any]


def text_segment(text: str) -> SegmentData:
    return {"type": "text", "data": {"text": text}}


def mention_segment(target: str) -> SegmentData:
    return {"type": "mention", "data": {"target": target}}


def media_segment(kind: str, media_kind: MediaKind, value: str) -> SegmentData:
    """`kind`: image, file, audio or video; `media_kind`, `value`: the segment's `Media`."""
    return {"type": kind, "data": {"media": {"kind": media_kind, "value": value}}}


def reply_segment(message_id: str) -> SegmentData:
    return {"type": "reply", "data": {"message_id": message_id}}


def face_segment(face_id: str | int) -> SegmentData:
    return {"type": "face", "data": {"id": face_id}}


def build_inbound(
    platform: str,
    bot: BotConfig,
    *,
    chat_id: str,
    chat_type: ChatType,
    user_id: str,
    user_name: str = "",
    is_admin: bool = False,
    message_id: str,
    text: str,
    segments: list[SegmentData],
    mentions: list[str],
    mentions_bot: bool,
    mention_names: dict[str, str] | None = None,
    reply_to: ReplyRef | None = None,
    route: dict[str, str] | None = None,
    event_id: str | None = None,
    sent_at_ms: float | None = None,
) -> InboundMessage:
    """The record of one inbound message: `user_id`, `user_name` and `is_admin` are its `Sender`.

    Built by one validation of plain data (`segments` as `SegmentData`), like the console's parse:
    a `ReplyRef` given is taken as it is (pydantic does not validate a model instance again)."""
    event = event_id or ""
    # One comparison in the common case; the refusal names the first id that is too long.
    if max(len(chat_id), len(user_id), len(message_id), len(event)) > MAX_ID_CHARS:
        _refuse_long_id(chat_id=chat_id, user_id=user_id, message_id=message_id, event_id=event)
    per_user = bot.session_scope == "user" and chat_type == "group"
    return InboundMessage.model_validate(
        {
            "platform": platform,
            "bot_id": bot.bot_id,
            "chat_id": chat_id,
            "chat_type": chat_type,
            "sender": {"user_id": user_id, "name": user_name, "is_admin": is_admin},
            "message_id": message_id,
            "event_id": event_id,
            "text": text,
            "segments": segments,
            "mentions": mentions,
            "mention_names": {k: v for k, v in mention_names.items() if v and k in mentions} if mention_names else {},
            "mentions_bot": mentions_bot,
            "reply_to": reply_to,
            "route": route or {},
            "conversation_key": conversation_key(platform, bot.bot_id, chat_id, user_id if per_user else None),
            "trace_id": new_trace_id(),
            "sent_at_ms": sent_at_ms,
            "hops": {"ingress": now_ms()},
        }
    )


def _refuse_long_id(**ids: str) -> NoReturn:
    field, value = next((field, value) for field, value in ids.items() if len(value) > MAX_ID_CHARS)
    raise WebhookRejected(
        400, "id_too_long", f"{field} is {len(value)} characters long; ids may have {MAX_ID_CHARS} at most"
    )


def media_placeholder(kind: str) -> str:
    return f"[{kind}]"


class InboundParts:
    """Inbound content being read into segments (as `SegmentData`), the plain text the agent gets,
    the mentioned ids and the names the platform sent with them."""

    def __init__(self) -> None:
        self.segments: list[SegmentData] = []
        self.plain: list[str] = []
        self.mentions: list[str] = []
        self.names: dict[str, str] = {}

    def text(self, value: str) -> None:
        if not value:
            return
        self.plain.append(value)
        last = self.segments[-1] if self.segments else None
        if last is not None and last["type"] == "text":
            self.segments[-1] = text_segment(last["data"]["text"] + value)
        else:
            self.segments.append(text_segment(value))

    def add_mention(self, target: str, name: str) -> None:
        self.segments.append(mention_segment(target))
        self.mentions.append(target)
        if name:
            self.names[target] = name
        self.plain.append(f"@{name or target}")

    def add_media(self, kind: str, media_kind: MediaKind, value: str) -> None:
        """`kind`: image, file, audio or video."""
        self.segments.append(media_segment(kind, media_kind, value))
        self.plain.append(media_placeholder(kind))


def media_kind(mime: str) -> str:
    """The media segment type a MIME type reads as (`file` for anything but image, audio, video)."""
    major = mime.split("/", 1)[0]
    return major if major in ("image", "audio", "video") else "file"


# --- outbound fallbacks --------------------------------------------------------------------------

_TEXTS = {
    "attachment_unavailable": {"zh": "[附件不可用]", "en": "[attachment unavailable]"},
    "forward": {"zh": "[合并转发的消息无法在此显示]", "en": "[forwarded messages cannot be shown here]"},
    "face": {"zh": "[表情]", "en": "[emoji]"},
    "reply_limit": {
        "zh": "[QQ 只允许对一条消息回复 5 次 其余内容未能发送]",
        "en": "[QQ allows 5 replies to one message: the rest of this reply could not be sent]",
    },
}

# A few QQ face ids that have an obvious emoji, for platforms without QQ faces.
_QQ_FACES = {
    "0": "😮",
    "1": "😖",
    "2": "😍",
    "4": "😎",
    "5": "😭",
    "6": "☺️",
    "9": "😢",
    "13": "😁",
    "14": "🙂",
    "21": "😊",
    "76": "👍",
    "77": "👎",
    "63": "🌹",
    "66": "❤️",
    "124": "👌",
    "178": "😅",
    "179": "😝",
    "182": "😂",
    "201": "👍",
}
_RPS = ("✊", "✌️", "✋")


def notice(bot: BotConfig, key: str) -> str:
    return _TEXTS[key].get(bot.language, _TEXTS[key]["en"])


def face_id_str(face_id: object) -> str:
    """A face id as text; a whole JSON number (`14.0`) as the integer it is."""
    if isinstance(face_id, float) and face_id.is_integer():
        return str(int(face_id))
    return str(face_id)


def face_text(bot: BotConfig, face_id: object) -> str:
    """A QQ face as an emoji where one is obvious; a non-numeric id (an emoji, `:smile:`) as is."""
    value = face_id_str(face_id)
    if value and not value.isdigit():
        return value
    return _QQ_FACES.get(value, notice(bot, "face"))


def _roll(outbound_id: str, index: int, sides: int) -> int:
    # Deterministic, so a re-render of the same outbound message shows the same result.
    digest = hashlib.sha256(f"{outbound_id}:{index}".encode()).digest()
    return digest[0] % sides


def dice_text(outbound_id: str, index: int) -> str:
    return f"🎲 {_roll(outbound_id, index, 6) + 1}"


def rps_text(outbound_id: str, index: int) -> str:
    return _RPS[_roll(outbound_id, index, 3)]


# --- outbound media ------------------------------------------------------------------------------


def attachment_unavailable(bot: BotConfig, segment_type: str, kind: str, reason: str) -> str:
    """Count and log (INFO: type, kind and reason only, never the value) one attachment replaced by
    the notice; returns the notice text."""
    label = rejection_label(reason)
    metrics.MEDIA_REJECTED.labels(bot.platform, label).inc()
    log.info("%s/%s: %s media (%s) sent as the notice: %s", bot.platform, bot.bot_id, segment_type, kind, label)
    return notice(bot, "attachment_unavailable")


def load_failure(exc: BaseException) -> str:
    """Why a media loader failed, as a rejection reason."""
    return exc.reason if isinstance(exc, MediaUnavailable) else "unreadable"


def with_own_file_ids(
    bot: BotConfig, segments: Sequence[Segment], shapes: Mapping[str, re.Pattern[str]]
) -> list[Segment]:
    """`segments` with every `kind: file` media that is not one of this platform's own file ids
    (`shapes`: a pattern per segment type the platform can send by id) replaced by the notice.

    An agent chooses these values. Passed on unchecked, a scheme or a path (`file:///etc/shadow`,
    `/data/x`, `http://10.0.0.1/`) would be read or fetched by the platform's side, on the operator's
    machine or network (NapCat and go-cqhttp do so)."""
    refused: list[int] = []
    for index, segment in enumerate(segments):
        if segment.type not in MEDIA_SEGMENT_TYPES:
            continue
        media = segment.data.media  # type: ignore[union-attr]
        if media.kind != "file":
            continue
        shape = shapes.get(segment.type)
        if shape is None or shape.fullmatch(media.value) is None:
            reason = "file_id_shape" if shape is not None else "unsupported_by_platform"
            attachment_unavailable(bot, segment.type, "file", reason)
            refused.append(index)
    if not refused:
        return list(segments)
    return with_placeholders(list(segments), refused, notice(bot, "attachment_unavailable"))


def media_dict(media: Media) -> dict[str, str]:
    return {"kind": media.kind, "value": media.value}


def file_name(media: Media, mime: str | None = None, default: str = "file") -> str:
    """A file name for an upload: the last path element of a url/path, else from the MIME type."""
    if media.kind in ("url", "path"):
        tail = media.value.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if tail and "." in tail:
            return tail[:100]
    ext = {
        "image/png": ".png",
        "image/jpeg": ".jpg",
        "image/gif": ".gif",
        "image/webp": ".webp",
        "audio/mpeg": ".mp3",
        "audio/ogg": ".ogg",
        "video/mp4": ".mp4",
        "application/pdf": ".pdf",
    }.get(mime or "", "")
    return default + ext


# --- outbound HTTP -------------------------------------------------------------------------------


def retry_after_header(value: str | None) -> float | None:
    """`Retry-After`: delta seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def network_outcome(exc: Exception) -> SendOutcome:
    return SendOutcome("retry", reason="network", detail=f"{type(exc).__name__}: {exc}"[:500])


def http_outcome(response: httpx.Response) -> SendOutcome | None:
    """The outcome a bare HTTP status decides on its own (rate limit, server error), else None."""
    if response.status_code == 429:
        return SendOutcome(
            "retry",
            reason="rate_limited",
            retry_after=retry_after_header(response.headers.get("retry-after")),
            detail=response.text[:500],
        )
    if response.status_code >= 500:
        return SendOutcome("retry", reason="server_error", detail=f"HTTP {response.status_code}")
    return None


async def read_capped(http: httpx.AsyncClient, url: str, headers: Mapping[str, str], max_bytes: int) -> bytes:
    """GET `url` of the platform's own API (an address the operator configured, not one a message
    named) with `headers`: at most `max_bytes` bytes, no redirects, else `MediaUnavailable`."""
    try:
        async with http.stream("GET", url, headers=dict(headers), follow_redirects=False) as response:
            return await capped_body(response, max_bytes)
    except httpx.TimeoutException:
        raise MediaUnavailable("timeout") from None
    except httpx.HTTPError:
        raise MediaUnavailable("transport_error") from None


def response_json(response: httpx.Response) -> dict[str, Any] | None:
    try:
        data = response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def base_url(bot: BotConfig, default: str) -> str:
    return (bot.api_base or default).rstrip("/")


def obj(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one (for optional nested fields)."""
    return value if isinstance(value, dict) else {}


def arr(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class TokenCache:
    """Access tokens per key (API base and app), each until `margin_s` before it expires; one fetch
    per expiry however many sends wait for it. Per process: a few token calls per worker."""

    def __init__(self, margin_s: float) -> None:
        self.margin_s = margin_s
        self._tokens: dict[tuple[str, ...], tuple[str, float]] = {}  # key → (token, monotonic expiry)
        # Keyed by event loop too: an asyncio.Lock belongs to the loop it first waited in.
        self._locks: dict[tuple[tuple[str, ...], int], asyncio.Lock] = {}

    def _cached(self, key: tuple[str, ...]) -> str | None:
        cached = self._tokens.get(key)
        return cached[0] if cached and cached[1] > time.monotonic() else None

    async def get(
        self, key: tuple[str, ...], fetch: Callable[[], Awaitable[tuple[str, float] | SendOutcome]]
    ) -> str | SendOutcome:
        """The cached token, or one `fetch` gives (token and lifetime in seconds), or its outcome."""
        token = self._cached(key)
        if token is not None:
            return token
        async with self._locks.setdefault((key, id(asyncio.get_running_loop())), asyncio.Lock()):
            token = self._cached(key)
            if token is not None:
                return token
            fetched = await fetch()
            if isinstance(fetched, SendOutcome):
                return fetched
            token, lifetime = fetched
            self._tokens[key] = (token, time.monotonic() + max(lifetime - self.margin_s, 1.0))
            return token

    def drop(self, key: tuple[str, ...], token: str | None = None) -> None:
        """Forget the token of `key` (only if it is still `token`, when given: not one another send
        fetched meanwhile)."""
        cached = self._tokens.get(key)
        if cached is not None and (token is None or cached[0] == token):
            del self._tokens[key]
