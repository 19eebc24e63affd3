"""Each platform end to end: a signed webhook in, the reply out to the platform's API stand-in.

One stack for the module (a fresh broker, the session's Redis under a unique prefix, the simulator,
one worker) with one bot per platform whose `api_base` points at the stand-ins of `tests/platforms`
(served from a background thread, see `platform_standins.py`). Inbound requests are built and signed
with the fixture builders of `tests/platforms` (python-telegram-bot objects, slack_sdk signatures,
lark-oapi's event model encrypted as Lark does, the OneBot v11 spec's events, DingTalk robot
messages read back by the dingtalk-stream SDK). DingTalk has a second bot on transport `stream`,
dialled by the worker to the stand-in Stream gateway. The simulator's agent echoes, so a message `T`
is answered with `echo: T`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import itertools
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from telegram import Chat, Message, MessageEntity, Update, User

from pipeline.bench.measure import TLS
from pipeline.embedded import RedisServer
from pipeline.kafka import ConsumeTimeoutError, consume_until
from pipeline.platforms import WebhookRequest
from pipeline.segments.notices import DEFAULT_NOTICES, NoticeKind
from pipeline.stack import Stack
from pipeline.topics import DEADLETTER, IM_INBOUND
from tests.conftest import enabled_brokers
from tests.platforms import test_dingtalk as dingtalk_fx
from tests.platforms import test_lark as lark_fx
from tests.platforms import test_onebot as onebot_fx
from tests.platforms import test_qqbot as qq_fx
from tests.platforms import test_slack as slack_fx
from tests.platforms import test_telegram as telegram_fx
from tests.platforms import test_wecom as wecom_fx
from tests.platforms.conftest import PNG, PNG_B64, Answer

from .platform_standins import Call, StandIns
from .stacks import running_stack, stack_idle

pytestmark = [pytest.mark.integration]

BOTS = {"onebot": "qq1", "telegram": "tg1", "lark": "lk1", "slack": "sl1"}
# Platforms in the stack whose tests are their own (not in the loops over BOTS above).
OWN_TESTS = {"dingtalk": "dt1"}
DINGTALK_STREAM_BOT = "dt2"  # the same app on transport "stream"
WECOM_BOT = "wc1"  # its webhook is signed in the query, so it has tests of its own below
QQ_BOT = "qb1"  # QQ bot (official API): its own envelope and Ed25519 signature, tests of its own below
QQ_ACTIVE_BOT = "qb2"  # the same QQ app with active_messages = true
QQ_NOTICE_LEAD = 5  # both QQ bots' reply_window_notice_seconds (30 by default), for a short test


def _bots_toml(standins: StandIns) -> str:
    def creds(values: dict[str, str]) -> str:
        return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in values.items()) + " }"

    bots = [
        (
            "onebot",
            onebot_fx.bot_config().self_id,
            None,
            {"secret": onebot_fx.SECRET, "access_token": onebot_fx.TOKEN},
        ),
        (
            "telegram",
            telegram_fx.bot_config().self_id,
            telegram_fx.bot_config().username,
            {"token": telegram_fx.TOKEN, "webhook_secret": "s3cret-token"},
        ),
        (
            "lark",
            lark_fx.BOT_OPEN_ID,
            None,
            {
                "app_id": lark_fx.APP_ID,
                "app_secret": lark_fx.APP_SECRET,
                "verification_token": lark_fx.VERIFY_TOKEN,
                "encrypt_key": lark_fx.ENCRYPT_KEY,
            },
        ),
        (
            "slack",
            slack_fx.BOT_USER,
            None,
            {"signing_secret": slack_fx.SIGNING_SECRET, "bot_token": slack_fx.BOT_TOKEN},
        ),
        (
            "dingtalk",
            dingtalk_fx.BOT_DINGTALK_ID,
            None,
            {"client_id": dingtalk_fx.CLIENT_ID, "client_secret": dingtalk_fx.CLIENT_SECRET},
        ),
    ]
    out = []
    for platform, self_id, username, credentials in bots:
        out.append("[[bots]]")
        out.append(f'platform = "{platform}"')
        out.append(f'bot_id = "{({**BOTS, **OWN_TESTS})[platform]}"')
        out.append(f'self_id = "{self_id}"')
        if username:
            out.append(f'username = "{username}"')
        out.append(f'api_base = "{standins.url(platform)}"')
        out.append('language = "en"')
        out.append(f"credentials = {creds(credentials)}")
        out.append("")
    out += [
        "[[bots]]",
        'platform = "dingtalk"',
        f'bot_id = "{DINGTALK_STREAM_BOT}"',
        'transport = "stream"',
        f'api_base = "{standins.dingtalk_stream.url}"',
        'language = "en"',
        f"credentials = {creds({'client_id': dingtalk_fx.CLIENT_ID, 'client_secret': dingtalk_fx.CLIENT_SECRET})}",
        "",
    ]
    wecom = wecom_fx.bot_config()
    out.append("[[bots]]")
    out.append(f'platform = "wecom"\nbot_id = "{WECOM_BOT}"\nusername = "{wecom.username}"')
    out.append(f'api_base = "{standins.url("wecom")}"\nlanguage = "en"')
    out.append(f"credentials = {creds({k: v.get_secret_value() for k, v in wecom.credentials.items()})}")
    out.append("")
    out.append("[[bots]]")
    out.append(f'platform = "qqbot"\nbot_id = "{QQ_BOT}"\nself_id = "{qq_fx.BOT_USER}"')
    out.append(f'api_base = "{standins.url("qqbot")}"\nlanguage = "en"')
    out.append(f"credentials = {creds({'app_id': qq_fx.APP_ID, 'app_secret': qq_fx.APP_SECRET})}")
    out.append(f"reply_window_notice_seconds = {QQ_NOTICE_LEAD}")
    out.append("")
    out.append("[[bots]]")
    out.append(f'platform = "qqbot"\nbot_id = "{QQ_ACTIVE_BOT}"\nself_id = "{qq_fx.BOT_USER}"')
    out.append(f'api_base = "{standins.url("qqbot")}"\nlanguage = "en"\nactive_messages = true')
    out.append(f"credentials = {creds({'app_id': qq_fx.APP_ID, 'app_secret': qq_fx.APP_SECRET})}")
    out.append(f"reply_window_notice_seconds = {QQ_NOTICE_LEAD}")
    return "\n".join(out)


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    """The broker of this run of the module (the stand-ins and the stack are made anew for each)."""
    return str(request.param)


@pytest.fixture(scope="module")
def standins(broker_kind: str) -> Iterator[StandIns]:
    """Started before the stack: the bots' `api_base` points at them."""
    servers = StandIns().start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, standins: StandIns) -> Iterator[Stack]:
    with running_stack(broker_kind, name="e2e", bots_toml=_bots_toml(standins), redis_url=redis_server.url) as stack:
        standins.idle = lambda: stack_idle(stack)
        yield stack


@pytest.fixture(autouse=True)
def _standins_saw_only_valid_requests(standins: StandIns) -> Iterator[None]:
    yield
    assert standins.errors == [], "requests the real platform would refuse"


# -- helpers ------------------------------------------------------------------------------------------

_numbers = itertools.count(1)


def _n() -> int:
    return next(_numbers)


async def post(stack: Stack, platform: str, request: WebhookRequest) -> httpx.Response:
    url = f"{stack.workers[0].url}/webhooks/{platform}/{({**BOTS, **OWN_TESTS})[platform]}"
    async with httpx.AsyncClient(timeout=30, verify=TLS) as client:
        return await client.post(url, content=request.body, headers=dict(request.headers))


def reply_text(call: Call) -> str:
    """The text a message call shows, in each platform's wire format."""
    body = call.body
    if call.platform == "telegram":
        return str(body.get("text") or body.get("caption") or "")
    if call.platform == "onebot":
        return "".join(s["data"]["text"] for s in body["message"] if s["type"] == "text")
    if call.platform == "slack":
        return str(body.get("text", ""))
    if call.platform == "dingtalk":
        param = json.loads(body["msgParam"])
        return str(param.get("content") or param.get("text") or "")
    content = json.loads(body["content"])
    if body["msg_type"] == "text":
        return str(content["text"])
    if body["msg_type"] == "post":
        [(_locale, post_body)] = content.items()
        return "".join(el.get("text", "") for para in post_body["content"] for el in para)
    return ""


async def egress_dead_letters(stack: Stack, chat: str, *, timeout: float = 45) -> list[dict[str, Any]]:
    """Read `im.deadletter` until egress's dead letter of a message to `chat` is there: those found."""
    letters: list[dict[str, Any]] = []

    def dead(record: Any) -> bool:
        letter = json.loads(record.value)
        if letter["stage"] == "egress" and json.loads(letter["record"])["chat_id"] == chat:
            letters.append(letter)
        return bool(letters)

    await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], DEADLETTER, dead, timeout=timeout)
    return letters


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


# Telegram: python-telegram-bot objects, the secret token header of setWebhook.
TG_ALICE = User(id=1001, first_name="Alice", last_name="Liddell", is_bot=False, username="alice")


def tg_private(n: int, text: str, *, secret: str = "s3cret-token") -> tuple[WebhookRequest, str, int]:
    user = User(id=100_000 + n, first_name="Alice", is_bot=False, username=f"alice{n}")
    chat = Chat(id=user.id, type=Chat.PRIVATE, first_name="Alice")
    message = Message(10 + n, _now(), chat, from_user=user, text=text)
    return telegram_fx.request(Update(900_000 + n, message=message), secret=secret), str(chat.id), message.message_id


def tg_group_mention(n: int, text: str) -> tuple[WebhookRequest, str, int]:
    chat = Chat(id=-1_000_000_000_000 - n, type=Chat.SUPERGROUP, title="Wonderland")
    full = f"@switch_bot {text}"
    entities = (MessageEntity(MessageEntity.MENTION, offset=0, length=len("@switch_bot")),)
    message = Message(20 + n, _now(), chat, from_user=TG_ALICE, text=full, entities=entities)
    return telegram_fx.request(Update(900_000 + n, message=message)), str(chat.id), message.message_id


# OneBot v11: the spec's events, signed with X-Signature (HMAC-SHA1 of the body).
def ob_private(n: int, text: str, *, secret: str = onebot_fx.SECRET) -> tuple[WebhookRequest, str, int]:
    user_id, message_id = 50_000 + n, 3_000 + n
    event = dict(
        onebot_fx.SPEC_PRIVATE,
        time=int(time.time()),
        user_id=user_id,
        message_id=message_id,
        message=[{"type": "text", "data": {"text": text}}],
        raw_message=text,
    )
    return onebot_fx.signed(event, secret=secret), f"private_{user_id}", message_id


def ob_group_at(n: int, text: str) -> tuple[WebhookRequest, str, int]:
    group_id, message_id = 700_000 + n, 4_000 + n
    message = [{"type": "at", "data": {"qq": "10001000"}}, {"type": "text", "data": {"text": f" {text}"}}]
    event = onebot_fx.group_event(message, time=int(time.time()), group_id=group_id, message_id=message_id)
    return onebot_fx.signed(event), f"group_{group_id}", message_id


# Lark: lark-oapi's P2ImMessageReceiveV1, encrypted with the encrypt key and signed as Lark does.
def lark_event(n: int, text: str, *, chat_type: str, mention_bot: bool = False) -> tuple[dict[str, Any], str, str]:
    chat_id, message_id = f"oc_e2e{n:026d}", f"om_e2e{n:026d}"
    content = {"text": f"@_user_1 {text}" if mention_bot else text}
    mentions = [lark_fx.mention("@_user_1", lark_fx.BOT_OPEN_ID, "Switch")] if mention_bot else None
    event = lark_fx.receive_event("text", content, chat_type=chat_type, mentions=mentions, event_id=uuid.uuid4().hex)
    event["event"]["message"].update(chat_id=chat_id, message_id=message_id)
    return event, chat_id, message_id


# Slack: the Events API documentation's examples, signed with slack_sdk's SignatureVerifier.
def slack_dm(n: int, text: str) -> tuple[dict[str, Any], str, str]:
    channel, ts = f"D0E2E{n:05d}", f"{1_700_000_000 + n}.000100"
    event = dict(slack_fx.DM, channel=channel, user=f"U0ALICE{n:04d}", text=text, ts=ts, event_ts=ts)
    return slack_fx.callback(event, event_id=f"Ev0E2E{n:06d}"), channel, ts


def slack_mention(n: int, text: str) -> tuple[dict[str, Any], str, str]:
    channel, ts = f"C0E2E{n:05d}", f"{1_700_000_000 + n}.000200"
    event = dict(slack_fx.APP_MENTION, channel=channel, text=f"<@{slack_fx.BOT_USER}> {text}", ts=ts, event_ts=ts)
    return slack_fx.callback(event, event_id=f"Ev0E2E{n:06d}"), channel, ts


# -- a message in, the reply out ----------------------------------------------------------------------


async def test_telegram_private_and_group_mention(stack: Stack, standins: StandIns) -> None:
    request, chat, message_id = tg_private(_n(), "hello from telegram")
    response = await post(stack, "telegram", request)
    assert response.status_code == 200, response.text
    [call] = await standins.wait_for("telegram", chat, within=45)
    assert call.path == f"/bot{telegram_fx.TOKEN}/sendMessage"  # the token is the Bot API's auth
    assert call.seen.json["chat_id"] == int(chat)
    assert call.seen.json["text"] == "echo: hello from telegram"
    assert call.seen.json["reply_parameters"] == {"message_id": message_id, "allow_sending_without_reply": True}
    assert "parse_mode" not in call.seen.json

    request, group, message_id = tg_group_mention(_n(), "what is up")
    assert (await post(stack, "telegram", request)).status_code == 200
    [call] = await standins.wait_for("telegram", group)
    assert call.path == f"/bot{telegram_fx.TOKEN}/sendMessage"
    assert call.seen.json["chat_id"] == int(group)
    assert call.seen.json["text"].startswith("echo: ") and "what is up" in call.seen.json["text"]
    assert call.seen.json["reply_parameters"]["message_id"] == message_id
    await standins.settle()
    assert len(standins.delivered("telegram", chat)) == 1 and len(standins.delivered("telegram", group)) == 1
    # "typing…" was shown while each turn ran.
    for conversation in (chat, group):
        actions = [
            c for c in standins.calls_for("telegram", conversation, messages_only=False) if "sendChatAction" in c.path
        ]
        assert actions and actions[0].seen.json["action"] == "typing"


async def test_onebot_private_and_group_at(stack: Stack, standins: StandIns) -> None:
    request, chat, message_id = ob_private(_n(), "hello from qq")
    assert (await post(stack, "onebot", request)).status_code == 200
    [call] = await standins.wait_for("onebot", chat)
    assert call.path == "/send_private_msg"
    assert call.seen.headers["authorization"] == f"Bearer {onebot_fx.TOKEN}"
    assert call.seen.json["user_id"] == int(chat.removeprefix("private_"))
    assert call.seen.json["message"][0] == {"type": "reply", "data": {"id": str(message_id)}}
    assert reply_text(call) == "echo: hello from qq"

    request, group, message_id = ob_group_at(_n(), "group question")
    assert (await post(stack, "onebot", request)).status_code == 200
    [call] = await standins.wait_for("onebot", group)
    assert call.path == "/send_group_msg"
    assert call.seen.headers["authorization"] == f"Bearer {onebot_fx.TOKEN}"
    assert call.seen.json["group_id"] == int(group.removeprefix("group_"))
    assert call.seen.json["message"][0] == {"type": "reply", "data": {"id": str(message_id)}}
    assert reply_text(call).startswith("echo: ") and "group question" in reply_text(call)
    await standins.settle()
    assert len(standins.delivered("onebot", chat)) == 1 and len(standins.delivered("onebot", group)) == 1


async def test_lark_encrypted_p2p_and_group_mention(stack: Stack, standins: StandIns) -> None:
    for chat_type, text, mention_bot in (("p2p", "hello from lark", False), ("group", "lark group ask", True)):
        event, chat, message_id = lark_event(_n(), text, chat_type=chat_type, mention_bot=mention_bot)
        standins.expect_lark_reply(message_id, chat)
        request = lark_fx.encrypted_request(event)
        assert json.loads(request.body).keys() == {"encrypt"}  # nothing readable on the wire
        assert lark_fx.sdk_accepts(request)  # the SDK's own dispatcher takes the same request
        assert (await post(stack, "lark", request)).status_code == 200
        [call] = await standins.wait_for("lark", chat)
        # The first message of a reply quotes the message it answers.
        assert call.path == f"/open-apis/im/v1/messages/{message_id}/reply"
        assert call.seen.headers["authorization"] == f"Bearer t-{standins.lark.tokens_issued}"
        assert call.seen.json["msg_type"] == "text" and len(call.seen.json["uuid"]) <= 50
        if mention_bot:
            assert reply_text(call).startswith("echo: ") and text in reply_text(call)
        else:
            assert reply_text(call) == f"echo: {text}"
    token_calls = [c for c in standins.all_calls() if c.path == "/open-apis/auth/v3/tenant_access_token/internal"]
    assert len(token_calls) == 1  # cached by the worker
    await standins.settle()


async def test_slack_dm_and_app_mention(stack: Stack, standins: StandIns) -> None:
    for build, text in ((slack_dm, "hello from slack"), (slack_mention, "slack channel ask")):
        payload, channel, ts = build(_n(), text)
        assert (await post(stack, "slack", slack_fx.signed(payload))).status_code == 200
        [call] = await standins.wait_for("slack", channel)
        assert call.path == "/chat.postMessage"
        assert call.seen.headers["authorization"] == f"Bearer {slack_fx.BOT_TOKEN}"
        assert call.seen.json["channel"] == channel
        assert call.seen.json["thread_ts"] == ts  # Slack has no quote: the reply goes in the thread
        assert reply_text(call).startswith("echo: ") and text in reply_text(call)
    await standins.settle()


# -- authenticity, redelivery, rate limits, permanent errors -------------------------------------------


async def _inbound_texts_until(stack: Stack, sentinels: list[str]) -> list[str]:
    """Every `im.inbound` record's text, read until each sentinel text was seen. A sentinel shares
    its conversation key (so its partition) with the rejected message, and so comes after it."""
    missing = set(sentinels)

    def found(record: Any) -> bool:
        text = json.loads(record.value).get("text", "")
        for sentinel in list(missing):
            if sentinel in text:
                missing.discard(sentinel)
        return not missing

    records = await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], IM_INBOUND, found, timeout=30)
    return [json.loads(r.value).get("text", "") for r in records]


async def test_bad_signature_is_rejected_and_reaches_nothing(stack: Stack, standins: StandIns) -> None:
    n = _n()
    tg_bad, tg_chat, _ = tg_private(n, "forged telegram", secret="wrong-token")
    ob_bad, ob_chat, _ = ob_private(n, "forged onebot", secret="wrong-secret")
    lark_event_bad, lark_chat, lark_message = lark_event(n, "forged lark", chat_type="p2p")
    lark_bad = lark_fx.encrypted_request(lark_event_bad, sign_key="wrong-key")
    assert not lark_fx.sdk_accepts(lark_bad)
    slack_payload, slack_chat, _ = slack_dm(n, "forged slack")
    slack_bad = slack_fx.signed(slack_payload, secret="wrong-signing-secret")
    for platform, request in (("telegram", tg_bad), ("onebot", ob_bad), ("lark", lark_bad), ("slack", slack_bad)):
        response = await post(stack, platform, request)
        assert response.status_code == 401, (platform, response.text)
        assert response.json() == {"error": "bad_signature"}

    # The genuine messages, with the same ids in the same chats (so the same partitions of im.inbound),
    # after them: had a forged one got in, its twin would be dropped as a redelivery.
    tg_ok, _, _ = tg_private(n, "genuine telegram")
    ob_ok, _, _ = ob_private(n, "genuine onebot")
    lark_event_ok, _, _ = lark_event(n, "genuine lark", chat_type="p2p")
    standins.expect_lark_reply(lark_message, lark_chat)
    slack_ok_payload, _, _ = slack_dm(n, "genuine slack")
    for platform, request in (
        ("telegram", tg_ok),
        ("onebot", ob_ok),
        ("lark", lark_fx.encrypted_request(lark_event_ok)),
        ("slack", slack_fx.signed(slack_ok_payload)),
    ):
        assert (await post(stack, platform, request)).status_code == 200

    texts = await _inbound_texts_until(stack, [f"genuine {p}" for p in ("telegram", "onebot", "lark", "slack")])
    assert not [t for t in texts if "forged" in t], texts
    try:  # a 401 is not a malformed payload: no dead letter either (read what the topic holds)
        await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], DEADLETTER, lambda _r: False, timeout=2)
    except ConsumeTimeoutError as exc:
        assert not [r for r in exc.records if b"forged" in r.value]

    for platform, chat in (("telegram", tg_chat), ("onebot", ob_chat), ("lark", lark_chat), ("slack", slack_chat)):
        await standins.wait_for(platform, chat)
    calls = await standins.settle()
    for platform, chat in (("telegram", tg_chat), ("onebot", ob_chat), ("lark", lark_chat), ("slack", slack_chat)):
        [call] = standins.calls_for(platform, chat)
        assert reply_text(call) == f"echo: genuine {platform}", reply_text(call)
    assert not [c for c in calls if b"forged" in c.seen.body or "forged" in json.dumps(c.seen.form)]

    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        metrics = (await client.get(f"{stack.workers[0].url}/metrics")).text
    for platform in BOTS:
        assert f'switchboard_webhooks_total{{outcome="bad_signature",platform="{platform}"}} 1.0' in metrics


async def test_redelivered_webhook_gets_one_reply(stack: Stack, standins: StandIns) -> None:
    n = _n()
    tg, tg_chat, _ = tg_private(n, "only once telegram")
    ob, ob_chat, _ = ob_private(n, "only once onebot")
    lark_evt, lark_chat, lark_message = lark_event(n, "only once lark", chat_type="p2p")
    standins.expect_lark_reply(lark_message, lark_chat)
    slack_payload, slack_chat, _ = slack_dm(n, "only once slack")
    deliveries = [
        ("telegram", tg),
        ("onebot", ob),
        ("lark", lark_fx.encrypted_request(lark_evt)),  # Lark redelivers the same event, encrypted anew
        ("slack", slack_fx.signed(slack_payload)),
    ]
    redeliveries = [
        ("telegram", tg),
        ("onebot", ob),
        ("lark", lark_fx.encrypted_request(lark_evt)),
        ("slack", slack_fx.signed(slack_payload, retry="1")),  # X-Slack-Retry-Num
    ]
    for platform, request in [*deliveries, *redeliveries, *redeliveries]:
        response = await post(stack, platform, request)
        assert response.status_code == 200, (platform, response.text)
    chats = {"telegram": tg_chat, "onebot": ob_chat, "lark": lark_chat, "slack": slack_chat}
    for platform, chat in chats.items():
        await standins.wait_for(platform, chat)
    await standins.settle()
    for platform, chat in chats.items():
        calls = standins.calls_for(platform, chat)
        assert [reply_text(c) for c in calls] == [f"echo: only once {platform}"], platform


RATE_LIMITED = {
    "telegram": (
        429,
        {
            "ok": False,
            "error_code": 429,
            "description": "Too Many Requests: retry after 2",
            "parameters": {"retry_after": 2},
        },
        {},
    ),
    "onebot": (429, "Too Many Requests", {"Retry-After": "2"}),
    "lark": (429, {"code": 99991400, "msg": "request trigger frequency limit"}, {"x-ogw-ratelimit-reset": "2"}),
    "slack": (429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "2"}),
}


async def test_rate_limited_send_waits_and_delivers_once(stack: Stack, standins: StandIns) -> None:
    n = _n()
    tg, tg_chat, _ = tg_private(n, "after the wait telegram")
    ob, ob_chat, _ = ob_private(n, "after the wait onebot")
    lark_evt, lark_chat, lark_message = lark_event(n, "after the wait lark", chat_type="p2p")
    standins.expect_lark_reply(lark_message, lark_chat)
    slack_payload, slack_chat, _ = slack_dm(n, "after the wait slack")
    chats = {"telegram": tg_chat, "onebot": ob_chat, "lark": lark_chat, "slack": slack_chat}
    for platform, chat in chats.items():
        standins.script(platform, chat, RATE_LIMITED[platform])  # once
    for platform, request in (
        ("telegram", tg),
        ("onebot", ob),
        ("lark", lark_fx.encrypted_request(lark_evt)),
        ("slack", slack_fx.signed(slack_payload)),
    ):
        assert (await post(stack, platform, request)).status_code == 200
    for platform, chat in chats.items():
        await standins.wait_for(platform, chat)
    await standins.settle()
    for platform, chat in chats.items():
        limited, delivered = standins.calls_for(platform, chat)
        assert limited.status == 429 and delivered.accepted, platform
        assert delivered.at - limited.at >= 1.9, (platform, delivered.at - limited.at)  # retry_after honoured
        assert limited.seen.body == delivered.seen.body or limited.seen.json == delivered.seen.json
        assert reply_text(delivered) == f"echo: after the wait {platform}"


PERMANENT = {  # platform: (answer, the dead letter's reason)
    "telegram": (
        (403, {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked by the user"}),
        "blocked",
    ),
    "onebot": ((200, {"status": "failed", "retcode": 100, "data": None, "message": "bad params"}), "bad_request"),
    "lark": ((400, {"code": 230002, "msg": "Bot/User can NOT be out of the chat."}), "not_in_chat"),
    "slack": ((200, {"ok": False, "error": "not_in_channel"}), "not_in_channel"),
}


async def test_permanent_error_is_dead_lettered_without_retries(stack: Stack, standins: StandIns) -> None:
    n = _n()
    tg, tg_chat, _ = tg_private(n, "nobody hears telegram")
    ob, ob_chat, _ = ob_private(n, "nobody hears onebot")
    lark_evt, lark_chat, lark_message = lark_event(n, "nobody hears lark", chat_type="p2p")
    standins.expect_lark_reply(lark_message, lark_chat)
    slack_payload, slack_chat, _ = slack_dm(n, "nobody hears slack")
    chats = {"telegram": tg_chat, "onebot": ob_chat, "lark": lark_chat, "slack": slack_chat}
    for platform, chat in chats.items():
        standins.script(platform, chat, PERMANENT[platform][0], sticky=True)  # every time
    for platform, request in (
        ("telegram", tg),
        ("onebot", ob),
        ("lark", lark_fx.encrypted_request(lark_evt)),
        ("slack", slack_fx.signed(slack_payload)),
    ):
        assert (await post(stack, platform, request)).status_code == 200

    letters: dict[str, dict[str, Any]] = {}

    def all_dead(record: Any) -> bool:
        letter = json.loads(record.value)
        if letter["stage"] == "egress":
            original = json.loads(letter["record"])
            if chats.get(original["platform"]) == original["chat_id"]:
                letters[original["platform"]] = letter
        return len(letters) == len(chats)

    try:
        await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], DEADLETTER, all_dead, timeout=45)
    except ConsumeTimeoutError as exc:
        raise AssertionError(f"dead letters: {sorted(letters)}; calls: {standins.all_calls()}") from exc
    await standins.settle()
    for platform, chat in chats.items():
        letter = letters[platform]
        assert letter["reason"] == PERMANENT[platform][1], letter
        assert letter["attempts"] == 1 and letter["topic"] == f"im.outbound.{platform}", letter
        assert json.loads(letter["record"])["segments"][0]["data"]["text"] == f"echo: nobody hears {platform}"
        [call] = standins.calls_for(platform, chat)  # no retry of a permanent error
        assert not call.accepted


async def test_media_reply_is_uploaded(stack: Stack, standins: StandIns) -> None:
    """An agent reply with a base64 image: Telegram uploads it (multipart sendPhoto with the caption),
    OneBot passes `base64://`, Lark uploads it to /im/v1/images first, Slack through the external
    upload flow."""
    reply = json.dumps(
        {
            "segments": [
                {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
                {"type": "text", "data": {"text": "a pixel"}},
            ]
        },
        separators=(",", ":"),
    )
    text = f"picture please [sim:reply={reply}]"
    n = _n()
    tg, tg_chat, _ = tg_private(n, text)
    ob, ob_chat, _ = ob_private(n, text)
    lark_evt, lark_chat, lark_message = lark_event(n, text, chat_type="p2p")
    standins.expect_lark_reply(lark_message, lark_chat)
    slack_payload, slack_chat, _ = slack_dm(n, text)
    for platform, request in (
        ("telegram", tg),
        ("onebot", ob),
        ("lark", lark_fx.encrypted_request(lark_evt)),
        ("slack", slack_fx.signed(slack_payload)),
    ):
        assert (await post(stack, platform, request)).status_code == 200

    [photo] = await standins.wait_for("telegram", tg_chat)
    assert photo.path == f"/bot{telegram_fx.TOKEN}/sendPhoto"
    assert photo.seen.files["photo"][1] == PNG and photo.seen.form["caption"] == "a pixel"
    assert photo.seen.form["chat_id"] == tg_chat

    [qq] = await standins.wait_for("onebot", ob_chat)
    segments = qq.seen.json["message"]
    assert [s["type"] for s in segments] == ["reply", "image", "text"]
    assert base64.b64decode(segments[1]["data"]["file"].removeprefix("base64://")) == PNG

    lark_calls = await standins.wait_for("lark", lark_chat, 2)
    assert [c.seen.json["msg_type"] for c in lark_calls] == ["image", "text"]
    assert json.loads(lark_calls[0].seen.json["content"]) == {"image_key": "img_v2_uploaded"}
    assert lark_calls[0].path == f"/open-apis/im/v1/messages/{lark_message}/reply"  # only the first quotes
    assert lark_calls[1].path == "/open-apis/im/v1/messages" and lark_calls[1].seen.json["receive_id"] == lark_chat
    assert any(c.path == "/open-apis/im/v1/images" and c.accepted for c in standins.all_calls())

    slack_calls = await standins.wait_for("slack", slack_chat, 2)
    completed = [c for c in slack_calls if c.path == "/files.completeUploadExternal"]
    assert len(completed) == 1
    file_id = completed[0].seen.json["files"][0]["id"]
    assert standins.slack_uploads[file_id] == [PNG]
    assert completed[0].seen.json["thread_ts"] == slack_payload["event"]["ts"]
    await standins.settle()


async def test_onebot_never_gets_a_path_a_scheme_or_an_agent_chosen_url(stack: Stack, standins: StandIns) -> None:
    """An agent reply naming local files and internal URLs in every media kind: the OneBot stand-in
    (whose checker accepts only `base64://` bytes or OneBot-shaped file ids in a `file` field) gets the
    notice in their place and the bytes of the one real image; the internal address is never asked."""
    internal = f"{standins.url('telegram')}/internal/x.png"  # loopback: the guard refuses it
    hostile = [
        {"kind": "file", "value": "file:///etc/shadow"},
        {"kind": "file", "value": "/etc/shadow"},
        {"kind": "file", "value": "../../napcat/config/onebot11.json"},
        {"kind": "url", "value": "file:///etc/passwd"},
        {"kind": "url", "value": internal},
        {"kind": "url", "value": "http://169.254.169.254/latest/meta-data/"},
        {"kind": "path", "value": "/etc/passwd"},
    ]
    segments = [{"type": "image", "data": {"media": media}} for media in hostile]
    segments.append({"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}})
    reply = json.dumps({"segments": segments}, separators=(",", ":"))
    request, chat, _ = ob_private(_n(), f"files please [sim:reply={reply}]")
    assert (await post(stack, "onebot", request)).status_code == 200
    [call] = await standins.wait_for("onebot", chat)
    message = call.seen.json["message"]
    body = call.seen.body.decode()
    for media in hostile:
        assert media["value"] not in body
    assert "/etc/" not in body and "169.254" not in body and "internal" not in body
    texts = [s["data"]["text"] for s in message if s["type"] == "text"]
    assert "".join(texts).split() == ["[attachment", "unavailable]"] * len(hostile)
    [image] = [s for s in message if s["type"] == "image"]
    assert base64.b64decode(image["data"]["file"].removeprefix("base64://")) == PNG
    assert not [c for c in standins.all_calls() if c.path.startswith("/internal")]
    await standins.settle()


async def test_another_bots_secret_is_cut_from_a_reply_in_any_form(stack: Stack, standins: StandIns) -> None:
    """The Telegram bot's webhook secret, in an OneBot bot's reply: fullwidth in one segment, split
    across two segments with a zero-width space in the other."""
    secret = "s3cret-token"  # the Telegram bot's `webhook_secret` in this stack
    fullwidth = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in secret)
    segments = [
        {"type": "text", "data": {"text": f"first {fullwidth}."}},
        {"type": "text", "data": {"text": f" then {secret[:5]}"}},
        {"type": "markdown", "data": {"content": f"**{secret[5:7]}\u200b{secret[7:]}** end"}},
    ]
    reply = json.dumps({"segments": segments}, separators=(",", ":"), ensure_ascii=False)
    request, chat, _ = ob_private(_n(), f"tell me [sim:reply={reply}]")
    assert (await post(stack, "onebot", request)).status_code == 200
    [call] = await standins.wait_for("onebot", chat)
    shown = reply_text(call)
    assert shown == "first [redacted]. then [redacted][redacted]** end"  # each piece of the split one cut
    await standins.settle()


# -- DingTalk: robot callbacks in the documented shape (checked by the dingtalk-stream SDK's model),
# signed with the app secret; replies through the robot OpenAPI stand-in.


def dt_private(n: int, text: str) -> tuple[dict[str, Any], str]:
    payload = dingtalk_fx.message(text=text, n=900_000 + n)
    return payload, payload["senderStaffId"]


def dt_group(n: int, text: str) -> tuple[dict[str, Any], str]:
    payload = dingtalk_fx.message(text=f" {text}", group=True, at_bot=True, n=900_000 + n)
    return payload, payload["conversationId"]


async def test_dingtalk_private_and_group_mention(stack: Stack, standins: StandIns) -> None:
    tokens_before = standins.dingtalk.tokens_issued
    for build, text, path in (
        (dt_private, "hello from dingtalk", dingtalk_fx.PRIVATE_PATH),
        (dt_group, "dingtalk group ask", dingtalk_fx.GROUP_PATH),
    ):
        payload, chat = build(_n(), text)
        response = await post(stack, "dingtalk", dingtalk_fx.signed(payload))
        assert response.status_code == 200, response.text
        [call] = await standins.wait_for("dingtalk", chat, within=45)
        assert call.path == path and call.seen.json["robotCode"] == dingtalk_fx.ROBOT_CODE
        assert call.seen.headers["x-acs-dingtalk-access-token"].startswith("dt-token-")
        assert reply_text(call).startswith("echo: ") and reply_text(call).endswith(text)  # groups: speaker named
    assert standins.dingtalk.tokens_issued - tokens_before <= 1  # cached by the worker
    await standins.settle()


async def test_dingtalk_bad_signature_and_redelivery(stack: Stack, standins: StandIns) -> None:
    n = _n()
    forged, chat = dt_private(n, "forged dingtalk")
    for request in (
        dingtalk_fx.signed(forged, secret="not-the-app-secret"),
        dingtalk_fx.signed(forged, ts_ms=int(time.time() * 1000) - 3_600_000),  # an hour old
    ):
        response = await post(stack, "dingtalk", request)
        assert response.status_code == 401, response.text
    malformed = dingtalk_fx.signed({"msgtype": "text", "text": {"content": "no ids"}})
    assert (await post(stack, "dingtalk", malformed)).status_code == 400
    # The genuine message with the same msgId, delivered three times (DingTalk retries a callback).
    genuine = dict(forged, text={"content": "genuine dingtalk"})
    for _ in range(3):
        assert (await post(stack, "dingtalk", dingtalk_fx.signed(genuine))).status_code == 200
    await standins.wait_for("dingtalk", chat)
    await standins.settle()
    assert [reply_text(c) for c in standins.calls_for("dingtalk", chat)] == ["echo: genuine dingtalk"]
    texts = await _inbound_texts_until(stack, ["genuine dingtalk"])
    assert not [t for t in texts if "forged" in t or "no ids" in t]


async def test_dingtalk_rate_limited_once_then_delivered(stack: Stack, standins: StandIns) -> None:
    payload, chat = dt_group(_n(), "after the wait dingtalk")
    throttled = (403, {"code": "Forbidden.AccessDenied.QpsLimitForApi", "message": "api qps limit"})
    standins.script("dingtalk", chat, throttled)
    assert (await post(stack, "dingtalk", dingtalk_fx.signed(payload))).status_code == 200
    await standins.wait_for("dingtalk", chat)
    await standins.settle()
    limited, delivered = standins.calls_for("dingtalk", chat)
    assert limited.status == 403 and delivered.accepted
    assert delivered.at - limited.at >= 1.9  # DingTalk gives no wait: the platform's default one
    assert limited.seen.json == delivered.seen.json
    assert reply_text(delivered).startswith("echo: ") and "after the wait dingtalk" in reply_text(delivered)


async def test_dingtalk_permanent_error_is_one_dead_letter(stack: Stack, standins: StandIns) -> None:
    payload, chat = dt_private(_n(), "nobody hears dingtalk")
    refused = (400, {"code": "staffId.notExisted", "message": "the user does not exist"})
    standins.script("dingtalk", chat, refused, sticky=True)
    assert (await post(stack, "dingtalk", dingtalk_fx.signed(payload))).status_code == 200
    found = await egress_dead_letters(stack, chat)
    await standins.settle()
    [letter] = found
    assert letter["reason"] == "bad_recipient" and letter["attempts"] == 1
    assert "staffId.notExisted" in letter["error"] and "the user does not exist" in letter["error"]
    [call] = standins.calls_for("dingtalk", chat)
    assert not call.accepted


async def test_dingtalk_image_reply_is_uploaded(stack: Stack, standins: StandIns) -> None:
    reply = json.dumps(
        {
            "segments": [
                {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
                {"type": "text", "data": {"text": "a pixel"}},
            ]
        },
        separators=(",", ":"),
    )
    payload, chat = dt_private(_n(), f"picture please [sim:reply={reply}]")
    assert (await post(stack, "dingtalk", dingtalk_fx.signed(payload))).status_code == 200
    image, text = await standins.wait_for("dingtalk", chat, 2)
    assert image.seen.json["msgKey"] == "sampleImageMsg" and text.seen.json["msgKey"] == "sampleText"
    media_id = json.loads(image.seen.json["msgParam"])["photoURL"]
    assert standins.dingtalk.media[media_id] == PNG
    await standins.settle()


async def test_dingtalk_stream_mode_one_reply_per_message(stack: Stack, standins: StandIns) -> None:
    """The stream bot's holder dials the gateway; a robot message over the socket is acknowledged
    after the broker has it and answered once, also when DingTalk sends the frame again."""
    gateway = standins.dingtalk_stream
    deadline = time.monotonic() + 30
    while gateway.live is None:
        assert time.monotonic() < deadline, f"no Stream connection; opens: {len(gateway.opens)}"
        await asyncio.sleep(0.1)
    payload, chat = dt_group(_n(), "over the stream")
    frame = gateway.callback(payload)
    frame_id = standins.run(gateway.push(frame))
    [call] = await standins.wait_for("dingtalk", chat, within=45)
    assert call.path == dingtalk_fx.GROUP_PATH and "over the stream" in reply_text(call)
    ack = standins.run(gateway.wait_ack(frame_id, timeout=10))
    assert ack["code"] == 200
    standins.run(gateway.push(frame))  # a redelivery: same frame, same msgId
    while len(gateway.acks_for(frame_id)) < 2:  # acknowledged again (ingest drops the copy)
        assert time.monotonic() < deadline + 60, "the redelivered frame was not acknowledged"
        await asyncio.sleep(0.1)
    await standins.settle()
    assert len(standins.calls_for("dingtalk", chat)) == 1
    assert len(gateway.acks_for(frame_id)) == 2 and gateway.errors == []


# -- WeCom: the self-built app's XML callback and the AI bot's JSON one, signed in the query ----------


async def wecom_call(stack: Stack, request: WebhookRequest) -> httpx.Response:
    url = f"{stack.workers[0].url}/webhooks/wecom/{WECOM_BOT}"
    async with httpx.AsyncClient(timeout=30, verify=TLS) as client:
        if request.method == "GET":
            return await client.get(url, params=dict(request.query))
        return await client.post(url, params=dict(request.query), content=request.body, headers=dict(request.headers))


def wecom_app_text(n: int, text: str, **crypto: Any) -> tuple[WebhookRequest, str]:
    """A member's message to the app, encrypted and signed with wechatpy; the chat is the member."""
    user = f"member.{n}"
    plain = wecom_fx.app_xml("text", msg_id=str(7_000_000_000_000 + n), user=user, Content=text)
    return wecom_fx.app_request(plain, **crypto), user


def wecom_ai_bot_mention(standins: StandIns, n: int, text: str) -> tuple[WebhookRequest, str]:
    chat = f"wrkE2E{n:020d}"
    payload = wecom_fx.aibot_payload(f"@Switch {text}", msg_id=f"aibot-e2e-{n}")
    # The stand-in answers at the worker's api_base; the response code names the chat.
    payload.update(chatid=chat, response_url=f"{standins.url('wecom')}/cgi-bin/aibot/response?response_code={chat}")
    return wecom_fx.aibot_request(payload), chat


def wecom_text(call: Call) -> str:
    body = call.body
    return str(body[body["msgtype"]]["content"])


async def test_wecom_url_check_app_message_and_ai_bot_group_mention(stack: Stack, standins: StandIns) -> None:
    response = await wecom_call(stack, wecom_fx.url_check("5927384618"))
    assert response.status_code == 200 and response.text == "5927384618"

    request, user = wecom_app_text(_n(), "hello from wecom")
    assert b"hello" not in request.body  # nothing readable on the wire
    response = await wecom_call(stack, request)
    assert response.status_code == 200 and response.text == ""
    [call] = await standins.wait_for("wecom", user, within=45)
    assert call.path == "/cgi-bin/message/send"
    assert call.seen.query["access_token"] == f"tok-{standins.wecom.tokens_issued}"
    assert call.body == {
        "touser": user,
        "agentid": int(wecom_fx.AGENT_ID),
        "msgtype": "text",
        "text": {"content": "echo: hello from wecom"},
    }

    request, chat = wecom_ai_bot_mention(standins, _n(), "group question")
    assert (await wecom_call(stack, request)).status_code == 200
    [call] = await standins.wait_for("wecom", chat)
    assert call.path == "/cgi-bin/aibot/response" and "access_token" not in call.seen.query
    assert call.body["msgtype"] == "markdown"
    assert wecom_text(call).startswith("echo: ") and "group question" in wecom_text(call)
    await standins.settle()
    assert len(standins.delivered("wecom", user)) == 1 and len(standins.delivered("wecom", chat)) == 1
    token_calls = [c for c in standins.all_calls() if c.path == "/cgi-bin/gettoken"]
    assert len(token_calls) == 1  # cached by the worker


async def test_wecom_forged_callback_is_refused_and_redelivery_answered_once(stack: Stack, standins: StandIns) -> None:
    n = _n()
    forged, user = wecom_app_text(n, "forged wecom", token="wrong-token")
    assert (await wecom_call(stack, forged)).status_code == 401
    forged_bot, chat = wecom_ai_bot_mention(standins, n, "forged bot")
    forged_bot = WebhookRequest(
        headers=forged_bot.headers, body=forged_bot.body, query=dict(forged_bot.query, msg_signature="0" * 40)
    )
    assert (await wecom_call(stack, forged_bot)).status_code == 401
    # The genuine message, with the same MsgId, three times (WeCom calls again after 5 s unanswered),
    # each encrypted anew: had the forged one got in, it would have been taken as the first.
    for _ in range(3):
        genuine, _user = wecom_app_text(n, "genuine wecom")
        assert (await wecom_call(stack, genuine)).status_code == 200
    await standins.wait_for("wecom", user)
    await standins.settle()
    assert [wecom_text(c) for c in standins.calls_for("wecom", user)] == ["echo: genuine wecom"]
    assert standins.calls_for("wecom", chat) == []
    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        metrics = (await client.get(f"{stack.workers[0].url}/metrics")).text
    assert 'switchboard_webhooks_total{outcome="bad_signature",platform="wecom"} 2.0' in metrics


async def test_wecom_rate_limited_once_then_delivered_and_permanent_dead_lettered(
    stack: Stack, standins: StandIns
) -> None:
    n = _n()
    limited_request, limited_user = wecom_app_text(n, "after the wait wecom")
    standins.script("wecom", limited_user, (200, {"errcode": 45009, "errmsg": "api freq out of limit"}))
    dead_request, dead_user = wecom_app_text(_n(), "nobody hears wecom")
    errmsg = "user & party & tag all invalid"
    standins.script("wecom", dead_user, (200, {"errcode": 81013, "errmsg": errmsg}), sticky=True)
    for request in (limited_request, dead_request):
        assert (await wecom_call(stack, request)).status_code == 200

    letters = await egress_dead_letters(stack, dead_user)
    await standins.wait_for("wecom", limited_user)
    await standins.settle()
    limited, delivered = standins.calls_for("wecom", limited_user)
    assert not limited.accepted and delivered.accepted
    assert delivered.at - limited.at >= 2.9, delivered.at - limited.at  # WeCom gives no time: 3 s
    assert limited.body == delivered.body and wecom_text(delivered) == "echo: after the wait wecom"
    [letter] = letters
    assert letter["reason"] == "bad_recipient" and errmsg in letter["error"], letter
    assert letter["attempts"] == 1 and letter["topic"] == "im.outbound.wecom"
    [call] = standins.calls_for("wecom", dead_user)  # no retry of a permanent error
    assert not call.accepted


async def test_wecom_media_reply_is_uploaded_first(stack: Stack, standins: StandIns) -> None:
    """An agent reply with a base64 image and text: `media/upload` for a media_id, then an `image`
    message with it, then the text."""
    reply = json.dumps(
        {
            "segments": [
                {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
                {"type": "text", "data": {"text": "a pixel"}},
            ]
        },
        separators=(",", ":"),
    )
    request, user = wecom_app_text(_n(), f"picture please [sim:reply={reply}]")
    assert (await wecom_call(stack, request)).status_code == 200
    image, text = await standins.wait_for("wecom", user, 2)
    assert image.body["msgtype"] == "image" and text.body == {
        "touser": user,
        "agentid": int(wecom_fx.AGENT_ID),
        "msgtype": "text",
        "text": {"content": "a pixel"},
    }
    assert standins.wecom.media[image.body["image"]["media_id"]] == ("image", PNG)
    await standins.settle()


# -- QQ bot (official API): signed with Ed25519 as QQ documents, fixtures read back by qq-botpy --------


async def post_qq(stack: Stack, request: WebhookRequest, bot: str = QQ_BOT) -> httpx.Response:
    url = f"{stack.workers[0].url}/webhooks/qqbot/{bot}"
    async with httpx.AsyncClient(timeout=30, verify=TLS) as client:
        return await client.post(url, content=request.body, headers=dict(request.headers))


def qq_group(n: int, text: str) -> tuple[dict[str, Any], str, str]:
    group, message_id = f"E2EGROUP{n:024d}", f"ROBOT1.0_e2e_group_{n:06d}"
    return qq_fx.group_at(text, message_id=message_id, group=group), f"group:{group}", message_id


def qq_c2c(n: int, text: str) -> tuple[dict[str, Any], str, str]:
    user, message_id = f"E2EUSER{n:025d}", f"ROBOT1.0_e2e_c2c_{n:06d}"
    return qq_fx.c2c(text, message_id=message_id, user=user), f"c2c:{user}", message_id


async def test_qqbot_url_validation_group_and_c2c(stack: Stack, standins: StandIns) -> None:
    # The callback URL check QQ makes when the URL is set (its docs' example), signed like every
    # callback: answered with the signature QQ computes itself.
    validation = b'{"d":{"plain_token":"Arq0D5A61EgUu4OxUvOp","event_ts":"1725442341"},"op":13}'
    response = await post_qq(stack, qq_fx.signed_raw(validation))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["plain_token"] == "Arq0D5A61EgUu4OxUvOp"
    qq_fx.qq_key().public_key().verify(bytes.fromhex(answer["signature"]), b"1725442341Arq0D5A61EgUu4OxUvOp")

    for build, text in ((qq_group, "qq group ask"), (qq_c2c, "hello from qq c2c")):
        payload, chat, message_id = build(_n(), text)
        standins.qq.received(message_id)
        response = await post_qq(stack, qq_fx.signed(payload))
        assert response.status_code == 200 and response.json() == {"op": 12, "d": 0}, response.text
        [call] = await standins.wait_for("qqbot", chat)
        kind, ident = chat.split(":")
        assert call.path == (f"/v2/groups/{ident}/messages" if kind == "group" else f"/v2/users/{ident}/messages")
        assert call.seen.headers["authorization"] == f"QQBot qq-token-{standins.qq.tokens_issued}"
        body = call.seen.json
        assert body["msg_type"] == 0 and body["msg_id"] == message_id and isinstance(body["msg_seq"], int)
        assert body["content"].startswith("echo: ") and text in body["content"]
    token_calls = [c for c in standins.all_calls() if c.path == "/app/getAppAccessToken"]
    assert len(token_calls) == 1  # cached by the worker
    await standins.settle()


async def test_qqbot_forged_and_malformed_webhooks_reach_nothing(stack: Stack, standins: StandIns) -> None:
    n = _n()
    payload, chat, message_id = qq_c2c(n, "forged qqbot")
    forged = qq_fx.signed(payload, secret="not-the-bot-secret-at-all")
    response = await post_qq(stack, forged)
    assert response.status_code == 401 and response.json() == {"error": "bad_signature"}
    malformed = qq_fx.signed_raw(b'{"op":0,"id":"x","t":"C2C_MESSAGE_CREATE","d":{"id":"m","author":{}}}')
    response = await post_qq(stack, malformed)
    assert response.status_code == 400 and response.json()["error"] == "malformed_payload"

    genuine, _, _ = qq_c2c(n, "genuine qqbot")  # the same ids: had the forged one got in, this is a duplicate
    standins.qq.received(message_id)
    assert (await post_qq(stack, qq_fx.signed(genuine))).status_code == 200
    texts = await _inbound_texts_until(stack, ["genuine qqbot"])
    assert not [t for t in texts if "forged qqbot" in t], texts
    [call] = await standins.wait_for("qqbot", chat)
    assert call.seen.json["content"] == "echo: genuine qqbot"
    await standins.settle()
    assert len(standins.calls_for("qqbot", chat)) == 1
    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        metrics = (await client.get(f"{stack.workers[0].url}/metrics")).text
    assert 'switchboard_webhooks_total{outcome="bad_signature",platform="qqbot"} 1.0' in metrics


async def test_qqbot_redelivered_webhook_gets_one_reply(stack: Stack, standins: StandIns) -> None:
    payload, chat, message_id = qq_group(_n(), "only once qqbot")
    standins.qq.received(message_id)
    for _ in range(3):  # QQ posts the same event again (signed anew) when it saw no answer in time
        assert (await post_qq(stack, qq_fx.signed(payload))).status_code == 200
    await standins.wait_for("qqbot", chat)
    await standins.settle()
    [call] = standins.calls_for("qqbot", chat)
    assert call.accepted and "only once qqbot" in call.seen.json["content"]


async def test_qqbot_rate_limited_send_waits_and_delivers_once(stack: Stack, standins: StandIns) -> None:
    payload, chat, message_id = qq_c2c(_n(), "after the wait qqbot")
    standins.qq.received(message_id)
    standins.script("qqbot", chat, (429, {"code": 22009, "message": "msg limit exceed"}, {"Retry-After": "2"}))
    assert (await post_qq(stack, qq_fx.signed(payload))).status_code == 200
    await standins.wait_for("qqbot", chat)
    await standins.settle()
    limited, delivered = standins.calls_for("qqbot", chat)
    assert limited.status == 429 and delivered.accepted
    assert delivered.at - limited.at >= 1.9, delivered.at - limited.at  # retry_after honoured
    assert limited.seen.json == delivered.seen.json  # the same msg_seq: QQ would drop a second copy
    assert delivered.seen.json["content"] == "echo: after the wait qqbot"


async def test_qqbot_permanent_error_is_dead_lettered_with_qqs_reason(stack: Stack, standins: StandIns) -> None:
    payload, chat, message_id = qq_c2c(_n(), "nobody hears qqbot")
    standins.qq.received(message_id)
    refusal = (403, {"code": 11253, "message": "check app privilege not pass"})
    standins.script("qqbot", chat, refusal, sticky=True)
    assert (await post_qq(stack, qq_fx.signed(payload))).status_code == 200
    letters = await egress_dead_letters(stack, chat)
    await standins.settle()
    [letter] = letters
    assert letter["reason"] == "missing_permission" and letter["attempts"] == 1, letter
    assert letter["topic"] == "im.outbound.qqbot"
    assert "11253" in letter["error"] and "check app privilege not pass" in letter["error"]
    [call] = standins.calls_for("qqbot", chat)  # no retry of a permanent error
    assert not call.accepted


async def test_qqbot_media_reply_is_uploaded_then_sent_as_media(stack: Stack, standins: StandIns) -> None:
    reply = json.dumps(
        {
            "segments": [
                {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
                {"type": "text", "data": {"text": "a pixel"}},
            ]
        },
        separators=(",", ":"),
    )
    payload, chat, message_id = qq_c2c(_n(), f"picture please [sim:reply={reply}]")
    standins.qq.received(message_id)
    assert (await post_qq(stack, qq_fx.signed(payload))).status_code == 200
    image, text = await standins.wait_for("qqbot", chat, 2)
    upload = [c for c in standins.calls_for("qqbot", chat, messages_only=False) if c.path.endswith("/files")]
    assert len(upload) == 1 and base64.b64decode(upload[0].seen.json["file_data"]) == PNG
    assert image.seen.json["msg_type"] == 7 and image.seen.json["media"] == {"file_info": upload[0].answer["file_info"]}
    assert text.seen.json == {
        "content": "a pixel",
        "msg_type": 0,
        "msg_id": message_id,
        "msg_seq": text.seen.json["msg_seq"],
    }
    assert image.seen.json["msg_seq"] != text.seen.json["msg_seq"]
    await standins.settle()


def qq_late_group(n: int, text: str, *, age: float) -> tuple[dict[str, Any], str, str, float]:
    """A group message QQ delivers `age` seconds after it was sent (its `timestamp`): its passive
    window (5 minutes) closes that much sooner. Returns the payload, chat, message id and send time."""
    sent = time.time() - age
    group, message_id = f"E2ELATE{n:025d}", f"ROBOT1.0_e2e_late_{n:06d}"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(sent))
    payload = qq_fx.group_at(text, message_id=message_id, group=group, timestamp=stamp)
    return payload, f"group:{group}", message_id, float(int(sent))


def notices_counted(metrics_text: str) -> dict[str, float]:
    return {
        sample.labels["notice"]: sample.value
        for family in text_string_to_metric_families(metrics_text)
        if family.name == "switchboard_notices"
        for sample in family.samples
        if sample.name == "switchboard_notices_total" and sample.labels.get("platform") == "qqbot"
    }


async def test_qqbot_a_turn_outliving_the_reply_window_gets_one_notice_while_it_is_open(
    stack: Stack, standins: StandIns
) -> None:
    """Three group messages that reach the bot 276-280 s after they were sent, so their passive
    windows close about 10-14 s later (egress stops 10 s before QQ's 5 minutes) and the notice is due
    5 s before that: a fast turn answers in time and gets no notice; a slow one (the agent thinks
    15 s) gets exactly one notice, a passive reply sent while the window was open, and then its
    late answer is dead-lettered, or, for the bot with active messages, sent as an active message."""
    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        before = notices_counted((await client.get(f"{stack.workers[0].url}/metrics")).text)
    fast, fast_chat, fast_id, fast_sent = qq_late_group(_n(), "quick one qqbot", age=276)
    slow, slow_chat, slow_id, slow_sent = qq_late_group(_n(), "slow one qqbot [sim:think=15]", age=280)
    active, active_chat, active_id, active_sent = qq_late_group(_n(), "slow active qqbot [sim:think=15]", age=280)
    for message_id, sent in ((fast_id, fast_sent), (slow_id, slow_sent), (active_id, active_sent)):
        standins.qq.received(message_id, at=sent)
    posted = time.time()
    for payload, bot in ((fast, QQ_BOT), (slow, QQ_BOT), (active, QQ_ACTIVE_BOT)):
        assert (await post_qq(stack, qq_fx.signed(payload), bot)).status_code == 200

    letters = await egress_dead_letters(stack, slow_chat, timeout=60)
    await standins.wait_for("qqbot", active_chat, 2, within=30)
    await standins.settle()
    assert time.time() - posted > 14  # every window here has closed: no notice can still come

    # The fast turn: its answer, nothing else.
    [answer] = standins.calls_for("qqbot", fast_chat)
    assert answer.accepted and answer.seen.json["content"].endswith("quick one qqbot")  # the echo
    assert answer.seen.json["msg_id"] == fast_id

    # The slow turn: one notice, a passive reply to the user's message inside its window.
    [notice] = standins.calls_for("qqbot", slow_chat)
    body = notice.seen.json
    assert notice.accepted and body["msg_id"] == slow_id and isinstance(body["msg_seq"], int)
    assert body["content"] == DEFAULT_NOTICES["en"][NoticeKind.REPLY_WINDOW_CLOSING]
    [letter] = letters
    assert letter["reason"] == "passive_window_expired", letter
    late = json.loads(letter["record"])
    assert late["kind"] == "reply" and late["segments"][0]["data"]["text"].endswith("slow one qqbot")

    # With active messages: the notice says so, then the answer comes without a msg_id.
    notice, reply = standins.calls_for("qqbot", active_chat)
    assert notice.accepted and notice.seen.json["msg_id"] == active_id
    assert notice.seen.json["content"] == DEFAULT_NOTICES["en"][NoticeKind.REPLY_WINDOW_CLOSING_ACTIVE]
    assert reply.accepted and "msg_id" not in reply.seen.json
    assert reply.seen.json["content"].endswith("slow active qqbot")

    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        after = notices_counted((await client.get(f"{stack.workers[0].url}/metrics")).text)
    for kind in ("reply_window_closing", "reply_window_closing_active"):
        assert after.get(kind, 0.0) - before.get(kind, 0.0) == 1.0, (kind, before, after)


async def test_qqbot_a_worker_killed_after_the_send_does_not_post_twice(stack: Stack, standins: StandIns) -> None:
    """SIGKILL the worker the moment QQ accepted the reply, before egress could mark it delivered:
    its replacement replays the record and sends the same msg_id + msg_seq, which QQ refuses as a
    repeat (40054005); the chat shows the reply once. (Last in the module: it replaces the worker.)"""
    payload, chat, message_id = qq_c2c(_n(), "survive the crash qqbot")
    standins.qq.received(message_id)
    victim = stack.workers[0]
    assert victim.pid is not None
    api = standins.apis["qqbot"]
    serve = api.prefixes["/v2/users/"]
    killed: list[int] = []

    def accept_then_kill(seen: Any) -> Any:
        answer = cast(Answer, serve(seen))  # QQ's stand-in answers at once
        if not killed and seen.path == f"/v2/users/{chat.split(':')[1]}/messages" and answer[0] == 200:
            os.killpg(cast(int, victim.pid), signal.SIGKILL)  # the answer never reaches the worker
            killed.append(cast(int, victim.pid))
        return answer

    api.prefixes["/v2/users/"] = accept_then_kill
    try:
        assert (await post_qq(stack, qq_fx.signed(payload))).status_code == 200
        await standins.wait_for("qqbot", chat)
        assert killed
        await victim.kill()  # reaped
        await stack.add_worker()
        await standins.wait_for("qqbot", chat, 2, delivered=False, within=90)  # the replayed send
        await standins.settle()
    finally:
        api.prefixes["/v2/users/"] = serve
    calls = standins.calls_for("qqbot", chat)
    assert [c.status for c in calls][:1] == [200] and all(c.status == 400 for c in calls[1:]), calls
    assert {c.answer["code"] for c in calls[1:]} == {40054005}
    assert len({(c.seen.json["msg_id"], c.seen.json["msg_seq"]) for c in calls}) == 1  # the same send each time
    assert [s.json["content"] for s in standins.qq.sent if s.json.get("msg_id") == message_id] == [
        "echo: survive the crash qqbot"
    ]
