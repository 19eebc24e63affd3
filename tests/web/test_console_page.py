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
import json
import math
import os
import shutil
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pipeline.segments.models import SEGMENT_TYPES, segment_list_adapter

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


CONFIRMATION = "The agent wants to run **bash**: `ls -la /tmp`.\nReply /allow or /deny."


def canned_messages(base: str) -> list[dict[str, Any]]:
    now = time.time() * 1000
    t0 = now - 5 * 60_000

    def msg(n: int, kind: str, segments: list[dict[str, Any]], reply_to: str | None = None) -> dict[str, Any]:
        ingress = t0 + n * 20_000
        segment_list_adapter.validate_python(segments)  # the canned data obeys the real contract
        return {
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
    ]


# ------------------------------------------------------------------------------------------------
# The fake server


class FakeConsole:
    def __init__(self) -> None:
        self.chats: dict[str, list[dict[str, Any]]] = {}
        self.webhooks: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.base = ""
        self.stream_broken = False  # answer 503 on the stream: the page must fall back to polling
        self.unauthorized = 0

    @staticmethod
    def _json(body: dict[str, Any]):
        async def handler(_: web.Request) -> web.Response:
            return web.json_response(body)

        return handler

    @staticmethod
    def _bytes(body: bytes, content_type: str):
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

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.require_token])
        app.router.add_get("/console/", self._index)
        app.router.add_static("/console/static/", STATIC)
        app.router.add_get("/console/api/config", self._json({"bots": [BOT]}))
        app.router.add_get("/console/api/messages", self.messages)
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
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            while True:
                messages = self.chats.get(chat_id, [])
                for index in range(sent, len(messages)):
                    data = json.dumps(messages[index], ensure_ascii=False)
                    await response.write(f"id: {index + 1}\nevent: message\ndata: {data}\n\n".encode())
                sent = max(sent, len(messages))
                try:
                    await asyncio.wait_for(self.changed.wait(), 5)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    async def webhook(self, request: web.Request) -> web.Response:
        received = time.time() * 1000
        assert request.match_info["bot_id"] == BOT["bot_id"]
        body = await request.json()
        self.webhooks.append(body)
        if not body["text"].startswith("/"):
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
        return web.json_response({"ok": True, "message_id": body.get("message_id")})


async def _wait_for(predicate: Callable[[], bool], what: str, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------------------------------------
# The test


async def test_console_page() -> None:
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
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.base = f"http://127.0.0.1:{port}"
    for message in canned_messages(fake.base):
        fake.deliver(CHAT, message)
    assert {s["type"] for m in fake.chats[CHAT] for s in m["segments"]} == set(SEGMENT_TYPES)

    errors: list[str] = []
    try:
        async with async_playwright() as pw:
            try:
                browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            except Exception as exc:  # a broken local Chromium is an environment problem, not a page bug
                pytest.skip(f"Chromium does not start: {exc}")
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            page = await context.new_page()
            page.set_default_timeout(5000)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # (the canned video 404s and the broken stream 503s on purpose)
            page.on(
                "console",
                lambda m: (
                    errors.append(m.text)
                    if m.type == "error" and not any(code in m.text for code in ("404", "503", "401"))
                    else None
                ),
            )

            # The token in the fragment: kept by the page, dropped from the address bar.
            await page.goto(f"{fake.base}/console/#token={TOKEN}")
            await page.wait_for_selector("html[data-ready=true]")
            assert TOKEN not in page.url
            # First visit: a default user and a private chat with the bot.
            await page.get_by_test_id("chat-list").locator(".chat-item[data-type=private]").wait_for()

            # A group chat.
            await page.get_by_test_id("new-group").click()
            await page.get_by_test_id("chat-id-input").fill(CHAT)
            await page.get_by_test_id("chat-name-input").fill("Team room")
            await page.get_by_test_id("chat-create").click()
            await page.wait_for_selector(f".chat-item.active[data-chat={CHAT}][data-type=group]")
            assert (await page.get_by_test_id("chat-name").text_content() or "") == "Team room"

            # Two users: Bob (an admin of the bot, by its configuration) and Carol; the last one added
            # is the sender, switch back to Bob.
            for user_id, name in (("bob", "Bob"), ("carol", "Carol")):
                await page.get_by_test_id("new-user").click()
                await page.get_by_test_id("user-id-input").fill(user_id)
                await page.get_by_test_id("user-name-input").fill(name)
                await page.get_by_test_id("user-save").click()
                await page.wait_for_selector(f".user-item.active[data-user={user_id}]")
            await page.get_by_test_id("sender-select").select_option("bob")
            await page.wait_for_selector(".user-item.active[data-user=bob]")
            assert await page.locator(".user-item[data-user=bob] .admin-badge").count() == 1
            assert await page.locator(".user-item[data-user=carol] .admin-badge").count() == 0

            # Every canned bot message is there (SSE connected after the initial load).
            await page.wait_for_selector('.msg[data-id="out-6"]')
            await page.wait_for_selector("[data-testid=conn][data-state=live]")

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
            await browser.close()
    finally:
        await runner.cleanup()
    assert not errors, errors
