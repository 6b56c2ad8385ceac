"""The format of uploaded objects (DESIGN §6): writer, reader and verifier.

An object is::

    [DataBlock]* [IndexBlock] [Footer]

all integers big-endian, every part checksummed with CRC32C.

- **DataBlock** — consecutive batches (the exact bytes of :func:`walstream.records.encode_batch`)
  of ONE stream with contiguous offsets, then ``crc u32`` (CRC32C of those batch bytes). The
  builder cuts a block when it reaches about ``block_target_bytes``; a single batch larger than
  that gets a block of its own.
- **IndexBlock** — one fixed 36-byte entry per data block, sorted by ``(stream_id,
  start_offset)`` whatever the physical order of the blocks::

      stream_id i64 | start_offset i64 | end_delta i32 | record_count i32 | position u64 | size u32

  ``size`` counts the block's bytes including its CRC.
- **Footer** — fixed 48 bytes::

      index_position u64 | index_length u32 | index_crc u32 | entry_count u32
      | format_version u16 | flags u16 | reserved 12 zero bytes | footer_crc u32 | magic 8 bytes

  ``footer_crc`` is the CRC32C of the 36 bytes before it; ``magic`` is ``b"WSOBJ\\x00\\x00\\x01"``.

A reader that knows the object's ``index_size`` (index block + footer, kept in metadata) reaches
any offset with two ranged reads: one suffix read for the index, one read for the block. Bad or
truncated bytes raise :class:`CorruptionError`; they are never returned as records.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from .errors import CorruptionError, InvalidArgument
from .objects import ObjectStore
from .records import (
    BATCH_HEADER,
    BatchHeader,
    SequencedRecord,
    decode_batch,
    decode_batch_header,
)

__all__ = [
    "DEFAULT_BLOCK_TARGET_BYTES",
    "FOOTER_SIZE",
    "FORMAT_VERSION",
    "INDEX_ENTRY_SIZE",
    "OBJECT_MAGIC",
    "BuiltObject",
    "Footer",
    "IndexEntry",
    "ObjectBuilder",
    "ObjectIndex",
    "StreamSlice",
    "decode_block",
    "decode_block_records",
    "describe_object",
    "object_key",
    "parse_footer",
    "parse_index",
    "read_index",
    "verify_object",
]

OBJECT_MAGIC = b"WSOBJ\x00\x00\x01"
FORMAT_VERSION = 1
DEFAULT_BLOCK_TARGET_BYTES = 1 << 20

_INDEX_ENTRY = struct.Struct(">qqiiQI")
_FOOTER_FIELDS = struct.Struct(">QIIIHH12s")
_FOOTER = struct.Struct(">QIIIHH12sI8s")
_U32 = struct.Struct(">I")

INDEX_ENTRY_SIZE = _INDEX_ENTRY.size
FOOTER_SIZE = _FOOTER.size
assert INDEX_ENTRY_SIZE == 36
assert FOOTER_SIZE == 48
assert _FOOTER_FIELDS.size == 36

_BLOCK_CRC_SIZE = 4
_MIN_BLOCK_SIZE = BATCH_HEADER.size + _BLOCK_CRC_SIZE
_MAX_I32 = 2**31 - 1
_MAX_U32 = 2**32 - 1
_MAX_BLOCK_TARGET_BYTES = 1 << 31


def _crc(data: bytes | memoryview, value: int = 0) -> int:
    return int(crc32c.crc32c(data, value))


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One data block: stream ``stream_id``, offsets ``[start_offset, end_offset)``, stored at
    bytes ``[position, position + size)`` of the object (``size`` includes the block CRC)."""

    stream_id: int
    start_offset: int
    end_offset: int
    record_count: int
    position: int
    size: int


@dataclass(frozen=True, slots=True)
class StreamSlice:
    """What one object holds of one stream: offsets ``[start_offset, end_offset)`` in ``size``
    bytes of data blocks."""

    stream_id: int
    start_offset: int
    end_offset: int
    record_count: int
    size: int


@dataclass(frozen=True)
class BuiltObject:
    data: bytes
    index_size: int
    """Bytes of the index block and footer: the length of the suffix read that loads the index."""
    slices: list[StreamSlice]
    """One per stream, in the order the streams were added."""


@dataclass(frozen=True, slots=True)
class Footer:
    index_position: int
    index_length: int
    index_crc: int
    entry_count: int
    version: int
    flags: int


class ObjectBuilder:
    """Builds one object from batches, stream after stream.

    A stream's batches must be added together and with contiguous offsets (all of stream A, then
    all of stream B, ...); streams may come in any order. Only batch headers are checked here:
    the batches are expected to come from :func:`walstream.records.encode_batch`.
    """

    def __init__(self, block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES) -> None:
        if not 1 <= block_target_bytes <= _MAX_BLOCK_TARGET_BYTES:
            raise InvalidArgument(
                f"block_target_bytes must be between 1 and {_MAX_BLOCK_TARGET_BYTES}, "
                f"got {block_target_bytes}"
            )
        self._block_target_bytes = block_target_bytes
        self._parts: list[bytes] = []
        self._entries: list[IndexEntry] = []
        self._slices: list[StreamSlice] = []
        self._seen_streams: set[int] = set()
        self._data_bytes = 0
        # The open block: its first offset, batch bytes so far, running CRC and record count.
        self._block_position = 0
        self._block_start = 0
        self._block_end = 0
        self._block_bytes = 0
        self._block_crc = 0
        self._block_records = 0
        self._stream_id: int | None = None
        self._stream_start = 0
        self._stream_bytes = 0
        self._finished = False

    @property
    def size_bytes(self) -> int:
        """Bytes of data blocks so far, the open block counted with its CRC."""
        open_block = self._block_bytes + _BLOCK_CRC_SIZE if self._block_bytes else 0
        return self._data_bytes + open_block

    def add_batch(self, batch: bytes) -> None:
        """Append one encoded batch. Raises :class:`InvalidArgument` if it is not exactly one
        batch, or breaks the grouping or offset contiguity of its stream."""
        if self._finished:
            raise InvalidArgument("add_batch() after finish(): start a new ObjectBuilder")
        try:
            header = decode_batch_header(batch)
        except CorruptionError as exc:
            raise InvalidArgument(f"not an encoded batch: {exc}") from None
        if header.size != len(batch):
            raise InvalidArgument(
                f"add_batch() takes exactly one batch: header says {header.size} bytes, "
                f"got {len(batch)}"
            )
        if header.stream_id != self._stream_id:
            if header.stream_id in self._seen_streams:
                raise InvalidArgument(
                    f"stream {header.stream_id} was already added to this object: add all "
                    "batches of a stream together"
                )
            self._close_stream()
            self._seen_streams.add(header.stream_id)
            self._stream_id = header.stream_id
            self._stream_start = header.base_offset
            self._stream_bytes = 0
            self._block_end = header.base_offset
        elif header.base_offset != self._block_end:
            raise InvalidArgument(
                f"stream {header.stream_id}: batch starts at offset {header.base_offset}, "
                f"expected {self._block_end} (batches of a stream must be contiguous)"
            )
        if self._block_bytes and (
            self._block_bytes + len(batch) > self._block_target_bytes
            or self._block_records + header.count > _MAX_I32
        ):
            self._cut_block()
        if not self._block_bytes:
            self._block_start = header.base_offset
        self._parts.append(bytes(batch))
        self._block_bytes += len(batch)
        self._block_crc = _crc(batch, self._block_crc)
        self._block_records += header.count
        self._block_end = header.end_offset
        if self._block_bytes >= self._block_target_bytes:
            self._cut_block()

    def finish(self) -> BuiltObject:
        """Close the last block and append the index and footer."""
        if self._finished:
            raise InvalidArgument("finish() called twice")
        if self._stream_id is None:
            raise InvalidArgument("an object needs at least one batch")
        self._close_stream()
        self._finished = True
        entries = sorted(self._entries, key=lambda entry: (entry.stream_id, entry.start_offset))
        index = b"".join(
            _INDEX_ENTRY.pack(
                entry.stream_id,
                entry.start_offset,
                entry.end_offset - entry.start_offset,
                entry.record_count,
                entry.position,
                entry.size,
            )
            for entry in entries
        )
        fields = _FOOTER_FIELDS.pack(
            self._data_bytes, len(index), _crc(index), len(entries), FORMAT_VERSION, 0, bytes(12)
        )
        footer = fields + _U32.pack(_crc(fields)) + OBJECT_MAGIC
        self._parts.append(index)
        self._parts.append(footer)
        data = b"".join(self._parts)
        self._parts = []
        return BuiltObject(data, len(index) + FOOTER_SIZE, list(self._slices))

    def _cut_block(self) -> None:
        assert self._stream_id is not None
        self._parts.append(_U32.pack(self._block_crc))
        size = self._block_bytes + _BLOCK_CRC_SIZE
        self._entries.append(
            IndexEntry(
                self._stream_id,
                self._block_start,
                self._block_end,
                self._block_records,
                self._data_bytes,
                size,
            )
        )
        self._data_bytes += size
        self._stream_bytes += size
        self._block_bytes = 0
        self._block_crc = 0
        self._block_records = 0

    def _close_stream(self) -> None:
        if self._stream_id is None:
            return
        if self._block_bytes:
            self._cut_block()
        self._slices.append(
            StreamSlice(
                self._stream_id,
                self._stream_start,
                self._block_end,
                self._block_end - self._stream_start,
                self._stream_bytes,
            )
        )


class ObjectIndex:
    """The parsed index of one object: where each stream's offsets are stored."""

    def __init__(
        self,
        entries: list[IndexEntry],
        object_size: int,
        index_position: int,
        version: int = FORMAT_VERSION,
    ) -> None:
        self.entries = entries
        self.object_size = object_size
        self.index_position = index_position
        self.version = version
        # Blocks of one stream are sorted and contiguous, so their end offsets are sorted too.
        self._end_keys = [(entry.stream_id, entry.end_offset) for entry in entries]

    @property
    def index_size(self) -> int:
        """Bytes of the index block and footer."""
        return self.object_size - self.index_position

    def blocks_for(
        self, stream_id: int, start_offset: int, end_offset: int | None = None
    ) -> list[IndexEntry]:
        """The blocks of ``stream_id`` holding offsets in ``[start_offset, end_offset)``
        (``end_offset=None``: to the end of the stream's data in this object)."""
        first = bisect.bisect_right(self._end_keys, (stream_id, start_offset))
        blocks: list[IndexEntry] = []
        for entry in self.entries[first:]:
            if entry.stream_id != stream_id:
                break
            if end_offset is not None and entry.start_offset >= end_offset:
                break
            blocks.append(entry)
        return blocks

    def stream_ids(self) -> list[int]:
        """The streams this object holds, ascending."""
        return sorted({entry.stream_id for entry in self.entries})

    def __repr__(self) -> str:
        return (
            f"ObjectIndex(entries={len(self.entries)}, object_size={self.object_size}, "
            f"index_position={self.index_position}, version={self.version})"
        )


def parse_footer(footer: bytes, object_size: int) -> Footer:
    """Decode and check the 48-byte footer of an object of ``object_size`` bytes."""
    if len(footer) != FOOTER_SIZE:
        raise CorruptionError(
            f"object footer is {len(footer)} bytes, expected {FOOTER_SIZE} (truncated object?)"
        )
    (
        index_position,
        index_length,
        index_crc,
        entry_count,
        version,
        flags,
        reserved,
        footer_crc,
        magic,
    ) = _FOOTER.unpack(footer)
    if magic != OBJECT_MAGIC:
        raise CorruptionError(f"bad object magic {magic!r}: not a walstream object, or truncated")
    if _crc(footer[: _FOOTER_FIELDS.size]) != footer_crc:
        raise CorruptionError("object footer checksum mismatch")
    if version != FORMAT_VERSION:
        raise CorruptionError(
            f"object format version {version} is not supported (this walstream reads version "
            f"{FORMAT_VERSION}); upgrade walstream"
        )
    if flags != 0 or reserved != bytes(12):
        raise CorruptionError(f"object footer has unknown flags 0x{flags:04x} or reserved bytes")
    if entry_count == 0 or index_length != entry_count * INDEX_ENTRY_SIZE:
        raise CorruptionError(
            f"object footer: index of {index_length} bytes cannot hold {entry_count} entries"
        )
    if index_position + index_length + FOOTER_SIZE != object_size:
        raise CorruptionError(
            f"object footer places the index at [{index_position}, "
            f"{index_position + index_length}) but the object is {object_size} bytes "
            "(truncated, or the wrong size was recorded)"
        )
    return Footer(index_position, index_length, index_crc, entry_count, version, flags)


def parse_index(tail: bytes, object_size: int) -> ObjectIndex:
    """Parse the index from ``tail``, the LAST bytes of an object of ``object_size`` bytes
    (at least ``index_size`` of them). Checks the footer, the index CRC, the order of entries
    and that the blocks exactly tile the data area."""
    if len(tail) < FOOTER_SIZE or len(tail) > object_size:
        raise CorruptionError(
            f"object tail of {len(tail)} bytes cannot hold a footer of an object of "
            f"{object_size} bytes (truncated object?)"
        )
    footer = parse_footer(bytes(tail[-FOOTER_SIZE:]), object_size)
    needed = footer.index_length + FOOTER_SIZE
    if len(tail) < needed:
        raise CorruptionError(
            f"object index needs the last {needed} bytes, got {len(tail)} "
            "(the recorded index_size does not match the object)"
        )
    index = memoryview(tail)[len(tail) - needed : len(tail) - FOOTER_SIZE]
    if _crc(index) != footer.index_crc:
        raise CorruptionError("object index checksum mismatch")
    entries = [
        IndexEntry(
            stream_id,
            start_offset,
            start_offset + end_delta,
            record_count,
            position,
            size,
        )
        for stream_id, start_offset, end_delta, record_count, position, size in (
            _INDEX_ENTRY.iter_unpack(index)
        )
    ]
    _check_entries(entries, footer.index_position)
    return ObjectIndex(entries, object_size, footer.index_position, footer.version)


def _check_entries(entries: Sequence[IndexEntry], data_size: int) -> None:
    previous: IndexEntry | None = None
    for entry in entries:
        if (
            entry.start_offset < 0
            or entry.end_offset <= entry.start_offset
            or entry.record_count != entry.end_offset - entry.start_offset
            or entry.size < _MIN_BLOCK_SIZE
        ):
            raise CorruptionError(f"object index entry is malformed: {entry}")
        if previous is not None:
            if entry.stream_id < previous.stream_id or (
                entry.stream_id == previous.stream_id and entry.start_offset != previous.end_offset
            ):
                raise CorruptionError(
                    f"object index entries are out of order or leave a gap: {previous} then {entry}"
                )
        previous = entry
    next_position = 0
    for entry in sorted(entries, key=lambda entry: entry.position):
        if entry.position != next_position:
            raise CorruptionError(
                f"object data blocks do not tile the data area: block at {entry.position}, "
                f"expected {next_position}"
            )
        next_position += entry.size
    if next_position != data_size:
        raise CorruptionError(
            f"object data blocks end at {next_position} but the index starts at {data_size}"
        )


async def read_index(
    store: ObjectStore,
    key: str,
    object_size: int | None = None,
    index_size: int | None = None,
) -> ObjectIndex:
    """Load the index of object ``key``.

    With ``index_size`` (from metadata) this is ONE suffix GET; without it, a GET of the footer
    then a GET of the index. ``object_size`` comes from ``head`` when not given.
    """
    if object_size is None:
        object_size = (await store.head(key)).size
    if index_size is not None:
        if index_size < FOOTER_SIZE:
            raise InvalidArgument(f"index_size {index_size} is smaller than a footer")
        if index_size > object_size:
            raise CorruptionError(
                f"object {key!r} is {object_size} bytes, smaller than its index of "
                f"{index_size} bytes (truncated object?)"
            )
        tail = await store.get(key, -index_size)
        return _parse_index_of(key, tail, object_size)
    if object_size < FOOTER_SIZE:
        raise CorruptionError(
            f"object {key!r} is {object_size} bytes, too small for a footer (truncated object?)"
        )
    footer_bytes = await store.get(key, -FOOTER_SIZE)
    try:
        footer = parse_footer(footer_bytes, object_size)
    except CorruptionError as exc:
        raise CorruptionError(f"object {key!r}: {exc}") from None
    index_bytes = await store.get(
        key, footer.index_position, footer.index_position + footer.index_length
    )
    return _parse_index_of(key, index_bytes + footer_bytes, object_size)


def _parse_index_of(key: str, tail: bytes, object_size: int) -> ObjectIndex:
    try:
        return parse_index(tail, object_size)
    except CorruptionError as exc:
        raise CorruptionError(f"object {key!r}: {exc}") from None


def _decode_block(
    block: bytes | memoryview, entry: IndexEntry
) -> list[tuple[BatchHeader, bytes, list[SequencedRecord]]]:
    if len(block) != entry.size:
        raise CorruptionError(
            f"data block of stream {entry.stream_id} at {entry.position} is {len(block)} bytes, "
            f"index says {entry.size} (truncated read?)"
        )
    view = memoryview(block)
    body = view[: len(view) - _BLOCK_CRC_SIZE]
    (stored_crc,) = _U32.unpack_from(view, len(body))
    if _crc(body) != stored_crc:
        raise CorruptionError(
            f"data block checksum mismatch (stream {entry.stream_id}, offsets "
            f"[{entry.start_offset}, {entry.end_offset}), object position {entry.position})"
        )
    batches: list[tuple[BatchHeader, bytes, list[SequencedRecord]]] = []
    next_offset = entry.start_offset
    position = 0
    try:
        while position < len(body):
            header, records = decode_batch(body, position)
            if header.stream_id != entry.stream_id or header.base_offset != next_offset:
                raise CorruptionError(
                    f"data block holds stream {header.stream_id} offset {header.base_offset}, "
                    f"expected stream {entry.stream_id} offset {next_offset}"
                )
            batches.append((header, bytes(body[position : position + header.size]), records))
            position += header.size
            next_offset = header.end_offset
    except (struct.error, ValueError, IndexError) as exc:
        raise CorruptionError(f"malformed batch in data block: {exc}") from None
    if next_offset != entry.end_offset or not batches:
        raise CorruptionError(
            f"data block of stream {entry.stream_id} ends at offset {next_offset}, index says "
            f"{entry.end_offset}"
        )
    return batches


def decode_block(block: bytes, entry: IndexEntry) -> list[tuple[BatchHeader, bytes]]:
    """Check one data block against its index entry and return its batches as
    ``(header, batch bytes)``. Raises :class:`CorruptionError` on any mismatch."""
    return [(header, batch) for header, batch, _ in _decode_block(block, entry)]


def decode_block_records(block: bytes, entry: IndexEntry) -> list[SequencedRecord]:
    """Check one data block and return its records in offset order."""
    return [record for _, _, records in _decode_block(block, entry) for record in records]


def verify_object(data: bytes) -> ObjectIndex:
    """Check a whole object: footer, index and every data block."""
    index = parse_index(data, len(data))
    view = memoryview(data)
    for entry in index.entries:
        _decode_block(view[entry.position : entry.position + entry.size], entry)
    return index


def describe_object(data: bytes) -> list[str]:
    """Human-readable lines for ``walstream inspect object``: the footer, then one line per index
    entry with the result of its block check. Raises :class:`CorruptionError` when the footer or
    index is unreadable (nothing can be located then)."""
    index = parse_index(data, len(data))
    footer = parse_footer(data[-FOOTER_SIZE:], len(data))
    lines = [
        f"object: {len(data)} bytes, format version {footer.version}, flags 0x{footer.flags:04x}",
        f"index: position {footer.index_position}, {footer.index_length} bytes, "
        f"{footer.entry_count} entries, crc ok; streams: "
        + ", ".join(str(stream_id) for stream_id in index.stream_ids()),
    ]
    view = memoryview(data)
    for entry in index.entries:
        try:
            batches = _decode_block(view[entry.position : entry.position + entry.size], entry)
            check = f"crc ok, {len(batches)} batches"
        except CorruptionError as exc:
            check = f"BAD: {exc}"
        lines.append(
            f"block: stream {entry.stream_id} offsets [{entry.start_offset}, "
            f"{entry.end_offset}) records {entry.record_count} position {entry.position} "
            f"size {entry.size} {check}"
        )
    return lines


def object_key(object_id: int, prefix: str = "") -> str:
    """The key of object ``object_id``, spread over hashed prefixes so that keys of consecutive
    ids land in different folders (object stores partition by key prefix)."""
    if not 0 <= object_id < 2**64:
        raise InvalidArgument(f"object ids are in [0, 2**64), got {object_id}")
    digest = hashlib.blake2b(object_id.to_bytes(8, "big"), digest_size=8).hexdigest()
    return f"{prefix}{digest[:2]}/{digest[2:4]}/{object_id:016x}.wso"
