"""Pipelined read-ahead of sequential cold reads: the next window is in flight while the current
one is consumed, the bytes it brings are checked like any fetched range, and a failed prefetch
never fails a read (the range is fetched again on demand)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable

import pytest
from walstream import Client, CorruptionError, EngineConfig, Record
from walstream.config import CacheConfig, CompactionConfig, UploadConfig
from walstream.engine.object_reader import ObjectReader
from walstream.engine.read import read_committed
from walstream.errors import BackendUnavailable
from walstream.metadata import ObjectInfo, ObjectState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.records import SequencedRecord
from walstream.wal.memory import MemoryWal

RECORDS = 6000
CONFIG = EngineConfig(
    cache=CacheConfig(readahead_min_bytes=16 << 10, readahead_max_bytes=256 << 10),
    upload=UploadConfig(max_bytes=1 << 20, max_interval_s=3600),
    compaction=CompactionConfig(enabled=False),
)


def value(offset: int) -> bytes:
    return f"{offset:08d}".encode() * 64


class SlowStore(MemoryObjectStore):
    """GETs take a moment; records how many ran at once and which ranges were asked for (with
    ``progress()`` at the time); can fail chosen GETs once, damage the bytes of the first
    GET that covers ``damage_once`` (key, position) in transit, and hold GETs of ``held`` keys
    for a minute (unless cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_once: set[tuple[str, int]] = set()
        self.failed: list[tuple[str, int]] = []
        self.ranges: list[tuple[str, int, int | None, int]] = []
        self.progress: Callable[[], int] = lambda: 0
        self.damage_once: tuple[str, int] | None = None
        self.held: set[str] = set()

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.ranges.append((key, start, end, self.progress()))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(60 if key in self.held else 0.002)
            if (key, start) in self.fail_once:
                self.fail_once.discard((key, start))
                self.failed.append((key, start))
                raise BackendUnavailable(f"GET {key} at {start}: injected outage")
            data = await super().get(key, start, end)
            if self.damage_once is not None and self.damage_once[0] == key:
                at = self.damage_once[1] - start
                if 0 <= start and 0 <= at < len(data):
                    self.damage_once = None
                    data = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
            return data
        finally:
            self.in_flight -= 1

    def gets_covering(self, key: str, position: int, size: int) -> list[int]:
        """The reader's progress when each GET of ``key`` that covers bytes ``position`` to
        ``position + size`` was issued."""
        return [
            progress
            for got, start, end, progress in self.ranges
            if got == key and 0 <= start <= position and end is not None and position + size <= end
        ]


async def cold_stream(
    store: SlowStore, records: int = RECORDS
) -> tuple[MemoryMetadataStore, int, list[ObjectInfo]]:
    metadata = MemoryMetadataStore()
    async with Client(wal=MemoryWal(), objects=store, metadata=metadata, config=CONFIG) as client:
        stream = await client.create_stream("cold")
        for base in range(0, records, 500):
            await stream.append([Record(value(offset)) for offset in range(base, base + 500)])
        await client.flush()
        stream_id = stream.stream_id
    objects = await metadata.list_objects(state=ObjectState.COMMITTED)
    assert len(objects) >= 3
    return metadata, stream_id, objects


def reader_for(store: SlowStore, metadata: MemoryMetadataStore) -> ObjectReader:
    return ObjectReader(
        store,
        metadata,
        readahead_min_bytes=16 << 10,
        readahead_max_bytes=256 << 10,
        readahead_depth=4,
    )


async def read_values(
    store: SlowStore, metadata: MemoryMetadataStore, stream_id: int, reader: ObjectReader
) -> list[bytes]:
    return [
        record.value
        async for record in read_committed(
            store, metadata, stream_id, 0, batch_records=700, reader=reader
        )
    ]


async def test_sequential_cold_read_keeps_the_next_window_in_flight() -> None:
    store = SlowStore()
    metadata, stream_id, _ = await cold_stream(store)
    store.most_in_flight = 0
    reader = reader_for(store, metadata)
    assert await read_values(store, metadata, stream_id, reader) == [
        value(offset) for offset in range(RECORDS)
    ]
    assert store.most_in_flight >= 2
    assert reader.prefetched_gets > 0
    assert reader.prefetch_bytes <= 4 * (256 << 10)


def records_alive() -> int:
    return sum(1 for item in gc.get_objects() if type(item) is SequencedRecord)


async def test_a_finished_reader_and_its_decoded_blocks_are_freed_without_the_cycle_collector() -> (
    None
):
    # A reference cycle through the reader would keep its block cache (a scan's decoded records)
    # until a full collection: in a Spark worker, one after every task.
    store = SlowStore()
    metadata, stream_id, objects = await cold_stream(store)
    reader = reader_for(store, metadata)
    assert len(await read_values(store, metadata, stream_id, reader)) == RECORDS
    await asyncio.sleep(0)  # let the released read-ahead's cancelled GETs finish
    block = reader.blocks.get((objects[-1].object_id, 0))
    assert block, "the last object's first block is cached"
    cached = len(block)
    del block
    freed_reader = weakref.ref(reader)
    gc.disable()
    try:
        before = records_alive()
        del reader
        assert freed_reader() is None, "the reader outlived its last reference (a cycle)"
        assert before - records_alive() >= cached, "its decoded records outlived it"
    finally:
        gc.enable()


async def test_read_ahead_keeps_several_gets_in_flight_and_within_its_budget() -> None:
    store = SlowStore()
    metadata, stream_id, objects = await cold_stream(store, 4 * RECORDS)
    expected = [value(offset) for offset in range(4 * RECORDS)]
    for depth in (0, 1, 4):
        store.most_in_flight = 0
        reader = ObjectReader(
            store,
            metadata,
            readahead_min_bytes=64 << 10,
            readahead_max_bytes=1 << 20,
            readahead_depth=depth,
        )
        assert await read_values(store, metadata, stream_id, reader) == expected
        # Several windows, objects' indexes and first windows ahead are in flight at once, and
        # never more read ahead than depth x readahead_max_bytes.
        assert reader.most_prefetch_bytes <= depth * (1 << 20)
        if depth == 0:
            assert store.most_in_flight == 1
            assert reader.prefetched_gets == 0
        else:
            assert store.most_in_flight >= depth + 1
            # Every object after the first is read from a prefetch.
            assert reader.prefetched_gets >= len(objects) - 1
        assert reader.prefetch_bytes == 0  # the scan ended: nothing is held


async def test_abandoned_scans_release_their_read_ahead_and_others_still_read_ahead() -> None:
    store = SlowStore()
    metadata, stream_id, _ = await cold_stream(store, 3 * RECORDS)
    reader = reader_for(store, metadata)
    budget = 4 * (256 << 10)
    # A scan that stops leaves read-ahead nobody claims; the stream's next read elsewhere
    # releases it, and that scan reads ahead again, within the budget all along.
    used_before = 0
    for start in range(0, 3 * RECORDS - 2800, RECORDS):
        position = start
        for _ in range(4):
            batch = await reader.read(stream_id, position, None, 700, 1 << 30, sequential=True)
            assert [record.value for record in batch] == [
                value(offset) for offset in range(position, position + 700)
            ]
            position = batch[-1].offset + 1
            assert reader.prefetch_bytes <= budget
        assert reader.prefetched_gets > used_before
        used_before = reader.prefetched_gets
        assert reader.prefetch_bytes > 0  # abandoned with read-ahead held ...
    await reader.read(stream_id, 0, None, 10, 1 << 30)
    assert reader.prefetch_bytes == 0  # ... until the stream's next read starts elsewhere
    assert reader.most_prefetch_bytes <= budget


async def test_a_closed_or_cancelled_scan_releases_its_read_ahead() -> None:
    store = SlowStore()
    metadata, stream_id, _ = await cold_stream(store)
    reader = reader_for(store, metadata)
    scan = read_committed(store, metadata, stream_id, 0, batch_records=700, reader=reader)
    values = [(await anext(scan)).value for _ in range(800)]
    assert values == [value(offset) for offset in range(800)]
    assert reader.prefetch_bytes > 0
    await scan.aclose()
    assert reader.prefetch_bytes == 0

    async def consume() -> None:
        async for _ in read_committed(
            store, metadata, stream_id, 0, batch_records=700, reader=reader
        ):
            await asyncio.sleep(0)

    consumer = asyncio.create_task(consume())
    while reader.prefetch_bytes == 0:
        await asyncio.sleep(0.001)
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    assert reader.prefetch_bytes == 0
    # The GETs it had in flight were cancelled, not left running.
    await asyncio.sleep(0.01)
    assert store.in_flight == 0


async def test_a_closed_scan_cancels_the_index_reads_it_started_ahead() -> None:
    store = SlowStore()
    metadata, stream_id, objects = await cold_stream(store)
    ordered = sorted(objects, key=lambda info: info.ranges[0].start_offset)
    store.held = {info.key for info in ordered[1:]}  # the next objects' GETs hang
    reader = ObjectReader(store, metadata, readahead_max_bytes=1 << 20, readahead_depth=4)
    scan = read_committed(store, metadata, stream_id, 0, batch_records=300, reader=reader)
    assert (await anext(scan)).value == value(0)
    assert store.in_flight > 0  # the following objects' indexes are read ahead at once
    await scan.aclose()
    await asyncio.sleep(0.01)
    assert store.in_flight == 0


async def test_streams_read_ahead_together_within_one_budget() -> None:
    store = SlowStore()
    metadata = MemoryMetadataStore()
    async with Client(wal=MemoryWal(), objects=store, metadata=metadata, config=CONFIG) as client:
        streams = [await client.create_stream(f"cold-{number}") for number in range(3)]
        for base in range(0, 3000, 500):
            for stream in streams:
                await stream.append([Record(value(offset)) for offset in range(base, base + 500)])
        await client.flush()
    reader = reader_for(store, metadata)
    positions = {stream.stream_id: 0 for stream in streams}
    while any(position < 3000 for position in positions.values()):
        for stream_id, position in positions.items():
            if position >= 3000:
                continue
            batch = await reader.read(stream_id, position, None, 400, 1 << 30, sequential=True)
            assert [record.value for record in batch] == [
                value(offset) for offset in range(position, min(3000, position + 400))
            ]
            positions[stream_id] = batch[-1].offset + 1
            assert reader.prefetch_bytes <= 4 * (256 << 10)
    assert reader.prefetched_gets > 0
    assert reader.most_prefetch_bytes <= 4 * (256 << 10)


async def test_a_failed_prefetch_is_fetched_again_by_the_read_that_needs_it() -> None:
    store = SlowStore()
    metadata, stream_id, objects = await cold_stream(store)
    # Fail the first GET of every block position once: prefetches among them fail.
    for info in objects:
        index = await reader_for(store, metadata).index(info)
        store.fail_once |= {(info.key, entry.position) for entry in index.entries[1:]}
    reader = reader_for(store, metadata)
    values = []
    position = 0
    surfaced = 0
    while position < RECORDS:
        try:
            batch = await reader.read(stream_id, position, None, 700, 1 << 30)
        except BackendUnavailable:
            # An on-demand GET failed (what a read without prefetching sees too): retry it.
            surfaced += 1
            continue
        values.extend(record.value for record in batch)
        position = batch[-1].offset + 1
    assert values == [value(offset) for offset in range(RECORDS)]
    # Failed prefetches were absorbed: fewer failures reached a read than were injected.
    assert reader.prefetched_gets > 0
    assert surfaced < len(store.failed)


async def test_a_damaged_block_fetched_ahead_fails_the_read_that_reaches_it() -> None:
    store = SlowStore()
    metadata, stream_id, objects = await cold_stream(store)
    info = objects[1]
    index = await reader_for(store, metadata).index(info)
    damaged = index.entries[len(index.entries) // 2]
    data = bytearray(await MemoryObjectStore.get(store, info.key))
    data[damaged.position + damaged.size // 2] ^= 0xFF
    await store.put(info.key, bytes(data))
    reader = reader_for(store, metadata)
    values: list[bytes] = []
    with pytest.raises(CorruptionError):
        async for record in read_committed(
            store, metadata, stream_id, 0, batch_records=700, reader=reader
        ):
            values.append(record.value)
    assert reader.prefetched_gets > 0
    # Records were served in order up to the read whose limits reach the damaged block.
    assert values == [value(offset) for offset in range(len(values))]
    assert damaged.start_offset - 700 < len(values) <= damaged.start_offset


@pytest.mark.parametrize("which", ["first", "last"])
async def test_bytes_damaged_on_the_way_to_a_prefetch_are_caught_by_the_read_that_needs_them(
    which: str,
) -> None:
    store = SlowStore()
    metadata, stream_id, objects = await cold_stream(store, 4 * RECORDS)
    info = objects[len(objects) // 2]
    index = await reader_for(store, metadata).index(info)
    damaged = index.entries[0] if which == "first" else index.entries[-1]
    # Only the first GET that covers the block sees a flipped bit; the object is intact.
    store.damage_once = (info.key, damaged.position + damaged.size // 3)
    reader = ObjectReader(
        store, metadata, readahead_min_bytes=64 << 10, readahead_max_bytes=1 << 20
    )
    values: list[bytes] = []
    store.progress = lambda: len(values)
    store.ranges.clear()
    errors = 0
    position = 0
    while position < 4 * RECORDS:
        try:
            batch = await reader.read(stream_id, position, None, 700, 1 << 30, sequential=True)
        except CorruptionError as exc:
            # Surfaced by the read that reaches the block, after what precedes it was served.
            assert "checksum" in str(exc)
            assert position == len(values) and damaged.start_offset - 700 < position
            assert position <= damaged.start_offset
            errors += 1
            continue
        values.extend(record.value for record in batch)
        position = batch[-1].offset + 1
    assert store.damage_once is None  # the damage was delivered ...
    # ... to a GET issued ahead, while the reader was still well before the block ...
    first_get = store.gets_covering(info.key, damaged.position, damaged.size)[0]
    assert first_get < damaged.start_offset - 700
    # ... and checked like a range fetched on demand: no damaged value was returned, and at
    # most the read that needed the block saw an error (none when the block came after what
    # the read returned: it was fetched again by the next read, intact).
    assert errors <= 1
    assert values == [value(offset) for offset in range(4 * RECORDS)]


@pytest.mark.parametrize("which", ["first", "last"])
async def test_a_damaged_block_read_ahead_fails_only_the_read_that_reaches_it(which: str) -> None:
    store = SlowStore()
    metadata, stream_id, objects = await cold_stream(store, 4 * RECORDS)
    info = objects[len(objects) // 2]
    index = await reader_for(store, metadata).index(info)
    damaged = index.entries[0] if which == "first" else index.entries[-1]
    data = bytearray(await MemoryObjectStore.get(store, info.key))
    data[damaged.position + damaged.size // 3] ^= 0x01
    await store.put(info.key, bytes(data))

    def gets_of_damaged() -> list[int]:
        return store.gets_covering(info.key, damaged.position, damaged.size)

    reader = ObjectReader(
        store, metadata, readahead_min_bytes=64 << 10, readahead_max_bytes=1 << 20
    )
    values: list[bytes] = []
    store.progress = lambda: len(values)
    store.ranges.clear()
    with pytest.raises(CorruptionError, match="checksum"):
        async for record in read_committed(
            store, metadata, stream_id, 0, batch_records=700, reader=reader
        ):
            values.append(record.value)
    # The block was first fetched ahead, well before the read that reaches it, which fails;
    # every record before it was served, intact.
    assert gets_of_damaged()[0] < damaged.start_offset - 700
    assert values == [value(offset) for offset in range(len(values))]
    assert damaged.start_offset - 700 < len(values) <= damaged.start_offset
    assert reader.prefetch_bytes == 0
    assert (info.object_id, damaged.position) not in reader.blocks
    # Nothing bad was kept: the next read that reaches the block fetches it again, and fails.
    fetched = len(gets_of_damaged())
    with pytest.raises(CorruptionError, match="checksum"):
        await reader.read(stream_id, damaged.start_offset, None, 10, 1 << 30)
    assert len(gets_of_damaged()) == fetched + 1
    # A read that ends before the block is served.
    if damaged.start_offset > info.ranges[0].start_offset:
        before = await reader.read(
            stream_id, damaged.start_offset - 5, damaged.start_offset, 100, 1 << 30
        )
        assert [record.value for record in before] == [
            value(offset) for offset in range(damaged.start_offset - 5, damaged.start_offset)
        ]
