"""The chunk server's storage: append-only segment files on a local disk.

A data folder holds numbered segment files ``0000000001.seg`` … Each is a sequence of records::

    kind u8 | body_len u32 | body | crc32c u32      (CRC over kind, body_len and body)

(the CRC is a trailer of :mod:`walstream.format.frames`, as in the protocol's frames).

Kinds: CHUNK (log_id, epoch, seq, data_crc, data), CLAIM (log_id, epoch), SEAL (log_id, epoch,
end_seq), TRIM (log_id, through_seq, trim_offset), IDENTITY (log_id, deployment_id 16 bytes,
node_id: whose log it is, recorded by the first identified claim) and CHECKPOINT (the claims,
seals and trim points of every log; CHECKPOINT2 adds each log's identity and is what this
version writes, CHECKPOINT is still read). Every segment starts with a checkpoint, so a segment
whose chunks are all trimmed or replaced can be deleted without losing any log's epochs, trim
point or identity.

Durability: a request is answered only after its record was written and ``fdatasync`` returned.
Group commit: the records written while the event loop works through what arrived together share
one ``fdatasync``, run on the loop's thread at the end of that turn (:meth:`ChunkStore.when_durable`);
a thread hop per sync cost more CPU than the sync on a small machine. A failed ``fdatasync`` (or
write) stops the store acknowledging anything until a restart replays what is really on disk: a
later sync that succeeds does not prove the earlier pages reached the disk. On start the store
replays every segment in order.

Damage on disk: a torn record at the very end of the last segment (a crash mid-write) is cut
off. A record that fails its checksum anywhere else is *skipped* and replay resumes at the next
position where a complete record with a valid checksum starts: the chunks lost with it are
simply missing from this server's listings, and the quorum WAL repairs them from the peers (or,
when no peer has a valid copy either, reports them as damage). The control state lost with a
damaged record comes back from the checkpoint of the next segment (claims, seals and trim
points only grow). The server keeps serving; ``damaged_records`` counts what was skipped.
Truncation: ``segments.manifest`` records every segment's size at each rotation and clean close
(written atomically). A segment found shorter than recorded lost bytes that were durable, so no
crash explains it; neither does a damaged record with valid records after it. In both cases the
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
import struct
from collections.abc import Callable
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
MANIFEST = "segments.manifest"


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
        sizes = {index: (self.root / _segment_name(index)).stat().st_size for index in indexes}
        for position, index in enumerate(indexes):
            self._replay(index, last=position == len(indexes) - 1, durable=recorded.get(index, 0))
        for state in self._logs.values():
            for stored in state.chunks.values():
                self._segments[stored.segment].live_chunks += 1
        lost = {
            index: recorded[index] - size
            for index, size in sizes.items()
            if recorded.get(index, 0) > size
        }
        self._rotate(next_index=(indexes[-1] + 1) if indexes else 1)
        if lost or self.damaged_records:
            # Bytes this server once made durable are gone (cut off, or skipped as damaged
            # while valid records follow: no crash explains either). Whatever chunks they held
            # cannot be named any more, so every log is marked incomplete until its next seal.
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

    def _read_manifest(self) -> dict[int, int]:
        """Segment sizes recorded at the last rotation or clean close (empty when unreadable)."""
        try:
            text = (self.root / MANIFEST).read_text()
            return {
                int(index): int(size)
                for index, size in (line.split() for line in text.split("\n") if line)
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring an unreadable %s: %s", MANIFEST, exc)
            return {}

    def _write_manifest(self) -> None:
        """Record every segment's size durably (a later open finds truncated segments)."""
        lines = []
        for index, segment in sorted(self._segments.items()):
            size = (
                self._active_size
                if segment is self._active
                else self._io.fstat(segment.read_fd).st_size
            )
            lines.append(f"{index} {size}\n")
        temporary = self.root / (MANIFEST + ".tmp")
        with open(temporary, "w") as file:
            file.write("".join(lines))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.root / MANIFEST)
        directory = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def _mark_tail_lost(self) -> None:
        self._tail_lost = True
        for state in self._logs.values():
            state.incomplete = True

    def _replay(self, index: int, *, last: bool, durable: int = 0) -> None:
        """Replay one segment; ``durable`` is how many of its bytes the manifest says were
        written before a clean close or rotation (damage there is never a torn tail)."""
        path = self.root / _segment_name(index)
        with open(path, "rb") as file:
            data = file.read()
        self._segments[index] = _Segment(index, path, self._io.open(str(path), os.O_RDONLY))
        position = 0
        while position < len(data):
            problem, end = self._check_record(data, position)
            if (
                problem is not None
                and last
                and position >= durable
                and self._torn_tail(data, position, end)
            ):
                self.truncated_bytes = len(data) - position
                log.warning("cutting a torn tail of %d bytes off %s", self.truncated_bytes, path)
                with open(path, "r+b") as file:
                    file.truncate(position)
                    os.fsync(file.fileno())
                return
            if problem is None:
                kind = data[position]
                body_start = position + _RECORD_HEAD.size
                try:
                    self._apply_record(kind, data[body_start : end - CRC_BYTES], index, body_start)
                except FrameError as exc:
                    problem = f"an unreadable record ({exc})"
            if problem is None:
                position = end
                continue
            resume = self._next_record(data, position + 1)
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

    def _next_record(self, data: bytes, start: int) -> int:
        """The first position at or after ``start`` where a valid record begins (or the end)."""
        for position in range(start, len(data) - _RECORD_HEAD.size - 3):
            if data[position] in _KINDS and self._check_record(data, position)[0] is None:
                return position
        return len(data)

    def _torn_tail(self, data: bytes, position: int, end: int) -> bool:
        """Whether the damage at ``position`` is what a crash mid-append leaves: nothing valid
        follows it in the last segment."""
        return self._next_record(data, position + 1) >= len(data)

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
            written = self._io.write(self._active_fd, record)
            if written != len(record):
                raise OSError(f"short write of {written} of {len(record)} bytes to a segment")
        except OSError as exc:
            raise self._fail("write", exc) from None
        self._active_size += len(record)
        self._written += 1
        return self._active_index, body_position

    @property
    def _active_index(self) -> int:
        assert self._active is not None
        return self._active.index

    def _rotate(self, next_index: int) -> None:
        io = self._io
        try:
            if self._active_fd >= 0:
                io.fdatasync(self._active_fd)
                io.close(self._active_fd)
                self._synced = self._written
            path = self.root / _segment_name(next_index)
            self._active_fd = io.open(
                str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644
            )
            self._active = self._segments[next_index] = _Segment(
                next_index, path, io.open(str(path), os.O_RDONLY)
            )
            self._active_size = 0
            self._append_record(KIND_CHECKPOINT2, self._checkpoint_body())
            io.fdatasync(self._active_fd)
        except OSError as exc:
            raise self._fail("segment rotation", exc) from None
        self._synced = self._written
        self._write_manifest()

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
            directory = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

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

    def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        waiters, self._durable_waiters = self._durable_waiters, []
        error = self._failure
        if self._active_fd >= 0:
            if error is None:
                try:
                    self._io.fdatasync(self._active_fd)
                except OSError as exc:
                    error = self._fail("fdatasync", exc)
                else:
                    self._synced = self._written
                    self._write_manifest()
            self._io.close(self._active_fd)
            self._active_fd = -1
        for segment in self._segments.values():
            self._io.close(segment.read_fd)
        self._segments.clear()
        for callback in waiters:
            callback(error)


def _pack_identity(identity: LogIdentity) -> bytes:
    return identity.deployment_id + _U64.pack(identity.node_id)


def _read_identity(reader: BodyReader) -> LogIdentity:
    deployment_id = reader.take(DEPLOYMENT_ID_BYTES)
    return LogIdentity(deployment_id, reader.u64())
