"""The chunk-server client against a scripted server: replies are matched to their requests by
id whatever their order, and a damaged reply fails what is in flight as ambiguous."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from walstream.errors import AmbiguousError, PreconditionFailed
from walstream.wal.quorum import encode_chunk
from walstream_wal_nvme_quorum import ChunkServerReplica
from walstream_wal_nvme_quorum.protocol import Op, Status, encode_frame, parse_frame

LOG = "node-1"

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[int, int]:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    frame = parse_frame(await reader.readexactly(length))
    return frame.code, frame.request_id


async def request_ids(reader: asyncio.StreamReader) -> AsyncIterator[int]:
    """The id of each request the client sends, until it closes the connection."""
    while True:
        try:
            _, request_id = await read_request(reader)
        except asyncio.IncompleteReadError:
            return
        yield request_id


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[Script], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> str:
        server = await asyncio.start_server(script, "127.0.0.1", 0)
        servers.append(server)
        host, port = server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    yield start
    for server in servers:
        server.close()


async def test_replies_in_another_order_settle_their_own_requests(
    scripted: Callable[[Script], Awaitable[str]],
) -> None:
    async def answer_backwards(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await read_request(reader)
        second = await read_request(reader)
        assert first[0] == second[0] == Op.WRITE
        # both replies in one segment, the later request's first
        writer.write(
            encode_frame(Status.OK, second[1])
            + encode_frame(Status.CONFLICT, first[1], b"other bytes")
        )
        await writer.drain()
        await reader.read()

    replica = ChunkServerReplica(await scripted(answer_backwards))
    first = asyncio.ensure_future(replica.write_chunk(LOG, 1, 1, encode_chunk([b"first"])))
    await asyncio.sleep(0.05)  # the first request leaves first
    second = asyncio.ensure_future(replica.write_chunk(LOG, 1, 2, encode_chunk([b"second"])))
    assert await asyncio.wait_for(second, 5) is None
    with pytest.raises(PreconditionFailed, match="other bytes"):
        await asyncio.wait_for(first, 5)
    await replica.close()


async def test_a_damaged_reply_fails_the_request_as_ambiguous_and_the_client_reconnects(
    scripted: Callable[[Script], Awaitable[str]],
) -> None:
    connections = 0

    async def damage_the_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        async for request_id in request_ids(reader):
            reply = bytearray(encode_frame(Status.OK, request_id))
            if connections == 1:
                reply[-1] ^= 0xFF
            writer.write(bytes(reply))
            await writer.drain()

    replica = ChunkServerReplica(await scripted(damage_the_first))
    with pytest.raises(AmbiguousError, match="damaged reply"):
        await asyncio.wait_for(replica.ping(), 5)
    await asyncio.wait_for(replica.ping(), 5)
    assert connections == 2
    await replica.close()


async def test_a_reply_split_across_segments_is_joined_and_an_impossible_length_is_refused(
    scripted: Callable[[Script], Awaitable[str]],
) -> None:
    connections = 0

    async def split_then_garble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        async for request_id in request_ids(reader):
            reply = encode_frame(Status.OK, request_id)
            if connections == 1:
                # one reply in three segments, the length prefix itself cut in two
                for piece in (reply[:2], reply[2:7], reply[7:]):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.02)
            else:
                writer.write(struct.pack(">I", 2) + reply[4:])  # shorter than any frame
                await writer.drain()

    replica = ChunkServerReplica(await scripted(split_then_garble))
    await asyncio.wait_for(replica.ping(), 5)
    await asyncio.wait_for(replica.ping(), 5)
    assert connections == 1
    await replica.close()
    replica = ChunkServerReplica(await scripted(split_then_garble))
    with pytest.raises(AmbiguousError, match="impossible length 2"):
        await asyncio.wait_for(replica.ping(), 5)
    await replica.close()
