"""Tiny real file headers for byte-sniffing tests."""

from __future__ import annotations

import base64

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="
)
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01" + b"\x00" * 64
GIF = b"GIF89a\x01\x00\x01\x00" + b"\x00" * 32
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x00" * 32
BMP = b"BM\x46\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00" + b"\x00" * 32
MP3_ID3 = b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\x00" * 32
MP3_FRAME = b"\xff\xfb\x90\x64" + b"\x00" * 32
OGG = b"OggS\x00\x02" + b"\x00" * 32
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 32
M4A = b"\x00\x00\x00\x20ftypM4A \x00\x00\x00\x00" + b"\x00" * 32
AMR = b"#!AMR\n" + b"\x00" * 32
SILK = b"\x02#!SILK_V3" + b"\x00" * 32
MP4 = b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00" + b"\x00" * 32
MOV = b"\x00\x00\x00\x14ftypqt  \x00\x00\x02\x00" + b"\x00" * 32
WEBM = b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\x82\x84webm" + b"\x00" * 32
AVI = b"RIFF\x24\x00\x00\x00AVI LIST" + b"\x00" * 32
PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n" + b"\x00" * 32
ZIP = b"PK\x03\x04\x14\x00\x00\x00" + b"\x00" * 32
TEXT = b"just some text, no magic here\n"
