"""The wire forms of the S2 API v1 records: protobuf (``application/protobuf`` or
``application/x-protobuf``, the messages of S2's ``s2/v1/s2.proto``), the S2S session framing
(``s2s/proto``) and JSON (``raw`` or ``base64`` bytes, chosen by the ``s2-format`` header).

The protobuf codec is written out here for the six small messages the API uses (StreamPosition,
Header, AppendRecord, AppendInput, AppendAck, SequencedRecord, ReadBatch): no generated code and
no dependency, and unknown fields are skipped as protobuf requires. Malformed bytes raise
:class:`S2Error` ``bad_proto`` (400), never an exception of the parser.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass
from typing import Any

from walstream.server.s2.compression import THRESHOLD_BYTES, Coding, compress, decompress
from walstream.server.s2.errors import S2Error

__all__ = [
    "PROTOBUF_TYPES",
    "S2S",
    "AppendCommand",
    "AppendRequest",
    "FrameReader",
    "S2Record",
    "decode_append_input",
    "encode_append_ack",
    "encode_frame",
    "encode_read_batch",
    "encode_terminal",
    "json_append_input",
    "json_read_batch",
    "media_type",
    "position_json",
]

_MAX_U64 = 2**64 - 1

PROTOBUF_TYPES = frozenset({"application/protobuf", "application/x-protobuf"})
"""The media types of the protobuf forms: S2's TypeScript SDK sends the first, its Python SDK the
second; both name the same messages."""
S2S = "s2s/proto"
"""The media type of S2S sessions."""


def media_type(value: str | None) -> str:
    """The first media type of a ``Content-Type`` or ``Accept`` value, lower case, without its
    parameters (``""`` when there is none): S2 reads only the first type of ``Accept``."""
    return (value or "").split(",", 1)[0].split(";", 1)[0].strip().lower()


@dataclass(frozen=True, slots=True)
class S2Record:
    """One record as the S2 API carries it: bytes headers, a body, an optional timestamp."""

    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """An ``AppendInput``: 1 to 1000 records and the two conditions."""

    records: list[S2Record]
    match_seq_num: int | None
    fencing_token: str | None


AppendCommand = tuple[str, bytes]


# -- protobuf -----------------------------------------------------------------------------------


def _varint(value: int, out: bytearray) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _field_varint(number: int, value: int, out: bytearray) -> None:
    out.append(number << 3)
    _varint(value, out)


def _field_bytes(number: int, data: bytes, out: bytearray) -> None:
    out.append((number << 3) | 2)
    _varint(len(data), out)
    out += data


def _position(seq_num: int, timestamp: int) -> bytes:
    out = bytearray()
    if seq_num:
        _field_varint(1, seq_num, out)
    if timestamp:
        _field_varint(2, timestamp, out)
    return bytes(out)


def encode_append_ack(start: tuple[int, int], end: tuple[int, int], tail: tuple[int, int]) -> bytes:
    """``AppendAck`` from (seq_num, timestamp) pairs."""
    out = bytearray()
    for number, position in ((1, start), (2, end), (3, tail)):
        _field_bytes(number, _position(*position), out)
    return bytes(out)


def encode_read_batch(
    records: list[tuple[int, int, tuple[tuple[bytes, bytes], ...], bytes]],
    tail: tuple[int, int] | None,
) -> bytes:
    """``ReadBatch`` from (seq_num, timestamp, headers, body) tuples and the optional tail."""
    out = bytearray()
    for seq_num, timestamp, headers, body in records:
        item = bytearray()
        if seq_num:
            _field_varint(1, seq_num, item)
        if timestamp:
            _field_varint(2, timestamp, item)
        for name, value in headers:
            header = bytearray()
            if name:
                _field_bytes(1, name, header)
            if value:
                _field_bytes(2, value, header)
            _field_bytes(3, bytes(header), item)
        if body:
            _field_bytes(4, body, item)
        _field_bytes(1, bytes(item), out)
    if tail is not None:
        _field_bytes(2, _position(*tail), out)
    return bytes(out)


def _bad_proto(what: str) -> S2Error:
    return S2Error(400, "bad_proto", f"malformed protobuf AppendInput: {what}")


def _fields(data: bytes, what: str) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one message: ints for varints, bytes for
    length-delimited fields; fixed-width fields are skipped."""
    fields: list[tuple[int, int | bytes]] = []
    position, size = 0, len(data)
    while position < size:
        key, position = _read_varint(data, position, what)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _bad_proto(f"{what}: field number 0")
        if wire_type == 0:
            value, position = _read_varint(data, position, what)
            fields.append((number, value))
        elif wire_type == 2:
            length, position = _read_varint(data, position, what)
            end = position + length
            if end > size:
                raise _bad_proto(f"{what}: a field runs past the end of the message")
            fields.append((number, data[position:end]))
            position = end
        elif wire_type == 1:
            position += 8
        elif wire_type == 5:
            position += 4
        else:
            raise _bad_proto(f"{what}: unsupported wire type {wire_type}")
        if position > size:
            raise _bad_proto(f"{what}: truncated")
    return fields


def _read_varint(data: bytes, position: int, what: str) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if position >= len(data) or shift > 63:
            raise _bad_proto(f"{what}: truncated or overlong varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7


def _as_int(value: int | bytes, what: str) -> int:
    if not isinstance(value, int):
        raise _bad_proto(f"{what} must be a varint")
    return value


def _as_bytes(value: int | bytes, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise _bad_proto(f"{what} must be length-delimited")
    return value


def decode_append_input(data: bytes) -> AppendRequest:
    """An ``AppendInput`` message (the checks of the record count are the caller's)."""
    records: list[S2Record] = []
    match_seq_num: int | None = None
    fencing_token: str | None = None
    for number, value in _fields(data, "AppendInput"):
        if number == 1:
            records.append(_decode_record(_as_bytes(value, "records")))
        elif number == 2:
            match_seq_num = _as_int(value, "match_seq_num")
        elif number == 3:
            try:
                fencing_token = _as_bytes(value, "fencing_token").decode("utf-8")
            except UnicodeDecodeError:
                raise _bad_proto("fencing_token is not UTF-8") from None
    return AppendRequest(records, match_seq_num, fencing_token)


def _decode_record(data: bytes) -> S2Record:
    timestamp: int | None = None
    headers: list[tuple[bytes, bytes]] = []
    body = b""
    for number, value in _fields(data, "AppendRecord"):
        if number == 1:
            timestamp = _as_int(value, "timestamp")
        elif number == 2:
            name, header_value = b"", b""
            for header_number, part in _fields(_as_bytes(value, "headers"), "Header"):
                if header_number == 1:
                    name = _as_bytes(part, "Header.name")
                elif header_number == 2:
                    header_value = _as_bytes(part, "Header.value")
            headers.append((name, header_value))
        elif number == 3:
            body = _as_bytes(value, "body")
    return S2Record(tuple(headers), body, timestamp)


# -- S2S framing --------------------------------------------------------------------------------

_TERMINAL = 0x80
_COMPRESSION_MASK = 0x60
_COMPRESSION_SHIFT = 5
_MAX_FRAME = 2**24 - 1


def encode_frame(body: bytes, coding: Coding = Coding.NONE) -> bytes:
    """A regular S2S message, compressed with ``coding`` when it has at least
    :data:`~walstream.server.s2.compression.THRESHOLD_BYTES` bytes."""
    flag = 0
    if coding is not Coding.NONE and len(body) >= THRESHOLD_BYTES:
        body = compress(body, coding)
        flag = coding << _COMPRESSION_SHIFT
    size = len(body) + 1
    if size > _MAX_FRAME:
        raise S2Error(500, "other", "an S2S message would exceed 16 MiB")
    return struct.pack(">I", size)[1:] + bytes([flag]) + body


def encode_terminal(status: int, error: bytes) -> bytes:
    """The terminal S2S message: a 2-byte status and the JSON error body."""
    body = struct.pack(">H", status) + error
    return struct.pack(">I", len(body) + 1)[1:] + bytes([_TERMINAL]) + body


class FrameReader:
    """Splits the bytes of an S2S request body into message bodies (decompressed: at most
    ``max_message_bytes`` each, as sent and once decompressed)."""

    def __init__(self, max_message_bytes: int) -> None:
        self.buffer = bytearray()
        self.max_message_bytes = max_message_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return the bodies of the messages now complete."""
        self.buffer += data
        messages: list[bytes] = []
        buffer = self.buffer
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:3], "big")
            if size < 1 or size > self.max_message_bytes:
                raise S2Error(
                    400,
                    "bad_frame",
                    f"an S2S message of {size} bytes is outside 1 to {self.max_message_bytes}",
                )
            if len(buffer) < 3 + size:
                break
            flag = buffer[3]
            if flag & _TERMINAL:
                raise S2Error(400, "bad_frame", "a client sent a terminal S2S message")
            body = bytes(buffer[4 : 3 + size])
            code = (flag & _COMPRESSION_MASK) >> _COMPRESSION_SHIFT
            if code:
                if code not in (Coding.ZSTD, Coding.GZIP):
                    raise S2Error(400, "bad_frame", f"unknown S2S compression {code}")
                body = decompress(body, Coding(code), self.max_message_bytes, "an S2S message")
            messages.append(body)
            del buffer[: 3 + size]
        return messages

    @property
    def pending(self) -> bool:
        return bool(self.buffer)


# -- JSON ---------------------------------------------------------------------------------------


def _decode_text(value: Any, base64_format: bool, what: str) -> bytes:
    if not isinstance(value, str):
        raise S2Error(422, "invalid", f"{what} must be a string")
    if base64_format:
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise S2Error(422, "invalid", f"{what} is not valid base64") from None
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise S2Error(422, "invalid", f"{what} is not valid UTF-8 text") from None


def _encode_text(data: bytes, base64_format: bool) -> str:
    if base64_format:
        return base64.b64encode(data).decode("ascii")
    return data.decode("utf-8", "replace")


def _optional_u64(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_U64:
        raise S2Error(422, "invalid", f"{what} must be an unsigned 64-bit integer or null")
    return value


def append_input(body: bytes, protobuf: bool, base64_format: bool) -> AppendRequest:
    """An append request's body: protobuf ``AppendInput`` when ``protobuf`` (the request's
    Content-Type says so), else JSON (any other type: ``curl -d`` sends a form type)."""
    if protobuf:
        return decode_append_input(body)
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise S2Error(400, "bad_json", "the body is not valid JSON") from None
    return json_append_input(document, base64_format)


def json_append_input(document: Any, base64_format: bool) -> AppendRequest:
    """An ``AppendInput`` JSON document."""
    if not isinstance(document, dict):
        raise S2Error(422, "invalid", "the body must be a JSON object (AppendInput)")
    records_json = document.get("records")
    if not isinstance(records_json, list):
        raise S2Error(422, "invalid", "records: expected a list of AppendRecord objects")
    records: list[S2Record] = []
    for index, item in enumerate(records_json):
        if not isinstance(item, dict):
            raise S2Error(422, "invalid", f"records[{index}]: expected an object")
        headers_json = item.get("headers") or []
        if not isinstance(headers_json, list):
            raise S2Error(422, "invalid", f"records[{index}].headers: expected a list")
        headers: list[tuple[bytes, bytes]] = []
        for position, pair in enumerate(headers_json):
            what = f"records[{index}].headers[{position}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise S2Error(422, "invalid", f"{what}: expected a [name, value] pair")
            headers.append(
                (
                    _decode_text(pair[0], base64_format, f"{what} name"),
                    _decode_text(pair[1], base64_format, f"{what} value"),
                )
            )
        body_json = item.get("body", "")
        body = b"" if body_json is None else _decode_text(body_json, base64_format, "body")
        timestamp = _optional_u64(item.get("timestamp"), f"records[{index}].timestamp")
        records.append(S2Record(tuple(headers), body, timestamp))
    match_seq_num = _optional_u64(document.get("match_seq_num"), "match_seq_num")
    token = document.get("fencing_token")
    if token is not None:
        if not isinstance(token, str):
            raise S2Error(422, "invalid", "fencing_token must be a string or null")
        _decode_text(token, False, "fencing_token")
    return AppendRequest(records, match_seq_num, token)


def position_json(seq_num: int, timestamp: int) -> dict[str, int]:
    return {"seq_num": seq_num, "timestamp": timestamp}


def json_read_batch(
    records: list[tuple[int, int, tuple[tuple[bytes, bytes], ...], bytes]],
    tail: tuple[int, int] | None,
    base64_format: bool,
) -> dict[str, Any]:
    """A ``ReadBatch`` JSON document."""
    document: dict[str, Any] = {
        "records": [
            {
                "seq_num": seq_num,
                "timestamp": timestamp,
                "headers": [
                    [_encode_text(name, base64_format), _encode_text(value, base64_format)]
                    for name, value in headers
                ],
                "body": _encode_text(body, base64_format),
            }
            for seq_num, timestamp, headers, body in records
        ]
    }
    if tail is not None:
        document["tail"] = position_json(*tail)
    return document
