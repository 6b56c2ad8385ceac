"""The batch codec (docs/architecture/formats.md).

A **batch** is the unit that is appended atomically and stored with identical bytes in the WAL and
in objects::

    magic u8 | stream_id i64 | epoch i64 | base_offset i64 | count i32 | payload_len i32 | payload

(33-byte header, big-endian). The payload is ``count`` records, each::

    timestamp_ms i64 | key_len i32 (-1 = no key) | key | value_len i32 | value
    | header_count u16 | (name_len u16 | name utf-8 | hvalue_len i32 | hvalue)*

The batch itself carries no checksum: the enclosing WAL record or object data block does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from walstream.errors import CorruptionError, InvalidArgument
from walstream.records import Record, SequencedRecord, make_sequenced_record

__all__ = [
    "BATCH_HEADER",
    "BATCH_MAGIC",
    "BatchHeader",
    "decode_batch",
    "decode_batch_header",
    "decode_records_into",
    "encode_batch",
    "iter_batches",
    "record_size",
]


BATCH_MAGIC = 0xB1  # batch format version 1
BATCH_HEADER = struct.Struct(">BqqqiI")
assert BATCH_HEADER.size == 33

_REC_TS_KEYLEN = struct.Struct(">qi")
#: A batch header followed by the head of one record without a key: timestamp, key length -1,
#: value length. The single-record batch of a plain record (the hot path) packs it in one call.
_SINGLE_HEAD = struct.Struct(">BqqqiIqii")
_NO_HEADERS = b"\x00\x00"
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_MAX_I32 = 2**31 - 1
_MAX_I64 = 2**63 - 1


@dataclass(frozen=True, slots=True)
class BatchHeader:
    stream_id: int
    epoch: int
    base_offset: int
    count: int
    payload_len: int

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count

    @property
    def size(self) -> int:
        return BATCH_HEADER.size + self.payload_len


def record_size(record: Record | SequencedRecord) -> int:
    """Bytes a record takes in a batch payload (used for ``limit_bytes`` and accounting)."""
    size = 8 + 4 + 4 + 2 + len(record.value) + (len(record.key) if record.key is not None else 0)
    for name, value in record.headers:
        size += 2 + len(name.encode()) + 4 + len(value)
    return size


def encode_batch(
    stream_id: int,
    epoch: int,
    base_offset: int,
    records: Sequence[Record],
    timestamps_ms: Sequence[int],
) -> bytes:
    """Encode ``records`` with their resolved timestamps into one batch."""
    if len(records) == 1:
        record = records[0]
        if record.key is None and not record.headers:
            value = record.value
            payload_len = 18 + len(value)  # timestamp 8, key length 4, value length 4, header count 2
            try:
                head = _SINGLE_HEAD.pack(
                    BATCH_MAGIC, stream_id, epoch, base_offset, 1, payload_len,
                    timestamps_ms[0], -1, len(value),
                )  # fmt: skip
            except (struct.error, OverflowError) as exc:
                raise InvalidArgument(f"a record does not fit the batch format: {exc}") from None
            return b"".join((head, value, _NO_HEADERS))
    if not records:
        raise InvalidArgument("a batch needs at least one record")
    if len(records) > _MAX_I32:
        raise InvalidArgument(f"a batch holds at most {_MAX_I32} records, got {len(records)}")
    try:
        payload = _encode_payload(records, timestamps_ms)
    except (struct.error, OverflowError, UnicodeEncodeError) as exc:
        # Record checks its fields when made; this catches a bytearray grown after that, or a
        # timestamp out of range. Nothing was written.
        raise InvalidArgument(f"a record does not fit the batch format: {exc}") from None
    if len(payload) > _MAX_I32:
        raise InvalidArgument(f"batch payload of {len(payload)} bytes exceeds 2 GiB")
    header = BATCH_HEADER.pack(
        BATCH_MAGIC, stream_id, epoch, base_offset, len(records), len(payload)
    )
    return header + payload


def _encode_payload(records: Sequence[Record], timestamps_ms: Sequence[int]) -> bytes:
    parts: list[bytes] = []
    append = parts.append
    for record, timestamp_ms in zip(records, timestamps_ms, strict=True):
        key = record.key
        if key is None:
            append(_REC_TS_KEYLEN.pack(timestamp_ms, -1))
        else:
            append(_REC_TS_KEYLEN.pack(timestamp_ms, len(key)))
            append(bytes(key))
        append(_I32.pack(len(record.value)))
        append(bytes(record.value))
        append(_U16.pack(len(record.headers)))
        for name, value in record.headers:
            name_bytes = name.encode()
            append(_U16.pack(len(name_bytes)))
            append(name_bytes)
            append(_I32.pack(len(value)))
            append(bytes(value))
    return b"".join(parts)


def decode_batch_header(data: bytes | memoryview, position: int = 0) -> BatchHeader:
    if len(data) - position < BATCH_HEADER.size:
        raise CorruptionError(f"truncated batch header at byte {position}")
    magic, stream_id, epoch, base_offset, count, payload_len = BATCH_HEADER.unpack_from(
        data, position
    )
    if magic != BATCH_MAGIC:
        raise CorruptionError(f"bad batch magic 0x{magic:02x} at byte {position}")
    if count <= 0 or base_offset < 0:
        raise CorruptionError(f"bad batch header (count={count}, base={base_offset}) at {position}")
    if len(data) - position - BATCH_HEADER.size < payload_len:
        raise CorruptionError(f"truncated batch payload at byte {position}")
    return BatchHeader(stream_id, epoch, base_offset, count, payload_len)


def decode_batch(
    data: bytes | memoryview, position: int = 0
) -> tuple[BatchHeader, list[SequencedRecord]]:
    """Decode one batch starting at ``position``; raise :class:`CorruptionError` on bad bytes."""
    header = decode_batch_header(data, position)
    records: list[SequencedRecord] = []
    decode_records_into(data, position, header, records)
    return header, records


def decode_records_into(
    data: bytes | memoryview, position: int, header: BatchHeader, records: list[SequencedRecord]
) -> None:
    """Append the records of the batch at ``position`` (whose ``header`` was decoded) to
    ``records``; raise :class:`CorruptionError` on bad bytes. One record is a few C calls:
    a read decodes thousands of them per block."""
    if type(data) is not bytes:
        data = bytes(data)  # slices of bytes are one copy, of a memoryview two objects
    unpack_head = _REC_TS_KEYLEN.unpack_from
    unpack_i32 = _I32.unpack_from
    unpack_u16 = _U16.unpack_from
    append = records.append
    make = make_sequenced_record
    pos = position + BATCH_HEADER.size
    end = pos + header.payload_len
    base_offset = header.base_offset
    try:
        for offset in range(base_offset, base_offset + header.count):
            timestamp_ms, key_len = unpack_head(data, pos)
            pos += 12
            key: bytes | None = None
            if key_len >= 0:
                key = data[pos : pos + key_len]
                pos += key_len
            (value_len,) = unpack_i32(data, pos)
            pos += 4
            if value_len < 0 or pos + value_len > end:
                raise CorruptionError("record value overruns its batch")
            value = data[pos : pos + value_len]
            pos += value_len
            (header_count,) = unpack_u16(data, pos)
            pos += 2
            headers: tuple[tuple[str, bytes], ...] = ()
            if header_count:
                pairs: list[tuple[str, bytes]] = []
                for _ in range(header_count):
                    (name_len,) = unpack_u16(data, pos)
                    pos += 2
                    name = data[pos : pos + name_len].decode()
                    pos += name_len
                    (hvalue_len,) = unpack_i32(data, pos)
                    pos += 4
                    pairs.append((name, data[pos : pos + hvalue_len]))
                    pos += hvalue_len
                headers = tuple(pairs)
            if pos > end:
                raise CorruptionError("record overruns its batch")
            append(make(offset, value, key, headers, timestamp_ms))
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptionError(f"malformed record in batch at byte {position}: {exc}") from exc
    if pos != end:
        raise CorruptionError(f"batch payload length mismatch at byte {position}")


def iter_batches(data: bytes | memoryview) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` of consecutive batches filling ``data`` exactly."""
    position = 0
    total = len(data)
    while position < total:
        header = decode_batch_header(data, position)
        yield position, header
        position += header.size


def batch_records(data: bytes | memoryview) -> Iterable[SequencedRecord]:
    for position, _ in iter_batches(data):
        yield from decode_batch(data, position)[1]
