"""Discord's Gateway against a stand-in (`discord_standin`): IDENTIFY with the token and intents,
heartbeats, a message through the webhook path's parser, the sequence committed only once the broker
has the message, RESUME after a drop (replaying what was not durable), RECONNECT, INVALID_SESSION,
a missing heartbeat ACK, fatal close codes, and a new holder resuming the last one's session. Leases
on a real Redis; the producer is the recording stand-in of `conftest`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pipeline.connections import discord as gateway
from pipeline.settings import BotConfig
from pipeline.state import ConnectionStore
from tests.platforms.test_discord import BOT_USER, PUBLIC_KEY, TOKEN, dispatch, message_create

from .conftest import Produced
from .discord_standin import DiscordGatewayStandIn
from .standin_support import same_message, webhook_messages
from .test_onebot_ws import inbound, running, until


@pytest.fixture
async def discord_gateway(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DiscordGatewayStandIn]:
    monkeypatch.setattr(gateway, "_COMMIT_GRACE", 0.5)
    monkeypatch.setattr(gateway, "INVALID_SESSION_WAIT", (0.01, 0.05))
    # Each test starts with no memory of an earlier test's fatal close (the transport is a singleton).
    monkeypatch.setattr(gateway.TRANSPORTS[("discord", "gateway")], "_fatal", {})
    standin = DiscordGatewayStandIn()
    await standin.start()
    try:
        yield standin
    finally:
        await standin.stop()
        assert standin.errors == [], "frames Discord would refuse"


def bot(standin: DiscordGatewayStandIn, token: str = TOKEN) -> BotConfig:
    return BotConfig(
        platform="discord",
        bot_id="dc1",
        self_id=BOT_USER,
        transport="gateway",
        api_base=standin.url,
        credentials={"token": token, "public_key": PUBLIC_KEY},
    )


async def committed(store: ConnectionStore) -> dict[str, Any]:
    return json.loads(await store.resume_state("discord", "dc1") or "{}")


async def until_committed(store: ConnectionStore, field: str, value: Any) -> None:
    """Until the resume state in Redis has `field` = `value` (written by another task)."""
    for _ in range(250):
        if (await committed(store)).get(field) == value:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"resume state {await committed(store)}: {field} never became {value!r}")


def mention(n: int) -> dict[str, Any]:
    return message_create(f"<@{BOT_USER}> question {n}", id=f"77000000000000000{n:02d}")


async def test_identify_then_a_message_is_produced_and_its_sequence_committed_once_on_the_broker(
    discord_gateway: DiscordGatewayStandIn,
    store_url: str,
    redis_prefix: str,
    produced: Produced,
    store: ConnectionStore,
) -> None:
    config = bot(discord_gateway)
    produced.hold = True
    async with running(store_url, redis_prefix, produced, config):
        await until(lambda: len(discord_gateway.identifies) == 1, "identified")
        assert discord_gateway.gateway_requests == [f"Bot {TOKEN}"]
        await until(lambda: bool(discord_gateway.sessions), "ready")
        [session] = discord_gateway.sessions
        await until(lambda: discord_gateway.sockets[0].heartbeats != [], "first heartbeat (after the jitter)")
        d = mention(1)
        seq = await discord_gateway.send_message(d)
        await until(lambda: len(inbound(produced)) == 1, "produced")
        [message] = inbound(produced)
        [expected] = webhook_messages(config, json.loads(dispatch(d, seq)))
        assert same_message(message, expected) and message.mentions_bot
        await asyncio.sleep(0.3)  # the broker has not acknowledged: the sequence stays before it
        assert (await committed(store)) == {
            "session_id": session,
            "resume_gateway_url": f"{discord_gateway.url.replace('http', 'ws')}/resume",
            "seq": seq - 1,
        }
        for ack in produced.acks:
            ack.set_result(None)
        await until_committed(store, "seq", seq)


async def test_a_drop_is_resumed_and_what_was_not_durable_comes_again(
    discord_gateway: DiscordGatewayStandIn,
    store_url: str,
    redis_prefix: str,
    produced: Produced,
    store: ConnectionStore,
) -> None:
    async with running(store_url, redis_prefix, produced, bot(discord_gateway)):
        await until(lambda: bool(discord_gateway.sessions), "ready")
        [session] = discord_gateway.sessions
        durable = await discord_gateway.send_message(mention(1))
        await until(lambda: len(inbound(produced)) == 1, "first produced")
        await until_committed(store, "seq", durable)
        produced.hold = True  # the next message reaches the producer, never the broker
        await discord_gateway.send_message(mention(2))
        await until(lambda: len(inbound(produced)) == 2, "second produced")
        await discord_gateway.drop(4000)
        await until(lambda: len(discord_gateway.resumes) == 1, "resumed")
        assert discord_gateway.resumes[0] == {"token": TOKEN, "session_id": session, "seq": durable}
        assert len(discord_gateway.identifies) == 1  # resumed, not a new session
        produced.hold = False
        # The message that was not durable is sent again; ingest drops the copy by message id.
        await until(lambda: len(inbound(produced)) == 3, "replayed")
        assert [m.message_id for m in inbound(produced)][1:] == [mention(2)["id"]] * 2


async def test_reconnect_and_invalid_session(
    discord_gateway: DiscordGatewayStandIn,
    store_url: str,
    redis_prefix: str,
    produced: Produced,
    store: ConnectionStore,
) -> None:
    async with running(store_url, redis_prefix, produced, bot(discord_gateway)):
        await until(lambda: bool(discord_gateway.sessions), "ready")
        [first] = discord_gateway.sessions
        await discord_gateway.send_op(7)  # RECONNECT: the client closes and resumes
        await until(lambda: len(discord_gateway.resumes) == 1, "resumed after RECONNECT")
        assert discord_gateway.resumes[0]["session_id"] == first
        await until(lambda: len(discord_gateway.open_sockets()) == 1, "one socket")
        await discord_gateway.send_op(9, False)  # INVALID_SESSION, not resumable: IDENTIFY again
        # Discord asks for a heartbeat: read after the new IDENTIFY, its sequence must be the new
        # session's (null before READY), never the old session's (the stand-in refuses that).
        await discord_gateway.send_op(1)
        await until(lambda: len(discord_gateway.identifies) == 2, "identified again")
        await until(lambda: len(discord_gateway.sessions) == 2, "a new session")
        second = list(discord_gateway.sessions)[1]
        await until_committed(store, "session_id", second)
        seq = await discord_gateway.send_message(mention(3))
        await until(lambda: len(inbound(produced)) == 1, "produced on the new session")
        assert inbound(produced)[0].message_id == mention(3)["id"] and seq > 1


async def test_a_missing_heartbeat_ack_ends_the_connection_and_it_resumes(
    discord_gateway: DiscordGatewayStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    discord_gateway.heartbeat_ms = 200
    async with running(redis_url, redis_prefix, produced, bot(discord_gateway)):
        await until(lambda: bool(discord_gateway.sessions), "ready")
        await until(lambda: discord_gateway.sockets[0].heartbeats != [], "heartbeat")
        discord_gateway.ack_heartbeats = False  # Discord went silent
        await until(lambda: discord_gateway.sockets[0].closed is not None, "closed by the client")
        assert discord_gateway.sockets[0].close_code == gateway.RESUMABLE_CLOSE
        discord_gateway.ack_heartbeats = True
        await until(lambda: len(discord_gateway.resumes) == 1, "resumed")


async def test_disallowed_intents_and_a_wrong_token_are_fatal_with_a_clear_error(
    discord_gateway: DiscordGatewayStandIn,
    store_url: str,
    redis_prefix: str,
    produced: Produced,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    discord_gateway.close_after_identify = 4014
    with caplog.at_level(logging.ERROR, logger="pipeline.connections.discord"):
        async with running(store_url, redis_prefix, produced, bot(discord_gateway)):
            await until(lambda: len(discord_gateway.identifies) == 1, "identified")
            await asyncio.sleep(1.5)
            assert len(discord_gateway.identifies) == 1  # no loop of IDENTIFYs
        assert "4014" in caplog.text and "MESSAGE CONTENT intent" in caplog.text
        caplog.clear()
        monkeypatch.setattr(gateway.TRANSPORTS[("discord", "gateway")], "_fatal", {})
        async with running(store_url, redis_prefix, produced, bot(discord_gateway, token="wrong")):
            await until(lambda: len(discord_gateway.gateway_requests) >= 1, "asked for the Gateway URL")
            await asyncio.sleep(0.5)
        assert "the bot token is wrong" in caplog.text
    assert len(discord_gateway.sockets) == 1  # the wrong token never reached a socket


async def test_a_new_holder_resumes_the_last_holders_session(
    discord_gateway: DiscordGatewayStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    async with running(redis_url, redis_prefix, produced, bot(discord_gateway), holder="w1"):
        await until(lambda: bool(discord_gateway.sessions), "ready")
        [session] = discord_gateway.sessions
        seq = await discord_gateway.send_message(mention(1))
        await until(lambda: len(inbound(produced)) == 1, "produced")
        await asyncio.sleep(0.2)
    assert discord_gateway.sockets[0].close_code == gateway.RESUMABLE_CLOSE  # not 1000: resumable
    async with running(redis_url, redis_prefix, produced, bot(discord_gateway), holder="w2"):
        await until(lambda: len(discord_gateway.resumes) == 1, "resumed by the new holder")
        assert discord_gateway.resumes[0] == {"token": TOKEN, "session_id": session, "seq": seq}
        assert len(discord_gateway.identifies) == 1


async def test_an_unreachable_resume_url_falls_back_to_a_new_session(
    discord_gateway: DiscordGatewayStandIn,
    store_url: str,
    redis_prefix: str,
    produced: Produced,
    store: ConnectionStore,
) -> None:
    stale = {"session_id": "gone", "resume_gateway_url": "ws://127.0.0.1:9/nothing", "seq": 41}
    await store.redis.execute("SET", store.keys.resume("discord", "dc1"), json.dumps(stale))
    async with running(store_url, redis_prefix, produced, bot(discord_gateway)):
        await until(lambda: len(discord_gateway.identifies) == 1, "identified instead")
        await until(lambda: bool(discord_gateway.sessions), "ready")
        [session] = discord_gateway.sessions
        await until_committed(store, "session_id", session)
    assert discord_gateway.resumes == []


async def test_each_shard_is_a_bot_entry_with_its_own_connection_and_gets_its_guilds(
    discord_gateway: DiscordGatewayStandIn,
    store_url: str,
    redis_prefix: str,
    produced: Produced,
) -> None:
    discord_gateway.shards = 2
    shards = [bot(discord_gateway).model_copy(update={"bot_id": f"dc-s{i}", "shard": (i, 2)}) for i in range(2)]
    async with running(store_url, redis_prefix, produced, *shards):
        await until(lambda: len([s for s in discord_gateway.sockets if s.session]) == 2, "both shards ready")
        assert sorted(tuple(d["shard"]) for d in discord_gateway.identifies) == [(0, 2), (1, 2)]
        # Guild ids whose shard is 0 and 1: (guild_id >> 22) % 2.
        for n, guild in enumerate((str(4 << 22), str(5 << 22))):
            await discord_gateway.send_routed({**mention(n), "guild_id": guild})
        await until(lambda: len(inbound(produced)) == 2, "both produced")
        by_guild = {m.route.get("guild_id"): m.bot_id for m in inbound(produced)}
        assert by_guild == {str(4 << 22): "dc-s0", str(5 << 22): "dc-s1"}


def test_a_shard_outside_its_count_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"shard \[2, 2\]: needs 0 <= index < count"):
        BotConfig(platform="discord", bot_id="x", shard=(2, 2))
