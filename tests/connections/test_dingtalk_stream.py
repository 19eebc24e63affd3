"""DingTalk Stream mode (transport `stream`) against a stand-in gateway (`dingtalk_stream`) that
checks the app's credentials and the one-time tickets, with the lease on a real Redis: a robot
message is the inbound message its HTTP callback would be, acknowledged only once the broker has it
(never when it could not be produced); pings are answered; a `disconnect` is followed by a new
connection with a new ticket; wrong credentials fail the dial and the ticket is never logged."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pipeline import metrics
from pipeline.platforms import WebhookRequest, get_platform
from pipeline.settings import BotConfig
from tests.metric_values import current
from tests.platforms.test_dingtalk import CLIENT_ID, CLIENT_SECRET, message

from .conftest import Produced
from .dingtalk_stream import StreamGateway
from .test_onebot_ws import inbound, running, until


def stream_bot(api_base: str, secret: str = CLIENT_SECRET) -> BotConfig:
    return BotConfig(
        platform="dingtalk",
        bot_id="dt1",
        transport="stream",
        credentials={"client_id": CLIENT_ID, "client_secret": secret},
        api_base=api_base,
    )


def frames(outcome: str) -> float:
    return current(metrics.CONNECTION_FRAMES.labels("dingtalk", outcome))


@pytest.fixture
async def gateway() -> AsyncIterator[StreamGateway]:
    server = await StreamGateway().start()
    try:
        yield server
    finally:
        await server.stop()


async def test_a_message_is_acknowledged_only_after_the_broker_has_it(
    gateway: StreamGateway, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = stream_bot(gateway.url)
    produced.hold = True
    payload = message(group=True, at_bot=True, text=" what is new")
    async with running(redis_url, redis_prefix, produced, config):
        await until(lambda: gateway.live is not None, "connected")
        frame_id = await gateway.push(gateway.callback(payload))
        await until(lambda: len(inbound(produced)) == 1, "produced")
        await asyncio.sleep(0.5)
        assert gateway.acks_for(frame_id) == []  # not durable yet: no ack
        for held in produced.acks:
            held.set_result(None)
        ack = await gateway.wait_ack(frame_id)
        assert ack["code"] == 200 and ack["message"] == "OK"
        assert ack["headers"] == {"contentType": "application/json", "messageId": frame_id}
        assert json.loads(ack["data"]) == {"response": None}
    [streamed] = inbound(produced)
    # What the signed HTTP callback with the same message produces, with the same parser.
    webhook_bot = config.model_copy(update={"transport": "webhook"})
    [expected] = (
        get_platform("dingtalk")
        .parse(webhook_bot, WebhookRequest(headers={}, body=json.dumps(payload).encode()))
        .messages
    )
    fresh = {"hops", "trace_id"}
    assert streamed.model_dump(exclude=fresh) == expected.model_dump(exclude=fresh)
    assert streamed.mentions_bot and streamed.text == "what is new"
    [opened] = gateway.opens
    assert opened["subscriptions"] == [{"type": "CALLBACK", "topic": "/v1.0/im/bot/messages/get"}]
    assert gateway.errors == []


async def test_a_frame_the_broker_never_took_is_not_acknowledged(
    gateway: StreamGateway, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = stream_bot(gateway.url)
    produced.hold = True
    failed = frames("produce_failed")
    async with running(redis_url, redis_prefix, produced, config, produce_patience=1.0):
        await until(lambda: gateway.live is not None, "connected")
        frame_id = await gateway.push(gateway.callback(message(text="lost")))

        async def fail_every_send() -> None:
            while frames("produce_failed") == failed:
                for ack in produced.acks:
                    if not ack.done():
                        ack.set_exception(ConnectionError("broker down"))
                await asyncio.sleep(0.05)

        await asyncio.wait_for(fail_every_send(), timeout=10)
        await asyncio.sleep(0.3)
        assert gateway.acks_for(frame_id) == []  # DingTalk will send it again
        # The connection goes on: the next message is produced and acknowledged.
        produced.hold = False
        next_id = await gateway.push(gateway.callback(message(text="next")))
        assert (await gateway.wait_ack(next_id))["code"] == 200
    assert gateway.errors == []


async def test_ping_is_answered_and_disconnect_reconnects_with_a_new_ticket(
    gateway: StreamGateway, redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = stream_bot(gateway.url)
    async with running(redis_url, redis_prefix, produced, config):
        await until(lambda: gateway.live is not None, "connected")
        ping_id = await gateway.push(gateway.system("ping", {"opaque": "p-123"}))
        pong = await gateway.wait_ack(ping_id)
        assert pong["code"] == 200 and json.loads(pong["data"]) == {"opaque": "p-123"}
        first = gateway.live
        await gateway.push(gateway.system("disconnect", {"reason": "redeploy"}))
        await until(lambda: len(gateway.opens) == 2 and gateway.live not in (None, first), "a new connection")
        assert all(gateway.tickets.values()) and len(gateway.tickets) == 2  # each ticket used once
        frame_id = await gateway.push(gateway.callback(message(text="after the reconnect")))
        assert (await gateway.wait_ack(frame_id))["code"] == 200
        # An event frame of a topic nobody subscribed: answered 404, nothing produced.
        other = await gateway.push(gateway.callback(message(text="x"), topic="/v1.0/card/instances/callback"))
        assert (await gateway.wait_ack(other))["code"] == 404
    assert [m.text for m in inbound(produced)] == ["after the reconnect"]
    assert gateway.refused_sockets == 0 and gateway.errors == []
    for ticket in gateway.tickets:
        assert ticket not in caplog.text and ticket.replace("+", "%2B") not in caplog.text


async def test_wrong_credentials_fail_the_dial(
    gateway: StreamGateway, redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    dial_failed = current(metrics.CONNECTION_HANDSHAKES.labels("dingtalk", "dial_failed"))
    config = stream_bot(gateway.url, secret="not-the-secret-of-this-app")
    async with running(redis_url, redis_prefix, produced, config):
        await until(
            lambda: current(metrics.CONNECTION_HANDSHAKES.labels("dingtalk", "dial_failed")) >= dial_failed + 1,
            "the dial failed",
        )
    assert gateway.sockets == [] and gateway.tickets == {} and inbound(produced) == []
    assert "not-the-secret-of-this-app" not in caplog.text


def test_settings_accept_the_stream_transport() -> None:
    config: dict[str, Any] = {"platform": "dingtalk", "bot_id": "dt1", "transport": "stream"}
    problems = get_platform("dingtalk").settings_problems(config)
    assert problems == []
    assert "stream" in get_platform("dingtalk").transports
