"""The connection guard on real sockets: a connection that has not sent a whole request within the
request deadline is closed whatever it is doing, and counted; the probes get through a worker whose
connection slots are all held. Each runs with the webhook front on and off."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from pipeline import metrics
from pipeline.platforms import known_platforms
from tests.event_loop import hold_the_loop
from tests.metric_values import current

from .conftest import TOKEN, StartWorker, Worker
from .rawhttp import closed_by_server, closed_total, connect, webhook_bots
from .test_front import read_response, webhook

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: worker\r\n\r\n"
REASONS = ("idle_timeout", "header_timeout", "body_timeout", "evicted", "over_limit")
# Only catches a hang: every deadline in these tests is a fraction of it.
HANG = 10.0


@pytest.fixture(params=[True, False], ids=["front", "aiohttp"])
def front(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def closed_counts() -> dict[str, float]:
    return {reason: closed_total(reason) for reason in REASONS}


def since(before: dict[str, float]) -> dict[str, float]:
    return {reason: closed_total(reason) - before[reason] for reason in REASONS}


async def open_count(worker: Worker, expected: int) -> int:
    """The worker's open connections, once they reach `expected` (or the hang bound passes)."""
    web = worker.runtime.web
    assert web is not None
    for _ in range(int(HANG / 0.01)):
        if web.open_connections == expected:
            break
        await asyncio.sleep(0.01)
    return web.open_connections


async def test_a_connection_without_a_whole_request_is_closed_at_the_deadline_whatever_its_state(
    start_worker: StartWorker, front: bool
) -> None:
    """New and silent, idle between kept-alive requests, halfway through a head, halfway through a
    body: each is closed once the request deadline passes (not after the 75 s keep-alive time), and
    counted by what it was doing."""
    worker = await start_worker(web_request_timeout_seconds=0.5, web_webhook_front=front)
    before = closed_counts()
    fresh_reader, _ = await connect(worker)
    kept_reader, kept_writer = await connect(worker)
    kept_writer.write(HEALTHZ)
    assert (await read_response(kept_reader))[0] == 200
    head_reader, head_writer = await connect(worker)
    head_writer.write(b"POST /webhooks/console/locked HTTP/1.1\r\nHost: worker\r\nContent-Le")
    body_reader, body_writer = await connect(worker)
    body_writer.write(webhook("never whole").replace(b"Content-Length: ", b"Content-Length: 1")[:-10])
    closed = await asyncio.gather(
        *(closed_by_server(r, within=HANG) for r in (fresh_reader, kept_reader, head_reader, body_reader))
    )
    assert closed == [True, True, True, True]
    assert since(before) == {
        "idle_timeout": 2,
        "header_timeout": 1,
        "body_timeout": 1,
        "evicted": 0,
        "over_limit": 0,
    }
    assert await open_count(worker, 0) == 0
    assert worker.produced.records == []


async def test_a_kept_alive_connection_that_keeps_sending_whole_requests_stays_open(
    start_worker: StartWorker, front: bool
) -> None:
    """The deadline is per request: a client that sends a whole request within each deadline keeps
    its connection for as long as it likes."""
    worker = await start_worker(web_request_timeout_seconds=0.5, web_webhook_front=front)
    before = closed_counts()
    reader, writer = await connect(worker)
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < 1.5:  # three deadlines
        writer.write(webhook(f"m{sent}"))
        assert (await read_response(reader))[0] == 200
        sent += 1
        await asyncio.sleep(0.2)
    assert sent >= 3 and since(before)["idle_timeout"] == 0
    writer.close()


async def test_a_request_sent_in_time_is_answered_though_the_loop_was_held_past_its_deadline(
    start_worker: StartWorker, front: bool
) -> None:
    """The loop is held (a long callback, a starved process) from just after a whole request was
    sent until past its deadline: the request still in the socket is read and answered, not cut as
    silent. The time the loop could not read is not the client's (this failed the hostile-requests
    test under a loaded tier: connections reset with their requests unread)."""
    worker = await start_worker(web_request_timeout_seconds=0.5, web_webhook_front=front)
    before, deferred = closed_counts(), current(metrics.WEB_DEADLINES_DEFERRED)
    reader, writer = await connect(worker)
    await asyncio.sleep(0.05)  # accepted, and its socket watched
    writer.write(HEALTHZ)
    hold_the_loop(0.8)  # past the deadline, the request unread (worker and client share the loop)
    assert (await asyncio.wait_for(read_response(reader), HANG))[0] == 200
    assert since(before) == dict.fromkeys(REASONS, 0)
    assert current(metrics.WEB_DEADLINES_DEFERRED) > deferred
    writer.close()


async def test_the_probes_answer_while_idle_connections_fill_the_cap(start_worker: StartWorker, front: bool) -> None:
    """64 slots held by clients that send nothing, or half a head, with a deadline far away: a new
    connection takes the slot of the one that has waited longest without sending anything."""
    worker = await start_worker(web_max_connections=64, web_request_timeout_seconds=60, web_webhook_front=front)
    before = closed_counts()
    silent = [await connect(worker) for _ in range(32)]
    halfway = [await connect(worker) for _ in range(32)]
    for _, writer in halfway:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: worker\r\nX-Slow: 1\r\n")
        await writer.drain()
    assert await open_count(worker, 64) == 64
    for path in (b"/healthz", b"/readyz", b"/metrics"):
        reader, writer = await connect(worker)
        writer.write(b"GET " + path + b" HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n")
        status, _, _ = await read_response(reader)  # read_response bounds the wait (a hang)
        assert status == 200, path
        writer.close()
    # The oldest silent connections gave their slots; the ones halfway through a head kept theirs.
    assert await closed_by_server(silent[0][0], within=HANG)
    assert not await closed_by_server(halfway[0][0], within=0.2)
    # One eviction per probe at most: a probe's own slot is free again once it closed.
    assert 1 <= since(before)["evicted"] <= 3 and since(before)["over_limit"] == 0
    for _, writer in [*silent, *halfway]:
        writer.close()


async def test_the_probes_answer_while_every_slot_holds_a_request_being_answered(start_worker: StartWorker) -> None:
    """Every slot holds a console stream (a whole request, answered for as long as it lasts): beyond
    the cap, a connection is still admitted for the probes; anything else on it gets 503."""
    worker = await start_worker(web_max_connections=3)
    before = closed_counts()
    streams = []
    for _ in range(3):
        reader, writer = await connect(worker)
        writer.write(
            b"GET /console/api/stream?chat_id=c HTTP/1.1\r\nHost: worker\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        async with asyncio.timeout(HANG):
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        streams.append((reader, writer))
    reader, writer = await connect(worker)
    writer.write(HEALTHZ)
    assert (await read_response(reader))[0] == 200
    writer.write(webhook("no room"))
    status, headers, _ = await read_response(reader)
    assert status == 503 and headers.get("connection") == "close"
    assert await closed_by_server(reader, within=HANG)
    assert since(before)["over_limit"] == 1 and since(before)["evicted"] == 0
    assert worker.produced.records == []
    for _, stream_writer in streams:
        stream_writer.close()


async def test_healthz_time_under_large_unsigned_bodies_and_a_full_cap(start_worker: StartWorker) -> None:
    """How long `/healthz` takes while 4 clients post unsigned 1 MiB bodies to every platform's
    webhook and idle connections fill the cap (the target is 200 ms; printed, not asserted: the
    assertion is that every probe is answered)."""
    bots = webhook_bots()
    assert {b.platform for b in bots} == set(known_platforms())
    cap = 256
    worker = await start_worker(bots=bots, web_max_connections=cap, web_request_timeout_seconds=60)
    idle = [await connect(worker) for _ in range(cap - 8)]
    body = b"x" * (1024 * 1024)
    posted: list[int] = []
    running = True

    async def poster(first: int) -> None:
        reader, writer = await connect(worker)
        index = first
        while running:
            bot = bots[index % len(bots)]
            index += 1
            writer.write(
                f"POST /webhooks/{bot.platform}/{bot.bot_id} HTTP/1.1\r\nHost: w\r\n".encode()
                + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            status, _, _ = await read_response(reader)
            posted.append(status)

    posters = [asyncio.create_task(poster(i)) for i in range(4)]
    timings = []
    try:
        await asyncio.sleep(0.5)
        for _ in range(20):
            started = time.perf_counter()
            reader, writer = await connect(worker)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n")
            assert (await read_response(reader))[0] == 200
            timings.append((time.perf_counter() - started) * 1000)
            writer.close()
            await asyncio.sleep(0.05)
    finally:
        running = False
        await asyncio.gather(*posters, return_exceptions=True)
    print(
        f"\n/healthz under 4 clients posting unsigned 1 MiB bodies to {len(bots)} platforms' webhooks "
        f"({len(posted)} posts) and {len(idle)} idle connections (cap {cap}): "
        f"p50 {statistics.median(timings):.1f} ms, max {max(timings):.1f} ms (target 200 ms)"
    )
    assert posted and all(400 <= status < 500 for status in posted), sorted(set(posted))
    for _, writer in idle:
        writer.close()
