"""Claims are batched: first appends to many streams at once share a few claim transactions,
every stream is still claimed (epoch bumped, owned here) before its first acknowledgement, a
stream the batch may not claim fails alone with the error a single claim gives, and a node
restarted after a crash takes back the streams it owns at start instead of one claim per stream
at its next appends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

import pytest
from walstream import Client, EngineConfig, Record
from walstream.config import CompactionConfig, UploadConfig
from walstream.errors import FencedError
from walstream.metadata.contract import StreamInfo
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal

CONFIG = EngineConfig(
    upload=UploadConfig(max_interval_s=3600), compaction=CompactionConfig(enabled=False)
)


class CountedClaims(MemoryMetadataStore):
    """The memory store, counting claim transactions."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.transactions = 0

    async def claim_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        self.transactions += 1
        await asyncio.sleep(0)  # a real store's round trip: later claims gather meanwhile
        return await super().claim_stream(stream_id, node_id, node_epoch)

    async def claim_streams(
        self, stream_ids: Sequence[int], node_id: int, node_epoch: int
    ) -> dict[int, StreamInfo]:
        self.transactions += 1
        await asyncio.sleep(0)
        return await super().claim_streams(stream_ids, node_id, node_epoch)


async def test_first_appends_to_many_streams_share_claim_transactions() -> None:
    metadata = CountedClaims()
    async with Client(
        wal=MemoryWal(), objects=MemoryObjectStore(), metadata=metadata, config=CONFIG
    ) as client:
        streams = await client.create_streams([f"s{i:03d}" for i in range(300)])
        other = await metadata.register_node(99, {"type": "memory"})
        taken = streams[17]
        await metadata.claim_stream(taken.stream_id, 99, other.node_epoch)  # a running node's
        before = metadata.transactions
        results = await asyncio.gather(
            *(stream.append([Record(b"first")]) for stream in streams), return_exceptions=True
        )
        assert metadata.transactions - before <= 10, metadata.transactions - before
        refused = results[17]
        assert isinstance(refused, FencedError) and "node 99" in str(refused)
        for index, result in enumerate(results):
            if index == 17:
                continue
            assert not isinstance(result, BaseException), result
            assert (result.start, result.end) == (0, 1)
        for stream in streams:
            info = await metadata.get_stream(stream.stream_id)
            if stream is taken:
                assert (info.owner_node_id, info.epoch) == (99, 1)
            else:
                assert (info.owner_node_id, info.epoch) == (client.node_id, 1)


async def test_a_restart_after_a_crash_takes_its_streams_back_at_once() -> None:
    name = f"claims-{os.getpid()}-{os.urandom(4).hex()}"

    def parts() -> dict[str, object]:
        return {
            "wal": MemoryWal(name=name),
            "objects": MemoryObjectStore(name=name),
            "metadata": CountedClaims(name=name),
            "config": CONFIG,
        }

    async def write() -> list[int]:
        client = Client(**parts())  # type: ignore[arg-type]
        await client.start()
        streams = await client.create_streams([f"r{i:02d}" for i in range(40)])
        for stream in streams:
            await stream.append([Record(b"before")])
        return [stream.stream_id for stream in streams]  # crash: never closed

    ids = await asyncio.create_task(asyncio.to_thread(asyncio.run, write()))
    pieces = parts()
    metadata = pieces["metadata"]
    assert isinstance(metadata, CountedClaims)
    async with Client(**pieces) as client:  # type: ignore[arg-type]
        for stream_id in ids:
            info = await metadata.get_stream(stream_id)
            assert (info.owner_node_id, info.epoch) == (client.node_id, 2), info
        metadata.transactions = 0
        for stream_id in ids:
            stream = await client.open_stream(stream_id)
            ack = await stream.append([Record(b"after")])
            assert (ack.start, ack.end) == (1, 2)
        assert metadata.transactions == 0, "an adopted stream was claimed again"
        stream = await client.open_stream(ids[5])
        result = await stream.read(start=0, limit_records=10)
        assert [r.value for r in result.records] == [b"before", b"after"]


@pytest.mark.parametrize("count", [1, 2])
async def test_a_batch_failure_reaches_every_waiter(count: int) -> None:
    class Broken(CountedClaims):
        async def claim_streams(
            self, stream_ids: Sequence[int], node_id: int, node_epoch: int
        ) -> dict[int, StreamInfo]:
            raise FencedError("planted: the batch failed")

        async def claim_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
            raise FencedError("planted: the claim failed")

    metadata = Broken()
    async with Client(
        wal=MemoryWal(), objects=MemoryObjectStore(), metadata=metadata, config=CONFIG
    ) as client:
        streams = await client.create_streams([f"b{i}" for i in range(count)])
        results = await asyncio.gather(
            *(stream.append([Record(b"x")]) for stream in streams), return_exceptions=True
        )
        assert all(isinstance(r, FencedError) and "planted" in str(r) for r in results), results
