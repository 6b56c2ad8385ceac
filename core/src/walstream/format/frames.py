"""Payload framing shared by the WAL formats: CRC32C trailers and length-prefixed record tables.

Two building blocks, written once and used by every WAL medium that frames payloads itself:

- **CRC trailer** — ``bytes | crc32c u32``: the CRC32C (big-endian) of everything before it.
  :func:`with_crc` appends one, :func:`crc_trailer_ok` checks one. Quorum chunks and damage
  markers (:mod:`walstream.wal.quorum`), the chunk server's segment records and protocol frames
  (nvme quorum) and the header of an S3 WAL object all end in one.
- **Record table** — ``(len u32 | bytes)*``: the payloads one after another, each after its
  length; the number of payloads is not in the table, the enclosing header carries it.
  :func:`encode_record_table` writes one, :func:`decode_record_table` reads exactly ``count``
  entries and refuses a table that overruns its bytes or leaves bytes after them. Quorum chunks
  and S3 WAL objects hold their payloads in one.

Where the CRC covering a record table lives is the one thing that differs between the formats,
so it is left to them: a quorum chunk ends in a trailer over its header and table, an S3 WAL
object names its body's CRC in its (trailer-protected) header. The bytes on disk and on the wire
are exactly what the formats wrote before this module existed (the format fixtures check it).

Pure: bytes in, values out; nothing here does I/O. Errors are :class:`CorruptionError` with the
wording each format passes in (:class:`TableErrors`), so messages stay what operators know.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from walstream.errors import CorruptionError

__all__ = [
    "CRC_BYTES",
    "LENGTH",
    "TableErrors",
    "crc_trailer_ok",
    "decode_record_table",
    "encode_record_table",
    "with_crc",
]

CRC_BYTES = 4
"""Size of a CRC trailer."""
LENGTH = struct.Struct(">I")
"""A record table's length prefix (and the CRC trailer's encoding): u32, big-endian."""


def with_crc(*parts: bytes) -> bytes:
    """``parts`` joined, then the CRC32C of all of them as a u32 trailer."""
    crc = 0
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    return b"".join((*parts, LENGTH.pack(crc)))


def crc_trailer_ok(data: bytes | memoryview, start: int = 0, end: int | None = None) -> bool:
    """Whether ``data[start:end]`` ends in a CRC trailer that matches the bytes before it.

    ``False`` (never an exception) when the span is shorter than a trailer: the caller says what
    a failed check means for its format.
    """
    stop = len(data) if end is None else end
    if stop - start < CRC_BYTES:
        return False
    stored: int = LENGTH.unpack_from(data, stop - CRC_BYTES)[0]
    return int(crc32c.crc32c(data[start : stop - CRC_BYTES])) == stored


def encode_record_table(payloads: Sequence[bytes]) -> bytes:
    """``(len u32 | payload)*`` for ``payloads`` in order."""
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(LENGTH.pack(len(payload)))
        parts.append(payload)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class TableErrors:
    """How a format words the ways a record table can be malformed."""

    length_overrun: str
    """A length prefix does not fit in the bytes left."""
    payload_overrun: str
    """A payload is longer than the bytes left."""
    trailing: str
    """Bytes are left after ``count`` entries; ``{count}`` is replaced by their number."""


def decode_record_table(
    data: bytes | memoryview, count: int, errors: TableErrors, *, start: int = 0
) -> list[bytes]:
    """The ``count`` payloads of the record table that fills ``data[start:]`` exactly.

    Raises :class:`CorruptionError` (with ``errors``' wording) when an entry overruns the bytes or
    bytes are left after the last entry.
    """
    end = len(data)
    position = start
    payloads: list[bytes] = []
    for _ in range(count):
        if position + LENGTH.size > end:
            raise CorruptionError(errors.length_overrun)
        (length,) = LENGTH.unpack_from(data, position)
        position += LENGTH.size
        if position + length > end:
            raise CorruptionError(errors.payload_overrun)
        payloads.append(bytes(data[position : position + length]))
        position += length
    if position != end:
        raise CorruptionError(errors.trailing.replace("{count}", str(end - position)))
    return payloads
