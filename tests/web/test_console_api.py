"""The console's API on a real worker web server and a real Redis: the token on every route, bad
query parameters, the stream (backlog after a seq, then each delivery once), the viewer cap, one
Redis subscription per worker, shutdown with streams open, admins from configuration."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from pipeline.controls.budgets import Grant, window_at
from pipeline.records import InboundMessage, OutboundMessage, SessionCommand
from pipeline.session.models import UsageSnapshot
from pipeline.state import ConsoleStore, PendingAction, TurnRecord, close_redis_py, redis_py_client
from pipeline.topics import IM_INBOUND, SESSION_INPUT, outbound_topic
from pipeline.web._hub import VIEWER_QUEUE

from .conftest import ADMIN, TOKEN, StartWorker, Worker, console_bot

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def pipeline_console(worker: Worker) -> ConsoleStore:
    """What egress appends through: the stores' own Redis client."""
    return worker.runtime.state.console


@contextlib.asynccontextmanager
async def stream(
    http: aiohttp.ClientSession, worker: Worker, chat: str, *, after: int = 0, headers: dict[str, str] | None = None
) -> AsyncIterator[aiohttp.ClientResponse]:
    params = {"chat_id": chat, "bot_id": "locked", "after": str(after)}
    headers = AUTH if headers is None else headers
    async with http.get(f"{worker.url}/console/api/stream", params=params, headers=headers) as r:
        yield r


async def next_event(response: aiohttp.ClientResponse, timeout: float = 5.0) -> dict[str, Any]:
    """The next `message` event's id and data, or a `note` event's data as `{"note": …}` (keep-alive
    comments skipped)."""
    fields: dict[str, str] = {}
    async with asyncio.timeout(timeout):
        while True:
            line = (await response.content.readline()).decode()
            if not line:
                raise EOFError("the stream ended")
            line = line.rstrip("\n")
            if line == "" and "data" in fields:
                if fields.get("event") == "note":
                    assert "id" not in fields, "a note has no seq: a reconnect must never resume from it"
                    return {"note": json.loads(fields["data"])}
                return {"id": int(fields["id"]), "data": json.loads(fields["data"])}
            if line and not line.startswith(":"):
                key, _, value = line.partition(": ")
                fields[key] = value


async def wait_until(predicate: Any, what: str, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    assert predicate(), f"{what}: not after {seconds} s"


async def test_console_reads_stream_and_posts_need_the_token(start_worker: StartWorker) -> None:
    worker = await start_worker()
    await pipeline_console(worker).append("locked", "c1", {"id": "out-1", "text": "secret chat"}, message_id="out-1")
    query = {"chat_id": "c1", "bot_id": "locked"}
    body = {"chat_id": "c1", "chat_type": "private", "user_id": "u1", "text": "hi"}
    before = sample("switchboard_web_rejected_total", surface="console", reason="unauthorized")
    refused = sample("switchboard_webhooks_total", platform="console", outcome="bad_signature")
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            for path in ("messages", "stream", "config"):
                async with http.get(f"{worker.url}/console/api/{path}", params=query, headers=headers) as r:
                    assert r.status == 401, (path, headers)
                    assert (await r.json())["error"] == "unauthorized"
                    assert "secret chat" not in await r.text()
            async with http.post(f"{worker.url}/webhooks/console/locked", json=body, headers=headers) as r:
                assert r.status == 401
        # An unknown bot looks like a wrong token.
        async with http.get(
            f"{worker.url}/console/api/messages", params={"chat_id": "c1", "bot_id": "nobody"}, headers=AUTH
        ) as r:
            assert r.status == 401
        # With the token.
        async with http.get(f"{worker.url}/console/api/messages", params=query, headers=AUTH) as r:
            assert r.status == 200
            assert [m["text"] for m in (await r.json())["messages"]] == ["secret chat"]
        async with stream(http, worker, "c1") as r:
            assert r.status == 200
            assert (await next_event(r))["data"]["text"] == "secret chat"
        async with http.post(f"{worker.url}/webhooks/console/locked", json=body, headers=AUTH) as r:
            assert r.status == 200
        async with http.get(f"{worker.url}/console/api/config", headers=AUTH) as r:
            assert [b["bot_id"] for b in (await r.json())["bots"]] == ["locked"]
        # The page and its files hold no data: served without a token.
        async with http.get(f"{worker.url}/console/") as r:
            assert r.status == 200
    assert len(worker.produced.on(IM_INBOUND)) == 1  # only the authorised post
    assert sample("switchboard_web_rejected_total", surface="console", reason="unauthorized") - before == 10
    assert sample("switchboard_webhooks_total", platform="console", outcome="bad_signature") - refused == 3


async def test_config_lists_open_bots_and_those_the_token_opens(start_worker: StartWorker) -> None:
    bots = [console_bot("locked"), console_bot("other", token="another-token"), console_bot("open", token=None)]
    worker = await start_worker(bots=bots)
    async with aiohttp.ClientSession() as http:

        async def listed(headers: dict[str, str]) -> list[str] | int:
            async with http.get(f"{worker.url}/console/api/config", headers=headers) as r:
                return [b["bot_id"] for b in (await r.json())["bots"]] if r.status == 200 else r.status

        assert await listed({}) == ["open"]
        assert await listed(AUTH) == ["open", "locked"]
        assert await listed({"Authorization": "Bearer another-token"}) == ["open", "other"]
        assert await listed({"Authorization": "Bearer wrong"}) == 401  # the page asks again


async def test_bad_query_parameters_get_400(start_worker: StartWorker) -> None:
    worker = await start_worker()
    async with aiohttp.ClientSession() as http:
        for params in (
            {"chat_id": "c", "after": "abc"},
            {"chat_id": "c", "after": "-1"},
            {"chat_id": "c", "after": "1e3"},
            {"chat_id": "c", "after": ""},
            {"chat_id": "c", "after": "9" * 40},
            {"after": "0"},
            {"chat_id": "x" * 201},
        ):
            async with http.get(f"{worker.url}/console/api/stream", params=params, headers=AUTH) as r:
                assert r.status == 400, params
                assert r.headers["Content-Type"].startswith("application/json")
                assert (await r.json())["error"] == "bad_request"
        async with http.get(f"{worker.url}/console/api/messages", headers=AUTH) as r:
            assert r.status == 400
    two = await start_worker(bots=[console_bot("locked"), console_bot("b2")])
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{two.url}/console/api/messages", params={"chat_id": "c"}, headers=AUTH) as r:
            assert r.status == 400
            assert "bot_id" in (await r.json())["detail"]
    assert worker.runtime.web is not None and worker.runtime.web.deps.console is not None
    assert worker.runtime.web.deps.console.hub.viewers == 0  # none of them took a viewer slot


async def test_stream_sends_what_follows_after_then_each_delivery_once(start_worker: StartWorker) -> None:
    worker = await start_worker()
    console = pipeline_console(worker)
    for i in (1, 2, 3):
        await console.append("locked", "c", {"id": f"out-{i}"}, message_id=f"out-{i}")
    await console.append("locked", "elsewhere", {"id": "out-x"}, message_id="out-x")
    async with aiohttp.ClientSession() as http, stream(http, worker, "c", after=1) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        assert [(await next_event(r))["data"]["id"] for _ in range(2)] == ["out-2", "out-3"]
        await console.append("locked", "other-chat", {"id": "out-y"}, message_id="out-y")
        await console.append("locked", "c", {"id": "out-4"}, message_id="out-4")
        await console.append("locked", "c", {"id": "out-4"}, message_id="out-4")  # a replayed send
        event = await next_event(r)
        assert event == {"id": 4, "data": {"seq": 4, "id": "out-4"}}
        await console.append("locked", "c", {"id": "out-5"}, message_id="out-5")
        assert (await next_event(r))["data"]["id"] == "out-5"  # not out-4 again, nothing of other chats


async def test_status_notes_reach_only_their_chats_viewers_and_take_no_seq(start_worker: StartWorker) -> None:
    worker = await start_worker()
    console = pipeline_console(worker)
    await console.append("locked", "c", {"id": "out-1"}, message_id="out-1")
    async with (
        aiohttp.ClientSession() as http,
        stream(http, worker, "c") as r,
        stream(http, worker, "elsewhere") as other,
    ):
        assert (await next_event(r))["id"] == 1
        await console.publish_note("locked", "c", "held", ["web-1", "web-2"])
        assert await next_event(r) == {"note": {"note": "held", "message_ids": ["web-1", "web-2"]}}
        await console.append("locked", "c", {"id": "out-2"}, message_id="out-2")
        assert await next_event(r) == {"id": 2, "data": {"seq": 2, "id": "out-2"}}
        await console.append("locked", "elsewhere", {"id": "out-9"}, message_id="out-9")
        assert (await next_event(other))["id"] == 1  # the other chat's viewer got no note
    # Notes are not stored: a reader of the chat's list sees deliveries only.
    assert [json.loads(m)["id"] for m in await console.messages("locked", "c")] == ["out-1", "out-2"]


async def test_viewer_cap_gives_429_and_a_client_that_leaves_frees_its_slot(start_worker: StartWorker) -> None:
    worker = await start_worker(console_max_viewers=3)
    assert worker.runtime.web is not None and worker.runtime.web.deps.console is not None
    hub = worker.runtime.web.deps.console.hub
    before = sample("switchboard_web_rejected_total", surface="console", reason="over_viewer_limit")
    async with contextlib.AsyncExitStack() as viewers:
        sessions = [await viewers.enter_async_context(aiohttp.ClientSession()) for _ in range(3)]
        responses = [await viewers.enter_async_context(stream(s, worker, f"c{i}")) for i, s in enumerate(sessions)]
        assert [r.status for r in responses] == [200, 200, 200]
        await wait_until(lambda: hub.viewers == 3, "three viewers")
        async with aiohttp.ClientSession() as http, stream(http, worker, "c9") as r:
            assert r.status == 429
            assert r.headers["Retry-After"]
            body = await r.json()
            assert body["error"] == "over_viewer_limit" and "SWITCHBOARD_CONSOLE_MAX_VIEWERS" in body["detail"]
        # A client that leaves (its connection closed, nothing written to it yet): its slot is free
        # without waiting for the next keep-alive write to fail.
        await sessions[0].close()
        await wait_until(lambda: hub.viewers == 2, "the slot released", seconds=2.0)
        async with aiohttp.ClientSession() as http, stream(http, worker, "c9") as r:
            assert r.status == 200
    assert sample("switchboard_web_rejected_total", surface="console", reason="over_viewer_limit") - before == 1
    await wait_until(lambda: hub.viewers == 0, "every slot released")


async def test_one_redis_subscription_per_worker_and_never_the_pipeline_pool(start_worker: StartWorker) -> None:
    worker = await start_worker(console_max_viewers=100)
    # A client of the test's own: the worker opens no general-purpose redis-py client.
    redis = redis_py_client(worker.runtime.settings.redis_url or "", decode_responses=True)
    assert worker.runtime.web is not None and worker.runtime.web.deps.console is not None
    console = worker.runtime.web.deps.console
    assert console.store.redis is not worker.runtime.state.redis  # a client of its own
    channel = pipeline_console(worker).channel

    async def subscriptions() -> int:
        return int(dict(await redis.pubsub_numsub(channel))[channel])

    assert isinstance(redis, Redis)  # not a cluster URL
    db = str(redis.connection_pool.connection_kwargs["db"])  # other tests' clients use other DBs

    async def clients(name: str) -> int:
        return sum(1 for c in await redis.client_list() if c.get("name") == name and c.get("db") == db)

    async with asyncio.timeout(5):
        await worker.runtime.web.deps.console.hub.subscribed.wait()
    assert await subscriptions() == 1
    pipeline_before = await clients("switchboard")
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        responses = [await stack.enter_async_context(stream(http, worker, f"c{i % 5}")) for i in range(60)]
        assert {r.status for r in responses} == {200}
        assert await subscriptions() == 1
        # The viewers' reads went through the console's two connections, never the pipeline's.
        assert await clients("switchboard-console") == 2
        assert await clients("switchboard") == pipeline_before
        await pipeline_console(worker).append("locked", "c3", {"id": "out-1"}, message_id="out-1")
        got = await asyncio.gather(*(next_event(r) for r in responses[3::5]))
        assert [e["data"]["id"] for e in got] == ["out-1"] * 12
    assert await subscriptions() == 1
    await close_redis_py(redis)


async def test_open_streams_do_not_hold_the_shutdown(start_worker: StartWorker) -> None:
    worker = await start_worker()
    async with aiohttp.ClientSession() as http, stream(http, worker, "c") as r:
        assert r.status == 200
        await worker.runtime.stop()
        # The stream was ended by the worker (a clean end of the chunked body, not a connection cut
        # after aiohttp's shutdown timeout): the page reconnects elsewhere.
        async with asyncio.timeout(2):
            rest = await r.content.read()
        assert rest == b""


async def test_is_admin_in_the_body_is_ignored_and_configured_admins_may_answer(start_worker: StartWorker) -> None:
    """Through ingress and ingest on real Redis: a confirmation is pending in a group chat; a user
    who claims `is_admin` is refused, the configured admin's `/deny` is sent to the session."""
    worker = await start_worker()
    runtime = worker.runtime
    conversation = "console:locked:g1"
    turn = TurnRecord(
        trace_id="t", platform="console", bot_id="locked", chat_id="g1", chat_type="group", starter_id="starter"
    )
    pending = [PendingAction(event_id="tool-1", kind="confirmation", name="rm")]
    await runtime.state.conversations.update_conversation(
        conversation, status="requires_action", turn=turn, pending=pending
    )

    async def post(user: str, text: str, **extra: Any) -> InboundMessage:
        body = {"chat_id": "g1", "chat_type": "group", "user_id": user, "text": text, **extra}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{worker.url}/webhooks/console/locked", json=body, headers=AUTH) as r:
                assert r.status == 200, await r.text()
        return InboundMessage.model_validate_json(worker.produced.on(IM_INBOUND)[-1])

    async def ingest(message: InboundMessage) -> None:
        await runtime.ingest.handle(message)

    claimed = await post("mallory", "/allow", is_admin=True)
    assert claimed.sender.is_admin is False
    await ingest(claimed)
    assert worker.produced.on(SESSION_INPUT) == []
    refusals = [OutboundMessage.model_validate_json(v) for v in worker.produced.on(outbound_topic("console"))]
    assert len(refusals) == 1 and refusals[0].kind == "notice"

    await ingest(await post(ADMIN, "/deny not today"))
    commands = [SessionCommand.model_validate_json(v) for v in worker.produced.on(SESSION_INPUT)]
    assert [c.kind for c in commands] == ["tool_confirmation"]
    assert commands[0].events[0]["result"] == "deny" and commands[0].events[0]["deny_message"] == "not today"


async def test_metrics_need_their_token_when_one_is_set(start_worker: StartWorker) -> None:
    worker = await start_worker(metrics_token="scrape-me")
    # Beyond loopback without a token: refused to everyone (0.0.0.0 also accepts us on 127.0.0.1).
    exposed = await start_worker(web_host="0.0.0.0")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{exposed.url}/metrics") as r:
            assert r.status == 401 and "SWITCHBOARD_METRICS_TOKEN" in (await r.json())["detail"]
        async with http.get(f"{exposed.url}/healthz") as r:
            assert r.status == 200
        for headers in ({}, {"Authorization": "Bearer nope"}):
            async with http.get(f"{worker.url}/metrics", headers=headers) as r:
                assert r.status == 401
                assert "switchboard_" not in await r.text()
        async with http.get(f"{worker.url}/metrics", headers={"Authorization": "Bearer scrape-me"}) as r:
            assert r.status == 200 and "switchboard_webhooks_total" in await r.text()
        for probe in ("/healthz", "/readyz"):  # probes stay open
            async with http.get(f"{worker.url}{probe}") as r:
                assert r.status == 200


async def test_with_the_console_off_nothing_of_it_is_served(start_worker: StartWorker) -> None:
    worker = await start_worker(console_enabled=False, bots=[console_bot("qq", platform="onebot", token=None)])
    assert worker.runtime.web is not None and worker.runtime.web.deps.console is None
    async with aiohttp.ClientSession() as http:
        for path in ("/console/", "/console/api/config", "/console/api/stream?chat_id=c", "/"):
            async with http.get(f"{worker.url}{path}", allow_redirects=False) as r:
                assert r.status == 404, path


async def test_a_slow_viewer_is_ended_not_waited_for(start_worker: StartWorker) -> None:
    """A viewer whose queue overflows is ended (its page reconnects and catches up from the list);
    the other viewers of the chat still get every delivery."""
    worker = await start_worker()
    assert worker.runtime.web is not None and worker.runtime.web.deps.console is not None
    hub = worker.runtime.web.deps.console.hub
    stalled = hub.join("locked", "c")  # a viewer that never reads
    console = pipeline_console(worker)
    before = sample("switchboard_console_streams_ended_total", reason="slow")
    async with aiohttp.ClientSession() as http, stream(http, worker, "c") as r:
        for i in range(VIEWER_QUEUE + 1):
            await console.append("locked", "c", {"id": f"out-{i}"})
        seen = [(await next_event(r))["id"] for _ in range(VIEWER_QUEUE + 1)]
    assert seen == list(range(1, VIEWER_QUEUE + 2))
    assert stalled.ended and stalled.reason == "slow"
    hub.leave(stalled)
    assert sample("switchboard_console_streams_ended_total", reason="slow") - before == 1


async def test_an_idle_stream_gets_keep_alive_comments(start_worker: StartWorker, monkeypatch: Any) -> None:
    from pipeline.web import _hub

    monkeypatch.setattr(_hub, "KEEPALIVE_SECONDS", 0.2)
    worker = await start_worker()
    async with aiohttp.ClientSession() as http, stream(http, worker, "quiet") as r:
        async with asyncio.timeout(5):
            assert await r.content.readline() == b": keep-alive\n"
        await pipeline_console(worker).append("locked", "quiet", {"id": "out-1"}, message_id="out-1")
        assert (await next_event(r))["data"]["id"] == "out-1"  # keep-alives did not get in the way


async def test_a_lost_subscription_ends_the_streams_and_they_catch_up(
    start_worker: StartWorker, redis_server_factory: Any
) -> None:
    """Redis restarts: deliveries published meanwhile never reach this worker's subscription, so
    its viewers are ended (`resync`), and a stream opened again from the last seq has them."""
    redis = await redis_server_factory(aof=True)
    worker = await start_worker(redis_url=redis.url)
    assert worker.runtime.web is not None and worker.runtime.web.deps.console is not None
    hub = worker.runtime.web.deps.console.hub
    before = sample("switchboard_console_streams_ended_total", reason="resync")
    async with aiohttp.ClientSession() as http:
        async with stream(http, worker, "c") as r:
            await pipeline_console(worker).append("locked", "c", {"id": "out-1"}, message_id="out-1")
            assert (await next_event(r))["id"] == 1
            await redis.stop()
            async with asyncio.timeout(10):
                assert await r.content.read() == b""  # ended by the worker
        await redis.start()
        async with asyncio.timeout(20):
            await hub.subscribed.wait()
        # Delivered while no viewer was connected, then seen by a stream that resumes after seq 1.
        await pipeline_console(worker).append("locked", "c", {"id": "out-2"}, message_id="out-2")
        async with stream(http, worker, "c", after=1) as r:
            assert (await next_event(r))["data"]["id"] == "out-2"
    assert sample("switchboard_console_streams_ended_total", reason="resync") - before == 1


async def test_a_live_viewer_that_stops_reading_is_ended(start_worker: StartWorker) -> None:
    """Once live, deliveries are written straight to the connection; one that stops reading fills
    its buffers and is ended (`slow`) instead of growing the worker's memory."""
    worker = await start_worker()
    assert worker.runtime.web is not None and worker.runtime.web.deps.console is not None
    hub = worker.runtime.web.deps.console.hub
    before = sample("switchboard_console_streams_ended_total", reason="slow")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # no receive-window autotuning
    client.connect(("127.0.0.1", worker.port))
    reader, writer = await asyncio.open_connection(sock=client)
    writer.write(
        b"GET /console/api/stream?chat_id=c&bot_id=locked HTTP/1.1\r\nHost: w\r\n"
        + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    await wait_until(lambda: hub.viewers == 1, "the viewer")
    console = pipeline_console(worker)
    big = "x" * 4000
    for i in range(2000):  # 8 MB: more than the socket buffers and the viewer's allowance
        await console.append("locked", "c", {"id": f"out-{i}", "text": big})
        if hub.viewers == 0:
            break
    await wait_until(lambda: hub.viewers == 0, "the slow viewer ended")
    assert sample("switchboard_console_streams_ended_total", reason="slow") - before == 1
    writer.close()


async def test_usage_shows_the_chats_the_senders_and_the_bots_totals_with_the_token(start_worker: StartWorker) -> None:
    bot = console_bot(budgets={"per_chat": {"tokens": 1000}, "timezone": "Asia/Tokyo"})
    worker = await start_worker(bots=[bot])
    render = worker.runtime.render
    await render.budgets.account(bot, "sesn-1", UsageSnapshot(input_tokens=700, active_seconds=2.5), "c1", "u1")
    await render.budgets.store.grant(
        "console:locked", window_at(bot.budgets, datetime.now(UTC)), "chat", "c1", Grant(300, "tokens", None)
    )
    query = {"chat_id": "c1", "bot_id": "locked", "user_id": "u1"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{worker.url}/console/api/usage", params=query) as r:
            assert r.status == 401
        async with http.get(f"{worker.url}/console/api/usage", params=query, headers=AUTH) as r:
            assert r.status == 200
            body = await r.json()
    assert body["timezone"] == "Asia/Tokyo"
    assert body["accounted"] is True
    assert body["chat"] == {
        "tokens": 700,
        "active_seconds": 2.5,
        "granted_tokens": 300,
        "granted_seconds": 0,
        "limit_tokens": 1000,
        "limit_seconds": None,
    }
    assert (body["user"]["tokens"], body["user"]["limit_tokens"]) == (700, None)
    assert body["bot"]["tokens"] == 700
