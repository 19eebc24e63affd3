"""Slack (Events API + Web API).

In: Events API requests signed with `X-Slack-Signature` (v0, HMAC-SHA256 of `v0:<ts>:<body>` with
the signing secret) within a 5-minute window of `X-Slack-Request-Timestamp`; `url_verification`;
`app_mention` in channels and `message` events (DMs, and channel messages as context when the app is
subscribed to them). Redeliveries (`X-Slack-Retry-Num`) carry the same `event_id`, so ingest drops
them as duplicates.
Out: `chat.postMessage` with mrkdwn converted from markdown and `<@U…>` mentions, in the thread of
the conversation (`route["thread_ts"]`); files through `files.getUploadURLExternal` → upload →
`files.completeUploadExternal` (URLs fetched here, through the SSRF guard). A `kind: file` image
passes only as a Slack file id (`F…`), shown through an image block; an existing file of another
type cannot be posted again by id. Slack answers HTTP 200 with `{"ok": false, "error": …}`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx
from pydantic import SecretStr

from pipeline.platforms._common import (
    InboundParts,
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
    media_kind,
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
from pipeline.platforms._richtext import RichText, parse_markdown, split_rich, to_mrkdwn
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

DEFAULT_API_BASE = "https://slack.com/api"
MAX_TEXT = 4000  # Slack's recommended maximum (longer text is truncated at 40,000)

# Message subtypes that are still a person talking; every other subtype (edits, joins, bots) is not.
_USER_SUBTYPES = {None, "file_share", "thread_broadcast"}
_RETRY_ERRORS = {
    "ratelimited",
    "rate_limited",
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
}
_KNOWN_ERRORS = {
    "channel_not_found",
    "not_in_channel",
    "invalid_auth",
    "account_inactive",
    "token_revoked",
    "is_archived",
    "msg_too_long",
    "no_text",
    "missing_scope",
    "not_authed",
    "restricted_action",
    "invalid_blocks",
    "too_many_attachments",
    "user_not_found",
    "file_not_found",
    "invalid_arguments",
    "cannot_dm_bot",
    "messages_tab_disabled",
    "team_access_not_granted",
    "ekm_access_denied",
}
_SLACK_TOKEN = re.compile(r"<([^<>]*)>")


# Slack file ids: `F` and upper-case letters and digits. Only images can be shown again by id.
FILE_ID_SHAPES = {"image": re.compile(r"F[A-Z0-9]{6,24}")}


class SlackPlatform(Platform):
    name: ClassVar[str] = "slack"
    required_credentials = ("bot_token",)
    # Socket Mode (`pipeline.connections.slack`): events over a WebSocket Switchboard dials with the
    # app-level token; no Events API requests, so no signing secret.
    transports = {"webhook": ("signing_secret",), "socket_mode": ("app_token",)}
    profile: ClassVar[PlatformProfile] = PlatformProfile(
        native_segments=frozenset({"text", "markdown", "mention", "image", "audio", "video", "file"}),
        max_text_chars=MAX_TEXT,
        max_attachment_bytes=1024 * 1024 * 1024,
        markdown=True,
        # chat.postMessage: about one message per second per channel (short bursts tolerated),
        # and a workspace-wide limit of several hundred per minute.
        default_chat_limit=RateLimit(count=1, per_seconds=1),
        default_bot_limit=RateLimit(count=300, per_seconds=60),
    )

    def settings_problems(self, entry: Mapping[str, Any]) -> list[tuple[str, str]]:
        credentials = entry.get("credentials")
        token = credentials.get("app_token") if isinstance(credentials, Mapping) else None
        if isinstance(token, SecretStr):
            token = token.get_secret_value()
        if isinstance(token, str) and token and not token.startswith("xapp-"):
            # A bot token (`xoxb-`) here is the usual mistake; the value itself is never shown.
            return [("credentials.app_token", "Socket Mode needs the app-level token, which starts with xapp-")]
        return []

    # --- in --------------------------------------------------------------------------------------

    @verify_guard
    def verify(self, bot: BotConfig, request: WebhookRequest) -> None:
        secret = bot.secret("signing_secret")
        if not secret:
            raise WebhookRejected(401, "bad_signature", "no signing_secret configured")
        timestamp = ascii_value(request.header("x-slack-request-timestamp"), "X-Slack-Request-Timestamp")
        require_fresh(bot, request, timestamp.decode())
        base = b"v0:" + timestamp + b":" + request.body
        expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
        if not same_secret(request.header("x-slack-signature"), expected):
            raise WebhookRejected(401, "bad_signature")

    @payload_guard
    def parse(self, bot: BotConfig, request: WebhookRequest) -> WebhookResult:
        payload = load_json(request.body)
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            raise WebhookRejected(400, "malformed_payload", "no type")
        if payload["type"] == "url_verification":
            challenge = payload.get("challenge")
            if not isinstance(challenge, str):
                raise WebhookRejected(400, "malformed_payload", "url_verification without challenge")
            return WebhookResult(body={"challenge": challenge}, ignored="url_verification")
        if payload["type"] != "event_callback":
            return WebhookResult(ignored="not_message")
        event = payload.get("event")
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise WebhookRejected(400, "malformed_payload", "event_callback without event")
        event_id = payload.get("event_id") if isinstance(payload.get("event_id"), str) else None
        etype = event["type"]
        if etype not in ("app_mention", "message"):
            return WebhookResult(ignored="not_message")
        if event.get("bot_id") or event.get("subtype") not in _USER_SUBTYPES:
            return WebhookResult(ignored="bot_or_subtype")
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        if not all(isinstance(v, str) and v for v in (user, channel, ts)):
            raise WebhookRejected(400, "malformed_payload", "event without user/channel/ts")
        assert isinstance(user, str) and isinstance(channel, str) and isinstance(ts, str)
        if bot.self_id is not None and user == bot.self_id:
            return WebhookResult(ignored="own_message")
        channel_type = event.get("channel_type")
        private = channel_type == "im" or (channel_type is None and channel.startswith("D"))

        text = event.get("text")
        parts, names = _parse_slack_text(text if isinstance(text, str) else "")
        for f in arr(event.get("files")):
            if isinstance(f, dict) and isinstance(f.get("id"), str):
                parts.add_media(media_kind(str(f.get("mimetype") or "")), "file", f["id"])
        segments, plain, mentions = parts.segments, parts.plain, parts.mentions
        mentions_bot = etype == "app_mention" or (bot.self_id is not None and bot.self_id in mentions)

        route: dict[str, str] = {}
        reply_to: ReplyRef | None = None
        thread_ts = event.get("thread_ts")
        if isinstance(thread_ts, str) and thread_ts:
            route["thread_ts"] = thread_ts
            if thread_ts != ts:
                parent_user = event.get("parent_user_id")
                reply_to = ReplyRef(
                    message_id=thread_ts,
                    user_id=parent_user if isinstance(parent_user, str) else None,
                    is_bot=bot.self_id is not None and parent_user == bot.self_id,
                )
                segments.insert(0, reply_segment(thread_ts))
        profile = obj(event.get("user_profile"))
        name = profile.get("display_name") or profile.get("real_name") or ""
        try:
            sent_at_ms: float | None = float(ts) * 1000
        except ValueError:
            sent_at_ms = None
        message = build_inbound(
            self.name,
            bot,
            chat_id=channel,
            chat_type="private" if private else "group",
            user_id=user,
            user_name=str(name),
            message_id=ts,
            event_id=event_id,
            text="".join(plain).strip(),
            segments=segments,
            mentions=mentions,
            mention_names=names,
            mentions_bot=mentions_bot,
            reply_to=reply_to,
            route=route,
            sent_at_ms=sent_at_ms,
        )
        return WebhookResult(messages=[message])

    # --- out -------------------------------------------------------------------------------------

    def render(self, bot: BotConfig, message: OutboundMessage) -> list[PlatformCall]:
        thread_ts = message.route.get("thread_ts")
        if not thread_ts and message.reply_to_message_id:
            thread_ts = message.reply_to_message_id  # Slack has no quote: answer in its thread
        for segment in message.segments:
            if not thread_ts and isinstance(segment, ReplySegment):
                thread_ts = segment.data.message_id
        base: dict[str, Any] = {"channel": message.chat_id}
        if thread_ts:
            base["thread_ts"] = thread_ts

        calls: list[PlatformCall] = []
        rich = RichText()

        def flush() -> None:
            nonlocal rich
            for text in _mrkdwn_pieces(rich, MAX_TEXT):
                calls.append(PlatformCall(method="POST", path="/chat.postMessage", json={**base, "text": text}))
            rich = RichText()

        for index, segment in enumerate(with_own_file_ids(bot, message.segments, FILE_ID_SHAPES)):
            if isinstance(segment, TextSegment):
                rich.append(segment.data.text)
            elif isinstance(segment, MarkdownSegment):
                rich.extend(parse_markdown(segment.data.content))
            elif isinstance(segment, MentionSegment):
                rich.append(f"@{segment.data.target}", "mention", user=segment.data.target)
            elif isinstance(segment, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                media = segment.data.media
                if media.kind != "file":
                    flush()
                    meta = {
                        "flow": "upload",
                        "channel": message.chat_id,
                        "thread_ts": thread_ts,
                        "segment": segment.type,
                    }
                    calls.append(
                        PlatformCall(
                            method="POST",
                            path="/files.getUploadURLExternal",
                            media=media,
                            media_field="file",
                            meta=meta,
                        )
                    )
                else:  # a Slack image file id (other kinds were refused above): shown through an image block
                    flush()
                    block = {"type": "image", "slack_file": {"id": media.value}, "alt_text": "image"}
                    body = {**base, "text": "image", "blocks": [block]}
                    calls.append(PlatformCall(method="POST", path="/chat.postMessage", json=body))
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
        root = base_url(bot, DEFAULT_API_BASE)
        headers = {"Authorization": f"Bearer {bot.secret('bot_token') or ''}"}
        if call.meta.get("flow") == "upload" and call.media is not None:
            return await self._upload(bot, call, http, load_media, root, headers)
        try:
            response = await http.request(call.method, root + call.path, json=call.json, headers=headers)
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        outcome, data = _classify(response)
        if outcome is None:
            return SendOutcome("delivered", platform_message_id=str(data.get("ts") or "") or None)
        return outcome

    async def _upload(
        self,
        bot: BotConfig,
        call: PlatformCall,
        http: httpx.AsyncClient,
        load_media: MediaLoader,
        root: str,
        headers: dict[str, str],
    ) -> SendOutcome:
        assert call.media is not None
        channel = call.meta["channel"]
        thread_ts = call.meta.get("thread_ts")
        try:
            data, mime = await load_media(call.media)
        except Exception as exc:  # the loader is foreign code: any failure means "unreadable"
            segment_type = str(call.meta.get("segment", "file"))
            text = {
                "channel": channel,
                "text": attachment_unavailable(bot, segment_type, call.media.kind, load_failure(exc)),
            }
            if thread_ts:
                text["thread_ts"] = thread_ts
            fallback = PlatformCall(method="POST", path="/chat.postMessage", json=text)
            return await self.send(bot, fallback, http, load_media)
        name = file_name(call.media, mime)
        try:
            # files.getUploadURLExternal takes form arguments, not JSON.
            response = await http.post(
                root + "/files.getUploadURLExternal", data={"filename": name, "length": str(len(data))}, headers=headers
            )
            outcome, ticket = _classify(response)
            if outcome is not None:
                return outcome
            upload_url, file_id = ticket.get("upload_url"), ticket.get("file_id")
            if not isinstance(upload_url, str) or not isinstance(file_id, str):
                return SendOutcome("retry", reason="bad_response", detail="no upload_url/file_id")
            uploaded = await http.post(
                upload_url, content=data, headers={"Content-Type": mime or "application/octet-stream"}
            )
            if uploaded.status_code != 200:
                early = http_outcome(uploaded)
                return early or SendOutcome(
                    "permanent", reason="upload_failed", detail=f"HTTP {uploaded.status_code}: {uploaded.text[:200]}"
                )
            complete: dict[str, Any] = {"files": [{"id": file_id, "title": name}], "channel_id": channel}
            if thread_ts:
                complete["thread_ts"] = thread_ts
            response = await http.post(root + "/files.completeUploadExternal", json=complete, headers=headers)
        except httpx.HTTPError as exc:
            return network_outcome(exc)
        outcome, _ = _classify(response)
        return outcome or SendOutcome("delivered", platform_message_id=file_id)


def _mrkdwn_pieces(rich: RichText, limit: int) -> list[str]:
    """mrkdwn of at most `limit` characters each. Splitting counts the plain text; escapes and link
    URLs make the mrkdwn longer, so a piece that grew past the limit is split again, smaller."""
    out: list[str] = []
    for piece in split_rich(rich, limit):
        text = to_mrkdwn(piece)
        if len(text) > MAX_TEXT and limit > 200:
            out.extend(_mrkdwn_pieces(piece, limit * 2 // 3))
        else:
            out.append(text)
    return out


def _classify(response: httpx.Response) -> tuple[SendOutcome | None, dict[str, Any]]:
    """(None, body) when Slack said ok; else the outcome."""
    early = http_outcome(response)
    if early is not None:
        return early, {}
    data = response_json(response)
    if data is None:
        return SendOutcome("permanent", reason="bad_response", detail=f"HTTP {response.status_code}"), {}
    if data.get("ok") is True:
        return None, data
    error = str(data.get("error") or "unknown_error")
    if error in _RETRY_ERRORS:
        return SendOutcome(
            "retry",
            reason="rate_limited" if "rate" in error else "server_error",
            retry_after=retry_after_header(response.headers.get("retry-after")),
            detail=error,
        ), {}
    reason = error if error in _KNOWN_ERRORS else "api_error"
    return SendOutcome("permanent", reason=reason, detail=error), {}


def _parse_slack_text(text: str) -> tuple[InboundParts, dict[str, str]]:
    """Slack message text into segments: `<@U…>` mentions (with the name of `<@U…|name>`, where
    Slack gives one), `<url|label>` links, entities."""
    parts = InboundParts()
    names: dict[str, str] = {}

    def add(value: str) -> None:
        parts.text(value.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))

    pos = 0
    for match in _SLACK_TOKEN.finditer(text):
        add(text[pos : match.start()])
        pos = match.end()
        inner, _, label = match.group(1).partition("|")
        if inner.startswith("@"):
            user = inner[1:]
            parts.add_mention(user, label or user)
            if label:
                names[user] = label
        elif inner.startswith("#"):
            add(f"#{label or inner[1:]}")
        elif inner.startswith("!"):
            add(f"@{label or inner[1:].split('^')[0]}")
        else:
            add(f"{label} ({inner})" if label and label != inner else inner)
    add(text[pos:])
    return parts, names
