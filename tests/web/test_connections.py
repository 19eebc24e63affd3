"""The worker's web server against misbehaving clients, on raw sockets: half-sent requests are
closed after the request timeout, a connection at the cap takes the slot of an idle one, a burst of
new connections waits in the listen queue, and a webhook body that does not parse is dead-lettered as
an excerpt and a digest, not kept whole."""

from __future__ import annotations

import asyncio
import hashlib
import json
import select
import socket
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import REGISTRY

from pipeline.records import DeadLetter
from pipeline.settings import BotConfig
from pipeline.topics import DEADLETTER
from tests.platforms import test_discord as discord_fx

from .conftest import TOKEN, StartWorker, Worker
from .rawhttp import closed_by_server

BURST = 300


def listen_queue_cap() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


def closed_total(reason: str) -> float:
    return REGISTRY.get_sample_value("switchboard_web_connections_closed_total", {"reason": reason}) or 0.0


async def connect(worker: Worker) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", worker.port)


async def test_half_sent_requests_are_closed_after_the_request_timeout(start_worker: StartWorker) -> None:
    worker = await start_worker(web_request_timeout_seconds=0.5)
    headers_before, body_before = closed_total("header_timeout"), closed_total("body_timeout")
    # Slow loris: a request line and some headers, never the blank line that ends them.
    lorises = [await connect(worker) for _ in range(20)]
    for _, writer in lorises:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: worker\r\nX-Slow: 1\r\n")
        await writer.drain()
    # A webhook whose body never arrives in full.
    body_reader, body_writer = await connect(worker)
    body_writer.write(
        b"POST /webhooks/console/locked HTTP/1.1\r\nHost: worker\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 500\r\n\r\n".encode()
        + b'{"chat_id": "c"'
    )
    await body_writer.drain()
    # Meanwhile a well-behaved client is served, and its kept-alive connection is not cut.
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{worker.url}/healthz") as r:
            assert r.status == 200
        results = await asyncio.gather(*(closed_by_server(reader, within=5.0) for reader, _ in lorises))
        assert all(results)
        assert await closed_by_server(body_reader, within=5.0)
        async with http.get(f"{worker.url}/healthz") as r:
            assert r.status == 200
    assert closed_total("header_timeout") - headers_before == 20
    assert closed_total("body_timeout") - body_before == 1
    assert worker.produced.records == []  # the cut webhook produced nothing
    for _, writer in [*lorises, (body_reader, body_writer)]:
        writer.close()


async def test_a_slow_but_complete_request_and_a_long_stream_are_not_cut(start_worker: StartWorker) -> None:
    worker = await start_worker(web_request_timeout_seconds=0.5)
    before = closed_total("header_timeout") + closed_total("body_timeout")
    reader, writer = await connect(worker)
    # Each piece well within the deadline, the whole request within it too.
    for piece in (b"GET /healthz HTTP/1.1\r\n", b"Host: worker\r\n", b"\r\n"):
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0.1)
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    # A console stream lives far beyond the request timeout: its request was whole.
    writer.write(
        b"GET /console/api/stream?chat_id=c HTTP/1.1\r\nHost: worker\r\n"
        + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    await writer.drain()
    assert not await closed_by_server(reader, within=1.5)
    writer.close()
    assert closed_total("header_timeout") + closed_total("body_timeout") == before


async def test_a_connection_at_the_cap_takes_the_slot_of_the_longest_idle_one(start_worker: StartWorker) -> None:
    """At the cap, a new connection is not refused while a slot is held by a connection without a
    request: the one idle longest is closed and counted (`evicted`), and the new one is served."""
    worker = await start_worker(web_max_connections=5)
    evicted, over = closed_total("evicted"), closed_total("over_limit")
    held = [await connect(worker) for _ in range(5)]
    for _ in range(50):
        if worker.runtime.web is not None and worker.runtime.web.open_connections == 5:
            break
        await asyncio.sleep(0.02)
    assert worker.runtime.web is not None and worker.runtime.web.open_connections == 5
    extra_reader, extra_writer = await connect(worker)
    extra_writer.write(b"GET /healthz HTTP/1.1\r\nHost: worker\r\n\r\n")
    await extra_writer.drain()
    assert (await asyncio.wait_for(extra_reader.readline(), 10)).startswith(b"HTTP/1.1 200")
    assert await closed_by_server(held[0][0], within=2.0)  # the oldest idle one
    assert closed_total("evicted") - evicted == 1 and closed_total("over_limit") == over
    # The others still work, and the count stays at the cap.
    reader, writer = held[1]
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: worker\r\n\r\n")
    await writer.drain()
    assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 200")
    assert worker.runtime.web.open_connections == 5
    for _, w in [*held, (extra_reader, extra_writer)]:
        w.close()


@pytest.mark.parametrize("front", [True, False], ids=["front", "aiohttp"])
async def test_a_burst_of_new_connections_is_queued_by_the_kernel_not_dropped(
    start_worker: StartWorker, front: bool
) -> None:
    """A platform opening its pool, or every client reconnecting after a restart: the connections
    arrive faster than the worker accepts them. Their handshakes must complete in the listen queue;
    a dropped SYN costs its client a retransmit, 1 s and then 3 s later. Here the worker cannot
    accept at all: the connects and the wait for them run on its own (blocked) event loop."""
    if listen_queue_cap() < BURST:
        pytest.skip(f"net.core.somaxconn is below {BURST}: the kernel caps every listen queue under the burst")
    worker = await start_worker(web_webhook_front=front)
    clients = []
    for _ in range(BURST):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", worker.port))
        clients.append(client)
    try:
        waiting = {c.fileno(): c for c in clients}
        deadline = time.monotonic() + 2.5  # past the first SYN retransmit, short of the second
        while waiting and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(waiting), [], 0.1)
            for fd in writable:
                assert waiting.pop(fd).getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        assert not waiting, f"{len(waiting)} of {BURST} handshakes did not complete while the worker was busy"
        # Once the loop runs again, the queued connections are accepted and served.
        last = clients[-1]
        last.setblocking(True)
        last.settimeout(10)
        await asyncio.sleep(0)
        await asyncio.to_thread(last.sendall, b"GET /healthz HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n")
        assert (await asyncio.to_thread(last.recv, 64)).startswith(b"HTTP/1.1 200")
    finally:
        for client in clients:
            client.close()


async def test_a_malformed_webhook_is_dead_lettered_as_an_excerpt_and_a_digest(start_worker: StartWorker) -> None:
    worker = await start_worker()
    body = ("{" + '"chat_id": "c", ' * 6000 + "broken").encode()  # ~100 kB, not JSON
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{worker.url}/webhooks/console/locked",
            data=body,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"] == "malformed"
    [raw] = worker.produced.on(DEADLETTER)
    letter = DeadLetter.model_validate_json(raw)
    assert letter.stage == "ingress" and letter.reason == "malformed"
    assert letter.record == body.decode()[:1000]
    assert letter.record_bytes == len(body)
    assert letter.record_sha256 == hashlib.sha256(body).hexdigest()
    assert len(raw) < 3000  # not the 100 kB body
    assert json.loads(raw)["record_sha256"] == letter.record_sha256


async def test_a_bot_on_a_long_connection_takes_no_webhooks(start_worker: StartWorker) -> None:
    """A Telegram bot that polls has no webhook secret to check: its webhook route is closed, so
    nobody can post updates in its name."""
    polled = BotConfig(
        platform="telegram",
        bot_id="polled",
        transport="polling",
        credentials={"token": "123456:ABC-test"},
        api_base="http://127.0.0.1:9",  # nothing listens: the worker's dials fail, which is fine here
    )
    worker = await start_worker(bots=[polled])
    before = REGISTRY.get_sample_value(
        "switchboard_webhooks_total", {"platform": "telegram", "outcome": "not_a_webhook_bot"}
    )
    update = {
        "update_id": 1,
        "message": {
            "message_id": 1,
            "date": 0,
            "chat": {"id": 5, "type": "private"},
            "from": {"id": 5, "is_bot": False, "first_name": "M"},
            "text": "hi",
        },
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{worker.url}/webhooks/telegram/polled", json=update) as r:
            assert r.status == 404
            assert "transport polling" in (await r.json())["error"]
    after = REGISTRY.get_sample_value(
        "switchboard_webhooks_total", {"platform": "telegram", "outcome": "not_a_webhook_bot"}
    )
    assert (after or 0.0) == (before or 0.0) + 1
    assert worker.produced.records == []


async def test_a_discord_gateway_bot_keeps_its_signed_interactions_endpoint(start_worker: StartWorker) -> None:
    """Discord sends messages over the Gateway but slash commands to the interactions endpoint: a
    Gateway bot's webhook route stays open for signed requests only (PING answered, forgeries 401)."""
    gateway_bot = BotConfig(
        platform="discord",
        bot_id="dc1",
        self_id=discord_fx.BOT_USER,
        transport="gateway",
        credentials={"token": discord_fx.TOKEN, "public_key": discord_fx.PUBLIC_KEY},
        api_base="http://127.0.0.1:9",  # nothing listens: the worker's dials fail, which is fine here
    )
    worker = await start_worker(bots=[gateway_bot])
    ping = discord_fx.signed({"type": 1, "id": "1", "application_id": discord_fx.BOT_USER, "token": "t", "version": 1})
    command = discord_fx.signed(discord_fx.SLASH)
    async with aiohttp.ClientSession() as http:
        url = f"{worker.url}/webhooks/discord/dc1"
        async with http.post(url, data=ping.body, headers=dict(ping.headers)) as r:
            assert (r.status, await r.json()) == (200, {"type": 1})
        async with http.post(url, data=command.body, headers={**command.headers, "x-signature-timestamp": "1"}) as r:
            assert r.status == 401
        assert worker.produced.records == []
        async with http.post(url, data=command.body, headers=dict(command.headers)) as r:
            assert (r.status, await r.json()) == (200, {"type": 5})
    assert len(worker.produced.records) == 1
