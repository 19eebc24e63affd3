"""Lark's long connection against a stand-in of Lark (`lark_standin`): the endpoint request with the
app's id and secret, lark_oapi's own protobuf `Frame` on the wire both ways, pings with the service
id, events parsed as the webhook parses them and answered (`{"code": 200}`) only once their messages
are on the broker, split messages put together, reconnects paced by the `ClientConfig`. Leases on a
real Redis; the producer is the recording stand-in of `conftest`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lark_oapi.ws.pb.pbbp2_pb2 import Frame as SdkFrame

from pipeline import metrics
from pipeline.connections import lark as long_connection
from pipeline.connections._frame import Frame, FrameError, decode, encode
from pipeline.platforms import get_platform
from pipeline.settings import BotConfig, Settings
from pipeline.topics import DEADLETTER
from tests.metric_values import current
from tests.platforms.test_lark import APP_ID, APP_SECRET, BOT_OPEN_ID, mention, receive_event

from .conftest import Produced
from .lark_standin import LarkStandIn
from .standin_support import frames, same_message, webhook_messages
from .test_onebot_ws import inbound, running, until


@pytest.fixture
async def lark() -> AsyncIterator[LarkStandIn]:
    standin = LarkStandIn()
    await standin.start()
    try:
        yield standin
    finally:
        await standin.stop()
        assert standin.errors == [], "frames or requests Lark would refuse"


def bot(lark: LarkStandIn, secret: str = APP_SECRET) -> BotConfig:
    return BotConfig(
        platform="lark",
        bot_id="lk1",
        self_id=BOT_OPEN_ID,
        transport="long_connection",
        api_base=lark.url,
        credentials={"app_id": APP_ID, "app_secret": secret},
    )


def text_event(text: str, event_id: str) -> dict[str, Any]:
    return receive_event(
        "text",
        {"text": f"@_user_1 {text}"},
        mentions=[mention("@_user_1", BOT_OPEN_ID, "bot")],
        event_id=event_id,
    )


# -- the frame codec -----------------------------------------------------------------------------


def test_the_frame_codec_reads_and_writes_what_the_sdk_does() -> None:
    sdk = SdkFrame(SeqID=2**40 + 3, LogID=99, service=-7, method=1, payload=b'{"x": "\xe4\xb8\xad"}')
    sdk.payload_encoding, sdk.payload_type, sdk.LogIDNew = "utf-8", "json", "log-1"
    for key, value in (("type", "event"), ("message_id", "m1"), ("sum", "1"), ("seq", "0")):
        header = sdk.headers.add()
        header.key, header.value = key, value
    ours = decode(sdk.SerializeToString())
    assert ours == Frame(
        seq_id=2**40 + 3,
        log_id=99,
        service=-7,
        method=1,
        headers=(("type", "event"), ("message_id", "m1"), ("sum", "1"), ("seq", "0")),
        payload_encoding="utf-8",
        payload_type="json",
        payload=sdk.payload,
        log_id_new="log-1",
    )
    assert encode(ours) == sdk.SerializeToString()
    answered = SdkFrame()
    answered.ParseFromString(encode(ours.answered(b'{"code": 200}', biz_rt="4")))
    assert [(h.key, h.value) for h in answered.headers][-1] == ("biz_rt", "4") and answered.payload == b'{"code": 200}'
    ping = SdkFrame()
    ping.ParseFromString(encode(Frame(service=5, headers=(("type", "ping"),))))
    assert ping.IsInitialized() and ping.method == 0 and ping.SeqID == 0 and ping.service == 5
    for broken in (b"\x08", b"\x0a\x05ab", b"\x08\x01\x10\x01\x18\x01", b"\x0f"):
        with pytest.raises(FrameError):
            decode(broken)


# -- over the wire ------------------------------------------------------------------------------


async def test_an_event_becomes_the_webhooks_message_and_is_answered_only_once_on_the_broker(
    lark: LarkStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = bot(lark)
    produced.hold = True
    async with running(redis_url, redis_prefix, produced, config):
        await until(lambda: len(lark.open_sockets()) == 1, "socket dialed")
        request = lark.endpoint_requests[0]
        assert request["body"] == {"AppID": APP_ID, "AppSecret": APP_SECRET}
        await until(lambda: len(lark.sockets[0].pings) == 1, "a ping with the service id")
        event = text_event("hello", event_id="ev-long-1")
        message_id = await lark.send_event(event)
        await until(lambda: len(inbound(produced)) == 1, "produced")
        [message] = inbound(produced)
        [expected] = webhook_messages(config, event)
        assert same_message(message, expected) and message.mentions_bot and message.event_id == "ev-long-1"
        await asyncio.sleep(0.5)  # the broker has not acknowledged: neither may we
        assert lark.sockets[0].answers == []
        for ack in produced.acks:
            ack.set_result(None)
        await until(lambda: len(lark.sockets[0].answers) == 1, "answered once durable")
        answer = lark.sockets[0].answers[0]
        assert (answer.message_id, answer.code) == (message_id, 200)


async def test_a_split_message_is_put_together_and_answered_once(
    lark: LarkStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    async with running(redis_url, redis_prefix, produced, bot(lark)):
        await until(lambda: len(lark.open_sockets()) == 1, "socket dialed")
        event = text_event("a longer message " * 40, event_id="ev-split")
        message_id = await lark.send_event(event, parts=3, order=[2, 0, 1])
        await until(lambda: len(lark.sockets[0].answers) == 1, "answered")
        assert lark.sockets[0].answers[0].message_id == message_id
        [message] = inbound(produced)
        assert message.event_id == "ev-split" and message.text.startswith("@bot a longer message")


async def test_cards_are_counted_not_answered_and_a_bad_event_is_dead_lettered_and_answered(
    lark: LarkStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    card_before, malformed_before = frames("lark", "card"), frames("lark", "malformed_payload")
    async with running(redis_url, redis_prefix, produced, bot(lark)):
        await until(lambda: len(lark.open_sockets()) == 1, "socket dialed")
        await lark.send_event({"schema": "2.0", "header": {"event_type": "card.action.trigger"}}, kind="card")
        broken = text_event("x", event_id="ev-broken")
        del broken["event"]["message"]
        await lark.send_event(broken)
        await until(lambda: len(lark.sockets[0].answers) == 1, "the bad event answered (it is dead-lettered)")
    assert frames("lark", "card") == card_before + 1 and frames("lark", "malformed_payload") == malformed_before + 1
    assert [topic for topic, _, _ in produced.records] == [DEADLETTER]


async def test_an_event_that_cannot_be_produced_is_answered_500(
    lark: LarkStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    produced.hold = True
    # 2 s of patience: sent at 0, 0.5 and 1.5 s; the next send would be past it.
    async with running(redis_url, redis_prefix, produced, bot(lark), produce_patience=2.0):
        await until(lambda: len(lark.open_sockets()) == 1, "socket dialed")
        await lark.send_event(text_event("lost", event_id="ev-fail"))
        for attempt in range(1, 4):
            await until(lambda n=attempt: len(produced.acks) == n, f"produce attempt {attempt}")  # type: ignore[misc]
            produced.acks[-1].set_exception(ConnectionError("broker unreachable"))
        await until(lambda: len(lark.sockets[0].answers) == 1, "answered")
        assert lark.sockets[0].answers[0].code == 500


async def test_pong_config_and_reconnects_follow_the_client_config(
    lark: LarkStandIn, redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pipeline")
    reconnects = metrics.CONNECTION_RECONNECTS.labels("lark", "long_connection")
    before = current(reconnects)
    lark.pong_config = {"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 1}
    async with running(redis_url, redis_prefix, produced, bot(lark)):
        await until(lambda: len(lark.open_sockets()) == 1, "socket dialed")
        await until(lambda: len(lark.sockets[0].pings) >= 3, "pings every second after the pong said so", 5)
        first = lark.sockets[0]
        await first.ws.close()  # Lark drops the socket
        await until(lambda: len(lark.open_sockets()) == 1 and len(lark.sockets) == 2, "connected again")
        assert len(lark.endpoint_requests) == 2 and current(reconnects) == before + 1
        await lark.send_event(text_event("again", event_id="ev-again"))
        await until(lambda: len(lark.sockets[1].answers) == 1, "answered on the new socket")
    assert "long connection made again" in caplog.text
    assert "ticket=" not in caplog.text and "access_key" not in caplog.text and APP_SECRET not in caplog.text


async def test_a_socket_whose_peer_stops_answering_pings_is_dropped_and_made_again(
    lark: LarkStandIn, redis_url: str, redis_prefix: str, produced: Produced, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(long_connection, "PING_SECONDS", 0.4)  # 20 s in production
    lark.answer_pings = False
    async with running(redis_url, redis_prefix, produced, bot(lark)):
        await until(lambda: len(lark.sockets) == 1, "socket dialed")
        await until(lambda: lark.sockets[0].closed is not None, "the silent socket closed by its pings", 5)
        lark.answer_pings = True
        await until(lambda: len(lark.open_sockets()) == 1 and len(lark.sockets) == 2, "made again")
        await lark.send_event(text_event("after", event_id="ev-after-ping"))
        await until(lambda: len(lark.sockets[1].answers) == 1, "the new socket works")


async def test_a_wrong_secret_fails_the_dial_and_is_counted_and_logged_without_it(
    lark: LarkStandIn, redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pipeline")
    failed = metrics.CONNECTION_HANDSHAKES.labels("lark", "dial_failed")
    before = current(failed)
    async with running(redis_url, redis_prefix, produced, bot(lark, secret="not-the-secret")):
        await until(lambda: current(failed) > before, "dial failed")
    assert lark.sockets == [] and lark.endpoint_requests[0]["body"]["AppSecret"] == "not-the-secret"
    assert "the long-connection endpoint refused: HTTP 200, code 403: app id or secret is invalid" in caplog.text
    assert "not-the-secret" not in caplog.text


def test_a_long_connection_bot_needs_no_webhook_credentials() -> None:
    settings = Settings(
        bots=[
            {
                "platform": "lark",
                "bot_id": "lk",
                "transport": "long_connection",
                "credentials": {"app_id": APP_ID, "app_secret": APP_SECRET},
            }
        ]
    )
    assert settings.bots[0].transport == "long_connection"
    assert get_platform("lark").startup_warnings(settings.bots[0]) == []
