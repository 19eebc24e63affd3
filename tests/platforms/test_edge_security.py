"""The public edge under an attacker's requests, over real HTTP to a worker's web server (its
webhooks answered by the webhook front or by the app's route): what an unauthenticated or replayed
request gets, that it is counted in `switchboard_webhooks_total`, that nothing of it reaches a topic
(not even a dead letter), and that none of it is logged as an error. Redis is the session's real one."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from redis import asyncio as aioredis

from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.platforms.dingtalk import FUTURE_SKEW_S, DingTalkPlatform
from pipeline.platforms.wecom import MAX_CALLBACK_BYTES
from pipeline.settings import BotConfig, Settings
from pipeline.stages.outputs import Outputs
from pipeline.state import Keys, RedisClient
from pipeline.topics import DEADLETTER, IM_INBOUND
from pipeline.web.server import WebServer

from . import test_dingtalk as dingtalk_fx
from . import test_discord as discord_fx
from . import test_lark as lark_fx
from . import test_onebot as onebot_fx
from . import test_qqbot as qq_fx
from . import test_slack as slack_fx
from . import test_telegram as telegram_fx
from . import test_wecom as wecom_fx
from .test_ingress_checks import Produced

# A Lark bot with an encrypt key and no verification token: an unsigned challenge can prove itself
# only by having been encrypted.
LARK_KEY_ONLY = BotConfig(
    platform="lark",
    bot_id="lk2",
    self_id=lark_fx.BOT_OPEN_ID,
    credentials={"app_id": lark_fx.APP_ID, "app_secret": lark_fx.APP_SECRET, "encrypt_key": lark_fx.ENCRYPT_KEY},
)


@dataclass
class Edge:
    url: str
    produced: Produced

    async def post(
        self, platform: str, bot_id: str, request: WebhookRequest, headers: list[tuple[str, bytes]] | None = None
    ) -> httpx.Response:
        # As bytes: a replaced value may be any bytes at all.
        sent = [(k.encode(), v.encode()) for k, v in request.headers.items()]
        if headers:
            names = {name.encode() for name, _ in headers}
            sent = [(k, v) for k, v in sent if k not in names] + [(k.encode(), v) for k, v in headers]
        async with httpx.AsyncClient() as client:
            return await client.post(
                f"{self.url}/webhooks/{platform}/{bot_id}",
                content=request.body,
                headers=sent,
                params=dict(request.query),
            )

    async def get(self, platform: str, bot_id: str, query: dict[str, str]) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.get(f"{self.url}/webhooks/{platform}/{bot_id}", params=query)

    def nothing_produced(self) -> bool:
        return self.produced.records == []


@pytest.fixture
async def signatures(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisClient]:
    """DingTalk's signatures kept in the real Redis, as a worker binds them at start-up."""
    client = RedisClient(redis_url)
    platform = get_platform("dingtalk")
    assert isinstance(platform, DingTalkPlatform)
    platform.bind(client, Keys(redis_prefix))
    try:
        yield client
    finally:
        platform.bind(None)
        await client.aclose()


@pytest.fixture(params=[True, False], ids=["front", "aiohttp"])
async def edge(
    redis_url: str, redis_prefix: str, signatures: RedisClient, request: pytest.FixtureRequest
) -> AsyncIterator[Edge]:
    settings = Settings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        console_enabled=False,
        web_webhook_front=request.param,
        bots=[
            wecom_fx.bot_config(),
            qq_fx.bot_config(),
            lark_fx.bot_config(),
            LARK_KEY_ONLY,
            dingtalk_fx.bot_config(),
            discord_fx.bot_config(),
            slack_fx.bot_config(),
            telegram_fx.bot_config(),
            onebot_fx.bot_config(),
        ],
    )
    produced = Produced()

    async def ready() -> dict[str, bool]:
        return {"started": True}

    server = WebServer(settings, produce=produced, outputs=Outputs(produced), ready=ready)
    port = await server.start("127.0.0.1", 0)
    try:
        yield Edge(f"http://127.0.0.1:{port}", produced)
    finally:
        await server.stop()


def counted(platform: str, outcome: str | None = None) -> float:
    """`switchboard_webhooks_total` of the platform: one outcome, or all of them."""
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name != "switchboard_webhooks_total" or sample.labels.get("platform") != platform:
                continue
            if outcome is None or sample.labels.get("outcome") == outcome:
                total += sample.value
    return total


@pytest.fixture
def errors(caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    """The ERROR records logged during the test (a traceback of a bad request would be one)."""
    caplog.set_level(logging.WARNING)
    found: list[logging.LogRecord] = []
    yield found
    found.extend(r for r in caplog.records if r.levelno >= logging.ERROR)
    assert found == [], [r.getMessage() for r in found]


def encrypt_value(request: WebhookRequest) -> str:
    """The `<Encrypt>` (app) or `encrypt` (AI bot) of a captured WeCom POST."""
    if request.body.startswith(b"{"):
        return str(json.loads(request.body)["encrypt"])
    found = re.search(rb"<Encrypt>(?:<!\[CDATA\[)?([A-Za-z0-9+/=]+)", request.body)
    assert found is not None
    return found.group(1).decode()


# --- 1. WeCom: nothing is parsed before the signature is checked --------------------------------


async def test_an_unsigned_wecom_body_over_the_cap_is_refused_unread(edge: Edge, errors: list[Any]) -> None:
    captured = wecom_fx.app_request(wecom_fx.app_xml("text", Content="hi"))
    flood = b"<xml>" + b"<a/>" * ((1024 * 1024 - 64) // 4) + b"</xml>"  # under the web server's 1 MiB
    before = counted("wecom", "too_large")
    response = await edge.post("wecom", "wc1", WebhookRequest(headers={}, body=flood, query=captured.query))
    assert response.status_code == 413 and response.json()["error"] == "too_large"
    assert counted("wecom", "too_large") == before + 1
    assert edge.nothing_produced()


async def test_an_unsigned_wecom_body_is_never_parsed(edge: Edge, errors: list[Any]) -> None:
    """A body that is not even XML, under the cap, with a real callback's query: the signature over
    its `<Encrypt>` does not match, so it is a 401; a parser would have called it malformed first."""
    captured = wecom_fx.app_request(wecom_fx.app_xml("text", Content="hi"))
    junk = b"<xml><Encrypt><![CDATA[QUJDRA==]]></Encrypt><<<" + b"<a/>" * 1000
    assert len(junk) < MAX_CALLBACK_BYTES
    before = counted("wecom", "bad_signature")
    response = await edge.post("wecom", "wc1", WebhookRequest(headers={}, body=junk, query=captured.query))
    assert response.status_code == 401 and response.json()["error"] == "bad_signature"
    assert counted("wecom", "bad_signature") == before + 1
    assert edge.nothing_produced()


async def test_a_signed_wecom_message_naming_an_odd_encoding_is_read_as_utf8(edge: Edge, errors: list[Any]) -> None:
    """Inside a signed message, an `encoding=` declaration naming a codec that is unknown or that
    cannot decode: WeCom's XML is UTF-8, so it is read as UTF-8 (not a parser crash logged as an
    error and answered `parser_error`)."""
    for n, encoding in enumerate(("bogus-encoding", "idna")):
        xml = wecom_fx.app_xml("text", msg_id=f"73912345678901234{n}", Content="hi")
        response = await edge.post(
            "wecom", "wc1", wecom_fx.app_request(f'<?xml version="1.0" encoding="{encoding}"?>{xml}')
        )
        assert response.status_code == 200, (encoding, response.text)
    assert [json.loads(m)["text"] for m in edge.produced.on(IM_INBOUND)] == ["hi", "hi"]
    assert edge.produced.on(DEADLETTER) == []


# --- 2. WeCom: the URL check answers echostrs only -----------------------------------------------


@pytest.mark.parametrize("surface", ["app", "aibot"])
async def test_a_captured_wecom_message_replayed_as_a_url_check_is_not_decrypted(
    edge: Edge, surface: str, errors: list[Any]
) -> None:
    secret_text = "the quarterly numbers are 42"
    if surface == "app":
        captured = wecom_fx.app_request(wecom_fx.app_xml("text", Content=secret_text))
    else:
        captured = wecom_fx.aibot_request(wecom_fx.aibot_payload(secret_text))
    query = {**captured.query, "echostr": encrypt_value(captured)}
    before = counted("wecom", "not_echostr")
    response = await edge.get("wecom", "wc1", query)
    assert response.status_code == 400 and response.json()["error"] == "not_echostr"
    assert secret_text not in response.text and "quarterly" not in response.text
    assert counted("wecom", "not_echostr") == before + 1
    assert edge.nothing_produced()
    # A real URL check is still answered with its echostr.
    check = wecom_fx.url_check("1616140317555161061")
    response = await edge.get("wecom", "wc1", dict(check.query))
    assert response.status_code == 200 and response.text == "1616140317555161061"


async def test_a_wecom_echostr_that_is_not_a_short_token_is_refused(edge: Edge, errors: list[Any]) -> None:
    for echo in ('{"msgtype":"text"}', "<xml/>", "a" * 129, "two words"):
        response = await edge.get("wecom", "wc1", dict(wecom_fx.url_check(echo).query))
        assert response.status_code == 400 and response.json()["error"] == "not_echostr", echo
    long = wecom_fx.url_check("1" * 100)
    query = {**long.query, "echostr": long.query["echostr"] + "A" * 600}
    assert (await edge.get("wecom", "wc1", query)).status_code in (400, 401)
    assert edge.nothing_produced()


# --- 3. Non-ASCII header values: a 4xx, counted, never an error -----------------------------------


def _non_ascii_cases() -> list[tuple[str, str, WebhookRequest, str]]:
    """(platform, bot id, a genuine request, the header whose value is replaced)."""
    dingtalk = dingtalk_fx.signed(dingtalk_fx.message())
    return [
        ("discord", "dc1", discord_fx.signed(discord_fx.SLASH), "x-signature-timestamp"),
        ("discord", "dc1", discord_fx.signed(discord_fx.SLASH), "x-signature-ed25519"),
        ("dingtalk", "dt1", dingtalk, "sign"),
        ("dingtalk", "dt1", dingtalk, "timestamp"),
        ("telegram", "tg1", telegram_fx.request(_telegram_update()), "x-telegram-bot-api-secret-token"),
        ("slack", "sl1", slack_fx.signed(slack_fx.callback(slack_fx.APP_MENTION)), "x-slack-signature"),
        ("slack", "sl1", slack_fx.signed(slack_fx.callback(slack_fx.APP_MENTION)), "x-slack-request-timestamp"),
        ("onebot", "qq1", onebot_fx.signed(onebot_fx.group_event("hi")), "x-signature"),
        ("qqbot", "qb1", qq_fx.signed(qq_fx.c2c("hi")), "x-signature-timestamp"),
        ("qqbot", "qb1", qq_fx.signed(qq_fx.c2c("hi")), "x-bot-appid"),
        ("lark", "lk1", lark_fx.encrypted_request(_lark_event()), "x-lark-signature"),
        ("lark", "lk1", lark_fx.encrypted_request(_lark_event()), "x-lark-request-nonce"),
    ]


def _telegram_update() -> Any:
    chat = telegram_fx.PRIVATE
    return telegram_fx.Update(9301, message=telegram_fx.Message(7, telegram_fx.WHEN, chat, text="hi"))


def _lark_event() -> dict[str, Any]:
    return lark_fx.receive_event("text", {"text": "hi"}, chat_type="p2p")


@pytest.mark.parametrize("value", [b"\xc3\xa9t\xc3\xa9", b"\xff\xfe1"], ids=["utf8", "not-utf8"])
@pytest.mark.parametrize(
    ("platform", "bot_id", "request_", "header"),
    _non_ascii_cases(),
    ids=[f"{p}-{h}" for p, _, _, h in _non_ascii_cases()],
)
async def test_a_non_ascii_header_value_is_a_counted_4xx_not_a_500(
    edge: Edge,
    errors: list[Any],
    platform: str,
    bot_id: str,
    request_: WebhookRequest,
    header: str,
    value: bytes,
) -> None:
    before = counted(platform)
    response = await edge.post(platform, bot_id, request_, headers=[(header, value)])
    assert 400 <= response.status_code < 500, response.text
    assert counted(platform) == before + 1
    assert edge.nothing_produced()


@pytest.mark.parametrize(
    ("platform", "request_", "header"),
    [(p, r, h) for p, _, r, h in _non_ascii_cases()],
    ids=[f"{p}-{h}" for p, _, _, h in _non_ascii_cases()],
)
def test_verify_refuses_what_the_front_decodes_from_non_ascii_bytes(
    platform: str, request_: WebhookRequest, header: str
) -> None:
    """The platform's own check, whatever front hands it the request: a header value decoded with
    `surrogateescape` (any character) is a 401, never an exception of another kind."""
    bots = {
        "discord": discord_fx.bot_config(),
        "dingtalk": dingtalk_fx.bot_config(),
        "telegram": telegram_fx.bot_config(),
        "slack": slack_fx.bot_config(),
        "onebot": onebot_fx.bot_config(),
        "qqbot": qq_fx.bot_config(),
        "lark": lark_fx.bot_config(),
    }
    for raw in (b"\xc3\xa9t\xc3\xa9", b"\xff\xfe1"):
        headers = {**request_.headers, header: raw.decode("utf-8", "surrogateescape")}
        tampered = WebhookRequest(headers=headers, body=request_.body, received_at_ms=time.time() * 1000)
        with pytest.raises(WebhookRejected) as refused:
            get_platform(platform).verify(bots[platform], tampered)
        assert refused.value.status == 401


def test_verify_of_wecom_refuses_a_non_ascii_query() -> None:
    captured = wecom_fx.app_request(wecom_fx.app_xml("text", Content="hi"))
    check = wecom_fx.url_check("1616140317555161061")
    query = {**check.query, "echostr": "\udcff" + check.query["echostr"]}
    with pytest.raises(WebhookRejected) as refused:
        get_platform("wecom").verify(
            wecom_fx.bot_config(), WebhookRequest(headers={}, body=b"", query=query, method="GET")
        )
    assert refused.value.status == 401
    # A JSON string may hold a lone surrogate as an escape: no base64 ciphertext does.
    aibot = wecom_fx.aibot_request(wecom_fx.aibot_payload("hi"))
    body = b'{"encrypt": "\\udcff' + json.loads(aibot.body)["encrypt"].encode() + b'"}'
    with pytest.raises(WebhookRejected) as refused:
        get_platform("wecom").verify(wecom_fx.bot_config(), WebhookRequest(headers={}, body=body, query=aibot.query))
    assert refused.value.status == 401
    for name in ("msg_signature", "timestamp", "nonce"):
        query = {**captured.query, name: "\udcff" + captured.query[name]}
        with pytest.raises(WebhookRejected) as refused:
            get_platform("wecom").verify(
                wecom_fx.bot_config(), WebhookRequest(headers={}, body=captured.body, query=query)
            )
        assert refused.value.status == 401, name


# --- 4. Nothing unauthenticated reaches a topic ----------------------------------------------------


async def test_an_unsigned_qq_validation_is_refused_and_not_dead_lettered(edge: Edge, errors: list[Any]) -> None:
    before = counted("qqbot", "bad_signature")
    for d in (
        {"plain_token": "<not a token>", "event_ts": "x"},
        {"plain_token": "Arq0D5A61EgUu4OxUvOp", "event_ts": "1"},
    ):
        body = json.dumps({"op": 13, "d": d}).encode()
        response = await edge.post(
            "qqbot", "qb1", WebhookRequest(headers={"content-type": "application/json"}, body=body)
        )
        assert response.status_code == 401 and response.json()["error"] == "bad_signature"
        assert "signature" not in response.json()  # nothing signed for an unsigned caller
    assert counted("qqbot", "bad_signature") == before + 2
    assert edge.nothing_produced()
    # Signed, it is answered.
    signed = qq_fx.signed_raw(b'{"d":{"plain_token":"Arq0D5A61EgUu4OxUvOp","event_ts":"1725442341"},"op":13}')
    response = await edge.post("qqbot", "qb1", signed)
    assert response.status_code == 200 and response.json()["plain_token"] == "Arq0D5A61EgUu4OxUvOp"


async def test_an_unsigned_plain_lark_challenge_needs_the_token_or_the_key(edge: Edge, errors: list[Any]) -> None:
    before = counted("lark", "bad_signature")
    for event in ({"type": "url_verification"}, {"type": "url_verification", "challenge": "c-1"}):
        request = WebhookRequest(headers={"content-type": "application/json"}, body=json.dumps(event).encode())
        response = await edge.post("lark", "lk2", request)
        assert response.status_code == 401 and "c-1" not in response.text
    assert counted("lark", "bad_signature") == before + 2
    assert edge.nothing_produced()
    # Encrypted with the key, the unsigned challenge is Lark's own and is answered.
    challenge = {"type": "url_verification", "challenge": "c-2", "token": ""}
    response = await edge.post("lark", "lk2", lark_fx.encrypted_request(challenge, signed=False))
    assert response.status_code == 200 and response.json() == {"challenge": "c-2"}


# --- 5. DingTalk: a signature authenticates one body ----------------------------------------------


async def test_a_dingtalk_signature_authenticates_one_body_on_every_worker(
    edge: Edge, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis, errors: list[Any]
) -> None:
    genuine = dingtalk_fx.signed(dingtalk_fx.message(text="from DingTalk"))
    assert (await edge.post("dingtalk", "dt1", genuine)).status_code == 200
    # The same request again is DingTalk retrying: taken (ingest drops the copy by its msgId).
    assert (await edge.post("dingtalk", "dt1", genuine)).status_code == 200
    [first, again] = [json.loads(m) for m in edge.produced.on(IM_INBOUND)]
    assert first["message_id"] == again["message_id"]
    # The captured headers with another body: refused, nothing produced, no dead letter.
    forged = WebhookRequest(headers=genuine.headers, body=json.dumps(dingtalk_fx.message(text="forged")).encode())
    before = counted("dingtalk", "replayed_signature")
    response = await edge.post("dingtalk", "dt1", forged)
    assert response.status_code == 401 and response.json()["error"] == "replayed_signature"
    assert counted("dingtalk", "replayed_signature") == before + 1
    # The mark is in Redis, kept as long as the timestamp could pass, shared with every worker.
    [key] = [k async for k in redis_client.scan_iter(match=f"{redis_prefix}dingtalk-sign:*")]
    ttl = await redis_client.ttl(key)
    assert 0 < ttl <= dingtalk_fx.bot_config().replay_window_seconds + FUTURE_SKEW_S
    another_worker = RedisClient(redis_url)
    platform = get_platform("dingtalk")
    assert isinstance(platform, DingTalkPlatform)
    platform.bind(another_worker, Keys(redis_prefix))
    try:
        response = await edge.post("dingtalk", "dt1", forged)
        assert response.status_code == 401 and response.json()["error"] == "replayed_signature"
    finally:
        await another_worker.aclose()
    assert len(edge.produced.on(IM_INBOUND)) == 2 and edge.produced.on(DEADLETTER) == []


async def test_a_dingtalk_timestamp_ahead_of_the_clock_is_refused(edge: Edge, errors: list[Any]) -> None:
    now_ms = int(time.time() * 1000)
    ahead = dingtalk_fx.signed(dingtalk_fx.message(), ts_ms=now_ms + (FUTURE_SKEW_S + 60) * 1000)
    response = await edge.post("dingtalk", "dt1", ahead)
    assert response.status_code == 401 and response.json()["error"] == "stale_timestamp"
    assert edge.nothing_produced()
    within = dingtalk_fx.signed(dingtalk_fx.message(), ts_ms=now_ms + (FUTURE_SKEW_S - 30) * 1000)
    assert (await edge.post("dingtalk", "dt1", within)).status_code == 200


async def test_without_its_redis_dingtalk_takes_nothing(edge: Edge, errors: list[Any]) -> None:
    platform = get_platform("dingtalk")
    assert isinstance(platform, DingTalkPlatform)
    platform.bind(None)  # the `signatures` fixture restores nothing: it unbinds at the end anyway
    response = await edge.post("dingtalk", "dt1", dingtalk_fx.signed(dingtalk_fx.message()))
    assert response.status_code == 503 and response.json()["error"] == "replay_check_unavailable"
    assert edge.nothing_produced()
