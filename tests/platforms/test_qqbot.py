"""QQ bot (official API): inbound callbacks in QQ's envelope, each read back through qq-botpy's own
event parsers (the SDK must see the same ids), signed with Ed25519 as QQ documents (the seed
derivation checked against the docs' worked example); outbound against a stand-in of the OpenAPI
that checks the token header, paths, body shapes and QQ's passive-reply rules (a known msg_id inside
its window, at most 5 replies, no msg_seq twice for one msg_id)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections import defaultdict
from typing import Any

import httpx
import pytest
from botpy.connection import ConnectionState
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline.errors import ConfigurationError
from pipeline.platforms import MediaLoader, WebhookRejected, WebhookRequest
from pipeline.platforms.checks import check_bots
from pipeline.platforms.qqbot import QQBotPlatform
from pipeline.records import OutboundMessage
from pipeline.segments import segment_list_adapter
from pipeline.settings import BotConfig, Settings

from .conftest import PNG, PNG_B64, FakeApi, Seen, broken_loader, load_media, rejected_count

# The bot secret of QQ's own worked example (event-emit.md), so its published signature checks us.
APP_ID, APP_SECRET = "11111111", "DG5g3B4j9X2KOErG"
BOT_USER = "4829451786362001"  # the bot's guild user id (`<@!…>` in channels)
GROUP = "C9F778FE6ADF9D1D1DBE395BF744A33A"
MEMBER = "E4F4AEA33253A2797FB897C50B81D7ED"
USER = "3A2C1F5D7B6E4A8C9D0E1F2A3B4C5D6E"
CHANNEL, GUILD, DM_GUILD = "1000001", "9000000000000001", "7000000000000001"
ALICE_GUILD_ID = "14521312312345"


def bot_config(api: FakeApi | None = None, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="qqbot",
        bot_id="qb1",
        self_id=BOT_USER,
        credentials={"app_id": APP_ID, "app_secret": APP_SECRET},
        api_base=api.url if api else None,
        **extra,
    )


# -- inbound -------------------------------------------------------------------------------------


def qq_key(secret: str = APP_SECRET) -> Ed25519PrivateKey:
    """QQ's derivation, written out here on its own: the secret repeated, cut to the 32-byte seed."""
    return Ed25519PrivateKey.from_private_bytes((secret * 32).encode()[:32])


def signed(payload: dict[str, Any], *, secret: str = APP_SECRET, timestamp: int | None = None) -> WebhookRequest:
    body = json.dumps(payload, ensure_ascii=False).encode()
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    signature = qq_key(secret).sign(stamp.encode() + body).hex()
    headers = {
        "x-signature-ed25519": signature,
        "x-signature-timestamp": stamp,
        "x-bot-appid": APP_ID,
        "user-agent": "QQBot-Callback",
    }
    return WebhookRequest(headers=headers, body=body, received_at_ms=time.time() * 1000)


_events = itertools.count(1)


def envelope(kind: str, data: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
    """A dispatch (op 0) as QQ posts it, read back through qq-botpy's parser for `kind`: the SDK
    must find the ids Switchboard reads where Switchboard reads them."""
    payload = {"op": 0, "id": event_id or f"{kind}:{next(_events):08d}", "d": data, "s": 1, "t": kind}
    seen: list[Any] = []
    state = ConnectionState(lambda name, *args: seen.append((name, *args)), None)
    state.parsers[kind.lower()](payload)
    [(name, sdk)] = seen
    assert name == kind.lower() and sdk.id == data["id"] and sdk.event_id == payload["id"]
    assert sdk.content == data.get("content")
    if kind == "GROUP_AT_MESSAGE_CREATE":
        assert (sdk.group_openid, sdk.author.member_openid) == (data["group_openid"], data["author"]["member_openid"])
    elif kind == "C2C_MESSAGE_CREATE":
        assert sdk.author.user_openid == data["author"]["user_openid"]
    else:
        assert (sdk.guild_id, sdk.channel_id, sdk.author.id) == (
            data["guild_id"],
            data["channel_id"],
            data["author"]["id"],
        )
    assert [a.url for a in sdk.attachments] == [a["url"] for a in data.get("attachments", [])]
    return payload


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


def group_at(
    text: str, *, message_id: str = "ROBOT1.0_group_msg_1", group: str = GROUP, **extra: Any
) -> dict[str, Any]:
    data = {
        "author": {"id": MEMBER, "member_openid": MEMBER, "union_openid": MEMBER},
        "content": f" {text}",  # QQ removes the bot's @ and leaves the space after it
        "group_id": group,
        "group_openid": group,
        "id": message_id,
        "timestamp": now_iso(),
        **extra,
    }
    return envelope("GROUP_AT_MESSAGE_CREATE", data)


def c2c(text: str, *, message_id: str = "ROBOT1.0_c2c_msg_1", user: str = USER, **extra: Any) -> dict[str, Any]:
    data = {
        "author": {"id": user, "user_openid": user, "union_openid": user},
        "content": text,
        "id": message_id,
        "timestamp": now_iso(),
        **extra,
    }
    return envelope("C2C_MESSAGE_CREATE", data)


def guild_at(
    text: str,
    *,
    message_id: str = "08e092eeb983afef9e0110f1a8b2e80b",
    mentions: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    data = {
        "author": {"avatar": "https://thirdqq.qlogo.cn/0", "bot": False, "id": ALICE_GUILD_ID, "username": "Alice"},
        "channel_id": CHANNEL,
        "content": f"<@!{BOT_USER}> {text}",
        "guild_id": GUILD,
        "id": message_id,
        "member": {"joined_at": "2021-04-12T16:34:50+08:00", "nick": "Alice", "roles": ["1"]},
        "mentions": mentions or [{"avatar": "", "bot": True, "id": BOT_USER, "username": "Switch"}],
        "seq": 44,
        "seq_in_channel": "44",
        "timestamp": now_iso(),
        **extra,
    }
    return envelope("AT_MESSAGE_CREATE", data)


def direct(text: str, *, message_id: str = "08e5f0a3b7a5c3d2e101", **extra: Any) -> dict[str, Any]:
    data = {
        "author": {"avatar": "", "id": ALICE_GUILD_ID, "username": "Alice"},
        "channel_id": "2000001",
        "content": text,
        "direct_message": True,
        "guild_id": DM_GUILD,
        "id": message_id,
        "src_guild_id": GUILD,
        "timestamp": now_iso(),
        **extra,
    }
    return envelope("DIRECT_MESSAGE_CREATE", data)


platform = QQBotPlatform()


def take(request: WebhookRequest, bot: BotConfig | None = None) -> Any:
    bot = bot or bot_config()
    platform.verify(bot, request)
    return platform.parse(bot, request)


def test_the_key_derivation_matches_qqs_worked_examples() -> None:
    # event-emit.md: secret DG5g3B4j9X2KOErG, op 13 with this plain_token and event_ts → this signature.
    request = signed_raw(b'{"d":{"plain_token":"Arq0D5A61EgUu4OxUvOp","event_ts":"1725442341"},"op":13}')
    result = take(request)
    assert result.body == {
        "plain_token": "Arq0D5A61EgUu4OxUvOp",
        "signature": "87befc99c42c651b3aac0278e71ada338433ae26fcb24307bdc5ad38c1adc2d0"
        "1bcfcadc0842edac85e85205028a1132afe09280305f13aa6909ffc2d652c706",
    }
    assert result.messages == [] and result.ignored == "url_verification"
    # sign.md: secret naOC0ocQE3shWLAfffVLB1rhYPG7 → the public key starts 215 195 98 254.
    public = qq_key("naOC0ocQE3shWLAfffVLB1rhYPG7").public_key().public_bytes_raw()
    assert list(public[:4]) == [215, 195, 98, 254]


def test_group_at_message() -> None:
    result = take(signed(group_at("what is the weather")))
    [message] = result.messages
    assert result.body == {"op": 12, "d": 0}
    assert message.chat_id == f"group:{GROUP}" and message.chat_type == "group"
    assert message.sender.user_id == MEMBER
    assert message.text == "what is the weather" and message.mentions_bot
    assert message.message_id == "ROBOT1.0_group_msg_1"
    assert message.event_id.startswith("GROUP_AT_MESSAGE_CREATE:")
    assert message.route["msg_id"] == "ROBOT1.0_group_msg_1"
    assert abs(int(message.route["at_ms"]) - time.time() * 1000) < 5_000
    assert message.conversation_key == f"qqbot:qb1:group%3A{GROUP}"


def test_c2c_with_image_attachment() -> None:
    attachment = {
        "content_type": "image/jpeg",
        "filename": "A1B2.jpg",
        "height": 10,
        "width": 10,
        "size": 1234,
        "url": "https://multimedia.nt.qq.com.cn/download?appid=1407&fileid=abc",
    }
    [message] = take(signed(c2c("look", attachments=[attachment]))).messages
    assert message.chat_id == f"c2c:{USER}" and message.chat_type == "private" and message.mentions_bot
    assert [s.type for s in message.segments] == ["text", "image"]
    assert message.segments[1].data.media.value == attachment["url"]
    assert message.text == "look[image]"


def test_guild_channel_mentions_and_direct_message() -> None:
    payload = guild_at(
        "hi <@!200> and <@!300>",
        mentions=[{"bot": True, "id": BOT_USER, "username": "Switch"}, {"bot": False, "id": "200", "username": "Bob"}],
    )
    [message] = take(signed(payload)).messages
    assert message.chat_id == f"channel:{CHANNEL}" and message.chat_type == "group"
    assert message.mentions == [BOT_USER, "200", "300"] and message.mentions_bot
    assert message.mention_names == {BOT_USER: "Switch", "200": "Bob"}
    assert message.sender.name == "Alice"
    assert [s.type for s in message.segments] == ["mention", "text", "mention", "text", "mention"]

    # MESSAGE_CREATE (every channel message, private bots): addresses the bot only when it is @-ed.
    plain = envelope("MESSAGE_CREATE", dict(guild_at("x")["d"], content="just chatting", mentions=[], id="m2"))
    [context] = take(signed(plain)).messages
    assert not context.mentions_bot

    [dm] = take(signed(direct("private question"))).messages
    assert dm.chat_id == f"dm:{DM_GUILD}" and dm.chat_type == "private" and dm.mentions_bot
    assert dm.text == "private question"


def test_quote_and_faces_in_a_channel() -> None:
    payload = guild_at("see <emoji:13>", message_reference={"message_id": "08parent"})
    [message] = take(signed(payload)).messages
    assert message.reply_to is not None and message.reply_to.message_id == "08parent"
    assert [s.type for s in message.segments] == ["reply", "mention", "text", "face"]


def test_bad_signatures_and_stale_requests_are_refused() -> None:
    good = signed(c2c("hello"))
    forged = signed(c2c("hello"), secret="another-secret-entirely")
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot_config(), forged)
    assert exc.value.status == 401 and exc.value.reason == "bad_signature"
    tampered = WebhookRequest(headers=good.headers, body=good.body.replace(b"hello", b"hellp"))
    for request in (
        tampered,
        WebhookRequest(headers={}, body=good.body),  # unsigned
        WebhookRequest(headers={**good.headers, "x-signature-ed25519": "zz" * 64}, body=good.body),
        WebhookRequest(headers={**good.headers, "x-signature-ed25519": "ab" * 10}, body=good.body),
        WebhookRequest(headers={**good.headers, "x-bot-appid": "99999999"}, body=good.body),
    ):
        with pytest.raises(WebhookRejected) as exc:
            platform.verify(bot_config(), request)
        assert exc.value.status == 401
    stale = signed(c2c("hello"), timestamp=int(time.time()) - 3600)
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot_config(), stale)
    assert exc.value.reason == "stale_timestamp"
    with pytest.raises(WebhookRejected):  # no secret configured: nothing is taken
        platform.verify(BotConfig(platform="qqbot", bot_id="x"), good)


def test_validation_is_not_a_signing_oracle() -> None:
    """Op 13's answer is a signature with the callback key: only QQ-shaped tokens are signed, so a
    forged callback (timestamp + a JSON body) cannot be had that way."""
    body = json.dumps(c2c("forged")).encode()
    oracle = {"op": 13, "d": {"plain_token": body.decode(), "event_ts": "1725442341"}}
    unsigned = WebhookRequest(headers={}, body=json.dumps(oracle).encode())
    with pytest.raises(WebhookRejected) as exc:
        platform.verify(bot_config(), unsigned)  # QQ signs op 13 like every other callback
    assert (exc.value.status, exc.value.reason) == (401, "bad_signature")
    request = signed_raw(json.dumps(oracle).encode())
    platform.verify(bot_config(), request)
    with pytest.raises(WebhookRejected) as exc:
        platform.parse(bot_config(), request)  # even signed, only a plain token is answered
    assert exc.value.status == 400
    for d in ({"plain_token": "abc", "event_ts": "12a"}, {"plain_token": "", "event_ts": "1"}, {}):
        with pytest.raises(WebhookRejected):
            platform.parse(bot_config(), signed_raw(json.dumps({"op": 13, "d": d}).encode()))


def test_malformed_and_ignored_payloads() -> None:
    for body in (b"not json", b"[1]", b'{"op":0,"t":"C2C_MESSAGE_CREATE","d":[]}'):
        with pytest.raises(WebhookRejected) as exc:
            take(signed_raw(body))
        assert exc.value.status == 400
    missing_id = c2c("x")
    del missing_id["d"]["id"]
    with pytest.raises(WebhookRejected):
        take(signed(missing_id))
    no_author = c2c("x")
    no_author["d"]["author"] = {}
    with pytest.raises(WebhookRejected):
        take(signed(no_author))
    assert take(signed({"op": 0, "id": "e", "t": "GROUP_ADD_ROBOT", "d": {}})).ignored == "not_message"
    assert take(signed({"op": 11})).ignored == "not_message"
    bot_author = guild_at("x")
    bot_author["d"]["author"]["bot"] = True
    assert take(signed(bot_author)).ignored == "bot_sender"
    assert take(signed(c2c(""))).ignored == "unsupported_message"


def signed_raw(body: bytes) -> WebhookRequest:
    stamp = str(int(time.time()))
    signature = qq_key().sign(stamp.encode() + body).hex()
    return WebhookRequest(headers={"x-signature-ed25519": signature, "x-signature-timestamp": stamp}, body=body)


# -- outbound: a stand-in of the OpenAPI ------------------------------------------------------------


class QQStandIn:
    """Token issuance, the four message APIs and the two upload APIs, refusing what QQ refuses."""

    PASSIVE_WINDOW = {"groups": 300.0, "users": 3600.0, "channels": 300.0, "dms": 300.0}

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.tokens_issued = 0
        self.known: dict[str, float] = {}  # user message id → when it was received
        self.replies: dict[str, set[int]] = defaultdict(set)  # msg_id → msg_seqs taken
        self.file_infos: set[str] = set()
        self.sent: list[Seen] = []
        self._ids = itertools.count(1)
        api.on("/app/getAppAccessToken", self.token)
        for prefix in ("/v2/groups/", "/v2/users/", "/channels/", "/dms/"):
            api.prefixes[prefix] = self.route

    def received(self, message_id: str, at: float | None = None) -> None:
        """A user message QQ delivered (so a passive reply to it is possible)."""
        self.known[message_id] = time.time() if at is None else at

    def token(self, seen: Seen) -> tuple[int, Any]:
        assert seen.method == "POST" and seen.json == {"appId": APP_ID, "clientSecret": APP_SECRET}
        self.tokens_issued += 1
        return 200, {"access_token": f"qq-token-{self.tokens_issued}", "expires_in": "7200"}

    def route(self, seen: Seen) -> tuple[int, Any]:
        if seen.headers.get("authorization") != f"QQBot qq-token-{self.tokens_issued}":
            return 401, {"code": 11244, "message": "token not exist or expire"}
        assert seen.headers.get("x-union-appid") == APP_ID
        parts = seen.path.strip("/").split("/")
        if parts[-1] == "files":
            return self.upload(seen)
        assert parts[-1] == "messages" and seen.method == "POST", seen.path
        scene = parts[1] if parts[0] == "v2" else parts[0]
        return self.message(seen, scene)

    def upload(self, seen: Seen) -> tuple[int, Any]:
        body = seen.json
        assert set(body) in ({"file_type", "srv_send_msg", "url"}, {"file_type", "srv_send_msg", "file_data"})
        assert body["file_type"] in (1, 2) and body["srv_send_msg"] is False
        if "file_data" in body:
            assert base64.b64decode(body["file_data"]) == PNG
        else:
            assert body["url"].startswith("https://")
        info = f"file-info-{next(self._ids)}"
        self.file_infos.add(info)
        return 200, {"file_uuid": info, "file_info": info, "ttl": 3600}

    def message(self, seen: Seen, scene: str) -> tuple[int, Any]:
        v2 = scene in ("groups", "users")
        body: dict[str, Any] = seen.json if seen.json is not None else dict(seen.form)
        if v2:
            assert set(body) <= {"content", "msg_type", "media", "msg_id", "msg_seq", "event_id"}, body
            assert body["msg_type"] in (0, 7)
            assert isinstance(body["content"], str) and body["content"]
            if body["msg_type"] == 7:
                assert body["media"]["file_info"] in self.file_infos
            else:
                assert "media" not in body and body["content"].strip()
        else:
            assert set(body) <= {"content", "msg_id", "image", "message_reference"}, body
            assert body.get("content") or body.get("image") or seen.files.get("file_image")
            if seen.files:
                assert seen.files["file_image"][1] == PNG
        # No length check: QQ documents no limit on `content` (send.md lists it as a string, nothing
        # more), and checking the implementation's own cap here would test it against itself. Its
        # split is checked in test_long_text_is_split_within_the_reply_count, against a number
        # written there.
        msg_id = body.get("msg_id")
        if msg_id is not None:
            if msg_id not in self.known:
                return 400, {"code": 304026, "message": "回复的消息 id 错误"}
            if time.time() - self.known[msg_id] > self.PASSIVE_WINDOW[scene]:
                return 400, {"code": 304027, "message": "回复的消息过期"}
            if v2:
                seq = body["msg_seq"]
                assert isinstance(seq, int) and 1 <= seq < 2**31
                if seq in self.replies[msg_id]:
                    return 400, {"code": 40054005, "message": "消息被去重，请检查请求msgseq"}  # noqa: RUF001
                assert len(self.replies[msg_id]) < 5, "QQ allows 5 passive replies to one message"
                self.replies[msg_id].add(seq)
        else:
            assert "msg_seq" not in body
        self.sent.append(seen)
        return 200, {"id": f"sent-{next(self._ids)}", "timestamp": int(time.time())}


def outbound(
    chat_id: str, segments: list[dict[str, Any]], *, msg_id: str | None = "m1", **extra: Any
) -> OutboundMessage:
    route = {"msg_id": msg_id, "at_ms": str(int(time.time() * 1000))} if msg_id else {}
    return OutboundMessage(
        outbound_id=extra.pop("outbound_id", "out-q"),
        kind="reply",
        platform="qqbot",
        bot_id="qb1",
        chat_id=chat_id,
        chat_type="private" if chat_id.startswith(("c2c:", "dm:")) else "group",
        conversation_key=f"qqbot:qb1:{chat_id}",
        segments=segment_list_adapter.validate_python(segments),
        route=extra.pop("route", route),
        **extra,
    )


async def send_all(
    bot: BotConfig, message: OutboundMessage, http: httpx.AsyncClient, loader: MediaLoader = load_media
) -> list[Any]:
    qq = QQBotPlatform()
    return [await qq.send(bot, call, http, loader) for call in qq.render(bot, message)]


async def test_group_text_image_and_fallbacks(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)
    stand_in.received("m1")
    bot = bot_config(api)
    message = outbound(
        f"group:{GROUP}",
        [
            {"type": "text", "data": {"text": "hello "}},
            {"type": "mention", "data": {"target": MEMBER}},
            {"type": "markdown", "data": {"content": "**bold** [link](https://example.com)"}},
            {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
            {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/a.png"}}},
            {"type": "file", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
            {"type": "dice", "data": {}},
        ],
    )
    outcomes = await send_all(bot, message, http)
    assert [o.status for o in outcomes] == ["delivered"] * 4, outcomes
    assert stand_in.tokens_issued == 1  # cached across sends
    bodies = [s.json for s in stand_in.sent]
    assert bodies[0]["msg_type"] == 0 and bodies[0]["content"] == "hello bold link (https://example.com)"
    assert [b["msg_type"] for b in bodies[1:3]] == [7, 7] and bodies[1]["content"] == " "
    assert bodies[3]["content"].startswith("[附件不可用]🎲 ")  # the file (QQ takes none yet), the dice
    assert all(b["msg_id"] == "m1" for b in bodies)
    # QQ's rule (send.md): msg_seq is an int that, with msg_id, tells replies apart; the same msg_id
    # + msg_seq twice is refused. So four replies to m1 need four different ones (the stand-in
    # refuses a repeat). That a replay reuses them is test_a_replayed_send_posts_once.
    seqs = [b["msg_seq"] for b in bodies]
    assert all(isinstance(seq, int) for seq in seqs) and len(set(seqs)) == 4, seqs
    uploads = [s.json for s in api.seen if s.path.endswith("/files")]
    assert "file_data" in uploads[0] and uploads[1]["url"] == "https://example.com/a.png"
    assert rejected_count("qqbot", "unsupported_by_platform") >= 1


async def test_a_replayed_send_posts_once(api: FakeApi, http: httpx.AsyncClient) -> None:
    """The same outbound message rendered and sent again (a crash before egress marked it): QQ
    refuses the repeated msg_id + msg_seq and the send counts as delivered; one message is shown."""
    stand_in = QQStandIn(api)
    stand_in.received("m1")
    bot = bot_config(api)
    message = outbound(f"c2c:{USER}", [{"type": "text", "data": {"text": "only once"}}])
    first = await send_all(bot, message, http)
    again = await send_all(bot, message, http)
    assert [o.status for o in first + again] == ["delivered", "delivered"]
    assert len(stand_in.sent) == 1
    replayed = [s for s in api.seen if s.path.endswith("/messages")][-1]
    assert replayed.json == stand_in.sent[0].json  # the same msg_seq, refused by QQ as a repeat
    # Another outbound message replying to the same user message gets other msg_seqs.
    other = outbound(f"c2c:{USER}", [{"type": "text", "data": {"text": "second"}}], outbound_id="out-r")
    assert [o.status for o in await send_all(bot, other, http)] == ["delivered"]
    assert len(stand_in.sent) == 2


async def test_long_text_is_split_within_the_reply_count(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)
    stand_in.received("m1")
    bot = bot_config(api, language="en")
    words = " ".join(f"w{i:05d}" for i in range(2_000))  # ~14,000 chars: 7 pieces
    message = outbound(f"group:{GROUP}", [{"type": "text", "data": {"text": words}}])
    outcomes = await send_all(bot, message, http)
    assert [o.status for o in outcomes] == ["delivered"] * 5
    contents = [s.json["content"] for s in stand_in.sent]
    # Switchboard's own cap, not QQ's (QQ documents none): 2,000 characters, written here so that a
    # change to it is a deliberate one.
    assert all(len(c) <= 2000 for c in contents)
    assert max(len(c) for c in contents[:4]) > 1500  # the pieces are full ones, not needlessly small
    assert contents[-1] == "[QQ allows 5 replies to one message: the rest of this reply could not be sent]"
    assert " ".join(contents[:4]).split() == words.split()[: len(" ".join(contents[:4]).split())]

    # With active messages allowed, the rest goes as active messages (no msg_id).
    stand_in.received("m2")
    active = bot_config(api, active_messages=True)
    message = outbound(f"group:{GROUP}", [{"type": "text", "data": {"text": words}}], msg_id="m2", outbound_id="o2")
    before = len(stand_in.sent)
    assert {o.status for o in await send_all(active, message, http)} == {"delivered"}
    sent = stand_in.sent[before:]
    assert [("msg_id" in s.json) for s in sent] == [True] * 5 + [False] * (len(sent) - 5)
    assert " ".join(s.json["content"] for s in sent).split() == words.split()


async def test_the_passive_window(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)
    stand_in.received("old", at=time.time() - 400)
    bot = bot_config(api)
    route = {"msg_id": "old", "at_ms": str(int((time.time() - 400) * 1000))}
    message = outbound(f"group:{GROUP}", [{"type": "text", "data": {"text": "late"}}], route=route)
    [outcome] = await send_all(bot, message, http)
    assert outcome.status == "permanent" and outcome.reason == "passive_window_expired"
    assert "5 min" in outcome.detail and not stand_in.sent  # not even tried: QQ would refuse it
    # One-to-one chats allow 60 minutes.
    stand_in.received("old")
    c2c_message = outbound(f"c2c:{USER}", [{"type": "text", "data": {"text": "late"}}], route=route)
    assert [o.status for o in await send_all(bot, c2c_message, http)] == ["delivered"]
    # Allowed to, the late group reply goes as an active message.
    [late] = await send_all(bot_config(api, active_messages=True), message, http)
    assert late.status == "delivered" and "msg_id" not in stand_in.sent[-1].json
    # QQ's own verdict (its clock, not ours) is honoured too.
    stand_in.received("m1", at=time.time() - 1000)
    [refused] = await send_all(bot, outbound(f"group:{GROUP}", [{"type": "text", "data": {"text": "x"}}]), http)
    assert refused.status == "permanent" and refused.reason == "passive_window_expired" and "304027" in refused.detail


def test_reply_deadline_is_the_window_egress_keeps() -> None:
    """The deadline QQ declares for a turn (its notice is due a little before it) is the moment egress
    stops sending passive replies: the scene's window after the message, less the margin."""
    qq, bot = QQBotPlatform(), bot_config()
    assert qq.profile.reply_window
    at = 1_700_000_000_000
    route = {"msg_id": "m1", "at_ms": str(at)}
    assert qq.reply_deadline_ms(bot, f"group:{GROUP}", route) == at + 290_000
    assert qq.reply_deadline_ms(bot, f"c2c:{USER}", route) == at + 3_590_000
    assert qq.reply_deadline_ms(bot, f"channel:{CHANNEL}", route) == at + 290_000
    assert qq.reply_deadline_ms(bot, f"dm:{DM_GUILD}", route) == at + 290_000
    # Render puts the same moment on every passive call.
    [call] = qq.render(bot, outbound(f"group:{GROUP}", [{"type": "text", "data": {"text": "x"}}], route=route))
    assert call.meta["passive_until_ms"] == at + 290_000
    # Nothing to answer, no time of the message, or not a QQ chat id: no deadline.
    assert qq.reply_deadline_ms(bot, f"group:{GROUP}", {"at_ms": str(at)}) is None
    assert qq.reply_deadline_ms(bot, f"group:{GROUP}", {"msg_id": "m1"}) is None
    assert qq.reply_deadline_ms(bot, "private_1", route) is None


async def test_channel_and_dm(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)
    stand_in.received("m1")
    bot = bot_config(api)
    message = outbound(
        f"channel:{CHANNEL}",
        [
            {"type": "mention", "data": {"target": ALICE_GUILD_ID}},
            {"type": "text", "data": {"text": " hi"}},
            {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
            {"type": "video", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
        ],
    )
    assert [o.status for o in await send_all(bot, message, http)] == ["delivered"] * 3
    text, image, video = stand_in.sent
    assert text.path == f"/channels/{CHANNEL}/messages"
    assert text.json == {"content": f"<@{ALICE_GUILD_ID}> hi", "msg_id": "m1"}
    assert image.form == {"msg_id": "m1"} and image.files["file_image"][1] == PNG
    assert "[附件不可用]" in video.json["content"]  # channels take no video
    dm = outbound(
        f"dm:{DM_GUILD}",
        [
            {"type": "text", "data": {"text": "psst"}},
            {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/a.png"}}},
        ],
    )
    assert [o.status for o in await send_all(bot, dm, http)] == ["delivered"] * 2
    assert [s.path for s in stand_in.sent[-2:]] == [f"/dms/{DM_GUILD}/messages"] * 2
    # A URL goes to QQ, whose servers fetch it: nothing is fetched or uploaded here.
    assert stand_in.sent[-1].json == {"image": "https://example.com/a.png", "msg_id": "m1"}


async def test_unreadable_media_becomes_the_notice(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)
    stand_in.received("m1")
    bot = bot_config(api, language="en")
    message = outbound(f"c2c:{USER}", [{"type": "image", "data": {"media": {"kind": "path", "value": "/nope"}}}])
    before = rejected_count("qqbot", "unreadable")
    assert [o.status for o in await send_all(bot, message, http, broken_loader)] == ["delivered"]
    assert stand_in.sent[0].json["content"] == "[attachment unavailable]" and stand_in.sent[0].json["msg_type"] == 0
    assert rejected_count("qqbot", "unreadable") == before + 1


@pytest.mark.parametrize(
    ("status", "body", "headers", "verdict", "reason"),
    [
        (429, {"code": 22009, "message": "msg limit exceed"}, {"Retry-After": "3"}, "retry", "rate_limited"),
        (200, {"code": 20028, "message": "子频道消息触发限频"}, {}, "retry", "rate_limited"),
        (500, {"code": 1100300, "message": "系统内部错误"}, {}, "retry", "server_error"),
        (400, {"code": 304082, "message": "upload media info fail"}, {}, "retry", "server_error"),
        (403, {"code": 11253, "message": "check app privilege not pass"}, {}, "permanent", "missing_permission"),
        (400, {"code": 304003, "message": "url not allowed"}, {}, "permanent", "url_not_allowed"),
        (400, {"code": 1100101, "message": "内容涉及敏感"}, {}, "permanent", "content_refused"),
        (400, {"code": 12345, "message": "something new"}, {}, "permanent", "api_error"),
        (400, {"code": 304049, "message": "私信主动消息数限频"}, {}, "permanent", "active_quota"),
        (502, "<html>bad gateway</html>", {}, "retry", "server_error"),
    ],
)
async def test_error_classification(
    api: FakeApi, http: httpx.AsyncClient, status: int, body: Any, headers: dict[str, str], verdict: str, reason: str
) -> None:
    stand_in = QQStandIn(api)
    api.reply(f"/v2/users/{USER}/messages", status, body, headers)
    bot = bot_config(api, active_messages=True)
    message = outbound(f"c2c:{USER}", [{"type": "text", "data": {"text": "x"}}], msg_id=None)
    [outcome] = await send_all(bot, message, http)
    assert (outcome.status, outcome.reason) == (verdict, reason), outcome
    if isinstance(body, dict):
        assert str(body["code"]) in outcome.detail and body["message"] in outcome.detail  # for the dead letter
    if headers:
        assert outcome.retry_after == 3.0
    assert stand_in.tokens_issued == 1


async def test_an_expired_token_is_dropped_and_fetched_again(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)
    qq = QQBotPlatform()
    bot = bot_config(api, active_messages=True)
    call = qq.render(bot, outbound(f"c2c:{USER}", [{"type": "text", "data": {"text": "x"}}], msg_id=None))[0]
    assert (await qq.send(bot, call, http, load_media)).status == "delivered"
    stand_in.tokens_issued += 1  # QQ rotated it: the cached one is refused with 401 / 11244
    outcome = await qq.send(bot, call, http, load_media)
    assert (outcome.status, outcome.reason, outcome.retry_after) == ("retry", "token_expired", 0.0)
    assert (await qq.send(bot, call, http, load_media)).status == "delivered"


async def test_a_bad_app_secret_is_permanent(api: FakeApi, http: httpx.AsyncClient) -> None:
    api.reply("/app/getAppAccessToken", 200, {"code": 100016, "message": "invalid appid or secret"})
    bot = bot_config(api, active_messages=True)
    message = outbound(f"c2c:{USER}", [{"type": "text", "data": {"text": "x"}}], msg_id=None)
    [outcome] = await send_all(bot, message, http)
    assert outcome.status == "permanent" and outcome.reason == "unauthorized" and "100016" in outcome.detail
    assert APP_SECRET not in outcome.detail


def test_a_chat_id_without_a_scene_is_refused() -> None:
    with pytest.raises(ValueError, match="not a qqbot chat id"):
        QQBotPlatform().render(bot_config(), outbound("12345", [{"type": "text", "data": {"text": "x"}}]))


async def test_the_token_is_fetched_again_before_it_expires(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)

    def short_lived(seen: Seen) -> tuple[int, Any]:
        status, body = stand_in.token(seen)
        return status, {**body, "expires_in": "31"}  # QQ's last minute: 30 s kept in reserve

    api.on("/app/getAppAccessToken", short_lived)
    qq = QQBotPlatform()
    bot = bot_config(api, active_messages=True)
    call = qq.render(bot, outbound(f"c2c:{USER}", [{"type": "text", "data": {"text": "x"}}], msg_id=None))[0]
    assert (await qq.send(bot, call, http, load_media)).status == "delivered"
    assert (await qq.send(bot, call, http, load_media)).status == "delivered"
    assert stand_in.tokens_issued == 1  # still fresh
    await asyncio.sleep(1.1)
    assert (await qq.send(bot, call, http, load_media)).status == "delivered"
    assert stand_in.tokens_issued == 2  # taken anew before QQ would have refused the old one


def test_settings_require_app_id_and_app_secret() -> None:
    with pytest.raises(ConfigurationError) as exc:
        check_bots(Settings(bots=[{"platform": "qqbot", "bot_id": "qb1", "credentials": {"app_id": APP_ID}}]))
    assert "credentials.app_secret" in str(exc.value) and "required for qqbot" in str(exc.value)
    complete = {"platform": "qqbot", "bot_id": "qb1", "credentials": {"app_id": APP_ID, "app_secret": "s"}}
    check_bots(Settings(bots=[complete]))


async def test_no_active_message_unless_the_bot_allows_them(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)
    message = outbound(f"group:{GROUP}", [{"type": "text", "data": {"text": "unprompted"}}], msg_id=None)
    [outcome] = await send_all(bot_config(api), message, http)
    assert (outcome.status, outcome.reason) == ("permanent", "active_messages_off")
    assert not [s for s in api.seen if s.path.endswith("/messages")]  # not even tried
    [outcome] = await send_all(bot_config(api, active_messages=True), message, http)
    assert outcome.status == "delivered" and "msg_id" not in stand_in.sent[0].json


def test_guild_escapes_are_read_and_written_as_qq_documents() -> None:
    [message] = take(signed(guild_at("a &lt;b&gt; &amp;amp; <#123>"))).messages
    assert message.text.endswith("a <b> &amp; #123")
    agent = outbound(
        f"channel:{CHANNEL}",
        [
            {"type": "text", "data": {"text": "x <@!999> @everyone & <emoji:1> "}},
            {"type": "mention", "data": {"target": "123> <@456"}},  # not of QQ's shape: left out
            {"type": "mention", "data": {"target": ALICE_GUILD_ID}},
        ],
    )
    [call] = QQBotPlatform().render(bot_config(), agent)
    assert call.json is not None
    assert call.json["content"] == f"x &lt;@!999&gt; @\u200beveryone &amp; &lt;emoji:1&gt; <@{ALICE_GUILD_ID}>"
    # Groups and one-to-one chats take the text as it is.
    [call] = QQBotPlatform().render(
        bot_config(), outbound(f"group:{GROUP}", [{"type": "text", "data": {"text": "a<b"}}])
    )
    assert call.json is not None and call.json["content"] == "a<b"


async def test_an_upload_qq_refuses_costs_the_attachment_not_the_reply(api: FakeApi, http: httpx.AsyncClient) -> None:
    stand_in = QQStandIn(api)
    stand_in.received("m1")
    api.reply(f"/v2/groups/{GROUP}/files", 400, {"code": 304020, "message": "file size exceed"})
    bot = bot_config(api, language="en")
    message = outbound(
        f"group:{GROUP}",
        [
            {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
            {"type": "text", "data": {"text": "caption stays"}},
        ],
    )
    before = rejected_count("qqbot", "refused_by_platform")
    assert [o.status for o in await send_all(bot, message, http)] == ["delivered", "delivered"]
    assert [s.json["content"] for s in stand_in.sent] == ["[attachment unavailable]", "caption stays"]
    assert stand_in.sent[0].json["msg_type"] == 0 and "media" not in stand_in.sent[0].json
    assert rejected_count("qqbot", "refused_by_platform") == before + 1
    # A rate-limited upload is retried instead.
    api.reply(f"/v2/groups/{GROUP}/files", 429, {"code": 22009, "message": "msg limit exceed"})
    qq = QQBotPlatform()
    [first, _] = qq.render(bot, message)
    assert (await qq.send(bot, first, http, load_media)).reason == "rate_limited"
