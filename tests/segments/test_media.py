"""Media checks without network: byte sniffing, media root, base64, capabilities (S15)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from pipeline.segments import (
    Capabilities,
    Media,
    MediaChecker,
    MediaSettings,
    MediaUnavailable,
    OutcomeReason,
    SafeFetcher,
    finalize_reply,
)
from pipeline.segments.media import REJECTION_REASONS, decode_base64_media, rejection_label, with_placeholders
from pipeline.segments.models import segment_list_adapter
from pipeline.segments.sniff import mime_fits_segment, sniff_mime
from tests.segments import media_samples as samples
from tests.segments.conftest import TURN, make_policy


@pytest.mark.parametrize(
    ("data", "mime"),
    [
        (samples.PNG, "image/png"),
        (samples.JPEG, "image/jpeg"),
        (samples.GIF, "image/gif"),
        (samples.WEBP, "image/webp"),
        (samples.BMP, "image/bmp"),
        (samples.MP3_ID3, "audio/mpeg"),
        (samples.MP3_FRAME, "audio/mpeg"),
        (samples.OGG, "audio/ogg"),
        (samples.WAV, "audio/wav"),
        (samples.M4A, "audio/mp4"),
        (samples.AMR, "audio/amr"),
        (samples.SILK, "audio/silk"),
        (samples.MP4, "video/mp4"),
        (samples.MOV, "video/quicktime"),
        (samples.WEBM, "video/webm"),
        (samples.AVI, "video/x-msvideo"),
        (samples.PDF, "application/pdf"),
        (samples.ZIP, "application/zip"),
        (samples.TEXT, None),
        (b"", None),
        (b"BM", None),
    ],
)
def test_sniff(data: bytes, mime: str | None) -> None:
    assert sniff_mime(data) == mime


def test_mime_fits_segment() -> None:
    assert mime_fits_segment("image/png", "image")
    assert not mime_fits_segment("application/pdf", "image")
    assert not mime_fits_segment("video/mp4", "audio")
    assert not mime_fits_segment(None, "video")
    assert mime_fits_segment(None, "file") and mime_fits_segment("image/png", "file")


def segments_json(*items: tuple[str, str, str]) -> str:
    import json

    return json.dumps({"segments": [{"type": t, "data": {"media": {"kind": k, "value": v}}} for t, k, v in items]})


@pytest.fixture
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "a.png").write_bytes(samples.PNG)
    (root / "sub" / "clip.mp4").write_bytes(samples.MP4)
    (root / "doc.pdf").write_bytes(samples.PDF)
    (root / "big.png").write_bytes(samples.PNG + b"\x00" * 5000)
    (tmp_path / "outside.png").write_bytes(samples.PNG)
    os.symlink(tmp_path / "outside.png", root / "escape.png")
    os.symlink(root / "a.png", root / "inside-link.png")
    return root


@pytest.mark.parametrize(
    ("segment_type", "value", "accepted", "reason"),
    [
        ("image", "a.png", True, "ok"),
        ("image", "inside-link.png", True, "ok"),  # a link that stays inside is fine
        ("video", "sub/clip.mp4", True, "ok"),
        ("image", "doc.pdf", False, "type_mismatch"),
        ("file", "doc.pdf", True, "ok"),
        ("image", "escape.png", False, "path_outside_root"),
        ("image", "../outside.png", False, "path_outside_root"),
        ("image", "/etc/passwd", False, "path_outside_root"),
        ("image", "missing.png", False, "unreadable"),
        ("image", "sub", False, "not_a_file"),
        ("image", ".", False, "path_outside_root"),
        ("image", "big.png", False, "too_large"),
    ],
)
async def test_path_media(media_root: Path, segment_type: str, value: str, accepted: bool, reason: str) -> None:
    checker = MediaChecker(MediaSettings(media_root=media_root, max_bytes=4096))
    [segment] = segment_list_adapter.validate_json(segments_json((segment_type, "path", value))[12:-1])
    checked = await checker.check_one(0, segment, Capabilities())  # type: ignore[arg-type]
    assert (checked.accepted, checked.reason) == (accepted, reason)


async def test_path_media_refused_without_root() -> None:
    outcome = await finalize_reply(
        segments_json(("image", "path", "a.png")),
        TURN,
        make_policy(),
        corrector=None,
        media=MediaChecker(),
        capabilities=Capabilities(),
    )
    assert outcome.media_rejected == 1 and outcome.media[0].reason == "path_not_allowed"


def test_base64_size_is_checked_before_decoding() -> None:
    huge = "A" * 4_000_000  # would decode to 3 MB
    with pytest.raises(MediaUnavailable) as too_big:
        decode_base64_media(huge, 1024)
    assert too_big.value.reason == "too_large"


@pytest.mark.parametrize(
    "value",
    [
        base64.b64encode(samples.PNG).decode(),
        "base64://" + base64.b64encode(samples.PNG).decode(),
        "data:image/png;base64," + base64.b64encode(samples.PNG).decode(),
        base64.encodebytes(samples.PNG).decode(),  # with newlines
    ],
)
def test_base64_forms(value: str) -> None:
    assert decode_base64_media(value, 1 << 20) == samples.PNG


@pytest.mark.parametrize("value", ["not base64!", "data:image/png,rawdata", "QUJD=X", "ñññ"])
def test_bad_base64(value: str) -> None:
    with pytest.raises(MediaUnavailable) as bad:
        decode_base64_media(value, 1 << 20)
    assert bad.value.reason == "bad_base64"


async def test_finalize_media_kinds_and_capabilities(media_root: Path) -> None:
    pdf_b64 = base64.b64encode(samples.PDF).decode()
    text = segments_json(
        ("image", "base64", base64.b64encode(samples.PNG).decode()),
        ("image", "base64", pdf_b64),  # a PDF posing as an image
        ("audio", "file", "platform-ref"),  # platform-opaque: passes through unread
        ("video", "path", "sub/clip.mp4"),  # video not supported by this platform
        ("audio", "base64", base64.b64encode(samples.SILK).decode()),
    )
    caps = Capabilities(supported_segment_types=frozenset({"text", "image", "audio"}))
    checker = MediaChecker(MediaSettings(media_root=media_root, keep_bytes=True))
    outcome = await finalize_reply(
        text, TURN, make_policy(language="zh"), corrector=None, media=checker, capabilities=caps
    )
    assert outcome.reason is OutcomeReason.OK
    assert [s.type for s in outcome.segments] == ["image", "text", "audio", "text", "audio"]
    assert outcome.segments[1].model_dump()["data"]["text"] == "[附件不可用]"
    summary = [(c.index, c.accepted, c.reason, c.mime) for c in outcome.media]
    assert summary == [
        (0, True, "ok", "image/png"),
        (1, False, "type_mismatch", "application/pdf"),
        (2, True, "platform_file", None),
        (3, False, "unsupported_by_platform", None),
        (4, True, "ok", "audio/silk"),
    ]
    assert outcome.media[0].data == samples.PNG  # kept only because keep_bytes=True
    assert outcome.media_rejected == 2


async def test_per_type_limit_from_capabilities() -> None:
    text = segments_json(("image", "base64", base64.b64encode(samples.PNG + b"\x00" * 2000).decode()))
    caps = Capabilities(max_bytes_by_type={"image": 1000})
    outcome = await finalize_reply(text, TURN, make_policy(), corrector=None, media=MediaChecker(), capabilities=caps)
    assert outcome.media[0].reason == "too_large"


async def test_without_checker_only_capabilities_apply() -> None:
    text = segments_json(("image", "url", "https://example.com/a.png"), ("video", "url", "https://e.com/v.mp4"))
    caps = Capabilities(supported_segment_types=frozenset({"image"}))
    outcome = await finalize_reply(text, TURN, make_policy(), corrector=None, media=None, capabilities=caps)
    assert [(c.accepted, c.reason) for c in outcome.media] == [(True, "unchecked"), (False, "unsupported_by_platform")]
    assert outcome.media_rejected == 1


async def test_empty_source_is_unavailable() -> None:
    outcome = await finalize_reply(
        segments_json(("image", "base64", "")),
        TURN,
        make_policy(),
        corrector=None,
        media=MediaChecker(),
        capabilities=Capabilities(),
    )
    assert outcome.media[0].reason == "empty"


def test_rejection_reasons_are_bounded_labels() -> None:
    assert rejection_label("address_private") == "address_private"
    assert rejection_label("http_404") == rejection_label("http_503") == "http_error"
    assert rejection_label("something the fetcher invented") == "other"
    assert {rejection_label(r) for r in REJECTION_REASONS} == REJECTION_REASONS


def test_placeholders_are_set_apart_from_text_and_from_each_other() -> None:
    segments = segment_list_adapter.validate_python(
        [
            {"type": "text", "data": {"text": "see"}},
            {"type": "image", "data": {"media": {"kind": "path", "value": "a"}}},
            {"type": "image", "data": {"media": {"kind": "path", "value": "b"}}},
            {"type": "reply", "data": {"message_id": "m1"}},
            {"type": "image", "data": {"media": {"kind": "path", "value": "c"}}},
            {"type": "text", "data": {"text": "end "}},
            {"type": "video", "data": {"media": {"kind": "path", "value": "d"}}},
            {"type": "file", "data": {"media": {"kind": "path", "value": "e"}}},
        ]
    )
    out = with_placeholders(segments, [1, 2, 4, 7], "[x]")
    shown = "".join(s.data.text for s in out if s.type == "text")
    assert shown == "see [x] [x] [x] end [x]"  # after the video: nothing inline to run into
    assert out[3].type == "reply" and out[6].type == "video"


async def test_the_egress_loader_reads_through_the_same_guards() -> None:
    checker = MediaChecker(MediaSettings(), SafeFetcher())
    try:
        data, mime = await checker.load(Media(kind="base64", value=base64.b64encode(samples.PNG).decode()))
        assert data == samples.PNG and mime == "image/png"
        for media, reason in (
            (Media(kind="file", value="AgACAgIAAxkB"), "unsupported_by_platform"),
            (Media(kind="path", value="/etc/passwd"), "path_not_allowed"),
            (Media(kind="url", value="http://127.0.0.1:9/x.png"), "address_loopback"),
        ):
            with pytest.raises(MediaUnavailable) as refused:
                await checker.load(media)
            assert refused.value.reason == reason
    finally:
        await checker.aclose()
