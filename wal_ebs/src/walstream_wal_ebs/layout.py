"""The on-device layout of the ebs WAL: two header slots, then a circular record area.

::

    [slot 0: 4 KiB][slot 1: 4 KiB][record area: capacity bytes, 4 KiB multiple ...............]

**Header slots** alternate: every header write goes to the slot after the newest one with a
sequence number one higher, so a torn header write leaves the other slot intact. The newest slot
whose magic, version and CRC32C check out wins. Header format version 2 adds the WAL's identity
(the deployment id and the node id it belongs to) and ``acked_through`` (every record below it was
acknowledged; written by a clean close). Version 3 puts the owner's *fence lease* (microseconds)
in what version 2 kept as a reserved zero field: how long after a header read that showed it the
owner the writer may still acknowledge writes without reading the header again; whoever takes the
WAL over waits that long before reading the log. A release that reads only versions 1 and 2
refuses a version-3 header ("upgrade walstream") instead of taking it over without waiting.
Version 1 and 2 headers are still read (their writers hold no lease); the next header write turns
them into version 3.

**Records** live at ever-growing *logical* offsets; a record with logical offset ``o`` sits at
``area_start + o % capacity``. Each record is a header followed by its body (docs/architecture/formats.md). Record
format version 2 (32-byte header, what this code writes)::

    magic u32 | body_len u32 | body_offset u64 (= the record's logical offset) |
    acked_through u64 | body_crc u32 | header_crc u32

``acked_through`` is the group's *watermark*: when the group was issued, every record at a lower
offset had already been acknowledged (see :mod:`walstream_wal_ebs.scan` for how recovery uses it).
Record format version 1 (24-byte header, written by older releases, still read) lacks it::

    magic u32 | body_len u32 | body_offset u64 | body_crc u32 | header_crc u32

The magic tells the versions apart. ``header_crc`` is a CRC32C of the bytes before it, seeded with
the format's salt (random at format time) so that records left by an earlier format of the same
device never parse. A *padding* record (its own magic, body not checked) fills the rest of a
group's last block and the end of the ring at the wrap point. All integers are big-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Any

import crc32c

__all__ = [
    "BLOCK_BYTES",
    "FORMAT_VERSION",
    "HEADER_SLOT_COUNT",
    "NO_DEPLOYMENT",
    "PADDING_MAGIC",
    "PADDING_MAGIC_V1",
    "RECORD_AREA_START",
    "RECORD_HEADER_BYTES",
    "RECORD_HEADER_BYTES_V1",
    "RECORD_MAGIC",
    "RECORD_MAGIC_V1",
    "HeaderSlot",
    "RecordHeader",
    "align_up",
    "pack_record_header",
    "pack_record_header_v1",
    "pick_header",
    "repair_record_header",
    "unpack_record_header",
]

BLOCK_BYTES = 4096
"""Unit of every write and of alignment (the common logical block size of NVMe and EBS)."""
HEADER_SLOT_COUNT = 2
RECORD_AREA_START = HEADER_SLOT_COUNT * BLOCK_BYTES
FORMAT_VERSION = 3
"""Header format: 1 = no identity; 2 = deployment id, home node and acked-through; 3 = the
owner's fence lease."""
READABLE_VERSIONS = (1, 2, 3)

HEADER_MAGIC = b"WSWH"
RECORD_MAGIC_V1 = 0x57535752  # "WSWR"
PADDING_MAGIC_V1 = 0x57535750  # "WSWP"
RECORD_MAGIC = 0x57535232  # "WSR2"
PADDING_MAGIC = 0x57535032  # "WSP2"
NO_DEPLOYMENT = bytes(16)
"""The deployment id of a header that records none (version 1, or formatted unbound)."""

_HEADER_V1 = struct.Struct(">4sHHQQQQQQqQqqQ")
_HEADER_V2 = struct.Struct(">4sHHQQQQQQqQqqQ16sqQ")
_VERSION = struct.Struct(">H")
_CRC = struct.Struct(">I")
_RECORD_V1 = struct.Struct(">IIQI")
_RECORD_V2 = struct.Struct(">IIQQI")
_MAGIC = struct.Struct(">I")
RECORD_HEADER_BYTES_V1 = _RECORD_V1.size + 4
RECORD_HEADER_BYTES = _RECORD_V2.size + 4
"""Size of the record header this code writes (version 2)."""
assert RECORD_HEADER_BYTES_V1 == 24
assert RECORD_HEADER_BYTES == 32
MAGICS_V1 = (RECORD_MAGIC_V1, PADDING_MAGIC_V1)
MAGICS_V2 = (RECORD_MAGIC, PADDING_MAGIC)


def align_up(value: int, alignment: int = BLOCK_BYTES) -> int:
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class HeaderSlot:
    """One header slot's content. Offsets are logical record offsets."""

    sequence: int
    """Grows by one at every header write; the newest valid slot wins."""
    timestamp_ms: int
    capacity_bytes: int
    """Size of the circular record area (a multiple of 4 KiB)."""
    area_start: int
    """Byte position of the record area on the device."""
    tail_offset: int
    """Logical offset recovery scans from: the first untrimmed record (or the next write)."""
    trim_offset: int
    """Inclusive trim point: records at offsets ``<= trim_offset`` are never recovered."""
    head_floor: int
    """Where the latest writer started writing; every record ever written is below
    ``max(head_floor, tail_offset) + capacity``. Restarts resume beyond it."""
    node_id: int
    node_epoch: int
    """The owner: only this node id + epoch may write. A FAILOVER open with a higher epoch
    replaces it, which fences the old writer."""
    salt: int
    """Random per format; seeds every record's header CRC."""
    version: int = FORMAT_VERSION
    deployment_id: bytes = NO_DEPLOYMENT
    """The deployment this WAL belongs to (version 2; all zero: none recorded)."""
    home_node_id: int = -1
    """The node this WAL belongs to, recorded with the deployment id (-1: none recorded)."""
    acked_through: int = 0
    """Every record at a logical offset below this was acknowledged (a clean close writes it)."""
    fence_lease_us: int = 0
    """Version 3: the owner may acknowledge a write up to this long after the start of a header
    read that showed it the owner; a taker waits this long after fencing it (0: no lease, as
    every version-1/2 writer and a cleanly closed one)."""

    @property
    def has_identity(self) -> bool:
        return self.deployment_id != NO_DEPLOYMENT

    @property
    def ring_end(self) -> int:
        """The byte size the medium must have: header slots plus the whole record area."""
        return self.area_start + self.capacity_bytes

    def encode(self) -> bytes:
        common = (
            HEADER_MAGIC,
            self.version,
            0,
            self.sequence,
            self.timestamp_ms,
            self.capacity_bytes,
            self.area_start,
            self.tail_offset,
            self.head_floor,
            self.trim_offset,
            self.salt,
            self.node_id,
            self.node_epoch,
            self.fence_lease_us if self.version >= 3 else 0,
        )
        if self.version == 1:
            fields = _HEADER_V1.pack(*common)
        else:
            fields = _HEADER_V2.pack(
                *common, self.deployment_id, self.home_node_id, self.acked_through
            )
        slot = fields + _CRC.pack(crc32c.crc32c(fields))
        return slot + bytes(BLOCK_BYTES - len(slot))

    @classmethod
    def decode(cls, slot: bytes) -> HeaderSlot:
        """Parse one slot; raises ValueError saying what is wrong with it."""
        if len(slot) < _HEADER_V2.size + 4:
            raise ValueError("slot too short")
        if bytes(slot[:4]) != HEADER_MAGIC:
            raise ValueError("no header magic")
        (version,) = _VERSION.unpack_from(slot, 4)
        layout = _HEADER_V1 if version == 1 else _HEADER_V2
        fields = bytes(slot[: layout.size])
        (stored_crc,) = _CRC.unpack_from(slot, layout.size)
        if crc32c.crc32c(fields) != stored_crc:
            raise ValueError("header CRC mismatch")
        if version not in READABLE_VERSIONS:
            raise ValueError(
                f"unsupported format version {version} (this release reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}); upgrade walstream"
            )
        values = layout.unpack(fields)
        (
            _magic,
            _version,
            _flags,
            sequence,
            timestamp_ms,
            capacity_bytes,
            area_start,
            tail_offset,
            head_floor,
            trim_offset,
            salt,
            node_id,
            node_epoch,
            reserved,
        ) = values[:14]
        deployment_id, home_node_id, acked_through = (
            values[14:] if version >= 2 else (NO_DEPLOYMENT, -1, 0)
        )
        if capacity_bytes <= 0 or capacity_bytes % BLOCK_BYTES or area_start % BLOCK_BYTES:
            raise ValueError("capacity or record area not 4 KiB aligned")
        return cls(
            sequence=sequence,
            timestamp_ms=timestamp_ms,
            capacity_bytes=capacity_bytes,
            area_start=area_start,
            tail_offset=tail_offset,
            trim_offset=trim_offset,
            head_floor=head_floor,
            node_id=node_id,
            node_epoch=node_epoch,
            salt=salt,
            version=version,
            deployment_id=bytes(deployment_id),
            home_node_id=home_node_id,
            acked_through=acked_through,
            fence_lease_us=reserved if version >= 3 else 0,
        )

    def next(self, **changes: Any) -> HeaderSlot:
        return replace(self, sequence=self.sequence + 1, **changes)

    @property
    def slot_index(self) -> int:
        return self.sequence % HEADER_SLOT_COUNT


def pick_header(slots: list[bytes]) -> tuple[HeaderSlot | None, list[str]]:
    """The newest valid slot, and one problem description per invalid slot."""
    best: HeaderSlot | None = None
    problems: list[str] = []
    for index, raw in enumerate(slots):
        try:
            slot = HeaderSlot.decode(raw)
        except ValueError as exc:
            problems.append(f"slot {index}: {exc}")
            continue
        if best is None or slot.sequence > best.sequence:
            best = slot
    return best, problems


@dataclass(frozen=True, slots=True)
class RecordHeader:
    magic: int
    body_len: int
    body_offset: int
    body_crc: int
    acked_through: int | None
    """The group's watermark (record format 2); ``None`` for format 1 records."""

    @property
    def is_padding(self) -> bool:
        return self.magic in (PADDING_MAGIC, PADDING_MAGIC_V1)

    @property
    def header_bytes(self) -> int:
        return RECORD_HEADER_BYTES_V1 if self.acked_through is None else RECORD_HEADER_BYTES


def salt_seed(salt: int) -> int:
    """The CRC32C state every record header CRC starts from."""
    return int(crc32c.crc32c(salt.to_bytes(8, "big")))


def pack_record_header(
    buffer: memoryview,
    position: int,
    magic: int,
    body_len: int,
    body_offset: int,
    acked_through: int,
    body_crc: int,
    seed: int,
) -> None:
    """Write a format-2 record header (``magic``: RECORD_MAGIC or PADDING_MAGIC)."""
    _RECORD_V2.pack_into(buffer, position, magic, body_len, body_offset, acked_through, body_crc)
    header_crc = crc32c.crc32c(buffer[position : position + _RECORD_V2.size], seed)
    _CRC.pack_into(buffer, position + _RECORD_V2.size, header_crc)


def record_header(
    magic: int, body_len: int, body_offset: int, acked_through: int, body_crc: int, seed: int
) -> bytes:
    """The bytes :func:`pack_record_header` writes, returned instead (for a writer that joins
    many records before one copy into its aligned buffer)."""
    fields = _RECORD_V2.pack(magic, body_len, body_offset, acked_through, body_crc)
    return fields + _CRC.pack(crc32c.crc32c(fields, seed))


def pack_record_header_v1(
    buffer: memoryview | bytearray,
    position: int,
    magic: int,
    body_len: int,
    body_offset: int,
    body_crc: int,
    seed: int,
) -> None:
    """Write a format-1 record header, as older releases did (kept for compatibility tests)."""
    _RECORD_V1.pack_into(buffer, position, magic, body_len, body_offset, body_crc)
    header_crc = crc32c.crc32c(bytes(buffer[position : position + _RECORD_V1.size]), seed)
    _CRC.pack_into(buffer, position + _RECORD_V1.size, header_crc)


def unpack_record_header(
    data: bytes | bytearray | memoryview, position: int, seed: int
) -> RecordHeader | str:
    """The record header at ``position``, or why it is not one (no magic, CRC mismatch).

    ``data`` must hold :data:`RECORD_HEADER_BYTES` bytes from ``position`` when they are
    available (a format-1 header needs only 24)."""
    (magic,) = _MAGIC.unpack_from(data, position)
    if magic in MAGICS_V2:
        if len(data) - position < RECORD_HEADER_BYTES:
            return "record header cut by the ring end"
        fields = bytes(data[position : position + _RECORD_V2.size])
        (stored,) = _CRC.unpack_from(data, position + _RECORD_V2.size)
        if crc32c.crc32c(fields, seed) != stored:
            return "record header CRC mismatch"
        _, body_len, body_offset, acked_through, body_crc_value = _RECORD_V2.unpack(fields)
        return RecordHeader(magic, body_len, body_offset, body_crc_value, acked_through)
    if magic in MAGICS_V1:
        fields = bytes(data[position : position + _RECORD_V1.size])
        (stored,) = _CRC.unpack_from(data, position + _RECORD_V1.size)
        if crc32c.crc32c(fields, seed) != stored:
            return "record header CRC mismatch"
        _, body_len, body_offset, body_crc_value = _RECORD_V1.unpack(fields)
        return RecordHeader(magic, body_len, body_offset, body_crc_value, None)
    return "no record magic"


def repair_record_header(data: bytes, seed: int) -> RecordHeader | None:
    """The record header ``data`` (which failed its checks) held before one bit flipped, or
    ``None``. CRC32C detects every error of up to three bits in a header this short, so a header
    one bit away from a valid one was that header: a damaged padding is recognised as padding and
    a damaged record's extent is known. Never used to return record bodies."""
    length = min(len(data), RECORD_HEADER_BYTES)
    scratch = bytearray(data[:length])
    for bit in range(length * 8):
        scratch[bit >> 3] ^= 0x80 >> (bit & 7)
        candidate = unpack_record_header(scratch, 0, seed)
        scratch[bit >> 3] ^= 0x80 >> (bit & 7)
        if isinstance(candidate, RecordHeader):
            return candidate
    return None


def body_crc(body: bytes | memoryview) -> int:
    return int(crc32c.crc32c(body))
