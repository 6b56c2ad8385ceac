"""Writing uploaded objects: :class:`ObjectBuilder` lays batches out in the format of
:mod:`walstream.format.object` (data blocks of one stream each, then the index and the footer).

Pure: bytes in, bytes out; the engine's uploader and compactor write the result to the object
store.
"""

from __future__ import annotations

import bisect
import operator
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from crc32c import crc32c

from walstream.errors import CorruptionError, InvalidArgument
from walstream.format.batch import decode_batch_header
from walstream.format.object import (
    BLOCK_CRC_SIZE,
    DEFAULT_INDEX_PAGE_ENTRIES,
    FORMAT_VERSION,
    IDENTITY_FORMAT_VERSION,
    LEGACY_FORMAT_VERSION,
    MAX_INDEX_PAGE_ENTRIES,
    IndexEntry,
    ObjectIdentity,
    checksum,
    encode_footer,
    encode_index,
    encode_top_index,
)

__all__ = ["DEFAULT_BLOCK_TARGET_BYTES", "BuiltObject", "ObjectBuilder", "StreamSlice"]

DEFAULT_BLOCK_TARGET_BYTES = 1 << 20
_MAX_I32 = 2**31 - 1
_MAX_BLOCK_TARGET_BYTES = 1 << 31
_U32 = struct.Struct(">I")


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
    """A finished object: its bytes, the size of its index suffix and what it holds per stream."""

    data: bytes
    index_size: int
    """Bytes of the index block and footer: the length of the suffix read that loads the index."""
    slices: list[StreamSlice]
    """One per stream, in the order the streams were added."""


class ObjectBuilder:
    """Builds one object from batches, stream after stream.

    A stream's batches must be added together and with contiguous offsets (all of stream A, then
    all of stream B, ...); streams may come in any order. Only batch headers are checked here:
    the batches are expected to come from :func:`walstream.records.encode_batch`.

    With ``identity`` the object is written in the current format (version 3: the footer names
    the deployment and object id, block CRCs are seeded with them, the index is cut into pages
    of ``index_page_entries`` entries found through a top index); every object walstream
    uploads has one. ``format_version=2`` writes the flat index of version 2 instead, and
    without an identity the builder writes version 1, which carries none (both kept for tools
    and tests that need old-format files).
    """

    def __init__(
        self,
        block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES,
        *,
        identity: ObjectIdentity | None = None,
        format_version: int | None = None,
        index_page_entries: int = DEFAULT_INDEX_PAGE_ENTRIES,
    ) -> None:
        if not 1 <= block_target_bytes <= _MAX_BLOCK_TARGET_BYTES:
            raise InvalidArgument(
                f"block_target_bytes must be between 1 and {_MAX_BLOCK_TARGET_BYTES}, "
                f"got {block_target_bytes}"
            )
        if format_version is None:
            format_version = LEGACY_FORMAT_VERSION if identity is None else FORMAT_VERSION
        if (format_version == LEGACY_FORMAT_VERSION) != (identity is None) or format_version not in (
            LEGACY_FORMAT_VERSION, IDENTITY_FORMAT_VERSION, FORMAT_VERSION,
        ):  # fmt: skip
            raise InvalidArgument(
                f"format_version {format_version} with{'out' if identity is None else ''} an "
                "identity: version 1 has none, versions 2 and 3 need one"
            )
        if not 1 <= index_page_entries <= MAX_INDEX_PAGE_ENTRIES:
            raise InvalidArgument(
                f"index_page_entries must be between 1 and {MAX_INDEX_PAGE_ENTRIES}, "
                f"got {index_page_entries}"
            )
        self._block_target_bytes = block_target_bytes
        self.format_version = format_version
        self._page_entries = index_page_entries
        self.identity = identity
        self._crc_seed = 0 if identity is None else identity.block_crc_seed
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
        open_block = self._block_bytes + BLOCK_CRC_SIZE if self._block_bytes else 0
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
        self.add_stream_batches(
            header.stream_id, [(bytes(batch), header.base_offset, header.end_offset)]
        )

    def add_stream_batches(
        self, stream_id: int, batches: Iterable[tuple[bytes, int, int]]
    ) -> None:
        """Append batches of ``stream_id`` given as ``(encoded batch, base_offset,
        end_offset)``, for callers that know each batch's header because they encoded it (the
        uploader's cached batches): the headers are not decoded again, only the grouping and
        the contiguity of the offsets are checked. One pass with the block state in locals: an
        uploaded object of small batches holds thousands of them."""
        if self._finished:
            raise InvalidArgument("add_batch() after finish(): start a new ObjectBuilder")
        if stream_id != self._stream_id:
            if stream_id in self._seen_streams:
                raise InvalidArgument(
                    f"stream {stream_id} was already added to this object: add all "
                    "batches of a stream together"
                )
            self._close_stream()
            self._seen_streams.add(stream_id)
            self._stream_id = stream_id
            self._stream_start = -1
            self._stream_bytes = 0
        target = self._block_target_bytes
        parts = self._parts
        block_bytes = self._block_bytes
        block_crc = self._block_crc
        block_records = self._block_records
        block_end = self._block_end
        try:
            for data, base_offset, end_offset in batches:
                if self._stream_start < 0:
                    self._stream_start = block_end = base_offset
                elif base_offset != block_end:
                    raise InvalidArgument(
                        f"stream {stream_id}: batch starts at offset {base_offset}, "
                        f"expected {block_end} (batches of a stream must be contiguous)"
                    )
                count = end_offset - base_offset
                if count <= 0:
                    raise InvalidArgument(
                        f"stream {stream_id}: batch [{base_offset}, {end_offset}) holds no records"
                    )
                size = len(data)
                if block_bytes and (
                    block_bytes + size > target or block_records + count > _MAX_I32
                ):
                    self._block_bytes, self._block_crc = block_bytes, block_crc
                    self._block_records, self._block_end = block_records, block_end
                    self._cut_block()
                    block_bytes = block_crc = block_records = 0
                if not block_bytes:
                    self._block_start = base_offset
                    block_crc = self._crc_seed
                parts.append(data)
                block_bytes += size
                block_crc = checksum(data, block_crc)
                block_records += count
                block_end = end_offset
                if block_bytes >= target:
                    self._block_bytes, self._block_crc = block_bytes, block_crc
                    self._block_records, self._block_end = block_records, block_end
                    self._cut_block()
                    block_bytes = block_crc = block_records = 0
        finally:
            self._block_bytes, self._block_crc = block_bytes, block_crc
            self._block_records, self._block_end = block_records, block_end

    def add_block_body(
        self, stream_id: int, start_offset: int, end_offset: int, body: bytes | memoryview
    ) -> None:
        """Append ``body``, whole encoded batches of ``stream_id`` holding offsets
        ``[start_offset, end_offset)`` (the checked body of another object's data block,
        :func:`walstream.format.object.block_body`), without decoding its batches: a rewrite
        copies blocks at the speed of the CRC. Bodies of one stream join one block while it
        stays within the block target (small blocks merge); a body larger than the target gets
        a block of its own. The grouping and contiguity rules of :meth:`add_stream_batches`
        apply."""
        if self._finished:
            raise InvalidArgument("add_block_body() after finish(): start a new ObjectBuilder")
        count = end_offset - start_offset
        if count <= 0 or count > _MAX_I32 or not body:
            raise InvalidArgument(
                f"stream {stream_id}: block body [{start_offset}, {end_offset}) of {len(body)} "
                "bytes holds no records or too many"
            )
        if stream_id != self._stream_id:
            if stream_id in self._seen_streams:
                raise InvalidArgument(
                    f"stream {stream_id} was already added to this object: add all "
                    "batches of a stream together"
                )
            self._close_stream()
            self._seen_streams.add(stream_id)
            self._stream_id = stream_id
            self._stream_start = start_offset
            self._stream_bytes = 0
            self._block_end = start_offset
        elif self._stream_start < 0:
            self._stream_start = self._block_end = start_offset
        elif start_offset != self._block_end:
            raise InvalidArgument(
                f"stream {stream_id}: block starts at offset {start_offset}, expected "
                f"{self._block_end} (batches of a stream must be contiguous)"
            )
        size = len(body)
        if self._block_bytes and (
            self._block_bytes + size > self._block_target_bytes
            or self._block_records + count > _MAX_I32
        ):
            self._cut_block()
        if not self._block_bytes:
            self._block_start = start_offset
            self._block_crc = self._crc_seed
        self._parts.append(bytes(body))
        self._block_bytes += size
        self._block_crc = checksum(body, self._block_crc)
        self._block_records += count
        self._block_end = end_offset
        if self._block_bytes >= self._block_target_bytes:
            self._cut_block()

    def add_stream_batch(
        self, stream_id: int, data: bytes, base_offset: int, end_offset: int
    ) -> None:
        """:meth:`add_stream_run` for a stream of ONE batch (the common case in a block of
        appends to many streams), with the same bytes and the same checks, at a fraction of the
        Python work."""
        count = end_offset - base_offset
        if (
            stream_id == self._stream_id
            or stream_id in self._seen_streams
            or self._finished
            or not 0 < count <= _MAX_I32
        ):
            self.add_stream_batches(stream_id, [(data, base_offset, end_offset)])
            return
        self._close_stream()
        self._seen_streams.add(stream_id)
        self._stream_id = stream_id
        self._stream_start = base_offset
        self._stream_bytes = 0
        self._parts.append(data)
        self._block_start = base_offset
        self._block_end = end_offset
        self._block_bytes = len(data)
        self._block_crc = crc32c(data, self._crc_seed)
        self._block_records = count
        if self._block_bytes >= self._block_target_bytes:
            self._cut_block()

    def add_stream_run(
        self,
        stream_id: int,
        data: Sequence[bytes],
        base_offsets: Sequence[int],
        end_offsets: Sequence[int],
    ) -> None:
        """:meth:`add_stream_batches` for a whole stream at once — batch ``i`` is ``data[i]``
        with offsets ``[base_offsets[i], end_offsets[i])`` — with the object the same to the
        byte: each data block is found by a search over the running sizes and joined and
        checksummed in one piece, so the work per batch is done in C (an uploaded block of
        small batches holds thousands of them)."""
        count = len(data)
        if not count:
            return
        if (
            stream_id == self._stream_id
            or self._finished
            or len(base_offsets) != count
            or len(end_offsets) != count
            or end_offsets[-1] - base_offsets[0] > _MAX_I32
        ):
            self.add_stream_batches(stream_id, zip(data, base_offsets, end_offsets, strict=True))
            return
        if stream_id in self._seen_streams:
            raise InvalidArgument(
                f"stream {stream_id} was already added to this object: add all "
                "batches of a stream together"
            )
        if list(base_offsets[1:]) != list(end_offsets[:-1]) or not all(
            map(operator.lt, base_offsets, end_offsets)
        ):
            # Name the first batch that breaks the rule, as the batch-by-batch path does.
            self.add_stream_batches(stream_id, zip(data, base_offsets, end_offsets, strict=True))
            raise AssertionError("unreachable: add_stream_batches refuses these batches")
        self._close_stream()
        self._seen_streams.add(stream_id)
        self._stream_id = stream_id
        self._stream_start = base_offsets[0]
        self._stream_bytes = 0
        ends = list(accumulate(map(len, data)))
        target = self._block_target_bytes
        first = 0
        consumed = 0
        while first < count:
            # The block takes batches while it stays within the target (at least one).
            last = max(first, bisect.bisect_right(ends, consumed + target, lo=first) - 1)
            pieces = data[first : last + 1]
            self._parts.extend(pieces)  # joined once, with the whole object, in finish()
            crc = self._crc_seed
            for piece in pieces:
                crc = crc32c(piece, crc)
            self._block_start = base_offsets[first]
            self._block_end = end_offsets[last]
            self._block_bytes = ends[last] - consumed
            self._block_crc = crc
            self._block_records = end_offsets[last] - base_offsets[first]
            consumed = ends[last]
            first = last + 1
            if first < count or self._block_bytes >= target:
                self._cut_block()
            # else: the stream's last block stays open, as after add_stream_batches

    def finish(self) -> BuiltObject:
        """Close the last block and append the index and footer."""
        if self._finished:
            raise InvalidArgument("finish() called twice")
        if self._stream_id is None or (not self._slices and self._stream_start < 0):
            raise InvalidArgument("an object needs at least one batch")
        self._close_stream()
        self._finished = True
        entries = sorted(self._entries, key=lambda entry: (entry.stream_id, entry.start_offset))
        index = encode_index(entries)
        top: bytes | None = None
        if self.format_version == FORMAT_VERSION:
            top = encode_top_index(entries, index, self._page_entries)
        footer = encode_footer(
            self._data_bytes, index, len(entries), self.identity, top=top,
            page_entries=self._page_entries if top is not None else 0,
        )  # fmt: skip
        self._parts.append(index)
        if top is not None:
            self._parts.append(top)
        self._parts.append(footer)
        data = b"".join(self._parts)
        self._parts = []
        tail = len(index) + len(footer) + (len(top) if top is not None else 0)
        return BuiltObject(data, tail, list(self._slices))

    def _cut_block(self) -> None:
        assert self._stream_id is not None
        self._parts.append(_U32.pack(self._block_crc))
        size = self._block_bytes + BLOCK_CRC_SIZE
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
        if self._stream_id is None or self._stream_start < 0:
            return  # no stream yet, or one given no batches
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
