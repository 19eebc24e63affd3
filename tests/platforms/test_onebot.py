"""OneBot v11: inbound events shaped as in the v11 spec (`event/message.md`, `communication/
http-post.md`, `message/segment.md`); outbound against a local stand-in of the HTTP API
(`communication/http.md`) that checks the action, the bearer token and every message segment."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.platforms.onebot import cq_escape, parse_cq
from pipeline.records import OutboundMessage
from pipeline.runtime import reply_context
from pipeline.segments import MediaChecker, segment_list_adapter
from pipeline.segments.context import Member
from pipeline.settings import BotConfig
from pipeline.stages.ingest import content_blocks, member_names
from pipeline.state import ContextEntry

from .conftest import PDF, PNG, FakeApi, MediaServer, Seen, broken_loader, load_media, rejected_count

SECRET = "ob-secret"
TOKEN = "ob-access-token"

# The spec's private-message report example (communication/http-post.md), verbatim.
SPEC_PRIVATE = {
    "time": 1515204254,
    "self_id": 10001000,
    "post_type": "message",
    "message_type": "private",
    "sub_type": "friend",
    "message_id": 12,
    "user_id": 12345678,
    "message": "你好\uff5e",
    "raw_message": "你好\uff5e",
    "font": 456,
    "sender": {"nickname": "小不点", "sex": "male", "age": 18},
}


def group_event(message: Any, **extra: Any) -> dict[str, Any]:
    """A group message with the fields of event/message.md ("群消息")."""
    event = {
        "time": 1515204254,
        "self_id": 10001000,
        "post_type": "message",
        "message_type": "group",
        "sub_type": "normal",
        "message_id": 2001,
        "group_id": 123456,
        "user_id": 12345678,
        "anonymous": None,
        "message": message,
        "raw_message": message if isinstance(message, str) else "",
        "font": 456,
        "sender": {
            "user_id": 12345678,
            "nickname": "小不点",
            "card": "群名片",
            "sex": "male",
            "age": 18,
            "area": "",
            "level": "1",
            "role": "admin",
            "title": "",
        },
    }
    event.update(extra)
    return event


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    fields = {"self_id": "10001000", **extra}
    return BotConfig(
        platform="onebot",
        bot_id="qq1",
        credentials={"secret": SECRET, "access_token": TOKEN},
        api_base=api.url if api else None,
        **fields,
    )


def signed(event: dict[str, Any], secret: str = SECRET) -> WebhookRequest:
    body = json.dumps(event, ensure_ascii=False).encode()
    sig = "sha1=" + hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
    return WebhookRequest(headers={"x-signature": sig, "x-self-id": "10001000"}, body=body)


def parse(
    event: dict[str, Any], **extra: Any
) -> Any:  # Any: the tests read the fields of the segment types they expect
    platform = get_platform("onebot")
    bot = bot_config(**extra)
    req = signed(event)
    platform.verify(bot, req)
    return platform.parse(bot, req)


# --- in ------------------------------------------------------------------------------------------


def test_spec_private_message() -> None:
    [m] = parse(SPEC_PRIVATE).messages
    assert m.chat_type == "private" and m.chat_id == "private_12345678"
    assert m.sender.user_id == "12345678" and m.sender.name == "小不点" and not m.sender.is_admin
    assert m.text == "你好\uff5e" and m.message_id == "12"
    assert m.sent_at_ms == 1515204254000
    assert m.conversation_key == "onebot:qq1:private_12345678"


def test_group_cq_string_with_at_reply_image_and_escapes() -> None:
    raw = (
        "[CQ:reply,id=1999][CQ:at,qq=10001000] 看看 &#91;这个&#93; &amp; "
        "[CQ:image,file=abc.jpg,url=https://gchat.qpic.cn/x?a=1&amp;b=2][CQ:face,id=14]"
    )
    [m] = parse(group_event(raw)).messages
    assert m.chat_id == "group_123456" and m.chat_type == "group"
    assert m.sender.name == "群名片" and m.sender.is_admin
    assert m.mentions_bot and m.mentions == ["10001000"]
    assert m.reply_to is not None and m.reply_to.message_id == "1999"
    # The bot's own `at` addressed it (above); it is not part of what was said.
    assert [s.type for s in m.segments] == ["reply", "text", "image", "face"]
    assert m.segments[1].data.text == " 看看 [这个] & "
    assert m.segments[2].data.media.kind == "url"
    assert m.segments[2].data.media.value == "https://gchat.qpic.cn/x?a=1&b=2"
    assert m.text.startswith("看看 [这个] &")


def test_group_array_format_other_mention_and_per_user_scope() -> None:
    message = [
        {"type": "at", "data": {"qq": "all"}},
        {"type": "text", "data": {"text": " hi "}},
        {"type": "at", "data": {"qq": "222"}},
        {"type": "record", "data": {"file": "voice.amr"}},
    ]
    [m] = parse(group_event(message), session_scope="user").messages
    assert not m.mentions_bot and m.mentions == ["222"]
    assert [s.type for s in m.segments] == ["text", "mention", "audio"]
    assert m.segments[2].data.media.kind == "file"
    assert m.conversation_key == "onebot:qq1:group_123456:12345678"


def test_an_at_without_a_name_is_named_from_the_window() -> None:
    message = [
        {"type": "at", "data": {"qq": "10001000"}},
        {"type": "text", "data": {"text": " ask "}},
        {"type": "at", "data": {"qq": "222"}},
        {"type": "text", "data": {"text": " and "}},
        {"type": "at", "data": {"qq": "333", "name": "老王"}},  # some implementations send the name
    ]
    [m] = parse(group_event(message)).messages
    assert m.mentions == ["10001000", "222", "333"] and m.mention_names == {"333": "老王"}
    bot = bot_config()
    window = [ContextEntry(message_id="1990", user_id="222", name="小明", text="hi")]
    names = member_names(m, window)
    assert content_blocks(m, bot, label_sender=False, names=names)[0]["text"] == "ask @小明 and @老王"
    ctx = reply_context(bot, m, window)
    assert ctx.context_members == (Member("222", "小明"), Member("333", "老王"))
    # Nobody in the window has that number: the agent sees the id, and may still mention it back.
    assert content_blocks(m, bot, label_sender=False)[0]["text"] == "ask @222 and @老王"
    assert "222" in reply_context(bot, m, []).mentionable_ids()


@pytest.mark.parametrize("self_id", ["10001000", None])
def test_the_bots_own_mention_triggers_but_is_not_what_the_agent_reads(self_id: str | None) -> None:
    # `switchboard up --onebot-ws` configures no QQ number: the bot learns it from the event.
    message = [
        {"type": "at", "data": {"qq": "10001000", "name": "bot"}},
        {"type": "text", "data": {"text": " what does "}},
        {"type": "at", "data": {"qq": "222"}},
        {"type": "text", "data": {"text": " think?"}},
    ]
    [m] = parse(group_event(message), self_id=self_id).messages
    assert m.mentions_bot and m.mentions == ["10001000", "222"]
    assert "10001000" not in m.text and m.text == "what does @222 think?"
    bot = bot_config(self_id=self_id)
    assert content_blocks(m, bot, label_sender=False)[0]["text"] == "what does @222 think?"


def test_signature_and_ignored_and_malformed() -> None:
    platform = get_platform("onebot")
    bot = bot_config()
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot, signed(SPEC_PRIVATE, secret="forged"))
    assert (exc.value.status, exc.value.reason) == (401, "bad_signature")
    unsigned = WebhookRequest(headers={}, body=json.dumps(SPEC_PRIVATE).encode())
    with pytest.raises(WebhookRejected):
        platform.verify(bot, unsigned)
    with pytest.raises(WebhookRejected) as exc:  # no secret configured: nothing is taken unsigned
        platform.verify(BotConfig(platform="onebot", bot_id="open"), unsigned)
    assert (exc.value.status, exc.value.reason) == (401, "bad_signature")

    heartbeat = {
        "time": 1,
        "self_id": 10001000,
        "post_type": "meta_event",
        "meta_event_type": "heartbeat",
        "status": {},
        "interval": 5000,
    }
    assert parse(heartbeat).ignored == "not_message"
    own = dict(SPEC_PRIVATE, user_id=10001000)
    assert parse(own).ignored == "own_message"
    for body in (
        b"\xff\xfe",
        b"[1]",
        b'{"post_type": "message", "message_type": "group", "user_id": 1, "message_id": 2}',
        b'{"post_type": "message", "message_type": "private", "user_id": 1, "message_id": 2, "message": 5}',
    ):
        with pytest.raises(WebhookRejected) as exc:
            platform.parse(bot, WebhookRequest(headers={}, body=body))
        assert exc.value.status == 400


def test_cq_roundtrip() -> None:
    text = "a[b]&c,d"
    assert parse_cq(cq_escape(text)) == [{"type": "text", "data": {"text": text}}]
    assert parse_cq(f"[CQ:share,url={cq_escape('https://x/?a=1,2', param=True)},title=T]") == [
        {"type": "share", "data": {"url": "https://x/?a=1,2", "title": "T"}}
    ]


# --- out -----------------------------------------------------------------------------------------

_SEGMENT_FIELDS = {  # message/segment.md: the data fields each sendable segment needs
    "text": {"text"},
    "at": {"qq"},
    "image": {"file"},
    "record": {"file"},
    "video": {"file"},
    "face": {"id"},
    "reply": {"id"},
    "forward": {"id"},
    "dice": set(),
    "rps": set(),
    "share": {"url", "title"},
    "file": {"file", "name"},
}


# What a `file` field may hold: bytes Switchboard read itself (`base64://…`) or a file id of the
# implementations' own shape (NapCat: 32 hex digits, maybe with the image's extension; go-cqhttp: an
# MD5 in hex with `.image`/`.video`). A scheme (`file://`, `http://`), a path or an agent-chosen URL
# would be read or fetched by the implementation itself, on the operator's machine and network.
ONEBOT_FILE_ID = re.compile(r"[0-9A-Fa-f]{32,128}(?:\.[A-Za-z0-9]{1,8})?")


def check_file_field(value: Any) -> None:
    assert isinstance(value, str)
    if value.startswith("base64://"):
        payload = value.removeprefix("base64://")
        assert payload and base64.b64decode(payload, validate=True), "empty or invalid base64"
        return
    assert ONEBOT_FILE_ID.fullmatch(value), f"neither base64 bytes nor a OneBot file id: {value[:80]!r}"


def check_onebot(seen: Seen) -> tuple[int, Any]:
    if seen.headers.get("authorization") != f"Bearer {TOKEN}":
        return 401 if "authorization" not in seen.headers else 403, ""
    assert seen.method == "POST" and seen.headers["content-type"].startswith("application/json")
    body = seen.json
    target = "group_id" if seen.path == "/send_group_msg" else "user_id"
    assert isinstance(body[target], int)
    message = body["message"]
    assert message, "empty message"
    for n, seg in enumerate(message):
        assert set(seg["data"]) == _SEGMENT_FIELDS[seg["type"]], seg
        if "file" in seg["data"]:
            check_file_field(seg["data"]["file"])
        if "name" in seg["data"]:
            assert seg["data"]["name"] and not set(seg["data"]["name"]) & set("/\\\0"), seg["data"]["name"]
        if seg["type"] == "reply":
            assert n == 0
        if seg["type"] in ("record", "video", "file", "forward", "dice", "rps", "share"):
            assert len(message) == 1, "QQ sends these alone"
    text = sum(len(s["data"]["text"]) for s in message if s["type"] == "text")
    assert text <= 4000
    return 200, {"status": "ok", "retcode": 0, "data": {"message_id": 30000 + len(seen.body)}}


def outbound(
    segments: list[dict[str, Any]], chat_id: str = "group_123456", chat_type: str = "group", **extra: Any
) -> OutboundMessage:
    return OutboundMessage(
        outbound_id="out-9",
        kind="reply",
        platform="onebot",
        bot_id="qq1",
        chat_id=chat_id,
        chat_type=chat_type,
        conversation_key=f"onebot:qq1:{chat_id}",
        segments=segment_list_adapter.validate_python(segments),
        **extra,
    )


async def test_every_segment_type(
    api: FakeApi, http: httpx.AsyncClient, tmp_path: Path, media_server: MediaServer, guarded_loader: MediaChecker
) -> None:
    api.on("/send_group_msg", check_onebot)
    platform = get_platform("onebot")
    bot = bot_config(api)
    pic = tmp_path / "p.png"
    pic.write_bytes(PNG)
    video_id = "6f1c2b0e9d8a4c3b8e7f6a5b4c3d2e1f.mp4"  # a NapCat file id
    message = outbound(
        [
            {"type": "mention", "data": {"target": "12345678"}},
            {"type": "text", "data": {"text": " 结果如下\uff1a"}},
            {"type": "markdown", "data": {"content": "**重点** 见 [文档](https://example.com)"}},
            {"type": "image", "data": {"media": {"kind": "url", "value": f"{media_server.url}/a.png"}}},
            {"type": "image", "data": {"media": {"kind": "path", "value": str(pic)}}},
            {"type": "face", "data": {"id": 14}},
            {"type": "audio", "data": {"media": {"kind": "base64", "value": "AAAA"}}},
            {"type": "video", "data": {"media": {"kind": "file", "value": video_id}}},
            {"type": "file", "data": {"media": {"kind": "url", "value": f"{media_server.url}/r.pdf"}}},
            {"type": "forward", "data": {"forward_id": "fw-123"}},
            {"type": "dice", "data": {}},
            {"type": "rps", "data": {}},
            {"type": "share", "data": {"url": "https://example.com", "title": "Example"}},
        ],
        reply_to_message_id="2001",
    )
    calls = platform.render(bot, message)
    for call in calls:
        outcome = await platform.send(bot, call, http, guarded_loader.load)
        assert outcome.status == "delivered" and outcome.platform_message_id
    sent = [s.json["message"] for s in api.calls("/send_group_msg")]
    assert [[seg["type"] for seg in m] for m in sent] == [
        ["reply", "at", "text", "text", "image", "image", "face"],
        ["record"],
        ["video"],
        ["file"],
        ["forward"],
        ["dice"],
        ["rps"],
        ["share"],
    ]
    first = sent[0]
    png_bytes = "base64://" + base64.b64encode(PNG).decode()
    assert first[0]["data"] == {"id": "2001"} and first[1]["data"] == {"qq": "12345678"}
    assert first[3]["data"]["text"] == "重点 见 文档 (https://example.com)"
    # The URL was fetched here (through the SSRF guard), and OneBot got the bytes, not the URL.
    assert first[4]["data"]["file"] == png_bytes and media_server.requests == ["/a.png", "/r.pdf"]
    assert first[5]["data"]["file"] == png_bytes
    assert first[6]["data"] == {"id": "14"}
    assert sent[1][0]["data"]["file"] == "base64://AAAA"
    assert sent[2][0]["data"]["file"] == video_id
    assert sent[3][0]["data"] == {"file": "base64://" + base64.b64encode(PDF).decode(), "name": "r.pdf"}
    assert sent[4][0]["data"] == {"id": "fw-123"}
    assert all(s.json["group_id"] == 123456 for s in api.calls("/send_group_msg"))


# Values an agent could put in a `kind: file` reference that OneBot implementations would read or
# fetch themselves (NapCat reads any existing local path, relative ones too).
HOSTILE_FILE_IDS = [
    "file:///etc/shadow",
    "/etc/shadow",
    "../../napcat/config/onebot11.json",
    "config.json",
    "C:\\Windows\\win.ini",
    "http://10.0.0.1/admin.png",
    "https://example.com/a.png",
    "base64://AAAA",
    "data:image/png;base64,AAAA",
    "6f1c2b0e9d8a4c3b8e7f6a5b4c3d2e1f/../../etc/passwd",
]


@pytest.mark.parametrize("value", HOSTILE_FILE_IDS)
async def test_a_file_reference_not_shaped_like_a_onebot_file_id_never_reaches_onebot(
    api: FakeApi, http: httpx.AsyncClient, guarded_loader: MediaChecker, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    api.on("/send_group_msg", check_onebot)
    platform = get_platform("onebot")
    bot = bot_config(api, language="en")
    before = rejected_count("onebot", "file_id_shape")
    caplog.set_level(logging.INFO, logger="pipeline.platforms")
    message = outbound(
        [
            {"type": "text", "data": {"text": "look:"}},
            {"type": "image", "data": {"media": {"kind": "file", "value": value}}},
            {"type": "file", "data": {"media": {"kind": "file", "value": value}}},
        ]
    )
    for call in platform.render(bot, message):
        assert (await platform.send(bot, call, http, guarded_loader.load)).status == "delivered"
    [sent] = api.calls("/send_group_msg")
    assert sent.json["message"] == [
        {"type": "text", "data": {"text": "look:"}},
        {"type": "text", "data": {"text": " [attachment unavailable]"}},
        {"type": "text", "data": {"text": " [attachment unavailable]"}},
    ]
    assert value not in sent.body.decode()
    assert rejected_count("onebot", "file_id_shape") == before + 2
    lines = [r.getMessage() for r in caplog.records]
    assert any("file_id_shape" in line for line in lines) and not any(value in line for line in lines)


@pytest.mark.parametrize(
    ("media", "reason"),
    [
        ({"kind": "url", "value": "{server}/a.png"}, "address_loopback"),
        ({"kind": "url", "value": "http://169.254.169.254/latest/meta-data/iam/"}, "address_metadata"),
        ({"kind": "url", "value": "http://[::ffff:10.0.0.1]/x.png"}, "address_private"),
        ({"kind": "url", "value": "file:///etc/shadow"}, "scheme_not_allowed"),
        ({"kind": "url", "value": "http://user:pw@example.com/x.png"}, "credentials_in_url"),
        ({"kind": "path", "value": "/etc/shadow"}, "path_not_allowed"),
        ({"kind": "base64", "value": "not base64!"}, "bad_base64"),
    ],
)
async def test_urls_paths_and_bytes_are_read_by_switchboard_or_refused(
    api: FakeApi,
    http: httpx.AsyncClient,
    media_server: MediaServer,
    strict_loader: MediaChecker,
    caplog: pytest.LogCaptureFixture,
    media: dict[str, str],
    reason: str,
) -> None:
    """With the production loader (no loopback, no media root), each of these is refused by
    Switchboard: OneBot gets the notice, never the URL or path, and the media server no request."""
    api.on("/send_group_msg", check_onebot)
    platform = get_platform("onebot")
    bot = bot_config(api, language="en")
    value = media["value"].replace("{server}", media_server.url)
    before = rejected_count("onebot", reason)
    caplog.set_level(logging.INFO, logger="pipeline.platforms")
    message = outbound([{"type": "image", "data": {"media": {"kind": media["kind"], "value": value}}}])
    [call] = platform.render(bot, message)
    assert (await platform.send(bot, call, http, strict_loader.load)).status == "delivered"
    [sent] = api.calls("/send_group_msg")
    assert sent.json["message"] == [{"type": "text", "data": {"text": "[attachment unavailable]"}}]
    assert media_server.requests == []
    assert rejected_count("onebot", reason) == before + 1
    assert any(reason in r.getMessage() for r in caplog.records)
    assert not any(value in r.getMessage() for r in caplog.records)


async def test_private_long_text_split_and_unreadable_media(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/send_private_msg", check_onebot)
    platform = get_platform("onebot")
    bot = bot_config(api, language="en")
    message = outbound(
        [
            {"type": "text", "data": {"text": "段落。" * 3000}},
            {"type": "image", "data": {"media": {"kind": "path", "value": "/missing.png"}}},
        ],
        chat_id="private_12345678",
        chat_type="private",
    )
    calls = platform.render(bot, message)
    assert len(calls) >= 3
    for call in calls:
        assert (await platform.send(bot, call, http, broken_loader)).status == "delivered"
    sent = api.calls("/send_private_msg")
    assert all(s.json["user_id"] == 12345678 for s in sent)
    joined = "".join(seg["data"]["text"] for s in sent for seg in s.json["message"] if seg["type"] == "text")
    assert joined.count("段落。") == 3000
    # Set apart from the text before it (a space), as the notice always is.
    assert sent[-1].json["message"][-1] == {"type": "text", "data": {"text": " [attachment unavailable]"}}


async def test_several_unavailable_attachments_in_a_row_are_set_apart(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/send_group_msg", check_onebot)
    platform = get_platform("onebot")
    bot = bot_config(api, language="en")
    image = {"type": "image", "data": {"media": {"kind": "path", "value": "/missing.png"}}}
    message = outbound([{"type": "text", "data": {"text": "pictures:"}}, image, image, image, _text("done")])
    [call] = platform.render(bot, message)
    assert (await platform.send(bot, call, http, broken_loader)).status == "delivered"
    [sent] = api.calls("/send_group_msg")
    shown = "".join(seg["data"]["text"] for seg in sent.json["message"])
    notice = "[attachment unavailable]"
    assert shown == f"pictures: {notice} {notice} {notice} done"


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": text}}


@pytest.mark.parametrize(
    ("status", "body", "verdict", "reason"),
    [
        (200, {"status": "async", "retcode": 1, "data": None}, "delivered", ""),
        (
            200,
            {"status": "failed", "retcode": 1404, "data": None, "message": "API不存在"},
            "permanent",
            "unsupported_api",
        ),
        (200, {"status": "failed", "retcode": 100, "data": None, "wording": "参数错误"}, "permanent", "bad_request"),
        (200, {"status": "failed", "retcode": 200, "data": None, "message": "发送失败"}, "permanent", "failed"),
        (200, {"status": "failed", "retcode": 201, "data": None}, "retry", "server_error"),
        (404, "", "permanent", "unsupported_api"),
        (503, "", "retry", "server_error"),
        (429, "", "retry", "rate_limited"),
    ],
)
async def test_retcode_classification(
    api: FakeApi, http: httpx.AsyncClient, status: int, body: Any, verdict: str, reason: str
) -> None:
    api.reply("/send_group_msg", status, body)
    platform = get_platform("onebot")
    bot = bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == (verdict, reason)


async def test_bad_token_is_permanent_and_network_error_retries(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.on("/send_group_msg", check_onebot)
    platform = get_platform("onebot")
    wrong = BotConfig(platform="onebot", bot_id="qq1", credentials={"access_token": "nope"}, api_base=api.url)
    [call] = platform.render(wrong, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(wrong, call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "unauthorized")
    dead = BotConfig(platform="onebot", bot_id="qq1", api_base="http://127.0.0.1:9")
    outcome = await platform.send(dead, call, http, load_media)
    assert (outcome.status, outcome.reason) == ("retry", "network")
