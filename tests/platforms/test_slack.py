"""Slack: inbound Events API payloads as documented (app_mention, message.im, url_verification),
signed with slack_sdk's SignatureVerifier; outbound against a local stand-in of the Web API that
answers as Slack does (HTTP 200 with ok/error, 429 + Retry-After) and checks every request."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest
from slack_sdk.signature import SignatureVerifier

from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.records import OutboundMessage
from pipeline.runtime import reply_context
from pipeline.segments import segment_list_adapter
from pipeline.segments.context import Member
from pipeline.settings import BotConfig
from pipeline.stages.ingest import content_blocks

from .conftest import PNG, PNG_B64, FakeApi, Seen, load_media, rejected_count

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
BOT_TOKEN = "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy"
BOT_USER = "U0LAN0Z89"


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="slack",
        bot_id="sl1",
        self_id=BOT_USER,
        credentials={"signing_secret": SIGNING_SECRET, "bot_token": BOT_TOKEN},
        api_base=api.url if api else None,
        **extra,
    )


def signed(
    payload: dict[str, Any], *, ts: int | None = None, secret: str = SIGNING_SECRET, retry: str | None = None
) -> WebhookRequest:
    body = json.dumps(payload).encode()
    timestamp = str(ts if ts is not None else int(time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    headers = {
        "x-slack-request-timestamp": timestamp,
        "x-slack-signature": signature or "",
        "content-type": "application/json",
    }
    if retry is not None:
        headers["x-slack-retry-num"] = retry
        headers["x-slack-retry-reason"] = "http_timeout"
    request = WebhookRequest(headers=headers, body=body, received_at_ms=time.time() * 1000)
    # The SDK's own verifier accepts what we send (or it is a deliberately bad case).
    assert SignatureVerifier(SIGNING_SECRET).is_valid_request(body, headers) == (
        secret == SIGNING_SECRET and abs(time.time() - int(timestamp)) <= 300
    )
    return request


def callback(event: dict[str, Any], event_id: str = "Ev123ABC456") -> dict[str, Any]:
    # The outer event_callback envelope of the Events API documentation.
    return {
        "token": "ZZZZZZWSxiZZZ2yIvs3peJ",
        "team_id": "T123ABC456",
        "api_app_id": "A123ABC456",
        "event": event,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": 1515449522,
        "authed_users": [BOT_USER],
    }


# The app_mention example of the Events API documentation.
APP_MENTION = {
    "type": "app_mention",
    "user": "U123ABC456",
    "text": "What is the hour of the pearl, <@U0LAN0Z89>?",
    "ts": "1515449522.000016",
    "channel": "C123ABC456",
    "event_ts": "1515449522000016",
}
# The message.im example.
DM = {
    "type": "message",
    "channel": "D024BE91L",
    "user": "U2147483697",
    "text": "Hello hello can you hear me? <https://example.com|site> &lt;3 &amp;",
    "ts": "1355517523.000005",
    "event_ts": "1355517523.000005",
    "channel_type": "im",
}


def parse(payload: dict[str, Any], **kw: Any) -> Any:  # Any: the tests read the fields of the segment types they expect
    platform = get_platform("slack")
    bot = bot_config()
    request = signed(payload, **kw)
    platform.verify(bot, request)
    return platform.parse(bot, request)


# --- in ------------------------------------------------------------------------------------------


def test_app_mention() -> None:
    [m] = parse(callback(APP_MENTION)).messages
    assert m.chat_id == "C123ABC456" and m.chat_type == "group" and m.mentions_bot
    assert m.message_id == "1515449522.000016" and m.event_id == "Ev123ABC456"
    assert m.mentions == [BOT_USER]
    assert [s.type for s in m.segments] == ["text", "mention", "text"]
    assert m.text == "What is the hour of the pearl, @U0LAN0Z89?"
    assert m.route == {} and m.sent_at_ms == pytest.approx(1515449522000.016)


def test_mention_names_where_the_payload_has_them() -> None:
    # `<@U…|name>` carries the name; a bare `<@U…>` (what the Events API usually sends) only the id.
    event = dict(APP_MENTION, text="<@U0LAN0Z89> ask <@U0BOB1234|bob> and <@U0CAROL12>")
    [m] = parse(callback(event)).messages
    assert m.mentions == [BOT_USER, "U0BOB1234", "U0CAROL12"] and m.mention_names == {"U0BOB1234": "bob"}
    bot = bot_config()
    assert content_blocks(m, bot, label_sender=False)[0]["text"] == "ask @bob and @U0CAROL12"
    ctx = reply_context(bot, m, [])
    assert ctx.context_members == (Member("U0BOB1234", "bob"), Member("U0CAROL12", ""))


def test_dm_and_redelivery_keeps_event_id() -> None:
    [m] = parse(callback(DM, "Ev0PV52K21"), retry="1").messages
    assert m.chat_type == "private" and m.chat_id == "D024BE91L" and not m.mentions_bot
    assert m.text == "Hello hello can you hear me? site (https://example.com) <3 &"
    assert m.event_id == "Ev0PV52K21"  # the same id as the first delivery: ingest drops it


def test_thread_reply_to_bot_and_files() -> None:
    event = dict(
        APP_MENTION,
        ts="1515449600.000100",
        thread_ts="1515449522.000016",
        parent_user_id=BOT_USER,
        files=[
            {"id": "F0001", "name": "cat.png", "mimetype": "image/png"},
            {"id": "F0002", "name": "r.pdf", "mimetype": "application/pdf"},
        ],
    )
    [m] = parse(
        callback(event),
    ).messages
    assert m.route == {"thread_ts": "1515449522.000016"}
    assert m.reply_to is not None and m.reply_to.is_bot
    assert [s.type for s in m.segments] == ["reply", "text", "mention", "text", "image", "file"]
    assert m.segments[4].data.media.value == "F0001"


def test_ignored_events_and_url_verification() -> None:
    bot_msg = dict(DM, bot_id="B123", subtype="bot_message")
    assert parse(callback(bot_msg)).ignored == "bot_or_subtype"
    edit = dict(DM, subtype="message_changed")
    assert parse(callback(edit)).ignored == "bot_or_subtype"
    reaction = {"type": "reaction_added", "user": "U1", "reaction": "thumbsup", "item": {}, "event_ts": "1"}
    assert parse(callback(reaction)).ignored == "not_message"
    challenge = {
        "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
        "type": "url_verification",
        "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
    }
    result = parse(challenge)
    assert result.body == {"challenge": challenge["challenge"]} and not result.messages


def test_bad_signature_stale_and_malformed() -> None:
    platform = get_platform("slack")
    bot = bot_config()
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot, signed(callback(DM), secret="wrong-secret"))
    assert (exc.value.status, exc.value.reason) == (401, "bad_signature")
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot, signed(callback(DM), ts=int(time.time()) - 301))
    assert (exc.value.status, exc.value.reason) == (401, "stale_timestamp")
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(BotConfig(platform="slack", bot_id="x"), signed(callback(DM)))
    assert exc.value.status == 401
    for payload in (
        b"nope",
        b'{"type": "event_callback"}',
        b'{"type": "event_callback", "event": {"type": "message"}}',
    ):
        with pytest.raises(WebhookRejected) as exc:
            platform.parse(bot, WebhookRequest(headers={}, body=payload))
        assert exc.value.status == 400


# --- out -----------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"<(@U[A-Z0-9]+|https?://[^|>]+(\|[^>]*)?)>")


def check_slack(seen: Seen) -> tuple[int, Any]:
    if seen.headers.get("authorization") != f"Bearer {BOT_TOKEN}":
        return 200, {"ok": False, "error": "invalid_auth"}
    assert seen.method == "POST"
    body = seen.json
    assert body["channel"].startswith(("C", "D"))
    for block in body.get("blocks", []):
        if "slack_file" in block:  # a Slack file id, never a URL of the agent's choosing
            assert set(block["slack_file"]) == {"id"} and re.fullmatch(r"F[A-Z0-9]+", block["slack_file"]["id"])
    text = body["text"]
    assert 0 < len(text) <= 4000
    # Every `<` left after removing Slack's own tokens would be a broken message.
    assert "<" not in _TOKEN_RE.sub("", text) and ">" not in _TOKEN_RE.sub("", text)
    return 200, {"ok": True, "channel": body["channel"], "ts": f"1700000000.{len(seen.body):06d}"}


def outbound(segments: list[dict[str, Any]], **extra: Any) -> OutboundMessage:
    return OutboundMessage(
        outbound_id="out-s",
        kind="reply",
        platform="slack",
        bot_id="sl1",
        chat_id="C123ABC456",
        chat_type="group",
        conversation_key="slack:sl1:C123ABC456",
        segments=segment_list_adapter.validate_python(segments),
        **extra,
    )


async def test_mrkdwn_mentions_thread_and_fallbacks(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/chat.postMessage", check_slack)
    platform = get_platform("slack")
    bot = bot_config(api, language="en")
    message = outbound(
        [
            {"type": "mention", "data": {"target": "U123ABC456"}},
            {"type": "text", "data": {"text": " 1 < 2 & 3 > 2 "}},
            {
                "type": "markdown",
                "data": {
                    "content": (
                        "# Title\n**bold** _it_ ~~gone~~ `a<b` [link](https://example.com/x)\n- one\n```\nx = 1\n```"
                    )
                },
            },
            {"type": "dice", "data": {}},
            {"type": "rps", "data": {}},
            {"type": "face", "data": {"id": ":tada:"}},
            {"type": "share", "data": {"url": "https://example.com/s", "title": "Shared"}},
            {"type": "forward", "data": {"forward_id": "x"}},
        ],
        route={"thread_ts": "1515449522.000016"},
    )
    [call] = platform.render(bot, message)
    outcome = await platform.send(bot, call, http, load_media)
    assert outcome.status == "delivered" and outcome.platform_message_id
    [seen] = api.calls("/chat.postMessage")
    assert seen.json["thread_ts"] == "1515449522.000016"
    text = seen.json["text"]
    assert text.startswith(
        "<@U123ABC456> 1 &lt; 2 &amp; 3 &gt; 2 *Title*\n"
        "*bold* _it_ ~gone~ `a&lt;b` <https://example.com/x|link>\n• one\n```\nx = 1\n```"
    )
    assert "🎲 " in text and ":tada:" in text and "<https://example.com/s|Shared>" in text
    assert "[forwarded messages cannot be shown here]" in text


async def test_long_text_split(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/chat.postMessage", check_slack)
    platform = get_platform("slack")
    bot = bot_config(api)
    calls = platform.render(
        bot,
        outbound([{"type": "text", "data": {"text": "lorem ipsum " * 1000}}], reply_to_message_id="1515449522.000016"),
    )
    assert len(calls) == 4
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    sent = api.calls("/chat.postMessage")
    assert "".join(s.json["text"] for s in sent).count("lorem") == 1000
    assert {s.json["thread_ts"] for s in sent} == {"1515449522.000016"}  # no quote on Slack: its thread


async def test_split_counts_the_rendered_mrkdwn(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/chat.postMessage", check_slack)
    platform = get_platform("slack")
    bot = bot_config(api)
    # Short labels, long URLs, characters that escape to five: the mrkdwn is far longer than the text.
    content = " ".join(f"[x](https://example.com/{'p' * 60}/{n}) <&>" for n in range(300))
    calls = platform.render(bot, outbound([{"type": "markdown", "data": {"content": content}}]))
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    sent = "".join(s.json["text"] for s in api.calls("/chat.postMessage"))
    assert sent.count("|x>") == 300 and sent.count("&lt;&amp;&gt;") == 300


async def test_external_upload_flow(api: FakeApi, http: httpx.AsyncClient) -> None:
    def get_url(seen: Seen) -> tuple[int, Any]:
        assert seen.headers["authorization"] == f"Bearer {BOT_TOKEN}"
        assert seen.headers["content-type"].startswith("application/x-www-form-urlencoded")
        assert seen.form == {"filename": "file.png", "length": str(len(PNG))}
        return 200, {"ok": True, "upload_url": f"{api.url}/upload/v1/abc", "file_id": "F0UPLOADED"}

    def upload(seen: Seen) -> tuple[int, Any]:
        assert seen.body == PNG
        return 200, "OK - 70"

    def complete(seen: Seen) -> tuple[int, Any]:
        assert seen.headers["authorization"] == f"Bearer {BOT_TOKEN}"
        assert seen.json == {
            "files": [{"id": "F0UPLOADED", "title": "file.png"}],
            "channel_id": "C123ABC456",
            "thread_ts": "1515449522.000016",
        }
        return 200, {"ok": True, "files": [{"id": "F0UPLOADED"}]}

    api.on("/files.getUploadURLExternal", get_url)
    api.on("/upload/v1/abc", upload)
    api.on("/files.completeUploadExternal", complete)
    api.on("/chat.postMessage", check_slack)
    platform = get_platform("slack")
    bot = bot_config(api)
    message = outbound(
        [
            {"type": "text", "data": {"text": "here:"}},
            {
                "type": "image",
                "data": {
                    "media": {
                        "kind": "base64",
                        "value": PNG_B64,
                    }
                },
            },
            {"type": "image", "data": {"media": {"kind": "file", "value": "F0EXISTING"}}},
        ],
        route={"thread_ts": "1515449522.000016"},
    )
    calls = platform.render(bot, message)
    assert [c.path for c in calls] == ["/chat.postMessage", "/files.getUploadURLExternal", "/chat.postMessage"]
    for call in calls:
        outcome = await platform.send(bot, call, http, load_media)
        assert outcome.status == "delivered", outcome
    assert len(api.calls("/files.completeUploadExternal")) == 1
    block = api.calls("/chat.postMessage")[1].json["blocks"][0]
    assert block == {"type": "image", "slack_file": {"id": "F0EXISTING"}, "alt_text": "image"}


@pytest.mark.parametrize(
    ("status", "body", "headers", "verdict", "reason", "retry_after"),
    [
        (429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "30"}, "retry", "rate_limited", 30.0),
        (200, {"ok": False, "error": "ratelimited"}, {"Retry-After": "3"}, "retry", "rate_limited", 3.0),
        (200, {"ok": False, "error": "channel_not_found"}, {}, "permanent", "channel_not_found", None),
        (200, {"ok": False, "error": "not_in_channel"}, {}, "permanent", "not_in_channel", None),
        (200, {"ok": False, "error": "account_inactive"}, {}, "permanent", "account_inactive", None),
        (200, {"ok": False, "error": "some_new_error"}, {}, "permanent", "api_error", None),
        (200, {"ok": False, "error": "internal_error"}, {}, "retry", "server_error", None),
        (503, "unavailable", {}, "retry", "server_error", None),
    ],
)
async def test_error_classification(
    api: FakeApi,
    http: httpx.AsyncClient,
    status: int,
    body: Any,
    headers: dict[str, str],
    verdict: str,
    reason: str,
    retry_after: float | None,
) -> None:
    api.reply("/chat.postMessage", status, body, headers)
    platform = get_platform("slack")
    bot = bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason, outcome.retry_after) == (verdict, reason, retry_after)


async def test_invalid_auth_is_permanent(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/chat.postMessage", check_slack)
    platform = get_platform("slack")
    bot = BotConfig(platform="slack", bot_id="sl1", credentials={"bot_token": "xoxb-wrong"}, api_base=api.url)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason, outcome.detail) == ("permanent", "invalid_auth", "invalid_auth")


@pytest.mark.parametrize(
    ("segment", "value", "reason"),
    [
        ("image", "https://files.slack.com/files-pri/T0-F0/x.png", "file_id_shape"),
        ("image", "file:///etc/shadow", "file_id_shape"),
        ("image", "f0lowercase", "file_id_shape"),
        ("file", "F0EXISTING", "unsupported_by_platform"),  # only images can be shown again by id
    ],
)
async def test_a_file_reference_slack_cannot_take_becomes_the_notice(
    api: FakeApi, http: httpx.AsyncClient, segment: str, value: str, reason: str
) -> None:
    api.on("/chat.postMessage", check_slack)
    platform = get_platform("slack")
    bot = bot_config(api, language="en")
    before = rejected_count("slack", reason)
    message = outbound(
        [
            {"type": "text", "data": {"text": "see"}},
            {"type": segment, "data": {"media": {"kind": "file", "value": value}}},
            {"type": "text", "data": {"text": "above"}},
        ]
    )
    for call in platform.render(bot, message):
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    [sent] = api.calls("/chat.postMessage")
    assert sent.json["text"] == "see [attachment unavailable] above" and "blocks" not in sent.json
    assert rejected_count("slack", reason) == before + 1
