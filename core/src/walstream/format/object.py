"""The format of uploaded objects (docs/architecture/formats.md): layout, parsing and verification (pure, no I/O).

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
- **Index pages and top index** (version 3, the current format). The index entries above are
  cut into *pages* of ``page_entries`` entries (the last page may be shorter), written one after
  the other; after them comes the *top index*, one 24-byte entry per page::

      last_stream_id i64 | last_end_offset i64 | page_crc u32 | entry_count u32

  ``(last_stream_id, last_end_offset)`` is the key of the page's last entry, ``page_crc`` the
  CRC32C of the page's bytes. A reader that loads the footer and the top index (a few KiB even
  for a shared object of many thousand streams) finds the pages that can hold a stream by binary
  search and reads only those: a cold read no longer fetches the whole index.
- **Footer**, version 3 — fixed 72 bytes::

      index_position u64 | index_length u32 | top_crc u32 | entry_count u32
      | format_version u16 | flags u16 | deployment_id 16 bytes | object_id u64
      | page_entries u32 | reserved 8 zero bytes | footer_crc u32 | magic 8 bytes

  ``index_length`` counts the pages; the top index follows them (``ceil(entry_count /
  page_entries)`` entries) and ``top_crc`` is its CRC32C. ``magic`` is ``b"WSOBJ\x00\x00\x03"``.
  Identity and seeded block CRCs as in version 2.
- **Footer**, version 2 (still read; written on request) — fixed 72 bytes::

      index_position u64 | index_length u32 | index_crc u32 | entry_count u32
      | format_version u16 | flags u16 | deployment_id 16 bytes | object_id u64
      | reserved 12 zero bytes | footer_crc u32 | magic 8 bytes

  ``footer_crc`` is the CRC32C of the 60 bytes before it; ``magic`` is ``b"WSOBJ\\x00\\x00\\x02"``.
  The footer names the deployment and the object id the object was written for, and every
  data-block CRC of a version-2 object is seeded with that identity (the CRC32C of
  ``deployment_id || object_id`` is the CRC's initial value): a block read out of another
  deployment's or another object's file fails its check even when its bytes are intact.
- **Footer**, version 1 (still read, written only without an identity) — fixed 48 bytes::

      index_position u64 | index_length u32 | index_crc u32 | entry_count u32
      | format_version u16 | flags u16 | reserved 12 zero bytes | footer_crc u32 | magic 8 bytes

  ``footer_crc`` covers the 36 bytes before it; ``magic`` is ``b"WSOBJ\\x00\\x00\\x01"`` and its
  block CRCs are unseeded. The magic (the last 8 bytes) tells a reader which footer it holds.

A reader that knows the object's ``index_size`` (everything after the data blocks, kept in
metadata) reaches any offset with two ranged reads when the index is small (one suffix read for
the whole index, one for the block), and with three when it is large (the footer and top index,
the stream's pages, the block); docs/architecture/formats-object-index.md has the details. Bad or
truncated bytes raise :class:`CorruptionError`; an object of another deployment or object id
raises :class:`IdentityMismatch`; neither is ever returned as records. The builder is in
:mod:`walstream.format.object_builder`, the keys in :mod:`walstream.format.object_keys`, the
ranged reads in :mod:`walstream.engine.object_reader`.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from walstream.errors import CorruptionError, IdentityMismatch, InvalidArgument
from walstream.format.batch import (
    BATCH_HEADER,
    BatchHeader,
    decode_batch_header,
    decode_records_into,
)
from walstream.records import DEPLOYMENT_ID_BYTES, SequencedRecord

__all__ = [
    "BLOCK_CRC_SIZE",
    "DEFAULT_INDEX_PAGE_ENTRIES",
    "FOOTER_SIZE",
    "FOOTER_SIZE_V1",
    "FORMAT_VERSION",
    "IDENTITY_FORMAT_VERSION",
    "INDEX_ENTRY_SIZE",
    "LEGACY_FORMAT_VERSION",
    "MAX_FOOTER_SIZE",
    "OBJECT_MAGIC",
    "OBJECT_MAGIC_V1",
    "OBJECT_MAGIC_V2",
    "TOP_ENTRY_SIZE",
    "Footer",
    "IndexEntry",
    "IndexPage",
    "ObjectIdentity",
    "ObjectIndex",
    "block_body",
    "check_foreign_footer",
    "check_identity",
    "checksum",
    "cut_block_body",
    "decode_block",
    "decode_block_records",
    "describe_object",
    "encode_footer",
    "encode_index",
    "parse_footer",
    "parse_footer_checked",
    "parse_index",
    "parse_index_pages",
    "parse_index_top",
    "verify_object",
]

OBJECT_MAGIC = b"WSOBJ\x00\x00\x03"
"""Magic of the current format (version 3: a paged index with a top index)."""
OBJECT_MAGIC_V2 = b"WSOBJ\x00\x00\x02"
OBJECT_MAGIC_V1 = b"WSOBJ\x00\x00\x01"
FORMAT_VERSION = 3
IDENTITY_FORMAT_VERSION = 2
"""Version 2: identity in the footer, one flat index block (still read, written on request)."""
LEGACY_FORMAT_VERSION = 1
DEFAULT_INDEX_PAGE_ENTRIES = 128
"""Index entries per page of a version-3 object: 4,608 bytes a page."""
MAX_INDEX_PAGE_ENTRIES = 1 << 16

_INDEX_ENTRY = struct.Struct(">qqiiQI")
_FOOTER_FIELDS_V1 = struct.Struct(">QIIIHH12s")
_FOOTER_V1 = struct.Struct(">QIIIHH12sI8s")
_FOOTER_FIELDS = struct.Struct(f">QIIIHH{DEPLOYMENT_ID_BYTES}sQ12s")
_FOOTER = struct.Struct(f">QIIIHH{DEPLOYMENT_ID_BYTES}sQ12sI8s")
_FOOTER_FIELDS_V3 = struct.Struct(f">QIIIHH{DEPLOYMENT_ID_BYTES}sQI8s")
_FOOTER_V3 = struct.Struct(f">QIIIHH{DEPLOYMENT_ID_BYTES}sQI8sI8s")
_TOP_ENTRY = struct.Struct(">qqII")
_U32 = struct.Struct(">I")

TOP_ENTRY_SIZE = _TOP_ENTRY.size
INDEX_ENTRY_SIZE = _INDEX_ENTRY.size
FOOTER_SIZE = _FOOTER.size
FOOTER_SIZE_V1 = _FOOTER_V1.size
MAX_FOOTER_SIZE = max(FOOTER_SIZE, FOOTER_SIZE_V1)
_MAGIC_SIZE = len(OBJECT_MAGIC)
assert INDEX_ENTRY_SIZE == 36
assert FOOTER_SIZE == 72
assert FOOTER_SIZE_V1 == 48
assert _FOOTER_FIELDS_V1.size == 36
assert _FOOTER_FIELDS.size == 60
assert _FOOTER_V3.size == FOOTER_SIZE
assert _FOOTER_FIELDS_V3.size == 60
assert TOP_ENTRY_SIZE == 24

BLOCK_CRC_SIZE = 4
_MIN_BLOCK_SIZE = BATCH_HEADER.size + BLOCK_CRC_SIZE


@dataclass(frozen=True, slots=True)
class ObjectIdentity:
    """Who an object belongs to: the deployment (16 bytes from the metadata store) and the object
    id metadata prepared for it. Written into every version-2 footer and checked on read."""

    deployment_id: bytes
    object_id: int

    def __post_init__(self) -> None:
        if len(self.deployment_id) != DEPLOYMENT_ID_BYTES:
            raise InvalidArgument(
                f"a deployment id is {DEPLOYMENT_ID_BYTES} bytes, got {len(self.deployment_id)}"
            )
        if not 0 <= self.object_id < 2**64:
            raise InvalidArgument(f"object ids are in [0, 2**64), got {self.object_id}")

    @property
    def block_crc_seed(self) -> int:
        """The initial CRC value of every data block of a version-2 object with this identity."""
        return checksum(self.deployment_id + self.object_id.to_bytes(8, "big"))

    def describe(self) -> str:
        return f"deployment {self.deployment_id.hex()} object {self.object_id}"


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
class Footer:
    index_position: int
    index_length: int
    index_crc: int
    entry_count: int
    version: int
    flags: int
    identity: ObjectIdentity | None = None
    """The deployment and object id (versions 2 and 3); ``None`` for a version-1 footer."""
    page_entries: int = 0
    """Index entries per page (version 3); 0 for the flat index of versions 1 and 2."""

    @property
    def size(self) -> int:
        """Bytes of this footer (its version's fixed size)."""
        return FOOTER_SIZE_V1 if self.version == LEGACY_FORMAT_VERSION else FOOTER_SIZE

    @property
    def page_count(self) -> int:
        """Pages of a version-3 index (0 for versions 1 and 2)."""
        if not self.page_entries:
            return 0
        return -(-self.entry_count // self.page_entries)

    @property
    def top_length(self) -> int:
        """Bytes of the top index (0 before version 3)."""
        return self.page_count * TOP_ENTRY_SIZE

    @property
    def tail_size(self) -> int:
        """Bytes after the data blocks: index (pages), top index and footer."""
        return self.index_length + self.top_length + self.size

    @property
    def block_crc_seed(self) -> int:
        return 0 if self.identity is None else self.identity.block_crc_seed


class ObjectIndex:
    """The parsed index of one object: where each stream's offsets are stored."""

    def __init__(
        self,
        entries: list[IndexEntry],
        object_size: int,
        index_position: int,
        version: int = FORMAT_VERSION,
        identity: ObjectIdentity | None = None,
        top: IndexTop | None = None,
    ) -> None:
        self.entries = entries
        self.object_size = object_size
        self.index_position = index_position
        self.version = version
        self.identity = identity
        """The identity from the footer (``None`` for a version-1 object)."""
        self.top = top
        """A *partial* index of a version-3 object: its top index, with only the pages in
        :attr:`loaded_pages` parsed into :attr:`entries` (``None``: the whole index)."""
        self.loaded_pages: set[int] = set()
        # Blocks of one stream are sorted and contiguous, so their end offsets are sorted too.
        self._end_keys = [(entry.stream_id, entry.end_offset) for entry in entries]

    @property
    def partial(self) -> bool:
        return self.top is not None

    def covers(self, stream_id: int) -> bool:
        """Whether :meth:`blocks_for` answers for ``stream_id`` (always, for a whole index)."""
        if self.top is None:
            return True
        return set(self.top.pages_for(stream_id)) <= self.loaded_pages

    def add_pages(self, pages: dict[int, list[IndexEntry]]) -> None:
        """Merge parsed pages (page number → entries) into a partial index."""
        fresh = {
            number: entries for number, entries in pages.items() if number not in self.loaded_pages
        }
        if not fresh:
            return
        merged = self.entries + [entry for entries in fresh.values() for entry in entries]
        merged.sort(key=lambda entry: (entry.stream_id, entry.start_offset))
        self.entries = merged
        self.loaded_pages.update(fresh)
        self._end_keys = [(entry.stream_id, entry.end_offset) for entry in merged]

    @property
    def index_size(self) -> int:
        """Bytes of the index block and footer."""
        return self.object_size - self.index_position

    @property
    def block_crc_seed(self) -> int:
        """Initial CRC value of this object's data blocks (pass to :func:`decode_block`)."""
        return 0 if self.identity is None else self.identity.block_crc_seed

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
        """The streams this object holds, ascending (of a partial index: of its loaded pages)."""
        return sorted({entry.stream_id for entry in self.entries})

    def __repr__(self) -> str:
        pages = (
            ""
            if self.top is None
            else f"pages={sorted(self.loaded_pages)} of {len(self.top.pages)}, "
        )
        return (
            f"ObjectIndex(entries={len(self.entries)}, object_size={self.object_size}, "
            f"index_position={self.index_position}, version={self.version}, {pages}"
            f"identity={None if self.identity is None else self.identity.describe()})"
        )


@dataclass(frozen=True, slots=True)
class IndexPage:
    """One top-index entry of a version-3 object: page ``number`` holds ``entry_count`` index
    entries, the last one keyed ``(last_stream_id, last_end_offset)``."""

    number: int
    last_stream_id: int
    last_end_offset: int
    crc: int
    entry_count: int


class IndexTop:
    """The footer and top index of a version-3 object: where each index page lies."""

    def __init__(self, footer: Footer, pages: list[IndexPage]) -> None:
        self.footer = footer
        self.pages = pages
        self._keys = [(page.last_stream_id, page.last_end_offset) for page in pages]

    def pages_for(self, stream_id: int) -> range:
        """The pages that can hold entries of ``stream_id`` (possibly none: an empty range):
        from the first whose last key reaches the stream to the first that ends past it."""
        first = bisect.bisect_left(self._keys, (stream_id, -1))
        last = bisect.bisect_left(self._keys, (stream_id + 1, -1))
        return range(first, min(last + 1, len(self.pages)))

    def byte_range(self, pages: range) -> tuple[int, int]:
        """Object bytes ``[start, end)`` of the consecutive ``pages``."""
        page_bytes = self.footer.page_entries * INDEX_ENTRY_SIZE
        start = self.footer.index_position + pages.start * page_bytes
        end = start + sum(self.pages[number].entry_count for number in pages) * INDEX_ENTRY_SIZE
        return start, end


def checksum(data: bytes | memoryview, value: int = 0) -> int:
    """CRC32C of ``data`` continued from ``value``: every checksum of the format (a data block's
    starts from its object's :attr:`ObjectIdentity.block_crc_seed`)."""
    return int(crc32c.crc32c(data, value))


def encode_index(entries: Sequence[IndexEntry]) -> bytes:
    """The index block: one entry per data block, in the order given (by stream, then offset)."""
    return b"".join(
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


def encode_top_index(entries: Sequence[IndexEntry], index: bytes, page_entries: int) -> bytes:
    """The top index of a version-3 object whose index pages are ``index`` (the encoded
    ``entries``, ``page_entries`` a page)."""
    page_bytes = page_entries * INDEX_ENTRY_SIZE
    parts = []
    for first in range(0, len(entries), page_entries):
        page = entries[first : first + page_entries]
        start = first * INDEX_ENTRY_SIZE
        last = page[-1]
        parts.append(
            _TOP_ENTRY.pack(
                last.stream_id,
                last.end_offset,
                checksum(index[start : start + page_bytes]),
                len(page),
            )
        )
    return b"".join(parts)


def encode_footer(
    index_position: int,
    index: bytes,
    entry_count: int,
    identity: ObjectIdentity | None,
    *,
    top: bytes | None = None,
    page_entries: int = 0,
) -> bytes:
    """The footer after ``index``: version 3 when ``top`` (the top index, written between the
    pages and the footer) is given, else version 2 naming ``identity``, or version 1 without
    one."""
    if top is not None:
        if identity is None:
            raise InvalidArgument("a version-3 object needs an identity")
        fields = _FOOTER_FIELDS_V3.pack(
            index_position, len(index), checksum(top), entry_count, FORMAT_VERSION, 0,
            identity.deployment_id, identity.object_id, page_entries, bytes(8),
        )  # fmt: skip
        return fields + _U32.pack(checksum(fields)) + OBJECT_MAGIC
    if identity is None:
        fields = _FOOTER_FIELDS_V1.pack(
            index_position, len(index), checksum(index), entry_count, LEGACY_FORMAT_VERSION, 0,
            bytes(12),
        )  # fmt: skip
        return fields + _U32.pack(checksum(fields)) + OBJECT_MAGIC_V1
    fields = _FOOTER_FIELDS.pack(
        index_position, len(index), checksum(index), entry_count, IDENTITY_FORMAT_VERSION, 0,
        identity.deployment_id, identity.object_id, bytes(12),
    )  # fmt: skip
    return fields + _U32.pack(checksum(fields)) + OBJECT_MAGIC_V2


def footer_size_of(tail: bytes | memoryview) -> int:
    """The size of the footer that ends ``tail`` (the last bytes of an object), told by its magic.
    Raises :class:`CorruptionError` when the last 8 bytes are no known magic."""
    magic = bytes(tail[-_MAGIC_SIZE:]) if len(tail) >= _MAGIC_SIZE else bytes(tail)
    if magic in (OBJECT_MAGIC, OBJECT_MAGIC_V2):
        return FOOTER_SIZE
    if magic == OBJECT_MAGIC_V1:
        return FOOTER_SIZE_V1
    raise CorruptionError(f"bad object magic {magic!r}: not a walstream object, or truncated")


def parse_footer(footer: bytes | memoryview, object_size: int) -> Footer:
    """Decode and check the footer at the end of ``footer`` (the footer itself or any longer
    tail of the object) of an object of ``object_size`` bytes. Accepts versions 1, 2 and 3."""
    size = footer_size_of(footer)
    if len(footer) < size:
        raise CorruptionError(
            f"object footer is {len(footer)} bytes, expected {size} (truncated object?)"
        )
    raw = bytes(footer[len(footer) - size :])
    identity: ObjectIdentity | None = None
    page_entries = 0
    reserved_ok = True
    if size == FOOTER_SIZE_V1:
        (
            index_position, index_length, index_crc, entry_count, version, flags, reserved,
            footer_crc, _magic,
        ) = _FOOTER_V1.unpack(raw)  # fmt: skip
        fields_size = _FOOTER_FIELDS_V1.size
        expected_version = LEGACY_FORMAT_VERSION
        reserved_ok = reserved == bytes(12)
    elif raw[-_MAGIC_SIZE:] == OBJECT_MAGIC_V2:
        (
            index_position, index_length, index_crc, entry_count, version, flags, deployment_id,
            object_id, reserved, footer_crc, _magic,
        ) = _FOOTER.unpack(raw)  # fmt: skip
        fields_size = _FOOTER_FIELDS.size
        expected_version = IDENTITY_FORMAT_VERSION
        reserved_ok = reserved == bytes(12)
    else:
        (
            index_position, index_length, index_crc, entry_count, version, flags, deployment_id,
            object_id, page_entries, reserved, footer_crc, _magic,
        ) = _FOOTER_V3.unpack(raw)  # fmt: skip
        fields_size = _FOOTER_FIELDS_V3.size
        expected_version = FORMAT_VERSION
        reserved_ok = reserved == bytes(8)
    if checksum(raw[:fields_size]) != footer_crc:
        raise CorruptionError("object footer checksum mismatch")
    if version != expected_version:
        raise CorruptionError(
            f"object format version {version} is not supported (this walstream reads versions "
            f"{LEGACY_FORMAT_VERSION} to {FORMAT_VERSION}); upgrade walstream"
        )
    if flags != 0 or not reserved_ok:
        raise CorruptionError(f"object footer has unknown flags 0x{flags:04x} or reserved bytes")
    if size == FOOTER_SIZE:
        identity = ObjectIdentity(deployment_id, object_id)
    if version == FORMAT_VERSION and not 1 <= page_entries <= MAX_INDEX_PAGE_ENTRIES:
        raise CorruptionError(
            f"object footer: {page_entries} index entries a page is outside [1, "
            f"{MAX_INDEX_PAGE_ENTRIES}]"
        )
    if entry_count == 0 or index_length != entry_count * INDEX_ENTRY_SIZE:
        raise CorruptionError(
            f"object footer: index of {index_length} bytes cannot hold {entry_count} entries"
        )
    parsed = Footer(
        index_position, index_length, index_crc, entry_count, version, flags, identity,
        page_entries,
    )  # fmt: skip
    if index_position + parsed.tail_size != object_size:
        raise CorruptionError(
            f"object footer places the index at [{index_position}, "
            f"{index_position + index_length}) but the object is {object_size} bytes "
            "(truncated, or the wrong size was recorded)"
        )
    return parsed


def check_identity(
    footer: Footer, key: str, expected: ObjectIdentity | None, *, require: bool = False
) -> None:
    """Raise :class:`IdentityMismatch` unless ``footer`` names ``expected``.

    A version-1 footer carries no identity: it passes unless ``require`` (the key is of the
    identity-carrying scheme, so the file under it must be version 2). ``expected=None`` checks
    nothing (tools reading a file on its own).
    """
    if expected is None:
        return
    if footer.identity is None:
        if require:
            raise IdentityMismatch(
                f"object {key!r}: expected {expected.describe()}, found a version-1 object "
                "without an identity under a key of the identity format; the file was replaced. "
                "Check that the object store holds this deployment's objects"
            )
        return
    if footer.identity != expected:
        raise IdentityMismatch(
            f"object {key!r}: expected {expected.describe()}, found "
            f"{footer.identity.describe()}; the object store holds another deployment's or "
            "another object's file under this key. Check that object_store points at this "
            "deployment's objects"
        )


def parse_index(
    tail: bytes | memoryview,
    object_size: int,
    *,
    key: str = "",
    expected: ObjectIdentity | None = None,
    require_identity: bool = False,
) -> ObjectIndex:
    """Parse the whole index from ``tail``, the LAST bytes of an object of ``object_size``
    bytes (at least ``index_size`` of them). Checks the footer, the identity (when ``expected``
    is given, right after the footer checksum so a foreign object is reported as
    :class:`IdentityMismatch` whatever its size), the index CRC (of version 3: the top index's
    and every page's), the order of entries and that the blocks exactly tile the data area."""
    if len(tail) > object_size:
        raise CorruptionError(
            f"object tail of {len(tail)} bytes is longer than the object of {object_size} bytes"
        )
    footer = parse_footer_checked(tail, object_size, key, expected, require_identity)
    needed = footer.tail_size
    if len(tail) < needed:
        raise CorruptionError(
            f"object index needs the last {needed} bytes, got {len(tail)} "
            "(the recorded index_size does not match the object)"
        )
    view = memoryview(tail)
    index = view[len(tail) - needed : len(tail) - needed + footer.index_length]
    if footer.version == FORMAT_VERSION:
        top = _parse_top(view, footer)
        pages = parse_index_pages(top, range(len(top.pages)), index, footer.index_position)
        entries = [entry for number in range(len(top.pages)) for entry in pages[number]]
    else:
        if checksum(index) != footer.index_crc:
            raise CorruptionError("object index checksum mismatch")
        entries = _unpack_entries(index)
    _check_entries(entries, footer.index_position)
    return ObjectIndex(entries, object_size, footer.index_position, footer.version, footer.identity)


def _unpack_entries(index: bytes | memoryview) -> list[IndexEntry]:
    return [
        IndexEntry(stream_id, start_offset, start_offset + end_delta, record_count, position, size)
        for stream_id, start_offset, end_delta, record_count, position, size in (
            _INDEX_ENTRY.iter_unpack(index)
        )
    ]


def _parse_top(tail: memoryview, footer: Footer) -> IndexTop:
    """The top index that ends ``tail`` just before ``footer``, checked against its CRC."""
    end = len(tail) - footer.size
    raw = tail[end - footer.top_length : end]
    if len(raw) != footer.top_length or checksum(raw) != footer.index_crc:
        raise CorruptionError("object top index checksum mismatch")
    pages: list[IndexPage] = []
    total = 0
    previous: tuple[int, int] | None = None
    for number, (stream_id, end_offset, crc, count) in enumerate(_TOP_ENTRY.iter_unpack(raw)):
        last_page = number == footer.page_count - 1
        if not 1 <= count <= footer.page_entries or (
            count != footer.page_entries and not last_page
        ):
            raise CorruptionError(
                f"object top index: page {number} claims {count} entries ({footer.page_entries} "
                "a page)"
            )
        if previous is not None and (stream_id, end_offset) <= previous:
            raise CorruptionError(f"object top index: page {number} is out of order")
        previous = (stream_id, end_offset)
        pages.append(IndexPage(number, stream_id, end_offset, crc, count))
        total += count
    if total != footer.entry_count:
        raise CorruptionError(
            f"object top index counts {total} entries, the footer {footer.entry_count}"
        )
    return IndexTop(footer, pages)


def parse_index_top(
    tail: bytes | memoryview,
    object_size: int,
    *,
    key: str = "",
    expected: ObjectIdentity | None = None,
    require_identity: bool = False,
) -> IndexTop:
    """The footer and top index of a version-3 object from ``tail``, its last bytes (at least
    ``top_length`` + footer of them), checked like :func:`parse_index` checks them. Raises
    :class:`InvalidArgument` for an object of an earlier version (it has no top index)."""
    footer = parse_footer_checked(tail, object_size, key, expected, require_identity)
    if footer.version != FORMAT_VERSION:
        raise InvalidArgument(f"a version-{footer.version} object has no top index")
    if len(tail) < footer.top_length + footer.size:
        raise CorruptionError(
            f"object top index needs the last {footer.top_length + footer.size} bytes, got "
            f"{len(tail)}"
        )
    return _parse_top(memoryview(tail), footer)


def parse_index_pages(
    top: IndexTop, pages: range, data: bytes | memoryview, at: int
) -> dict[int, list[IndexEntry]]:
    """Parse the consecutive index ``pages`` from ``data``, bytes of the object from position
    ``at`` on (as :meth:`IndexTop.byte_range` names them). Each page is checked against its CRC
    in the top index, its entries must be in order and its last entry must carry the key the top
    index has for it (:class:`CorruptionError` otherwise)."""
    start, end = top.byte_range(pages)
    if at > start or len(data) < end - at:
        raise CorruptionError(
            f"index pages {pages.start}..{pages.stop - 1} need object bytes [{start}, {end}), "
            f"got [{at}, {at + len(data)})"
        )
    view = memoryview(data)
    result: dict[int, list[IndexEntry]] = {}
    position = start - at
    for number in pages:
        page = top.pages[number]
        raw = view[position : position + page.entry_count * INDEX_ENTRY_SIZE]
        position += len(raw)
        if checksum(raw) != page.crc:
            raise CorruptionError(f"object index page {number} checksum mismatch")
        entries = _unpack_entries(raw)
        last = entries[-1]
        if (last.stream_id, last.end_offset) != (page.last_stream_id, page.last_end_offset):
            raise CorruptionError(
                f"object index page {number} ends at stream {last.stream_id} offset "
                f"{last.end_offset}, its top-index entry says stream {page.last_stream_id} "
                f"offset {page.last_end_offset}"
            )
        for before, after in itertools.pairwise(entries):
            if (after.stream_id, after.start_offset) <= (before.stream_id, before.start_offset):
                raise CorruptionError(f"object index page {number} is out of order")
        result[number] = entries
    return result


def parse_footer_checked(
    tail: bytes | memoryview,
    object_size: int,
    key: str,
    expected: ObjectIdentity | None,
    require_identity: bool,
) -> Footer:
    """The footer at the end of ``tail``, identity checked before the size checks (a foreign
    object of another size is an identity mismatch, not a truncation)."""
    try:
        footer = parse_footer(tail, object_size)
    except CorruptionError:
        # The size check may be what failed: a foreign object of another size is named as such.
        check_foreign_footer(tail, key, expected, require_identity)
        raise
    check_identity(footer, key, expected, require=require_identity)
    return footer


def check_foreign_footer(
    tail: bytes | memoryview, key: str, expected: ObjectIdentity | None, require_identity: bool
) -> None:
    """Raise :class:`IdentityMismatch` when ``tail`` ends in a footer whose checksum and version
    are right (whatever object size it implies) and that does not name ``expected``."""
    if expected is None:
        return
    footer = _footer_ignoring_size(tail)
    if footer is not None:
        check_identity(footer, key, expected, require=require_identity)


def _footer_ignoring_size(tail: bytes | memoryview) -> Footer | None:
    """The footer at the end of ``tail`` when its magic, checksum and version are right, without
    checking it against any object size; ``None`` otherwise."""
    try:
        size = footer_size_of(tail)
    except CorruptionError:
        return None
    if len(tail) < size:
        return None
    raw = bytes(tail[len(tail) - size :])
    try:
        # Parse it as if the object were exactly what the footer says it is.
        index_position, index_length = struct.unpack_from(">QI", raw)
        object_size = index_position + index_length + size
        if raw[-_MAGIC_SIZE:] == OBJECT_MAGIC:
            fields = _FOOTER_V3.unpack(raw)
            entry_count, page_entries = fields[3], fields[8]
            if page_entries:
                object_size += -(-entry_count // page_entries) * TOP_ENTRY_SIZE
        return parse_footer(raw, object_size)
    except CorruptionError:
        return None


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


def _decode_block(
    block: bytes | memoryview,
    entry: IndexEntry,
    crc_seed: int = 0,
    *,
    records: list[SequencedRecord] | None = None,
    at: int | None = None,
) -> list[tuple[BatchHeader, bytes]]:
    """Check a data block against its index entry; its batches as ``(header, batch bytes)``,
    or, when ``records`` is given, nothing, the block's records appended to ``records``.

    ``at``: ``block`` is a larger range of the object holding the block from byte ``at`` on
    (checked in place, without a copy of its bytes); batch positions in errors count from the
    start of ``block`` then."""
    start = 0 if at is None else at
    if (len(block) != entry.size) if at is None else (at < 0 or len(block) - at < entry.size):
        raise CorruptionError(
            f"data block of stream {entry.stream_id} at {entry.position} is "
            f"{max(0, len(block) - start)} bytes, index says {entry.size} (truncated read?)"
        )
    body_end = start + entry.size - BLOCK_CRC_SIZE
    (stored_crc,) = _U32.unpack_from(block, body_end)
    if type(block) is not bytes:
        # Batches decode from bytes: copy the block's body (counted from 0 again).
        block, body_end, start = bytes(block[start:body_end]), body_end - start, 0
    body = block
    if checksum(memoryview(body)[start:body_end], crc_seed) != stored_crc:
        raise CorruptionError(
            f"data block checksum mismatch (stream {entry.stream_id}, offsets "
            f"[{entry.start_offset}, {entry.end_offset}), object position {entry.position})"
            + ("; the bytes are damaged or belong to another object" if crc_seed else "")
        )
    batches: list[tuple[BatchHeader, bytes]] = []
    next_offset = entry.start_offset
    position = start
    count = 0
    try:
        while position < body_end:
            header = decode_batch_header(body, position)
            if position + header.size > body_end:
                raise CorruptionError(f"batch at byte {position} overruns its data block")
            if header.stream_id != entry.stream_id or header.base_offset != next_offset:
                raise CorruptionError(
                    f"data block holds stream {header.stream_id} offset {header.base_offset}, "
                    f"expected stream {entry.stream_id} offset {next_offset}"
                )
            if records is None:
                batches.append((header, body[position : position + header.size]))
                decode_records_into(body, position, header, [])
            else:
                decode_records_into(body, position, header, records)
            count += 1
            position += header.size
            next_offset = header.end_offset
    except (struct.error, ValueError, IndexError) as exc:
        raise CorruptionError(f"malformed batch in data block: {exc}") from None
    if next_offset != entry.end_offset or not count:
        raise CorruptionError(
            f"data block of stream {entry.stream_id} ends at offset {next_offset}, index says "
            f"{entry.end_offset}"
        )
    return batches


def block_body(
    data: bytes | memoryview, entry: IndexEntry, crc_seed: int = 0, *, at: int = 0
) -> memoryview:
    """The batch bytes of the data block ``entry`` of an object, checked against the block's CRC
    and its index entry's size but not decoded: what a rewrite copies into a new object (the
    copy gets a fresh CRC of its own). ``data`` holds the block from byte ``at`` on. Raises
    :class:`CorruptionError` on a truncated block or a checksum mismatch."""
    if at < 0 or len(data) - at < entry.size or entry.size < _MIN_BLOCK_SIZE:
        raise CorruptionError(
            f"data block of stream {entry.stream_id} at {entry.position} is "
            f"{max(0, len(data) - at)} bytes, index says {entry.size} (truncated read?)"
        )
    view = memoryview(data)
    body_end = at + entry.size - BLOCK_CRC_SIZE
    (stored_crc,) = _U32.unpack_from(view, body_end)
    body = view[at:body_end]
    if checksum(body, crc_seed) != stored_crc:
        raise CorruptionError(
            f"data block checksum mismatch (stream {entry.stream_id}, offsets "
            f"[{entry.start_offset}, {entry.end_offset}), object position {entry.position})"
            + ("; the bytes are damaged or belong to another object" if crc_seed else "")
        )
    return body


def cut_block_body(
    body: memoryview, entry: IndexEntry, start_offset: int, end_offset: int
) -> tuple[memoryview, int, int]:
    """The whole batches of a checked block body (:func:`block_body`) that hold offsets in
    ``[start_offset, end_offset)``, as ``(bytes, first offset, end offset)``; the first batch may
    begin before ``start_offset`` (batches are never split). Walks the batch headers and checks
    that they continue the index entry's stream and offsets (:class:`CorruptionError`
    otherwise); an empty result has equal offsets."""
    position = 0
    next_offset = entry.start_offset
    first = last = -1
    first_offset = end = entry.start_offset
    try:
        while position < len(body):
            header = decode_batch_header(body, position)
            if header.stream_id != entry.stream_id or header.base_offset != next_offset:
                raise CorruptionError(
                    f"data block holds stream {header.stream_id} offset {header.base_offset}, "
                    f"expected stream {entry.stream_id} offset {next_offset}"
                )
            if header.end_offset > start_offset and header.base_offset < end_offset:
                if first < 0:
                    first, first_offset = position, header.base_offset
                last, end = position + header.size, header.end_offset
            position += header.size
            next_offset = header.end_offset
    except (struct.error, ValueError, IndexError) as exc:
        raise CorruptionError(f"malformed batch in data block: {exc}") from None
    if position != len(body) or next_offset != entry.end_offset:
        raise CorruptionError(
            f"data block of stream {entry.stream_id} ends at offset {next_offset}, index says "
            f"{entry.end_offset}"
        )
    if first < 0:
        return body[0:0], start_offset, start_offset
    return body[first:last], first_offset, end


def decode_block(
    block: bytes, entry: IndexEntry, crc_seed: int = 0
) -> list[tuple[BatchHeader, bytes]]:
    """Check one data block against its index entry and return its batches as
    ``(header, batch bytes)``. ``crc_seed`` is the object's :attr:`ObjectIndex.block_crc_seed`.
    Raises :class:`CorruptionError` on any mismatch."""
    return _decode_block(block, entry, crc_seed)


def decode_block_records(
    block: bytes, entry: IndexEntry, crc_seed: int = 0, *, at: int | None = None
) -> list[SequencedRecord]:
    """Check one data block and return its records in offset order. With ``at``, ``block``
    is a larger range of the object that holds the block from byte ``at`` on (no copy)."""
    records: list[SequencedRecord] = []
    _decode_block(block, entry, crc_seed, records=records, at=at)
    return records


def verify_object(data: bytes, expected: ObjectIdentity | None = None) -> ObjectIndex:
    """Check a whole object: footer (and identity, when ``expected`` is given), index and every
    data block."""
    index = parse_index(data, len(data), expected=expected)
    view = memoryview(data)
    for entry in index.entries:
        _decode_block(
            view[entry.position : entry.position + entry.size], entry, index.block_crc_seed
        )
    return index


def describe_object(data: bytes) -> list[str]:
    """Human-readable lines for ``walstream inspect object``: the footer with the identity it
    names, then one line per index entry with the result of its block check. Raises
    :class:`CorruptionError` when the footer or index is unreadable (nothing can be located
    then)."""
    index = parse_index(data, len(data))
    footer = parse_footer(data, len(data))
    identity = (
        "none (format version 1 carries no identity)"
        if footer.identity is None
        else f"deployment {footer.identity.deployment_id.hex()}, object id "
        f"{footer.identity.object_id}"
    )
    pages = (
        f", {footer.page_count} pages of {footer.page_entries} entries"
        if footer.page_entries
        else ""
    )
    lines = [
        f"object: {len(data)} bytes, format version {footer.version}, flags 0x{footer.flags:04x}",
        f"identity: {identity}",
        f"index: position {footer.index_position}, {footer.index_length} bytes, "
        f"{footer.entry_count} entries{pages}, crc ok; streams: "
        + ", ".join(str(stream_id) for stream_id in index.stream_ids()),
    ]
    view = memoryview(data)
    for entry in index.entries:
        try:
            batches = _decode_block(
                view[entry.position : entry.position + entry.size], entry, index.block_crc_seed
            )
            check = f"crc ok, {len(batches)} batches"
        except CorruptionError as exc:
            check = f"BAD: {exc}"
        lines.append(
            f"block: stream {entry.stream_id} offsets [{entry.start_offset}, "
            f"{entry.end_offset}) records {entry.record_count} position {entry.position} "
            f"size {entry.size} {check}"
        )
    return lines
