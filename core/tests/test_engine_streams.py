"""The node gate and its failure latch (engine/streams.py): a node that lost a WAL append stops
accepting writes with a typed error naming the cause, and keeps serving what was acknowledged."""

from __future__ import annotations

import asyncio
import os

import pytest
from walstream import BackendUnavailable, Client, FencedError, InvalidArgument, Record
from walstream.engine.streams import NodeGate
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal


class LosingWal(MemoryWal):
    """A WAL whose appends fail (asynchronously, like a lost device) once ``losing`` is set."""

    losing = False

    def append(self, data: bytes) -> asyncio.Future[int]:
        if not self.losing:
            return super().append(data)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        loop.call_soon(future.set_exception, BackendUnavailable("the WAL device went away"))
        return future


class RefusingWal(MemoryWal):
    """A WAL that refuses one append on the spot (raising from ``append`` itself), as a fenced or
    failed group-commit WAL does."""

    refuse = False

    def append(self, data: bytes) -> asyncio.Future[int]:
        if self.refuse:
            self.refuse = False  # only once: the node must stay stopped anyway
            raise FencedError("the WAL was claimed by a newer epoch")
        return super().append(data)


def test_gate_refuses_before_start_and_after_close() -> None:
    gate = NodeGate(7)
    with pytest.raises(InvalidArgument, match=r"start\(\) the client first"):
        gate.check_open()
    gate.started = True
    gate.check_open()
    gate.closed = True
    with pytest.raises(InvalidArgument, match="the client is closed"):
        gate.check_open()


def test_the_first_failure_is_latched_and_named_in_every_refusal() -> None:
    gate = NodeGate(7)
    gate.raise_if_failed()  # healthy
    first = BackendUnavailable("upload failed")
    gate.latch(first)
    gate.latch(FencedError("newer epoch"))
    assert gate.failure is first
    with pytest.raises(BackendUnavailable, match=r"node 7 stopped accepting writes.*upload failed"):
        gate.raise_if_failed()

    fenced = NodeGate(8)
    fenced.latch(FencedError("node epoch 3 is newer"))
    with pytest.raises(FencedError, match="node 8 was fenced: node epoch 3 is newer"):
        fenced.raise_if_failed()


async def test_a_lost_wal_append_stops_writes_but_not_reads() -> None:
    name = f"latch-{os.urandom(4).hex()}"
    wal = LosingWal(name=name)
    client = Client(wal=wal, objects=MemoryObjectStore(), metadata=MemoryMetadataStore(name=name))
    async with client:
        stream = await client.create_stream("s")
        await stream.append([Record(b"kept")])
        assert client.failure is None
        wal.losing = True
        with pytest.raises(BackendUnavailable, match="the WAL device went away"):
            await stream.append([Record(b"lost")])
        assert isinstance(client.failure, BackendUnavailable)
        wal.losing = False  # the node must stay stopped even if the device comes back
        with pytest.raises(BackendUnavailable, match="restart the client"):
            await stream.append([Record(b"refused")])
        with pytest.raises(BackendUnavailable, match="stopped accepting writes"):
            await stream.trim(0)
        result = await stream.read(start=0)
        assert [record.value for record in result.records] == [b"kept"]
        assert await stream.check_tail() == 1


async def test_a_wal_refusing_an_append_on_the_spot_stops_writes_and_settles_the_batch() -> None:
    name = f"refuse-{os.urandom(4).hex()}"
    wal = RefusingWal(name=name)
    client = Client(wal=wal, objects=MemoryObjectStore(), metadata=MemoryMetadataStore(name=name))

    async def scenario() -> None:
        async with client:
            stream = await client.create_stream("s")
            await stream.append([Record(b"kept")])
            wal.refuse = True
            with pytest.raises(FencedError, match="claimed by a newer epoch"):
                await stream.append([Record(b"refused")])
            # The WAL would take the next one, but the node stopped writing: no second batch
            # may reuse the offsets of the refused one.
            with pytest.raises(FencedError, match="node 1 was fenced"):
                await stream.append([Record(b"after")])
            result = await stream.read(start=0)
            assert [record.value for record in result.records] == [b"kept"]

    # close() must return: nothing may wait forever on the refused batch.
    await asyncio.wait_for(scenario(), 30)
