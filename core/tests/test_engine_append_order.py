"""Appends to one stream keep the order in which they began, also when they are pipelined (a
caller, an S2 append session or a Kafka producer submits the next append before the previous one
is acknowledged) and one of them has to wait: to claim the stream, or for room under the bound
of bytes not yet uploaded.

Each test stages the race deterministically: the wait is an injected pause (a gated claim or a
gated upload), and the overtaking append is submitted by the WAL at the moment the waiting
append reaches it, which is the one step in which the stream's lock reads as free while the
next waiter has not run yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from walstream import Client, EngineConfig, Record
from walstream.config import CacheConfig, CompactionConfig, UploadConfig
from walstream.metadata.contract import StreamInfo
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.records import AppendAck
from walstream.wal.memory import MemoryWal


class PipeliningWal(MemoryWal):
    """A WAL that runs ``on_next_append`` (once) when it is handed a record: the moment the
    engine submits an append, a pipelined caller submits its next one."""

    on_next_append: Callable[[], None] | None = None

    def append(self, data: bytes) -> asyncio.Future[int]:
        future = super().append(data)
        hook, self.on_next_append = self.on_next_append, None
        if hook is not None:
            hook()
        return future


class GatedClaims(MemoryMetadataStore):
    """A metadata store whose stream claims wait for ``claims_open``."""

    def __init__(self) -> None:
        super().__init__()
        self.claims_open = asyncio.Event()
        self.claim_waiting = asyncio.Event()

    async def claim_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        self.claim_waiting.set()
        await self.claims_open.wait()
        return await super().claim_stream(stream_id, node_id, node_epoch)


class GatedUploads(MemoryObjectStore):
    """An object store whose writes wait for ``uploads_open`` while it is clear."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads_open = asyncio.Event()
        self.uploads_open.set()
        self.upload_waiting = asyncio.Event()

    async def put_if_absent(self, key: str, data: bytes) -> None:
        if not self.uploads_open.is_set():
            self.upload_waiting.set()
            await self.uploads_open.wait()
        await super().put_if_absent(key, data)

    async def put(self, key: str, data: bytes) -> None:
        if not self.uploads_open.is_set():
            self.upload_waiting.set()
            await self.uploads_open.wait()
        await super().put(key, data)


async def settle_loop(steps: int = 20) -> None:
    """Let every task that can run do so (no I/O involved: a fixed number of loop steps)."""
    for _ in range(steps):
        await asyncio.sleep(0)


def labels_in_offset_order(acks: dict[str, AppendAck]) -> list[str]:
    return [label for label, _ in sorted(acks.items(), key=lambda item: item[1].start)]


async def test_appends_queued_behind_a_claim_keep_their_order_against_a_pipelined_append() -> None:
    wal = PipeliningWal()
    metadata = GatedClaims()
    config = EngineConfig(compaction=CompactionConfig(enabled=False))
    async with Client(wal=wal, objects=MemoryObjectStore(), metadata=metadata, config=config) as c:
        stream = await c.create_stream("ordered")
        acks: dict[str, AppendAck] = {}

        async def append(label: str) -> None:
            acks[label] = await stream.append([Record(label.encode())])

        tasks = [asyncio.ensure_future(append("first"))]  # claims the stream: waits at the gate
        await metadata.claim_waiting.wait()
        tasks.append(asyncio.ensure_future(append("second")))  # queued behind the claim
        tasks.append(asyncio.ensure_future(append("third")))  # queued behind the second
        await settle_loop()
        # When the first append reaches the WAL, the caller pipelines its next one.
        wal.on_next_append = lambda: tasks.append(asyncio.ensure_future(append("fourth")))
        metadata.claims_open.set()
        await asyncio.gather(*tasks)

        assert labels_in_offset_order(acks) == ["first", "second", "third", "fourth"]
        records = (await stream.read(start=0)).records
        assert [r.value for r in records] == [b"first", b"second", b"third", b"fourth"]


async def test_appends_waiting_for_upload_room_keep_their_order_against_a_pipelined_append() -> None:
    wal = PipeliningWal()
    objects = GatedUploads()
    config = EngineConfig(
        cache=CacheConfig(log_cache_bytes=64 << 10),
        upload=UploadConfig(max_bytes=16 << 10, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
        append_timeout_s=30,
    )
    async with Client(wal=wal, objects=objects, metadata=MemoryMetadataStore(), config=config) as c:
        stream = await c.create_stream("ordered")
        await stream.append([Record(b"claimed")])
        objects.uploads_open.clear()
        filler = bytes(20 << 10)
        while c._cache.unuploaded_bytes + len(filler) + 100 <= 64 << 10:
            await stream.append([Record(filler)])  # fill the bound while uploads are stuck
        acks: dict[str, AppendAck] = {}

        async def append(label: str) -> None:
            acks[label] = await stream.append([Record(label.encode() + filler)])

        tasks = [asyncio.ensure_future(append("first"))]  # no room: waits for an upload
        await objects.upload_waiting.wait()
        tasks.append(asyncio.ensure_future(append("second")))  # queued behind the first
        await settle_loop()
        assert not acks, "both appends must still be waiting for room"
        wal.on_next_append = lambda: tasks.append(asyncio.ensure_future(append("third")))
        objects.uploads_open.set()
        await asyncio.gather(*tasks)

        assert labels_in_offset_order(acks) == ["first", "second", "third"]
        tail = await stream.check_tail()
        records = (await stream.read(start=tail - 3)).records
        assert [r.value[: len(b"second")].rstrip(b"\0") for r in records] == [
            b"first",
            b"second",
            b"third",
        ]


async def test_many_pipelined_appends_are_stored_and_acknowledged_in_submission_order() -> None:
    """A caller that submits 200 appends without awaiting each, while uploads stall now and
    then (so some appends wait for room and every later one queues behind them)."""
    objects = GatedUploads()
    config = EngineConfig(
        cache=CacheConfig(log_cache_bytes=64 << 10),
        upload=UploadConfig(max_bytes=16 << 10, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
        append_timeout_s=30,
    )
    async with Client(
        wal=MemoryWal(), objects=objects, metadata=MemoryMetadataStore(), config=config
    ) as c:
        stream = await c.create_stream("pipelined")
        acknowledged: list[int] = []

        async def append(index: int) -> AppendAck:
            ack = await stream.append([Record(index.to_bytes(4, "big") + bytes(3000))])
            acknowledged.append(index)
            return ack

        tasks = []
        for index in range(200):
            if index % 50 == 10:
                objects.uploads_open.clear()
            if index % 50 == 30:
                objects.uploads_open.set()
            tasks.append(asyncio.ensure_future(append(index)))
            if index % 7 == 0:
                await asyncio.sleep(0)
        objects.uploads_open.set()
        acks = await asyncio.gather(*tasks)

        assert [ack.start for ack in acks] == list(range(200))
        assert acknowledged == list(range(200))
        records = []
        while len(records) < 200:
            records += (await stream.read(start=len(records))).records
        assert [int.from_bytes(r.value[:4], "big") for r in records] == list(range(200))
