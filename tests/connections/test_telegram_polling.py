"""Telegram `getUpdates` long polling (transport `polling`) against a stand-in Bot API that checks
requests the way Telegram does (`telegram_bot_api`), with the lease and the offset on a real Redis:
a polled update is the same inbound message its webhook would be; the offset is committed only
after the broker acknowledged, under the lease, and a new holder resumes from it; a second poller
(409 Conflict) and a webhook still set are logged, counted and backed off; network errors are
polled through again with backoff; the token never shows in a log."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import SecretStr
from telegram import Message, MessageEntity, Update

from pipeline import metrics
from pipeline.platforms import WebhookRequest, get_platform
from pipeline.settings import BotConfig
from tests.metric_values import current
from tests.platforms.test_telegram import ALICE, GROUP, TOKEN, WHEN

from .conftest import Produced
from .telegram_bot_api import BotApi
from .test_onebot_ws import inbound, running, until


def polling_bot(api_base: str, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="telegram",
        bot_id="tg1",
        self_id="777",
        username="switch_bot",
        transport="polling",
        credentials={"token": TOKEN},
        api_base=api_base,
        poll_timeout_seconds=1,
        **extra,
    )


def poll_errors(reason: str) -> float:
    return current(metrics.CONNECTION_POLL_ERRORS.labels("telegram", "tg1", reason))


@pytest.fixture
async def api() -> AsyncIterator[BotApi]:
    stand_in = await BotApi().start()
    try:
        yield stand_in
    finally:
        await stand_in.stop()


def group_mention(update_id: int) -> Update:
    text = "@switch_bot what is the time?"
    entity = MessageEntity(MessageEntity.MENTION, 0, len("@switch_bot"))
    return Update(update_id, message=Message(41, WHEN, GROUP, from_user=ALICE, text=text, entities=(entity,)))


async def test_polled_updates_are_the_webhooks_messages_and_the_offset_waits_for_the_broker(
    api: BotApi, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = polling_bot(api.url)
    produced.hold = True  # the broker has not acknowledged yet
    first = api.add(api.private_text(1, "hello"))
    second = api.add(group_mention(first["update_id"] + 1))
    async with running(redis_url, redis_prefix, produced, config) as connections:
        await until(lambda: len(inbound(produced)) == 2, "both updates produced")
        await asyncio.sleep(0.5)
        # Nothing committed and no further poll while the broker has not acknowledged them.
        assert await connections.store.committed_offset("telegram", "tg1") is None
        assert all("offset" not in p for p in api.polls) and len(api.polls) == 1
        for ack in produced.acks:
            ack.set_result(None)
        await until(lambda: api.pending == [], "confirmed by the next poll")
        assert await connections.store.committed_offset("telegram", "tg1") == second["update_id"] + 1
        [value] = await connections.store.holders([("telegram", "tg1", "event")])
        assert value is not None and value.holder == "w1"
    polled = inbound(produced)
    # What the webhook would have produced from the same updates, with the same parser.
    platform = get_platform("telegram")
    webhook_bot = config.model_copy(update={"transport": "webhook"})
    expected = [
        platform.parse(webhook_bot, WebhookRequest(headers={}, body=Update.de_json(u, None).to_json().encode()))
        for u in (first, second)
    ]
    # The same message but for the trace id (new per message) and the hop timestamps.
    fresh = {"hops", "trace_id"}
    assert [m.model_dump(exclude=fresh) for m in polled] == [r.messages[0].model_dump(exclude=fresh) for r in expected]
    assert polled[0].conversation_key == "telegram:tg1:60001" and polled[1].mentions_bot
    assert api.polls[0] == {"timeout": 1, "limit": 100, "allowed_updates": ["message"]}
    assert api.polls[1]["offset"] == second["update_id"] + 1
    assert api.served[first["update_id"]] == 1 and api.errors == [] and api.conflicts == 0
    assert api.calls[0] == "getMe" and "deleteWebhook" not in api.calls


async def test_a_new_holder_resumes_from_the_committed_offset_and_a_stale_one_cannot_move_it(
    api: BotApi, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = polling_bot(api.url)
    first = api.add(api.private_text(1, "one"))
    async with running(redis_url, redis_prefix, produced, config) as connections:
        await until(lambda: api.pending == [] and len(api.polls) >= 2, "the first update confirmed")
        [old] = await connections.store.holders([("telegram", "tg1", "event")])
        assert old is not None
    # Nobody polls now; Telegram keeps what comes meanwhile.
    second = api.add(api.private_text(2, "two"))
    polls_before = len(api.polls)
    async with running(redis_url, redis_prefix, produced, config, holder="w2") as connections:
        await until(lambda: api.pending == [] and len(api.polls) > polls_before + 1, "the second confirmed")
        resumed = api.polls[polls_before]
        assert resumed["offset"] == first["update_id"] + 1  # from Redis, not from the start
        # The earlier holder's fencing token no longer moves it.
        stale = await connections.store.commit_offset("telegram", "tg1", "event", old.owner, 1)
        assert stale is False
        assert await connections.store.committed_offset("telegram", "tg1") == second["update_id"] + 1
    assert [m.text for m in inbound(produced)] == ["one", "two"]
    assert api.served[first["update_id"]] == 1 and api.served[second["update_id"]] == 1


async def test_a_second_poller_is_a_conflict_logged_counted_and_backed_off(
    api: BotApi, redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    config = polling_bot(api.url)
    conflicts = poll_errors("conflict")
    caplog.set_level(logging.INFO)
    async with running(redis_url, redis_prefix, produced, config):
        await until(lambda: len(api.polls) >= 1, "polling")
        await asyncio.sleep(0.2)
        # Someone else polls with the same token (another deployment): Telegram ends our poll.
        async with aiohttp.ClientSession() as http:
            rogue = await http.post(f"{api.url}/bot{TOKEN}/getUpdates", json={"timeout": 0})
            assert rogue.status == 200
        await until(lambda: poll_errors("conflict") == conflicts + 1, "the conflict counted")
        polls = len(api.polls)
        await asyncio.sleep(0.5)
        assert len(api.polls) == polls  # backing off, not polling at once
        api.add(api.private_text(3, "after the conflict"))
        await until(lambda: len(inbound(produced)) == 1, "polling again, the lease still held", timeout=10)
    assert api.conflicts == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("another getUpdates poller uses this bot's token" in e for e in errors), errors
    assert TOKEN not in caplog.text


async def test_a_webhook_still_set_is_an_error_unless_the_bot_opted_in_to_delete_it(
    redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    api = await BotApi(webhook_url="https://example.org/webhooks/telegram/tg1").start()
    try:
        api.add(api.private_text(4, "waiting behind a webhook"))
        refused = poll_errors("webhook_active")
        async with running(redis_url, redis_prefix, produced, polling_bot(api.url)):
            await until(lambda: poll_errors("webhook_active") > refused, "the webhook refusal counted")
        assert inbound(produced) == [] and api.deleted_webhook == [] and api.webhook_url
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("a webhook is set" in e and "delete_webhook = true" in e for e in errors), errors
        # Opted in: deleted at start, the pending update kept and polled.
        async with running(redis_url, redis_prefix, produced, polling_bot(api.url, delete_webhook=True)):
            await until(lambda: len(inbound(produced)) == 1, "polled once the webhook is gone")
        assert api.deleted_webhook == [{"drop_pending_updates": False}] and api.webhook_url == ""
        assert api.errors == []
    finally:
        await api.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_network_errors_are_polled_through_with_backoff_and_the_token_never_logged(
    redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = _free_port()
    api = await BotApi().start(port=port)
    network, reconnects = poll_errors("network"), metrics.CONNECTION_RECONNECTS.labels("telegram", "polling")
    reconnects_before = current(reconnects)
    try:
        async with running(redis_url, redis_prefix, produced, polling_bot(api.url)):
            await until(lambda: len(api.polls) >= 1, "polling")
            await api.stop()  # the Bot API is unreachable for a while
            await until(lambda: poll_errors("network") >= network + 2, "network errors counted")
            api = await BotApi().start(port=port)
            api.add(api.private_text(5, "after the outage"))
            await until(lambda: len(inbound(produced)) == 1, "polled again", timeout=20)
        assert current(reconnects) >= reconnects_before + 2
    finally:
        await api.stop()
    assert "getUpdates failed (network" in caplog.text and TOKEN not in caplog.text


async def test_a_wrong_token_fails_the_dial_without_showing_it(
    api: BotApi, redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "999999:WRONG-token-never-logged"
    config = polling_bot(api.url).model_copy(update={"credentials": {"token": SecretStr(wrong)}})
    unauthorized = poll_errors("unauthorized")
    async with running(redis_url, redis_prefix, produced, config):
        await until(lambda: poll_errors("unauthorized") >= unauthorized + 2, "refused dials counted")
    assert "getUpdates" not in api.calls and api.errors  # only getMe was tried, and refused
    assert wrong not in caplog.text and "is the bot's token right?" in caplog.text


async def test_server_errors_and_rate_limits_are_waited_out(
    api: BotApi, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    api.scripted = [
        web.json_response({"ok": False, "error_code": 502, "description": "Bad Gateway"}, status=502),
        web.json_response(
            {
                "ok": False,
                "error_code": 429,
                "description": "Too Many Requests: retry after 1",
                "parameters": {"retry_after": 1},
            },
            status=429,
        ),
        web.json_response({"ok": True, "result": {"not": "a list"}}),
    ]
    before = {reason: poll_errors(reason) for reason in ("server_error", "rate_limited", "bad_response")}
    api.add(api.private_text(6, "after the errors"))
    started = asyncio.get_running_loop().time()
    async with running(redis_url, redis_prefix, produced, polling_bot(api.url)):
        await until(lambda: len(inbound(produced)) == 1, "polled after the errors", timeout=15)
    # Backed off each time (1 s, then Telegram's retry_after of 1 s, then 4 s), never polled in a
    # loop: the fourth poll got the update (a fifth, with its offset, may have confirmed it).
    assert asyncio.get_running_loop().time() - started >= 6.0
    assert len(api.polls) in (4, 5) and api.served == {900_000: 1}
    assert {reason: poll_errors(reason) - count for reason, count in before.items()} == {
        "server_error": 1,
        "rate_limited": 1,
        "bad_response": 1,
    }
