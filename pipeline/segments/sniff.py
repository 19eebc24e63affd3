"""Identify media by their bytes (S15), never by a claimed name or Content-Type."""

from __future__ import annotations

# ISO base media (mp4 family) brands → MIME. Unknown brands of an `ftyp` box count as video/mp4.
_FTYP_BRANDS: dict[bytes, str] = {
    b"M4A ": "audio/mp4",
    b"M4B ": "audio/mp4",
    b"M4P ": "audio/mp4",
    b"F4A ": "audio/mp4",
    b"qt  ": "video/quicktime",
    b"avif": "image/avif",
    b"avis": "image/avif",
    b"heic": "image/heic",
    b"heix": "image/heic",
    b"mif1": "image/heif",
    b"msf1": "image/heif",
    b"3gp4": "video/3gpp",
    b"3gp5": "video/3gpp",
    b"3gp6": "video/3gpp",
    b"3g2a": "video/3gpp2",
}

# (offset, magic, mime) for fixed signatures, checked in order.
_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "image/png"),
    (0, b"\xff\xd8\xff", "image/jpeg"),
    (0, b"GIF87a", "image/gif"),
    (0, b"GIF89a", "image/gif"),
    (0, b"II*\x00", "image/tiff"),
    (0, b"MM\x00*", "image/tiff"),
    (0, b"\x00\x00\x01\x00", "image/x-icon"),
    (0, b"ID3", "audio/mpeg"),
    (0, b"OggS", "audio/ogg"),
    (0, b"fLaC", "audio/flac"),
    (0, b"#!AMR\n", "audio/amr"),
    (0, b"#!AMR-WB\n", "audio/amr-wb"),
    (0, b"#!SILK_V3", "audio/silk"),
    (0, b"\x02#!SILK_V3", "audio/silk"),  # Tencent's variant with a leading 0x02
    (0, b"FLV\x01", "video/x-flv"),
    (0, b"%PDF-", "application/pdf"),
    (0, b"PK\x03\x04", "application/zip"),
    (0, b"PK\x05\x06", "application/zip"),
    (0, b"\x1f\x8b", "application/gzip"),
    (0, b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"),
    (0, b"Rar!\x1a\x07", "application/vnd.rar"),
    (0, b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "application/x-ole-storage"),
    (257, b"ustar", "application/x-tar"),
)

SNIFF_BYTES = 512


def _is_mpeg_audio_frame(head: bytes) -> bool:
    # MPEG audio frame sync: 11 set bits; layer bits must not be the reserved 00.
    return len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0 and (head[1] & 0x06) != 0


def sniff_mime(head: bytes) -> str | None:
    """The MIME type recognised from the first bytes of a file, or None when unknown."""
    if len(head) >= 12 and head[:4] == b"RIFF":
        form = head[8:12]
        if form == b"WEBP":
            return "image/webp"
        if form == b"WAVE":
            return "audio/wav"
        if form == b"AVI ":
            return "video/x-msvideo"
    if len(head) >= 12 and head[4:8] == b"ftyp":
        return _FTYP_BRANDS.get(head[8:12], "video/mp4")
    if head[:4] == b"\x1a\x45\xdf\xa3":  # EBML: Matroska or WebM, told apart by the DocType
        return "video/webm" if b"webm" in head[:SNIFF_BYTES] else "video/x-matroska"
    for offset, magic, mime in _SIGNATURES:
        if head[offset : offset + len(magic)] == magic:
            return mime
    if head[:2] == b"BM" and len(head) >= 14 and head[6:10] == b"\x00\x00\x00\x00":
        return "image/bmp"  # "BM" alone is too weak: also require the zero reserved fields
    if _is_mpeg_audio_frame(head):
        return "audio/mpeg"
    return None


_PREFIX_BY_SEGMENT = {"image": "image/", "audio": "audio/", "video": "video/"}


def mime_fits_segment(mime: str | None, segment_type: str) -> bool:
    """Whether bytes of `mime` may be sent as `segment_type`; a `file` accepts anything."""
    if segment_type == "file":
        return True
    prefix = _PREFIX_BY_SEGMENT.get(segment_type)
    return mime is not None and prefix is not None and mime.startswith(prefix)
