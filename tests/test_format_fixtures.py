"""Old-format fixtures: bytes written by the code of commit 7f2c0d6 must still be read.

``tests/fixtures/formats`` holds an ebs WAL file, S3 WAL objects (format 2 and 1), uploaded
objects (format 3, 2 and 1; format 3, the paged index, was added later by the same script), quorum chunks (format 2, 1 and a damage marker), a chunk server's
segment folder and chunk-server protocol frames, all made by ``make_fixtures.py`` from the inputs
below. Each test reads a fixture with today's code and checks the exact records (offsets, keys,
values, headers, timestamps); where the encoder is deterministic it also checks that today's
encoder writes the very same bytes, so a format change is caught in both directions: a reader that
no longer reads old bytes, and a writer that silently writes new ones.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Sequence
from pathlib import Path

import crc32c
from walstream.engine.object_reader import read_index
from walstream.format.batch import decode_batch, encode_batch, iter_batches
from walstream.format.object import (
    FOOTER_SIZE,
    FOOTER_SIZE_V1,
    IndexEntry,
    ObjectIdentity,
    decode_block_records,
    parse_footer,
    parse_index_pages,
    parse_index_top,
    verify_object,
)
from walstream.format.object_builder import ObjectBuilder
from walstream.objects.memory import MemoryObjectStore
from walstream.records import Record, SequencedRecord
from walstream.wal import WalMode
from walstream.wal.quorum import LogIdentity, encode_chunk, encode_damage_marker, parse_chunk

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "formats"

DEPLOYMENT_ID = bytes.fromhex("0123456789abcdef0011223344556677")
NODE_ID = 5
NODE_EPOCH = 2
EBS_SALT = 0x5EED_CAFE
OBJECT_ID = 99
CHUNK_LOG_ID = "node-5"
STREAM_EPOCHS = {7: 3, 42: 1}

EXPECTED: dict[int, list[SequencedRecord]] = {
    7: [
        SequencedRecord(0, b"v0", b"k0", (("h1", b"x"),), 1_700_000_000_000),
        SequencedRecord(1, b"", None, (), 1_700_000_000_001),
        SequencedRecord(
            2, bytes(range(40)), b"", (("a", b""), ("b", b"\x00\xff")), 1_700_000_000_002
        ),
        SequencedRecord(3, b"v3", b"k3", (), 1_700_000_000_010),
        SequencedRecord(4, b"v4" * 30, None, (("trace", b"t-4"),), 1_700_000_000_011),
    ],
    42: [
        SequencedRecord(10, b"hello", b"k", (("trace", b"abc"),), 1_600_000_000_000),
        SequencedRecord(11, b"world", b"k", (), 0),
    ],
}
"""Every record the fixtures hold, per stream."""

WAL_ORDER = [(7, 0, 3), (42, 10, 11), (7, 3, 5), (42, 11, 12)]
"""The batches in WAL order: ``(stream_id, start_offset, end_offset)``."""


def _batch(stream_id: int, start: int, end: int) -> bytes:
    records = [record for record in EXPECTED[stream_id] if start <= record.offset < end]
    return encode_batch(
        stream_id,
        STREAM_EPOCHS[stream_id],
        start,
        [Record(record.value, record.key, record.headers) for record in records],
        [record.timestamp_ms for record in records],
    )


def wal_batches() -> list[bytes]:
    return [_batch(*where) for where in WAL_ORDER]


def crc(data: bytes) -> int:
    return int(crc32c.crc32c(data))


def s3_wal_object(version: int) -> bytes:
    from walstream_wal_s3.layout import encode_wal_object

    if version == 1:
        return encode_wal_object(NODE_ID, NODE_EPOCH, 0, wal_batches()[:2], version=1)
    return encode_wal_object(
        NODE_ID, NODE_EPOCH, 2, wal_batches(), deployment_id=DEPLOYMENT_ID, durable_before=2
    )


def build_object(version: int) -> bytes:
    identity = ObjectIdentity(DEPLOYMENT_ID, OBJECT_ID) if version >= 2 else None
    # A small block target: stream 7's two batches land in two blocks; two index entries a
    # page: version 3's four entries take two pages.
    builder = ObjectBuilder(
        block_target_bytes=64, identity=identity, format_version=version, index_page_entries=2
    )
    for stream_id, start, end in sorted(WAL_ORDER):
        builder.add_batch(_batch(stream_id, start, end))
    return builder.finish().data


def chunk_identity() -> LogIdentity:
    return LogIdentity(DEPLOYMENT_ID, NODE_ID)


def chunks_v2() -> list[bytes]:
    batches = wal_batches()
    return [
        encode_chunk(batches[:2], identity=chunk_identity(), acked_through=0),
        encode_chunk(batches[2:], identity=chunk_identity(), acked_through=2),
    ]


_U32 = struct.Struct(">I")
DAMAGE_REASON = "records [4, 6) lost: fixture"


async def fill_chunk_store(root: Path) -> None:
    """What the chunk server's store holds in the fixture: a claim with identity, two chunks
    (seqs 1 and 2) and a seal, then a clean close."""
    from walstream_wal_nvme_quorum.store import ChunkStore

    store = ChunkStore(root)
    store.open()
    await store.claim(CHUNK_LOG_ID, NODE_EPOCH, chunk_identity())
    for seq, chunk in enumerate(chunks_v2(), start=1):
        await store.write(CHUNK_LOG_ID, NODE_EPOCH, seq, chunk, crc(chunk))
    await store.seal(CHUNK_LOG_ID, NODE_EPOCH, 2)
    store.close()


def chunk_file() -> bytes:
    """``len u32 | chunk`` for: two format-2 chunks, a format-1 chunk, a damage marker."""
    chunks = [
        *chunks_v2(),
        encode_chunk(wal_batches()[:1], version=1),
        encode_damage_marker(DAMAGE_REASON, identity=chunk_identity(), acked_through=4),
    ]
    return b"".join(_U32.pack(len(chunk)) + chunk for chunk in chunks)


def _split_lengths(data: bytes) -> list[bytes]:
    parts: list[bytes] = []
    position = 0
    while position < len(data):
        (length,) = _U32.unpack_from(data, position)
        parts.append(data[position + 4 : position + 4 + length])
        position += 4 + length
    assert position == len(data)
    return parts


FRAMES = [(4, 7, b"\x00\x06node-5payload"), (0, 7, b""), (130, 0xFFFF_FFFF, bytes(range(9)))]
"""Chunk-server protocol frames: ``(code, request_id, body)``."""


def frame_file() -> bytes:
    from walstream_wal_nvme_quorum.protocol import encode_frame

    return b"".join(encode_frame(*frame) for frame in FRAMES)


def _records_of(batches: list[bytes]) -> list[SequencedRecord]:
    return [record for batch in batches for record in decode_batch(batch)[1]]


def _expected_in_wal_order(batches: int | None = None) -> list[SequencedRecord]:
    return [
        record
        for stream_id, start, end in WAL_ORDER[:batches]
        for record in EXPECTED[stream_id]
        if start <= record.offset < end
    ]


# -- batches ------------------------------------------------------------------------------------


def test_batches_of_the_fixtures_are_what_the_encoder_writes_today() -> None:
    """The batch bytes every fixture embeds: pinned by a literal for one small batch."""
    assert _batch(42, 11, 12).hex() == (
        "b1000000000000002a0000000000000001000000000000000b0000000100000018"
        "0000000000000000000000016b00000005776f726c640000"
    )


# -- the ebs WAL --------------------------------------------------------------------------------


async def test_ebs_wal_file_of_format_2_is_read(tmp_path: Path) -> None:
    from walstream_wal_ebs import EbsWal
    from walstream_wal_ebs.layout import RECORD_AREA_START
    from walstream_wal_ebs.wal import MIN_CAPACITY_BYTES

    path = tmp_path / "wal.img"
    shutil.copyfile(FIXTURES / "wal_ebs.img", path)
    wal = EbsWal(path, capacity_bytes=MIN_CAPACITY_BYTES, direct=False, create=False)
    wal.bind_deployment(DEPLOYMENT_ID)
    await wal.start(NODE_ID, NODE_EPOCH + 1, WalMode.READ_WRITE)
    recovered = [record async for record in wal.recover()]
    await wal.close()
    assert [record.offset for record in recovered] == [131072, 135168, 139264, 143360]
    assert all(record.damage_before is None for record in recovered)
    assert [record.data for record in recovered] == wal_batches()
    assert _records_of([record.data for record in recovered]) == _expected_in_wal_order()

    # The record area is what today's writer writes for the same appends (the header slots
    # carry a wall-clock timestamp, so only the records are compared).
    fresh = tmp_path / "fresh.img"
    await _write_fresh_ebs(fresh)
    fixture = (FIXTURES / "wal_ebs.img").read_bytes()
    assert fresh.read_bytes()[RECORD_AREA_START:] == fixture[RECORD_AREA_START:]


async def _write_fresh_ebs(target: Path) -> None:
    from walstream_wal_ebs import EbsWal
    from walstream_wal_ebs.wal import MIN_CAPACITY_BYTES

    wal = EbsWal(target, capacity_bytes=MIN_CAPACITY_BYTES, direct=False, salt=EBS_SALT)
    wal.bind_deployment(DEPLOYMENT_ID)
    await wal.start(NODE_ID, NODE_EPOCH, WalMode.READ_WRITE)
    assert [record async for record in wal.recover()] == []
    for batch in wal_batches():
        await wal.append(batch)
    await wal.close()


# -- S3 WAL objects -----------------------------------------------------------------------------


def test_s3_wal_object_of_format_2_is_read_and_rewritten_identically() -> None:
    from walstream_wal_s3.layout import read_wal_object

    data = (FIXTURES / "wal_s3_v2.bin").read_bytes()
    header, payloads = read_wal_object(data)
    assert (header.version, header.node_id, header.epoch) == (2, NODE_ID, NODE_EPOCH)
    assert (header.first_offset, header.count, header.durable_before) == (2, 4, 2)
    assert header.deployment_id == DEPLOYMENT_ID
    assert header.size == 72
    assert payloads == wal_batches()
    assert _records_of(payloads) == _expected_in_wal_order()
    assert s3_wal_object(2) == data


def test_s3_wal_object_of_format_1_is_read_and_rewritten_identically() -> None:
    from walstream_wal_s3.layout import read_wal_object

    data = (FIXTURES / "wal_s3_v1.bin").read_bytes()
    header, payloads = read_wal_object(data)
    assert (header.version, header.node_id, header.epoch, header.first_offset) == (1, 5, 2, 0)
    assert (header.count, header.deployment_id, header.durable_before) == (2, b"", None)
    assert header.size == 48
    assert _records_of(payloads) == _expected_in_wal_order(2)
    assert s3_wal_object(1) == data


# -- uploaded objects ---------------------------------------------------------------------------


async def test_object_of_format_3_is_read_whole_and_by_pages_and_rebuilt_identically() -> None:
    data = (FIXTURES / "object_v3.wso").read_bytes()
    identity = ObjectIdentity(DEPLOYMENT_ID, OBJECT_ID)
    footer = parse_footer(data[-FOOTER_SIZE:], len(data))
    assert (footer.version, footer.identity, footer.entry_count) == (3, identity, 4)
    assert (footer.page_entries, footer.page_count) == (2, 2)
    index = verify_object(data, identity)
    store = MemoryObjectStore()
    await store.put("o.wso", data)
    assert repr(await read_index(store, "o.wso", expected=identity)) == repr(index)
    _check_object_records(data, index.entries, index.block_crc_seed)
    # The paged path: the top index names one page per stream.
    top = parse_index_top(data, len(data), expected=identity)
    assert [(p.last_stream_id, p.last_end_offset, p.entry_count) for p in top.pages] == [
        (7, 5, 2),
        (42, 12, 2),
    ]
    assert list(top.pages_for(7)) == [0, 1] and list(top.pages_for(42)) == [1]
    pages = parse_index_pages(top, range(2), data, 0)
    assert [e for number in (0, 1) for e in pages[number]] == index.entries
    assert build_object(3) == data


async def test_object_of_format_2_is_read_and_rebuilt_identically() -> None:
    data = (FIXTURES / "object_v2.wso").read_bytes()
    identity = ObjectIdentity(DEPLOYMENT_ID, OBJECT_ID)
    footer = parse_footer(data[-FOOTER_SIZE:], len(data))
    assert (footer.version, footer.identity, footer.entry_count) == (2, identity, 4)
    index = verify_object(data, identity)
    store = MemoryObjectStore()
    await store.put("o.wso", data)
    assert repr(await read_index(store, "o.wso", expected=identity)) == repr(index)
    _check_object_records(data, index.entries, index.block_crc_seed)
    assert build_object(2) == data


async def test_object_of_format_1_is_read_and_rebuilt_identically() -> None:
    data = (FIXTURES / "object_v1.wso").read_bytes()
    footer = parse_footer(data[-FOOTER_SIZE_V1:], len(data))
    assert (footer.version, footer.identity, footer.entry_count) == (1, None, 4)
    index = verify_object(data)
    assert index.block_crc_seed == 0
    _check_object_records(data, index.entries, 0)
    assert build_object(1) == data


def _check_object_records(data: bytes, entries: Sequence[IndexEntry], seed: int) -> None:
    assert [(e.stream_id, e.start_offset, e.end_offset, e.record_count) for e in entries] == [
        (7, 0, 3, 3),
        (7, 3, 5, 2),
        (42, 10, 11, 1),
        (42, 11, 12, 1),
    ]
    for stream_id, expected in EXPECTED.items():
        records = [
            record
            for entry in entries
            if entry.stream_id == stream_id
            for record in decode_block_records(
                data[entry.position : entry.position + entry.size], entry, seed
            )
        ]
        assert records == expected


# -- quorum chunks and the chunk server -----------------------------------------------------------


def test_quorum_chunks_of_format_2_and_1_and_damage_markers_are_read() -> None:
    data = (FIXTURES / "quorum_chunks.bin").read_bytes()
    first, second, legacy, marker = (parse_chunk(chunk) for chunk in _split_lengths(data))
    assert (first.identity, first.acked_through, first.damage) == (chunk_identity(), 0, None)
    assert (second.identity, second.acked_through) == (chunk_identity(), 2)
    assert _records_of(first.records + second.records) == _expected_in_wal_order()
    assert (legacy.identity, legacy.acked_through) == (None, 0)
    assert _records_of(legacy.records) == _expected_in_wal_order(1)
    assert (marker.records, marker.identity, marker.acked_through) == ([], chunk_identity(), 4)
    assert marker.damage == DAMAGE_REASON
    assert chunk_file() == data


async def test_chunk_server_segments_are_read(tmp_path: Path) -> None:
    from walstream_wal_nvme_quorum.store import ChunkStore

    root = tmp_path / "data"
    shutil.copytree(FIXTURES / "nvme_segments", root)
    store = ChunkStore(root)
    store.open()
    try:
        assert (store.damaged_records, store.truncated_bytes, store.lost_bytes) == (0, 0, 0)
        listing = store.listing(CHUNK_LOG_ID)
        assert listing.claimed_epoch == NODE_EPOCH
        assert [(info.seq, info.epoch, info.crc) for info in listing.chunks.values()] == [
            (seq, NODE_EPOCH, crc(chunk)) for seq, chunk in enumerate(chunks_v2(), start=1)
        ]
        for seq, chunk in enumerate(chunks_v2(), start=1):
            assert await store.read(CHUNK_LOG_ID, seq) == (NODE_EPOCH, chunk)
    finally:
        store.close()

    # Today's store writes the same segment for the same requests.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    await fill_chunk_store(fresh)
    for name in ("0000000001.seg", "segments.manifest"):
        assert (fresh / name).read_bytes() == (FIXTURES / "nvme_segments" / name).read_bytes()


def test_chunk_server_protocol_frames_are_read_and_rewritten_identically() -> None:
    from walstream_wal_nvme_quorum.protocol import FRAME_PREFIX, parse_frame

    data = (FIXTURES / "nvme_frames.bin").read_bytes()
    frames = []
    position = 0
    while position < len(data):
        (length,) = FRAME_PREFIX.unpack_from(data, position)
        position += FRAME_PREFIX.size
        frame = parse_frame(data[position : position + length])
        frames.append((frame.code, frame.request_id, frame.body))
        position += length
    assert frames == FRAMES
    assert frame_file() == data


def test_batches_in_the_wal_fixtures_decode_one_after_another() -> None:
    joined = b"".join(wal_batches())
    assert [header.stream_id for _, header in iter_batches(joined)] == [7, 42, 7, 42]
