"""Media checks (S15): read url/path/base64 media, identify them by bytes, enforce size and type.

A media segment that cannot be read, is too big, is of a type its segment does not carry, or is not
supported by the platform is replaced in place by an "attachment unavailable" text segment, set apart
by a space from the text around it (so several in a row do not run together). `kind: file`
references belong to the platform and pass through unread; each platform's renderer accepts only ids
of its own shape (`pipeline/platforms`).

Rejection reasons are a bounded vocabulary (`REJECTION_REASONS`, `rejection_label`): they label
`switchboard_media_rejected_total` and the INFO log line of each rejection.
"""

from __future__ import annotations

import asyncio
import binascii
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.segments.context import Capabilities
from pipeline.segments.exceptions import MediaUnavailable
from pipeline.segments.fetch import SafeFetcher
from pipeline.segments.models import (
    MEDIA_SEGMENT_TYPES,
    MarkdownSegment,
    Media,
    MediaSegment,
    Segment,
    TextData,
    TextSegment,
)
from pipeline.segments.sniff import SNIFF_BYTES, mime_fits_segment, sniff_mime

_GENERIC_BINARY = "application/octet-stream"

# Every reason a media item can be refused for (MediaUnavailable reasons, the checks below, the
# platforms' own). Anything else is counted as "other"; HTTP statuses as "http_error".
REJECTION_REASONS: frozenset[str] = frozenset(
    {
        # reading
        "unreadable",
        "not_a_file",
        "too_large",
        "empty",
        "bad_base64",
        "bad_path",
        "path_outside_root",
        "path_not_allowed",
        "url_not_allowed",
        "unknown_kind",
        # fetching
        "bad_url",
        "scheme_not_allowed",
        "credentials_in_url",
        "dns_failed",
        "unparsable_address",
        "address_metadata",
        "address_loopback",
        "address_multicast",
        "address_link_local",
        "address_reserved",
        "address_private",
        "timeout",
        "transport_error",
        "redirect_without_location",
        "too_many_redirects",
        "http_error",
        "checksum_mismatch",
        # checks
        "type_mismatch",
        "unsupported_by_platform",
        "refused_by_platform",
        "leak",
        "file_id_shape",
        "other",
    }
)


def rejection_label(reason: str) -> str:
    """`reason` as a bounded metric label."""
    if reason in REJECTION_REASONS:
        return reason
    return "http_error" if reason.startswith("http_") else "other"


@dataclass(frozen=True, slots=True)
class CheckedMedia:
    """The outcome for one media segment of the reply.

    `index` is the segment's position in the outcome's segment list (where a rejected one now holds
    the notice). `mime` is detected from the bytes (egress needs it); `data` is kept only when the
    checker was asked to keep bytes.
    """

    index: int
    segment_type: str
    kind: str
    accepted: bool
    reason: str  # "ok", "platform_file", or why it was rejected
    mime: str | None = None
    size: int | None = None
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class MediaSettings:
    media_root: Path | None = None  # `kind: path` media must resolve inside it; None refuses them
    max_bytes: int = 20 * 1024 * 1024  # host-wide cap, also bounded by the platform's capabilities
    keep_bytes: bool = False


@dataclass(frozen=True, slots=True)
class MediaCheck:
    segments: list[Segment]
    checked: list[CheckedMedia]
    rejected: int


def _strip_base64_prefix(value: str) -> str:
    if value.startswith("base64://"):  # OneBot's convention
        return value[len("base64://") :]
    if value.startswith("data:"):
        header, sep, payload = value.partition(",")
        if sep and header.endswith(";base64"):
            return payload
        raise MediaUnavailable("bad_base64")
    return value


def decode_base64_media(value: str, max_bytes: int) -> bytes:
    """Decode inline base64 after checking its decoded size (so a huge value is never decoded)."""
    payload = _strip_base64_prefix(value)
    if any(ch in payload for ch in " \t\r\n"):
        payload = "".join(payload.split())
    padding = len(payload) - len(payload.rstrip("="))
    if len(payload) * 3 // 4 - padding > max_bytes:
        raise MediaUnavailable("too_large")
    try:
        return binascii.a2b_base64(payload.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise MediaUnavailable("bad_base64") from None


def _read_inside_root(root: Path, value: str, max_bytes: int) -> bytes:
    if "\x00" in value or not value:
        raise MediaUnavailable("bad_path")
    real_root = os.path.realpath(root)
    # realpath resolves every symlink, so a link pointing out of the root is caught here.
    real_path = os.path.realpath(os.path.join(real_root, value))
    if os.path.commonpath([real_root, real_path]) != real_root or real_path == real_root:
        raise MediaUnavailable("path_outside_root")
    try:
        # O_NOFOLLOW: if the final component was swapped for a symlink after the check, refuse.
        fd = os.open(real_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        raise MediaUnavailable("unreadable") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MediaUnavailable("not_a_file")
        if info.st_size > max_bytes:
            raise MediaUnavailable("too_large")
        chunks: list[bytes] = []
        remaining = max_bytes + 1  # one byte more than allowed tells "grew past the limit"
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise MediaUnavailable("too_large")
    return data


class MediaChecker:
    """Reads and identifies media. Build once per deployment (it owns the fetcher's HTTP client)."""

    def __init__(self, settings: MediaSettings | None = None, fetcher: SafeFetcher | None = None) -> None:
        self.settings = settings or MediaSettings()
        self._fetcher = fetcher

    async def aclose(self) -> None:
        if self._fetcher is not None:
            await self._fetcher.aclose()

    async def load(self, media: Media) -> tuple[bytes, str]:
        """A media reference's bytes and the type sniffed from them, read through the same guards as
        the check (the loader egress gives the platforms). A platform file id is not ours to read."""
        if media.kind == "file":
            raise MediaUnavailable("unsupported_by_platform")
        data = await self._read(media.kind, media.value, self.settings.max_bytes)
        return data, sniff_mime(data[:SNIFF_BYTES]) or _GENERIC_BINARY

    async def _read(self, kind: str, value: str, max_bytes: int) -> bytes:
        if kind == "base64":
            return decode_base64_media(value, max_bytes)
        if kind == "path":
            if self.settings.media_root is None:
                raise MediaUnavailable("path_not_allowed")
            return await asyncio.to_thread(_read_inside_root, self.settings.media_root, value, max_bytes)
        if kind == "url":
            if self._fetcher is None:
                raise MediaUnavailable("url_not_allowed")
            return (await self._fetcher.fetch(value, max_bytes)).data
        raise MediaUnavailable("unknown_kind")

    async def check_one(self, index: int, segment: MediaSegment, capabilities: Capabilities) -> CheckedMedia:
        media = segment.data.media
        if segment.type not in capabilities.supported_segment_types:
            return CheckedMedia(index, segment.type, media.kind, False, "unsupported_by_platform")
        if media.kind == "file":
            return CheckedMedia(index, segment.type, media.kind, True, "platform_file")
        max_bytes = min(self.settings.max_bytes, capabilities.limit_for(segment.type))
        try:
            data = await self._read(media.kind, media.value, max_bytes)
        except MediaUnavailable as error:
            return CheckedMedia(index, segment.type, media.kind, False, error.reason)
        if not data:
            return CheckedMedia(index, segment.type, media.kind, False, "empty", size=0)
        mime = sniff_mime(data[:SNIFF_BYTES])
        if not mime_fits_segment(mime, segment.type):
            return CheckedMedia(index, segment.type, media.kind, False, "type_mismatch", mime, len(data))
        return CheckedMedia(
            index,
            segment.type,
            media.kind,
            True,
            "ok",
            mime or _GENERIC_BINARY,
            len(data),
            data if self.settings.keep_bytes else None,
        )

    async def check_segments(
        self, segments: list[Segment], capabilities: Capabilities, unavailable_text: str
    ) -> MediaCheck:
        """Check every media segment concurrently; rejected ones become `unavailable_text` in place."""
        positions = [i for i, s in enumerate(segments) if s.type in MEDIA_SEGMENT_TYPES]
        if not positions:
            return MediaCheck(segments, [], 0)
        async with asyncio.TaskGroup() as group:  # cancellation of the turn cancels every read
            tasks = [
                group.create_task(self.check_one(i, segments[i], capabilities))  # type: ignore[arg-type]
                for i in positions
            ]
        checked = [task.result() for task in tasks]
        rejected = [result.index for result in checked if not result.accepted]
        return MediaCheck(with_placeholders(segments, rejected, unavailable_text), checked, len(rejected))


def unavailable_segment(text: str) -> TextSegment:
    return TextSegment(type="text", data=TextData(text=text))


_NOT_INLINE = frozenset({*MEDIA_SEGMENT_TYPES, "forward", "dice", "rps"})


def _shown_text(segment: Segment) -> str | None:
    """The text a segment shows inline, as far as spacing goes: "" for what shows nothing (a reply
    reference), None for what most platforms show apart (media, forwards, dice)."""
    if isinstance(segment, TextSegment):
        return segment.data.text
    if isinstance(segment, MarkdownSegment):
        return segment.data.content
    if segment.type == "reply":
        return ""
    if segment.type in _NOT_INLINE:
        return None
    return "x"  # mentions, faces, shares: visible, never ending in a space


def _neighbour(segments: Sequence[Segment], indexes: Iterable[int], stop: frozenset[int]) -> str | None:
    for index in indexes:
        if index in stop:
            return None
        shown = _shown_text(segments[index])
        if shown != "":
            return shown
    return None


def spaced_placeholder(text: str, before: str | None, after: str | None) -> str:
    """`text` with a space where the visible text `before` / `after` it would run into it
    (None or "" where nothing is shown on that side)."""
    if before and not before[-1].isspace():
        text = " " + text
    if after and not after[0].isspace():
        text = text + " "
    return text


def with_placeholders(segments: list[Segment], positions: Iterable[int], text: str) -> list[Segment]:
    """`segments` with the segments at `positions` replaced by the notice `text`, each set apart from
    the inline text around it (a placeholder right after another gets one space, not two)."""
    replace = frozenset(positions)
    if not replace:
        return segments
    out = list(segments)
    for index in sorted(replace):
        before = _neighbour(out, range(index - 1, -1, -1), frozenset())
        after = _neighbour(out, range(index + 1, len(out)), replace)  # a later placeholder spaces itself
        out[index] = unavailable_segment(spaced_placeholder(text, before, after))
    return out
