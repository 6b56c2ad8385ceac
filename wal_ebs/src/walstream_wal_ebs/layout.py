"""The on-device layout of the ebs WAL: two header slots, then a circular record area.

::

    [slot 0: 4 KiB][slot 1: 4 KiB][record area: capacity bytes, 4 KiB multiple ...............]

**Header slots** alternate: every header write goes to the slot after the newest one with a
sequence number one higher, so a torn header write leaves the other slot intact. The newest slot
whose magic, version and CRC32C check out wins.

**Records** live at ever-growing *logical* offsets; a record with logical offset ``o`` sits at
``area_start + o % capacity``. Each record is a 24-byte header followed by its body (DESIGN §6)::

    magic u32 | body_len u32 | body_offset u64 (= the record's logical offset) | body_crc u32 |
    header_crc u32

``header_crc`` is a CRC32C of the 20 bytes before it, seeded with the format's salt (random at
format time) so that records left by an earlier format of the same device never parse.
A *padding* record (its own magic, body not checked) fills the rest of a group's last block and
the end of the ring at the wrap point. All integers are big-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

import crc32c

__all__ = [
    "BLOCK_BYTES",
    "FORMAT_VERSION",
    "HEADER_SLOT_COUNT",
    "PADDING_MAGIC",
    "RECORD_AREA_START",
    "RECORD_HEADER_BYTES",
    "RECORD_MAGIC",
    "HeaderSlot",
    "RecordHeader",
    "align_up",
    "pack_record_header",
    "pick_header",
    "unpack_record_header",
]

BLOCK_BYTES = 4096
"""Unit of every write and of alignment (the common logical block size of NVMe and EBS)."""
HEADER_SLOT_COUNT = 2
RECORD_AREA_START = HEADER_SLOT_COUNT * BLOCK_BYTES
FORMAT_VERSION = 1

HEADER_MAGIC = b"WSWH"
RECORD_MAGIC = 0x57535752  # "WSWR"
PADDING_MAGIC = 0x57535750  # "WSWP"

_HEADER = struct.Struct(">4sHHQQQQQQqQqqQ")
_HEADER_CRC = struct.Struct(">I")
_RECORD = struct.Struct(">IIQI")
RECORD_HEADER_BYTES = _RECORD.size + 4
assert RECORD_HEADER_BYTES == 24


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

    def encode(self) -> bytes:
        fields = _HEADER.pack(
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
            0,
        )
        slot = fields + _HEADER_CRC.pack(crc32c.crc32c(fields))
        return slot + bytes(BLOCK_BYTES - len(slot))

    @classmethod
    def decode(cls, slot: bytes) -> HeaderSlot:
        """Parse one slot; raises ValueError saying what is wrong with it."""
        if len(slot) < _HEADER.size + 4:
            raise ValueError("slot too short")
        fields = bytes(slot[: _HEADER.size])
        (
            magic,
            version,
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
            _reserved,
        ) = _HEADER.unpack(fields)
        if magic != HEADER_MAGIC:
            raise ValueError("no header magic")
        (stored_crc,) = _HEADER_CRC.unpack_from(slot, _HEADER.size)
        if crc32c.crc32c(fields) != stored_crc:
            raise ValueError("header CRC mismatch")
        if version != FORMAT_VERSION:
            raise ValueError(f"unsupported format version {version}")
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
        )

    def next(self, **changes: int) -> HeaderSlot:
        return replace(self, sequence=self.sequence + 1, **changes)

    @property
    def slot_index(self) -> int:
        return self.sequence % HEADER_SLOT_COUNT


def has_header_magic(slot: bytes) -> bool:
    return bytes(slot[:4]) == HEADER_MAGIC


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

    @property
    def is_padding(self) -> bool:
        return self.magic == PADDING_MAGIC


def salt_seed(salt: int) -> int:
    """The CRC32C state every record header CRC starts from."""
    return int(crc32c.crc32c(salt.to_bytes(8, "big")))


def pack_record_header(
    buffer: memoryview, position: int, magic: int, body_len: int, body_offset: int,
    body_crc: int, seed: int,
) -> None:
    _RECORD.pack_into(buffer, position, magic, body_len, body_offset, body_crc)
    header_crc = crc32c.crc32c(buffer[position : position + _RECORD.size], seed)
    _HEADER_CRC.pack_into(buffer, position + _RECORD.size, header_crc)


def unpack_record_header(
    data: bytes | memoryview, position: int, seed: int
) -> RecordHeader | str:
    """The record header at ``position``, or why it is not one (no magic, CRC mismatch)."""
    magic, body_len, body_offset, body_crc = _RECORD.unpack_from(data, position)
    if magic != RECORD_MAGIC and magic != PADDING_MAGIC:
        return "no record magic"
    (stored,) = _HEADER_CRC.unpack_from(data, position + _RECORD.size)
    if crc32c.crc32c(data[position : position + _RECORD.size], seed) != stored:
        return "record header CRC mismatch"
    return RecordHeader(magic, body_len, body_offset, body_crc)


def body_crc(body: bytes | memoryview) -> int:
    return int(crc32c.crc32c(body))
