"""The chunk server answers a write only once it is durable: a failed sync is never acknowledged
(nor anything after it), acknowledged records survive a power cut of every server, and writes
that arrive together share one fdatasync (group commit)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import crc32c
import pytest
from walstream.errors import AmbiguousError
from walstream.wal import WalMode
from walstream.wal.quorum import encode_chunk
from walstream_conformance.harness.power import SimulatedDisk
from walstream_wal_nvme_quorum import ChunkServerReplica, NvmeQuorumWal
from walstream_wal_nvme_quorum.protocol import (
    Op,
    Status,
    encode_frame,
    pack_str,
    pack_u32,
    pack_u64,
)
from walstream_wal_nvme_quorum.server import ChunkServer
from walstream_wal_nvme_quorum.store import ChunkStore

LOG = "node-1"


class CountingIO:
    """``os`` for segment files, counting ``fdatasync`` calls; ``failing`` makes them raise EIO
    (a disk that took the writes into its cache but cannot make them durable)."""

    def __init__(self) -> None:
        self.fdatasyncs = 0
        self.failing = False

    def open(self, path: str, flags: int, mode: int = 0o777, /) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: bytes, /) -> int:
        return os.write(fd, data)

    def pread(self, fd: int, length: int, offset: int, /) -> bytes:
        return os.pread(fd, length, offset)

    def fdatasync(self, fd: int, /) -> None:
        if self.failing:
            raise OSError(errno.EIO, "simulated fdatasync failure")
        self.fdatasyncs += 1
        os.fdatasync(fd)

    def fstat(self, fd: int, /) -> os.stat_result:
        return os.fstat(fd)

    def close(self, fd: int, /) -> None:
        os.close(fd)


class _KeepNothing(random.Random):
    """A power cut that keeps none of the writes that were not synced."""

    def randint(self, a: int, b: int) -> int:
        return a


async def serve(store: ChunkStore) -> tuple[ChunkServer, str]:
    server = ChunkServer(store)
    host, port = await server.start("127.0.0.1", 0)
    return server, f"{host}:{port}"


@pytest.fixture
async def counted(tmp_path: Path) -> AsyncIterator[tuple[CountingIO, ChunkStore, str]]:
    io = CountingIO()
    store = ChunkStore(tmp_path / "chunkd", io=io)
    store.open()
    server, address = await serve(store)
    yield io, store, address
    await server.stop()
    try:
        store.close()
    except OSError:
        pass


async def test_a_write_whose_sync_failed_is_not_acknowledged_nor_anything_after_it(
    counted: tuple[CountingIO, ChunkStore, str],
) -> None:
    io, _, address = counted
    replica = ChunkServerReplica(address)
    await replica.write_chunk(LOG, 1, 1, encode_chunk([b"durable"]))
    io.failing = True
    with pytest.raises(AmbiguousError, match="fdatasync"):
        await replica.write_chunk(LOG, 1, 2, encode_chunk([b"never synced"]))
    # A later sync that works proves nothing about the pages of the failed one: the server
    # acknowledges nothing until a restart replays what is really on disk.
    io.failing = False
    with pytest.raises(AmbiguousError, match="restart"):
        await replica.write_chunk(LOG, 1, 3, encode_chunk([b"after the failure"]))
    with pytest.raises(AmbiguousError, match="restart"):
        await replica.list_chunks(LOG)
    await replica.close()


async def test_writes_that_arrive_together_share_one_fdatasync(
    counted: tuple[CountingIO, ChunkStore, str],
) -> None:
    io, store, address = counted
    reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
    before = io.fdatasyncs
    frames = []
    for seq in range(1, 21):
        data = encode_chunk([f"chunk {seq}".encode()])
        body = pack_str(LOG) + pack_u64(1, seq) + pack_u32(crc32c.crc32c(data)) + data
        frames.append(encode_frame(Op.WRITE, seq, body))
    writer.write(b"".join(frames))  # one TCP write: the server reads them in one turn
    answered = set()
    for _ in frames:
        (length,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 5))
        payload = await asyncio.wait_for(reader.readexactly(length), 5)
        status, request_id = payload[0], int.from_bytes(payload[1:5], "big")
        assert status == Status.OK
        answered.add(request_id)
    assert answered == set(range(1, 21))
    assert sorted(store.listing(LOG).chunks) == list(range(1, 21))
    assert 1 <= io.fdatasyncs - before <= 2, "each write paid its own fdatasync"
    writer.close()


async def test_acknowledged_records_survive_a_power_cut_of_every_server(tmp_path: Path) -> None:
    folders = [tmp_path / f"chunkd-{index}" for index in range(3)]
    disks = [SimulatedDisk(_KeepNothing()) for _ in folders]
    stores = [ChunkStore(folder, io=disk) for folder, disk in zip(folders, disks, strict=True)]
    running = []
    for store in stores:
        store.open()
        running.append(await serve(store))
    wal = NvmeQuorumWal(
        [ChunkServerReplica(address) for _, address in running],
        log_id=LOG,
        request_timeout_s=1.0,
        write_timeout_s=3.0,
    )
    await wal.start(1, 1, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    acked: dict[int, bytes] = {}

    async def appender(index: int) -> None:
        for round_index in range(12):
            payload = f"appender {index} round {round_index} ".encode() * 20
            acked[await wal.append(payload)] = payload

    # 32 appenders: several chunks in flight at once, each server syncing groups of them.
    await asyncio.gather(*(appender(index) for index in range(32)))
    for disk in disks:  # at once: nothing more reaches the disks after the last acknowledgement
        disk.lose_power()
    for server, _ in running:
        await server.stop()
    await wal.close()

    restarted = []
    for folder in folders:
        store = ChunkStore(folder)
        store.open()
        restarted.append((store, *(await serve(store))))
    try:
        wal = NvmeQuorumWal(
            [ChunkServerReplica(address) for _, _, address in restarted],
            log_id=LOG,
            request_timeout_s=1.0,
            write_timeout_s=3.0,
        )
        await wal.start(1, 2, WalMode.READ_WRITE)
        recovered = {record.offset: record.data async for record in wal.recover()}
        await wal.close()
    finally:
        for store, server, _ in restarted:
            await server.stop()
            store.close()
    assert len(acked) == 32 * 12
    assert {offset: recovered.get(offset) for offset in acked} == acked


async def test_a_connection_over_its_request_limit_pauses_and_resumes(
    counted: tuple[CountingIO, ChunkStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from walstream_wal_nvme_quorum import server as chunkd

    monkeypatch.setattr(chunkd, "MAX_REQUESTS_PER_CONNECTION", 1)
    _, store, address = counted
    replica = ChunkServerReplica(address)
    chunks = {seq: encode_chunk([f"chunk {seq}".encode()]) for seq in range(1, 31)}
    writes = [replica.write_chunk(LOG, 1, seq, data) for seq, data in chunks.items()]
    await asyncio.wait_for(asyncio.gather(*writes), 10)
    assert sorted(store.listing(LOG).chunks) == list(chunks)
    await replica.close()


async def test_a_frame_that_stalls_half_way_is_refused_and_its_connection_closed(
    counted: tuple[CountingIO, ChunkStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from walstream_wal_nvme_quorum import server as chunkd

    monkeypatch.setattr(chunkd, "FRAME_READ_TIMEOUT_S", 0.05)
    _, _, address = counted
    reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
    frame = encode_frame(Op.PING, 3)
    writer.write(frame[:-2])
    (length,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 5))
    payload = await asyncio.wait_for(reader.readexactly(length), 5)
    assert payload[0] == Status.BAD_REQUEST and b"truncated" in payload
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
