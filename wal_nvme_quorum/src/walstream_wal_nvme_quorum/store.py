"""The chunk server's storage: append-only segment files on a local disk.

A data folder holds numbered segment files ``0000000001.seg`` … Each is a sequence of records,
from byte 0 on, optionally followed by zeros (space prepared for more records)::

    kind u8 | body_len u32 | body | crc32c u32      (CRC over kind, body_len and body)

(the CRC is a trailer of :mod:`walstream.format.frames`, as in the protocol's frames).

Kinds: CHUNK (log_id, epoch, seq, data_crc, data), CLAIM (log_id, epoch), SEAL (log_id, epoch,
end_seq), TRIM (log_id, through_seq, trim_offset), IDENTITY (log_id, deployment_id 16 bytes,
node_id: whose log it is, recorded by the first identified claim) and CHECKPOINT (the claims,
seals and trim points of every log; CHECKPOINT2 adds each log's identity and is what this
version writes, CHECKPOINT is still read). Every segment starts with a checkpoint, so a segment
whose chunks are all trimmed or replaced can be deleted without losing any log's epochs, trim
point or identity.

Segments written in place: a segment is created with its first ``PREALLOCATE_FIRST_BYTES`` of
zeros written and synced (file and folder) before its first record. While it is written, a
background thread appends more zeros ahead of the writes (``PREALLOCATE_STEP_BYTES`` at a time,
synced every ``PREALLOCATE_SYNC_BYTES``, up to ``segment_bytes``); the writer uses the zeros an
extension synced once it is done. Records overwrite the zeros from the written end (a
descriptor without ``O_APPEND``, positioned there), so the ``fdatasync`` that makes them durable
has no file size or extent to commit through the file system's journal. A record that does not
fit in the synced zeros never waits: it stops the extension under way (which then writes no
more zeros) and is appended past them (as durable; that sync also commits the new size), and the
next extension starts from the new end of the file. No record starts with a zero byte (no kind is 0), so the records of a segment
end where only zeros follow. A segment closed cleanly is cut to its written end, so that it
reads like a segment of the previous format (never preallocated, ending where its records do;
those are still read: nothing in them changed); rotated segments and the one a server was
writing when it stopped keep their zeros (an older version would take them for damage).

Durability: a request is answered only after its record was written and ``fdatasync`` returned.
Group commit: the records written while the event loop works through what arrived together share
one ``fdatasync``, run on the loop's thread at the end of that turn (:meth:`ChunkStore.when_durable`);
a thread hop per sync cost more CPU than the sync on a small machine. A failed ``fdatasync`` (or
write) stops the store acknowledging anything until a restart replays what is really on disk: a
later sync that succeeds does not prove the earlier pages reached the disk. On start the store
replays every segment in order.

Damage on disk: a torn record at the very end of the last segment (a crash mid-write: nothing
valid follows it before the zeros) is cut off: zeroed in place within the size the manifest
recorded, truncated beyond it (the zeros before it stay). Zeros followed by a valid record are
damage, not the end. A record that fails its checksum anywhere else is *skipped* and replay
resumes at the next position where a complete record with a valid checksum starts: the chunks
lost with it are simply missing from this server's listings, and the quorum WAL repairs them
from the peers (or, when no peer has a valid copy either, reports them as damage). The control
state lost with a damaged record comes back from the checkpoint of the next segment (claims,
seals and trim points only grow). The server keeps serving; ``damaged_records`` counts what was skipped.
Truncation: ``segments.manifest`` records every segment at each rotation and clean close (written
atomically, one line per segment): ``index end size``, where its records end and its durable file
size, or ``index end`` when the two are equal (a finished segment; the line of the previous format,
which recorded the size alone). A segment whose valid records end before the recorded end, or
whose file is shorter than the recorded size, lost bytes that were durable, so no crash explains
it; neither does a damaged record with valid records after it. In all these cases the
store appends a TAIL_LOST record and every log it holds (and every log
it learns later) lists itself as *incomplete* until its next seal, which tells recovery that
this server cannot vouch for the end of the log. CHECKPOINT2 carries these flags.
A log whose segments carry two different identities (a segment of another deployment swapped
in) refuses identified claims with :class:`IdentityMismatch`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import crc32c
from walstream.errors import CorruptionError, FencedError, NotFound, PreconditionFailed
from walstream.format.frames import CRC_BYTES, crc_trailer_ok, with_crc
from walstream.records import DEPLOYMENT_ID_BYTES
from walstream.wal.quorum import (
    MAX_SEALS,
    ChunkInfo,
    LogIdentity,
    LogListing,
    Seal,
    identity_mismatch,
)

from .protocol import BodyReader, FrameError, pack_str

__all__ = ["DEFAULT_SEGMENT_BYTES", "ChunkStore", "DurableCallback", "SegmentIO"]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 << 20
_RECORD_HEAD = struct.Struct(">BI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_MAX_RECORD_BODY = 1 << 30

KIND_CHUNK = 1
KIND_CLAIM = 2
KIND_SEAL = 3
KIND_TRIM = 4
KIND_CHECKPOINT = 5
KIND_IDENTITY = 6
KIND_CHECKPOINT2 = 7
KIND_TAIL_LOST = 8
_KINDS = frozenset(range(KIND_CHUNK, KIND_TAIL_LOST + 1))
_KIND_BYTE = re.compile(b"[" + bytes(sorted(_KINDS)) + b"]")
MANIFEST = "segments.manifest"

PREALLOCATE_FIRST_BYTES = 2 << 20
"""Zeros written (and synced) when a segment is created, before its first record."""
PREALLOCATE_STEP_BYTES = 2 << 20
"""Zeros one background extension of the active segment appends (and syncs)."""
PREALLOCATE_SYNC_BYTES = 256 << 10
"""An extension syncs its zeros this many at a time."""
PREALLOCATE_AHEAD_BYTES = (2 << 20) - (256 << 10)
"""An extension starts when less than this much zeroed space is left ahead of the writes."""
_ZEROS = bytes(1 << 20)


@dataclass(slots=True)
class _StoredChunk:
    epoch: int
    segment: int
    position: int
    size: int
    crc: int


@dataclass
class _Log:
    claimed_epoch: int = 0
    trim_seq: int = 0
    trim_offset: int = -1
    seals: list[Seal] = field(default_factory=list)
    chunks: dict[int, _StoredChunk] = field(default_factory=dict)
    identity: LogIdentity | None = None
    conflicting: LogIdentity | None = None
    """A second identity met on replay: segments of two deployments are mixed here."""
    incomplete: bool = False
    """This server lost data (TAIL_LOST) after the log's last seal."""


@dataclass
class _Segment:
    index: int
    path: Path
    read_fd: int
    live_chunks: int = 0
    end: int = 0
    """Where its records end (the written end); for the active segment see ``_active_size``."""
    size: int = 0
    """Its file size known to be durable (records and zeros)."""


class SegmentIO(Protocol):
    """The ``os`` calls the store makes on segment files (``os`` itself, or a power-loss
    simulation in tests)."""

    def open(self, path: str, flags: int, mode: int = 0o777, /) -> int: ...
    def write(self, fd: int, data: bytes, /) -> int: ...
    def pread(self, fd: int, length: int, offset: int, /) -> bytes: ...
    def fdatasync(self, fd: int, /) -> None: ...
    def fstat(self, fd: int, /) -> os.stat_result: ...
    def close(self, fd: int, /) -> None: ...


DurableCallback = Callable[[OSError | None], None]
"""Told ``None`` once the records written before it was registered are on stable storage, or
the error that stopped the store."""


def _segment_name(index: int) -> str:
    return f"{index:010d}.seg"


class ChunkStore:
    """Chunks of many logs in append-only segments, with per-log epoch fencing."""

    def __init__(
        self,
        root: Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        io: SegmentIO | None = None,
    ) -> None:
        self.root = root
        self.segment_bytes = segment_bytes
        self._io: SegmentIO = io if io is not None else os
        self._logs: dict[str, _Log] = {}
        self._segments: dict[int, _Segment] = {}
        self._active: _Segment | None = None
        self._active_fd = -1
        self._active_size = 0
        self._prepared = 0
        """Bytes of the active segment that are zeros or records, synced: records written
        within them change no file size or extent, so their ``fdatasync`` commits no metadata."""
        self._zeroing: Future[int] | None = None
        """The background extension of the active segment under way (it appends zeros)."""
        self._extension = _Extension()
        self._zeroer: ThreadPoolExecutor | None = None
        self._zeroing_stopped = False
        """An extension of the active segment failed: no more until the next segment."""
        self._written = 0
        self._synced = 0
        self._durable_waiters: list[DurableCallback] = []
        self._flush_handle: asyncio.Handle | None = None
        self._failure: OSError | None = None
        """Set by a failed write or sync: nothing is acknowledged any more (see the module doc)."""
        self.syncs = 0
        """``fdatasync`` calls of group commit (for tests and benchmarks)."""
        self.truncated_bytes = 0
        """Bytes of a torn tail cut off at open (for logs and tests)."""
        self.damaged_records = 0
        """Damaged regions skipped at open (each one or more records; see the module doc)."""
        self.lost_bytes = 0
        """Bytes that segment files lost since the manifest recorded them (found at open)."""
        self._tail_lost = False
        """This server once lost data: logs it did not know then are incomplete too."""

    # -- opening ----------

    def open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        indexes = sorted(int(path.stem) for path in self.root.glob("*.seg") if path.stem.isdigit())
        recorded = self._read_manifest()
        lost: dict[int, int] = {}
        for position, index in enumerate(indexes):
            end, size = recorded.get(index, (0, 0))
            segment = self._replay(
                index, last=position == len(indexes) - 1, durable=end, durable_size=size
            )
            if end > segment.end or size > segment.size:
                lost[index] = max(end - segment.end, size - segment.size)
        if indexes:
            # What a killed server left in the page cache becomes durable before the manifest
            # records its size (a power cut later must not make it look truncated).
            self._io.fdatasync(self._segments[indexes[-1]].read_fd)
        for state in self._logs.values():
            for stored in state.chunks.values():
                self._segments[stored.segment].live_chunks += 1
        self._rotate(next_index=(indexes[-1] + 1) if indexes else 1)
        if lost or self.damaged_records:
            # Bytes this server once made durable are gone (cut off, zeroed, or skipped as
            # damaged while valid records follow: no crash explains either). Whatever chunks
            # they held cannot be named any more, so every log is marked incomplete until its
            # next seal.
            self.lost_bytes = sum(lost.values())
            log.error(
                "segments %s are shorter than this server wrote them (%d bytes lost) and %d "
                "damaged regions were skipped; the logs here report themselves incomplete until "
                "a recovery seals them",
                sorted(lost),
                self.lost_bytes,
                self.damaged_records,
            )
            self._append_record(KIND_TAIL_LOST, _U64.pack(self.lost_bytes))
            self._mark_tail_lost()
            self._io.fdatasync(self._active_fd)
            self._synced = self._written
        self._delete_dead_segments()

    def _read_manifest(self) -> dict[int, tuple[int, int]]:
        """``index -> (written end, file size)`` recorded at the last rotation or clean close
        (empty when unreadable). A line of the previous format, ``index size``, is a segment
        that was never preallocated: its records end where the file does."""
        try:
            text = (self.root / MANIFEST).read_text()
            recorded: dict[int, tuple[int, int]] = {}
            for line in text.split("\n"):
                fields = [int(field) for field in line.split()]
                if len(fields) == 2:
                    recorded[fields[0]] = (fields[1], fields[1])
                elif len(fields) == 3:
                    recorded[fields[0]] = (fields[1], fields[2])
                elif fields:
                    raise ValueError(f"a line of {len(fields)} fields")
            return recorded
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring an unreadable %s: %s", MANIFEST, exc)
            return {}

    def _write_manifest(self) -> None:
        """Record every segment's written end and durable size (a later open finds segments
        that lost records or were truncated)."""
        lines = []
        for index, segment in sorted(self._segments.items()):
            if segment is self._active:
                end, size = self._active_size, max(self._prepared, self._active_size)
            else:
                end, size = segment.end, segment.size
            # A segment without zeros after its records: the line of the previous format.
            lines.append(f"{index} {end}\n" if end == size else f"{index} {end} {size}\n")
        temporary = self.root / (MANIFEST + ".tmp")
        with open(temporary, "w") as file:
            file.write("".join(lines))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.root / MANIFEST)
        _fsync_directory(self.root)

    def _mark_tail_lost(self) -> None:
        self._tail_lost = True
        for state in self._logs.values():
            state.incomplete = True

    def _replay(
        self, index: int, *, last: bool, durable: int = 0, durable_size: int = 0
    ) -> _Segment:
        """Replay one segment; ``durable`` is where the manifest says its records ended at a
        clean close or rotation (damage before it is never a torn tail) and ``durable_size``
        its file size then (a torn tail is never cut below it)."""
        path = self.root / _segment_name(index)
        with open(path, "rb") as file:
            data = file.read()
        segment = _Segment(index, path, self._io.open(str(path), os.O_RDONLY), size=len(data))
        self._segments[index] = segment
        written = _nonzero_end(data)  # only zeros after it: space not written yet
        position = 0
        while position < written:
            problem, end = self._check_record(data, position)
            if (
                problem is not None
                and last
                and position >= durable
                and self._torn_tail(data, position, written)
            ):
                segment.size = self._cut_torn_tail(path, data, position, written, durable_size)
                return segment
            if problem is None:
                kind = data[position]
                body_start = position + _RECORD_HEAD.size
                try:
                    self._apply_record(kind, data[body_start : end - CRC_BYTES], index, body_start)
                except FrameError as exc:
                    problem = f"an unreadable record ({exc})"
            if problem is None:
                position = segment.end = end
                continue
            resume = self._next_record(data, position + 1, written)
            self.damaged_records += 1
            log.error(
                "segment %s has %s at byte %d; skipping %d bytes to the next valid record (the "
                "chunks in them are missing here and are repaired from the peers)",
                path,
                problem,
                position,
                resume - position,
            )
            position = resume
        return segment

    def _cut_torn_tail(
        self, path: Path, data: bytes, position: int, written: int, durable_size: int
    ) -> int:
        """Remove the torn bytes from ``position`` to ``written`` (the zeros before them stay):
        zeroed in place inside the size the manifest recorded, cut off beyond it. Returns the
        file's new size."""
        start = _first_nonzero(data, position)
        keep = max(start, durable_size)
        self.truncated_bytes = written - start
        log.warning("cutting a torn tail of %d bytes off %s", self.truncated_bytes, path)
        with open(path, "r+b") as file:
            if min(written, keep) > start:
                file.seek(start)
                file.write(bytes(min(written, keep) - start))
            size = len(data)
            if written > keep:
                file.truncate(keep)
                size = keep
            file.flush()
            os.fsync(file.fileno())
        return size

    @staticmethod
    def _check_record(data: bytes, position: int) -> tuple[str | None, int]:
        """``(problem or None, end)`` of the record starting at ``position``."""
        if len(data) - position < _RECORD_HEAD.size + CRC_BYTES:
            return "a truncated record header", len(data)
        kind, body_len = _RECORD_HEAD.unpack_from(data, position)
        end = position + _RECORD_HEAD.size + body_len + CRC_BYTES
        if body_len > _MAX_RECORD_BODY or end > len(data):
            return "a truncated record", len(data)
        if not crc_trailer_ok(data, position, end):
            return "a record with a bad checksum", end
        if kind not in _KINDS:
            return f"a record of unknown kind {kind}", end
        return None, end

    def _next_record(self, data: bytes, start: int, written: int) -> int:
        """The first position from ``start`` (and before ``written``, where only zeros follow)
        where a valid record begins, or the end of ``data``."""
        for match in _KIND_BYTE.finditer(data, start, written):
            if self._check_record(data, match.start())[0] is None:
                return match.start()
        return len(data)

    def _torn_tail(self, data: bytes, position: int, written: int) -> bool:
        """Whether the damage at ``position`` is what a crash mid-append leaves: nothing valid
        follows it in the last segment."""
        return self._next_record(data, position + 1, written) >= len(data)

    def _apply_record(self, kind: int, body: bytes, segment: int, body_start: int) -> None:
        reader = BodyReader(body)
        if kind == KIND_CHUNK:
            log_id = reader.string()
            epoch, seq = reader.u64(), reader.u64()
            crc = reader.u32()
            size = len(reader.rest())
            state = self._log(log_id)
            state.claimed_epoch = max(state.claimed_epoch, epoch)
            if seq > state.trim_seq and not self._invalidated(state, seq, epoch):
                data_start = body_start + len(body) - size
                state.chunks[seq] = _StoredChunk(epoch, segment, data_start, size, crc)
        elif kind == KIND_CLAIM:
            state = self._log(reader.string())
            state.claimed_epoch = max(state.claimed_epoch, reader.u64())
        elif kind == KIND_SEAL:
            state = self._log(reader.string())
            self._apply_seal(state, Seal(reader.u64(), reader.u64()), count_live=False)
        elif kind == KIND_TRIM:
            state = self._log(reader.string())
            self._apply_trim(state, reader.u64(), reader.i64(), count_live=False)
        elif kind == KIND_IDENTITY:
            state = self._log(reader.string())
            self._apply_identity(state, _read_identity(reader))
        elif kind in (KIND_CHECKPOINT, KIND_CHECKPOINT2):
            for _ in range(reader.u32()):
                state = self._log(reader.string())
                state.claimed_epoch = max(state.claimed_epoch, reader.u64())
                through_seq, trim_offset = reader.u64(), reader.i64()
                for _ in range(reader.u32()):
                    self._apply_seal(state, Seal(reader.u64(), reader.u64()), count_live=False)
                self._apply_trim(state, through_seq, trim_offset, count_live=False)
                if kind == KIND_CHECKPOINT2:
                    identity = _read_identity(reader)
                    if identity.deployment_id != bytes(DEPLOYMENT_ID_BYTES):
                        self._apply_identity(state, identity)
                    state.incomplete = bool(reader.u8() & 1)
            if kind == KIND_CHECKPOINT2 and reader.u8() & 1:
                self._tail_lost = True
        elif kind == KIND_TAIL_LOST:
            self._mark_tail_lost()
        else:
            raise FrameError(f"unknown record kind {kind}")

    # -- state rules ----------

    def _log(self, log_id: str) -> _Log:
        state = self._logs.get(log_id)
        if state is None:
            state = self._logs[log_id] = _Log(incomplete=self._tail_lost)
        return state

    @staticmethod
    def _apply_identity(state: _Log, identity: LogIdentity) -> None:
        if state.identity is None:
            state.identity = identity
        elif state.identity != identity:
            state.conflicting = identity

    @staticmethod
    def _invalidated(state: _Log, seq: int, epoch: int) -> bool:
        return any(seal.epoch > epoch and seq > seal.end_seq for seal in state.seals)

    def _forget(self, stored: _StoredChunk, count_live: bool) -> None:
        if count_live:
            self._segments[stored.segment].live_chunks -= 1

    def _apply_seal(self, state: _Log, seal: Seal, *, count_live: bool) -> None:
        state.claimed_epoch = max(state.claimed_epoch, seal.epoch)
        state.incomplete = False
        if seal not in state.seals:
            state.seals = sorted([*state.seals, seal])[-MAX_SEALS:]
        for seq, stored in list(state.chunks.items()):
            if stored.epoch < seal.epoch and seq > seal.end_seq:
                del state.chunks[seq]
                self._forget(stored, count_live)

    def _apply_trim(
        self, state: _Log, through_seq: int, trim_offset: int, *, count_live: bool
    ) -> None:
        state.trim_seq = max(state.trim_seq, through_seq)
        state.trim_offset = max(state.trim_offset, trim_offset)
        for seq in [seq for seq in state.chunks if seq <= state.trim_seq]:
            self._forget(state.chunks.pop(seq), count_live)

    def _check_epoch(self, log_id: str, state: _Log, epoch: int) -> None:
        if epoch < state.claimed_epoch:
            raise FencedError(
                f"log {log_id} is owned by epoch {state.claimed_epoch}; a request of epoch "
                f"{epoch} is refused"
            )

    # -- writing records ----------

    def _append_record(self, kind: int, body: bytes) -> tuple[int, int]:
        """Write one record to the active segment (not yet synced); returns (segment, body pos)."""
        if self._active_size >= self.segment_bytes:
            self._rotate(next_index=self._active_index + 1)
        if self._failure is not None:
            raise self._failure
        head = _RECORD_HEAD.pack(kind, len(body))
        record = with_crc(head, body)
        body_position = self._active_size + len(head)
        try:
            if self._active_size + len(record) > self._prepared:
                # Beyond the synced zeros: take what the extension under way synced if it is
                # done, else stop it (it writes nothing more) and append past the zeros (this
                # sync then commits the new size too) rather than wait for it.
                self._finish_zeroing(wait=False)
            # The descriptor is not O_APPEND: its position is the written end.
            written = self._io.write(self._active_fd, record)
            if written != len(record):
                raise OSError(f"short write of {written} of {len(record)} bytes to a segment")
        except OSError as exc:
            raise self._fail("write", exc) from None
        self._active_size += len(record)
        self._written += 1
        self._zero_ahead()
        return self._active_index, body_position

    @property
    def _active_index(self) -> int:
        assert self._active is not None
        return self._active.index

    def _zero_ahead(self) -> None:
        """Start appending zeros to the active segment in the background when little zeroed
        space is left ahead of the writes (one extension at a time)."""
        if self._zeroing is not None:
            if not self._zeroing.done():
                return
            self._finish_zeroing(wait=True)
        if (
            self._zeroing_stopped
            or self._active is None
            or self._prepared >= self.segment_bytes
            or self._prepared - self._active_size >= PREALLOCATE_AHEAD_BYTES
        ):
            return
        try:
            start = self._io.fstat(self._active_fd).st_size  # where the file ends
        except OSError:
            return  # the next write or sync reports what is wrong
        target = min(self.segment_bytes, start + PREALLOCATE_STEP_BYTES)
        if target <= start:
            return
        if self._zeroer is None:
            self._zeroer = ThreadPoolExecutor(1, thread_name_prefix="chunkd-zeros")
        self._extension = _Extension()
        self._zeroing = self._zeroer.submit(
            _append_zeros, self._io, str(self._active.path), start, target, self._extension
        )

    def _finish_zeroing(self, *, wait: bool) -> None:
        """Stop the extension under way (if any: it writes no more zeros), and once it is done
        (at once with ``wait``) take the space it synced."""
        job = self._zeroing
        if job is None:
            return
        with self._extension.lock:
            self._extension.stopped = True
        if not wait and not job.done():
            return
        self._zeroing = None
        try:
            self._prepared = max(self._prepared, job.result())
        except OSError as exc:
            # Records are then appended past the zeros: as durable, slower to sync.
            self._zeroing_stopped = True
            log.warning("preallocating segment space failed (%s); appending instead", exc)

    def _rotate(self, next_index: int) -> None:
        io = self._io
        try:
            if self._active_fd >= 0 and self._active is not None:
                self._finish_zeroing(wait=True)
                io.fdatasync(self._active_fd)
                self._synced = self._written
                # Zeros may stay after its records; the manifest records both.
                self._active.end = self._active_size
                self._active.size = max(self._prepared, self._active_size)
                io.close(self._active_fd)
                self._active_fd = -1
            path = self.root / _segment_name(next_index)
            # Created with its first zeros written and synced, file and folder, before any
            # record goes in.
            prepared = min(self.segment_bytes, PREALLOCATE_FIRST_BYTES)
            fd = io.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            try:
                _write_zeros(io, fd, prepared)
                io.fdatasync(fd)
            finally:
                io.close(fd)
            _fsync_directory(self.root)
            self._active_fd = io.open(str(path), os.O_WRONLY)
            self._active = self._segments[next_index] = _Segment(
                next_index, path, io.open(str(path), os.O_RDONLY)
            )
            self._active_size = 0
            self._prepared = prepared
            self._zeroing_stopped = False
            self._append_record(KIND_CHECKPOINT2, self._checkpoint_body())
            io.fdatasync(self._active_fd)
        except OSError as exc:
            raise self._fail("segment rotation", exc) from None
        self._synced = self._written
        self._write_manifest()

    def _cut_zeros(self, segment: _Segment, fd: int, end: int) -> None:
        """Cut the zeros after the written ``end`` of a segment closed cleanly (durably), so
        that it reads as the segments of the previous format did."""
        segment.end = segment.size = end
        if self._io.fstat(fd).st_size > end:
            os.truncate(segment.path, end)
            self._io.fdatasync(fd)

    def _checkpoint_body(self) -> bytes:
        parts = [_U32.pack(len(self._logs))]
        for log_id, state in self._logs.items():
            parts.append(pack_str(log_id))
            parts.append(_U64.pack(state.claimed_epoch))
            parts.append(_U64.pack(state.trim_seq))
            parts.append(_I64.pack(state.trim_offset))
            parts.append(_U32.pack(len(state.seals)))
            parts.extend(_U64.pack(seal.epoch) + _U64.pack(seal.end_seq) for seal in state.seals)
            parts.append(
                _pack_identity(state.identity or LogIdentity(bytes(DEPLOYMENT_ID_BYTES), 0))
            )
            parts.append(bytes([1 if state.incomplete else 0]))
        parts.append(bytes([1 if self._tail_lost else 0]))
        return b"".join(parts)

    def _fail(self, what: str, exc: OSError) -> OSError:
        """Latch the first I/O failure: from now on every request that needs the disk fails."""
        if self._failure is None:
            self._failure = OSError(
                exc.errno,
                f"the chunk store's {what} failed ({exc}); it acknowledges nothing more: "
                "restart walstream-chunkd (it replays what is on disk) or replace the disk",
            )
            log.error("%s", self._failure)
        return self._failure

    def when_durable(self, callback: DurableCallback) -> None:
        """Call ``callback(None)`` once every record written so far is on stable storage (at
        once when it already is), or ``callback(error)`` when the store failed. Callbacks
        registered in the same turn of the event loop share one ``fdatasync``, made on the
        loop's thread in a later turn (group commit)."""
        if self._failure is not None:
            callback(self._failure)
            return
        if self._synced >= self._written and not self._durable_waiters:
            callback(None)
            return
        self._durable_waiters.append(callback)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        waiters, self._durable_waiters = self._durable_waiters, []
        error = self._failure
        if error is None and self._synced < self._written:
            upto = self._written
            try:
                if self._active_fd < 0:
                    raise OSError(9, "the store is closed")
                self._io.fdatasync(self._active_fd)
            except OSError as exc:
                error = self._fail("fdatasync", exc)
            else:
                self.syncs += 1
                self._synced = upto
        for callback in waiters:
            try:
                callback(error)
            except Exception:
                log.exception("a durability callback raised; ignored")

    async def _sync(self) -> None:
        """Wait until every record written so far is on stable storage (group commit)."""
        if self._synced >= self._written and self._failure is None:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(error: OSError | None) -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        self.when_durable(done)
        await future

    def _delete_dead_segments(self) -> None:
        dead = [
            segment
            for index, segment in self._segments.items()
            if segment.live_chunks <= 0 and segment is not self._active
        ]
        for segment in dead:
            del self._segments[segment.index]
            self._io.close(segment.read_fd)
            segment.path.unlink(missing_ok=True)
        if dead:
            _fsync_directory(self.root)

    # -- the operations ----------

    def listing(self, log_id: str) -> LogListing:
        state = self._logs.get(log_id) or _Log()
        return LogListing(
            state.claimed_epoch,
            state.trim_seq,
            state.trim_offset,
            tuple(state.seals),
            {
                seq: ChunkInfo(seq, stored.epoch, stored.size, stored.crc)
                for seq, stored in state.chunks.items()
            },
            state.identity,
            state.incomplete,
        )

    # Each operation has a synchronous ``apply_*`` (checks, state change, record written, not
    # yet synced; the server answers from a :meth:`when_durable` callback) and an async form
    # that also waits for the sync.

    async def claim(
        self, log_id: str, epoch: int, identity: LogIdentity | None = None, *, where: str = ""
    ) -> LogListing:
        """Claim ``log_id`` for ``epoch``; with an ``identity``, first refuse a log of another
        deployment or node (:class:`IdentityMismatch`, nothing changed) and record it on a log
        that has none. ``where`` names this server in errors."""
        self.apply_claim(log_id, epoch, identity, where=where)
        await self._sync()
        return self.listing(log_id)

    def apply_claim(
        self, log_id: str, epoch: int, identity: LogIdentity | None = None, *, where: str = ""
    ) -> None:
        state = self._log(log_id)
        if identity is not None:
            for stored in (state.identity, state.conflicting):
                if stored is not None and stored != identity:
                    raise identity_mismatch(where or str(self.root), log_id, stored, identity)
        self._check_epoch(log_id, state, epoch)
        if identity is not None and state.identity is None:
            state.identity = identity
            self._append_record(KIND_IDENTITY, pack_str(log_id) + _pack_identity(identity))
        if epoch > state.claimed_epoch:
            state.claimed_epoch = epoch
            self._append_record(KIND_CLAIM, pack_str(log_id) + _U64.pack(epoch))

    async def list_chunks(self, log_id: str) -> LogListing:
        await self._sync()
        return self.listing(log_id)

    async def write(self, log_id: str, epoch: int, seq: int, data: bytes, crc: int) -> None:
        replaced = self.apply_write(log_id, epoch, seq, data, crc)
        await self._sync()
        if replaced:
            self._delete_dead_segments()

    def apply_write(self, log_id: str, epoch: int, seq: int, data: bytes, crc: int) -> bool:
        """Store a chunk (not yet synced); ``True`` when it replaced one, so that segments may
        have died (call :meth:`delete_dead_segments` once it is durable)."""
        if crc32c.crc32c(data) != crc:
            raise CorruptionError(f"chunk {seq} of log {log_id} arrived damaged (CRC mismatch)")
        state = self._log(log_id)
        self._check_epoch(log_id, state, epoch)
        if seq <= state.trim_seq:
            return False
        existing = state.chunks.get(seq)
        if existing is not None and existing.epoch == epoch:
            if existing.crc != crc or existing.size != len(data):
                raise PreconditionFailed(
                    f"log {log_id} already holds other bytes for chunk {seq} of epoch {epoch}"
                )
            return False
        body = pack_str(log_id) + _U64.pack(epoch) + _U64.pack(seq) + _U32.pack(crc) + data
        segment, body_position = self._append_record(KIND_CHUNK, body)
        state.claimed_epoch = max(state.claimed_epoch, epoch)
        if existing is not None:
            self._forget(existing, count_live=True)
        state.chunks[seq] = _StoredChunk(
            epoch, segment, body_position + len(body) - len(data), len(data), crc
        )
        self._segments[segment].live_chunks += 1
        return existing is not None

    async def read(self, log_id: str, seq: int) -> tuple[int, bytes]:
        return self.read_now(log_id, seq)

    def read_now(self, log_id: str, seq: int) -> tuple[int, bytes]:
        state = self._logs.get(log_id)
        stored = state.chunks.get(seq) if state is not None else None
        if stored is None:
            raise NotFound(f"no chunk {seq} in log {log_id}")
        segment = self._segments[stored.segment]
        # A synchronous read (page cache, chunks of at most a few MiB): a trim running meanwhile
        # could otherwise close the segment under a reading thread.
        data = self._io.pread(segment.read_fd, stored.size, stored.position)
        if len(data) != stored.size or crc32c.crc32c(data) != stored.crc:
            raise CorruptionError(f"chunk {seq} of log {log_id} failed its checksum on disk")
        return stored.epoch, data

    async def seal(self, log_id: str, epoch: int, end_seq: int) -> None:
        self.apply_seal(log_id, epoch, end_seq)
        await self._sync()
        self._delete_dead_segments()

    def apply_seal(self, log_id: str, epoch: int, end_seq: int) -> None:
        """Seal (not yet synced); call :meth:`delete_dead_segments` once it is durable."""
        state = self._log(log_id)
        self._check_epoch(log_id, state, epoch)
        self._append_record(KIND_SEAL, pack_str(log_id) + _U64.pack(epoch) + _U64.pack(end_seq))
        self._apply_seal(state, Seal(epoch, end_seq), count_live=True)

    async def trim(self, log_id: str, epoch: int, through_seq: int, trim_offset: int) -> None:
        self.apply_trim(log_id, epoch, through_seq, trim_offset)
        await self._sync()
        self._delete_dead_segments()

    def apply_trim(self, log_id: str, epoch: int, through_seq: int, trim_offset: int) -> None:
        """Trim (not yet synced); call :meth:`delete_dead_segments` once it is durable."""
        state = self._log(log_id)
        self._check_epoch(log_id, state, epoch)
        state.claimed_epoch = max(state.claimed_epoch, epoch)
        if through_seq > state.trim_seq or trim_offset > state.trim_offset:
            self._append_record(
                KIND_TRIM, pack_str(log_id) + _U64.pack(through_seq) + _I64.pack(trim_offset)
            )
            self._apply_trim(state, through_seq, trim_offset, count_live=True)

    def delete_dead_segments(self) -> None:
        """Delete the segments without a live chunk (after a replacing write, seal or trim is
        durable)."""
        self._delete_dead_segments()

    def segment_count(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        waiters, self._durable_waiters = self._durable_waiters, []
        error = self._failure
        if self._active_fd >= 0:
            self._finish_zeroing(wait=True)
            if error is None:
                try:
                    self._io.fdatasync(self._active_fd)
                except OSError as exc:
                    error = self._fail("fdatasync", exc)
                else:
                    self._synced = self._written
                    # Manifest first (it records the written end as the size), then the zeros
                    # go: a crash between the two leaves zeros the manifest allows for.
                    active, self._active = self._active, None
                    assert active is not None
                    active.end = active.size = self._active_size
                    self._write_manifest()
                    try:
                        self._cut_zeros(active, self._active_fd, self._active_size)
                    except OSError as exc:
                        log.warning("could not cut the zeros off %s: %s", active.path, exc)
            self._io.close(self._active_fd)
            self._active_fd = -1
        for segment in self._segments.values():
            self._io.close(segment.read_fd)
        self._segments.clear()
        if self._zeroer is not None:
            self._zeroer.shutdown(wait=True)
            self._zeroer = None
        for callback in waiters:
            callback(error)


def _pack_identity(identity: LogIdentity) -> bytes:
    return identity.deployment_id + _U64.pack(identity.node_id)


def _read_identity(reader: BodyReader) -> LogIdentity:
    deployment_id = reader.take(DEPLOYMENT_ID_BYTES)
    return LogIdentity(deployment_id, reader.u64())


def _fsync_directory(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _write_zeros(io: SegmentIO, fd: int, count: int) -> None:
    while count > 0:
        written = io.write(fd, _ZEROS[: min(count, len(_ZEROS))])
        if written <= 0:
            raise OSError(f"short write of zeros ({written} bytes) to a segment")
        count -= written


@dataclass
class _Extension:
    """Shared by the writer and one extension: once ``stopped`` (set under ``lock``) the
    extension writes no more zeros, so the writer may append past them."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: bool = False


def _append_zeros(io: SegmentIO, path: str, start: int, target: int, extension: _Extension) -> int:
    """Extend the segment at ``path`` (whose file ends at ``start``) with zeros towards
    ``target``, synced a piece at a time, until done or stopped; returns where the synced
    zeros end. Runs on the zeroing thread."""
    fd = io.open(path, os.O_WRONLY | os.O_APPEND)
    synced = position = start
    try:
        while position < target:
            step = min(target - position, PREALLOCATE_SYNC_BYTES)
            with extension.lock:
                if extension.stopped:
                    break
                size = io.fstat(fd).st_size
                if size != position:
                    raise OSError(f"segment {path} ends at {size}, not at {position} as expected")
                _write_zeros(io, fd, step)
            position += step
            io.fdatasync(fd)  # small pieces: a sync of records made meanwhile flushes little
            synced = position
    finally:
        io.close(fd)
    return synced


def _nonzero_end(data: bytes) -> int:
    """The position after the last byte of ``data`` that is not zero (0 when all are)."""
    end = len(data)
    while end > 0:
        start = max(0, end - len(_ZEROS))
        kept = len(data[start:end].rstrip(b"\0"))
        if kept:
            return start + kept
        end = start
    return 0


_NONZERO = re.compile(b"[^\x00]")


def _first_nonzero(data: bytes, start: int) -> int:
    match = _NONZERO.search(data, start)
    return match.start() if match is not None else len(data)
