"""DingTalk: inbound robot callbacks as documented (text, richText, picture; one-to-one and group),
each read back by the dingtalk-stream SDK's `ChatbotMessage` and signed here independently of the
platform module; outbound against a stand-in of the robot OpenAPI that checks every request as
DingTalk does (the token header, the paths, `msgParam` a JSON string, a valid `msgKey`,
`robotCode`) and answers with DingTalk's error shapes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import time
from typing import Any

import httpx
import pytest
from dingtalk_stream.chatbot import ChatbotMessage

from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.records import OutboundMessage
from pipeline.runtime import leak_scanner
from pipeline.segments import segment_list_adapter
from pipeline.segments.models import MediaData
from pipeline.settings import BotConfig, Settings

from .conftest import PNG, PNG_B64, FakeApi, Seen, broken_loader, load_media

CLIENT_ID = "dingc3xq8mwzexampleapp"
CLIENT_SECRET = "Xq7w9Zt2Lk4Vb8Nm1Pr6Sd3Fg5Hj0KlQwErTyUiOpAsDfGhJkLzXcVbNm-_example"
ROBOT_CODE = CLIENT_ID  # an internal app's robot: its code is the AppKey
BOT_DINGTALK_ID = "$:LWCP_v1:$robotSwitchboard0001"
TOKEN_PATH = "/v1.0/oauth2/accessToken"
PRIVATE_PATH = "/v1.0/robot/oToMessages/batchSend"
GROUP_PATH = "/v1.0/robot/groupMessages/send"
UPLOAD_PATH = "/media/upload"
MSG_KEYS = {
    "sampleText": {"content"},
    "sampleMarkdown": {"title", "text"},
    "sampleImageMsg": {"photoURL"},
    "sampleFile": {"mediaId", "fileName", "fileType"},
}


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="dingtalk",
        bot_id="dt1",
        self_id=BOT_DINGTALK_ID,
        credentials={"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET},
        api_base=api.url if api else None,
        **extra,
    )


def sign(timestamp: str, secret: str = CLIENT_SECRET) -> str:
    # As the robot documentation states it: timestamp + "\n" + appSecret, HmacSHA256, Base64.
    mac = hmac.new(secret.encode("utf-8"), (timestamp + "\n" + secret).encode("utf-8"), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode("ascii")


def signed(payload: dict[str, Any], *, ts_ms: int | None = None, secret: str = CLIENT_SECRET) -> WebhookRequest:
    body = json.dumps(payload, ensure_ascii=False).encode()
    timestamp = str(ts_ms if ts_ms is not None else int(time.time() * 1000))
    headers = {"timestamp": timestamp, "sign": sign(timestamp, secret), "content-type": "application/json"}
    return WebhookRequest(headers=headers, body=body, received_at_ms=time.time() * 1000)


_ids = itertools.count(1)


def message(
    msgtype: str = "text",
    *,
    text: str = "hello",
    group: bool = False,
    at_bot: bool = False,
    content: dict[str, Any] | None = None,
    n: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A robot message in the documented shape, checked by the SDK's model (it reads it back the same)."""
    n = n if n is not None else next(_ids)
    at_users = [{"dingtalkId": BOT_DINGTALK_ID}] if at_bot else []
    payload: dict[str, Any] = {
        "conversationId": f"cidE2E{n:08d}GroupConversation==" if group else f"cidPrivate{n:08d}==",
        "atUsers": at_users,
        "chatbotCorpId": "dinge8a565example",
        "chatbotUserId": BOT_DINGTALK_ID,
        "msgId": f"msgE2E{n:08d}ABCDEF==",
        "senderNick": "Alice",
        "isAdmin": False,
        "senderStaffId": f"staff{n:05d}",
        "sessionWebhookExpiredTime": int(time.time() * 1000) + 5_400_000,
        "createAt": int(time.time() * 1000),
        "senderCorpId": "dinge8a565example",
        "conversationType": "2" if group else "1",
        "senderId": f"$:LWCP_v1:$sender{n:05d}",
        "sessionWebhook": f"https://oapi.dingtalk.com/robot/sendBySession?session=s{n}",
        "robotCode": ROBOT_CODE,
        "msgtype": msgtype,
    }
    if group:
        payload["conversationTitle"] = "Switchboard test"
        payload["isInAtList"] = at_bot
    if msgtype == "text":
        payload["text"] = {"content": text}
    if content is not None:
        payload["content"] = content
    payload.update(fields)
    assert ChatbotMessage.from_dict(payload).to_dict() == payload  # the SDK's model agrees with the shape
    return payload


# -- in ---------------------------------------------------------------------------------------------


def test_private_text_message() -> None:
    platform, bot = get_platform("dingtalk"), bot_config()
    payload = message(text=" 你好 ")
    request = signed(payload)
    platform.verify(bot, request)
    [m] = platform.parse(bot, request).messages
    assert m.chat_type == "private" and m.chat_id == payload["senderStaffId"]
    assert m.sender.user_id == payload["senderStaffId"] and m.sender.name == "Alice"
    assert m.message_id == payload["msgId"] and m.text == "你好" and not m.mentions_bot
    assert m.sent_at_ms == payload["createAt"]


def test_group_message_with_mentions() -> None:
    platform, bot = get_platform("dingtalk"), bot_config()
    payload = message(
        text=" @Bob what now",
        group=True,
        at_bot=True,
        atUsers=[{"dingtalkId": BOT_DINGTALK_ID}, {"dingtalkId": "$:LWCP_v1:$bob", "staffId": "bob01"}],
    )
    [m] = platform.parse(bot, signed(payload)).messages
    assert m.chat_type == "group" and m.chat_id == payload["conversationId"]
    assert m.mentions_bot and m.mentions == ["bob01"]  # the robot itself is not listed
    assert m.text == "@Bob what now"

    not_at = message(text="chatter", group=True, at_bot=False)
    [m] = platform.parse(bot, signed(not_at)).messages
    assert not m.mentions_bot


def test_rich_text_and_picture() -> None:
    platform, bot = get_platform("dingtalk"), bot_config()
    rich = message(
        "richText",
        content={"richText": [{"text": "look "}, {"type": "picture", "downloadCode": "dlCodeRich1"}, {"text": "!"}]},
    )
    [m] = platform.parse(bot, signed(rich)).messages
    assert [s.type for s in m.segments] == ["text", "image", "text"]
    assert isinstance(m.segments[1].data, MediaData)
    assert m.segments[1].data.media.kind == "file" and m.segments[1].data.media.value == "dlCodeRich1"
    assert m.text == "look [image]!"
    assert ChatbotMessage.from_dict(rich).get_image_list() == ["dlCodeRich1"]

    picture = message("picture", content={"downloadCode": "dlCodePic1"})
    [m] = platform.parse(bot, signed(picture)).messages
    assert m.segments[0].type == "image" and m.segments[0].data.media.value == "dlCodePic1"

    audio = message("audio", content={"duration": 3, "downloadCode": "dlAudio", "recognition": "turn it on"})
    [m] = platform.parse(bot, signed(audio)).messages
    assert [s.type for s in m.segments] == ["audio", "text"] and "turn it on" in m.text


def test_ignored_messages() -> None:
    platform, bot = get_platform("dingtalk"), bot_config()
    assert platform.parse(bot, signed(message("interactiveCard"))).ignored == "not_message"
    outsider = message()
    outsider.pop("senderStaffId")
    assert platform.parse(bot, signed(outsider)).ignored == "no_staff_id"
    own = message(senderId=BOT_DINGTALK_ID)
    assert platform.parse(bot, signed(own)).ignored == "own_message"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: {**r.headers, "sign": sign(r.headers["timestamp"], "wrong-secret")},
        lambda r: {**r.headers, "sign": ""},
        lambda r: {k: v for k, v in r.headers.items() if k != "timestamp"},
        lambda r: {**r.headers, "timestamp": str(int(r.headers["timestamp"]) + 1)},  # sign of another time
        lambda r: {**r.headers, "timestamp": "not-a-number", "sign": sign("not-a-number")},
    ],
)
def test_bad_signature(mutate: Any) -> None:
    platform, bot = get_platform("dingtalk"), bot_config()
    request = signed(message())
    bad = WebhookRequest(headers=mutate(request), body=request.body, received_at_ms=request.received_at_ms)
    with pytest.raises(WebhookRejected) as caught:
        platform.verify(bot, bad)
    assert caught.value.status == 401


def test_stale_and_future_timestamps() -> None:
    platform = get_platform("dingtalk")
    now_ms = int(time.time() * 1000)
    for bot, offset_s, ok in (
        (bot_config(), 290, True),
        (bot_config(), 310, False),
        (bot_config(), -310, False),
        (bot_config(replay_window_seconds=3600), 3500, True),  # DingTalk's own hour, when set
        (bot_config(replay_window_seconds=3600), 3700, False),
    ):
        request = signed(message(), ts_ms=now_ms - offset_s * 1000)
        if ok:
            platform.verify(bot, request)
        else:
            with pytest.raises(WebhookRejected) as caught:
                platform.verify(bot, request)
            assert caught.value.status == 401 and caught.value.reason == "stale_timestamp"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"msgtype": "text"}',
        json.dumps({**message(), "conversationType": "3"}).encode(),
        json.dumps({**message(), "msgId": 5}).encode(),
        json.dumps({**message(), "text": "plain"}).encode(),
        json.dumps({**message(), "senderStaffId": ["x"]}).encode(),
        json.dumps({**message("richText", content={"richText": []}), "content": {"richText": "x"}}).encode(),
        json.dumps({**message(), "msgId": "m" * 5000}).encode(),
    ],
)
def test_malformed_payloads_are_400(body: bytes) -> None:
    platform, bot = get_platform("dingtalk"), bot_config()
    with pytest.raises(WebhookRejected) as caught:
        platform.parse(bot, WebhookRequest(headers={}, body=body))
    assert caught.value.status == 400


# -- the robot OpenAPI stand-in -----------------------------------------------------------------------


class DingTalkStandIn:
    """The robot OpenAPI as DingTalk checks it: tokens it issued, the paths, the bodies."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.tokens_issued = 0
        self.valid_tokens: set[str] = set()
        self.media: dict[str, bytes] = {}

    def install(self) -> DingTalkStandIn:
        self.api.on(TOKEN_PATH, self.token)
        self.api.on(PRIVATE_PATH, self.send)
        self.api.on(GROUP_PATH, self.send)
        self.api.on(UPLOAD_PATH, self.upload)
        return self

    def token(self, seen: Seen) -> tuple[int, Any]:
        assert seen.method == "POST" and seen.json == {"appKey": CLIENT_ID, "appSecret": CLIENT_SECRET}, seen.json
        self.tokens_issued += 1
        token = f"dt-token-{self.tokens_issued}"
        self.valid_tokens.add(token)
        return 200, {"accessToken": token, "expireIn": 7200}

    def authorised(self, token: str | None) -> bool:
        return token in self.valid_tokens

    def send(self, seen: Seen) -> tuple[int, Any]:
        if not self.authorised(seen.headers.get("x-acs-dingtalk-access-token")):
            return 401, {"code": "InvalidAuthentication", "message": "不合法的access_token", "requestid": "r1"}
        check_send(seen)
        if seen.path == GROUP_PATH:
            return 200, {"processQueryKey": f"pqk-{len(self.api.seen)}"}
        return 200, {
            "processQueryKey": f"pqk-{len(self.api.seen)}",
            "invalidStaffIdList": [],
            "flowControlledStaffIdList": [],
        }

    def upload(self, seen: Seen) -> tuple[int, Any]:
        if not self.authorised(seen.query.get("access_token")):
            return 200, {"errcode": 40014, "errmsg": "不合法的access_token"}
        assert seen.method == "POST" and seen.query.get("type") in ("image", "file", "voice", "video")
        name, data, _ctype = seen.files["media"]
        assert data and name
        media_id = f"@lAD{'PDe' * 3}{len(self.media):04d}xyz"
        self.media[media_id] = data
        return 200, {"errcode": 0, "errmsg": "ok", "media_id": media_id, "type": seen.query["type"], "created_at": 1}


def check_send(seen: Seen) -> None:
    """A batchSend / groupMessages/send body as the robot OpenAPI takes it (raises otherwise)."""
    assert seen.method == "POST" and seen.headers["content-type"].startswith("application/json")
    body = seen.json
    assert isinstance(body, dict) and body.get("robotCode") == ROBOT_CODE, body
    assert body.get("msgKey") in MSG_KEYS, body
    assert isinstance(body.get("msgParam"), str), "msgParam is a JSON string"
    assert len(body["msgParam"].encode()) <= 15_000
    param = json.loads(body["msgParam"])
    assert isinstance(param, dict) and set(param) == MSG_KEYS[body["msgKey"]], param
    assert all(isinstance(v, str) and v for v in param.values()), param
    if body["msgKey"] == "sampleImageMsg":
        assert param["photoURL"].startswith("@"), "a media id of media/upload"
    if seen.path == PRIVATE_PATH:
        assert set(body) == {"robotCode", "userIds", "msgKey", "msgParam"}, body
        assert isinstance(body["userIds"], list) and 1 <= len(body["userIds"]) <= 20
    elif seen.path == GROUP_PATH:
        assert set(body) == {"robotCode", "openConversationId", "msgKey", "msgParam"}, body
        assert body["openConversationId"].startswith("cid")
    else:
        raise AssertionError(seen.path)


def outbound(segments: list[dict[str, Any]], *, group: bool = False, chat: str | None = None) -> OutboundMessage:
    chat_id = chat or ("cidE2EGroup==" if group else "staff00001")
    return OutboundMessage(
        outbound_id="out-1",
        kind="reply",
        platform="dingtalk",
        bot_id="dt1",
        chat_id=chat_id,
        chat_type="group" if group else "private",
        conversation_key=f"dingtalk:dt1:{chat_id}",
        segments=segment_list_adapter.validate_python(segments),
    )


async def send_all(
    bot: BotConfig, message: OutboundMessage, http: httpx.AsyncClient, loader: Any = load_media
) -> list[Any]:
    platform = get_platform("dingtalk")
    return [await platform.send(bot, call, http, loader) for call in platform.render(bot, message)]


async def test_text_private_and_markdown_group(api: FakeApi, http: httpx.AsyncClient) -> None:
    standin = DingTalkStandIn(api).install()
    bot = bot_config(api)
    outcomes = await send_all(bot, outbound([{"type": "text", "data": {"text": "hi there"}}]), http)
    assert [o.status for o in outcomes] == ["delivered"]
    [call] = api.calls(PRIVATE_PATH)
    assert call.json["userIds"] == ["staff00001"] and call.json["msgKey"] == "sampleText"
    assert json.loads(call.json["msgParam"]) == {"content": "hi there"}
    assert call.headers["x-acs-dingtalk-access-token"] == "dt-token-1"

    segments = [
        {"type": "markdown", "data": {"content": "## Result\n**bold** and `code`"}},
        {"type": "mention", "data": {"target": "bob01"}},
        {"type": "text", "data": {"text": "see above"}},
    ]
    outcomes = await send_all(bot, outbound(segments, group=True), http)
    assert [o.status for o in outcomes] == ["delivered"]
    [call] = api.calls(GROUP_PATH)
    assert call.json["openConversationId"] == "cidE2EGroup==" and call.json["msgKey"] == "sampleMarkdown"
    param = json.loads(call.json["msgParam"])
    assert param["title"] == "Result" and "**bold**" in param["text"] and "@bob01 see above" in param["text"]
    assert standin.tokens_issued == 1  # cached across sends


async def test_long_text_is_split(api: FakeApi, http: httpx.AsyncClient) -> None:
    DingTalkStandIn(api).install()
    bot = bot_config(api)
    text = ("段落内容。" * 300 + "\n") * 5  # 7,505 characters, 22,000 bytes in UTF-8
    outcomes = await send_all(bot, outbound([{"type": "text", "data": {"text": text}}]), http)
    calls = api.calls(PRIVATE_PATH)
    assert len(calls) >= 2 and all(o.status == "delivered" for o in outcomes)
    shown = "".join(json.loads(c.json["msgParam"])["content"] for c in calls)
    assert shown.replace("\n", "") == text.replace("\n", "")


async def test_image_is_uploaded_and_fallbacks(api: FakeApi, http: httpx.AsyncClient) -> None:
    standin = DingTalkStandIn(api).install()
    bot = bot_config(api, language="en")
    segments = [
        {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
        {"type": "text", "data": {"text": "a pixel"}},
        {"type": "dice", "data": {}},
        {"type": "forward", "data": {"forward_id": "f1"}},
        {"type": "image", "data": {"media": {"kind": "file", "value": "file:///etc/passwd"}}},
    ]
    outcomes = await send_all(bot, outbound(segments, group=True), http)
    assert all(o.status == "delivered" for o in outcomes)
    calls = api.calls(GROUP_PATH)
    assert [c.json["msgKey"] for c in calls] == ["sampleImageMsg", "sampleText"]
    [upload] = api.calls(UPLOAD_PATH)
    assert upload.query["type"] == "image" and upload.files["media"][1] == PNG
    assert json.loads(calls[0].json["msgParam"])["photoURL"] in standin.media
    text = json.loads(calls[1].json["msgParam"])["content"]
    assert text.startswith("a pixel🎲 ") and "[forwarded messages cannot be shown here]" in text
    assert "[attachment unavailable]" in text and "passwd" not in json.dumps([c.json for c in api.seen])

    # A media that cannot be loaded: the notice in its place, no upload.
    before = len(api.calls(UPLOAD_PATH))
    message = outbound([{"type": "file", "data": {"media": {"kind": "url", "value": "http://x/r.pdf"}}}])
    [outcome] = await send_all(bot, message, http, broken_loader)
    assert outcome.status == "delivered" and len(api.calls(UPLOAD_PATH)) == before
    [call] = api.calls(PRIVATE_PATH)
    assert json.loads(call.json["msgParam"]) == {"content": "[attachment unavailable]"}


async def test_file_is_uploaded_as_sample_file(api: FakeApi, http: httpx.AsyncClient, tmp_path: Any) -> None:
    DingTalkStandIn(api).install()
    bot = bot_config(api)
    path = tmp_path / "report.pdf"
    path.write_bytes(b"%PDF-1.4 x")
    message = outbound([{"type": "file", "data": {"media": {"kind": "path", "value": str(path)}}}])
    [outcome] = await send_all(bot, message, http)
    assert outcome.status == "delivered"
    [upload] = api.calls(UPLOAD_PATH)
    assert upload.query["type"] == "file" and upload.files["media"][0] == "report.pdf"
    [call] = api.calls(PRIVATE_PATH)
    assert call.json["msgKey"] == "sampleFile"
    assert json.loads(call.json["msgParam"])["fileName"] == "report.pdf"


async def test_expired_token_is_fetched_again_once(api: FakeApi, http: httpx.AsyncClient) -> None:
    standin = DingTalkStandIn(api).install()
    bot = bot_config(api)
    message = outbound([{"type": "text", "data": {"text": "one"}}])
    assert [o.status for o in await send_all(bot, message, http)] == ["delivered"]
    standin.valid_tokens.clear()  # DingTalk invalidated it before its expiry
    assert [o.status for o in await send_all(bot, message, http)] == ["delivered"]
    assert standin.tokens_issued == 2
    statuses = [c.headers["x-acs-dingtalk-access-token"] for c in api.calls(PRIVATE_PATH)]
    assert statuses == ["dt-token-1", "dt-token-1", "dt-token-2"]


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected", "reason", "retry_after"),
    [
        (
            403,
            {"code": "Forbidden.AccessDenied.QpsLimitForApi", "message": "qps limit"},
            {},
            "retry",
            "rate_limited",
            2.0,
        ),
        (429, {"code": "Throttling", "message": "slow down"}, {"Retry-After": "7"}, "retry", "rate_limited", 7.0),
        (500, {"code": "SystemError", "message": "busy"}, {}, "retry", "server_error", None),
        (400, {"code": "invalidParameter.robotCode", "message": "robot 不存在"}, {}, "permanent", "bad_request", None),
        (400, {"code": "staffId.notExisted", "message": "no such user"}, {}, "permanent", "bad_recipient", None),
        (
            403,
            {"code": "Forbidden.AccessDenied.AccessTokenPermissionDenied", "message": "no scope"},
            {},
            "permanent",
            "forbidden",
            None,
        ),
        (200, {"processQueryKey": "k", "invalidStaffIdList": ["staff00001"]}, {}, "permanent", "bad_recipient", None),
        (200, {"processQueryKey": "k", "flowControlledStaffIdList": ["staff00001"]}, {}, "retry", "rate_limited", 2.0),
    ],
)
async def test_error_classification(
    api: FakeApi,
    http: httpx.AsyncClient,
    status: int,
    body: dict[str, Any],
    headers: dict[str, str],
    expected: str,
    reason: str,
    retry_after: float | None,
) -> None:
    DingTalkStandIn(api).install()
    api.reply(PRIVATE_PATH, status, body, headers, once=True)
    [outcome] = await send_all(bot_config(api), outbound([{"type": "text", "data": {"text": "x"}}]), http)
    assert (outcome.status, outcome.reason, outcome.retry_after) == (expected, reason, retry_after)
    if status != 200:
        assert body["code"] in outcome.detail and body["message"] in outcome.detail  # for the dead letter


async def test_wrong_app_secret_is_permanent(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.reply(TOKEN_PATH, 400, {"code": "invalidClientSecret", "message": "无效的clientSecret"})
    bot = BotConfig(
        platform="dingtalk",
        bot_id="dt1",
        credentials={"client_id": CLIENT_ID + "x", "client_secret": CLIENT_SECRET, "robot_code": ROBOT_CODE},
        api_base=api.url,
    )
    [outcome] = await send_all(bot, outbound([{"type": "text", "data": {"text": "x"}}]), http)
    assert outcome.status == "permanent" and outcome.reason == "unauthorized"
    assert "invalidClientSecret" in outcome.detail and CLIENT_SECRET not in outcome.detail
    assert not api.calls(PRIVATE_PATH)


def test_startup_warning_names_the_unsigned_body() -> None:
    platform = get_platform("dingtalk")
    [warning] = platform.startup_warnings(bot_config())
    assert "not the body" in warning and "300 s" in warning
    assert platform.startup_warnings(bot_config(transport="stream")) == []


def test_the_app_secret_is_in_the_leak_check() -> None:
    scanner = leak_scanner(Settings(bots=[bot_config()]))
    scan = scanner.scan(f"here it is: {CLIENT_SECRET}!")
    assert scan.hits == 1 and CLIENT_SECRET not in scan.text and scan.text.startswith("here it is: ")
    assert scanner.scan("nothing secret here").hits == 0
