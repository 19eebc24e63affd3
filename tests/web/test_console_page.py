"""UI test of the web console page (`pipeline/web/static`), driven in headless Chromium.

A tiny aiohttp app serves the real static files at the real paths, with FAKE console API endpoints
(config, messages, stream, webhook) and canned bot messages covering every segment type. The real
pipeline end to end is tested elsewhere; this checks the page: chats, users, mentions, reply-to,
commands, rendering of all 13 segment types and the message kinds, live updates (SSE and polling),
and the bearer token: the fake refuses every API request without it, the page takes it from the URL
fragment and sends it on every request, the stream (read with fetch) included.

Needs the `playwright` Python package and a Chromium binary (Debian's `chromium`; the Playwright
browser download is not used). Skips cleanly when either is missing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import re
import shutil
import struct
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pipeline.platforms.base import WebhookRequest
from pipeline.platforms.console import ConsolePlatform
from pipeline.segments.media import with_placeholders
from pipeline.segments.models import (
    SEGMENT_TYPES,
    ImageSegment,
    Media,
    MediaData,
    TextData,
    TextSegment,
    segment_list_adapter,
)
from pipeline.settings import BotConfig
from pipeline.stages.ingest import content_blocks

STATIC = Path(__file__).resolve().parents[2] / "pipeline" / "web" / "static"
SCREENSHOT = Path("/tmp/console.png")
BOT = {
    "bot_id": "console-bot",
    "self_id": "switchboard",
    "language": "en",
    "busy_policy": "queue",
    "admins": ["bob"],
    "token_required": True,
}
TOKEN = "page-test-token"
CHAT = "team"
# What `/console/api/usage` answers (the usage budgets' totals in the window).
USAGE = {
    "window": "2026-12-06",
    "timezone": "UTC",
    "chat": {
        "tokens": 1200,
        "active_seconds": 3.2,
        "granted_tokens": 500,
        "granted_seconds": 0,
        "limit_tokens": 1000,
        "limit_seconds": None,
    },
    "bot": {
        "tokens": 5000,
        "active_seconds": 40.0,
        "granted_tokens": 0,
        "granted_seconds": 0,
        "limit_tokens": None,
        "limit_seconds": None,
    },
}
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.timeout(60)


def _chromium() -> str | None:
    for candidate in (
        os.environ.get("SWITCHBOARD_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


# ------------------------------------------------------------------------------------------------
# Canned media: a small gradient PNG and a short WAV tone, generated here (no binary fixtures)


def _png(width: int = 96, height: int = 64) -> bytes:
    rows = b""
    for y in range(height):
        rows += b"\x00" + b"".join(
            bytes((70 + x * 150 // width, 90 + y * 120 // height, 230 - x * 80 // width)) for x in range(width)
        )

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _wav(seconds: float = 0.4, rate: int = 8000) -> bytes:
    samples = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(int(seconds * rate))
    )
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(samples))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", len(samples))
        + samples
    )


PNG = _png()
WAV = _wav()


def _seg(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, "data": data}


def _media(kind: str, media_kind: str, value: str) -> dict[str, Any]:
    return _seg(kind, media={"kind": media_kind, "value": value})


MARKDOWN = """## Weather report
It is **sunny** and *warm*, with `low` wind. Details at [the met office](https://example.org/met?a=1&b=2).

- first item
- second item with **bold**
  - nested item

1. step one
2. step two

```python
print("<b>not bold</b>")
```

> quoted line

Hostile: <img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> [bad](javascript:window.__pwned=3)
"""


HOSTILE = '<img src=x onerror="window.__pwned=9">'
CONFIRMATION = "The agent wants to run **bash**: `ls -la /tmp`.\nReply /allow or /deny."


def canned_messages(base: str) -> list[dict[str, Any]]:
    now = time.time() * 1000
    t0 = now - 5 * 60_000

    def msg(
        n: int, kind: str, segments: list[dict[str, Any]], reply_to: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        ingress = t0 + n * 20_000
        segment_list_adapter.validate_python(segments)  # the canned data obeys the real contract
        return extra | {
            "id": f"out-{n}",
            "kind": kind,
            "chat_id": CHAT,
            "reply_to": reply_to,
            "segments": segments,
            "trace_id": f"trace-{n}",
            "hops": {"ingress": ingress, "ingest": ingress + 4, "dispatch": ingress + 31},
            "delivered_at": ingress + 850 + n * 400,
        }

    return [
        msg(1, "notice", [_seg("text", text="A fresh session was started for this chat.")]),
        msg(2, "reply", [_seg("markdown", content=MARKDOWN)]),
        msg(
            3,
            "reply",
            [
                _seg("reply", message_id="out-2"),
                _seg("mention", target="carol"),
                _seg("text", text=" here are some toys: "),
                _seg("face", id=76),
                _seg("face", id="14"),
                _seg("dice"),
                _seg("rps"),
                _seg("forward", forward_id="fw-1234"),
            ],
        ),
        msg(
            4,
            "reply",
            [
                _seg("text", text="Media, every way it can arrive:"),
                _media("image", "url", f"{base}/fake/pic.png"),
                _media("image", "base64", base64.b64encode(PNG).decode()),
                _media("image", "path", "/var/lib/agent/out/chart.png"),
                _media("audio", "url", f"{base}/fake/tone.wav"),
                _media("video", "url", f"{base}/fake/clip.mp4"),
                _media("file", "url", f"{base}/fake/report.pdf"),
                _media("file", "base64", base64.b64encode(b"%PDF-1.4 tiny").decode()),
                _media("file", "file", "file-abc123"),
                _seg("share", url="https://example.com/articles/42", title="How the switchboard routes messages"),
            ],
        ),
        msg(5, "progress", [_seg("text", text="Looking that up with the search tool…")]),
        msg(6, "confirmation", [_seg("markdown", content=CONFIRMATION)]),
        # A reply the correction call fixed (render's note), and one whose two images the worker
        # refused: each replaced in place by the notice text, as the media check does it.
        msg(7, "reply", [_seg("text", text="Fixed on the second try.")], notes=["corrected"]),
        msg(8, "reply", unavailable_reply(), media_rejected=["too_large", f"address_private{HOSTILE}"]),
    ]


def unavailable_reply() -> list[dict[str, Any]]:
    image = ImageSegment(type="image", data=MediaData(media=Media(kind="url", value="http://10.0.0.1/a.png")))
    segments: list[Any] = [TextSegment(type="text", data=TextData(text="Two charts:")), image, image]
    placed = with_placeholders(segments, [1, 2], "[attachment unavailable]")
    return [segment.model_dump(mode="json") for segment in placed]


# ------------------------------------------------------------------------------------------------
# The fake server


class FakeConsole:
    def __init__(self) -> None:
        self.chats: dict[str, list[dict[str, Any]]] = {}
        self.notes: dict[str, list[dict[str, Any]]] = {}  # per chat: status notes, live only
        self.busy: dict[str, str] = {}  # chat → the message whose (pretend) turn is running
        self.received: dict[str, float] = {}  # message id → when its webhook came (its `ingress`)
        self.webhooks: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.base = ""
        self.stream_broken = False  # answer 503 on the stream: the page must fall back to polling
        self.unauthorized = 0
        self.restarts = 0  # each ends the open streams: a worker restart, on fresh Redis

    def restart(self) -> None:
        """As a `switchboard up` run after another: every chat empty and numbered afresh, streams ended."""
        self.chats.clear()
        self.notes.clear()
        self.busy.clear()
        self.restarts += 1
        self.changed.set()
        self.changed = asyncio.Event()

    @staticmethod
    def _json(body: dict[str, Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_: web.Request) -> web.Response:
            return web.json_response(body)

        return handler

    @staticmethod
    def _bytes(body: bytes, content_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_: web.Request) -> web.Response:
            return web.Response(body=body, content_type=content_type)

        return handler

    @staticmethod
    async def _index(_: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    def deliver(self, chat_id: str, message: dict[str, Any]) -> None:
        chat = self.chats.setdefault(chat_id, [])
        chat.append({"seq": len(chat) + 1, **message})
        self.changed.set()
        self.changed = asyncio.Event()

    def note(self, chat_id: str, note: str, message_ids: list[str]) -> None:
        """A status note, as `begin_turn` publishes it: streamed live (an SSE `note` event), not kept."""
        self.notes.setdefault(chat_id, []).append({"note": note, "message_ids": message_ids})
        self.changed.set()
        self.changed = asyncio.Event()

    def notice(self, chat_id: str, text: str, reply_to: str | None, **extra: Any) -> str:
        outbound_id = f"notice-{len(self.chats.get(chat_id, [])) + 1}"
        now = time.time() * 1000
        self.deliver(
            chat_id,
            {
                "id": outbound_id,
                "kind": "notice",
                "chat_id": chat_id,
                "reply_to": reply_to,
                "segments": [_seg("text", text=text)],
                "trace_id": None,
                # As the worker stamps a notice: the hops of the message it answers.
                "hops": {"ingress": self.received[reply_to]} if reply_to in self.received else {},
                "delivered_at": now,
                **extra,
            },
        )
        return outbound_id

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.require_token])
        app.router.add_get("/console/", self._index)
        app.router.add_static("/console/static/", STATIC)
        app.router.add_get("/console/api/config", self._json({"bots": [BOT]}))
        app.router.add_get("/console/api/messages", self.messages)
        app.router.add_get("/console/api/usage", self._json(USAGE))
        app.router.add_get("/console/api/stream", self.stream)
        app.router.add_post("/webhooks/console/{bot_id}", self.webhook)
        app.router.add_get("/fake/pic.png", self._bytes(PNG, "image/png"))
        app.router.add_get("/fake/tone.wav", self._bytes(WAV, "audio/wav"))
        app.router.add_get("/fake/report.pdf", self._bytes(b"%PDF-1.4", "application/pdf"))
        return app

    @web.middleware
    async def require_token(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """As the worker does: the API and the webhook need the bot's token; the page does not."""
        if request.path.startswith(("/console/api/", "/webhooks/")):
            if request.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.unauthorized += 1
                return web.json_response({"error": "unauthorized"}, status=401)
            assert TOKEN not in request.path_qs, "the token must never be in a URL"
        response: web.StreamResponse = await handler(request)
        return response

    async def messages(self, request: web.Request) -> web.Response:
        assert request.query.get("bot_id") == BOT["bot_id"]
        chat_id = request.query["chat_id"]
        return web.json_response({"chat_id": chat_id, "messages": self.chats.get(chat_id, [])})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        if self.stream_broken:
            return web.json_response({"error": "no streaming here"}, status=503)
        chat_id = request.query["chat_id"]
        sent = int(request.query.get("after", "0"))  # the last seq the page has (seq n is index n - 1)
        noted = len(self.notes.get(chat_id, []))  # notes are live only: none from before
        restarts = self.restarts
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            while restarts == self.restarts:
                messages = self.chats.get(chat_id, [])
                for index in range(sent, len(messages)):
                    data = json.dumps(messages[index], ensure_ascii=False)
                    await response.write(f"id: {index + 1}\nevent: message\ndata: {data}\n\n".encode())
                sent = max(sent, len(messages))
                notes = self.notes.get(chat_id, [])
                for note in notes[noted:]:  # as the worker frames them: no id
                    await response.write(f"event: note\ndata: {json.dumps(note)}\n\n".encode())
                noted = len(notes)
                try:
                    await asyncio.wait_for(self.changed.wait(), 5)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        else:
            await response.write_eof()
        return response

    async def webhook(self, request: web.Request) -> web.Response:
        received = time.time() * 1000
        assert request.match_info["bot_id"] == BOT["bot_id"]
        body = await request.json()
        self.webhooks.append(body)
        self.received[body["message_id"]] = received
        chat_id = body["chat_id"]
        command = body["text"].strip().split(" ")[0] if body["text"].startswith("/") else None
        # As the worker decides it: a private chat, a mention of the bot, a reply to it, a command.
        addressed = (
            body["chat_type"] == "private"
            or BOT["self_id"] in body.get("mentions", [])
            or str(body.get("reply_to") or "").startswith("out-")
            or command is not None
        )
        if command == "/stop" and chat_id in self.busy:
            self.notice(chat_id, "Stopped.", self.busy.pop(chat_id))  # quoting the stopped turn's message
        elif "[busy]" in body["text"]:
            self.busy[chat_id] = body["message_id"]  # a long turn: no answer until the test says
        elif addressed and command is None and chat_id not in self.busy:  # held while busy: the test's notes say
            reply = [_seg("mention", target=body["user_id"]), _seg("text", text=f" echo: {body['text']}")]
            self.deliver(
                body["chat_id"],
                {
                    "id": f"out-echo-{len(self.webhooks)}",
                    "kind": "reply",
                    "chat_id": body["chat_id"],
                    "reply_to": body.get("message_id"),
                    "segments": reply,
                    "trace_id": "trace-echo",
                    "hops": {"ingress": received, "ingest": received + 2},
                    "delivered_at": received + 420,
                },
            )
        return web.json_response({"ok": True, "message_id": body.get("message_id"), "addressed": addressed})


async def _wait_for(predicate: Callable[[], bool], what: str, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------------------------------------
# The test


@dataclass
class Session:
    """The fake console, a headless Chromium on it, and what went wrong in the pages."""

    fake: FakeConsole
    browser: Any
    errors: list[str]

    async def page(self, context: Any = None, *, width: int = 1280, height: int = 900) -> Any:
        if context is None:
            context = await self.browser.new_context(viewport={"width": width, "height": height})
        page = await context.new_page()
        page.set_default_timeout(5000)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        # (the canned video 404s and the broken stream 503s on purpose)
        page.on(
            "console",
            lambda m: (
                self.errors.append(m.text)
                if m.type == "error" and not any(code in m.text for code in ("404", "503", "401"))
                else None
            ),
        )
        return page


@contextlib.asynccontextmanager
async def console_session() -> AsyncIterator[Session]:
    """The fake console with the canned chat, and Chromium (skips when either piece is missing)."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("the playwright Python package is not installed")
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium binary (apt-get install chromium, or set SWITCHBOARD_CHROMIUM)")

    fake = FakeConsole()
    runner = web.AppRunner(fake.app(), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.base = f"http://127.0.0.1:{port}"
    for message in canned_messages(fake.base):
        fake.deliver(CHAT, message)
    errors: list[str] = []
    try:
        async with async_playwright() as pw:
            try:
                browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            except Exception as exc:  # a broken local Chromium is an environment problem, not a page bug
                pytest.skip(f"Chromium does not start: {exc}")
            try:
                yield Session(fake, browser, errors)
            finally:
                await browser.close()
    finally:
        await runner.cleanup()
    assert not errors, errors


async def open_team_chat(page: Any) -> None:
    """The group chat of the canned messages, with Bob (an admin of the bot, by its configuration)
    and Carol; Bob sends."""
    await page.get_by_test_id("new-group").click()
    await page.get_by_test_id("chat-id-input").fill(CHAT)
    await page.get_by_test_id("chat-name-input").fill("Team room")
    await page.get_by_test_id("chat-create").click()
    await page.wait_for_selector(f".chat-item.active[data-chat={CHAT}][data-type=group]")
    for user_id, name in (("bob", "Bob"), ("carol", "Carol")):  # the last one added sends
        await page.get_by_test_id("new-user").click()
        await page.get_by_test_id("user-id-input").fill(user_id)
        await page.get_by_test_id("user-name-input").fill(name)
        await page.get_by_test_id("user-save").click()
        await page.wait_for_selector(f".user-item.active[data-user={user_id}]")
    await send_as(page, "bob")


async def send_as(page: Any, user_id: str) -> None:
    await page.get_by_test_id("sender-select").select_option(user_id)
    await page.wait_for_selector(f".user-item.active[data-user={user_id}]")


async def test_console_page() -> None:
    async with console_session() as session:
        fake = session.fake
        assert {s["type"] for m in fake.chats[CHAT] for s in m["segments"]} == set(SEGMENT_TYPES)
        page = await session.page()
        context = page.context
        browser = session.browser
        errors = session.errors

        # The token in the fragment: kept by the page, dropped from the address bar.
        await page.goto(f"{fake.base}/console/#token={TOKEN}")
        await page.wait_for_selector("html[data-ready=true]")
        assert TOKEN not in page.url
        # First visit: a default user and a private chat with the bot.
        await page.get_by_test_id("chat-list").locator(".chat-item[data-type=private]").wait_for()

        await open_team_chat(page)
        assert (await page.get_by_test_id("chat-name").text_content() or "") == "Team room"
        assert await page.locator(".user-item[data-user=bob] .admin-badge").count() == 1
        assert await page.locator(".user-item[data-user=carol] .admin-badge").count() == 0

        # Every canned bot message is there (SSE connected after the initial load).
        await page.wait_for_selector('.msg[data-id="out-6"]')
        await page.wait_for_selector("[data-testid=conn][data-state=live]")
        # The usage budgets' line: the chat against its limit (with the grant), the bot's total.
        await page.wait_for_selector("[data-testid=usage-line]:has-text('usage 2026-12-06')")
        usage_line = await page.get_by_test_id("usage-line").text_content() or ""
        assert "chat 1200/1500 tok, 3 s" in usage_line and "bot 5000 tok, 40 s" in usage_line

        # Mention the bot and Carol, send.
        await page.get_by_test_id("mention-bot").click()
        await page.get_by_test_id("mention-users").click()
        await page.locator("[data-testid=mention-option][data-target=carol]").click()
        assert await page.get_by_test_id("mention-chip").count() == 2
        await page.get_by_test_id("input").fill("hello bot, meet Carol")
        await page.get_by_test_id("input").press("Enter")
        await _wait_for(lambda: len(fake.webhooks) >= 1, what="the webhook")
        sent = fake.webhooks[0]
        message_id = sent.pop("message_id")
        assert isinstance(message_id, str) and message_id
        assert sent == {
            "chat_id": CHAT,
            "chat_type": "group",
            "user_id": "bob",
            "user_name": "Bob",
            "text": "hello bot, meet Carol",
            "mentions": ["switchboard", "carol"],
        }
        assert await page.get_by_test_id("mention-chip").count() == 0  # the composer is cleared

        # The echo arrives live over SSE, after our message, with its latency.
        echo = page.locator('.msg[data-id="out-echo-1"]')
        await echo.wait_for()
        assert "420 ms" in (await echo.locator("[data-testid=latency]").text_content() or "")
        order = await page.eval_on_selector_all("#messages .msg", "els => els.map(e => e.dataset.id)")
        assert order.index("out-6") < order.index(message_id) < order.index("out-echo-1")
        mine = page.locator(f'.msg[data-id="{message_id}"]')
        assert "msg--out" in (await mine.get_attribute("class") or "")
        assert await mine.locator("[data-seg=mention]").count() == 2
        await mine.locator(".status-sent").wait_for()

        # Every segment type is rendered.
        for kind in SEGMENT_TYPES:
            assert await page.locator(f'#messages [data-seg="{kind}"]').count() >= 1, kind
        md = page.locator('.msg[data-id="out-2"] .seg-markdown')
        for selector in (
            "h2",
            "strong",
            "em",
            "p code",
            "pre code",
            "ul li",
            "ul ul li",
            "ol li",
            "blockquote",
            'a[href="https://example.org/met?a=1&b=2"]',
        ):
            assert await md.locator(selector).count() >= 1, selector
        assert "<b>not bold</b>" in (await md.locator("pre code").text_content() or "")
        # Hostile markup stays text.
        assert await md.locator("img, script, a[href^=javascript]").count() == 0
        assert "<script>" in (await md.text_content() or "")
        assert await page.evaluate("window.__pwned") is None

        toys = page.locator('.msg[data-id="out-3"]')
        assert await toys.locator('.seg-reply[data-ref="out-2"]').count() == 1
        assert "Weather report" in (await toys.locator(".seg-reply").text_content() or "")
        assert "@carol" in (await toys.locator("[data-seg=mention]").text_content() or "")
        assert "👍" in (await toys.locator('[data-seg=face][data-id="76"]').text_content() or "")
        assert "🎲" in (await toys.locator("[data-seg=dice]").text_content() or "")
        assert "✊" in (await toys.locator("[data-seg=rps]").text_content() or "")
        assert "fw-1234" in (await toys.locator("[data-seg=forward]").text_content() or "")

        media = page.locator('.msg[data-id="out-4"]')
        url_img = media.locator(f'[data-seg=image][data-kind=url] img[src="{fake.base}/fake/pic.png"]')
        assert await url_img.count() == 1
        b64_src = await media.locator("[data-seg=image][data-kind=base64] img").get_attribute("src") or ""
        assert b64_src.startswith("data:image/png;base64,iVBORw0KGgo")
        loaded = "[...document.querySelectorAll('.seg-image img')].filter(i => i.complete && i.naturalWidth)"
        await page.wait_for_function(f"() => {loaded}.length >= 2")
        assert "chart.png" in (await media.locator("[data-seg=image][data-kind=path]").text_content() or "")
        assert await media.locator(f'[data-seg=audio] audio[src="{fake.base}/fake/tone.wav"]').count() == 1
        assert await media.locator(f'[data-seg=video] video[src="{fake.base}/fake/clip.mp4"]').count() == 1
        assert await media.locator(f'a[data-seg=file][download][href="{fake.base}/fake/report.pdf"]').count() == 1
        file_b64 = await media.locator("a[data-seg=file][data-kind=base64]").get_attribute("href") or ""
        assert file_b64.startswith("data:application/pdf;base64,")
        assert await media.locator("[data-seg=file][data-kind=file]:not(a)").count() == 1
        share = media.locator('a[data-seg=share][href="https://example.com/articles/42"]')
        assert "How the switchboard routes messages" in (await share.text_content() or "")

        # Kinds look different: the notice is a banner, progress and confirmation are marked.
        style = "e => ['backgroundColor', 'borderTopColor', 'borderTopStyle'].map(k => getComputedStyle(e)[k])"
        notice_style = await page.locator('.msg[data-id="out-1"].msg--notice .bubble').evaluate(style)
        reply_style = await page.locator('.msg[data-id="out-2"].msg--reply .bubble').evaluate(style)
        progress_style = await page.locator('.msg[data-id="out-5"].msg--progress .bubble').evaluate(style)
        assert notice_style != reply_style
        assert notice_style[0] != reply_style[0]  # a different background
        assert progress_style[2] == "dashed"
        assert await page.locator('.msg[data-id="out-1"] .latency').count() == 1

        # Reply to a bot message: click it, send; reply_to goes to the webhook.
        await page.locator('.msg[data-id="out-2"] .msg-head').click()
        await page.get_by_test_id("reply-bar").wait_for()
        await page.get_by_test_id("input").fill("thanks!")
        await page.get_by_test_id("send").click()
        await _wait_for(lambda: len(fake.webhooks) >= 2, what="the reply webhook")
        assert fake.webhooks[1]["reply_to"] == "out-2"
        assert fake.webhooks[1]["mentions"] == []
        assert await page.get_by_test_id("reply-bar").is_hidden()
        await page.locator('.msg[data-id="out-echo-2"]').wait_for()
        thanks_id = await page.locator(".msg--person", has_text="thanks!").get_attribute("data-id")
        order = await page.eval_on_selector_all("#messages .msg", "els => els.map(e => e.dataset.id)")
        assert order[-4:] == [message_id, "out-echo-1", thanks_id, "out-echo-2"], order

        # The confirmation's Allow button sends /allow as the current user, then shows it answered.
        await page.locator('.msg[data-id="out-6"] [data-testid=confirm-allow]').click()
        await _wait_for(lambda: len(fake.webhooks) >= 3, what="/allow")
        assert fake.webhooks[2]["text"] == "/allow"
        assert fake.webhooks[2]["user_id"] == "bob"
        await page.wait_for_selector('.msg[data-id="out-6"] [data-testid=confirm-allow]:disabled')

        # Quick command buttons, as another user.
        await page.get_by_test_id("sender-select").select_option("carol")
        await page.get_by_test_id("cmd-stop").click()
        await _wait_for(lambda: len(fake.webhooks) >= 4, what="/stop")
        assert {k: fake.webhooks[3][k] for k in ("text", "user_id")} == {"text": "/stop", "user_id": "carol"}
        assert "is_admin" not in fake.webhooks[3]

        await page.get_by_test_id("sender-select").select_option("bob")
        # A tall window, so that the screenshot shows the whole conversation.
        height = await page.evaluate("() => document.querySelector('#messages').scrollHeight + 260")
        await page.set_viewport_size({"width": 1280, "height": min(height, 4000)})
        await page.wait_for_timeout(150)
        await page.screenshot(path=str(SCREENSHOT))
        await page.set_viewport_size({"width": 1280, "height": 900})

        # The markdown renderer keeps hostile input inert.
        hostile = [
            "[x](javascript:alert(1))",
            "![x](javascript:alert(1))",
            '[x](https://a.b/"onmouseover="alert(1))',
            'https://a.b/"onmouseover="alert(1)',
            "**<b>bold</b>**",
            "`<i>code</i>`",
            "<a href=x>y</a>",
            "# <svg onload=alert(1)>",
            "- <img src=x>",
            "| <b>h</b> |\n|---|\n| <i>c</i> |",
            "[x](data:text/html,hi)",
        ]
        rendered = await page.evaluate("xs => xs.map(SwitchboardConsole.renderMarkdown).join('\\n')", hostile)
        for bad in ("<b>", "<i>", "<a href=x", "<svg", "<img src=x", '="javascript', '"onmouseover', '="data:'):
            assert bad not in rendered, (bad, rendered)

        # The polling fallback: a second tab whose stream fails polls, and sees a new delivery.
        fake.stream_broken = True
        poller = await context.new_page()
        poller.on("pageerror", lambda exc: errors.append(str(exc)))
        await poller.goto(f"{fake.base}/console/")  # no fragment: the kept token is used
        await poller.wait_for_selector("[data-testid=conn][data-state=polling]", timeout=6000)
        await poller.wait_for_selector('.msg[data-id="out-6"]')
        # Local messages are per tab (sessionStorage): the new tab shows only the bot's.
        assert await poller.locator(f'.msg[data-id="{message_id}"]').count() == 0
        late = [_seg("text", text="Stopped.")]
        fake.deliver(
            CHAT,
            {
                "id": "out-late",
                "kind": "notice",
                "chat_id": CHAT,
                "reply_to": None,
                "segments": late,
                "trace_id": None,
                "hops": {},
                "delivered_at": time.time() * 1000,
            },
        )
        await poller.locator('.msg[data-id="out-late"]').wait_for(timeout=4000)
        await page.locator('.msg[data-id="out-late"]').wait_for(timeout=4000)  # and live in the first tab
        assert fake.unauthorized == 0, "the page sent a request without its token"

        # A browser that has no token: the page asks for it, and works once it is entered.
        stranger = await (await browser.new_context()).new_page()
        stranger.on("pageerror", lambda exc: errors.append(str(exc)))
        await stranger.goto(f"{fake.base}/console/")
        await stranger.get_by_test_id("settings-dialog").wait_for()
        assert fake.unauthorized >= 1
        await stranger.get_by_test_id("token-input").fill(TOKEN)
        await stranger.get_by_test_id("token-input").press("Enter")
        await stranger.wait_for_selector("html[data-ready=true]", timeout=8000)
        await stranger.get_by_test_id("new-group").click()
        await stranger.get_by_test_id("chat-id-input").fill(CHAT)
        await stranger.get_by_test_id("chat-create").click()
        await stranger.locator('.msg[data-id="out-late"]').wait_for(timeout=4000)


SHOTS = Path("/tmp/ui-shots")
# The README's directive table (its section), which the page's cheat-sheet mirrors.
README_DIRECTIVES = (
    (Path(__file__).resolve().parents[2] / "README.md")
    .read_text(encoding="utf-8")
    .split("### Simulator directives", 1)[1]
    .split("\n## ", 1)[0]
)
# The console bot as the worker would configure it for the canned chat (the page's BOT).
WORKER_BOT = BotConfig.model_validate(
    {"platform": "console", "bot_id": BOT["bot_id"], "self_id": BOT["self_id"], "admins": BOT["admins"]}
)


def as_worker_reads_it(body: dict[str, Any]) -> tuple[list[tuple[str, str]], str]:
    """What the page sent, read by the real console platform: its segments, and the text the agent
    gets (ingest's content blocks)."""
    result = ConsolePlatform().parse(WORKER_BOT, WebhookRequest(headers={}, body=json.dumps(body).encode()))
    (message,) = result.messages
    segments: list[tuple[str, str]] = [
        (s.type, s.data.target if s.type == "mention" else s.data.text)  # type: ignore[union-attr]
        for s in message.segments
    ]
    return segments, str(content_blocks(message, WORKER_BOT, label_sender=False)[0]["text"])


async def segments_of(message: Any) -> list[str]:
    return list(
        await message.locator(".msg-body > .seg").evaluate_all(
            "els => els.map(e => e.dataset.seg === 'mention' ? '@' + e.dataset.target : e.textContent)"
        )
    )


async def shot(page: Any, name: str) -> None:
    await page.screenshot(path=f"{SHOTS}/{name}")  # Playwright makes the directory


async def test_console_page_mentions_statuses_refusals_and_quotes() -> None:
    async with console_session() as session:
        fake = session.fake
        page = await session.page()
        await page.goto(f"{fake.base}/console/#token={TOKEN}")
        await page.wait_for_selector("html[data-ready=true]")
        await open_team_chat(page)
        await page.wait_for_selector('.msg[data-id="out-8"]')
        await page.wait_for_selector("[data-testid=conn][data-state=live]")
        box = page.get_by_test_id("input")
        suggest = page.get_by_test_id("mention-suggest")
        offered = "() => [...document.querySelectorAll('[data-testid=mention-suggestion]')].map(e => e.dataset.target)"
        selected = "[data-testid=mention-suggestion][aria-selected=true]"

        # (12, at the end) The first message this tab keeps: a reply to the bot's weather report.
        await page.locator('.msg[data-id="out-2"] .msg-head').click()
        await box.fill("thanks!")
        await box.press("Enter")
        await _wait_for(lambda: len(fake.webhooks) >= 1, what="the reply")
        thanks = str(fake.webhooks[0]["message_id"])
        await page.locator('.msg[data-id="out-echo-1"]').wait_for()

        # 8. Typing `@` offers the bot first, then the members (not the sender); arrows move, Enter
        # picks and writes `@id `; typing narrows by id or name, any case; Escape closes.
        await box.click()
        await page.keyboard.type("hi @")
        await suggest.wait_for()
        assert await page.evaluate(offered) == ["switchboard", "alice", "carol"]  # Alice: the first visit's user
        assert await page.locator(selected).get_attribute("data-target") == "switchboard"
        for key in ("ArrowUp", "ArrowDown", "ArrowDown"):  # Up wraps to the last
            await page.keyboard.press(key)
        assert await page.locator(selected).get_attribute("data-target") == "alice"
        await page.keyboard.press("ArrowDown")
        assert await page.locator(selected).get_attribute("data-target") == "carol"
        await shot(page, "1-mention-suggestions.png")
        await page.keyboard.press("Enter")
        assert await box.input_value() == "hi @carol "
        await suggest.wait_for(state="hidden")
        await page.keyboard.type("and @SW")
        assert await page.evaluate(offered) == ["switchboard"]
        await page.keyboard.press("Tab")
        await page.keyboard.type("@")
        await suggest.wait_for()
        await page.keyboard.press("Escape")
        await suggest.wait_for(state="hidden")
        await page.keyboard.press("Backspace")
        await page.keyboard.type("see me@carol.com or @nobody")  # an address, a stranger: nothing offered
        await suggest.wait_for(state="hidden")
        await page.keyboard.type(", thanks @Ca")  # by name
        assert await page.evaluate(offered) == ["carol"]
        await page.keyboard.press("Enter")
        await page.keyboard.type("bye")
        await page.keyboard.press("Enter")  # nothing offered: Enter sends
        await _wait_for(lambda: len(fake.webhooks) >= 2, what="the typed mentions")
        typed = fake.webhooks[1]
        text = "hi @carol and @switchboard see me@carol.com or @nobody, thanks @carol bye"
        assert (typed["text"], typed["mentions"]) == (text, ["carol", "switchboard"])
        mine = page.locator(f'.msg[data-id="{typed["message_id"]}"]')
        expected = ["hi ", "@carol", " and ", "@switchboard", " see me@carol.com or @nobody, thanks ", "@carol", " bye"]
        assert await segments_of(mine) == expected
        # The worker reads them the same way, in place; the bot's own mention is not in the text.
        segments, agent_text = as_worker_reads_it(typed)
        assert [v if k == "text" else f"@{v}" for k, v in segments] == expected
        assert agent_text == "hi @carol and  see me@carol.com or @nobody, thanks @carol bye"
        await page.locator('.msg[data-id="out-echo-2"]').wait_for()  # addressed (the bot is mentioned)
        assert await mine.locator("[data-note=unaddressed]").count() == 0

        # 11. A chip (the "@ user…" menu) then text: apart on the page and on the way to the agent.
        await page.get_by_test_id("mention-users").click()
        await page.locator("[data-testid=mention-option][data-target=carol]").click()
        await box.fill("hey")
        await box.press("Enter")
        await _wait_for(lambda: len(fake.webhooks) >= 3, what="the chip message")
        chip = fake.webhooks[2]
        assert (chip["text"], chip["mentions"]) == ("hey", ["carol"])
        assert await segments_of(page.locator(f'.msg[data-id="{chip["message_id"]}"]')) == ["@carol", "hey"]
        assert as_worker_reads_it(chip)[1] == "@carol hey"

        # 14. That message did not reach the agent (a group, no mention of the bot): it says so.
        note = page.locator(f'.msg[data-id="{chip["message_id"]}"] [data-note=unaddressed]')
        assert (await note.text_content() or "") == "not addressed to the bot"
        # A reply the correction call fixed says so; others do not.
        assert (await page.locator('.msg[data-id="out-7"] [data-note=corrected]').text_content() or "") == "corrected"
        assert await page.locator('.msg[data-id="out-2"] [data-note]').count() == 0

        # 13. Each refused image is a placeholder of its own, with the worker's reason, as text.
        refused_media = page.locator('.msg[data-id="out-8"] [data-testid=attachment-unavailable]')
        assert await refused_media.count() == 2
        first, second = [await refused_media.nth(i).bounding_box() for i in (0, 1)]
        assert (
            first
            and second
            and (first["x"] + first["width"] < second["x"] or first["y"] + first["height"] <= second["y"])
        )
        assert await refused_media.nth(0).get_attribute("data-reason") == "too_large"
        assert (await refused_media.nth(0).text_content() or "") == "[attachment unavailable] · too large"
        assert HOSTILE.replace("_", " ") in (await refused_media.nth(1).text_content() or "")
        assert await page.locator('.msg[data-id="out-8"] img').count() == 0

        # 9. Carol may not answer the confirmation: the worker refuses her /allow. The card stays
        # open (buttons enabled, not "answered"); the refusal is shown to Carol only, as text.
        card = page.locator('.msg[data-id="out-6"]')
        await send_as(page, "carol")
        await card.get_by_test_id("confirm-allow").click()
        await _wait_for(lambda: len(fake.webhooks) >= 4, what="Carol's /allow")
        carols = fake.webhooks[3]
        assert (carols["text"], carols["user_id"]) == ("/allow", "carol")
        # Until the worker says, Carol's answer is pending (she is not an admin): the card stays open.
        await page.wait_for_selector(
            '.msg[data-id="out-6"] .confirm-hint:has-text("/allow by Carol: waiting for the bot")'
        )
        assert await card.get_by_test_id("confirm-allow").is_enabled()
        # The worker's refusal: a notice quoting her answer, marked `refused` (hostile text included:
        # the page must show it as text).
        refusal_id = fake.notice(
            CHAT, f"Only @bob / admins may answer this confirmation. {HOSTILE}", carols["message_id"], notes=["refused"]
        )
        refusal = card.get_by_test_id("confirm-refused")
        await refusal.wait_for()
        assert "Only @bob / admins may answer this confirmation." in (await refusal.text_content() or "")
        assert HOSTILE in (await refusal.text_content() or "")
        assert await card.get_by_test_id("confirm-allow").is_enabled()
        assert await card.get_by_test_id("confirm-deny").is_enabled()
        assert "answered" not in (await card.locator(".confirm-hint").text_content() or "")
        carols_message = page.locator(f'.msg[data-id="{carols["message_id"]}"]')
        assert "Only @bob" in (await carols_message.get_by_test_id("msg-refused").text_content() or "")
        assert await page.locator(f'.msg[data-id="{refusal_id}"]').count() == 0  # not a message to all
        await card.scroll_into_view_if_needed()
        await shot(page, "2-refused-confirmation.png")
        # Bob sees the card open, without Carol's refusal, and answers it.
        await send_as(page, "bob")
        await refusal.wait_for(state="detached")
        await card.get_by_test_id("confirm-allow").click()
        await _wait_for(lambda: len(fake.webhooks) >= 5, what="Bob's /allow")
        await page.wait_for_selector('.msg[data-id="out-6"] [data-testid=confirm-allow]:disabled')
        assert (await card.locator(".confirm-hint").text_content() or "") == "answered: /allow by Bob"
        assert await page.evaluate("window.__pwned") is None
        # A next confirmation, answered by Carol (say, the turn's starter): pending until the bot
        # goes on, then answered. Bob's earlier /allow was for the first card, not this one.
        now = time.time() * 1000
        second_card = {"id": "out-c2", "kind": "confirmation", "chat_id": CHAT, "reply_to": None, "trace_id": None}
        fake.deliver(CHAT, second_card | {"segments": [_seg("text", text="Run rm?")], "hops": {}, "delivered_at": now})
        card2 = page.locator('.msg[data-id="out-c2"]')
        await card2.wait_for()
        assert (await card2.locator(".confirm-hint").text_content() or "") == "as Bob"
        await send_as(page, "carol")
        await card2.get_by_test_id("confirm-deny").click()
        await page.wait_for_selector(
            '.msg[data-id="out-c2"] .confirm-hint:has-text("/deny by Carol: waiting for the bot")'
        )
        assert await card2.get_by_test_id("confirm-allow").is_enabled()
        denied = [_seg("text", text="tool denied")]
        denied_reply = {"id": "out-denied", "kind": "reply", "segments": denied, "hops": {}}
        fake.deliver(CHAT, second_card | denied_reply | {"delivered_at": time.time() * 1000})
        await page.wait_for_selector('.msg[data-id="out-c2"] [data-testid=confirm-allow]:disabled')
        assert (await card2.locator(".confirm-hint").text_content() or "") == "answered: /deny by Carol"
        assert (await card.locator(".confirm-hint").text_content() or "") == "answered: /allow by Bob"
        await send_as(page, "bob")

        # 10. While the bot is busy, messages are held, then merged into one turn, released, or
        # dropped by /stop, as the worker's notes arrive (live).
        async def say(text: str) -> str:
            count = len(fake.webhooks)
            await box.fill(text)
            await box.press("Enter")
            await _wait_for(lambda: len(fake.webhooks) > count, what=text)
            return str(fake.webhooks[-1]["message_id"])

        def note_of(message_id: str) -> Any:
            return page.locator(f'.msg[data-id="{message_id}"] .msg-note:not([data-note=unaddressed])')

        long_task = await say("@switchboard [busy] a long task")
        second, third = await say("@switchboard second"), await say("@switchboard third")
        for held in (second, third):
            fake.note(CHAT, "held", [held])
            await page.wait_for_selector(f'.msg[data-id="{held}"] [data-note=held]')
        assert (await note_of(second).text_content() or "") == "held"
        await shot(page, "3-held.png")
        fake.note(CHAT, "merged", [second, third])
        for merged in (second, third):
            await page.wait_for_selector(f'.msg[data-id="{merged}"] [data-note=merged]')
            assert await note_of(merged).count() == 1  # "merged" replaced "held"
        fourth = await say("@switchboard fourth")
        fake.note(CHAT, "held", [fourth])
        await page.wait_for_selector(f'.msg[data-id="{fourth}"] [data-note=held]')
        fake.note(CHAT, "released", [fourth])
        await page.wait_for_selector(f'.msg[data-id="{fourth}"] [data-note=released]')
        fifth = await say("@switchboard fifth")
        fake.note(CHAT, "held", [fifth])
        await page.wait_for_selector(f'.msg[data-id="{fifth}"] [data-note=held]')

        # 15. /stop drops what waited, and its "Stopped." quotes the stopped message.
        await page.get_by_test_id("cmd-stop").click()
        fake.note(CHAT, "dropped", [fifth])
        await page.wait_for_selector(f'.msg[data-id="{fifth}"] [data-note=dropped]')
        stopped = page.locator(".msg--notice", has_text="Stopped.")
        await stopped.wait_for()
        assert await stopped.locator(f'.seg-reply[data-ref="{long_task}"]').count() == 1
        assert "a long task" in (await stopped.locator(".quote-text").text_content() or "")
        await shot(page, "4-notes-and-stopped.png")

        # 12. After a reload the quotes show the quoted text, the notes stay: the messages kept in
        # this tab are drawn before the history arrives, and again once it has.
        await page.reload()
        await page.wait_for_selector("html[data-ready=true]")
        await page.wait_for_selector('.msg[data-id="out-8"]')
        quote = page.locator(f'.msg[data-id="{thanks}"] .seg-reply[data-ref="out-2"] .quote-text')
        await page.wait_for_function(
            "q => (document.querySelector(q) || {}).textContent?.includes('Weather report')",
            arg=f'.msg[data-id="{thanks}"] .seg-reply .quote-text',
        )
        assert "out-2" not in (await quote.text_content() or "")
        assert "a long task" in (await stopped.locator(".quote-text").text_content() or "")
        assert (await note_of(second).text_content() or "") == "merged"
        assert (await note_of(fifth).text_content() or "") == "dropped"
        # A second tab (its own sent messages) does not show Carol's refusal at all.
        other = await session.page(page.context)
        await other.goto(f"{fake.base}/console/")
        await other.wait_for_selector('.msg[data-id="out-8"]')
        assert await other.locator(f'.msg[data-id="{refusal_id}"]').count() == 0
        assert await other.get_by_test_id("confirm-refused").count() == 0
        await other.close()

        # The directive cheat-sheet mirrors the README's table; a click puts one in the message.
        directives = re.findall(r"`(\[sim:[^`]*\])`", README_DIRECTIVES)
        sheet = page.get_by_test_id("directives")
        await sheet.locator("summary").click()
        shown = await sheet.locator("[data-insert]").evaluate_all("els => els.map(e => e.textContent)")
        table = [d for d in directives if not d.startswith('[sim:reply={"segments":[{')]  # the example
        assert shown == table and len(shown) >= 14, (shown, table)
        await box.fill("")
        await sheet.locator('[data-insert="[sim:think=2]"]').click()
        assert await box.input_value() == "[sim:think=2] "
        await shot(page, "5-directives.png")

        # 15. "+ Private": the suggested chat id is a placeholder (faint, slanted, explained), not
        # a value; an empty field takes it.
        await page.get_by_test_id("new-private").click()
        chat_id = page.get_by_test_id("chat-id-input")
        assert await chat_id.input_value() == ""
        assert await chat_id.get_attribute("placeholder") == "e.g. dm-bob"
        assert (await page.get_by_test_id("chat-id-hint").text_content() or "") == "Leave empty to use dm-bob."
        placeholder_style = await chat_id.evaluate(
            "e => { const p = getComputedStyle(e, '::placeholder');"
            " return [p.fontStyle, p.opacity, getComputedStyle(e).color, p.color] }"
        )
        assert placeholder_style[0] == "italic" and float(placeholder_style[1]) < 1
        assert placeholder_style[2] != placeholder_style[3]
        await shot(page, "6-new-private-dialog.png")
        await page.get_by_test_id("chat-create").click()
        await page.wait_for_selector(".chat-item.active[data-chat=dm-bob][data-type=private]")

        # At phone width the composer's placeholder is not clipped.
        await box.fill("")
        await page.set_viewport_size({"width": 375, "height": 740})
        await page.wait_for_timeout(100)
        placeholder_room = """e => {
            const s = getComputedStyle(e), probe = document.createElement('span');
            probe.style.cssText = `position:absolute;visibility:hidden;white-space:pre;font:${s.font}`;
            probe.textContent = e.placeholder;
            document.body.append(probe);
            const width = probe.getBoundingClientRect().width;
            probe.remove();
            const room = e.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
            return [e.placeholder, width, room];
        }"""
        fits = await box.evaluate(placeholder_room)
        assert fits[0] == "Message the bot…" and fits[1] <= fits[2], fits
        await page.get_by_test_id("menu-btn").click()  # the sidebar, folded away at this width
        await page.locator(f".chat-item[data-chat={CHAT}] .chat-open").click()
        await page.wait_for_selector(f".chat-item.active[data-chat={CHAT}]")
        fits = await box.evaluate(placeholder_room)
        assert fits[0] == "Message the group…" and fits[1] <= fits[2], fits
        await page.wait_for_timeout(300)  # the sidebar's slide out, for the picture only
        await shot(page, "7-phone-375.png")


def bot_message(fake: FakeConsole, kind: str, text: str, reply_to: str, trace_id: str) -> str:
    """A delivery of the bot answering `reply_to` (hops from its webhook, as the worker stamps them)."""
    outbound_id = f"out-{kind}-{len(fake.chats.get(CHAT, [])) + 1}"
    fake.deliver(
        CHAT,
        {
            "id": outbound_id,
            "kind": kind,
            "chat_id": CHAT,
            "reply_to": reply_to,
            "segments": [_seg("text", text=text)],
            "trace_id": trace_id,
            "hops": {"ingress": fake.received[reply_to]},
            "delivered_at": time.time() * 1000,
        },
    )
    return outbound_id


async def test_console_page_shows_the_bot_typing_while_its_turn_runs() -> None:
    async with console_session() as session:
        fake = session.fake
        page = await session.page()
        await page.goto(f"{fake.base}/console/#token={TOKEN}")
        await page.wait_for_selector("html[data-ready=true]")
        await open_team_chat(page)
        await page.wait_for_selector('.msg[data-id="out-8"]')
        typing = page.get_by_test_id("typing")
        assert await typing.count() == 0  # history only: nothing running

        # Chatter the bot does not read starts nothing.
        await page.get_by_test_id("input").fill("just chatting")
        await page.get_by_test_id("input").press("Enter")
        await page.locator(".msg--person", has_text="just chatting").locator(".note-unaddressed").wait_for()
        assert await typing.count() == 0

        # A message to the bot that it takes long over: typing until the answer, progress or not.
        await page.get_by_test_id("mention-bot").click()
        await page.get_by_test_id("input").fill("[busy] think it over")
        await page.get_by_test_id("input").press("Enter")
        await _wait_for(lambda: len(fake.webhooks) >= 2, what="the webhook")
        asked = fake.webhooks[1]["message_id"]
        await typing.wait_for()
        assert "is typing" in (await typing.text_content() or "")
        last = await page.eval_on_selector("#messages", "box => box.lastElementChild.id")
        assert last == "typing"  # below the newest message
        progress = bot_message(fake, "progress", "Searching…", asked, "trace-busy")
        await page.locator(f'.msg[data-id="{progress}"]').wait_for()
        assert await typing.count() == 1
        confirmation = bot_message(fake, "confirmation", "Run bash with {}? /allow or /deny", asked, "trace-busy")
        await page.locator(f'.msg[data-id="{confirmation}"]').wait_for()
        await typing.wait_for(state="detached")  # the bot waits for people now, it is not working

        # The answer starts it again; the reply ends it, and its latency says what it includes.
        await page.locator(f'.msg[data-id="{confirmation}"] [data-testid=confirm-allow]').click()
        await _wait_for(lambda: len(fake.webhooks) >= 3, what="/allow")
        await typing.wait_for()
        reply = bot_message(fake, "reply", "Done.", asked, "trace-busy")
        await page.locator(f'.msg[data-id="{reply}"]').wait_for()
        await typing.wait_for(state="detached")
        chip = page.locator(f'.msg[data-id="{reply}"] [data-testid=latency]')
        assert "until /allow" in (await chip.text_content() or "")
        title = await chip.get_attribute("title") or ""
        assert "after the message that started this turn" in title and "waiting for /allow" in title
        assert "webhook" not in title
        await shot(page, "8-typing-done.png")


async def test_console_page_keeps_both_sides_of_a_chat_or_neither_after_a_restart() -> None:
    async with console_session() as session:
        fake = session.fake
        page = await session.page()
        await page.goto(f"{fake.base}/console/#token={TOKEN}")
        await page.wait_for_selector("html[data-ready=true]")
        await open_team_chat(page)
        await page.wait_for_selector("[data-testid=conn][data-state=live]")
        await page.get_by_test_id("mention-bot").click()
        await page.get_by_test_id("input").fill("before the restart")
        await page.get_by_test_id("input").press("Enter")
        await page.locator('.msg[data-id="out-echo-1"]').wait_for()

        # A reload with the server as it was: both sides.
        await page.reload()
        await page.wait_for_selector('.msg[data-id="out-echo-1"]')
        assert await page.locator(".msg--person", has_text="before the restart").count() == 1

        # The server restarts on fresh storage while the page is open: the page sees its chat is
        # gone and clears its own side too; what comes next is shown (the new server numbers the
        # chat from 1 again, below what the page had seen).
        fake.restart()
        await page.locator(".msg--person", has_text="before the restart").wait_for(state="detached")
        assert await page.locator('.msg[data-id="out-echo-1"]').count() == 0
        assert await page.locator("#messages .msg").count() == 0
        assert "cleared here too" in (await page.locator("#banner").text_content() or "")
        await page.wait_for_selector("[data-testid=conn][data-state=live]")
        await page.get_by_test_id("mention-bot").click()
        await page.get_by_test_id("input").fill("after the restart")
        await page.get_by_test_id("input").press("Enter")
        await page.locator('.msg[data-id="out-echo-2"]').wait_for()
        assert fake.chats[CHAT][0]["id"] == "out-echo-2" and fake.chats[CHAT][0]["seq"] == 1
        assert await page.locator(".msg--person", has_text="after the restart").count() == 1

        # A restart while the tab is closed: the reload finds the chat gone, and shows neither side.
        fake.restart()
        await page.reload()
        await page.wait_for_selector("html[data-ready=true]")
        await page.wait_for_selector("[data-testid=conn][data-state=live]")
        assert await page.locator("#messages .msg").count() == 0
