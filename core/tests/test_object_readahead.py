"""Pipelined read-ahead of sequential cold reads: the next window is in flight while the current
one is consumed, the bytes it brings are checked like any fetched range, and a failed prefetch
never fails a read (the range is fetched again on demand)."""

from __future__ import annotations

import asyncio

import pytest
from walstream import Client, CorruptionError, EngineConfig, Record
from walstream.config import CacheConfig, CompactionConfig, UploadConfig
from walstream.engine.object_reader import ObjectReader
from walstream.engine.read import read_committed
from walstream.errors import BackendUnavailable
from walstream.metadata import ObjectInfo, ObjectState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
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
    """GETs take a moment; records how many ran at once; can fail chosen GETs once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_once: set[tuple[str, int]] = set()
        self.failed: list[tuple[str, int]] = []

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.002)
            if (key, start) in self.fail_once:
                self.fail_once.discard((key, start))
                self.failed.append((key, start))
                raise BackendUnavailable(f"GET {key} at {start}: injected outage")
            return await super().get(key, start, end)
        finally:
            self.in_flight -= 1


async def cold_stream(store: SlowStore) -> tuple[MemoryMetadataStore, int, list[ObjectInfo]]:
    metadata = MemoryMetadataStore()
    async with Client(wal=MemoryWal(), objects=store, metadata=metadata, config=CONFIG) as client:
        stream = await client.create_stream("cold")
        for base in range(0, RECORDS, 500):
            await stream.append([Record(value(offset)) for offset in range(base, base + 500)])
        await client.flush()
        stream_id = stream.stream_id
    objects = await metadata.list_objects(state=ObjectState.COMMITTED)
    assert len(objects) >= 3
    return metadata, stream_id, objects


def reader_for(store: SlowStore, metadata: MemoryMetadataStore) -> ObjectReader:
    return ObjectReader(
        store, metadata, readahead_min_bytes=16 << 10, readahead_max_bytes=256 << 10
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


async def test_read_ahead_holds_at_most_its_budget_across_abandoned_scans() -> None:
    store = SlowStore()
    metadata, stream_id, _ = await cold_stream(store)
    reader = reader_for(store, metadata)
    budget = 4 * (256 << 10)
    # Scans that stop after a few reads leave prefetches nobody claims; later scans still get
    # theirs, every read returns its records, and what is held stays within the budget.
    used_by_first_scan = None
    for start in range(0, RECORDS - 1500, 1500):
        position = start
        for _ in range(3):
            batch = await reader.read(stream_id, position, None, 300, 1 << 30)
            assert [record.value for record in batch] == [
                value(offset) for offset in range(position, position + 300)
            ]
            position = batch[-1].offset + 1
        assert reader.prefetch_bytes <= budget
        if used_by_first_scan is None:
            used_by_first_scan = reader.prefetched_gets
    assert used_by_first_scan is not None
    assert reader.prefetched_gets > used_by_first_scan


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
