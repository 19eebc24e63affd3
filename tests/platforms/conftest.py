"""A local stand-in for each platform's HTTP API: a real aiohttp server on 127.0.0.1 that records
every request and answers with scripted responses, so `send()` is tested over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from pipeline.segments import MediaChecker, MediaSettings, SafeFetcher
from pipeline.segments.models import Media


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    json: Any = None
    form: dict[str, str] = field(default_factory=dict)
    files: dict[str, tuple[str, bytes, str]] = field(default_factory=dict)


Answer = tuple[int, Any] | tuple[int, Any, dict[str, str]]
Handler = Callable[[Seen], Answer | Awaitable[Answer]]


class FakeApi:
    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.routes: dict[str, list[Handler]] = {}
        self.defaults: dict[str, Handler] = {}
        # Paths with ids in them (`/v2/groups/{id}/messages`): a prefix → handler, after exact paths.
        self.prefixes: dict[str, Handler] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None

    def on(self, path: str, handler: Handler, *, once: bool = False) -> None:
        """Answer requests to `path` (without query) with `handler`; `once` queues a single answer."""
        if once:
            self.routes.setdefault(path, []).append(handler)
        else:
            self.defaults[path] = handler

    def reply(
        self, path: str, status: int, body: Any, headers: dict[str, str] | None = None, *, once: bool = False
    ) -> None:
        self.on(path, lambda _seen: (status, body, headers or {}), once=once)

    def calls(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ctype = request.content_type
        seen = Seen(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=b"",
        )
        if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
            post = await request.post()
            for key, value in post.items():
                if isinstance(value, web.FileField):
                    seen.files[key] = (value.filename, value.file.read(), value.content_type)
                else:
                    seen.form[key] = str(value)
        else:
            seen.body = await request.read()
            if ctype == "application/json":
                seen.json = json.loads(seen.body)
        self.seen.append(seen)
        queue = self.routes.get(request.path)
        handler = queue.pop(0) if queue else self.defaults.get(request.path)
        if handler is None:
            handler = next((h for p, h in self.prefixes.items() if request.path.startswith(p)), None)
        if handler is None:
            return web.json_response({"error": "no route"}, status=404)
        answer = handler(seen)
        if not isinstance(answer, tuple):
            answer = await answer
        status, body, *rest = answer
        headers = rest[0] if rest else {}
        if isinstance(body, bytes | str):
            return web.Response(status=status, body=body, headers=headers)
        return web.json_response(body, status=status, headers=headers)


@pytest.fixture
async def api() -> AsyncIterator[FakeApi]:
    server = FakeApi()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        yield client


# A 1x1 PNG.
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
PNG = base64.b64decode(PNG_B64)


async def load_media(media: Media) -> tuple[bytes, str]:
    """The test stand-in for the SSRF-guarded loader: base64 and paths only."""
    if media.kind == "base64":
        return base64.b64decode(media.value), "image/png"
    if media.kind == "path":
        data = await asyncio.to_thread(Path(media.value).read_bytes)
        return data, "image/png" if data.startswith(b"\x89PNG") else "application/octet-stream"
    raise ValueError(f"cannot load {media.kind}")


async def broken_loader(media: Media) -> tuple[bytes, str]:
    raise OSError("unreadable")


PDF = b"%PDF-1.4 test\n"


@dataclass
class MediaServer:
    """A web server on loopback with a PNG and a PDF; `requests` counts what it served."""

    url: str = ""
    requests: list[str] = field(default_factory=list)


@pytest.fixture
async def media_server() -> AsyncIterator[MediaServer]:
    state = MediaServer()

    async def serve(request: web.Request) -> web.Response:
        state.requests.append(request.path)
        body = {"/a.png": PNG, "/r.pdf": PDF}.get(request.path)
        return web.Response(body=body) if body is not None else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.fixture
async def guarded_loader(tmp_path: Path) -> AsyncIterator[MediaChecker]:
    """The media loader egress uses (`MediaChecker.load`): the SSRF-guarded fetcher (loopback allowed,
    for the media server above) and paths inside `tmp_path` only."""
    checker = MediaChecker(MediaSettings(media_root=tmp_path), SafeFetcher(allow_loopback_for_tests=True))
    try:
        yield checker
    finally:
        await checker.aclose()


@pytest.fixture
async def strict_loader() -> AsyncIterator[MediaChecker]:
    """The production loader's defaults: no loopback, no media root (no `path` media at all)."""
    checker = MediaChecker(MediaSettings(), SafeFetcher())
    try:
        yield checker
    finally:
        await checker.aclose()


def rejected_count(platform: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value("switchboard_media_rejected_total", {"platform": platform, "reason": reason}) or 0.0
    )
