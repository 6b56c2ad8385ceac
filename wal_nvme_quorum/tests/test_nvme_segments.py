"""Segments written in place: created with synced zeros, records overwriting them from the written
end, replay ending where only zeros follow (see the ``store`` module docstring)."""

from __future__ import annotations

import os
import random
import shutil
import struct
import threading
from pathlib import Path

import crc32c
import pytest
from walstream.wal.quorum import encode_chunk
from walstream_conformance.harness.power import SimulatedDisk
from walstream_wal_nvme_quorum import store as chunk_store
from walstream_wal_nvme_quorum.store import MANIFEST, ChunkStore

LOG = "node-1"
_HEAD = struct.Struct(">BI")


def chunk(seq: int, size: int = 300) -> bytes:
    return encode_chunk([random.Random(seq).randbytes(size)])  # incompressible


async def write_chunks(store: ChunkStore, seqs: range, size: int = 300) -> dict[int, bytes]:
    written = {}
    for seq in seqs:
        data = chunk(seq, size)
        await store.write(LOG, 1, seq, data, crc32c.crc32c(data))
        written[seq] = data
    return written


def record_spans(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of each record, read independently of the store: up to a zero kind."""
    spans = []
    position = 0
    while position < len(data) and data[position] != 0:
        _, body_len = _HEAD.unpack_from(data, position)
        end = position + _HEAD.size + body_len + 4
        spans.append((position, end))
        position = end
    return spans


def segments(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.seg"))


def reopen(folder: Path) -> ChunkStore:
    store = ChunkStore(folder)
    store.open()
    return store


def assert_holds(store: ChunkStore, chunks: dict[int, bytes]) -> None:
    listing = store.listing(LOG)
    assert sorted(listing.chunks) == sorted(chunks)
    for seq, data in chunks.items():
        assert store.read_now(LOG, seq) == (1, data)


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preallocation in small steps, so that a few hundred KiB of chunks cross several."""
    monkeypatch.setattr(chunk_store, "PREALLOCATE_FIRST_BYTES", 16 << 10)
    monkeypatch.setattr(chunk_store, "PREALLOCATE_STEP_BYTES", 8 << 10)
    monkeypatch.setattr(chunk_store, "PREALLOCATE_SYNC_BYTES", 4 << 10)
    monkeypatch.setattr(chunk_store, "PREALLOCATE_AHEAD_BYTES", 14 << 10)


class RecordingIO:
    """``os`` for segment files that checks where records land, per file (inode): a write
    through a descriptor opened without ``O_APPEND`` (the records) is *in place* when it ends
    within the file size made durable by an earlier sync of that file (so its own sync commits
    no new size)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[int, int] = {}
        self._appending: set[int] = set()
        self._dirty: set[int] = set()
        self.synced_size: dict[int, int] = {}
        self.in_place = 0
        self.past_synced: list[tuple[int, int, int]] = []
        """``(inode, offset, end)`` of each record write beyond the durable size."""
        self.unsynced_zeros = 0
        """Descriptors of zeros (written through ``O_APPEND``) closed before a sync."""
        self.events: list[tuple[str, int]] = []
        """``(event, inode)``: create, sync, record (the first write of records) and folder."""

    def open(self, path: str, flags: int, mode: int = 0o777, /) -> int:
        fd = os.open(path, flags, mode)
        inode = os.fstat(fd).st_ino
        with self._lock:
            self._files[fd] = inode
            if flags & os.O_APPEND:
                self._appending.add(fd)
            self.synced_size.setdefault(inode, 0)
            if flags & os.O_CREAT:
                self.events.append(("create", inode))
        return fd

    def write(self, fd: int, data: bytes, /) -> int:
        inode = self._files[fd]
        with self._lock:
            if fd in self._appending:
                self._dirty.add(fd)
            else:
                offset = os.lseek(fd, 0, os.SEEK_CUR)
                if ("record", inode) not in self.events:
                    self.events.append(("record", inode))
                if offset + len(data) <= self.synced_size[inode]:
                    self.in_place += 1
                else:
                    self.past_synced.append((inode, offset, offset + len(data)))
        return os.write(fd, data)

    def pread(self, fd: int, length: int, offset: int, /) -> bytes:
        return os.pread(fd, length, offset)

    def fdatasync(self, fd: int, /) -> None:
        size = os.fstat(fd).st_size  # what this sync makes durable (writes before it)
        os.fdatasync(fd)
        with self._lock:
            inode = self._files[fd]
            self.synced_size[inode] = max(self.synced_size[inode], size)
            self.events.append(("sync", inode))
            self._dirty.discard(fd)

    def fstat(self, fd: int, /) -> os.stat_result:
        return os.fstat(fd)

    def close(self, fd: int, /) -> None:
        with self._lock:
            self._files.pop(fd, None)
            self._appending.discard(fd)
            if fd in self._dirty:
                self._dirty.discard(fd)
                self.unsynced_zeros += 1
        os.close(fd)


async def test_records_are_written_in_place_into_synced_zeros(
    tmp_path: Path, small_steps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = RecordingIO()
    sync_folder = chunk_store._fsync_directory

    def recorded_folder_sync(path: Path) -> None:
        sync_folder(path)
        io.events.append(("folder", 0))

    monkeypatch.setattr(chunk_store, "_fsync_directory", recorded_folder_sync)
    folder = tmp_path / "data"
    store = ChunkStore(folder, segment_bytes=64 << 10, io=io)
    store.open()
    written = await write_chunks(store, range(1, 301), size=1000)  # ~300 KiB: 4+ segments
    assert store.segment_count() >= 4
    events = io.events
    for path in segments(folder):
        # Created, its first zeros synced, then the folder synced, and only then a record.
        inode = path.stat().st_ino
        created = events.index(("create", inode))
        first_record = events.index(("record", inode))
        synced = events.index(("sync", inode), created)
        assert created < synced < events.index(("folder", 0), synced) < first_record
    assert io.unsynced_zeros == 0, "zeros were handed to the writer before they were synced"
    # Past the synced zeros only the record that crosses a segment's size (one per segment).
    assert len(io.past_synced) <= store.segment_count(), io.past_synced
    assert io.in_place >= 290
    assert_holds(store, written)
    store.close()
    assert_holds(reopened := reopen(tmp_path / "data"), written)
    assert (reopened.damaged_records, reopened.truncated_bytes, reopened.lost_bytes) == (0, 0, 0)
    reopened.close()


async def test_a_cleanly_closed_segment_ends_where_its_records_do(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    store = ChunkStore(folder, segment_bytes=4096)
    store.open()
    await write_chunks(store, range(1, 30))
    assert segments(folder)[-1].stat().st_size >= 4096, "the active segment holds no zeros"
    store.close()
    manifest = {}
    for line in (folder / MANIFEST).read_text().splitlines():
        index, end, *size = map(int, line.split())
        manifest[index] = (end, size[0] if size else end)
    *rotated, last = segments(folder)
    for path in [*rotated, last]:
        data = path.read_bytes()
        end = record_spans(data)[-1][1]
        assert manifest[int(path.stem)] == (end, len(data))
        assert data[end:] == bytes(len(data) - end)
    # The segment closed cleanly is cut to its records: the line of the previous format.
    assert last.stat().st_size == manifest[int(last.stem)][0]
    assert (folder / MANIFEST).read_text().splitlines()[-1] == f"{int(last.stem)} {len(data)}"


async def test_zeros_after_the_last_record_replay_to_exactly_the_written_records(
    tmp_path: Path,
) -> None:
    store = ChunkStore(tmp_path / "data")
    store.open()
    written = await write_chunks(store, range(1, 11))
    crashed = tmp_path / "crashed"  # the folder as a SIGKILL leaves it: no clean close
    shutil.copytree(tmp_path / "data", crashed)
    store.close()
    (segment,) = segments(crashed)
    data = segment.read_bytes()
    end = record_spans(data)[-1][1]
    assert end < len(data) and data[end:] == bytes(len(data) - end)
    reopened = reopen(crashed)
    assert_holds(reopened, written)
    assert (reopened.damaged_records, reopened.truncated_bytes, reopened.lost_bytes) == (0, 0, 0)
    assert not reopened.listing(LOG).incomplete
    assert segment.read_bytes() == data  # nothing cut: the zeros are not a torn record
    reopened.close()


async def test_a_record_torn_inside_the_preallocated_space_is_cut_off(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path / "data")
    store.open()
    written = await write_chunks(store, range(1, 11))
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "data", crashed)
    store.close()
    (segment,) = segments(crashed)
    size = segment.stat().st_size
    end = record_spans(segment.read_bytes())[-1][1]
    torn = _HEAD.pack(1, 700) + b"half of a chunk record"  # its sync never returned
    with open(segment, "r+b") as file:
        file.seek(end)
        file.write(torn)
    reopened = reopen(crashed)
    assert_holds(reopened, written)
    assert reopened.truncated_bytes == len(torn)
    assert (reopened.damaged_records, reopened.lost_bytes) == (0, 0)
    assert not reopened.listing(LOG).incomplete
    after = segment.read_bytes()
    assert len(after) == size and after[end:] == bytes(size - end)  # zeroed in place
    reopened.close()
    again = reopen(crashed)
    assert (again.truncated_bytes, again.damaged_records, again.lost_bytes) == (0, 0, 0)
    assert_holds(again, written)
    again.close()


async def test_zeros_followed_by_a_valid_record_are_damage_not_the_end(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path / "data")
    store.open()
    written = await write_chunks(store, range(1, 6))
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "data", crashed)
    store.close()
    (segment,) = segments(crashed)
    spans = record_spans(segment.read_bytes())
    start, end = spans[-3]  # chunk 3 (the last records are chunks 3, 4, 5)
    with open(segment, "r+b") as file:
        file.seek(start)
        file.write(bytes(end - start))
    reopened = reopen(crashed)
    assert_holds(reopened, {seq: data for seq, data in written.items() if seq != 3})
    assert reopened.damaged_records == 1
    assert reopened.listing(LOG).incomplete
    reopened.close()


@pytest.mark.parametrize("preallocated", [True, False], ids=["crashed", "finished"])
async def test_a_segment_whose_records_end_before_the_recorded_end_lost_its_tail(
    tmp_path: Path, preallocated: bool
) -> None:
    """The last records replaced by zeros (the file keeps its size): the manifest's written
    end, not the file size, tells that durable records are gone."""
    folder = tmp_path / "data"
    store = ChunkStore(folder)
    store.open()
    await write_chunks(store, range(1, 6))
    if preallocated:
        # A crash, then a restart: it records the segment's written end and size (zeros
        # after the records) and writes on in a new segment.
        crashed = tmp_path / "crashed"
        shutil.copytree(folder, crashed)
        store.close()
        folder = crashed
        reopen(folder).close()
    else:
        store.close()
    first = segments(folder)[0]
    size = first.stat().st_size
    assert (size > 1 << 20) == preallocated
    start, _ = record_spans(first.read_bytes())[-2]  # chunks 4 and 5
    with open(first, "r+b") as file:
        file.seek(start)
        file.write(bytes(size - start))
    assert first.stat().st_size == size
    reopened = reopen(folder)
    assert sorted(reopened.listing(LOG).chunks) == [1, 2, 3]
    assert reopened.lost_bytes > 0 and reopened.damaged_records == 0
    assert reopened.listing(LOG).incomplete
    reopened.close()


async def test_a_truncated_preallocated_segment_lost_durable_bytes(tmp_path: Path) -> None:
    """Zeros the manifest recorded as durable are bytes too: a segment cut shorter than its
    recorded size was truncated by something other than a crash."""
    store = ChunkStore(tmp_path / "data")
    store.open()
    written = await write_chunks(store, range(1, 4))
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "data", crashed)
    store.close()
    reopen(crashed).close()  # records this segment's end and preallocated size
    first = segments(crashed)[0]
    with open(first, "r+b") as file:
        file.truncate(first.stat().st_size // 2)  # only zeros go
    reopened = reopen(crashed)
    assert_holds(reopened, written)
    assert reopened.lost_bytes > 0 and reopened.listing(LOG).incomplete
    reopened.close()


async def test_a_power_cut_keeps_acknowledged_records_and_reports_no_loss(
    tmp_path: Path, small_steps: None
) -> None:
    for seed in range(8):
        folder = tmp_path / f"seed-{seed}"
        disk = SimulatedDisk(random.Random(seed))
        store = ChunkStore(folder, segment_bytes=48 << 10, io=disk)
        store.open()
        acked = await write_chunks(store, range(1, 121))  # crosses segments and extensions
        for seq in range(121, 126):  # written, never synced nor acknowledged
            data = chunk(seq)
            store.apply_write(LOG, 1, seq, data, crc32c.crc32c(data))
        if store._zeroing is not None:  # the power cut closes the extension's descriptor
            store._zeroing.result()
        disk.lose_power()
        reopened = reopen(folder)
        listing = reopened.listing(LOG)
        assert set(acked) <= set(listing.chunks) <= set(range(1, 126)), seed
        for seq, data in acked.items():
            assert reopened.read_now(LOG, seq) == (1, data)
        assert (reopened.damaged_records, reopened.lost_bytes) == (0, 0), seed
        assert not listing.incomplete
        reopened.close()
