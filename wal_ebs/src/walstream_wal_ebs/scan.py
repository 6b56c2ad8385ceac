"""Walking the chain of records from the tail offset: shared by recovery and ``inspect``.

The walk starts at the header's tail offset and expects, at each step, a record whose
``body_offset`` equals the logical offset it reached. It stops at the first position that does
not hold one: no magic (a clean end or never-written space), a CRC mismatch (a torn write or
damage), or a record whose offset belongs to an earlier lap (stale data). It never skips over a
bad record.

One exception keeps restarts safe: at a 4 KiB-aligned position the walk accepts a record whose
offset is *larger* by a whole number of capacities — a *jump*. Only a writer that started after
the walk ended at that very position writes such a record (it resumes beyond everything any
earlier writer could have left in the ring, see ``EbsWal``), so stale bytes never look like one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from .layout import BLOCK_BYTES, RECORD_HEADER_BYTES, HeaderSlot, body_crc, salt_seed
from .layout import unpack_record_header as _unpack

__all__ = ["RingReader", "ScanStep", "scan_ring"]

_CHUNK_BYTES = 1 << 20

ReadFunction = Callable[[int, int], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class ScanStep:
    kind: Literal["record", "padding", "jump", "stop"]
    offset: int
    """Logical offset of the record / padding; for a jump, where the walk continues; for a stop,
    where it stopped."""
    end: int = 0
    """Logical offset just past this record or padding."""
    data: bytes | None = None
    problem: str = ""
    """For a stop: why."""
    corrupt: bool = False
    """For a stop: the bytes failed a checksum (a torn write or damage), not a clean end."""


class RingReader:
    """Aligned, chunked reads of the record area; a record never crosses the ring end."""

    def __init__(self, read: ReadFunction, area_start: int, capacity_bytes: int) -> None:
        self._read = read
        self._area_start = area_start
        self._capacity_bytes = capacity_bytes
        self._chunk_start = 0
        self._chunk = b""

    async def get(self, ring_position: int, length: int) -> bytes:
        """``length`` bytes at ``ring_position`` (0-based within the record area)."""
        end = ring_position + length
        chunk_end = self._chunk_start + len(self._chunk)
        if not (self._chunk_start <= ring_position and end <= chunk_end):
            start = ring_position - ring_position % BLOCK_BYTES
            stop = min(self._capacity_bytes, max(start + _CHUNK_BYTES, end))
            stop += -stop % BLOCK_BYTES
            self._chunk = await self._read(self._area_start + start, stop - start)
            self._chunk_start = start
        offset = ring_position - self._chunk_start
        return self._chunk[offset : offset + length]


async def scan_ring(read: ReadFunction, header: HeaderSlot) -> AsyncIterator[ScanStep]:
    """Yield the chain from ``header.tail_offset``: records, paddings, jumps, then one stop."""
    capacity = header.capacity_bytes
    seed = salt_seed(header.salt)
    reader = RingReader(read, header.area_start, capacity)
    expected = header.tail_offset
    walked_bytes = 0
    while True:
        ring_position = expected % capacity
        if walked_bytes >= capacity:
            yield ScanStep("stop", expected, problem="walked a whole lap of the ring")
            return
        if capacity - ring_position < RECORD_HEADER_BYTES:
            yield ScanStep(
                "stop", expected, problem="no room for a record before the ring end", corrupt=True
            )
            return
        raw = await reader.get(ring_position, RECORD_HEADER_BYTES)
        header_or_problem = _unpack(raw, 0, seed)
        if isinstance(header_or_problem, str):
            yield ScanStep(
                "stop",
                expected,
                problem=header_or_problem,
                corrupt=header_or_problem != "no record magic",
            )
            return
        record = header_or_problem
        if record.body_offset != expected:
            is_jump = (
                record.body_offset > expected
                and (record.body_offset - expected) % capacity == 0
                and expected % BLOCK_BYTES == 0
            )
            if not is_jump:
                yield ScanStep(
                    "stop",
                    expected,
                    problem=(
                        f"record at ring position {ring_position} carries offset "
                        f"{record.body_offset}, expected {expected} (left by an earlier lap)"
                    ),
                )
                return
            yield ScanStep("jump", record.body_offset, end=record.body_offset)
            expected = record.body_offset
        end_position = ring_position + RECORD_HEADER_BYTES + record.body_len
        if end_position > capacity:
            yield ScanStep(
                "stop",
                expected,
                problem=f"record of {record.body_len} bytes runs past the ring end",
                corrupt=True,
            )
            return
        step_bytes = RECORD_HEADER_BYTES + record.body_len
        if record.is_padding:
            yield ScanStep("padding", expected, end=expected + step_bytes)
        else:
            body = await reader.get(ring_position + RECORD_HEADER_BYTES, record.body_len)
            if body_crc(body) != record.body_crc:
                yield ScanStep("stop", expected, problem="record body CRC mismatch", corrupt=True)
                return
            yield ScanStep("record", expected, end=expected + step_bytes, data=body)
        expected += step_bytes
        walked_bytes += step_bytes
