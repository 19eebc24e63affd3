"""Lark/Feishu: inbound events built through lark-oapi's own event model (P2ImMessageReceiveV1),
encrypted as Lark does and checked against the SDK's own dispatcher (which must accept the same
request); outbound against a local stand-in of the Open API (token, messages, reply, uploads)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx
import lark_oapi as lark
import pytest
from Crypto.Cipher import AES
from lark_oapi.api.im.v1 import P2ImMessageReceiveV1
from lark_oapi.core.model import RawRequest
from lark_oapi.core.utils.decryptor import AESCipher

from pipeline.platforms import WebhookRejected, WebhookRequest
from pipeline.platforms.lark import LarkPlatform
from pipeline.records import OutboundMessage
from pipeline.runtime import reply_context
from pipeline.segments import segment_list_adapter
from pipeline.segments.context import Member
from pipeline.segments.prompt import turn_context_object
from pipeline.settings import BotConfig
from pipeline.stages.ingest import content_blocks

from .conftest import PNG, FakeApi, Seen, broken_loader, load_media, rejected_count

APP_ID, APP_SECRET = "cli_a1b2c3d4e5", "app-secret-xyz"
VERIFY_TOKEN, ENCRYPT_KEY = "v-token-123", "e-key-456"
BOT_OPEN_ID = "ou_bot0000000000000000000000000001"
ALICE = "ou_alice000000000000000000000000002"


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="lark",
        bot_id="lk1",
        self_id=BOT_OPEN_ID,
        credentials={
            "app_id": APP_ID,
            "app_secret": APP_SECRET,
            "verification_token": VERIFY_TOKEN,
            "encrypt_key": ENCRYPT_KEY,
        },
        api_base=api.url if api else None,
        **extra,
    )


def receive_event(
    message_type: str,
    content: dict[str, Any],
    *,
    chat_type: str = "group",
    mentions: list[dict[str, Any]] | None = None,
    parent_id: str | None = None,
    event_id: str = "5e3702a84e847582be8db7fb73283c02",
) -> dict[str, Any]:
    """An im.message.receive_v1 callback, passed through the SDK's typed model: a field the SDK
    does not know would not survive the round trip."""
    raw = {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "token": VERIFY_TOKEN,
            "create_time": "1608725989000",
            "event_type": "im.message.receive_v1",
            "tenant_key": "2ca1d211f64f6438",
            "app_id": APP_ID,
        },
        "event": {
            "sender": {
                "sender_id": {"union_id": "on_8ed6aa67826108097d9ee143816345", "user_id": "e33ggbyz", "open_id": ALICE},
                "sender_type": "user",
                "tenant_key": "2ca1d211f64f6438",
            },
            "message": {
                "message_id": "om_5ce6d572455d361153b7cb51da133945",
                "root_id": parent_id,
                "parent_id": parent_id,
                "create_time": "1609073151345",
                "update_time": "1609073151345",
                "chat_id": "oc_5ce6d572455d361153b7xx51da133945",
                "chat_type": chat_type,
                "message_type": message_type,
                "content": json.dumps(content, ensure_ascii=False),
                "mentions": mentions or [],
            },
        },
    }
    return json.loads(lark.JSON.marshal(P2ImMessageReceiveV1(raw)))


def mention(key: str, open_id: str, name: str) -> dict[str, Any]:
    return {
        "key": key,
        "id": {"union_id": "on_x", "user_id": "u_x", "open_id": open_id},
        "name": name,
        "tenant_key": "2ca1d211f64f6438",
    }


def encrypt(plaintext: str, key: str = ENCRYPT_KEY) -> str:
    iv = os.urandom(16)
    data = plaintext.encode()
    pad = 16 - len(data) % 16
    cipher = AES.new(hashlib.sha256(key.encode()).digest(), AES.MODE_CBC, iv)
    encrypted = base64.b64encode(iv + cipher.encrypt(data + bytes([pad]) * pad)).decode()
    assert AESCipher(key).decrypt_str(encrypted) == plaintext  # the SDK reads it back
    return encrypted


def encrypted_request(
    event: dict[str, Any],
    *,
    key: str = ENCRYPT_KEY,
    sign_key: str = ENCRYPT_KEY,
    signed: bool = True,
    sent_at: int | None = None,
) -> WebhookRequest:
    body = json.dumps({"encrypt": encrypt(json.dumps(event), key)}).encode()
    headers = {"content-type": "application/json"}
    if signed:
        timestamp, nonce = str(int(time.time()) if sent_at is None else sent_at), "a8bd7e2b"
        signature = hashlib.sha256((timestamp + nonce + sign_key).encode() + body).hexdigest()
        headers.update(
            {"x-lark-request-timestamp": timestamp, "x-lark-request-nonce": nonce, "x-lark-signature": signature}
        )
    return WebhookRequest(headers=headers, body=body)


def sdk_accepts(request: WebhookRequest) -> bool:
    """The SDK's own dispatcher on the same bytes and headers."""
    received: list[Any] = []
    handler = (
        lark.EventDispatcherHandler.builder(ENCRYPT_KEY, VERIFY_TOKEN)
        .register_p2_im_message_receive_v1(received.append)
        .build()
    )
    raw = RawRequest()
    raw.uri = "/webhooks/lark/lk1"
    raw.body = request.body
    raw.headers = {k.title(): v for k, v in request.headers.items()}
    raw.headers.update(
        {
            "X-Lark-Request-Timestamp": request.headers.get("x-lark-request-timestamp", ""),
            "X-Lark-Request-Nonce": request.headers.get("x-lark-request-nonce", ""),
            "X-Lark-Signature": request.headers.get("x-lark-signature", ""),
        }
    )
    response = handler.do(raw)
    return response.status_code == 200


def parse(
    request: WebhookRequest, **extra: Any
) -> Any:  # Any: the tests read the fields of the segment types they expect
    platform = LarkPlatform()
    bot = bot_config(**extra)
    platform.verify(bot, request)
    return platform.parse(bot, request)


# --- in ------------------------------------------------------------------------------------------


def test_encrypted_group_text_mentioning_bot() -> None:
    event = receive_event(
        "text",
        {"text": "@_user_1 hello @_user_2 !"},
        mentions=[mention("@_user_1", BOT_OPEN_ID, "Switch"), mention("@_user_2", ALICE, "Alice")],
    )
    request = encrypted_request(event)
    assert sdk_accepts(request)
    [m] = parse(request).messages
    assert m.chat_type == "group" and m.chat_id == "oc_5ce6d572455d361153b7xx51da133945"
    assert m.event_id == "5e3702a84e847582be8db7fb73283c02"
    assert m.message_id == "om_5ce6d572455d361153b7cb51da133945"
    assert m.sender.user_id == ALICE and m.mentions == [BOT_OPEN_ID, ALICE] and m.mentions_bot
    assert [s.type for s in m.segments] == ["mention", "text", "mention", "text"]
    assert m.text == "@Switch hello @Alice !"
    assert m.sent_at_ms == 1609073151345


def test_p2p_post_with_image_and_reply() -> None:
    post = {
        "title": "Report",
        "content": [
            [{"tag": "text", "text": "see "}, {"tag": "a", "href": "https://example.com", "text": "this"}],
            [{"tag": "img", "image_key": "img_v2_041b28e3-5680-48c2-9af2-497ace79333g"}],
        ],
    }
    event = receive_event("post", post, chat_type="p2p", parent_id="om_parent")
    [m] = parse(encrypted_request(event), session_scope="user").messages
    assert m.chat_type == "private" and not m.mentions_bot
    assert m.reply_to is not None and m.reply_to.message_id == "om_parent"
    assert [s.type for s in m.segments] == ["reply", "text", "image"]
    assert m.segments[2].data.media.value.startswith("img_v2_")
    assert m.text.startswith("Report\nsee this (https://example.com)")
    assert m.conversation_key == "lark:lk1:oc_5ce6d572455d361153b7xx51da133945"  # private: no per-user key


def test_plain_image_message_and_unencrypted_with_token_only() -> None:
    event = receive_event("image", {"image_key": "img_v2_abc"}, chat_type="p2p")
    body = json.dumps(event).encode()
    platform = LarkPlatform()
    bot = BotConfig(platform="lark", bot_id="lk1", credentials={"verification_token": VERIFY_TOKEN})
    request = WebhookRequest(headers={}, body=body)
    platform.verify(bot, request)
    [m] = platform.parse(bot, request).messages
    assert m.segments[0].type == "image" and m.segments[0].data.media.kind == "file"
    forged = json.dumps(dict(event, header=dict(event["header"], token="forged"))).encode()
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot, WebhookRequest(headers={}, body=forged))
    assert (exc.value.status, exc.value.reason) == (401, "bad_token")


def test_url_verification_plain_and_encrypted() -> None:
    challenge = {"challenge": "ajls384kdjx98XX", "token": VERIFY_TOKEN, "type": "url_verification"}
    result = parse(WebhookRequest(headers={}, body=json.dumps(challenge).encode()))
    assert result.body == {"challenge": "ajls384kdjx98XX"} and not result.messages
    result = parse(encrypted_request(challenge, signed=False))
    assert result.body == {"challenge": "ajls384kdjx98XX"}


def test_bad_signature_bad_encryption_and_ignored() -> None:
    event = receive_event("text", {"text": "hi"})
    bad = encrypted_request(event, sign_key="wrong")
    assert not sdk_accepts(bad)
    with pytest.raises(WebhookRejected) as exc:
        parse(bad)
    assert (exc.value.status, exc.value.reason) == (401, "bad_signature")
    with pytest.raises(WebhookRejected) as exc:
        parse(encrypted_request(event, signed=False))
    assert exc.value.status == 401
    with pytest.raises(WebhookRejected) as exc:
        parse(encrypted_request(event, key="another-key"))
    assert exc.value.status == 400
    with pytest.raises(WebhookRejected) as exc:
        LarkPlatform().verify(BotConfig(platform="lark", bot_id="x"), encrypted_request(event))
    assert exc.value.status == 401

    read = dict(event, header=dict(event["header"], event_type="im.message.message_read_v1"))
    assert parse(encrypted_request(read)).ignored == "not_message"
    from_bot = json.loads(json.dumps(event))
    from_bot["event"]["sender"]["sender_type"] = "app"
    assert parse(encrypted_request(from_bot)).ignored == "bot_sender"
    with pytest.raises(WebhookRejected) as exc:
        LarkPlatform().parse(bot_config(), WebhookRequest(headers={}, body=b"{]"))
    assert exc.value.status == 400


def test_a_signed_request_outside_the_replay_window_is_refused() -> None:
    event = receive_event("text", {"text": "hi"})
    now = int(time.time())
    recorded = encrypted_request(event, sent_at=now - 3600)
    assert sdk_accepts(recorded)  # the SDK checks only the signature: a recording passes it
    for request in (recorded, encrypted_request(event, sent_at=now + 3600)):
        with pytest.raises(WebhookRejected) as exc:
            parse(request)
        assert (exc.value.status, exc.value.reason) == (401, "stale_timestamp")
    # Inside the default 300 s, and inside a bot's own longer window.
    assert parse(encrypted_request(event, sent_at=now - 240)).messages
    assert parse(encrypted_request(event, sent_at=now - 1800), replay_window_seconds=3600).messages
    with pytest.raises(WebhookRejected) as exc:
        parse(encrypted_request(event, sent_at=now - 1800))
    assert exc.value.reason == "stale_timestamp"
    # Signed, but without a timestamp to check.
    unstamped = encrypted_request(event)
    headers = {k: v for k, v in unstamped.headers.items() if k != "x-lark-request-timestamp"}
    with pytest.raises(WebhookRejected) as exc:
        parse(WebhookRequest(headers=headers, body=unstamped.body))
    assert exc.value.status == 401


def test_mention_names_reach_the_text_and_the_member_list() -> None:
    bob = "ou_bob00000000000000000000000000003"
    event = receive_event(
        "text",
        {"text": "@_user_1 please ask @_user_2 about it"},
        mentions=[mention("@_user_1", BOT_OPEN_ID, "Switch"), mention("@_user_2", bob, "Bob Lee")],
    )
    [m] = parse(encrypted_request(event)).messages
    assert m.mentions == [BOT_OPEN_ID, bob] and m.mention_names == {BOT_OPEN_ID: "Switch", bob: "Bob Lee"}
    bot = bot_config()
    assert content_blocks(m, bot, label_sender=False)[0]["text"] == "please ask @Bob Lee about it"
    ctx = reply_context(bot, m, [])  # Bob never spoke in the window, and is listed all the same
    assert ctx.context_members == (Member(bob, "Bob Lee"),) and bob in ctx.mentionable_ids()
    assert turn_context_object(ctx)["members"] == [{"user_id": bob, "name": "Bob Lee"}]


# --- out -----------------------------------------------------------------------------------------


class LarkStandIn:
    """Token issuance and the IM endpoints, checking auth, bodies and content JSON."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.tokens_issued = 0
        # Lark sends at most one message per `uuid` within an hour; a repeat is answered like the first.
        self.sent: dict[str, Any] = {}
        self.repeated: list[str] = []
        api.on("/open-apis/auth/v3/tenant_access_token/internal", self.token)
        api.on("/open-apis/im/v1/messages", self.create)
        api.on("/open-apis/im/v1/messages/om_parent/reply", self.create)
        api.on("/open-apis/im/v1/images", self.image)
        api.on("/open-apis/im/v1/files", self.file)

    def token(self, seen: Seen) -> tuple[int, Any]:
        assert seen.json == {"app_id": APP_ID, "app_secret": APP_SECRET}
        self.tokens_issued += 1
        return 200, {"code": 0, "msg": "ok", "tenant_access_token": f"t-{self.tokens_issued}", "expire": 7200}

    def _auth(self, seen: Seen) -> bool:
        return seen.headers.get("authorization") == f"Bearer t-{self.tokens_issued}"

    def create(self, seen: Seen) -> tuple[int, Any]:
        if not self._auth(seen):
            return 400, {"code": 99991663, "msg": "Invalid access token for authorization."}
        body = seen.json
        if seen.path == "/open-apis/im/v1/messages":
            assert seen.query == {"receive_id_type": "chat_id"} and body["receive_id"].startswith("oc_")
        assert body["msg_type"] in ("text", "post", "image", "file") and len(body["uuid"]) <= 50
        content = json.loads(body["content"])
        if body["msg_type"] == "text":
            assert content["text"]
        elif body["msg_type"] == "image":
            assert set(content) == {"image_key"} and re.fullmatch(r"img_(v\d+_)?[\w-]+", content["image_key"])
        elif body["msg_type"] == "file":
            assert set(content) == {"file_key"} and re.fullmatch(r"file_(v\d+_)?[\w-]+", content["file_key"])
        elif body["msg_type"] == "post":
            [(locale, post)] = content.items()
            assert locale in ("zh_cn", "en_us") and post["content"]
            for para in post["content"]:
                tags = [el["tag"] for el in para]
                assert "md" not in tags or tags == ["md"], "md takes a paragraph of its own"
        assert len(seen.body or json.dumps(body).encode()) < 30 * 1024
        if body["uuid"] in self.sent:
            self.repeated.append(body["uuid"])
            return 200, self.sent[body["uuid"]]
        answer = {"code": 0, "msg": "success", "data": {"message_id": f"om_sent_{len(self.api.seen)}"}}
        self.sent[body["uuid"]] = answer
        return 200, answer

    def image(self, seen: Seen) -> tuple[int, Any]:
        assert self._auth(seen) and seen.form == {"image_type": "message"} and seen.files["image"][1] == PNG
        return 200, {"code": 0, "msg": "success", "data": {"image_key": "img_v2_uploaded"}}

    def file(self, seen: Seen) -> tuple[int, Any]:
        assert self._auth(seen) and seen.form["file_type"] == "pdf" and seen.form["file_name"] == "r.pdf"
        return 200, {"code": 0, "msg": "success", "data": {"file_key": "file_v2_uploaded"}}


def outbound(segments: list[dict[str, Any]], **extra: Any) -> OutboundMessage:
    return OutboundMessage(
        outbound_id="out-l",
        kind="reply",
        platform="lark",
        bot_id="lk1",
        chat_id="oc_5ce6d572455d361153b7xx51da133945",
        chat_type="group",
        conversation_key="lark:lk1:oc_5ce6d572455d361153b7xx51da133945",
        segments=segment_list_adapter.validate_python(segments),
        **extra,
    )


async def test_text_post_image_file_and_token_cache(api: FakeApi, http: httpx.AsyncClient, tmp_path: Path) -> None:
    stand_in = LarkStandIn(api)
    platform = LarkPlatform()
    bot = bot_config(api)
    pdf = tmp_path / "r.pdf"
    pdf.write_bytes(b"%PDF-1.4 test")
    message = outbound(
        [
            {"type": "text", "data": {"text": "plain first"}},
            {"type": "image", "data": {"media": {"kind": "base64", "value": base64.b64encode(PNG).decode()}}},
            {"type": "mention", "data": {"target": ALICE}},
            {"type": "text", "data": {"text": " see below\nsecond line"}},
            {"type": "markdown", "data": {"content": "**bold** and `code`"}},
            {"type": "share", "data": {"url": "https://example.com", "title": "Example"}},
            {"type": "dice", "data": {}},
            {"type": "file", "data": {"media": {"kind": "path", "value": str(pdf)}}},
            {"type": "image", "data": {"media": {"kind": "file", "value": "img_v2_existing"}}},
        ],
        reply_to_message_id="om_parent",
    )
    calls = platform.render(bot, message)
    outcomes = [await platform.send(bot, call, http, load_media) for call in calls]
    for outcome in outcomes:
        assert outcome.status == "delivered", outcome
        assert outcome.platform_message_id
    assert stand_in.tokens_issued == 1  # cached across sends
    sent = [s for s in api.seen if s.path.startswith("/open-apis/im/v1/messages")]
    assert sent[0].path.endswith("/om_parent/reply")  # only the first message quotes
    assert all(s.path == "/open-apis/im/v1/messages" for s in sent[1:])
    kinds = [(s.json["msg_type"], json.loads(s.json["content"])) for s in sent]
    assert kinds[0] == ("text", {"text": "plain first"})
    assert kinds[1] == ("image", {"image_key": "img_v2_uploaded"})
    post = kinds[2][1]["zh_cn"]["content"]
    assert post[0] == [{"tag": "at", "user_id": ALICE}, {"tag": "text", "text": " see below"}]
    assert post[1] == [{"tag": "text", "text": "second line"}]
    assert post[2] == [{"tag": "md", "text": "**bold** and `code`"}]
    assert post[3][0] == {"tag": "a", "text": "Example", "href": "https://example.com"}
    assert post[3][1]["text"].startswith("🎲 ")
    assert kinds[3] == ("file", {"file_key": "file_v2_uploaded"})
    assert kinds[4] == ("image", {"image_key": "img_v2_existing"})
    assert len({s.json["uuid"] for s in sent}) == len(sent)
    # A re-render gives the same uuids, so Lark drops a replayed send.
    uuids = [(c.json or {})["uuid"] for c in calls]
    again = platform.render(bot, message)
    assert [(c.json or {})["uuid"] for c in again] == uuids
    replayed = await platform.send(bot, again[0], http, load_media)
    assert replayed.status == "delivered" and stand_in.repeated == [uuids[0]]
    assert replayed.platform_message_id == outcomes[0].platform_message_id, "the first send's message"


async def test_many_short_paragraphs_stay_under_the_body_limit(api: FakeApi, http: httpx.AsyncClient) -> None:
    LarkStandIn(api)
    platform = LarkPlatform()
    bot = bot_config(api)
    # 4,000 one-character lines with a mention: few characters, but 4,000 post paragraphs of JSON.
    message = outbound(
        [{"type": "mention", "data": {"target": ALICE}}, {"type": "text", "data": {"text": '\n"' * 4000}}]
    )
    calls = platform.render(bot, message)
    assert len(calls) >= 3
    for call in calls:
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"


async def test_long_markdown_split_and_unreadable_image(api: FakeApi, http: httpx.AsyncClient) -> None:
    LarkStandIn(api)
    platform = LarkPlatform()
    bot = bot_config(api, language="en")
    message = outbound(
        [
            {"type": "markdown", "data": {"content": "\n".join(f"- 第{i}行 **要点** 😀" for i in range(1500))}},
            {"type": "image", "data": {"media": {"kind": "path", "value": "/missing.png"}}},
        ]
    )
    calls = platform.render(bot, message)
    assert len(calls) >= 3
    for call in calls:
        assert (await platform.send(bot, call, http, broken_loader)).status == "delivered"
    sent = [s for s in api.seen if s.path == "/open-apis/im/v1/messages"]
    joined = "".join(
        el["text"] for s in sent[:-1] for p in json.loads(s.json["content"])["en_us"]["content"] for el in p
    )
    assert joined.count("要点") == 1500
    assert json.loads(sent[-1].json["content"]) == {"text": "[attachment unavailable]"}


@pytest.mark.parametrize(
    ("status", "body", "verdict", "reason"),
    [
        (400, {"code": 99991400, "msg": "request trigger frequency limit"}, "retry", "rate_limited"),
        (429, {"code": 99991400, "msg": "request trigger frequency limit"}, "retry", "rate_limited"),
        (400, {"code": 230002, "msg": "Bot/User can NOT be out of the chat."}, "permanent", "not_in_chat"),
        (400, {"code": 230020, "msg": "This operation triggers the frequency limit."}, "retry", "rate_limited"),
        (400, {"code": 12345678, "msg": "new"}, "permanent", "api_error"),
        (500, "oops", "retry", "server_error"),
    ],
)
async def test_error_classification(
    api: FakeApi, http: httpx.AsyncClient, status: int, body: Any, verdict: str, reason: str
) -> None:
    stand_in = LarkStandIn(api)
    api.reply("/open-apis/im/v1/messages", status, body, {"x-ogw-ratelimit-reset": "2"})
    platform = LarkPlatform()
    bot = bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == (verdict, reason)
    if reason == "rate_limited":
        assert outcome.retry_after == 2.0
    assert stand_in.tokens_issued == 1


async def test_expired_token_is_dropped_and_refetched(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = LarkStandIn(api)
    platform = LarkPlatform()
    bot = bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    stand_in.tokens_issued += 1  # the server rotated the token: the cached one is now invalid
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason, outcome.retry_after) == ("retry", "token_expired", 0.0)
    assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    assert stand_in.tokens_issued == 3


async def test_bad_app_secret_is_permanent(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.reply("/open-apis/auth/v3/tenant_access_token/internal", 200, {"code": 10014, "msg": "app secret invalid"})
    platform = LarkPlatform()
    bot = bot_config(api)
    [call] = platform.render(bot, outbound([{"type": "text", "data": {"text": "hi"}}]))
    outcome = await platform.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason) == ("permanent", "unauthorized")


@pytest.mark.parametrize(
    ("segment", "value"),
    [
        ("image", "file:///etc/shadow"),
        ("image", "https://example.com/a.png"),
        ("image", "file_v2_not_an_image_key"),
        ("file", "img_v2_not_a_file_key"),
        ("video", "/data/v.mp4"),
    ],
)
async def test_a_key_not_of_lark_shape_is_not_sent(
    api: FakeApi, http: httpx.AsyncClient, segment: str, value: str
) -> None:
    LarkStandIn(api)
    platform = LarkPlatform()
    bot = bot_config(api, language="en")
    before = rejected_count("lark", "file_id_shape")
    message = outbound([{"type": segment, "data": {"media": {"kind": "file", "value": value}}}])
    for call in platform.render(bot, message):
        assert (await platform.send(bot, call, http, load_media)).status == "delivered"
    [sent] = [s for s in api.seen if s.path == "/open-apis/im/v1/messages"]
    assert json.loads(sent.json["content"]) == {"text": "[attachment unavailable]"}
    assert value not in sent.body.decode()
    assert rejected_count("lark", "file_id_shape") == before + 1


async def test_an_unreadable_upload_is_counted_with_its_reason(api: FakeApi, http: httpx.AsyncClient) -> None:
    LarkStandIn(api)
    platform = LarkPlatform()
    bot = bot_config(api, language="en")
    before = rejected_count("lark", "unreadable")
    [call] = platform.render(bot, outbound([{"type": "file", "data": {"media": {"kind": "path", "value": "/x"}}}]))
    assert (await platform.send(bot, call, http, broken_loader)).status == "delivered"
    assert rejected_count("lark", "unreadable") == before + 1


def test_a_mention_with_an_empty_key_is_ignored_not_looped_on() -> None:
    bob = "ou_bob00000000000000000000000000003"
    event = receive_event(
        "text",
        {"text": "hello @_user_1"},
        mentions=[mention("", BOT_OPEN_ID, "Switch"), mention("@_user_1", bob, "Bob Lee")],
    )
    [m] = parse(encrypted_request(event)).messages
    assert m.mentions == [bob] and not m.mentions_bot
    assert m.text == "hello @Bob Lee" and [s.type for s in m.segments] == ["text", "mention"]
