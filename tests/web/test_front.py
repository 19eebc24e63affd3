"""The webhook front on raw sockets: aiohttp's parser reads every request; the front answers webhooks
without the app's router and leaves everything else to the app, on the same connection, with the
same answers either way. Each test that compares runs on both (`web_webhook_front` on and off)."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import REGISTRY

from pipeline.topics import IM_INBOUND

from .conftest import TOKEN, StartWorker, Worker


def webhook(text: str, *, chat: str = "c-front", extra: bytes = b"", close: bool = False) -> bytes:
    body = json.dumps({"chat_id": chat, "chat_type": "group", "user_id": "u1", "text": text}).encode()
    return (
        b"POST /webhooks/console/locked HTTP/1.1\r\nHost: worker\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n".encode()
        + (b"Connection: close\r\n" if close else b"")
        + extra
        + b"\r\n"
        + body
    )


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response: status, headers (lower-cased names), body (by Content-Length or chunks)."""
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int((await reader.readline()).strip(), 16):
                body += await reader.readexactly(size)
                await reader.readline()
            await reader.readline()
        else:
            body = b""
        return int(status_line.split(" ")[1]), headers, body


async def connect(worker: Worker) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", worker.port)


def texts(worker: Worker) -> list[str]:
    return [json.loads(raw)["text"] for raw in worker.produced.on(IM_INBOUND)]


@pytest.fixture(params=[True, False], ids=["front", "aiohttp"])
def front(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


async def test_webhooks_and_other_requests_share_a_kept_alive_connection(
    start_worker: StartWorker, front: bool
) -> None:
    worker = await start_worker(web_webhook_front=front)
    reader, writer = await connect(worker)
    writer.write(webhook("one"))
    assert (await read_response(reader))[0] == 200
    # Not a webhook: from here aiohttp answers this connection (with the front on).
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: worker\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body)["status"] == "ok"
    writer.write(webhook("two"))
    assert (await read_response(reader))[0] == 200
    # Pipelined: a webhook, the probe and a webhook in one write, answered in order.
    writer.write(webhook("three") + b"GET /readyz HTTP/1.1\r\nHost: worker\r\n\r\n" + webhook("four"))
    statuses = [(await read_response(reader))[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    assert texts(worker) == ["one", "two", "three", "four"]
    writer.close()


async def test_pipelined_webhooks_are_answered_in_order_on_one_connection(
    start_worker: StartWorker, front: bool
) -> None:
    worker = await start_worker(web_webhook_front=front)
    reader, writer = await connect(worker)
    writer.write(b"".join(webhook(f"m{i}") for i in range(20)) + webhook("last", close=True))
    for _ in range(21):
        status, headers, body = await read_response(reader)
        assert status == 200 and json.loads(body)["ok"] is True
        assert headers["content-type"] == "application/json; charset=utf-8"
    assert headers.get("connection") == "close"
    assert await reader.read() == b""  # closed after the request that asked for it
    assert texts(worker) == [f"m{i}" for i in range(20)] + ["last"]


async def test_the_same_refusals_with_the_same_status_body_and_headers(start_worker: StartWorker) -> None:
    requests = {
        "unknown bot": b"POST /webhooks/console/nobody HTTP/1.1\r\nHost: w\r\nContent-Length: 2\r\n\r\n{}",
        "method": b"GET /webhooks/console/locked HTTP/1.1\r\nHost: w\r\n\r\n",
        "unauthenticated": b"POST /webhooks/console/locked HTTP/1.1\r\nHost: w\r\nContent-Length: 2\r\n\r\n{}",
        "malformed": webhook("x").replace(b'"text": "x"}', b'"text": 555}'),  # the same length
        "accepted": webhook("fine"),
    }
    answers: dict[bool, dict[str, tuple[int, str, str | None, object]]] = {}
    for front in (True, False):
        worker = await start_worker(web_webhook_front=front)
        answers[front] = {}
        for name, raw in requests.items():
            reader, writer = await connect(worker)
            writer.write(raw)
            status, headers, body = await read_response(reader)
            answer = json.loads(body)
            answer.pop("message_id", None)  # a new id for every accepted message
            answers[front][name] = (status, headers["content-type"], headers.get("allow"), answer)
            writer.close()
    assert answers[True] == answers[False]
    assert answers[True]["method"][:3] == (405, "application/json; charset=utf-8", "POST")
    assert answers[True]["unknown bot"][0] == 404 and answers[True]["unauthenticated"][0] == 401
    assert answers[True]["malformed"][0] == 400 and answers[True]["accepted"][0] == 200


async def test_requests_the_front_does_not_take_are_aiohttps_to_answer(start_worker: StartWorker) -> None:
    """Chunked bodies, `Expect: 100-continue` and HTTP/1.0 are read as aiohttp reads them; ambiguous
    framing (a length and chunks, two lengths) is refused by aiohttp's parser and never produced."""
    worker = await start_worker(web_webhook_front=True)
    body = json.dumps({"chat_id": "c", "chat_type": "group", "user_id": "u1", "text": "chunked"}).encode()
    head = f"POST /webhooks/console/locked HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer {TOKEN}\r\n"
    chunked = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    reader, writer = await connect(worker)
    writer.write(chunked)
    assert (await read_response(reader))[0] == 200
    # Expect: 100-continue, the body sent only once the server said so.
    raw = webhook("expected", extra=b"Expect: 100-continue\r\n")
    head_part, _, body_part = raw.partition(b"\r\n\r\n")
    writer.write(head_part + b"\r\n\r\n")
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
    writer.write(body_part)
    assert (await read_response(reader))[0] == 200
    writer.close()
    reader, writer = await connect(worker)
    writer.write(webhook("old", extra=b"").replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    assert (await read_response(reader))[0] == 200
    writer.close()
    assert texts(worker) == ["chunked", "expected", "old"]
    # Request smuggling attempts: refused whole, nothing produced, the connection not reused.
    smuggled = {
        "length and chunks": (head + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
        + b"0\r\n\r\n"
        + webhook("smuggled"),
        "two lengths": webhook("twice", extra=b"Content-Length: 3\r\n"),
        "space before colon": webhook("spaced", extra=b"Content-Length : 3\r\n"),
        "bare LF": webhook("lf").replace(b"Host: worker\r\n", b"Host: worker\nX: y\r\n"),
    }
    for name, raw in smuggled.items():
        reader, writer = await connect(worker)
        writer.write(raw)
        status, _, _ = await read_response(reader)
        assert status == 400, name
        writer.close()
    assert texts(worker) == ["chunked", "expected", "old"]


async def test_an_oversized_webhook_gets_413_from_either_front(start_worker: StartWorker, front: bool) -> None:
    worker = await start_worker(web_webhook_front=front)
    before = REGISTRY.get_sample_value("switchboard_webhooks_total", {"platform": "console", "outcome": "too_large"})
    reader, writer = await connect(worker)
    big = json.dumps({"chat_id": "c", "chat_type": "group", "user_id": "u1", "text": "x" * (1024 * 1024 + 10)}).encode()
    writer.write(
        b"POST /webhooks/console/locked HTTP/1.1\r\nHost: w\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(big)}\r\n\r\n".encode()
        + big
    )
    status, _, body = await read_response(reader)
    assert (status, json.loads(body)) == (413, {"error": "payload too large"})
    after = REGISTRY.get_sample_value("switchboard_webhooks_total", {"platform": "console", "outcome": "too_large"})
    assert (after or 0.0) == (before or 0.0) + 1
    assert worker.produced.records == []
    writer.close()


async def test_stopping_lets_a_webhook_being_answered_finish_and_closes_idle_connections(
    start_worker: StartWorker,
) -> None:
    worker = await start_worker(web_webhook_front=True)
    produced = worker.produced
    producing, release = asyncio.Event(), asyncio.Event()
    record = produced.__call__

    async def slow_produce(topic: str, key: str | None, value: bytes) -> None:
        producing.set()
        await release.wait()
        await record(topic, key, value)

    web = worker.runtime.web
    assert web is not None
    web.deps.produce = slow_produce
    idle_reader, _ = await connect(worker)
    busy_reader, busy_writer = await connect(worker)
    busy_writer.write(webhook("in flight"))
    await asyncio.wait_for(producing.wait(), 10)  # the webhook is being answered
    stopping = asyncio.create_task(web.stop())
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # closed at once
    release.set()
    status, headers, _ = await read_response(busy_reader)
    assert status == 200 and headers.get("connection") == "close"
    await asyncio.wait_for(stopping, 10)
    assert texts(worker) == ["in flight"]


async def test_header_and_query_values_beyond_ascii_are_refused_before_any_verifier(
    start_worker: StartWorker, front: bool
) -> None:
    """Platform code is handed ASCII header values and query values only: anything else (here with
    a valid token) is a counted 400 from the web server, on either path, and nothing is produced."""
    worker = await start_worker(web_webhook_front=front)

    def count(outcome: str) -> float:
        labels = {"platform": "console", "outcome": outcome}
        return REGISTRY.get_sample_value("switchboard_webhooks_total", labels) or 0.0

    before = {outcome: count(outcome) for outcome in ("bad_header", "bad_query")}
    hostile = {
        "bad_header": [
            webhook("utf-8", extra="X-Note: caf\u00e9\r\n".encode()),
            webhook("latin-1", extra=b"X-Note: caf\xe9\r\n"),
            webhook("token").replace(TOKEN.encode(), TOKEN.encode() + b"\xff"),
        ],
        "bad_query": [webhook("query").replace(b"/webhooks/console/locked", b"/webhooks/console/locked?n=%C3%A9")],
    }
    for outcome, requests in hostile.items():
        for raw in requests:
            reader, writer = await connect(worker)
            writer.write(raw)
            status, _, body = await read_response(reader)
            assert (status, json.loads(body)) == (400, {"error": outcome})
            writer.close()
    assert count("bad_header") - before["bad_header"] == 3
    assert count("bad_query") - before["bad_query"] == 1
    assert worker.produced.records == []
