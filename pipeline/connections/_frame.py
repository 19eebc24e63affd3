"""The protobuf `Frame` of Lark's long connection (`pbbp2.proto`, proto2), encoded and decoded by
hand: two small messages do not justify the protobuf runtime as a dependency. Field numbers:

    message Header { required string key = 1; required string value = 2; }
    message Frame {
      required uint64 SeqID = 1; required uint64 LogID = 2; required int32 service = 3;
      required int32 method = 4; repeated Header headers = 5; optional string payload_encoding = 6;
      optional string payload_type = 7; optional bytes payload = 8; optional string LogIDNew = 9;
    }

Unknown fields are skipped when decoding (a newer server may add some) and not kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .exceptions import FrameError

CONTROL, DATA = 0, 1  # `method`

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True)
class Frame:
    seq_id: int = 0
    log_id: int = 0
    service: int = 0
    method: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    payload_encoding: str | None = None
    payload_type: str | None = None
    payload: bytes | None = None
    log_id_new: str | None = None

    def header(self, key: str) -> str | None:
        for name, value in self.headers:
            if name == key:
                return value
        return None

    def answered(self, payload: bytes, **headers: str) -> Frame:
        """This frame sent back with `payload` and extra headers (Lark's way of responding)."""
        return replace(self, headers=self.headers + tuple(headers.items()), payload=payload)


@dataclass
class _Fields:
    values: dict[int, list[int | bytes]] = field(default_factory=dict)


def encode(frame: Frame) -> bytes:
    out = bytearray()
    _varint_field(out, 1, frame.seq_id)
    _varint_field(out, 2, frame.log_id)
    _varint_field(out, 3, frame.service & 0xFFFFFFFFFFFFFFFF)  # int32: negative as ten bytes
    _varint_field(out, 4, frame.method & 0xFFFFFFFFFFFFFFFF)
    for key, value in frame.headers:
        header = bytearray()
        _bytes_field(header, 1, key.encode())
        _bytes_field(header, 2, value.encode())
        _bytes_field(out, 5, bytes(header))
    for number, text in ((6, frame.payload_encoding), (7, frame.payload_type)):
        if text is not None:
            _bytes_field(out, number, text.encode())
    if frame.payload is not None:
        _bytes_field(out, 8, frame.payload)
    if frame.log_id_new is not None:
        _bytes_field(out, 9, frame.log_id_new.encode())
    return bytes(out)


def decode(data: bytes) -> Frame:
    fields = _fields(data)
    for required in (1, 2, 3, 4):
        if required not in fields.values:
            raise FrameError(f"Frame without field {required}")
    headers = []
    for raw in fields.values.get(5, []):
        header = _fields(_as_bytes(raw))
        if 1 not in header.values or 2 not in header.values:
            raise FrameError("Header without key or value")
        headers.append((_text(header, 1), _text(header, 2)))
    return Frame(
        seq_id=_int(fields, 1),
        log_id=_int(fields, 2),
        service=_int32(_int(fields, 3)),
        method=_int32(_int(fields, 4)),
        headers=tuple(headers),
        payload_encoding=_text(fields, 6) if 6 in fields.values else None,
        payload_type=_text(fields, 7) if 7 in fields.values else None,
        payload=_as_bytes(fields.values[8][-1]) if 8 in fields.values else None,
        log_id_new=_text(fields, 9) if 9 in fields.values else None,
    )


def _varint(out: bytearray, value: int) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _varint_field(out: bytearray, number: int, value: int) -> None:
    _varint(out, number << 3 | _VARINT)
    _varint(out, value)


def _bytes_field(out: bytearray, number: int, value: bytes) -> None:
    _varint(out, number << 3 | _BYTES)
    _varint(out, len(value))
    out += value


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise FrameError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> _Fields:
    fields, at = _Fields(), 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, at = _read_varint(data, at)
        elif wire == _BYTES:
            length, at = _read_varint(data, at)
            if at + length > len(data):
                raise FrameError("truncated field")
            value, at = data[at : at + length], at + length
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            if at + size > len(data):
                raise FrameError("truncated field")
            value, at = int.from_bytes(data[at : at + size], "little"), at + size
        else:
            raise FrameError(f"wire type {wire} of field {number}")
        if number == 0:
            raise FrameError("field number 0")
        fields.values.setdefault(number, []).append(value)
    return fields


def _int(fields: _Fields, number: int) -> int:
    value = fields.values[number][-1]
    if not isinstance(value, int):
        raise FrameError(f"field {number} is not an integer")
    return value


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _as_bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise FrameError("a length-delimited field is an integer")
    return value


def _text(fields: _Fields, number: int) -> str:
    try:
        return _as_bytes(fields.values[number][-1]).decode()
    except UnicodeDecodeError as exc:
        raise FrameError(f"field {number} is not UTF-8") from exc


__all__ = ["CONTROL", "DATA", "Frame", "FrameError", "decode", "encode"]
