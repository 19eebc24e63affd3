"""OneBot v11 over WebSocket, against a stand-in implementation speaking both directions
(`pipeline.bench.onebot_peer`): forward (Switchboard dials its server with the access token) and
reverse (it dials a worker's `/onebot/ws/{bot_id}`, universal or split roles). Events are the v11
spec's (the fixtures of tests/platforms/test_onebot.py), parsed by the webhook's parser and produced
to `im.inbound`; meta events are handled, never produced; actions go out with an `echo` and are
checked by the stand-in with the HTTP API stand-in's checker. Leases on a real Redis."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web

from pipeline import metrics
from pipeline.bench.onebot_peer import OneBotPeer
from pipeline.connections import Connections, open_connections
from pipeline.connections.base import Link
from pipeline.connections.onebot import OneBotSocket
from pipeline.platforms.onebot import OneBotPlatform
from pipeline.records import InboundMessage
from pipeline.settings import BotConfig, Settings
from pipeline.stages.outputs import Outputs
from pipeline.state import RedisClient, redis_py_client
from pipeline.topics import DEADLETTER, IM_INBOUND
from pipeline.web.connections import add_connection_routes
from tests.metric_values import current
from tests.platforms.conftest import Seen, load_media
from tests.platforms.test_onebot import SPEC_PRIVATE, TOKEN, check_onebot, group_event, outbound

from .conftest import Produced

SELF_ID = 10001000


def check_action(action: str, params: Mapping[str, Any]) -> None:
    """The HTTP API stand-in's checks (segments, file fields, targets) on a WebSocket action; the
    token was checked when the socket opened."""
    body = json.dumps(params).encode()
    seen = Seen(
        method="POST",
        path=f"/{action}",
        query={},
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
        body=body,
        json=json.loads(body),
    )
    status, answer = check_onebot(seen)
    assert status == 200, answer


def bot(transport: str, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="onebot",
        bot_id="qq1",
        self_id=str(SELF_ID),
        transport=transport,
        credentials={"access_token": TOKEN},
        **extra,
    )


@asynccontextmanager
async def running(
    redis_url: str,
    redis_prefix: str,
    produced: Produced,
    *bots: BotConfig,
    lease: float = 3.0,
    holder: str = "w1",
    produce_patience: float = 30.0,
) -> AsyncIterator[Connections]:
    settings = Settings(
        bots=list(bots),
        redis_prefix=redis_prefix,
        connection_lease_seconds=lease,
        connection_produce_patience_seconds=produce_patience,
        connection_acquire_interval_seconds=0.2,
        connection_action_timeout_seconds=5.0,
    )
    quick = RedisClient(redis_url)
    blocking = redis_py_client(redis_url, decode_responses=True, socket_timeout=30)
    connections = open_connections(settings, quick, blocking, produced.send, Outputs(produced.send), holder=holder)
    await connections.start()
    try:
        yield connections
    finally:
        await connections.stop()
        await quick.aclose()
        await blocking.aclose()


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` served on a free loopback port; yields its ws:// base."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"ws://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def web_app(connections: Connections) -> AsyncIterator[str]:
    """A worker's web server with the long-connection routes; yields its ws:// base."""
    app = web.Application()
    add_connection_routes(app, connections)
    async with serving(app) as base:
        yield base


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)  # state of other tasks and processes: nothing to wait on


def inbound(produced: Produced) -> list[InboundMessage]:
    return [InboundMessage.model_validate_json(v) for topic, _, v in produced.records if topic == IM_INBOUND]


def frames(outcome: str) -> float:
    return current(metrics.CONNECTION_FRAMES.labels("onebot", outcome))


async def reply_through_the_platform(connections: Connections, bot_config: BotConfig, text: str) -> list[Any]:
    """Egress's path: render, then `send` with the platform bound to the router, as a worker does."""
    platform = OneBotPlatform()
    platform.bind(connections.router)
    message = outbound([{"type": "text", "data": {"text": text}}], chat_id="group_123456")
    async with httpx.AsyncClient() as http:
        return [
            await platform.send(bot_config, call, http, load_media) for call in platform.render(bot_config, message)
        ]


# -- forward -------------------------------------------------------------------------------------


@pytest.fixture
async def napcat_server() -> AsyncIterator[OneBotPeer]:
    peer = OneBotPeer(self_id=SELF_ID, access_token=TOKEN, heartbeat_interval=0.3, check_action=check_action)
    await peer.serve()
    try:
        yield peer
    finally:
        await peer.stop()


async def test_forward_dials_with_the_token_and_carries_events_and_actions(
    napcat_server: OneBotPeer, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = bot("ws-forward", api_base=napcat_server.url)
    heartbeats, metas = frames("heartbeat"), frames("meta")
    async with running(redis_url, redis_prefix, produced, config) as connections:
        await napcat_server.wait_until(lambda: len(napcat_server.open_sockets()) == 1, 5, "dialed")
        [value] = await connections.store.holders([("onebot", "qq1", "api")])
        assert value is not None and value.holder == "w1"
        await napcat_server.send_event(dict(SPEC_PRIVATE))
        await napcat_server.send_event(
            group_event([{"type": "at", "data": {"qq": str(SELF_ID)}}, {"type": "text", "data": {"text": " hi"}}])
        )
        await until(lambda: len(inbound(produced)) == 2, "both events produced")
        private, group = inbound(produced)
        assert private.conversation_key == "onebot:qq1:private_12345678" and private.text == "你好\uff5e"
        assert group.chat_id == "group_123456" and group.mentions_bot
        await until(lambda: frames("heartbeat") > heartbeats, "a heartbeat handled")
        outcomes = await reply_through_the_platform(connections, config, "echo: hi")
        assert [o.status for o in outcomes] == ["delivered"] and outcomes[0].platform_message_id
        [action] = napcat_server.actions
        assert action.action == "send_group_msg" and action.params["group_id"] == 123456
        assert action.params["message"] == [{"type": "text", "data": {"text": "echo: hi"}}]
    # Meta events (lifecycle, heartbeats) were handled, never produced; one socket all along.
    assert frames("meta") > metas and len(inbound(produced)) == 2 and len(napcat_server.sockets) == 1
    assert napcat_server.errors == [] and napcat_server.refused == []


async def test_forward_without_the_token_is_refused_and_the_bot_shows_no_holder(
    napcat_server: OneBotPeer, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = BotConfig(platform="onebot", bot_id="qq9", transport="ws-forward", api_base=napcat_server.url)
    failed = current(metrics.CONNECTION_HANDSHAKES.labels("onebot", "dial_failed"))
    async with running(redis_url, redis_prefix, produced, config):
        await until(lambda: len(napcat_server.refused) >= 2, "dials refused")
        await asyncio.sleep(1.2)  # the holders gauge is exported every second
        assert current(metrics.CONNECTION_HOLDER_MISSING.labels("onebot", "qq9")) == 1
    assert napcat_server.sockets == [] and set(napcat_server.refused) == {"bad_token"}
    assert current(metrics.CONNECTION_HANDSHAKES.labels("onebot", "dial_failed")) >= failed + 2


async def test_forward_redials_when_the_implementation_drops_the_socket(
    napcat_server: OneBotPeer, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = bot("ws-forward", api_base=napcat_server.url)
    reconnects = current(metrics.CONNECTION_RECONNECTS.labels("onebot", "ws-forward"))
    async with running(redis_url, redis_prefix, produced, config):
        await napcat_server.wait_until(lambda: len(napcat_server.open_sockets()) == 1, 5, "dialed")
        await napcat_server.drop()
        await napcat_server.wait_until(
            lambda: len(napcat_server.sockets) == 2 and len(napcat_server.open_sockets()) == 1, 5, "redialed"
        )
        await napcat_server.send_event(dict(SPEC_PRIVATE, message_id=77))
        await until(lambda: [m.message_id for m in inbound(produced)] == ["77"], "produced after the redial")
    assert current(metrics.CONNECTION_RECONNECTS.labels("onebot", "ws-forward")) == reconnects + 1


# -- reverse -------------------------------------------------------------------------------------


async def test_reverse_universal_connection_carries_events_and_actions(
    redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = bot("ws-reverse")
    peer = OneBotPeer(self_id=SELF_ID, access_token=TOKEN, check_action=check_action)
    async with running(redis_url, redis_prefix, produced, config) as connections, web_app(connections) as base:
        peer.dial([f"{base}/onebot/ws/qq1"])
        try:
            await peer.wait_until(lambda: len(peer.open_sockets()) == 1, 5, "accepted")
            await until(lambda: current(metrics.CONNECTIONS_HELD.labels("onebot", "ws-reverse")) == 1, "held")
            await peer.send_event(dict(SPEC_PRIVATE, message_id=5))
            await until(lambda: len(inbound(produced)) == 1, "produced")
            outcomes = await reply_through_the_platform(connections, config, "pong")
            assert [o.status for o in outcomes] == ["delivered"]
            assert [a.action for a in peer.actions] == ["send_group_msg"]
        finally:
            await peer.stop()
    assert peer.errors == []


async def test_an_event_whose_produce_fails_while_the_broker_is_away_is_produced_once_it_is_back(
    redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    """OneBot acknowledges nothing: an event read from the socket is the only copy there is, so a
    failed produce (a leader election, a broker restart) is sent again, not dropped."""
    config = bot("ws-reverse")
    peer = OneBotPeer(self_id=SELF_ID, access_token=TOKEN, check_action=check_action)
    retried = frames("produce_retried")
    async with running(redis_url, redis_prefix, produced, config) as connections, web_app(connections) as base:
        peer.dial([f"{base}/onebot/ws/qq1"])
        try:
            await peer.wait_until(lambda: len(peer.open_sockets()) == 1, 5, "accepted")
            produced.hold = True
            await peer.send_event(dict(SPEC_PRIVATE, message_id=7))
            for attempt in range(1, 4):  # the broker refuses three sends in a row (about 3.5 s of backoff)
                await until(lambda n=attempt: len(produced.acks) == n, f"send {attempt}")  # type: ignore[misc]
                produced.acks[-1].set_exception(ConnectionError("leader not available"))
            await until(lambda: len(produced.acks) == 4, "sent a fourth time")
            produced.acks[-1].set_result(None)
            await until(lambda: frames("produced") >= 1 and frames("produce_retried") == retried + 3, "produced")
            assert [m.message_id for m in inbound(produced)] == ["7"] * 4  # ingest keeps one by message id
            assert frames("produce_failed") == 0
        finally:
            await peer.stop()
    assert peer.errors == []


async def test_reverse_split_roles_hold_both_channels(redis_url: str, redis_prefix: str, produced: Produced) -> None:
    config = bot("ws-reverse")
    peer = OneBotPeer(self_id=SELF_ID, access_token=TOKEN, check_action=check_action)
    async with running(redis_url, redis_prefix, produced, config) as connections, web_app(connections) as base:
        peer.dial([f"{base}/onebot/ws/qq1"], roles=("Event", "API"))
        try:
            await peer.wait_until(lambda: {s.role for s in peer.open_sockets()} == {"event", "api"}, 5, "both roles")
            await until(lambda: current(metrics.CONNECTIONS_HELD.labels("onebot", "ws-reverse")) == 2, "both held")
            values = await connections.store.holders([("onebot", "qq1", "api"), ("onebot", "qq1", "event")])
            assert all(v is not None and v.state == "up" for v in values) and values[0] != values[1]
            await peer.send_event(dict(SPEC_PRIVATE, message_id=6))
            await until(lambda: len(inbound(produced)) == 1, "produced from the event socket")
            outcomes = await reply_through_the_platform(connections, config, "split")
            assert [o.status for o in outcomes] == ["delivered"]
            [action] = peer.actions
            assert next(s for s in peer.sockets if s.id == action.socket).role == "api"
        finally:
            await peer.stop()
    assert peer.errors == []


async def test_reverse_newest_connection_wins(redis_url: str, redis_prefix: str, produced: Produced) -> None:
    config = bot("ws-reverse")
    first, second = (OneBotPeer(self_id=SELF_ID, access_token=TOKEN, reconnect_interval=30) for _ in range(2))
    async with (
        running(redis_url, redis_prefix, produced, config, lease=1.5) as connections,
        web_app(connections) as base,
    ):
        try:
            first.dial([f"{base}/onebot/ws/qq1"])
            await first.wait_until(lambda: len(first.open_sockets()) == 1, 5, "first accepted")
            # "Newest" is the order the leases are taken in: wait until the first one holds.
            await until(lambda: current(metrics.CONNECTIONS_HELD.labels("onebot", "ws-reverse")) == 1, "held")
            second.dial([f"{base}/onebot/ws/qq1"])
            # The earlier socket is closed by its holder at its next renewal (a third of the lease).
            await first.wait_until(lambda: not first.open_sockets(), 3, "the older socket closed")
            assert len(second.open_sockets()) == 1
            [value] = await connections.store.holders([("onebot", "qq1", "api")])
            assert value is not None and value.token == 2
        finally:
            await first.stop()
            await second.stop()


@pytest.mark.parametrize(
    ("path", "headers", "status", "reason"),
    [
        ("/onebot/ws/qq1", {}, 401, "missing_token"),
        ("/onebot/ws/qq1", {"Authorization": "Bearer "}, 401, "missing_token"),
        ("/onebot/ws/qq1", {"Authorization": "Bearer wrong"}, 401, "bad_token"),
        ("/onebot/ws/qq1?access_token=wrong", {}, 401, "bad_token"),
        ("/onebot/ws/qq1", {"Authorization": f"Bearer {TOKEN}", "X-Client-Role": "Admin"}, 400, "bad_role"),
        ("/onebot/ws/qq1/event", {"Authorization": f"Bearer {TOKEN}", "X-Client-Role": "API"}, 400, "bad_role"),
        ("/onebot/ws/qq1", {"Authorization": f"Bearer {TOKEN}", "X-Self-ID": "42"}, 403, "self_id_mismatch"),
        ("/onebot/ws/hook", {"Authorization": f"Bearer {TOKEN}"}, 404, "not_a_connection_bot"),
        ("/onebot/ws/nobody", {"Authorization": f"Bearer {TOKEN}"}, 404, "not_a_connection_bot"),
    ],
)
async def test_reverse_handshakes_refused(
    redis_url: str,
    redis_prefix: str,
    produced: Produced,
    path: str,
    headers: dict[str, str],
    status: int,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    webhook_bot = BotConfig(platform="onebot", bot_id="hook", credentials={"access_token": TOKEN})
    before = current(metrics.CONNECTION_HANDSHAKES.labels("onebot", reason))
    async with running(redis_url, redis_prefix, produced, bot("ws-reverse"), webhook_bot) as connections:
        async with web_app(connections) as base, aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(base + path, headers=headers)
    assert refused.value.status == status
    assert current(metrics.CONNECTION_HANDSHAKES.labels("onebot", reason)) == before + 1
    assert TOKEN not in caplog.text and "wrong" not in caplog.text


@pytest.mark.parametrize(
    ("headers", "answer"),
    [({}, "missing_token"), ({"Authorization": "Bearer wrong"}, "bad_token")],
)
async def test_the_refusal_says_whether_the_token_is_missing_or_wrong(
    redis_url: str, redis_prefix: str, produced: Produced, headers: dict[str, str], answer: str
) -> None:
    # What someone setting up NapCat reads with curl: a missing token is told apart from a wrong one.
    async with running(redis_url, redis_prefix, produced, bot("ws-reverse")) as connections:
        async with web_app(connections) as base, aiohttp.ClientSession() as http:
            async with http.get(f"{base}/onebot/ws/qq1", headers=headers) as response:
                assert response.status == 401
                assert await response.json() == {"error": answer}


async def test_reverse_token_in_the_query_is_accepted(redis_url: str, redis_prefix: str, produced: Produced) -> None:
    async with running(redis_url, redis_prefix, produced, bot("ws-reverse")) as connections:
        async with web_app(connections) as base, aiohttp.ClientSession() as http:
            ws = await http.ws_connect(
                f"{base}/onebot/ws/qq1?access_token={TOKEN}", headers={"X-Self-ID": str(SELF_ID)}
            )
            await until(lambda: current(metrics.CONNECTIONS_HELD.labels("onebot", "ws-reverse")) == 1, "held")
            await ws.close()


# -- one socket ----------------------------------------------------------------------------------


class Captured(Link):
    def __init__(self) -> None:
        self.bot = bot("ws-forward")
        self.bodies: list[bytes] = []
        self.heartbeats = 0

    async def submit(self, body: bytes) -> Awaitable[Any]:
        self.bodies.append(body)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    def alive(self) -> None:
        self.heartbeats += 1


@asynccontextmanager
async def raw_server(handler: Callable[[web.WebSocketResponse], Awaitable[None]]) -> AsyncIterator[str]:
    async def accept(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await handler(ws)
        return ws

    app = web.Application()
    app.router.add_get("/", accept)
    async with serving(app) as base:
        yield base + "/"


async def test_an_action_written_without_a_response_is_final_outcome_unknown() -> None:
    got: list[dict[str, Any]] = []

    async def silent(ws: web.WebSocketResponse) -> None:
        async for message in ws:
            got.append(json.loads(message.data))
            if len(got) == 2:
                await ws.close()

    async with raw_server(silent) as url, aiohttp.ClientSession() as http:
        socket = OneBotSocket(
            await http.ws_connect(url),
            transport="ws-forward",
            channels=frozenset({"api", "event"}),
            bot=bot("ws-forward"),
        )
        reader = asyncio.create_task(socket.run(Captured()))
        timed_out = await socket.call("send_private_msg", {"user_id": 1, "message": []}, timeout=0.3)
        # Written, never answered: QQ may have posted it, so it is final (never sent again).
        assert timed_out.error == "outcome_unknown" and timed_out.final and timed_out.response is None
        closed = await socket.call("send_private_msg", {"user_id": 2, "message": []}, timeout=5)
        assert closed.error == "outcome_unknown" and closed.final and "closed" in closed.detail
        await reader
        # Nothing can be written any more: not sent, so it may be sent again (not final).
        unwritten = await socket.call("send_private_msg", {"user_id": 3, "message": []}, timeout=5)
        assert unwritten.error == "not_connected" and not unwritten.final
    assert [g["action"] for g in got] == ["send_private_msg", "send_private_msg"]
    assert got[0]["echo"] != got[1]["echo"] and got[0]["params"] == {"user_id": 1, "message": []}


async def test_a_silent_socket_is_closed_after_three_missed_heartbeats(caplog: pytest.LogCaptureFixture) -> None:
    async def one_heartbeat(ws: web.WebSocketResponse) -> None:
        await ws.send_json({"post_type": "meta_event", "meta_event_type": "heartbeat", "interval": 1000, "status": {}})
        async for _ in ws:  # then silent, and open until the client closes: only its watchdog ends it
            pass

    async with raw_server(one_heartbeat) as url, aiohttp.ClientSession() as http:
        link = Captured()
        socket = OneBotSocket(
            await http.ws_connect(url),
            transport="ws-forward",
            channels=frozenset({"api", "event"}),
            bot=bot("ws-forward"),
        )
        started = asyncio.get_running_loop().time()
        with caplog.at_level(logging.WARNING, logger="pipeline.connections.onebot"):
            async with asyncio.timeout(60):  # a hang bound only
                await socket.run(link)
        # Not before three of the announced 1 s intervals (a lower bound: load only lengthens it);
        # how soon after is not timed: the socket's own watchdog ended it, after 3 s of silence,
        # while the peer still held it open.
        assert asyncio.get_running_loop().time() - started > 2.5
        assert [r.getMessage() for r in caplog.records if "no heartbeat" in r.getMessage()] == [
            "onebot/qq1: no heartbeat for 3 s; closing the socket"
        ]
        assert link.heartbeats == 1 and link.bodies == []
        await socket.close()


async def test_malformed_frames_are_counted_and_dead_lettered(
    redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = bot("ws-reverse")
    before = frames("malformed_json")
    async with running(redis_url, redis_prefix, produced, config) as connections, web_app(connections) as base:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{base}/onebot/ws/qq1", headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.send_str("{not json")
            await ws.send_json({"post_type": "message", "message_type": "private"})  # no ids
            await ws.send_json(dict(SPEC_PRIVATE, message_id=8))  # still read after the bad ones
            await until(lambda: len(inbound(produced)) == 1, "the good frame produced")
            await ws.close()
    letters = [json.loads(v) for topic, _, v in produced.records if topic == DEADLETTER]
    assert [(d["stage"], d["reason"]) for d in letters] == [
        ("ingress", "malformed_json"),
        ("ingress", "malformed_payload"),
    ]
    assert letters[0]["record"] == "{not json" and frames("malformed_json") == before + 1
