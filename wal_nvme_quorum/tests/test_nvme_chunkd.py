"""The chunk server process: refusing bad frames while serving, epochs, torn tails, segments."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from walstream.errors import FencedError, NotFound, PreconditionFailed
from walstream.wal.quorum import encode_chunk
from walstream_wal_nvme_quorum import ChunkServerReplica
from walstream_wal_nvme_quorum.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    Op,
    Status,
    encode_frame,
    pack_str,
    pack_u64,
    parse_frame,
)
from walstream_wal_nvme_quorum.testing import ChunkServerProcess

LOG = "node-9"


async def restart(server: ChunkServerProcess) -> None:
    """SIGKILL and start again; then let clients notice their old connection closed (the
    synchronous restart blocked the event loop meanwhile)."""
    server.kill()
    server.start()
    await asyncio.sleep(0.1)


class RawClient:
    """Speaks raw frames to a server, to send what a well-behaved client never would."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, server: ChunkServerProcess) -> RawClient:
        return cls(*await asyncio.open_connection("127.0.0.1", server.port))

    async def send(self, raw: bytes) -> None:
        self.writer.write(raw)
        await self.writer.drain()

    async def reply(self) -> tuple[int, int, bytes]:
        (length,) = struct.unpack(">I", await asyncio.wait_for(self.reader.readexactly(4), 5))
        frame = parse_frame(await asyncio.wait_for(self.reader.readexactly(length), 5))
        return frame.code, frame.request_id, frame.body

    async def ping(self, request_id: int = 77) -> None:
        await self.send(encode_frame(Op.PING, request_id))
        assert await self.reply() == (Status.OK, request_id, b"")

    async def close(self) -> None:
        self.writer.close()


@pytest.mark.slow
async def test_malformed_frames_refused_and_serving_continues(
    chunk_servers: list[ChunkServerProcess],
) -> None:
    server = chunk_servers[0]
    client = await RawClient.connect(server)
    # bad checksum: refused, the connection stays usable
    damaged = bytearray(encode_frame(Op.PING, 5))
    damaged[-1] ^= 0xFF
    await client.send(bytes(damaged))
    status, _, body = await client.reply()
    assert status == Status.BAD_REQUEST and b"checksum" in body
    await client.ping()
    # unknown operation
    await client.send(encode_frame(99, 6))
    assert (await client.reply())[:2] == (Status.BAD_REQUEST, 6)
    # a body too short for its fields
    await client.send(encode_frame(Op.WRITE, 7, pack_str(LOG) + b"\x00\x01"))
    assert (await client.reply())[:2] == (Status.BAD_REQUEST, 7)
    # a frame shorter than the minimum
    await client.send(struct.pack(">I", 3) + b"abc")
    assert (await client.reply())[0] == Status.BAD_REQUEST
    await client.close()

    # oversized length: refused and that connection closed; others keep working
    oversized = await RawClient.connect(server)
    await oversized.send(struct.pack(">I", DEFAULT_MAX_FRAME_BYTES + 1) + b"x" * 16)
    status, _, body = await oversized.reply()
    assert status == Status.BAD_REQUEST and b"length" in body
    assert await oversized.reader.read() == b""
    # truncated: the client gives up half-way through a frame
    truncated = await RawClient.connect(server)
    frame = encode_frame(Op.PING, 8)
    await truncated.send(frame[: len(frame) - 3])
    truncated.writer.write_eof()
    assert (await truncated.reply())[0] == Status.BAD_REQUEST
    fresh = await RawClient.connect(server)
    await fresh.ping()
    await fresh.close()
    assert server.running


@pytest.mark.slow
async def test_wrong_epoch_writes_refused_and_epochs_survive_sigkill(
    chunk_servers: list[ChunkServerProcess],
) -> None:
    server = chunk_servers[0]
    replica = ChunkServerReplica(server.address)
    chunk = encode_chunk([b"one"])
    await replica.write_chunk(LOG, 3, 1, chunk)
    await replica.claim(LOG, 5)
    with pytest.raises(FencedError):
        await replica.write_chunk(LOG, 4, 2, chunk)
    with pytest.raises(FencedError):
        await replica.trim(LOG, 4, 1, 0)
    # the same (epoch, seq) with other bytes is a conflict; the same bytes are idempotent
    await replica.write_chunk(LOG, 5, 2, chunk)
    await replica.write_chunk(LOG, 5, 2, chunk)
    with pytest.raises(PreconditionFailed):
        await replica.write_chunk(LOG, 5, 2, encode_chunk([b"other"]))
    await restart(server)
    with pytest.raises(FencedError):
        await replica.write_chunk(LOG, 4, 3, chunk)
    listing = await replica.list_chunks(LOG)
    assert listing.claimed_epoch == 5
    assert {seq: info.epoch for seq, info in listing.chunks.items()} == {1: 3, 2: 5}
    assert await replica.read_chunk(LOG, 2) == (5, chunk)
    with pytest.raises(NotFound):
        await replica.read_chunk(LOG, 3)
    await replica.close()


@pytest.mark.slow
async def test_torn_tail_is_cut_after_sigkill(tmp_path: Path) -> None:
    server = ChunkServerProcess(tmp_path / "data")
    server.start()
    try:
        replica = ChunkServerReplica(server.address)
        chunks = {seq: encode_chunk([f"chunk {seq}".encode() * 50]) for seq in range(1, 11)}
        for seq, data in chunks.items():
            await replica.write_chunk(LOG, 1, seq, data)
        server.kill()
        segment = sorted((tmp_path / "data").glob("*.seg"))[-1]
        intact_size = segment.stat().st_size
        with open(segment, "ab") as file:  # a record header promising more than was written
            file.write(struct.pack(">BI", 1, 5000) + b"partial")
        server.start()
        await asyncio.sleep(0.1)
        assert segment.stat().st_size == intact_size
        listing = await replica.list_chunks(LOG)
        assert sorted(listing.chunks) == list(chunks)
        for seq, data in chunks.items():
            assert await replica.read_chunk(LOG, seq) == (1, data)
        await replica.write_chunk(LOG, 1, 11, encode_chunk([b"after restart"]))
        await restart(server)
        assert sorted((await replica.list_chunks(LOG)).chunks) == list(range(1, 12))
        await replica.close()
    finally:
        server.stop()


@pytest.mark.slow
async def test_damage_before_the_tail_is_skipped_and_the_rest_served(tmp_path: Path) -> None:
    server = ChunkServerProcess(tmp_path / "data", segment_bytes=2048)
    server.start()
    try:
        replica = ChunkServerReplica(server.address)
        chunks = {seq: encode_chunk([bytes([seq]) * 1000]) for seq in range(1, 8)}
        for seq, data in chunks.items():
            await replica.write_chunk(LOG, 1, seq, data)
        await replica.claim(LOG, 2)
        server.kill()
        first = sorted((tmp_path / "data").glob("*.seg"))[0]
        data = bytearray(first.read_bytes())
        damaged_at = data.index(bytes([1]) * 1000) + 500  # inside chunk 1's bytes
        data[damaged_at] ^= 0xFF
        first.write_bytes(bytes(data))
        server.start()
        await asyncio.sleep(0.1)
        listing = await replica.list_chunks(LOG)
        # Only the damaged record is lost on this server; the quorum repairs it from the peers.
        assert sorted(listing.chunks) == [2, 3, 4, 5, 6, 7]
        assert listing.claimed_epoch == 2
        # It lost a record it had made durable: it says so until a recovery seals the log.
        assert listing.incomplete
        await replica.seal(LOG, 2, 7)
        assert not (await replica.list_chunks(LOG)).incomplete
        for seq in range(2, 8):
            assert await replica.read_chunk(LOG, seq) == (1, chunks[seq])
        await replica.close()
    finally:
        server.stop()


@pytest.mark.slow
async def test_segments_rotate_and_trim_deletes_them(tmp_path: Path) -> None:
    server = ChunkServerProcess(tmp_path / "data", segment_bytes=4096)
    server.start()
    try:
        replica = ChunkServerReplica(server.address)
        for seq in range(1, 41):
            await replica.write_chunk(LOG, 1, seq, encode_chunk([bytes([seq]) * 1000]))
        before = len(list((tmp_path / "data").glob("*.seg")))
        assert before >= 8
        await replica.trim(LOG, 1, 35, 35)
        after = len(list((tmp_path / "data").glob("*.seg")))
        assert after <= 3
        await restart(server)
        listing = await replica.list_chunks(LOG)
        assert (listing.trim_seq, listing.trim_offset) == (35, 35)
        assert sorted(listing.chunks) == list(range(36, 41))
        # the trim point only moves forward, also across restarts
        await replica.trim(LOG, 1, 10, 10)
        assert (await replica.list_chunks(LOG)).trim_seq == 35
        with pytest.raises(FencedError):
            await replica.write_chunk(LOG, 0, 41, encode_chunk([b"old epoch"]))
        await replica.close()
    finally:
        server.stop()


async def test_token_required_when_configured(tmp_path: Path) -> None:
    server = ChunkServerProcess(tmp_path / "data", token="s3cret")
    server.start()
    try:
        anonymous = await RawClient.connect(server)
        await anonymous.send(encode_frame(Op.LIST, 1, pack_str(LOG)))
        assert (await anonymous.reply())[0] == Status.UNAUTHORIZED
        await anonymous.close()
        wrong = ChunkServerReplica(server.address, token="nope")
        with pytest.raises(Exception, match="token"):
            await wrong.list_chunks(LOG)
        await wrong.close()
        right = ChunkServerReplica(server.address, token="s3cret")
        await right.write_chunk(LOG, 1, 1, encode_chunk([b"ok"]))
        assert (await right.read_chunk(LOG, 1))[1] == encode_chunk([b"ok"])
        await right.close()
    finally:
        server.stop()


@pytest.mark.slow
async def test_claim_listing_reflects_seal(chunk_servers: list[ChunkServerProcess]) -> None:
    replica = ChunkServerReplica(chunk_servers[1].address)
    for seq in range(1, 6):
        await replica.write_chunk(LOG, 1, seq, encode_chunk([bytes([seq])]))
    await replica.seal(LOG, 2, 3)  # chunks 4 and 5 of epoch 1 are beyond the seal
    listing = await replica.claim(LOG, 2)
    assert sorted(listing.chunks) == [1, 2, 3]
    assert [(seal.epoch, seal.end_seq) for seal in listing.seals] == [(2, 3)]
    raw = await RawClient.connect(chunk_servers[1])
    await raw.send(encode_frame(Op.READ, 4, pack_str(LOG) + pack_u64(4)))
    assert (await raw.reply())[0] == Status.NOT_FOUND
    await raw.close()
    await replica.close()
