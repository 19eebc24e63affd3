"""WeCom: inbound callbacks encrypted and signed with wechatpy's WeCom crypto (`WeChatCrypto`,
`PrpCrypto`), and ours read back by wechatpy; outbound against a local stand-in of the WeCom API
(gettoken, message/send, appchat/send, media/upload, the AI bot's response_url) that checks the
access token on every call, the paths, the body shapes and WeCom's size limits."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import xmltodict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from wechatpy.crypto import _get_signature
from wechatpy.enterprise.crypto import PrpCrypto, WeChatCrypto
from wechatpy.exceptions import InvalidSignatureException

from pipeline.errors import ConfigurationError
from pipeline.platforms import SendOutcome, WebhookRejected, WebhookRequest, WebhookResult
from pipeline.platforms.checks import check_bots
from pipeline.platforms.wecom import WeComPlatform, decrypt, encrypt, msg_signature, split_utf8
from pipeline.records import OutboundMessage
from pipeline.runtime import deployment_secrets
from pipeline.segments import segment_list_adapter
from pipeline.settings import BotConfig, Settings

from .conftest import PNG, FakeApi, Seen, broken_loader, load_media, rejected_count
from .test_fuzz import _paths, _replace, json_values

CORP_ID, CORP_SECRET, AGENT_ID = "ww5f1a2b3c4d5e6f70", "corp-secret-0123456789abcdef", "1000002"
TOKEN = "wecomToken123"
AES_KEY = base64.b64encode(bytes(range(32))).decode().rstrip("=")  # 43 characters
AIBOT_TOKEN = "aibotToken456"
AIBOT_AES_KEY = base64.b64encode(bytes(range(100, 132))).decode().rstrip("=")
AIBOT_ID = "aib_0123456789abcdef"
ALICE = "alice.liu"


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="wecom",
        bot_id="wc1",
        username="Switch",
        credentials={
            "corp_id": CORP_ID,
            "corp_secret": CORP_SECRET,
            "agent_id": AGENT_ID,
            "token": TOKEN,
            "encoding_aes_key": AES_KEY,
            "aibot_token": AIBOT_TOKEN,
            "aibot_encoding_aes_key": AIBOT_AES_KEY,
        },
        api_base=api.url if api else None,
        **extra,
    )


def app_xml(msg_type: str, msg_id: str = "7391234567890123456", user: str = ALICE, **fields: str) -> str:
    """A message as WeCom's callback documents it (接收普通消息)."""
    items = {
        "ToUserName": CORP_ID,
        "FromUserName": user,
        "CreateTime": "1796000000",
        "MsgType": msg_type,
        **fields,
        "MsgId": msg_id,
        "AgentID": AGENT_ID,
    }
    return xmltodict.unparse({"xml": items}, full_document=False)


def app_request(
    plain: str,
    *,
    token: str = TOKEN,
    key: str = AES_KEY,
    corp_id: str = CORP_ID,
    sent_at: int | None = None,
    nonce: str = "1372623149",
) -> WebhookRequest:
    """The POST WeCom makes: the ciphertext and signature made by wechatpy, the signature in the query."""
    timestamp = str(int(time.time()) if sent_at is None else sent_at)
    reply = xmltodict.parse(WeChatCrypto(token, key, corp_id).encrypt_message(plain, nonce, timestamp))["xml"]
    envelope = {"ToUserName": CORP_ID, "AgentID": AGENT_ID, "Encrypt": reply["Encrypt"]}
    body = xmltodict.unparse({"xml": envelope}, full_document=False).encode()
    query = {"msg_signature": reply["MsgSignature"], "timestamp": timestamp, "nonce": nonce}
    return WebhookRequest(headers={"content-type": "text/xml"}, body=body, query=query)


def url_check(
    echo: str, *, token: str = TOKEN, key: str = AES_KEY, receive_id: str = CORP_ID, sent_at: int | None = None
) -> WebhookRequest:
    timestamp, nonce = str(int(time.time()) if sent_at is None else sent_at), "5f7b1e"
    echostr = PrpCrypto(base64.b64decode(key + "=")).encrypt(echo, receive_id).decode()
    query = {"msg_signature": _get_signature(token, timestamp, nonce, echostr), "timestamp": timestamp}
    query.update(nonce=nonce, echostr=echostr)
    return WebhookRequest(headers={}, body=b"", query=query, method="GET")


def aibot_payload(
    text: str = "@Switch hello robot", *, chat_type: str = "group", msg_id: str = "CAIQ16HMjQYY/NGagIOAgAMgq4KM0AI="
) -> dict[str, Any]:
    """The AI bot's text callback (智能机器人 接收消息), as documented."""
    payload: dict[str, Any] = {
        "msgid": msg_id,
        "aibotid": AIBOT_ID,
        "chattype": chat_type,
        "from": {"userid": ALICE},
        "response_url": "https://qyapi.weixin.qq.com/cgi-bin/aibot/response?response_code=RC1",
        "msgtype": "text",
        "text": {"content": text},
    }
    if chat_type == "group":
        payload["chatid"] = "wrkSFfCgAAtMQKg4xqDatM5C9IDHFpTw"
    return payload


def aibot_request(
    payload: dict[str, Any] | str, *, token: str = AIBOT_TOKEN, key: str = AIBOT_AES_KEY, sent_at: int | None = None
) -> WebhookRequest:
    plain = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    timestamp, nonce = str(int(time.time()) if sent_at is None else sent_at), "a1b2c3"
    encrypted = PrpCrypto(base64.b64decode(key + "=")).encrypt(plain, "").decode()
    query = {"msg_signature": _get_signature(token, timestamp, nonce, encrypted), "timestamp": timestamp}
    query["nonce"] = nonce
    body = json.dumps({"encrypt": encrypted}).encode()
    return WebhookRequest(headers={"content-type": "application/json"}, body=body, query=query)


def parse(request: WebhookRequest, bot: BotConfig | None = None) -> WebhookResult:
    platform = WeComPlatform()
    bot = bot or bot_config()
    platform.verify(bot, request)
    return platform.parse(bot, request)


def rejected(request: WebhookRequest, bot: BotConfig | None = None) -> tuple[int, str]:
    with pytest.raises(WebhookRejected) as exc:
        parse(request, bot)
    return exc.value.status, exc.value.reason


# --- crypto --------------------------------------------------------------------------------------


def test_our_crypto_and_wechatpys_read_each_other() -> None:
    message = "<xml><Content><![CDATA[你好, WeCom]]></Content></xml>"
    # Ours → wechatpy.
    ours = encrypt(AES_KEY, message.encode(), CORP_ID)
    assert PrpCrypto(base64.b64decode(AES_KEY + "=")).decrypt(ours, CORP_ID) == message
    signature = msg_signature(TOKEN, "1796000000", "n1", ours)
    assert WeChatCrypto(TOKEN, AES_KEY, CORP_ID).check_signature(signature, "1796000000", "n1", ours) == message
    # wechatpy → ours, every length around the 32-byte padding block.
    for n in range(0, 70):
        text = "字" * n
        theirs = PrpCrypto(base64.b64decode(AES_KEY + "=")).encrypt(text, CORP_ID).decode()
        assert decrypt(AES_KEY, theirs) == (text.encode(), CORP_ID)
    assert msg_signature(TOKEN, "1", "2", "abc") == _get_signature(TOKEN, "1", "2", "abc")
    with pytest.raises(InvalidSignatureException):  # a wrong signature of ours would fail there too
        WeChatCrypto(TOKEN, AES_KEY, CORP_ID).check_signature(signature, "1796000001", "n1", ours)
    with pytest.raises(ValueError):
        decrypt(AIBOT_AES_KEY, ours)  # the wrong key: bad padding (or a garbled length)
    with pytest.raises(ValueError):
        decrypt(AES_KEY[:-1], ours)


# --- in: the self-built app ----------------------------------------------------------------------


def test_url_check_answers_the_plain_echostr() -> None:
    result = parse(url_check("1616140317555161061"))
    assert result.text == "1616140317555161061" and result.ignored == "url_verification" and not result.messages
    # The AI bot's URL check: its own token and key, receiver id "".
    result = parse(url_check("98765", token=AIBOT_TOKEN, key=AIBOT_AES_KEY, receive_id=""))
    assert result.text == "98765"


def test_text_message_from_a_member() -> None:
    request = app_request(app_xml("text", Content="Hello <世界> & you"))
    assert request.body.startswith(b"<xml><ToUserName>") and b"Hello" not in request.body
    [m] = parse(request).messages
    assert m.platform == "wecom" and m.chat_type == "private" and m.chat_id == ALICE
    assert m.sender.user_id == ALICE and m.message_id == m.event_id == "7391234567890123456"
    assert m.text == "Hello <世界> & you" and [s.type for s in m.segments] == ["text"]
    assert m.sent_at_ms == 1796000000 * 1000 and not m.mentions_bot
    assert m.conversation_key == f"wecom:wc1:{ALICE}"
    assert parse(request).text == ""  # WeCom takes an empty 200 as "no passive reply"


def test_media_location_and_link_messages_and_ignored_ones() -> None:
    [m] = parse(app_request(app_xml("image", PicUrl="https://p.qpic.cn/x", MediaId="MEDIA_ID_0123456789ab"))).messages
    assert m.segments[0].type == "image" and m.segments[0].data.media.value == "MEDIA_ID_0123456789ab"
    assert m.text == "[image]"
    [m] = parse(app_request(app_xml("voice", MediaId="VOICE_ID_0123456789ab", Format="amr"))).messages
    assert m.segments[0].type == "audio"
    loc = app_xml("location", Location_X="23.134521", Location_Y="113.358803", Scale="20", Label="广州市")
    [m] = parse(app_request(loc)).messages
    assert m.text == "[location] 广州市 (23.134521, 113.358803)"
    link = app_xml("link", Title="WeCom", Description="d", Url="https://work.weixin.qq.com", PicUrl="")
    [m] = parse(app_request(link)).messages
    assert m.text == "WeCom (https://work.weixin.qq.com)"
    event = xmltodict.unparse(
        {"xml": {"ToUserName": CORP_ID, "FromUserName": ALICE, "MsgType": "event", "Event": "enter_agent"}},
        full_document=False,
    )
    assert parse(app_request(event)).ignored == "not_message"
    assert parse(app_request(app_xml("text", Content="x").replace(AGENT_ID, "1000099"))).ignored == "other_agent"
    assert parse(app_request(app_xml("miniprogram"))).ignored == "unsupported_message"


def test_forged_stale_misaddressed_and_malformed_callbacks_are_refused() -> None:
    plain = app_xml("text", Content="hi")
    assert rejected(app_request(plain, token="another-token")) == (401, "bad_signature")
    assert rejected(url_check("1", token="another-token")) == (401, "bad_signature")
    now = int(time.time())
    assert rejected(app_request(plain, sent_at=now - 3600)) == (401, "stale_timestamp")
    assert parse(app_request(plain, sent_at=now - 240)).messages  # inside the 300 s window
    # Signed with our token, but for another corp, or with another key.
    assert rejected(app_request(plain, corp_id="ww_other_corp")) == (400, "bad_encryption")
    assert rejected(app_request(plain, key=AIBOT_AES_KEY)) == (400, "bad_encryption")
    assert rejected(url_check("1", receive_id="ww_other_corp")) == (400, "bad_encryption")
    # No signature at all, a signature without its ciphertext, a body that is not XML.
    request = app_request(plain)
    assert rejected(WebhookRequest(headers={}, body=request.body)) == (401, "bad_signature")
    assert rejected(WebhookRequest(headers={}, body=b"<xml></xml>", query=request.query)) == (400, "malformed_payload")
    assert rejected(WebhookRequest(headers={}, body=b"\x00not xml", query=request.query))[0] == 400
    # An AI bot callback signed with a token that is neither the bot's nor the app's; and one signed
    # with the app's token but encrypted with the bot's key.
    assert rejected(aibot_request(aibot_payload(), token="unknown-token")) == (401, "bad_signature")
    assert rejected(aibot_request(aibot_payload(), token=TOKEN)) == (400, "bad_encryption")
    # Without credentials nothing is accepted.
    with pytest.raises(WebhookRejected) as exc:
        WeComPlatform().verify(BotConfig(platform="wecom", bot_id="x"), request)
    assert exc.value.status == 401


LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
    '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><xml><MsgType>text</MsgType><Content>&c;</Content>'
    "<FromUserName>u</FromUserName><MsgId>1</MsgId></xml>"
)
EXTERNAL = (
    '<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY x SYSTEM "file:///etc/passwd">]><xml><Content>&x;</Content></xml>'
)


def test_entities_are_never_expanded() -> None:
    # Inside the encrypted message (signed: only a holder of the token could send it): refused.
    for xml in (LAUGHS, EXTERNAL):
        status, reason = rejected(app_request(xml))
        assert (status, reason) == (400, "malformed_payload")
    # Outside, the envelope is never parsed: its `<Encrypt>` is found by a scan and its signature
    # checked first, so an unsigned document is a 401 whatever it declares.
    request = app_request(app_xml("text", Content="hi"))
    outer = LAUGHS.replace("<Content>&c;</Content>", "<Content>&c;</Content><Encrypt>x</Encrypt>").encode()
    assert rejected(WebhookRequest(headers={}, body=outer, query=request.query)) == (401, "bad_signature")


# --- in: the AI bot ------------------------------------------------------------------------------


def test_ai_bot_group_mention_and_single_chat() -> None:
    request = aibot_request(aibot_payload())
    assert json.loads(request.body).keys() == {"encrypt"}
    result = parse(request)
    [m] = result.messages
    assert result.text == ""
    assert m.chat_type == "group" and m.chat_id == "wrkSFfCgAAtMQKg4xqDatM5C9IDHFpTw" and m.mentions_bot
    assert m.text == "hello robot"  # the bot's own @name is not part of the question
    assert m.message_id == m.event_id == "CAIQ16HMjQYY/NGagIOAgAMgq4KM0AI="
    assert m.route == {"response_url": "https://qyapi.weixin.qq.com/cgi-bin/aibot/response?response_code=RC1"}
    [m] = parse(aibot_request(aibot_payload("hi there", chat_type="single"))).messages
    assert m.chat_type == "private" and m.chat_id == ALICE and not m.mentions_bot and m.text == "hi there"


def test_ai_bot_mixed_quote_voice_and_ignored() -> None:
    payload = aibot_payload()
    payload.update(
        msgtype="mixed",
        mixed={
            "msg_item": [
                {"msgtype": "text", "text": {"content": "@Switch what is this"}},
                {"msgtype": "image", "image": {"url": "https://ww-aibot-img.example/encrypted"}},
            ]
        },
        quote={"msgtype": "text", "text": {"content": "an earlier line"}},
    )
    del payload["text"]
    [m] = parse(aibot_request(payload)).messages
    assert m.text == "> an earlier line\nwhat is this[image]"
    voice = dict(aibot_payload(), msgtype="voice", voice={"content": "spoken words"})
    [m] = parse(aibot_request(voice)).messages
    assert "spoken words" in m.text
    assert parse(aibot_request(dict(aibot_payload(), msgtype="stream"))).ignored == "not_message"
    assert parse(aibot_request(dict(aibot_payload(), msgtype="event"))).ignored == "not_message"


def test_ai_bot_response_url_must_be_wecoms() -> None:
    for url in ("http://169.254.169.254/latest", "https://qyapi.weixin.qq.com.evil.example/x", "file:///etc/x"):
        assert rejected(aibot_request(dict(aibot_payload(), response_url=url))) == (400, "malformed_payload")


REASONS = {"malformed_payload", "malformed_json", "bad_encryption", "id_too_long"}
IGNORED = {None, "not_message", "unsupported_message", "other_agent", "own_message"}


def _fuzz_check(request: WebhookRequest) -> None:
    try:
        result = parse(request)
    except WebhookRejected as exc:
        assert 400 <= exc.status < 500 and exc.reason in REASONS | {"bad_signature"}, exc
        return
    assert result.ignored in IGNORED
    for message in result.messages:
        message.model_dump_json()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), new=json_values)
def test_fuzzed_ai_bot_callbacks(data: st.DataObject, new: Any) -> None:
    fixture = aibot_payload()
    path = data.draw(st.sampled_from(_paths(fixture)))
    _fuzz_check(aibot_request(_replace(fixture, path, new)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(["FromUserName", "MsgType", "MsgId", "Content", "CreateTime", "AgentID"]),
    value=st.text(max_size=40),
    raw=st.binary(max_size=64),
)
def test_fuzzed_app_messages(field: str, value: str, raw: bytes) -> None:
    items = {"FromUserName": ALICE, "MsgType": "text", "MsgId": "1", "Content": "x", "CreateTime": "1", "AgentID": "1"}
    items[field] = value
    plain = xmltodict.unparse({"xml": items}, full_document=False)
    _fuzz_check(app_request(plain))
    _fuzz_check(app_request(raw.decode("latin-1")))  # any bytes as the encrypted message
    envelope = app_request(plain)
    _fuzz_check(WebhookRequest(headers={}, body=raw, query=envelope.query))  # any bytes as the body


# --- out -----------------------------------------------------------------------------------------


class WeComStandIn:
    """gettoken, message/send, appchat/send, media/upload and the AI bot's response_url, answering in
    WeCom's format: the access token on every call, body shapes, byte limits, known media ids."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.tokens_issued = 0
        self.media: dict[str, tuple[str, bytes]] = {}  # media_id → (type, bytes)
        self.responded: set[str] = set()  # response codes used (each works once)
        self.expires_in = 7200
        api.on("/cgi-bin/gettoken", self.token)
        api.on("/cgi-bin/message/send", self.send)
        api.on("/cgi-bin/appchat/send", self.send)
        api.on("/cgi-bin/media/upload", self.upload)
        api.on("/cgi-bin/aibot/response", self.respond)

    def token(self, seen: Seen) -> tuple[int, Any]:
        assert seen.method == "GET"
        if seen.query != {"corpid": CORP_ID, "corpsecret": CORP_SECRET}:
            return 200, {"errcode": 40001, "errmsg": "invalid credential"}
        self.tokens_issued += 1
        return 200, {
            "errcode": 0,
            "errmsg": "ok",
            "access_token": f"tok-{self.tokens_issued}",
            "expires_in": self.expires_in,
        }

    def _token_error(self, seen: Seen) -> tuple[int, Any] | None:
        token = seen.query.get("access_token")
        if token is None:
            return 200, {"errcode": 41001, "errmsg": "access_token missing"}
        if token != f"tok-{self.tokens_issued}":
            return 200, {"errcode": 40014, "errmsg": "invalid access_token"}
        return None

    def send(self, seen: Seen) -> tuple[int, Any]:
        error = self._token_error(seen)
        if error is not None:
            return error
        assert seen.method == "POST" and seen.headers["content-type"].startswith("application/json")
        body = seen.json
        if seen.path == "/cgi-bin/message/send":
            assert body["touser"] and "|" not in body["touser"] and body["agentid"] == int(AGENT_ID)
            assert "chatid" not in body
        else:
            assert body["chatid"] and "touser" not in body and "agentid" not in body
        kind = body["msgtype"]
        assert kind in ("text", "markdown", "image", "file", "news"), kind
        assert set(body) - {"touser", "agentid", "chatid"} == {"msgtype", kind}, body
        if kind in ("text", "markdown"):
            content = body[kind]["content"]
            if not content.strip():
                return 200, {"errcode": 44004, "errmsg": "empty content"}
            if len(content.encode()) > 2048:
                return 200, {"errcode": 45002, "errmsg": "content size out of limit"}
        elif kind in ("image", "file"):
            media_id = body[kind]["media_id"]
            if media_id not in self.media or self.media[media_id][0] != kind:
                return 200, {"errcode": 40007, "errmsg": "invalid media_id"}
        else:
            [article] = body["news"]["articles"]
            assert article["url"].startswith("https://") and 0 < len(article["title"].encode()) <= 128
        return 200, {"errcode": 0, "errmsg": "ok", "invaliduser": "", "msgid": f"msg-{len(self.api.seen)}"}

    def upload(self, seen: Seen) -> tuple[int, Any]:
        error = self._token_error(seen)
        if error is not None:
            return error
        kind = seen.query.get("type")
        assert kind in ("image", "voice", "video", "file") and set(seen.files) == {"media"}
        name, data, _ctype = seen.files["media"]
        assert name and "/" not in name
        limit = {"image": 10, "voice": 2, "video": 10, "file": 20}[kind] * 1024 * 1024
        if not 5 <= len(data) <= limit:
            return 200, {"errcode": 40006, "errmsg": "invalid file size"}
        media_id = f"3a8asd892asd8asd{len(self.media):04d}"
        self.media[media_id] = (kind, data)
        return 200, {"errcode": 0, "errmsg": "", "type": kind, "media_id": media_id, "created_at": "1380000000"}

    def respond(self, seen: Seen) -> tuple[int, Any]:
        code = seen.query.get("response_code", "")
        assert code and "access_token" not in seen.query
        if code in self.responded:
            return 200, {"errcode": 93000, "errmsg": "response_code used"}  # once only
        body = seen.json
        assert body["msgtype"] == "markdown" and set(body) == {"msgtype", "markdown"}
        content = body["markdown"]["content"]
        assert content.strip() and len(content.encode()) <= 4096
        self.responded.add(code)
        return 200, {"errcode": 0, "errmsg": "ok"}


def outbound(segments: list[dict[str, Any]], *, chat_id: str = ALICE, **extra: Any) -> OutboundMessage:
    return OutboundMessage(
        outbound_id="out-w",
        kind="reply",
        platform="wecom",
        bot_id="wc1",
        chat_id=chat_id,
        chat_type=extra.pop("chat_type", "private"),
        conversation_key=f"wecom:wc1:{chat_id}",
        segments=segment_list_adapter.validate_python(segments),
        **extra,
    )


async def send_all(
    platform: WeComPlatform, bot: BotConfig, message: OutboundMessage, http: httpx.AsyncClient
) -> list[SendOutcome]:
    return [await platform.send(bot, call, http, load_media) for call in platform.render(bot, message)]


def sent(api: FakeApi, path: str = "/cgi-bin/message/send") -> list[dict[str, Any]]:
    return [s.json for s in api.seen if s.path == path]


async def test_every_segment_and_one_token(api: FakeApi, http: httpx.AsyncClient, tmp_path: Path) -> None:
    stand_in = WeComStandIn(api)
    platform, bot = WeComPlatform(), bot_config(api)
    pdf = tmp_path / "r.pdf"
    pdf.write_bytes(b"%PDF-1.4 test")
    message = outbound(
        [
            {"type": "reply", "data": {"message_id": "7391234567890123456"}},
            {"type": "text", "data": {"text": "plain first "}},
            {"type": "mention", "data": {"target": "bob"}},
            {"type": "face", "data": {"id": "14"}},
            {"type": "image", "data": {"media": {"kind": "base64", "value": base64.b64encode(PNG).decode()}}},
            {"type": "markdown", "data": {"content": "**bold** and `code`"}},
            {"type": "dice", "data": {}},
            {"type": "share", "data": {"url": "https://example.com/a", "title": "Example"}},
            {"type": "file", "data": {"media": {"kind": "path", "value": str(pdf)}}},
            {"type": "forward", "data": {"forward_id": "fw1"}},
        ]
    )
    outcomes = await send_all(platform, bot, message, http)
    assert [o.status for o in outcomes] == ["delivered"] * 6, outcomes
    assert stand_in.tokens_issued == 1  # cached across sends and uploads
    bodies = sent(api)
    assert [b["msgtype"] for b in bodies] == ["text", "image", "markdown", "news", "file", "text"]
    assert bodies[0]["text"] == {"content": "plain first @bob🙂"} and bodies[0]["touser"] == ALICE
    assert stand_in.media[bodies[1]["image"]["media_id"]] == ("image", PNG)
    assert bodies[2]["markdown"]["content"].startswith("**bold** and `code`🎲 ")
    assert bodies[3]["news"] == {"articles": [{"title": "Example", "url": "https://example.com/a"}]}
    assert stand_in.media[bodies[4]["file"]["media_id"]] == ("file", b"%PDF-1.4 test")
    assert bodies[5]["text"]["content"] == "[合并转发的消息无法在此显示]"
    assert all(o.platform_message_id for o in outcomes)


async def test_long_text_and_markdown_split_within_the_byte_limits(api: FakeApi, http: httpx.AsyncClient) -> None:
    WeComStandIn(api)
    platform, bot = WeComPlatform(), bot_config(api)
    text = "".join(f"第{i}行文字 " for i in range(700))  # ~7,700 bytes, 3 bytes a character
    markdown = "\n".join(f"- **要点 {i}** 😀" for i in range(400))
    outcomes = await send_all(platform, bot, outbound([{"type": "text", "data": {"text": text}}]), http)
    assert len(outcomes) >= 4 and all(o.status == "delivered" for o in outcomes)
    assert "".join(b["text"]["content"] for b in sent(api)) == text
    api.seen.clear()
    message = outbound([{"type": "markdown", "data": {"content": markdown}}])
    assert all(o.status == "delivered" for o in await send_all(platform, bot, message, http))
    pieces = [b["markdown"]["content"] for b in sent(api)]
    assert len(pieces) >= 4 and "".join(pieces) == markdown
    assert all(not p.startswith("\n") and not p.endswith(" **") for p in pieces)  # cut after line ends


def test_split_utf8_never_cuts_a_character() -> None:
    for text in ("😀" * 1000, "a" * 5000, "字 " * 2000, "x\n" * 3000):
        pieces = split_utf8(text, 2048)
        assert "".join(pieces) == text and all(len(p.encode()) <= 2048 for p in pieces)


async def test_a_group_chat_goes_through_appchat(api: FakeApi, http: httpx.AsyncClient) -> None:
    WeComStandIn(api)
    platform, bot = WeComPlatform(), bot_config(api)
    message = outbound([{"type": "text", "data": {"text": "to the group"}}], chat_id="wrOgQhDgAAMYQiS5ol9G7g")
    message = message.model_copy(update={"chat_type": "group"})
    [outcome] = await send_all(platform, bot, message, http)
    assert outcome.status == "delivered"
    [body] = sent(api, "/cgi-bin/appchat/send")
    assert body == {"chatid": "wrOgQhDgAAMYQiS5ol9G7g", "msgtype": "text", "text": {"content": "to the group"}}


async def test_an_ai_bot_message_is_answered_once_through_its_response_url(
    api: FakeApi, http: httpx.AsyncClient
) -> None:
    stand_in = WeComStandIn(api)
    platform, bot = WeComPlatform(), bot_config(api, language="en")
    route = {"response_url": f"{api.url}/cgi-bin/aibot/response?response_code=RC7"}
    message = outbound(
        [
            {"type": "text", "data": {"text": "answer " * 1000}},
            {"type": "image", "data": {"media": {"kind": "base64", "value": base64.b64encode(PNG).decode()}}},
            {"type": "share", "data": {"url": "https://example.com/a", "title": "Example"}},
        ],
        chat_id="wrkSFfCgAAtMQKg4xqDatM5C9IDHFpTw",
        chat_type="group",
        route=route,
    )
    calls = platform.render(bot, message)
    assert len(calls) == 1  # a response_url takes one call
    assert (await platform.send(bot, calls[0], http, load_media)).status == "delivered"
    [seen] = api.calls("/cgi-bin/aibot/response")
    content = seen.json["markdown"]["content"]
    assert content.startswith("answer answer") and content.endswith("…") and len(content.encode()) <= 4096
    assert stand_in.tokens_issued == 0 and stand_in.responded == {"RC7"}
    # Notices and progress do not use up the one call the reply needs.
    for kind in ("notice", "progress"):
        assert platform.render(bot, message.model_copy(update={"kind": kind})) == []
    assert len(platform.render(bot, message.model_copy(update={"kind": "confirmation"}))) == 1
    # A route pointing anywhere else is never called.
    foreign = message.model_copy(update={"route": {"response_url": "http://169.254.169.254/x"}})
    [call] = platform.render(bot, foreign)
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "bad_request") and len(api.seen) == 1


async def test_an_ai_bot_answer_with_media_shows_the_notice(api: FakeApi, http: httpx.AsyncClient) -> None:
    WeComStandIn(api)
    platform, bot = WeComPlatform(), bot_config(api, language="en")
    before = rejected_count("wecom", "unsupported_by_platform")
    message = outbound(
        [
            {"type": "text", "data": {"text": "here:"}},
            {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/a.png"}}},
        ],
        route={"response_url": f"{api.url}/cgi-bin/aibot/response?response_code=RC8"},
    )
    [call] = platform.render(bot, message)
    assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    [seen] = api.calls("/cgi-bin/aibot/response")
    assert seen.json["markdown"]["content"] == "here:\n[attachment unavailable]"
    assert "example.com" not in seen.body.decode()
    assert rejected_count("wecom", "unsupported_by_platform") == before + 1


async def test_an_expired_token_is_refreshed_once_within_the_send(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = WeComStandIn(api)
    platform, bot = WeComPlatform(), bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    stand_in.tokens_issued += 1  # WeCom revoked the token: the cached one is now refused with 40014
    assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    assert stand_in.tokens_issued == 3
    assert [s.query.get("access_token") for s in api.seen if s.path == "/cgi-bin/message/send"] == [
        "tok-1",
        "tok-1",
        "tok-3",
    ]
    # Refused again with the new token (42001): once only, then the egress retries later.
    api.reply("/cgi-bin/message/send", 200, {"errcode": 42001, "errmsg": "access_token expired"})
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason, outcome.retry_after) == ("retry", "token_expired", 0.0)
    assert stand_in.tokens_issued == 4 and "42001" in outcome.detail


async def test_an_image_over_10_mb_goes_as_a_file(api: FakeApi, http: httpx.AsyncClient, tmp_path: Path) -> None:
    stand_in = WeComStandIn(api)
    platform, bot = WeComPlatform(), bot_config(api)
    big = tmp_path / "big.png"
    big.write_bytes(PNG + b"\0" * (10 * 1024 * 1024))
    message = outbound([{"type": "image", "data": {"media": {"kind": "path", "value": str(big)}}}])
    assert [o.status for o in await send_all(platform, bot, message, http)] == ["delivered"]
    [body] = sent(api)
    assert body["msgtype"] == "file" and "image" not in body
    assert stand_in.media[body["file"]["media_id"]][0] == "file"
    assert [s.query["type"] for s in api.calls("/cgi-bin/media/upload")] == ["file"]


async def test_concurrent_sends_share_one_token_refreshed_before_it_expires(
    api: FakeApi, http: httpx.AsyncClient
) -> None:
    stand_in = WeComStandIn(api)
    stand_in.expires_in = 301  # 5 minutes are kept in hand: this one is used for 1 s
    platform, bot = WeComPlatform(), bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcomes = await asyncio.gather(*(platform.send(bot, call, http, load_media) for _ in range(20)))
    assert [o.status for o in outcomes] == ["delivered"] * 20
    assert stand_in.tokens_issued == 1 and len(api.calls("/cgi-bin/gettoken")) == 1
    await asyncio.sleep(1.1)
    assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    assert stand_in.tokens_issued == 2  # fetched anew before WeCom would refuse the old one


@pytest.mark.parametrize(
    ("status", "body", "headers", "verdict", "reason", "retry_after"),
    [
        (200, {"errcode": 45009, "errmsg": "api freq out of limit"}, {}, "retry", "rate_limited", 3.0),
        (200, {"errcode": 45033, "errmsg": "api concurrent out of limit"}, {}, "retry", "rate_limited", 3.0),
        (429, "slow down", {"Retry-After": "7"}, "retry", "rate_limited", 7.0),
        (200, {"errcode": -1, "errmsg": "system busy"}, {}, "retry", "server_error", None),
        (502, "bad gateway", {}, "retry", "server_error", None),
        (200, {"errcode": 81013, "errmsg": "user & party & tag all invalid"}, {}, "permanent", "bad_recipient", None),
        (
            200,
            {"errcode": 60020, "errmsg": "not allow to access from your ip"},
            {},
            "permanent",
            "ip_not_allowed",
            None,
        ),
        (200, {"errcode": 12345, "errmsg": "something new"}, {}, "permanent", "api_error", None),
        (200, {"errcode": 0, "errmsg": "ok", "invaliduser": ALICE}, {}, "permanent", "bad_recipient", None),
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
    WeComStandIn(api)
    api.reply("/cgi-bin/message/send", status, body, headers)
    platform, bot = WeComPlatform(), bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason, outcome.retry_after) == (verdict, reason, retry_after)
    if isinstance(body, dict) and body["errcode"]:
        assert body["errmsg"] in outcome.detail  # what the dead letter keeps


async def test_a_bad_secret_is_permanent(api: FakeApi, http: httpx.AsyncClient) -> None:
    WeComStandIn(api)
    platform = WeComPlatform()
    bot = bot_config(api)
    bot.credentials["corp_secret"] = SecretStr("wrong")
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "unauthorized")
    assert outcome.detail.startswith("gettoken: errcode 40001") and "wrong" not in outcome.detail


@pytest.mark.parametrize("value", ["file:///etc/shadow", "/data/x.png", "http://10.0.0.1/a.png", "short"])
async def test_a_media_id_not_of_wecoms_shape_is_not_sent(api: FakeApi, http: httpx.AsyncClient, value: str) -> None:
    WeComStandIn(api)
    platform, bot = WeComPlatform(), bot_config(api, language="en")
    before = rejected_count("wecom", "file_id_shape")
    message = outbound([{"type": "image", "data": {"media": {"kind": "file", "value": value}}}])
    assert [o.status for o in await send_all(platform, bot, message, http)] == ["delivered"]
    [body] = sent(api)
    assert body["text"] == {"content": "[attachment unavailable]"} and value not in json.dumps(body)
    assert rejected_count("wecom", "file_id_shape") == before + 1


async def test_an_existing_media_id_and_an_unreadable_upload(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = WeComStandIn(api)
    stand_in.media["2-G6nrLmr5EC3MMb_-zK1dDdzmd0p7"] = ("image", PNG)
    platform, bot = WeComPlatform(), bot_config(api, language="en")
    message = outbound(
        [
            {"type": "image", "data": {"media": {"kind": "file", "value": "2-G6nrLmr5EC3MMb_-zK1dDdzmd0p7"}}},
            {"type": "video", "data": {"media": {"kind": "path", "value": "/missing.mp4"}}},
        ]
    )
    before = rejected_count("wecom", "unreadable")
    calls = platform.render(bot, message)
    outcomes = [await platform.send(bot, call, http, broken_loader) for call in calls]
    assert [o.status for o in outcomes] == ["delivered", "delivered"]
    bodies = sent(api)
    assert bodies[0]["image"] == {"media_id": "2-G6nrLmr5EC3MMb_-zK1dDdzmd0p7"}
    assert bodies[1] == {
        "touser": ALICE,
        "agentid": 1000002,
        "msgtype": "text",
        "text": {"content": "[attachment unavailable]"},
    }
    assert rejected_count("wecom", "unreadable") == before + 1 and not api.calls("/cgi-bin/media/upload")


# --- configuration -------------------------------------------------------------------------------


def test_required_credentials_secrets_and_start_up_warnings() -> None:
    partial = {"platform": "wecom", "bot_id": "w", "credentials": {"corp_id": CORP_ID, "token": TOKEN}}
    with pytest.raises(ConfigurationError) as exc:
        check_bots(Settings(bots=[partial]))
    text = str(exc.value)
    for name in ("corp_secret", "agent_id", "encoding_aes_key"):
        assert f"credentials.{name}" in text and "required for wecom" in text
    found = {(s.source, s.value) for s in deployment_secrets(Settings(bots=[bot_config()]))}
    for name, value in (
        ("corp_secret", CORP_SECRET),
        ("token", TOKEN),
        ("encoding_aes_key", AES_KEY),
        ("aibot_token", AIBOT_TOKEN),
        ("aibot_encoding_aes_key", AIBOT_AES_KEY),
    ):
        assert (f"bot wecom/wc1, credential '{name}'", value) in found
    assert WeComPlatform().startup_warnings(bot_config()) == []
    bad = bot_config()
    bad.credentials["encoding_aes_key"] = SecretStr("too-short")
    del bad.credentials["aibot_token"]
    warnings = WeComPlatform().startup_warnings(bad)
    assert len(warnings) == 2 and "too-short" not in "".join(warnings)
    assert warnings[0].startswith("encoding_aes_key is not 43 characters")
