"""Inbound media a platform holds, read for the session: ingest's placeholder blocks, dispatch's
reading of them (`pipeline.stages.inbound_media`) against the WhatsApp Graph API stand-in and the
Satori server stand-in over real HTTP, and the outcomes when an item cannot be handed over."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from satori import Image
from satori import Text as SatoriText

from pipeline.platforms import get_platform
from pipeline.segments import SafeFetcher
from pipeline.segments.exceptions import MediaUnavailable
from pipeline.segments.models import Media
from pipeline.stages import inbound_media
from pipeline.stages.inbound_media import MARKER, InboundMedia, media_marker, without_markers
from pipeline.stages.ingest import content_blocks
from tests.connections.satori_standin import SatoriStandIn
from tests.platforms import test_satori as st
from tests.platforms import test_whatsapp as wa
from tests.platforms.conftest import PNG, FakeApi, Seen, load_media

MP4 = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\x00" * 64


def outcome_count(platform: str, outcome: str) -> float:
    labels = {"platform": platform, "outcome": outcome}
    return REGISTRY.get_sample_value("switchboard_inbound_media_total", labels) or 0.0


def turn(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "user.message", "id": "umsg-1", "content": [{"type": "text", "text": "look"}, *blocks]}]


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


@pytest.fixture
async def guard() -> AsyncIterator[SafeFetcher]:
    async with SafeFetcher(allow_loopback_for_tests=True) as fetcher:
        yield fetcher


def reader(guard: SafeFetcher, http: httpx.AsyncClient, max_bytes: int = 1024 * 1024) -> InboundMedia:
    async def guarded(url: str, limit: int, headers: Mapping[str, str]) -> bytes:
        return (await guard.fetch(url, limit, headers)).data

    platforms = {name: get_platform(name) for name in ("whatsapp", "satori", "telegram")}
    return InboundMedia(platforms, http, guarded, max_bytes)


def test_ingest_marks_platform_media_only_where_the_platform_reads_them() -> None:
    image = {
        **wa.text_message(""),
        "type": "image",
        "image": {"id": "1479537139650973", "mime_type": "image/jpeg", "caption": "look"},
    }
    del image["text"]
    [message] = get_platform("whatsapp").parse(wa.bot_config(), wa.signed(wa.update(image))).messages
    blocks = content_blocks(message, wa.bot_config(), label_sender=False)
    assert blocks == [
        {"type": "text", "text": "look"},
        media_marker("image", Media(kind="file", value="1479537139650973")),
    ]
    # Telegram's file ids are not read: no placeholder, the text as before.
    telegram = message.model_copy(update={"platform": "telegram"})
    assert [b["type"] for b in content_blocks(telegram, wa.bot_config(), label_sender=False)] == ["text"]


def test_a_dispatch_without_a_reader_leaves_the_placeholders_out() -> None:
    events = turn(media_marker("image", Media(kind="file", value="1")))
    assert without_markers(events) == turn()
    assert without_markers(turn()) == turn()


async def test_whatsapp_media_become_session_blocks_or_a_named_text(
    api: FakeApi, http: httpx.AsyncClient, guard: SafeFetcher
) -> None:
    standin = wa.WhatsAppStandIn(api)
    picture = standin.sent_by_user(PNG, "image/png")
    clip = standin.sent_by_user(MP4, "video/mp4")
    note = standin.sent_by_user(b"agenda: ship it\n", "text/plain")
    pdf = standin.sent_by_user(b"%PDF-1.4 x\n", "application/pdf")
    voice = standin.sent_by_user(b"OggS" + b"\x00" * 40, "audio/ogg")
    huge = standin.sent_by_user(PNG, "image/png", size=6 * 1024 * 1024)  # claimed past the image limit
    fake = standin.sent_by_user(b"not an image at all", "image/jpeg")
    events = turn(
        media_marker("image", Media(kind="file", value=picture)),
        media_marker("video", Media(kind="file", value=clip)),
        media_marker("file", Media(kind="file", value=note)),
        media_marker("file", Media(kind="file", value=pdf)),
        media_marker("audio", Media(kind="file", value=voice)),
        media_marker("image", Media(kind="file", value=huge)),
        media_marker("image", Media(kind="file", value=fake)),
        media_marker("image", Media(kind="file", value="1400000000009999")),  # WhatsApp knows no such id
    )
    kept = copy.deepcopy(events)
    before = {o: outcome_count("whatsapp", o) for o in ("read", "unsupported_by_session", "too_large", "http_error")}
    resolved = await reader(guard, http).resolve(wa.bot_config(api), events)
    assert events == kept  # the command's own events untouched: a retry reads again
    content = resolved[0]["content"]
    assert content[0] == {"type": "text", "text": "look"}
    assert content[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()},
    }
    assert content[2]["type"] == "video" and content[2]["source"]["media_type"] == "video/mp4"
    assert base64.b64decode(content[2]["source"]["data"]) == MP4
    assert content[3] == {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "agenda: ship it\n"},
    }
    texts = [b["text"] for b in content[4:]]
    assert texts == [
        "[the file sent with this message could not be read: unsupported_by_session]",
        "[the audio sent with this message could not be read: unsupported_by_session]",
        "[the image sent with this message could not be read: too_large]",
        "[the image sent with this message could not be read: type_mismatch]",
        "[the image sent with this message could not be read: http_error]",
    ]
    assert not [b for b in content if b.get("type") == MARKER]
    # Audio is never downloaded (no block for it), nor an image whose size is past the limit.
    assert voice not in standin.media_lookups and huge not in standin.downloads
    assert outcome_count("whatsapp", "read") - before["read"] == 3
    assert outcome_count("whatsapp", "unsupported_by_session") - before["unsupported_by_session"] == 2
    assert outcome_count("whatsapp", "too_large") - before["too_large"] == 1
    assert outcome_count("whatsapp", "http_error") - before["http_error"] == 1


async def test_a_turns_media_together_stay_within_one_session_request(
    api: FakeApi, http: httpx.AsyncClient, guard: SafeFetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items past the turn's room (what one session request takes) are named, not sent."""
    monkeypatch.setattr(inbound_media, "MAX_TURN_BYTES", len(PNG) * 3 // 2)
    standin = wa.WhatsAppStandIn(api)
    first, second = standin.sent_by_user(PNG, "image/png"), standin.sent_by_user(PNG, "image/png")
    markers = [media_marker("image", Media(kind="file", value=m)) for m in (first, second)]
    content = (await reader(guard, http).resolve(wa.bot_config(api), turn(*markers)))[0]["content"]
    assert content[1]["type"] == "image"
    assert content[2] == {"type": "text", "text": "[the image sent with this message could not be read: too_large]"}


async def test_a_platform_that_reads_no_media_gets_the_named_text(http: httpx.AsyncClient, guard: SafeFetcher) -> None:
    bot = wa.bot_config().model_copy(update={"platform": "telegram"})
    resolved = await reader(guard, http).resolve(bot, turn(media_marker("image", Media(kind="file", value="AgAD"))))
    assert resolved[0]["content"][1]["text"].endswith("unsupported_by_platform]")


@pytest.fixture
async def satori_server() -> AsyncIterator[SatoriStandIn]:
    server = SatoriStandIn()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_satori_internal_and_proxied_media_are_read_from_the_server_with_the_token(
    satori_server: SatoriStandIn, http: httpx.AsyncClient, guard: SafeFetcher
) -> None:
    api = FakeApi()
    api.url = satori_server.url
    bot = st.bot_config(api)
    internal = satori_server.resource("internal:discord/1100000000000000001/a b.png", PNG, "image/png")
    proxied_source = satori_server.resource("https://cdn.discordapp.com/attachments/1/c.png", PNG, "image/png")
    proxied = f"{satori_server.url}/v1/proxy/{proxied_source}"
    content = [SatoriText("see "), Image(internal), Image(proxied), Image("https://elsewhere.example/d.png")]
    [message] = st.parse(st.message_event(content, group=False), bot).messages
    blocks = content_blocks(message, bot, label_sender=False)
    assert [b["type"] for b in blocks] == ["text", MARKER, MARKER, "image"]
    assert blocks[3]["source"] == {"type": "url", "url": "https://elsewhere.example/d.png"}  # the session's to fetch
    resolved = await reader(guard, http).resolve(bot, [{"type": "user.message", "content": blocks}])
    digest = hashlib.sha256(PNG).hexdigest()
    for block in resolved[0]["content"][1:3]:
        assert (
            block["type"] == "image" and hashlib.sha256(base64.b64decode(block["source"]["data"])).hexdigest() == digest
        )
    assert satori_server.proxied == [internal, proxied_source] and satori_server.proxy_refused == []
    # Without the server's token: the server's 401, named; the text of the turn stays.
    tokenless = st.bot_config(api, credentials={"platform": st.LOGIN_PLATFORM})
    again = await reader(guard, http).resolve(tokenless, [{"type": "user.message", "content": blocks}])
    assert all(b["text"].endswith("could not be read: http_error]") for b in again[0]["content"][1:3])
    assert satori_server.proxy_refused == [internal, proxied_source]
    # A URL that is not the server's is never read with its token.
    with pytest.raises(MediaUnavailable) as refused:
        await get_platform("satori").fetch_media(
            bot, Media(kind="file", value="https://elsewhere.example/x.png"), http, reader(guard, http).guarded, 1024
        )
    assert refused.value.reason == "url_not_allowed"


# -- no idempotency key: what a send whose answer is lost becomes (docs/platforms.md) -------------


@pytest.mark.parametrize("platform", ["whatsapp", "satori"])
async def test_a_send_whose_answer_is_lost_is_retried_so_it_may_post_twice(api: FakeApi, platform: str) -> None:
    """The platform got the request (the stand-in saw it) but its answer never came: egress is told
    to retry (`network`), so the message may be posted twice; it is never dropped as unsure."""
    answer = asyncio.Event()

    async def stalled(seen: Seen) -> tuple[int, Any]:
        await answer.wait()
        return 500, {}

    if platform == "whatsapp":
        bot, path = wa.bot_config(api), wa.MESSAGES_PATH
        message = wa.outbound(wa.ALICE, [wa.text("hi")], {})
    else:
        bot, path = st.bot_config(api), "/v1/message.create"
        message = st.outbound([{"type": "text", "data": {"text": "hi"}}])
    api.on(path, stalled)
    sender = get_platform(platform)
    [call] = sender.render(bot, message)
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=0.3)) as impatient:
        outcome = await sender.send(bot, call, impatient, load_media)
    answer.set()
    assert (outcome.status, outcome.reason) == ("retry", "network"), outcome
    assert len(api.calls(path)) == 1  # it reached the platform: a retry sends it again
