"""Inbound media a platform holds (a WhatsApp media id, a Satori `internal:` URL), read when the
turn goes to the session and handed to it as content.

Ingest marks each such item in the turn's `user.message` content with a small placeholder block
(`platform_media`: the segment type and the platform's reference, no bytes on the broker). Dispatch
replaces each, just before the send, by the block the session protocol has for it: an `image` or a
`video` with a base64 source, a `document` with a plain-text source. An item that cannot be read
(too large, refused, a failed download), or that the protocol has no block for (audio, a PDF),
becomes a short text block saying so; the message's own text goes either way. Each item is counted
in `switchboard_inbound_media_total{platform, outcome}`. Reading is bounded by size (each item and
all of a turn's together: `MAX_TURN_BYTES`, and the deployment's `media_max_bytes`) and by time
(`TIMEOUT_S` for all of a turn's items).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from pipeline import metrics
from pipeline.platforms import Platform, UnknownPlatform, get_platform
from pipeline.platforms.base import GuardedFetch
from pipeline.segments.exceptions import MediaUnavailable
from pipeline.segments.media import rejection_label
from pipeline.segments.models import Media
from pipeline.segments.sniff import SNIFF_BYTES, sniff_mime
from pipeline.settings import BotConfig

log = logging.getLogger(__name__)

MARKER = "platform_media"
# The image types the session protocol's models take (base64 `media_type`); a sticker is a WebP.
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
# The video types the protocol names for a base64 source.
VIDEO_TYPES = frozenset({"video/mp4", "video/quicktime", "video/x-msvideo"})
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # the models' limit for one image
# All of a turn's items together (and so any one item): base64 makes them a third larger, and the
# whole user.message must stay within what a session API takes in one request (the simulator 8 MB).
MAX_TURN_BYTES = 5 * 1024 * 1024
TIMEOUT_S = 30.0  # all of a turn's items together: the turn waits for them


def fetches_media(platform: str) -> bool:
    """Whether `platform`'s inbound media of `kind: file` are read for the session."""
    try:
        return get_platform(platform).fetches_media
    except UnknownPlatform:
        return False


def media_marker(segment_type: str, media: Media) -> dict[str, Any]:
    """The placeholder block ingest puts in a turn's content for one item of platform media."""
    return {"type": MARKER, "segment": segment_type, "media": {"kind": media.kind, "value": media.value}}


def _has_markers(events: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(block, dict) and block.get("type") == MARKER
        for event in events
        if event.get("type") == "user.message"
        for block in event.get("content", ())
    )


def without_markers(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events` with every placeholder left out (a dispatch that reads no media: the session never
    gets a block type it does not know)."""
    if not _has_markers(events):
        return events
    cleaned = []
    for event in events:
        if event.get("type") == "user.message":
            content = [b for b in event.get("content", ()) if not (isinstance(b, dict) and b.get("type") == MARKER)]
            event = {**event, "content": content}
        cleaned.append(event)
    return cleaned


def unavailable_text(segment_type: str, reason: str) -> dict[str, Any]:
    return {"type": "text", "text": f"[the {segment_type} sent with this message could not be read: {reason}]"}


def session_block(segment_type: str, data: bytes) -> dict[str, Any] | str:
    """The session content block for the bytes of one inbound item, or why there is none."""
    if not data:
        return "empty"
    mime = sniff_mime(data[:SNIFF_BYTES])
    if segment_type == "image":
        if mime not in IMAGE_TYPES:
            return "type_mismatch" if mime is None or not mime.startswith("image/") else "unsupported_by_session"
        return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": _b64(data)}}
    if segment_type == "video":
        if mime not in VIDEO_TYPES:
            return "type_mismatch" if mime is None or not mime.startswith("video/") else "unsupported_by_session"
        return {"type": "video", "source": {"type": "base64", "media_type": mime, "data": _b64(data)}}
    if segment_type == "file" and mime is None and b"\x00" not in data:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return "unsupported_by_session"
        return {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}}
    return "unsupported_by_session"  # audio, PDFs, archives: the protocol has no block for them


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class InboundMedia:
    """Reads the platform media of a turn for dispatch. One per worker."""

    def __init__(
        self,
        platforms: Mapping[str, Platform],
        http: httpx.AsyncClient,
        guarded: GuardedFetch,
        max_bytes: int,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.platforms = platforms
        self.http = http
        self.guarded = guarded
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def resolve(self, bot: BotConfig, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`events` with each placeholder replaced by its content block or its text (a copy; the
        command's own events stay as they were, so a retry reads again)."""
        if not _has_markers(events):
            return events
        platform = self.platforms.get(bot.platform)
        resolved = copy.deepcopy(events)
        spots = [
            (content, index)
            for event in resolved
            if event.get("type") == "user.message"
            for content in (event.get("content", []),)
            for index, block in enumerate(content)
            if isinstance(block, dict) and block.get("type") == MARKER
        ]
        tasks = [asyncio.ensure_future(self._block(bot, platform, content[index])) for content, index in spots]
        try:
            done, _pending = await asyncio.wait(tasks, timeout=self.timeout_s)
        finally:
            for task in tasks:
                task.cancel()  # past the time, or the turn itself cancelled: stop every read
        budget = MAX_TURN_BYTES
        for (content, index), task in zip(spots, tasks, strict=True):
            segment_type = str(content[index].get("segment", "file"))
            if task not in done or task.cancelled() or task.exception() is not None:
                content[index] = self._unavailable(bot, segment_type, "timeout")
                continue
            block, size = task.result()
            if size > budget:  # the turn's earlier items took the room a session request has
                block = self._unavailable(bot, segment_type, "too_large")
            elif size:
                budget -= size
                self._count(bot, "read")
            content[index] = block
        return resolved

    async def _block(
        self, bot: BotConfig, platform: Platform | None, marker: dict[str, Any]
    ) -> tuple[dict[str, Any], int]:
        """The session block of one item and the bytes it holds (0: a text saying why not)."""
        segment_type = str(marker.get("segment", "file"))
        raw = marker.get("media")
        if platform is None or not platform.fetches_media or not isinstance(raw, dict):
            return self._unavailable(bot, segment_type, "unsupported_by_platform"), 0
        if segment_type == "audio":
            # No audio block in the session protocol: not downloaded at all.
            return self._unavailable(bot, segment_type, "unsupported_by_session"), 0
        limit = min(self.max_bytes, MAX_TURN_BYTES, MAX_IMAGE_BYTES if segment_type == "image" else self.max_bytes)
        try:
            media = Media(kind=raw.get("kind", "file"), value=str(raw.get("value", "")))
            data = await platform.fetch_media(bot, media, self.http, self.guarded, limit)
        except MediaUnavailable as refused:
            return self._unavailable(bot, segment_type, rejection_label(refused.reason)), 0
        except Exception as exc:  # a platform's reader must not fail the turn: the text goes on
            log.info("%s/%s: inbound %s unreadable (%s)", bot.platform, bot.bot_id, segment_type, type(exc).__name__)
            return self._unavailable(bot, segment_type, "unreadable"), 0
        block = session_block(segment_type, data)
        if isinstance(block, str):
            return self._unavailable(bot, segment_type, block), 0
        return block, max(len(data), 1)

    def _unavailable(self, bot: BotConfig, segment_type: str, reason: str) -> dict[str, Any]:
        self._count(bot, reason)
        # INFO: the type and the reason only, never the reference (a URL may carry a token).
        log.info("%s/%s: inbound %s not handed to the session: %s", bot.platform, bot.bot_id, segment_type, reason)
        return unavailable_text(segment_type, reason)

    @staticmethod
    def _count(bot: BotConfig, outcome: str) -> None:
        metrics.INBOUND_MEDIA.labels(bot.platform, outcome).inc()
