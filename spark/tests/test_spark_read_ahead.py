"""An executor's slice reads ahead with the deployment's ``cache.readahead_*`` options, and what it
read ahead is cancelled when Spark stops reading the slice early.

The slice reader runs without Spark here (``read_slice`` is what a Spark task iterates)."""

from __future__ import annotations

import asyncio
import time

import pytest
from walstream import Client, EngineConfig, Record
from walstream.config import CacheConfig, CompactionConfig, UploadConfig
from walstream.metadata import ObjectState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal
from walstream_spark import reading
from walstream_spark.planning import ReadSlice
from walstream_spark.runtime import DeploymentBackends

RECORDS = 6000


def value(offset: int) -> bytes:
    return f"{offset:08d}".encode() * 64


class CountingStore(MemoryObjectStore):
    """GETs take a moment and are counted while in flight; GETs of ``held`` keys wait for a
    minute (a slow store), unless cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most_in_flight = 0
        self.held: set[str] = set()

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(60 if key in self.held else 0.002)
            return await super().get(key, start, end)
        finally:
            self.in_flight -= 1


def config(depth: int) -> EngineConfig:
    """Objects of about 1 MiB; read-ahead of up to ``depth`` x 512 KiB reaches into the next."""
    return EngineConfig(
        cache=CacheConfig(
            readahead_min_bytes=16 << 10, readahead_max_bytes=512 << 10, readahead_depth=depth
        ),
        upload=UploadConfig(max_bytes=1 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
    )


def cold_stream(depth: int) -> tuple[DeploymentBackends, ReadSlice, list[str]]:
    """A stream of RECORDS records in several objects; the backends, a slice of all of it and
    the object keys in offset order."""
    store = CountingStore()
    metadata = MemoryMetadataStore()
    engine_config = config(depth)

    async def fill() -> tuple[int, list[str]]:
        async with Client(
            wal=MemoryWal(), objects=store, metadata=metadata, config=engine_config
        ) as client:
            stream = await client.create_stream("cold")
            for base in range(0, RECORDS, 500):
                await stream.append([Record(value(offset)) for offset in range(base, base + 500)])
            await client.flush()
        objects = await metadata.list_objects(state=ObjectState.COMMITTED)
        ordered = sorted(objects, key=lambda info: info.ranges[0].start_offset)
        return stream.stream_id, [info.key for info in ordered]

    stream_id, keys = asyncio.run(fill())
    assert len(keys) >= 3
    store.most_in_flight = 0
    backends = DeploymentBackends(store, metadata, engine_config)
    return backends, ReadSlice("cold", stream_id, 0, RECORDS, 0), keys


@pytest.mark.parametrize("depth", [0, 4])
def test_a_slice_reads_ahead_as_deep_as_the_deployment_says(depth: int) -> None:
    backends, piece, _ = cold_stream(depth)
    values = [record.value for chunk in reading.read_slice(backends, piece) for record in chunk]
    assert values == [value(offset) for offset in range(RECORDS)]
    store = backends.objects
    assert isinstance(store, CountingStore)
    if depth == 0:
        assert store.most_in_flight == 1  # cache.readahead_depth: 0 means no read-ahead GETs
    else:
        assert store.most_in_flight > 1


def test_a_slice_spark_stops_reading_early_cancels_its_read_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reading, "_CHUNK_RECORDS", 300)
    backends, piece, keys = cold_stream(4)
    store = backends.objects
    assert isinstance(store, CountingStore)
    store.held = set(keys[1:])  # read-ahead into the following objects hangs
    chunks = reading.read_slice(backends, piece)
    first = next(chunks)
    assert [record.offset for record in first] == list(range(300))
    while store.in_flight == 0:  # the slice reads ahead into the next objects
        time.sleep(0.01)  # bounded by the test's timeout, as every wait below
    chunks.close()  # what Spark does when a LIMIT is satisfied or the task is killed
    while store.in_flight:  # GETs read ahead for a slice nobody reads any more are cancelled
        time.sleep(0.01)
