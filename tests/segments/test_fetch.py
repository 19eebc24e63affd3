"""The SSRF-safe fetcher with real sockets on loopback (S15)."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from pipeline.segments import (
    Capabilities,
    ImageSegment,
    MediaChecker,
    MediaSettings,
    MediaUnavailable,
    OutcomeReason,
    SafeFetcher,
    UnsafeAddress,
    finalize_reply,
)
from pipeline.segments.fetch import address_refusal
from tests.segments.conftest import TURN, make_policy
from tests.segments.media_samples import PDF, PNG

LARGE_CHUNK = b"\x89PNG\r\n\x1a\n" + b"\x00" * (64 * 1024 - 8)


@dataclass
class MediaServer:
    base: str = ""
    port: int = 0
    host_headers: list[str] = field(default_factory=list)
    large_bytes_sent: int = 0
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def server() -> AsyncIterator[MediaServer]:
    state = MediaServer()

    async def png(request: web.Request) -> web.Response:
        state.host_headers.append(request.headers.get("Host", ""))
        return web.Response(body=PNG, content_type="image/png")

    async def pdf_claiming_png(request: web.Request) -> web.Response:
        return web.Response(body=PDF, content_type="image/png")  # the header lies; the bytes do not

    async def large_streamed(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to refuse early
        await response.prepare(request)
        try:
            for _ in range(1024):  # 64 MiB if nobody stops reading
                await response.write(LARGE_CHUNK)
                state.large_bytes_sent += len(LARGE_CHUNK)
        except (ConnectionResetError, RuntimeError):
            pass
        return response

    async def large_declared(request: web.Request) -> web.Response:
        return web.Response(body=b"\x00" * (2 * 1024 * 1024), content_type="image/png")

    def redirect_to(target: str) -> web.RouteDef:
        async def handler(request: web.Request) -> web.Response:
            location = target.replace("{port}", str(state.port))
            raise web.HTTPFound(location)

        return handler  # type: ignore[return-value]

    async def stall(request: web.Request) -> web.Response:
        state.stalled.set()
        await asyncio.wait_for(state.release.wait(), 10)
        return web.Response(body=PNG)

    app = web.Application()
    app.router.add_get("/stall", stall)
    app.router.add_get("/a.png", png)
    app.router.add_get("/fake.png", pdf_claiming_png)
    app.router.add_get("/large", large_streamed)
    app.router.add_get("/large-declared", large_declared)
    app.router.add_get("/to-private", redirect_to("http://10.0.0.1/x.png"))  # type: ignore[arg-type]
    app.router.add_get("/to-metadata", redirect_to("http://169.254.169.254/latest/meta-data/"))  # type: ignore[arg-type]
    app.router.add_get("/to-self", redirect_to("http://127.0.0.1:{port}/a.png"))  # type: ignore[arg-type]
    app.router.add_get("/to-relative", redirect_to("/a.png"))  # type: ignore[arg-type]
    app.router.add_get("/loop", redirect_to("/loop"))  # type: ignore[arg-type]
    app.router.add_get("/to-file", redirect_to("file:///etc/passwd"))  # type: ignore[arg-type]
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.port = runner.addresses[0][1]
    state.base = f"http://127.0.0.1:{state.port}"
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


def image(url: str) -> ImageSegment:
    return ImageSegment.model_validate({"type": "image", "data": {"media": {"kind": "url", "value": url}}})


async def test_localhost_is_refused_by_default(server: MediaServer) -> None:
    async with SafeFetcher() as fetcher:
        for url in (f"http://localhost:{server.port}/a.png", f"{server.base}/a.png", f"http://[::1]:{server.port}/"):
            with pytest.raises(UnsafeAddress) as refused:
                await fetcher.fetch(url, 1 << 20)
            assert refused.value.reason == "address_loopback"
    assert server.host_headers == []  # nothing ever reached the server


async def test_loopback_allowed_for_tests_fetches_for_real(server: MediaServer) -> None:
    async with SafeFetcher(allow_loopback_for_tests=True) as fetcher:
        fetched = await fetcher.fetch(f"{server.base}/a.png", 1 << 20)
    assert fetched.data == PNG and fetched.hops == 0


async def test_connects_to_the_resolved_ip_and_keeps_the_host_name(server: MediaServer) -> None:
    async def resolver(host: str, port: int) -> list[str]:
        assert host == "media.example"
        return ["127.0.0.1"]

    async with SafeFetcher(allow_loopback_for_tests=True, resolver=resolver) as fetcher:
        fetched = await fetcher.fetch(f"http://media.example:{server.port}/a.png", 1 << 20)
    assert fetched.data == PNG
    assert server.host_headers == [f"media.example:{server.port}"]


async def test_any_internal_answer_refuses_the_name(server: MediaServer) -> None:
    async def mixed(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.1.2.3"]

    async with SafeFetcher(resolver=mixed) as fetcher:
        with pytest.raises(UnsafeAddress) as refused:
            await fetcher.fetch("http://rebind.example/a.png", 1 << 20)
    assert refused.value.reason == "address_private"


async def test_streamed_body_stops_at_the_size_limit(server: MediaServer) -> None:
    async with SafeFetcher(allow_loopback_for_tests=True) as fetcher:
        with pytest.raises(MediaUnavailable) as too_big:
            await fetcher.fetch(f"{server.base}/large", 256 * 1024)
    assert too_big.value.reason == "too_large"
    # Reading stopped long before the end (what was sent is what fits in the loopback socket buffers).
    assert server.large_bytes_sent < 32 * 1024 * 1024


async def test_declared_length_over_limit_is_refused_before_reading(server: MediaServer) -> None:
    async with SafeFetcher(allow_loopback_for_tests=True) as fetcher:
        with pytest.raises(MediaUnavailable) as too_big:
            await fetcher.fetch(f"{server.base}/large-declared", 1024)
    assert too_big.value.reason == "too_large"


@pytest.mark.parametrize(
    ("path", "reason"),
    [("/to-private", "address_private"), ("/to-metadata", "address_metadata")],
)
async def test_redirect_to_internal_address_is_refused(server: MediaServer, path: str, reason: str) -> None:
    async with SafeFetcher(allow_loopback_for_tests=True) as fetcher:
        with pytest.raises(UnsafeAddress) as refused:
            await fetcher.fetch(f"{server.base}{path}", 1 << 20)
    assert refused.value.reason == reason


async def test_redirects_are_followed_and_bounded(server: MediaServer) -> None:
    async with SafeFetcher(allow_loopback_for_tests=True, max_redirects=3) as fetcher:
        assert (await fetcher.fetch(f"{server.base}/to-self", 1 << 20)).hops == 1
        assert (await fetcher.fetch(f"{server.base}/to-relative", 1 << 20)).data == PNG
        with pytest.raises(MediaUnavailable) as looping:
            await fetcher.fetch(f"{server.base}/loop", 1 << 20)
        assert looping.value.reason == "too_many_redirects"
        with pytest.raises(MediaUnavailable) as to_file:
            await fetcher.fetch(f"{server.base}/to-file", 1 << 20)
        assert to_file.value.reason == "scheme_not_allowed"


async def test_http_errors_and_bad_urls(server: MediaServer) -> None:
    async with SafeFetcher(allow_loopback_for_tests=True) as fetcher:
        for url, reason in [
            (f"{server.base}/missing", "http_404"),
            ("file:///etc/passwd", "scheme_not_allowed"),
            ("ftp://example.com/a.png", "scheme_not_allowed"),
            ("gopher://127.0.0.1:6379/_INFO", "scheme_not_allowed"),
            (f"http://user:pw@127.0.0.1:{server.port}/a.png", "credentials_in_url"),
            ("http:///nohost", "bad_url"),
            ("not a url at all", "scheme_not_allowed"),
        ]:
            with pytest.raises(MediaUnavailable) as failed:
                await fetcher.fetch(url, 1 << 20)
            assert failed.value.reason == reason, url


async def test_finalize_with_real_fetches(server: MediaServer) -> None:
    text = (
        '{"segments":['
        f'{{"type":"text","data":{{"text":"see"}}}},'
        f'{{"type":"image","data":{{"media":{{"kind":"url","value":"{server.base}/a.png"}}}}}},'
        f'{{"type":"image","data":{{"media":{{"kind":"url","value":"{server.base}/fake.png"}}}}}},'
        f'{{"type":"file","data":{{"media":{{"kind":"url","value":"{server.base}/fake.png"}}}}}},'
        f'{{"type":"image","data":{{"media":{{"kind":"url","value":"{server.base}/to-private"}}}}}}'
        "]}"
    )
    checker = MediaChecker(MediaSettings(), SafeFetcher(allow_loopback_for_tests=True))
    try:
        outcome = await finalize_reply(
            text, TURN, make_policy(), corrector=None, media=checker, capabilities=Capabilities()
        )
    finally:
        await checker.aclose()
    assert outcome.reason is OutcomeReason.OK
    assert outcome.media_rejected == 2
    kinds = [s.type for s in outcome.segments]
    assert kinds == ["text", "image", "text", "file", "text"]  # rejected ones replaced in place
    assert outcome.segments[2].model_dump()["data"]["text"] == "[attachment unavailable]"
    by_index = {c.index: c for c in outcome.media}
    assert (by_index[1].accepted, by_index[1].mime, by_index[1].size) == (True, "image/png", len(PNG))
    assert (by_index[2].accepted, by_index[2].reason, by_index[2].mime) == (False, "type_mismatch", "application/pdf")
    assert (by_index[3].accepted, by_index[3].mime) == (True, "application/pdf")  # a file takes anything
    assert (by_index[4].accepted, by_index[4].reason) == (False, "address_private")
    assert all(c.data is None for c in outcome.media)  # no byte blobs kept unless asked


async def test_default_checker_refuses_loopback_in_finalize(server: MediaServer) -> None:
    text = f'{{"segments":[{{"type":"image","data":{{"media":{{"kind":"url","value":"{server.base}/a.png"}}}}}}]}}'
    checker = MediaChecker(MediaSettings(), SafeFetcher())
    try:
        outcome = await finalize_reply(
            text, TURN, make_policy(), corrector=None, media=checker, capabilities=Capabilities()
        )
    finally:
        await checker.aclose()
    assert outcome.media_rejected == 1 and outcome.media[0].reason == "address_loopback"
    assert server.host_headers == []


@pytest.mark.parametrize(
    ("address", "allow_loopback", "refusal"),
    [
        ("127.0.0.1", False, "loopback"),
        ("127.0.0.1", True, None),
        ("::1", False, "loopback"),
        ("10.0.0.1", True, "private"),
        ("172.16.5.4", False, "private"),
        ("192.168.1.1", False, "private"),
        ("100.64.0.1", False, "private"),  # carrier-grade NAT
        ("169.254.169.254", True, "metadata"),
        ("100.100.100.200", False, "metadata"),
        ("fd00:ec2::254", False, "metadata"),
        ("169.254.1.1", False, "link_local"),
        ("fe80::1", False, "link_local"),
        ("224.0.0.1", False, "multicast"),
        ("ff02::1", False, "multicast"),
        ("0.0.0.0", False, "reserved"),
        ("240.0.0.1", False, "reserved"),
        ("fc00::1", False, "private"),
        ("::ffff:127.0.0.1", False, "loopback"),  # IPv4-mapped
        ("::ffff:10.0.0.1", False, "private"),
        ("64:ff9b::a00:1", False, "private"),  # NAT64 of 10.0.0.1
        ("2002:a00:1::", False, "private"),  # 6to4 of 10.0.0.1
        ("93.184.216.34", False, None),
        ("2606:2800:220:1:248:1893:25c8:1946", False, None),
    ],
)
def test_address_refusal(address: str, allow_loopback: bool, refusal: str | None) -> None:
    assert address_refusal(ipaddress.ip_address(address), allow_loopback=allow_loopback) == refusal


async def test_fetch_deadline(server: MediaServer) -> None:
    async with SafeFetcher(allow_loopback_for_tests=True, timeout_s=0.3) as fetcher:
        with pytest.raises(MediaUnavailable) as slow:
            await fetcher.fetch(f"{server.base}/stall", 1 << 20)
    assert slow.value.reason == "timeout"


async def test_turn_cancellation_cancels_media_reads(server: MediaServer) -> None:
    text = f'{{"segments":[{{"type":"image","data":{{"media":{{"kind":"url","value":"{server.base}/stall"}}}}}}]}}'
    checker = MediaChecker(MediaSettings(), SafeFetcher(allow_loopback_for_tests=True))
    try:
        task = asyncio.create_task(
            finalize_reply(text, TURN, make_policy(), corrector=None, media=checker, capabilities=Capabilities())
        )
        await asyncio.wait_for(server.stalled.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await checker.aclose()


async def test_headers_go_to_the_first_urls_origin_only() -> None:
    """A platform's token for its own media: sent to the URL's origin, never to another host a
    redirect names (`localhost` and `127.0.0.1` are two origins though one address)."""
    seen: list[tuple[str, str | None]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append((f"{request.host}{request.path}", request.headers.get("Authorization")))
        if request.path == "/away":
            raise web.HTTPFound(f"http://localhost:{request.url.port}/final")
        if request.path == "/home":
            raise web.HTTPFound("/final")
        return web.Response(body=PNG, content_type="image/png")

    app = web.Application()
    app.router.add_get("/{name}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    try:
        async with SafeFetcher(allow_loopback_for_tests=True) as fetcher:
            token = {"Authorization": "Bearer media-token"}
            assert (await fetcher.fetch(f"{base}/home", 1 << 20, token)).data == PNG
            assert (await fetcher.fetch(f"{base}/away", 1 << 20, token)).data == PNG
    finally:
        await runner.cleanup()
    assert [auth for _, auth in seen] == ["Bearer media-token", "Bearer media-token", "Bearer media-token", None]
    assert seen[-1][0] == f"localhost:{port}/final"
