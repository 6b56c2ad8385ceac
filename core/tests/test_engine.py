"""The engine through its public API: append, read, reopen, trim, fencing, corruption, caches,
upload ordering, compaction and recovery."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import itertools
import os
import weakref
from pathlib import Path

import pytest
from walstream import (
    Client,
    CorruptionError,
    EngineConfig,
    FencedError,
    OutOfRangeError,
    Record,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
)
from walstream.clock import ManualClock
from walstream.config import CacheConfig, CompactionConfig, UploadConfig
from walstream.engine.cache import BlockCache, LogCache
from walstream.errors import CapacityError, InvalidArgument
from walstream.metadata import ObjectKind, ObjectState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal

SMALL_UPLOADS = EngineConfig(
    upload=UploadConfig(max_bytes=128 << 10, max_interval_s=0.05, split_bytes=64 << 10),
    compaction=CompactionConfig(enabled=False),
)


def value_for(stream: str, offset: int, size: int = 64) -> bytes:
    seed = hashlib.blake2b(f"{stream}:{offset}".encode(), digest_size=16).digest()
    return (seed * (size // 16 + 1))[:size]


class Backends:
    """Backends that outlive a client, the way disks outlive a process."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.name = f"{kind}-{os.urandom(4).hex()}"
        self.objects = (
            MemoryObjectStore(self.name) if kind == "memory" else LocalObjectStore(root / "objects")
        )

    def metadata(self) -> MemoryMetadataStore | SqliteMetadataStore:
        if self.kind == "memory":
            return MemoryMetadataStore(name=self.name)
        return SqliteMetadataStore(self.root / "meta.db")

    def client(self, config: EngineConfig = SMALL_UPLOADS, **wal_options: object) -> Client:
        return Client(
            wal=MemoryWal(name=self.name, **wal_options),  # type: ignore[arg-type]
            objects=self.objects,
            metadata=self.metadata(),
            config=config,
        )


@pytest.fixture(params=["memory", "files"])
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Backends:
    return Backends(request.param, tmp_path)


async def read_all(stream, start: int = 0) -> list:  # type: ignore[no-untyped-def]
    records = []
    position = start
    while True:
        result = await stream.read(start=position, limit_records=5000, limit_bytes=4 << 20)
        if not result.records:
            return records
        assert result.records[0].offset == position, "a read must start exactly where asked"
        records.extend(result.records)
        position = result.records[-1].offset + 1


@pytest.mark.slow
async def test_three_streams_concurrently_read_back_reopen_trim(backends: Backends) -> None:
    names = ["orders", "payments", "clicks"]
    per_stream = 20_000
    batch = 200
    client = await backends.client().start()
    streams = [await client.create_stream(name) for name in names]

    async def produce(stream, name: str) -> None:  # type: ignore[no-untyped-def]
        for base in range(0, per_stream, batch):
            records = [
                Record(
                    value_for(name, offset),
                    key=str(offset).encode(),
                    headers=(("n", name.encode()),),
                )
                for offset in range(base, base + batch)
            ]
            ack = await stream.append(records)
            assert (ack.start, ack.end) == (base, base + batch)

    await asyncio.gather(
        *(produce(stream, name) for stream, name in zip(streams, names, strict=True))
    )
    for stream, name in zip(streams, names, strict=True):
        records = await read_all(stream)
        assert [r.offset for r in records] == list(range(per_stream))
        assert all(r.value == value_for(name, r.offset) for r in records)
        assert all(
            r.key == str(r.offset).encode() and r.headers == (("n", name.encode()),)
            for r in records
        )
    await client.close()

    reopened = await backends.client().start()
    for name in names:
        stream = await reopened.open_stream(name)
        assert await stream.check_tail() == per_stream
        records = await read_all(stream)
        assert [r.value for r in records] == [value_for(name, i) for i in range(per_stream)]
    committed = await reopened.metadata.list_objects(state=ObjectState.COMMITTED)
    assert committed, "data must have landed in objects"

    stream = await reopened.open_stream("orders")
    await stream.trim(12_345)
    with pytest.raises(OutOfRangeError) as excinfo:
        await stream.read(start=12_344)
    assert excinfo.value.start_offset == 12_345
    first = await stream.read(start=12_345, limit_records=1)
    assert first.records[0].value == value_for("orders", 12_345)
    with pytest.raises(OutOfRangeError):
        await stream.trim(per_stream + 1)
    await reopened.close()


async def test_match_tail_and_fencing_token(backends: Backends) -> None:
    async with backends.client() as client:
        stream = await client.create_stream("s")
        await stream.append([Record(b"a"), Record(b"b")], match_tail=0)
        with pytest.raises(TailMismatchError) as excinfo:
            await stream.append([Record(b"c")], match_tail=1)
        assert excinfo.value.actual_tail == 2
        await stream.set_fencing_token("writer-2")
        with pytest.raises(FencedError):
            await stream.append([Record(b"c")], fencing_token="writer-1")
        ack = await stream.append([Record(b"c")], fencing_token="writer-2", match_tail=2)
        assert ack.end == 3
        assert [r.value for r in await read_all(stream)] == [b"a", b"b", b"c"]


async def test_stream_admin_errors(backends: Backends) -> None:
    async with backends.client() as client:
        await client.create_stream("x")
        with pytest.raises(StreamExists):
            await client.create_stream("x")
        with pytest.raises(StreamNotFound):
            await client.open_stream("nope")
        stream = await client.open_stream("x")
        with pytest.raises(InvalidArgument):
            await stream.append([])
        with pytest.raises(InvalidArgument):
            await stream.read(start=0, tail_offset=1)
        with pytest.raises(OutOfRangeError):
            await stream.read(start=1)
        await client.delete_stream("x")
        with pytest.raises(StreamNotFound):
            await stream.append([Record(b"late")])
        assert [info.name for info in await client.list_streams()] == []


async def test_read_positions_by_timestamp_and_tail_offset(backends: Backends) -> None:
    async with backends.client() as client:
        stream = await client.create_stream("t")
        for i in range(50):
            await stream.append([Record(b"%d" % i, timestamp_ms=1_000 + i * 10)])
        await client.flush()
        for i in range(50, 60):
            await stream.append([Record(b"%d" % i, timestamp_ms=1_000 + i * 10)])
        result = await stream.read(from_timestamp=1_000 + 25 * 10 - 5)
        assert result.records[0].offset == 25
        result = await stream.read(from_timestamp=1_000 + 55 * 10)
        assert result.records[0].offset == 55
        result = await stream.read(tail_offset=3)
        assert [r.offset for r in result.records] == [57, 58, 59]
        # timestamps never go backwards within a stream
        await stream.append([Record(b"old", timestamp_ms=5)])
        last = await stream.read(tail_offset=1)
        assert last.records[0].timestamp_ms == 1_000 + 59 * 10


async def test_tail_follows_new_records(backends: Backends) -> None:
    async with backends.client() as client:
        stream = await client.create_stream("live")
        seen: list[int] = []

        async def follow() -> None:
            async for record in stream.tail(start=0):
                seen.append(record.offset)
                if len(seen) == 30:
                    return

        follower = asyncio.create_task(follow())
        for i in range(30):
            await stream.append([Record(b"%d" % i)])
            await asyncio.sleep(0)
        await asyncio.wait_for(follower, 10)
        assert seen == list(range(30))
        empty = await stream.read(start=30, wait=0.05)
        assert empty.records == [] and empty.tail == 30


async def test_a_reader_waiting_at_the_tail_holds_the_record_when_its_append_returns(
    backends: Backends,
) -> None:
    """The acknowledgement itself wakes a read waiting at the tail, ahead of the appender: by
    the time ``append`` returns, the waiting read has returned the record. Before, the read's
    wait resumed two steps of the event loop after the appender, behind whatever ran in
    those steps (the next WAL write, an upload, a fence check)."""
    async with backends.client() as client:
        stream = await client.create_stream("waiting")
        await stream.append([Record(b"before")])  # the stream is written here from now on
        waiting = asyncio.create_task(stream.read(start=1, wait=30.0))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not waiting.done()  # at the tail, waiting
        ack = await stream.append([Record(b"awaited")])
        assert waiting.done()
        result = waiting.result()
        assert [(record.offset, record.value) for record in result.records] == [
            (ack.start, b"awaited")
        ]
        assert result.tail == ack.end


async def test_flipped_byte_in_object_raises_corruption(tmp_path: Path) -> None:
    backends = Backends("files", tmp_path)
    async with backends.client() as client:
        stream = await client.create_stream("c")
        for base in range(0, 1000, 100):
            await stream.append([Record(value_for("c", i, 200)) for i in range(base, base + 100)])
    object_files = sorted((tmp_path / "objects").rglob("*.wso"))
    assert object_files
    target = object_files[0]
    data = bytearray(target.read_bytes())
    data[40] ^= 0x01  # inside the first data block
    target.write_bytes(bytes(data))
    async with backends.client() as client:
        stream = await client.open_stream("c")
        with pytest.raises(CorruptionError):
            await read_all(stream)


async def test_restart_recovers_unuploaded_acknowledged_records(backends: Backends) -> None:
    config = EngineConfig(
        upload=UploadConfig(max_bytes=64 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
    )
    crashed = await backends.client(config).start()
    stream = await crashed.create_stream("r")
    for i in range(100):
        await stream.append([Record(b"%d" % i)])
    assert await crashed.metadata.list_objects(state=ObjectState.COMMITTED) == []
    # Abandon the client without close(): its WAL still holds every acknowledged record.
    restarted = await backends.client(config).start()
    assert restarted.recovery is not None and restarted.recovery.records == 100
    assert restarted.node_epoch > crashed.node_epoch
    stream = await restarted.open_stream("r")
    assert [r.value for r in await read_all(stream)] == [b"%d" % i for i in range(100)]
    await stream.append([Record(b"100")])
    await restarted.close()
    # The zombie's uploader is fenced by the newer node epoch.
    with pytest.raises(FencedError):
        await crashed.flush()


async def test_recovery_drops_already_committed_batches(backends: Backends) -> None:
    first = await backends.client().start()
    stream = await first.create_stream("d")
    for i in range(20):
        await stream.append([Record(b"%d" % i)])
    await first.flush()  # committed, and the WAL trimmed
    second = await backends.client().start()
    assert second.recovery is not None and second.recovery.records == 0
    stream = await second.open_stream("d")
    assert len(await read_all(stream)) == 20
    await second.close()


async def test_failover_takes_over_dead_nodes_wal(tmp_path: Path) -> None:
    backends = Backends("memory", tmp_path)
    config = EngineConfig(
        node_id=1,
        upload=UploadConfig(max_bytes=64 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
    )
    dead = Client(
        wal=MemoryWal(name="node1"),
        objects=backends.objects,
        metadata=backends.metadata(),
        config=config,
    )
    await dead.start()
    stream = await dead.create_stream("f")
    for i in range(10):
        await stream.append([Record(b"%d" % i)])
    survivor = Client(
        wal=MemoryWal(name="node2"),
        objects=backends.objects,
        metadata=backends.metadata(),
        config=EngineConfig(node_id=2, compaction=CompactionConfig(enabled=False)),
    )
    await survivor.start()
    stats = await survivor.failover(1, MemoryWal(name="node1"))
    assert stats.records == 10
    # The zombie is fenced: its appends are never acknowledged.
    with pytest.raises(FencedError):
        await stream.append([Record(b"zombie")])
    taken = await survivor.open_stream("f")
    await taken.append([Record(b"10")])
    assert [r.value for r in await read_all(taken)] == [b"%d" % i for i in range(11)]
    await survivor.close()


async def test_uploads_commit_in_order_and_split_large_streams(tmp_path: Path) -> None:
    backends = Backends("memory", tmp_path)
    config = EngineConfig(
        upload=UploadConfig(
            max_bytes=256 << 10, max_interval_s=3600, split_bytes=100 << 10, max_concurrency=4
        ),
        compaction=CompactionConfig(enabled=False),
    )
    async with backends.client(config) as client:
        big = await client.create_stream("big")
        small = [await client.create_stream(f"small{i}") for i in range(3)]
        for round_ in range(20):
            await big.append([Record(bytes(4096)) for _ in range(8)])
            for stream in small:
                await stream.append([Record(b"s%d" % round_)])
        await client.flush()
        objects = await client.metadata.list_objects(state=ObjectState.COMMITTED)
        kinds = {info.kind for info in objects}
        assert ObjectKind.STREAM in kinds and ObjectKind.STREAM_SET in kinds
        for info in objects:
            if info.kind is ObjectKind.STREAM:
                assert len(info.ranges) == 1
        # committed ranges of each stream are contiguous, in commit (= id) order
        for stream in [big, *small]:
            ranges = sorted(
                (r for info in objects for r in info.ranges if r.stream_id == stream.stream_id),
                key=lambda r: r.start_offset,
            )
            assert ranges[0].start_offset == 0
            assert all(a.end_offset == b.start_offset for a, b in itertools.pairwise(ranges))


async def test_compaction_rewrites_small_objects_and_deletes_them(tmp_path: Path) -> None:
    backends = Backends("files", tmp_path)
    config = EngineConfig(
        upload=UploadConfig(max_bytes=1 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False, min_objects=2),
    )
    async with backends.client(config) as client:
        streams = [await client.create_stream(f"c{i}") for i in range(3)]
        for round_ in range(6):
            for index, stream in enumerate(streams):
                await stream.append(
                    [Record(value_for(f"c{index}", round_ * 10 + j)) for j in range(10)]
                )
            await client.flush()
        before = await client.metadata.list_objects(state=ObjectState.COMMITTED)
        assert len(before) == 6 and all(info.kind is ObjectKind.STREAM_SET for info in before)
        await streams[2].trim(30)
        assert await client.compact()
        after = await client.metadata.list_objects(state=ObjectState.COMMITTED)
        # Small streams stay together: six stream-set objects become one.
        assert [info.kind for info in after] == [ObjectKind.STREAM_SET]
        assert sorted(r.stream_id for r in after[0].ranges) == [s.stream_id for s in streams]
        keys_left = {meta.key async for meta in client.objects.list()}
        assert keys_left == {info.key for info in after}, "compacted sources must be deleted"
        for index, stream in enumerate(streams):
            start = 30 if index == 2 else 0
            records = await read_all(stream, start)
            assert [r.value for r in records] == [
                value_for(f"c{index}", i) for i in range(start, 60)
            ]


async def test_back_pressure_waits_for_uploads_then_fails_when_store_is_stuck(
    tmp_path: Path,
) -> None:
    backends = Backends("memory", tmp_path)
    config = EngineConfig(
        cache=CacheConfig(log_cache_bytes=64 << 10),
        upload=UploadConfig(max_bytes=16 << 10, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
        append_timeout_s=0.3,
    )
    async with backends.client(config) as client:
        stream = await client.create_stream("bp")
        for _ in range(64):  # 4x the cache bound: appends wait for uploads and go on
            await stream.append([Record(bytes(4000))])
        assert client._cache.unuploaded_bytes <= 64 << 10
        gate = asyncio.Event()
        original_put = client.objects.put_if_absent

        async def stuck_put(key: str, data: bytes) -> None:
            await gate.wait()
            await original_put(key, data)

        client.objects.put_if_absent = stuck_put  # type: ignore[method-assign]
        with pytest.raises(CapacityError):
            for _ in range(64):
                await stream.append([Record(bytes(4000))])
        gate.set()
        client.objects.put_if_absent = original_put  # type: ignore[method-assign]
        await client.flush()
        assert await stream.check_tail() >= 64


def test_log_cache_evicts_only_committed_blocks_fifo() -> None:
    async def scenario() -> None:
        cache = LogCache(max_bytes=100, clock=ManualClock())
        cache.active.settle(cache.add(1, 0, 0, 1, b"x" * 60, 0, 0), wal_offset=10)
        block_one = cache.seal_active()
        cache.active.settle(cache.add(1, 0, 1, 2, b"y" * 60, 0, 0), wal_offset=20)
        block_two = cache.seal_active()
        assert block_one is not None and block_two is not None
        assert block_one.last_acked_wal_offset == 10
        assert cache.total_bytes == 120
        cache.mark_committed(block_two)  # not at the front: nothing evicted
        assert cache.first_offset(1) == 0
        cache.mark_committed(block_one)
        assert cache.first_offset(1) == 1 and cache.total_bytes == 60
        assert list(cache.batches_from(1, 0)) == []
        assert [(b.base_offset, b.data) for b in cache.batches_from(1, 1)] == [(1, b"y" * 60)]

    asyncio.run(scenario())


def test_an_evicted_log_cache_block_is_freed_without_the_cyclic_collector() -> None:
    """A node holds hundreds of thousands of small cached batches; an evicted block must be
    freed by reference counting when the cache lets go of it. Were it part of a reference cycle
    (batches pointing back at their block), only the cyclic collector could free it, and its
    full passes over the cache stall the event loop for tens of milliseconds."""

    async def scenario() -> None:
        cache = LogCache(max_bytes=100, clock=ManualClock())
        for offset in range(3):
            block = cache.active
            block.settle(cache.add(1, 0, offset, offset + 1, b"x" * 60, 0, 0), offset)
            sealed = cache.seal_active()
            assert sealed is block
            if offset == 0:
                evicted = weakref.ref(block)
            del block, sealed
            cache.mark_committed(cache.blocks()[0])
        assert cache.first_offset(1) == 2
        assert evicted() is None

    collecting = gc.isenabled()
    gc.disable()
    try:
        asyncio.run(scenario())
    finally:
        if collecting:
            gc.enable()


def test_cached_batches_add_no_objects_for_the_cyclic_collector_to_walk() -> None:
    """A node caches hundreds of thousands of small batches; were each an object the cyclic
    collector tracks, every full collection would walk them all (tens of milliseconds with
    the event loop stalled, every few seconds under load). Ten thousand cached, acknowledged
    batches of several streams must leave the number of tracked objects about where it was."""

    async def scenario() -> None:
        cache = LogCache(max_bytes=1 << 30, clock=ManualClock())
        payloads = [b"%05d" % n * 20 for n in range(10_000)]
        gc.collect()
        before = len(gc.get_objects())
        for offset, payload in enumerate(payloads):
            stream_id = offset % 4
            index = cache.add(stream_id, 0, offset // 4, offset // 4 + 1, payload, 0, 0)
            cache.active.settle(index, offset)
            if offset % 2500 == 2499:
                cache.seal_active()
        gc.collect()
        grown = len(gc.get_objects()) - before
        assert grown < 200, f"{grown} more tracked objects for 10,000 cached batches"
        assert [b.data for b in cache.batches_from(3, 2498)] == payloads[-5::4]

    asyncio.run(scenario())


def test_block_cache_is_bounded_lru() -> None:
    cache: BlockCache[int, str] = BlockCache(max_bytes=100)
    for key in range(10):
        cache.put(key, f"v{key}", 30)
        assert cache.size_bytes <= 100
    assert len(cache) == 3
    assert cache.get(9) == "v9" and cache.get(0) is None
    cache.get(7)
    cache.put(10, "v10", 30)
    assert cache.get(7) == "v7" and cache.get(8) is None
    cache.put(11, "huge", 1000)
    assert cache.get(11) is None and cache.size_bytes <= 100


async def test_sequential_cold_reads_grow_readahead(tmp_path: Path) -> None:
    backends = Backends("memory", tmp_path)
    config = EngineConfig(
        cache=CacheConfig(readahead_min_bytes=64 << 10, readahead_max_bytes=4 << 20),
        upload=UploadConfig(max_bytes=16 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
    )
    async with backends.client(config) as client:
        stream = await client.create_stream("cold")
        for base in range(0, 20_000, 500):
            await stream.append(
                [Record(value_for("cold", i, 512)) for i in range(base, base + 500)]
            )
    async with backends.client(config) as client:  # a restarted node: nothing cached
        stream = await client.open_stream("cold")
        records = await read_all(stream)
        assert [r.value for r in records] == [value_for("cold", i, 512) for i in range(20_000)]
        gets = client.reader.gets
        blocks = 0
        for info in await client.metadata.list_objects(state=ObjectState.COMMITTED):
            blocks += len((await client.reader.index(info)).entries)
        assert blocks >= 10
        # read-ahead coalesces the sequential reader's blocks into fewer GETs than blocks
        assert gets < blocks


async def test_large_read_spans_objects_bigger_than_the_readahead_window(tmp_path: Path) -> None:
    backends = Backends("memory", tmp_path)
    config = EngineConfig(
        cache=CacheConfig(readahead_min_bytes=64 << 10, readahead_max_bytes=128 << 10),
        upload=UploadConfig(max_bytes=3 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
    )
    async with backends.client(config) as client:
        stream = await client.create_stream("wide")
        for base in range(0, 12_000, 500):
            await stream.append([Record(value_for("w", i, 1024)) for i in range(base, base + 500)])
    async with backends.client(config) as client:
        stream = await client.open_stream("wide")
        assert len(await client.metadata.list_objects(state=ObjectState.COMMITTED)) >= 3
        result = await stream.read(start=0, limit_records=100_000, limit_bytes=1 << 30)
        assert [r.offset for r in result.records] == list(range(12_000))
        assert all(r.value == value_for("w", r.offset, 1024) for r in result.records)


async def test_a_single_record_over_the_wal_limit_names_the_record_not_the_batch() -> None:
    client = Client(
        wal=MemoryWal(max_record_bytes=1 << 10),
        objects=MemoryObjectStore(),
        metadata=MemoryMetadataStore(),
    )
    async with client:
        stream = await client.create_stream("big")
        with pytest.raises(CapacityError, match=r"a single record of .* exceeds") as single:
            await stream.append([Record(bytes(4000))])
        assert "fewer records" not in str(single.value)
        with pytest.raises(CapacityError, match=r"batch of 8 records.*fewer records at once"):
            await stream.append([Record(bytes(200)) for _ in range(8)])
        assert await stream.check_tail() == 0


async def test_a_cancelled_append_neither_stops_the_node_nor_leaves_a_gap(
    backends: Backends,
) -> None:
    """Cancelling an append in flight (a caller's timeout, a client that went away) is the
    caller giving up on the answer, not a WAL failure: the node keeps accepting appends, and
    the cancelled batch, which the WAL may already hold, is either readable at its offsets or
    absent, never a hole or a duplicate. Before, the caller's cancellation cancelled the WAL's
    own future, which the write path took for a failed write: the node stopped accepting
    appends until restarted."""
    async with backends.client(write_delay_s=0.05) as client:
        stream = await client.create_stream("cancelled")
        await stream.append([Record(value=b"first")])
        appending = asyncio.ensure_future(stream.append([Record(value=b"cancelled")]))
        await asyncio.sleep(0.01)  # reserved and handed to the WAL, not yet durable
        appending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await appending
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(stream.append([Record(value=b"timed out")]), 0.01)
        ack = await stream.append([Record(value=b"last")])
        records = await read_all(stream)
        assert [record.offset for record in records] == list(range(len(records)))
        assert [record.value for record in records] == [
            b"first",
            b"cancelled",
            b"timed out",
            b"last",
        ]
        assert ack.start == 3 and ack.tail == 4
    async with backends.client() as reopened:
        stream = await reopened.open_stream("cancelled")
        values = [record.value for record in await read_all(stream)]
        assert values == [b"first", b"cancelled", b"timed out", b"last"]
