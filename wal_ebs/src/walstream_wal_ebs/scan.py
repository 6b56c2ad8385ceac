"""Walking the log from the tail offset, telling a torn tail from damage: shared by recovery and
``inspect``.

**The chain.** The walk starts at the header's tail offset and expects, at each step, a record
whose ``body_offset`` equals the logical offset it reached. At a 4 KiB-aligned position it also
accepts a record whose offset is *larger* by a whole number of capacities — a *jump*: only a writer
that started after an earlier walk ended at that very position writes one (it resumes beyond
everything any earlier writer could have left in the ring, see ``EbsWal``), so stale bytes never
look like one. Records are released only at a group's end (a 4 KiB boundary): a record of a group
whose later part is torn is dropped with it.

**Where the chain breaks** the walk does not simply stop, because a flipped bit in the middle of
the log would then silently drop every acknowledged record after it. It *resynchronises*: it looks
at the following 4 KiB-aligned positions (every group starts on one) for a record header that
checks out under this format's salt and carries a logical offset above the break and congruent to
its position (a later record of the same lap, or a later writer's). Stale bytes of an earlier lap
carry lower offsets, bytes of an earlier format another salt, padding and unused space no valid
header: none of them is ever taken for data. When the break is a record whose header checks out
but whose body does not, or whose header is one flipped bit away from checking out (CRC32C
corrects that unambiguously in 32 bytes), the walk skips exactly that record; a padding record one
bit away from valid is a padding record (it holds nothing, so nothing is lost).

**Torn tail or damage.** Valid records after a break are not proof of damage: up to
``max_inflight`` groups are written concurrently, and a crash can leave a later one on the medium
while an earlier one is torn — neither was acknowledged. The writer's in-flight window alone is too
coarse a test (a flip in the last few MiB would still lose acknowledged records silently), so every
group carries a *watermark* (record format 2): the offset below which every record had been
acknowledged when the group was issued. A break at offset ``D`` is *attested* when any valid record
after it carries a watermark above ``D`` (a later durable write shows that something in the
damaged region was acknowledged), or when the header's ``acked_through`` (written by a clean close)
is above ``D``. Attested breaks are reported as :class:`~walstream.wal.WalDamage` (on the next
record, or as a pure damage report at the end) and the walk continues after them. A break that
nothing attests is a torn tail: it, and the valid-looking records after it (all of them were in
flight with it), are dropped, exactly as a crash in the middle of their writes leaves them.
Format-1 records carry no watermark; one found after a break attests it (it cannot be shown to have
been in flight), so damage in old data is reported rather than dropped.

Resynchronisation reads ahead at most ``resync_bytes`` after a damaged record (the free part of the
ring, capped at 256 MiB: a larger damaged region reads as the end of the log, and is reported only
when the header's acked-through covers it) and ``clean_bytes`` after a clean end (zeros or stale
bytes, where only the in-flight window can hold anything newer), so a restart after a clean end
reads a few MiB more than the chain itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from walstream.wal import WalDamage

from .layout import (
    BLOCK_BYTES,
    MAGICS_V1,
    MAGICS_V2,
    RECORD_HEADER_BYTES,
    RECORD_HEADER_BYTES_V1,
    HeaderSlot,
    RecordHeader,
    align_up,
    body_crc,
    repair_record_header,
    salt_seed,
)
from .layout import unpack_record_header as _unpack

__all__ = [
    "DEFAULT_CLEAN_SCAN_BYTES",
    "DEFAULT_RESYNC_SCAN_BYTES",
    "ChainItem",
    "RingReader",
    "walk_log",
]

_CHUNK_BYTES = 1 << 20
DEFAULT_CLEAN_SCAN_BYTES = 8 << 20
"""How far past a clean end the walk looks for records written out of order (the in-flight
window: 4 groups of 1 MiB by default, doubled)."""
DEFAULT_RESYNC_SCAN_BYTES = 256 << 20
"""How far past a damaged record the walk looks for the next valid one."""

ReadFunction = Callable[[int, int], Awaitable[bytes]]
_CANDIDATE_MAGICS = frozenset(magic.to_bytes(4, "big") for magic in (*MAGICS_V1, *MAGICS_V2))


@dataclass(frozen=True, slots=True)
class ChainItem:
    """One released step of the walk, in log order."""

    kind: Literal["record", "padding", "jump", "damage", "end"]
    offset: int
    """Record / padding: its logical offset; jump: where the walk continues; damage: where it
    starts; end: ``chain_end``, the aligned logical offset after everything kept (a writer
    resumes there)."""
    end: int = 0
    """Record / padding: the offset just past it. Damage: the logical offset, in the lap where
    the damage starts, just past the damaged bytes (``damage.end`` is larger when the data after
    them was written by a later writer)."""
    data: bytes | None = None
    damage: WalDamage | None = None
    """Damage (attested): the region."""
    continues_at: int = -1
    """Damage: where the walk continues after it (-1 for damage at the very end)."""
    problem: str = ""
    """End: why the chain ended (a clean end, or the torn tail that was dropped)."""
    torn_records: int = 0
    """End: how many valid-looking records were dropped with the torn tail."""
    torn_start: int = -1
    """End: where the dropped torn tail starts (-1: none dropped)."""


class RingReader:
    """Aligned, chunked reads of the record area; a record never crosses the ring end."""

    def __init__(self, read: ReadFunction, area_start: int, capacity_bytes: int) -> None:
        self._read = read
        self._area_start = area_start
        self._capacity_bytes = capacity_bytes
        self._chunk_start = 0
        self._chunk = b""

    async def get(self, ring_position: int, length: int) -> bytes:
        """``length`` bytes at ``ring_position`` (0-based within the record area); fewer at the
        ring end."""
        length = min(length, self._capacity_bytes - ring_position)
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


@dataclass
class _Break:
    """A place where the chain broke, pending until attested or found to be a torn tail."""

    start: int
    reason: str
    attest_from: int
    """A watermark above this attests the break: the break's position in the offsets of the
    writer whose record follows it (``start`` itself, unless a later writer's record follows:
    its watermarks speak of its own offsets)."""
    boundary: int
    """The last group boundary at or before ``start``: where a torn tail would begin."""
    boundary_index: int
    """How many buffered items lie before ``boundary``."""


@dataclass(frozen=True, slots=True)
class _Stop:
    problem: str
    corrupt: bool
    """Bytes failed a check (damage or a torn write), rather than a clean end."""
    skip_to: int | None = None
    """The damaged record's extent is known (its header checks out, or is one bit away from
    doing so): the offset just past it."""


class _Walker:
    def __init__(
        self, read: ReadFunction, header: HeaderSlot, clean_bytes: int, resync_bytes: int
    ) -> None:
        self.reader = RingReader(read, header.area_start, header.capacity_bytes)
        self.clean_bytes = clean_bytes
        self.resync_bytes = resync_bytes
        self.seed = salt_seed(header.salt)
        self.capacity = header.capacity_bytes
        self.expected = header.tail_offset
        self.walked = 0
        """Ring bytes the chain covered so far (a chain never covers more than one lap)."""
        self.attested_below = header.acked_through
        """Highest watermark seen (and the header's acked-through): breaks below it are damage."""
        self.boundary = header.tail_offset
        """The last group boundary the walk passed."""
        self.boundary_index = 0
        self.buffer: list[ChainItem] = []
        """Items not yet final: a group not yet complete, or items after an unattested break."""
        self.breaks: list[_Break] = []
        self.out: list[ChainItem] = []
        """Items final and ready to be yielded."""

    def pending(self) -> bool:
        """Whether a buffered break is not attested (yet); break starts increase."""
        return bool(self.breaks) and self.breaks[-1].attest_from >= self.attested_below

    def reach_boundary(self) -> None:
        self.boundary = self.expected
        self.boundary_index = len(self.buffer)
        if not self.pending():
            # Everything up to here is whole (a group ends on a block boundary) and every break
            # before it is attested damage.
            self.out.extend(self.buffer)
            self.buffer.clear()
            self.breaks.clear()
            self.boundary_index = 0

    def note_watermark(self, record: RecordHeader) -> None:
        # A format-1 record cannot show it was in flight with a break before it: it attests it.
        watermark = record.body_offset if record.acked_through is None else record.acked_through
        self.attested_below = max(self.attested_below, watermark)

    async def follow_chain(self) -> _Stop:
        """Follow valid records from ``expected``, buffering them, until the chain breaks."""
        capacity = self.capacity
        while True:
            if self.walked >= capacity:
                return _Stop("walked a whole lap of the ring", corrupt=False)
            ring_position = self.expected % capacity
            if capacity - ring_position < RECORD_HEADER_BYTES_V1:
                return _Stop("no room for a record before the ring end", corrupt=True)
            raw = await self.reader.get(ring_position, RECORD_HEADER_BYTES)
            parsed = _unpack(raw, 0, self.seed)
            repaired = False
            if isinstance(parsed, str):
                fixed = repair_record_header(raw, self.seed)
                if fixed is None:
                    if parsed == "no record magic":
                        return _Stop("no record here (a clean end)", corrupt=False)
                    return _Stop(parsed, corrupt=True)
                parsed, repaired = fixed, True
            record = parsed
            expected = self.expected
            if record.body_offset != expected:
                is_jump = (
                    record.body_offset > expected
                    and (record.body_offset - expected) % capacity == 0
                    and expected % BLOCK_BYTES == 0
                )
                if not is_jump:
                    return _Stop(
                        f"record at ring position {ring_position} carries offset "
                        f"{record.body_offset}, expected {expected} (left by an earlier lap)",
                        corrupt=False,
                    )
                if repaired and not record.is_padding:
                    return _Stop(
                        "damaged record header",
                        corrupt=True,
                        skip_to=record.body_offset + record.header_bytes + record.body_len,
                    )
                self.buffer.append(ChainItem("jump", record.body_offset))
                self.expected = expected = record.body_offset
                self.reach_boundary()
            step_bytes = record.header_bytes + record.body_len
            if ring_position + step_bytes > capacity:
                return _Stop(
                    f"record of {record.body_len} bytes runs past the ring end", corrupt=True
                )
            if repaired and not record.is_padding:
                return _Stop("damaged record header", corrupt=True, skip_to=expected + step_bytes)
            # A repaired padding holds nothing: a flipped bit in it loses no data.
            self.note_watermark(record)
            if record.is_padding:
                self.buffer.append(ChainItem("padding", expected, end=expected + step_bytes))
            else:
                body = await self.reader.get(ring_position + record.header_bytes, record.body_len)
                if body_crc(body) != record.body_crc:
                    return _Stop(
                        "record body CRC mismatch", corrupt=True, skip_to=expected + step_bytes
                    )
                self.buffer.append(
                    ChainItem("record", expected, end=expected + step_bytes, data=body)
                )
            self.expected = expected + step_bytes
            self.walked += step_bytes
            if self.expected % BLOCK_BYTES == 0:
                self.reach_boundary()

    async def resync(self, limit: int) -> tuple[int, int] | None:
        """The next valid record after the break at ``expected`` within ``limit`` ring bytes,
        at a 4 KiB-aligned position: ``(its logical offset, ring distance to it)``, or None."""
        capacity = self.capacity
        start = self.expected
        start_position = start % capacity
        distance = align_up(start_position + 1) - start_position
        while distance < limit:
            position = (start_position + distance) % capacity
            raw = await self.reader.get(position, RECORD_HEADER_BYTES)
            if raw[:4] in _CANDIDATE_MAGICS:
                record = _unpack(raw, 0, self.seed)
                if (
                    not isinstance(record, str)
                    and record.body_offset > start
                    and record.body_offset % capacity == position
                    and position + record.header_bytes + record.body_len <= capacity
                ):
                    return record.body_offset, distance
            distance += BLOCK_BYTES
        return None

    def add_break(self, stop: _Stop, resume: int, distance: int) -> None:
        start = self.expected
        self.breaks.append(
            _Break(start, stop.problem, resume - distance, self.boundary, self.boundary_index)
        )
        self.buffer.append(
            ChainItem(
                "damage",
                start,
                end=start + distance,
                damage=WalDamage(start, resume, distance, stop.problem),
                continues_at=resume,
            )
        )
        self.walked += distance
        self.expected = resume
        if resume % BLOCK_BYTES == 0:
            self.reach_boundary()

    def finish(self, stop: _Stop) -> None:
        """The chain ended at ``expected``: release what is attested, drop the torn tail."""
        final = _Break(
            self.expected, stop.problem, self.expected, self.boundary, self.boundary_index
        )
        breaks = [*self.breaks, final]
        first_torn = next((brk for brk in breaks if brk.attest_from >= self.attested_below), None)
        if first_torn is None:
            # Even the end is attested (the header's acked-through covers it): acknowledged
            # records are missing there. Keep everything and report it.
            self.out.extend(self.buffer)
            end = self.attested_below
            self.out.append(
                ChainItem(
                    "damage",
                    final.start,
                    end=align_up(final.start),
                    damage=WalDamage(final.start, end, end - final.start, stop.problem),
                )
            )
            self.out.append(
                ChainItem(
                    "end", align_up(final.start), problem=f"damage at the end: {stop.problem}"
                )
            )
            return
        self.out.extend(self.buffer[: first_torn.boundary_index])
        dropped = self.buffer[first_torn.boundary_index :]
        torn_records = sum(1 for item in dropped if item.kind == "record")
        is_torn = stop.corrupt or first_torn is not final or torn_records > 0
        problem = (
            f"torn tail from offset {first_torn.start} dropped ({first_torn.reason}; "
            f"{torn_records} record(s) of unacknowledged writes)"
            if is_torn
            else stop.problem
        )
        self.out.append(
            ChainItem(
                "end",
                first_torn.boundary,
                problem=problem,
                torn_records=torn_records,
                torn_start=first_torn.start if is_torn else -1,
            )
        )


async def walk_log(
    read: ReadFunction,
    header: HeaderSlot,
    *,
    clean_bytes: int = DEFAULT_CLEAN_SCAN_BYTES,
    resync_bytes: int = DEFAULT_RESYNC_SCAN_BYTES,
) -> AsyncIterator[ChainItem]:
    """Walk the log from ``header.tail_offset`` (module docstring); the last item is ``end``.

    Items come in log order once final: records and paddings of whole groups, jumps, and
    attested damage (``kind="damage"``) before the items that follow it."""
    walker = _Walker(read, header, clean_bytes, resync_bytes)
    while True:
        stop = await walker.follow_chain()
        if stop.skip_to is not None:
            distance = (stop.skip_to - walker.expected) % walker.capacity
            found: tuple[int, int] | None = (stop.skip_to, distance)
            if distance + walker.walked > walker.capacity:
                found = None
        else:
            limit = min(
                walker.capacity - walker.walked,
                walker.resync_bytes if stop.corrupt else walker.clean_bytes,
            )
            found = await walker.resync(limit)
        if found is None:
            walker.finish(stop)
        else:
            walker.add_break(stop, *found)
        for item in walker.out:
            yield item
        walker.out.clear()
        if found is None:
            return
