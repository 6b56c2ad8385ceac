"""The chunk format: one group-commit group of a quorum WAL as the bytes every replica stores.

A chunk is numbered by its seq; the WAL offset of record ``i`` of chunk ``seq`` is
``seq * RECORDS_PER_CHUNK + i``. Format 2 stamps the writer's :class:`LogIdentity` and its
acknowledgement watermark; format 1 (older writers) is still read; a damage marker (0xC3) is a
chunk without records that recovery writes where acknowledged records may be lost.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from walstream.errors import CorruptionError, InvalidArgument
from walstream.format.frames import (
    CRC_BYTES,
    TableErrors,
    crc_trailer_ok,
    decode_record_table,
    encode_record_table,
    with_crc,
)
from walstream.records import DEPLOYMENT_ID_BYTES
from walstream.wal.contract import WalOffset

__all__ = [
    "CHUNK_MAGIC",
    "CHUNK_MAGIC_V2",
    "DAMAGE_MARKER_MAGIC",
    "NO_DEPLOYMENT",
    "RECORDS_PER_CHUNK",
    "Chunk",
    "LogIdentity",
    "chunk_crc",
    "chunk_offset",
    "decode_chunk",
    "encode_chunk",
    "encode_damage_marker",
    "offset_seq",
    "parse_chunk",
]

#: WAL offset of record ``i`` in chunk ``seq`` is ``seq * RECORDS_PER_CHUNK + i``.
RECORDS_PER_CHUNK = 1 << 24

CHUNK_MAGIC = 0xC1
"""Chunk format 1: ``magic | count | records | crc`` (no identity, no watermark); still read."""
CHUNK_MAGIC_V2 = 0xC2
"""Chunk format 2: adds the writer's identity and its acknowledgement watermark."""
DAMAGE_MARKER_MAGIC = 0xC3
"""A damage marker: a chunk without records that recovery writes where it found that
acknowledged records may be lost (its reason is reported by every later recovery)."""
_CHUNK_HEAD = struct.Struct(">BI")
_CHUNK_HEAD_V2 = struct.Struct(f">B{DEPLOYMENT_ID_BYTES}sQQI")
#: The deployment id of a chunk written by a WAL that was bound to no deployment.
NO_DEPLOYMENT = bytes(DEPLOYMENT_ID_BYTES)


def chunk_offset(seq: int, index: int) -> WalOffset:
    return seq * RECORDS_PER_CHUNK + index


def offset_seq(offset: WalOffset) -> int:
    return offset // RECORDS_PER_CHUNK


def chunk_crc(data: bytes) -> int:
    return crc32c.crc32c(data)


@dataclass(frozen=True, slots=True)
class LogIdentity:
    """Whose log it is: the deployment id (16 bytes) and the node id the WAL was started for."""

    deployment_id: bytes
    node_id: int

    def describe(self) -> str:
        return f"deployment {self.deployment_id.hex()} node {self.node_id}"


@dataclass(frozen=True, slots=True)
class Chunk:
    """A decoded chunk. ``identity`` is ``None`` for format 1 and for chunks of an unbound WAL;
    ``acked_through`` (0 for format 1) is the writer's watermark when it formed the chunk."""

    records: list[bytes]
    identity: LogIdentity | None = None
    acked_through: int = 0
    damage: str | None = None
    """Set for a damage marker: what recovery found lost there."""


def encode_damage_marker(
    reason: str, *, identity: LogIdentity | None = None, acked_through: int = 0
) -> bytes:
    """``magic 0xC3 u8 | deployment_id 16 | node_id u64 | acked_through u64 | len u32 |
    reason utf-8 | crc32c u32``."""
    deployment_id, node_id = (
        (identity.deployment_id, identity.node_id) if identity else (NO_DEPLOYMENT, 0)
    )
    raw = reason.encode()
    return with_crc(
        _CHUNK_HEAD_V2.pack(DAMAGE_MARKER_MAGIC, deployment_id, node_id, acked_through, len(raw)),
        raw,
    )


def encode_chunk(
    payloads: Sequence[bytes],
    *,
    identity: LogIdentity | None = None,
    acked_through: int = 0,
    version: int = 2,
) -> bytes:
    """Format 2: ``magic 0xC2 u8 | deployment_id 16 | node_id u64 | acked_through u64 |
    count u32 | (len u32 | bytes)* | crc32c u32`` (big-endian, CRC over everything before it).
    Format 1 (``version=1``, what older writers wrote): ``magic 0xC1 u8 | count u32 | records |
    crc32c u32``. Without an identity, format 2 stores the all-zero deployment id. The record
    table and the CRC trailer are :mod:`walstream.format.frames`'."""
    if version == 1:
        head = _CHUNK_HEAD.pack(CHUNK_MAGIC, len(payloads))
    elif version == 2:
        deployment_id, node_id = (
            (identity.deployment_id, identity.node_id) if identity else (NO_DEPLOYMENT, 0)
        )
        if len(deployment_id) != DEPLOYMENT_ID_BYTES:
            raise InvalidArgument(f"a deployment id has {DEPLOYMENT_ID_BYTES} bytes")
        head = _CHUNK_HEAD_V2.pack(
            CHUNK_MAGIC_V2, deployment_id, node_id, acked_through, len(payloads)
        )
    else:
        raise InvalidArgument(f"unknown chunk format version {version}")
    return with_crc(head, encode_record_table(payloads))


_CHUNK_TABLE_ERRORS = TableErrors(
    length_overrun="chunk record header overruns the chunk",
    payload_overrun="chunk record overruns the chunk",
    trailing="chunk has trailing bytes",
)


def parse_chunk(data: bytes) -> Chunk:
    """Decode a chunk of format 1 or 2; :class:`CorruptionError` when any byte is off."""
    if len(data) < _CHUNK_HEAD.size + CRC_BYTES:
        raise CorruptionError(f"chunk of {len(data)} bytes is too short")
    if not crc_trailer_ok(data):
        raise CorruptionError("chunk checksum mismatch")
    body = data[:-CRC_BYTES]
    magic = body[0]
    identity: LogIdentity | None = None
    acked_through = 0
    if magic == CHUNK_MAGIC:
        _, count = _CHUNK_HEAD.unpack_from(body, 0)
        position = _CHUNK_HEAD.size
    elif magic in (CHUNK_MAGIC_V2, DAMAGE_MARKER_MAGIC):
        if len(body) < _CHUNK_HEAD_V2.size:
            raise CorruptionError("chunk header overruns the chunk")
        _, deployment_id, node_id, acked_through, count = _CHUNK_HEAD_V2.unpack_from(body, 0)
        if deployment_id != NO_DEPLOYMENT:
            identity = LogIdentity(deployment_id, node_id)
        position = _CHUNK_HEAD_V2.size
        if magic == DAMAGE_MARKER_MAGIC:
            if position + count != len(body):
                raise CorruptionError("damage marker length mismatch")
            reason = body[position:].decode(errors="replace")
            return Chunk([], identity, acked_through, damage=reason)
    else:
        raise CorruptionError(f"bad chunk magic 0x{magic:02x}")
    records = decode_record_table(body, count, _CHUNK_TABLE_ERRORS, start=position)
    return Chunk(records, identity, acked_through)


def decode_chunk(data: bytes) -> list[bytes]:
    """The records of a chunk; :class:`CorruptionError` when any byte is off."""
    return parse_chunk(data).records
