"""The paged index of format 3: a cold read of one stream fetches the footer, the top index and
the stream's pages instead of the whole index; damage in the top index or a page is reported as
CorruptionError, never skipped; objects of formats 1 and 2 are read as before."""

from __future__ import annotations

import os

import pytest
from walstream import Client, EngineConfig, Record
from walstream.config import CompactionConfig, UploadConfig
from walstream.engine.object_reader import WHOLE_INDEX_BYTES, ObjectReader
from walstream.errors import CorruptionError
from walstream.format.batch import encode_batch
from walstream.format.object import (
    FOOTER_SIZE,
    ObjectIdentity,
    parse_index,
    parse_index_top,
)
from walstream.format.object_builder import BuiltObject, ObjectBuilder
from walstream.metadata import ObjectKind, ObjectState
from walstream.metadata.contract import ObjectInfo, StreamRange
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal
from walstream_conformance.faults import FaultyObjectStore

DEPLOYMENT = bytes(range(16))
OBJECT_ID = 9
STREAMS = 3000


class Counting(FaultyObjectStore):
    def __init__(self, inner: MemoryObjectStore) -> None:
        super().__init__(inner)
        self.bytes_read = 0

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await super().get(key, start, end)
        self.bytes_read += len(data)
        return data


def shared_object(version: int = 3, streams: int = STREAMS) -> BuiltObject:
    builder = ObjectBuilder(
        identity=ObjectIdentity(DEPLOYMENT, OBJECT_ID), format_version=version
    )
    for stream_id in range(1, streams + 1):
        builder.add_batch(encode_batch(stream_id, 1, 0, [Record(b"v%d" % stream_id)], [0]))
    return builder.finish()


async def stored(built: BuiltObject) -> tuple[Counting, ObjectReader, ObjectInfo]:
    store = Counting(MemoryObjectStore())
    await store.put("shared.wso", built.data)
    reader = ObjectReader(store, MemoryMetadataStore(), deployment_id=DEPLOYMENT)
    info = ObjectInfo(
        OBJECT_ID,
        "shared.wso",
        ObjectKind.STREAM_SET,
        ObjectState.COMMITTED,
        len(built.data),
        built.index_size,
        tuple(StreamRange(s, 0, 1) for s in range(1, STREAMS + 1)),
    )
    return store, reader, info


async def test_a_cold_lookup_reads_the_top_index_and_one_page_not_the_whole_index() -> None:
    built = shared_object()
    assert built.index_size > 4 * WHOLE_INDEX_BYTES
    store, reader, info = await stored(built)
    index = await reader.index(info, 1234)
    (entry,) = index.blocks_for(1234, 0)
    assert (entry.stream_id, entry.start_offset, entry.end_offset) == (1234, 0, 1)
    # Footer and top index (24 bytes a page of 128 entries), then one or two pages.
    assert store.bytes_read < built.index_size // 10
    assert index.partial and index.covers(1234) and not index.covers(2999)
    # Another stream adds its page to the cached partial index.
    before = store.bytes_read
    (entry,) = (await reader.index(info, 2999)).blocks_for(2999, 0)
    assert entry.stream_id == 2999
    assert store.bytes_read - before <= 2 * 128 * 36
    assert await reader.index(info, 1234) is index  # cached: no GET
    whole = parse_index(built.data, len(built.data))
    for stream_id in (1, 128, 129, 2999, 3000):
        assert (await reader.index(info, stream_id)).blocks_for(stream_id, 0) == whole.blocks_for(
            stream_id, 0
        )


async def test_objects_of_format_2_are_read_whole_as_before() -> None:
    built = shared_object(version=2)
    store, reader, info = await stored(built)
    index = await reader.index(info, 1234)
    assert not index.partial and index.version == 2
    assert index.blocks_for(1234, 0)[0].stream_id == 1234
    assert store.bytes_read >= built.index_size


def flip(data: bytes, position: int) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= 0x40
    return bytes(damaged)


async def test_a_damaged_page_is_corruption_for_its_streams_only() -> None:
    built = shared_object()
    index_position = len(built.data) - built.index_size
    # Entry 1 (stream 2) lies in page 0; stream 1500 in page 11.
    bad = flip(built.data, index_position + 36 + 3)
    _store, reader, info = await stored(BuiltObject(bad, built.index_size, built.slices))
    with pytest.raises(CorruptionError, match="page 0 checksum"):
        await reader.index(info, 2)
    assert (await reader.index(info, 1500)).blocks_for(1500, 0)[0].stream_id == 1500
    with pytest.raises(CorruptionError, match="page 0 checksum"):
        parse_index(bad, len(bad))


async def test_a_damaged_top_index_is_corruption() -> None:
    built = shared_object()
    top_entry = len(built.data) - FOOTER_SIZE - 24 + 2  # inside the last page's key
    bad = flip(built.data, top_entry)
    _store, reader, info = await stored(BuiltObject(bad, built.index_size, built.slices))
    with pytest.raises(CorruptionError, match="top index checksum"):
        await reader.index(info, 7)
    with pytest.raises(CorruptionError, match="top index checksum"):
        parse_index_top(bad, len(bad))
    with pytest.raises(CorruptionError):
        parse_index(bad, len(bad))


async def test_a_page_that_disagrees_with_its_top_entry_is_corruption() -> None:
    # Rewrite the top index so its CRC is right but page 0's key is wrong.
    import struct

    import crc32c

    built = shared_object()
    data = bytearray(built.data)
    top = parse_index_top(bytes(data), len(data))
    top_start = len(data) - FOOTER_SIZE - len(top.pages) * 24
    struct.pack_into(">q", data, top_start, 99)  # page 0 "ends" at stream 99
    top_bytes = bytes(data[top_start : len(data) - FOOTER_SIZE])
    fields = bytearray(data[-FOOTER_SIZE:])
    struct.pack_into(">I", fields, 12, crc32c.crc32c(top_bytes))
    struct.pack_into(">I", fields, 60, crc32c.crc32c(bytes(fields[:60])))
    data[-FOOTER_SIZE:] = fields
    with pytest.raises(CorruptionError, match="top-index entry says"):
        parse_index(bytes(data), len(data))


async def test_a_cold_read_through_the_engine_fetches_little_of_a_shared_index() -> None:
    name = f"pages-{os.urandom(4).hex()}"
    inner = MemoryObjectStore(name)
    store = Counting(inner)
    config = EngineConfig(
        upload=UploadConfig(max_bytes=64 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False),
    )

    def client() -> Client:
        return Client(
            wal=MemoryWal(name=name),
            objects=store,
            metadata=MemoryMetadataStore(name=name),
            config=config,
        )

    async with client() as writer:
        streams = [await writer.create_stream(f"s{i}") for i in range(2000)]
        for stream in streams:
            await stream.append([Record(b"x" * 50)])
        target = streams[1000]
        await target.append([Record(b"%d" % i * 20) for i in range(2000)])
        await writer.flush()
        (info,) = await writer.metadata.list_objects(state=ObjectState.COMMITTED)
        assert info.index_size > 4 * WHOLE_INDEX_BYTES
    async with client() as reader:
        store.bytes_read = 0
        stream = await reader.open_stream("s1000")
        result = await stream.read(start=0, limit_records=10_000, limit_bytes=16 << 20)
        assert [r.value for r in result.records] == [b"x" * 50] + [
            b"%d" % i * 20 for i in range(2000)
        ]
        data = await inner.get(info.key)
        blocks = parse_index(data, len(data)).blocks_for(stream.stream_id, 0)
        block_bytes = sum(entry.size for entry in blocks)
        # The stream's blocks plus a few KiB of index, not the whole shared index.
        assert block_bytes <= store.bytes_read < block_bytes + info.index_size // 4
