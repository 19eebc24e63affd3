"""Hostile requests to every webhook path (`/webhooks/{platform}/{bot_id}`, one bot of each platform)
and to the OneBot reverse WebSocket handshake, over raw sockets: header bytes beyond ASCII, NUL and
control bytes, overlong and duplicated headers, odd encodings, ambiguous framing (request smuggling
shapes), hostile bodies. The worker must answer none with 5xx, log no ERROR with a traceback, and
count every answer (the webhook route's outcomes, the parser's refusals, the handshake's)."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import random

import pytest
from prometheus_client import REGISTRY

from pipeline.settings import BotConfig
from pipeline.topics import IM_INBOUND

from .conftest import TOKEN, StartWorker
from .rawhttp import connect, read_until_closed, statuses, webhook_bots

ONEBOT_REVERSE = BotConfig(
    platform="onebot", bot_id="obr", transport="ws-reverse", credentials={"access_token": "ws-token"}
)
# Header names the platforms' verifiers read, and a few generic ones.
SIGNATURE_HEADERS = [
    "Authorization",
    "X-Telegram-Bot-Api-Secret-Token",
    "X-Slack-Signature",
    "X-Slack-Request-Timestamp",
    "X-Signature-Ed25519",
    "X-Signature-Timestamp",
    "X-Lark-Signature",
    "X-Lark-Request-Timestamp",
    "X-Lark-Request-Nonce",
    "X-Signature",
    "X-Self-ID",
    "X-Client-Role",
    "X-Bot-Appid",
    "timestamp",
    "sign",
    "Content-Type",
]
HOSTILE_VALUES = [
    "héllo wörld".encode(),  # UTF-8
    b"\xff\xfe\xfd",  # not UTF-8
    b"Bearer \xe4\xbd\xa0\xe5\xa5\xbd",
    b"sha256=\xc0\xaf",  # an overlong UTF-8 encoding
    b"a\x00b",  # NUL
    b"a\x01\x7fb",  # control bytes
    b"",
    b" " * 50,
    b"v0=" + b"a" * 9000,  # beyond aiohttp's 8,190-byte field limit
    b"1" * 400,
]
SMALL_BODY = json.dumps({"chat_id": "c", "chat_type": "group", "user_id": "u", "text": "hi"}).encode()
UTF16_BODY = SMALL_BODY.decode().encode("utf-16")
H2C = b"Connection: Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"


def request(method: str, path: str, headers: list[bytes], body: bytes = b"", *, length: bool = True) -> bytes:
    head = [f"{method} {path} HTTP/1.1".encode(), b"Host: worker"]
    if length:
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join([*head, *headers]) + b"\r\n\r\n" + body


def hostile_requests(method: str, path: str) -> list[bytes]:
    """The same hostile shapes for one method and path."""
    out = []
    json_type = b"Content-Type: application/json"
    for name in SIGNATURE_HEADERS:
        for value in HOSTILE_VALUES:
            out.append(request(method, path, [json_type, name.encode() + b": " + value], SMALL_BODY))
        # Duplicated: the same field twice with different values.
        out.append(request(method, path, [json_type, name.encode() + b": one", name.encode() + b": two"], SMALL_BODY))
    out += [
        request(method, path, [b"X-\xc3\xa9t\xc3\xa9: v"], SMALL_BODY),  # a name beyond ASCII
        request(method, path, [b"X-A: a\r\n folded"], SMALL_BODY),  # obsolete line folding
        request(method, path, [b"X-A : spaced"], SMALL_BODY),
        request(method, path, [b"X-A: bare\nX-B: lf"], SMALL_BODY),
        request(method, path, [b"X-A: bare\rCR"], SMALL_BODY),
        request(method, path, [b"X-Many-%d: v" % i for i in range(200)], SMALL_BODY),
        request(method, path, [b"X-Huge: " + b"h" * 70000], SMALL_BODY),
        request(method, path, [b"Host: second"], SMALL_BODY),
        request(
            method, path, [b"Content-Type: application/json; charset=utf-16"], SMALL_BODY.decode().encode("utf-16")
        ),
        request(method, path, [b"Content-Encoding: gzip", json_type], SMALL_BODY),  # not gzip
        request(method, path, [b"Content-Encoding: gzip", json_type], gzip.compress(b"[" * 50000)),
        request(method, path, [b"Content-Encoding: br, deflate, x-unknown"], SMALL_BODY),
    ]
    # Framing: ambiguous lengths and transfer codings (request smuggling shapes).
    smuggled = request("POST", "/webhooks/console/locked", [f"Authorization: Bearer {TOKEN}".encode()], SMALL_BODY)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMALL_BODY), SMALL_BODY)
    line = f"{method} {path} HTTP/1.1\r\nHost: worker\r\n".encode()
    out += [
        line + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
        line + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + smuggled,
        line + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
        line + b"Content-Length: 6\r\nContent-Length: 6\r\n\r\nabcdef",
        line + b"Content-Length: 6, 6\r\n\r\nabcdef",
        line + b"Content-Length: -1\r\n\r\n",
        line + b"Content-Length: +6\r\n\r\nabcdef",
        line + b"Content-Length: 0x06\r\n\r\nabcdef",
        line + b"Content-Length: 6 6\r\n\r\nabcdef",
        line + b"Content-Length: 99999999999999999999999\r\n\r\nabc",
        line + b"Content-Length: 2\r\n\r\n{}" + b"GARBAGE / HTTP/1.1\r\n\r\n",
        line + b"Content-Length: 2\r\n\r\n{}" + smuggled,  # a pipelined second request: answered on its own
        line + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        line + b"Transfer-Encoding: chunked, identity\r\n\r\n" + chunked,
        line + b"Transfer-Encoding: identity\r\n\r\n" + SMALL_BODY,
        line + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked,
        line + b"Transfer-Encoding: xchunked\r\n\r\n" + chunked,
        line + b"Transfer-Encoding : chunked\r\n\r\n" + chunked,
        line + b"Transfer-Encoding:\tchunked\r\n\r\n" + chunked,
        line + b"Transfer-Encoding: \xc3\xa7hunked\r\n\r\n" + chunked,
        line + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        line + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
        line + b"Transfer-Encoding: chunked\r\n\r\n3;ext=\x00\r\nabc\r\n0\r\n\r\n",
        line + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcXX0\r\n\r\n",
        line + b"Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
        line + b"Transfer-Encoding: chunked\r\n X: y\r\n\r\n" + chunked,
        line.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Transfer-Encoding: chunked\r\n\r\n" + chunked,
        line.replace(b"HTTP/1.1", b"HTTP/2.0") + b"Content-Length: 2\r\n\r\n{}",
        line.replace(b"HTTP/1.1", b"HTTP/1.1 extra") + b"Content-Length: 2\r\n\r\n{}",
        line.replace(method.encode(), method.lower().encode(), 1) + b"Content-Length: 2\r\n\r\n{}",
        line.replace(b" /", b"  /", 1) + b"Content-Length: 2\r\n\r\n{}",
        line.replace(b" /", b" http://elsewhere/", 1) + b"Content-Length: 2\r\n\r\n{}",
        line.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\n") + b"Content-Length: 2\r\n\r\n{}",
        line + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
        line + b"Expect: something-else\r\nContent-Length: 2\r\n\r\n{}",
        line
        + b"Connection: Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nContent-Length: 2\r\n\r\n{}",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64)),  # a TLS ClientHello
    ]
    # Bodies: hostile to a parser, sent with and without the console's credentials (which reach it).
    rng = random.Random(path)
    bodies = [
        b"",
        b"{",
        b"null",
        b"[]",
        b'"text"',
        b"\xff\xfe\x00{}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        json.dumps({"chat_id": "c" * 100_000, "text": "\u0000\ud800"}).encode(),
        b'{"chat_id": 1e999999, "user_id": -0, "text": 123456789012345678901234567890}',
        bytes(rng.randrange(256) for _ in range(4096)),
        b"x" * (1024 * 1024),
        b"x" * (1024 * 1024 + 1),
    ]
    credentials = [
        json_type,
        f"Authorization: Bearer {TOKEN}".encode(),
        b"X-Telegram-Bot-Api-Secret-Token: s3cret-token",
    ]
    for body in bodies:
        out.append(request(method, path, [json_type], body))
        out.append(request(method, path, credentials, body))
    out.append(request(method, path + "?timestamp=%C3%A9&sign=%FF&msg_signature=%00", [json_type], SMALL_BODY))
    return out


def counted() -> float:
    """Every answer the worker counts for these paths: the webhook route's outcomes, the parser's
    refusals, the OneBot handshake's outcomes."""
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == "switchboard_webhooks_total":
                total += sample.value
            elif sample.name == "switchboard_web_rejected_total" and sample.labels.get("surface") == "http":
                total += sample.value
            elif sample.name == "switchboard_connection_handshakes_total" and sample.labels.get("platform") == "onebot":
                total += sample.value
    return total


BOTS = webhook_bots()
TARGETS = [
    *(("POST", f"/webhooks/{b.platform}/{b.bot_id}") for b in BOTS),
    *(("GET", f"/webhooks/{b.platform}/{b.bot_id}") for b in BOTS),
    ("GET", f"/onebot/ws/{ONEBOT_REVERSE.bot_id}"),
    ("GET", f"/onebot/ws/{ONEBOT_REVERSE.bot_id}/event"),
]
# Found by this test in platform code (not the web server's): reported, and to be fixed there.
KNOWN_PLATFORM_FAULTS: dict[tuple[str, str], str] = {}


def target_params() -> list[object]:
    """Every target with the front on; with it off (webhooks through the app's route), the console's
    and Telegram's webhooks and the handshake (the refusals before the app are the same code)."""
    params: list[object] = []
    aiohttp_too = {("POST", "/webhooks/console/locked"), ("POST", "/webhooks/telegram/tg1"), TARGETS[-2]}
    for target in TARGETS:
        for front in (True, False) if target in aiohttp_too else (True,):
            marks = []
            if target in KNOWN_PLATFORM_FAULTS:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_PLATFORM_FAULTS[target]))
            name = f"{target[0]} {target[1]} {'front' if front else 'aiohttp'}"
            params.append(pytest.param(*target, front, marks=marks, id=name))
    return params


@pytest.mark.parametrize(("method", "path", "front"), target_params())
async def test_hostile_requests_are_refused_counted_and_never_a_server_error(
    start_worker: StartWorker, caplog: pytest.LogCaptureFixture, method: str, path: str, front: bool
) -> None:
    caplog.set_level(logging.WARNING)
    # A short deadline: every connection ends by itself (answered, refused, or idle) within it.
    worker = await start_worker(bots=[*BOTS, ONEBOT_REVERSE], web_request_timeout_seconds=0.5, web_webhook_front=front)
    cases = hostile_requests(method, path)
    gate = asyncio.Semaphore(64)
    answers: list[tuple[bytes, list[int], bool]] = []

    async def send(raw: bytes) -> None:
        async with gate:
            reader, writer = await connect(worker)
            try:
                writer.write(raw)
                await writer.drain()
            except ConnectionError:
                pass  # refused before it was all sent: what was answered is still read
            stream, reset = await read_until_closed(reader, within=30)
            answers.append((raw, statuses(stream), reset))
            writer.close()

    before = counted()
    await asyncio.gather(*(send(raw) for raw in cases))
    seen = [status for _, found, _ in answers for status in found]
    server_errors = [(raw[:160], found) for raw, found, _ in answers if any(s >= 500 for s in found)]
    assert server_errors == []
    errors = [(r.name, r.getMessage()[:200], bool(r.exc_info)) for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    # Every answer counted once. A reset connection may have lost an answer the worker counted.
    resets = sum(1 for _, _, reset in answers if reset)
    assert len(seen) <= counted() - before <= len(seen) + resets
    assert len(answers) == len(cases) and len(seen) >= len(cases) * 0.9
    # Only the honest request pipelined after a whole one got through; no smuggled one did.
    inbound = [json.loads(raw)["text"] for raw in worker.produced.on(IM_INBOUND)]
    assert inbound == ["hi"]
    assert sum(1 for s in seen if 200 <= s < 300) == 1
