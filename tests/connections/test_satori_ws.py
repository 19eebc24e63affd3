"""Satori's event WebSocket against a stand-in (`satori_standin`): IDENTIFY with the token, READY,
PING/PONG, a message through the webhook path's parser, the `sn` committed only once the broker has
the message, a drop resumed from the last durable `sn` (what was not durable comes again), another
login's events ignored, a wrong token refused without a loop of IDENTIFYs, and a new holder resuming
where the last stopped. Leases on a real Redis; the producer is the recording stand-in of `conftest`."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from satori import At
from satori import Text as SatoriText

from pipeline.connections import satori as satori_ws
from pipeline.settings import BotConfig
from pipeline.state import ConnectionStore
from tests.platforms.test_satori import BOT, LOGIN_PLATFORM, OTHER_BOT, TOKEN, login, message_event

from .conftest import Produced
from .satori_standin import SatoriStandIn, Socket
from .standin_support import PeerGone, frames, same_message, webhook_messages
from .test_onebot_ws import inbound, running, until


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SatoriStandIn]:
    monkeypatch.setattr(satori_ws, "_COMMIT_GRACE", 0.5)
    monkeypatch.setattr(satori_ws, "PING_SECONDS", 0.2)
    # Each test starts with no memory of an earlier test's refused IDENTIFY (the transport is a singleton).
    monkeypatch.setattr(satori_ws.TRANSPORTS[("satori", "websocket")], "_refused", {})
    standin = SatoriStandIn(logins=[login(BOT), login(OTHER_BOT)])
    await standin.start()
    try:
        yield standin
    finally:
        await standin.stop()
        assert standin.errors == [], "frames or requests a Satori server would refuse"


def bot(server: SatoriStandIn, token: str = TOKEN, self_id: str = BOT) -> BotConfig:
    return BotConfig(
        platform="satori",
        bot_id="st1",
        self_id=self_id,
        transport="websocket",
        api_base=server.url,
        credentials={"token": token, "platform": LOGIN_PLATFORM},
    )


async def committed(store: ConnectionStore) -> dict[str, Any]:
    return json.loads(await store.resume_state("satori", "st1") or "{}")


async def until_committed(store: ConnectionStore, sn: int) -> None:
    for _ in range(250):
        if (await committed(store)).get("sn") == sn:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"resume state {await committed(store)}: sn never became {sn}")


def mention(n: int, self_id: str = BOT) -> dict[str, Any]:
    return message_event(
        [At(BOT), SatoriText(f" question {n}")], message_id=f"77000000000000000{n:02d}", self_id=self_id
    )


async def test_identify_ready_and_a_message_produced_its_sn_committed_once_on_the_broker(
    server: SatoriStandIn, store_url: str, redis_prefix: str, produced: Produced, store: ConnectionStore
) -> None:
    config = bot(server)
    produced.hold = True
    async with running(store_url, redis_prefix, produced, config):
        await until(lambda: bool(server.open_sockets()), "identified")
        assert server.identifies == [{"token": TOKEN}]  # nothing to resume yet
        await until(lambda: server.sockets[0].pings >= 2, "pinged")
        event = mention(1)
        sn = await server.send_event(event)
        await until(lambda: len(inbound(produced)) == 1, "produced")
        [message] = inbound(produced)
        [expected] = webhook_messages(config, dict(event, sn=sn))
        assert same_message(message, expected) and message.mentions_bot
        await asyncio.sleep(0.3)  # the broker has not acknowledged: nothing committed
        assert await committed(store) == {}
        for ack in produced.acks:
            ack.set_result(None)
        await until_committed(store, sn)


async def test_another_logins_events_and_other_events_advance_the_sn_and_produce_nothing(
    server: SatoriStandIn, store_url: str, redis_prefix: str, produced: Produced, store: ConnectionStore
) -> None:
    other_before = frames("satori", "other_login")
    async with running(store_url, redis_prefix, produced, bot(server)):
        await until(lambda: bool(server.open_sockets()), "identified")
        await server.send_event(mention(1, self_id=OTHER_BOT))
        sn = await server.send_event(message_event("gone", kind="message-deleted"))
        await until_committed(store, sn)
        assert inbound(produced) == []
        assert frames("satori", "other_login") == other_before + 1


async def test_a_drop_is_resumed_from_the_last_durable_sn_and_what_was_not_durable_comes_again(
    server: SatoriStandIn, store_url: str, redis_prefix: str, produced: Produced, store: ConnectionStore
) -> None:
    async with running(store_url, redis_prefix, produced, bot(server)):
        await until(lambda: bool(server.open_sockets()), "identified")
        durable = await server.send_event(mention(1))
        await until_committed(store, durable)
        produced.hold = True  # the next message reaches the producer, never the broker
        await server.send_event(mention(2))
        await until(lambda: len(inbound(produced)) == 2, "second produced")
        await server.drop()
        await until(lambda: len(server.identifies) == 2, "identified again")
        assert server.identifies[1] == {"token": TOKEN, "sn": durable}
        produced.hold = False
        await until(lambda: len(inbound(produced)) == 3, "sent again")
        assert [m.message_id for m in inbound(produced)][1:] == [mention(2)["message"]["id"]] * 2


async def test_a_wrong_token_is_refused_with_a_clear_error_and_no_loop(
    server: SatoriStandIn,
    store_url: str,
    redis_prefix: str,
    produced: Produced,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="pipeline.connections.satori"):
        async with running(store_url, redis_prefix, produced, bot(server, token="wrong")):
            await until(lambda: len(server.identifies) == 1, "identified")
            await asyncio.sleep(1.5)
            assert len(server.identifies) == 1  # dials fail at once for a while: no IDENTIFY loop
    assert "closed the socket (3000) instead of READY: is the token right?" in caplog.text
    assert "wrong" not in caplog.text  # never the token


async def test_a_login_the_server_does_not_have_is_an_error_naming_it(
    server: SatoriStandIn, store_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="pipeline.connections.satori"):
        async with running(store_url, redis_prefix, produced, bot(server, self_id="123")):
            await until(lambda: bool(server.open_sockets()), "identified")
    assert f"has no login {LOGIN_PLATFORM}/123" in caplog.text


async def test_a_new_holder_resumes_where_the_last_stopped(
    server: SatoriStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    async with running(redis_url, redis_prefix, produced, bot(server), holder="w1"):
        await until(lambda: bool(server.open_sockets()), "identified")
        sn = await server.send_event(mention(1))
        await until(lambda: len(inbound(produced)) == 1, "produced")
        await asyncio.sleep(0.2)
    missed = await server.send_event(mention(2))  # while nobody holds the socket
    async with running(redis_url, redis_prefix, produced, bot(server), holder="w2"):
        await until(lambda: len(server.identifies) == 2, "identified by the new holder")
        assert server.identifies[1] == {"token": TOKEN, "sn": sn}
        await until(lambda: len(inbound(produced)) == 2, "the missed event")
        assert inbound(produced)[1].message_id == mention(2)["message"]["id"] and missed == sn + 1


async def test_an_event_numbered_by_id_as_before_v1_2_is_committed_by_it(
    server: SatoriStandIn, store_url: str, redis_prefix: str, produced: Produced, store: ConnectionStore
) -> None:
    async with running(store_url, redis_prefix, produced, bot(server)):
        await until(lambda: bool(server.open_sockets()), "identified")
        event = mention(1)
        del event["sn"]
        old = dict(event, id=41)  # a v1.0/v1.1 server numbers events with `id`
        await server.open_sockets()[0].ws.send_json({"op": 0, "body": old})
        await until(lambda: len(inbound(produced)) == 1, "produced")
        await until_committed(store, 41)


async def test_the_stand_in_keeps_an_event_its_dead_socket_refused_for_the_next_identify() -> None:
    """As a Satori server: an event written into a socket whose peer is gone is kept (a client that
    identifies with an older `sn` gets it) and the send does not fail the caller (the tests' traffic
    runs straight through a holder's SIGKILL)."""
    standin = SatoriStandIn(logins=[login(BOT)])
    dead = Socket(id=0, ws=PeerGone(), opened=time.monotonic(), identified=True)  # type: ignore[arg-type]
    standin.sockets.append(dead)
    sn = await standin.send_event(message_event("m1"))
    assert dead.closed is not None and standin.open_sockets() == []
    assert [e["sn"] for e in standin.events] == [sn]
