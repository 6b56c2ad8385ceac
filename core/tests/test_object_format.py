"""The object format (docs/architecture/formats.md): round trips, block cutting, index search, GET counts,
corruption and truncation, identity (format version 2) and reading version-1 objects."""

from __future__ import annotations

import dataclasses
import re
import struct
from collections import Counter
from collections.abc import Iterable

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from walstream.engine.object_reader import read_index
from walstream.errors import CorruptionError, IdentityMismatch, InvalidArgument
from walstream.format.batch import decode_batch, encode_batch
from walstream.format.object import (
    FOOTER_SIZE,
    FOOTER_SIZE_V1,
    FORMAT_VERSION,
    INDEX_ENTRY_SIZE,
    OBJECT_MAGIC,
    OBJECT_MAGIC_V1,
    IndexEntry,
    ObjectIdentity,
    ObjectIndex,
    decode_block,
    decode_block_records,
    describe_object,
    parse_footer,
    parse_index,
    verify_object,
)
from walstream.format.object_builder import BuiltObject, ObjectBuilder
from walstream.format.object_keys import is_identity_key, legacy_object_key, object_key
from walstream.objects.memory import MemoryObjectStore
from walstream.records import Record, SequencedRecord

StreamBatches = list[tuple[int, list[list[Record]]]]
"""(stream_id, batches) in the order streams are added; each stream starts at offset 1000·id."""


def _start_of(stream_id: int) -> int:
    return 1000 * stream_id


def _timestamp(stream_id: int, offset: int) -> int:
    return 1_700_000_000_000 + stream_id * 1_000_000 + offset


DEPLOYMENT = bytes.fromhex("0123456789abcdef0123456789abcdef")
OTHER_DEPLOYMENT = bytes.fromhex("fedcba9876543210fedcba9876543210")
IDENTITY = ObjectIdentity(DEPLOYMENT, 42)


def build(
    streams: StreamBatches,
    block_target_bytes: int = 1 << 20,
    identity: ObjectIdentity | None = IDENTITY,
) -> BuiltObject:
    """An object of the current format for ``identity``; ``identity=None`` writes version 1."""
    builder = ObjectBuilder(block_target_bytes, identity=identity)
    for stream_id, batches in streams:
        offset = _start_of(stream_id)
        for records in batches:
            timestamps = [_timestamp(stream_id, offset + i) for i in range(len(records))]
            builder.add_batch(encode_batch(stream_id, 3, offset, records, timestamps))
            offset += len(records)
    return builder.finish()


def expected_records(stream_id: int, batches: Iterable[list[Record]]) -> list[SequencedRecord]:
    flat = [record for records in batches for record in records]
    start = _start_of(stream_id)
    return [
        SequencedRecord(
            start + i,
            bytes(record.value),
            None if record.key is None else bytes(record.key),
            tuple((name, bytes(value)) for name, value in record.headers),
            _timestamp(stream_id, start + i),
        )
        for i, record in enumerate(flat)
    ]


def read_stream(
    data: bytes, index: ObjectIndex, stream_id: int, start: int, end: int | None = None
) -> list[SequencedRecord]:
    records: list[SequencedRecord] = []
    for entry in index.blocks_for(stream_id, start, end):
        block = data[entry.position : entry.position + entry.size]
        records.extend(decode_block_records(block, entry, index.block_crc_seed))
    return records


def small_streams() -> StreamBatches:
    """Three streams, added out of id order, several small blocks each (target 120 bytes)."""
    return [
        (7, [[Record(b"seven-%d" % i, key=b"k%d" % i)] for i in range(5)]),
        (2, [[Record(b"", key=None), Record(b"two", headers=(("h", b"v"),))] for _ in range(3)]),
        (5, [[Record(b"five" * 10, key=b"", headers=(("a", b""), ("b", b"bb")))]]),
    ]


class CountingStore(MemoryObjectStore):
    """A real in-memory store that counts the GETs a reader makes."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets += 1
        return await super().get(key, start, end)


# ---------------------------------------------------------------- round trips


def test_round_trip_through_index_and_blocks() -> None:
    streams = small_streams()
    built = build(streams, block_target_bytes=120)
    index = parse_index(built.data[-built.index_size :], len(built.data))
    assert index.index_size == built.index_size
    assert index.stream_ids() == [2, 5, 7]
    for stream_id, batches in streams:
        assert read_stream(built.data, index, stream_id, 0) == expected_records(stream_id, batches)


def test_decoded_records_are_ordinary_frozen_sequenced_records() -> None:
    # Decoders make records through make_sequenced_record, not the constructor.
    records = [Record(b"v", key=b"k", headers=(("h", b"x"),)), Record(b"w")]
    _, decoded = decode_batch(encode_batch(7, 1, 40, records, [5, 6]))
    expected = [
        SequencedRecord(40, b"v", b"k", (("h", b"x"),), 5),
        SequencedRecord(41, b"w", None, (), 6),
    ]
    assert decoded == expected
    assert [repr(record) for record in decoded] == [repr(record) for record in expected]
    assert {hash(record) for record in decoded} == {hash(record) for record in expected}
    assert all(type(record) is SequencedRecord for record in decoded)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded[0].value = b"changed"  # type: ignore[misc]


def test_slices_describe_each_stream_in_added_order() -> None:
    streams = small_streams()
    built = build(streams, block_target_bytes=120)
    index = verify_object(built.data)
    assert [s.stream_id for s in built.slices] == [7, 2, 5]
    for piece in built.slices:
        blocks = index.blocks_for(piece.stream_id, 0)
        assert piece.start_offset == _start_of(piece.stream_id) == blocks[0].start_offset
        assert piece.end_offset == blocks[-1].end_offset
        assert piece.record_count == piece.end_offset - piece.start_offset
        assert piece.size == sum(block.size for block in blocks)
    assert sum(piece.size for piece in built.slices) + built.index_size == len(built.data)


def test_decode_block_returns_the_exact_batch_bytes() -> None:
    builder = ObjectBuilder()
    batches = [
        encode_batch(4, 9, offset, [Record(b"v%d" % offset)] * 2, [offset, offset])
        for offset in range(0, 10, 2)
    ]
    for batch in batches:
        builder.add_batch(batch)
    built = builder.finish()
    (entry,) = parse_index(built.data, len(built.data)).entries
    decoded = decode_block(built.data[entry.position : entry.position + entry.size], entry)
    assert [batch for _, batch in decoded] == batches
    assert [header.base_offset for header, _ in decoded] == [0, 2, 4, 6, 8]
    assert all(header.epoch == 9 for header, _ in decoded)


_records = st.lists(
    st.builds(
        Record,
        value=st.binary(max_size=300),
        key=st.none() | st.binary(max_size=20),
        headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=16)), max_size=3).map(
            tuple
        ),
    ),
    min_size=1,
    max_size=6,
)
_streams = st.lists(
    st.tuples(st.integers(0, 2**40), st.lists(_records, min_size=1, max_size=8)),
    min_size=1,
    max_size=5,
    unique_by=lambda pair: pair[0],
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    streams=_streams,
    block_target_bytes=st.sampled_from([1, 64, 500, 4096, 1 << 20]),
    data=st.data(),
)
def test_property_records_in_equal_records_out(
    streams: StreamBatches, block_target_bytes: int, data: st.DataObject
) -> None:
    built = build(streams, block_target_bytes)
    index = parse_index(built.data[-built.index_size :], len(built.data))
    assert index.entries == sorted(index.entries, key=lambda e: (e.stream_id, e.start_offset))
    for stream_id, batches in streams:
        expected = expected_records(stream_id, batches)
        assert read_stream(built.data, index, stream_id, 0) == expected
        # A read from any offset finds the block holding it first.
        offset = data.draw(st.integers(expected[0].offset, expected[-1].offset))
        blocks = index.blocks_for(stream_id, offset, offset + 1)
        assert len(blocks) == 1 and blocks[0].start_offset <= offset < blocks[0].end_offset
        got = read_stream(built.data, index, stream_id, offset)
        assert [r for r in got if r.offset >= offset] == expected[offset - expected[0].offset :]
    assert verify_object(built.data).entries == index.entries


@settings(max_examples=200, deadline=None)
@given(
    value=st.binary(max_size=3000),
    key=st.none() | st.binary(max_size=40),
    headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=20)), max_size=2),
    timestamp_ms=st.integers(0, 2**63 - 1),
    base_offset=st.integers(0, 2**62),
)
def test_a_single_record_batch_has_the_bytes_of_the_general_encoding(
    value: bytes,
    key: bytes | None,
    headers: list[tuple[str, bytes]],
    timestamp_ms: int,
    base_offset: int,
) -> None:
    """A batch of one plain record is packed in one call (the append hot path); its bytes must
    be those of the record-by-record encoding (here: the same record inside a two-record batch,
    whose first record's bytes follow the header), and decode to the record."""
    record = Record(value=value, key=key, headers=tuple(headers))
    single = encode_batch(7, 3, base_offset, [record], [timestamp_ms])
    pair = encode_batch(7, 3, base_offset, [record, record], [timestamp_ms, timestamp_ms])
    record_bytes = (len(pair) - 33) // 2
    assert single[33:] == pair[33 : 33 + record_bytes]
    assert struct.unpack(">BqqqiI", single[:33]) == (0xB1, 7, 3, base_offset, 1, record_bytes)
    _, decoded = decode_batch(single)
    assert [(r.offset, r.value, r.key, r.headers, r.timestamp_ms) for r in decoded] == [
        (base_offset, value, key, tuple(headers), timestamp_ms)
    ]


# ---------------------------------------------------------------- block cutting


def test_blocks_are_cut_near_one_mib() -> None:
    batch_bytes = 100 << 10
    builder = ObjectBuilder()
    for offset in range(50):  # ~5 MiB of one stream
        builder.add_batch(encode_batch(1, 0, offset, [Record(bytes(batch_bytes))], [0]))
    built = builder.finish()
    blocks = parse_index(built.data, len(built.data)).entries
    assert len(blocks) == 5
    for block in blocks[:-1]:
        assert (1 << 20) - batch_bytes - 100 < block.size <= (1 << 20) + 4
    assert blocks[-1].end_offset == 50


def test_a_batch_larger_than_the_target_gets_a_block_of_its_own() -> None:
    builder = ObjectBuilder()
    small = encode_batch(1, 0, 0, [Record(b"small")], [0])
    large = encode_batch(1, 0, 1, [Record(bytes(3 << 19))], [0])  # 1.5 MiB
    builder.add_batch(small)
    builder.add_batch(large)
    builder.add_batch(encode_batch(1, 0, 2, [Record(b"after")], [0]))
    built = builder.finish()
    blocks = parse_index(built.data, len(built.data)).entries
    assert [(b.start_offset, b.end_offset) for b in blocks] == [(0, 1), (1, 2), (2, 3)]
    assert blocks[1].size == len(large) + 4


def test_a_new_stream_starts_a_new_block_and_size_bytes_grows() -> None:
    builder = ObjectBuilder()
    assert builder.size_bytes == 0
    first = encode_batch(1, 0, 0, [Record(b"a")], [0])
    builder.add_batch(first)
    assert builder.size_bytes == len(first) + 4
    builder.add_batch(encode_batch(2, 0, 0, [Record(b"b")], [0]))
    assert builder.size_bytes == 2 * (len(first) + 4)
    built = builder.finish()
    assert len(built.data) == builder.size_bytes + built.index_size
    assert [(e.stream_id, e.size) for e in parse_index(built.data, len(built.data)).entries] == [
        (1, len(first) + 4),
        (2, len(first) + 4),
    ]


# ---------------------------------------------------------------- builder misuse


def test_builder_rejects_gaps_regrouping_and_bad_batches() -> None:
    builder = ObjectBuilder()
    builder.add_batch(encode_batch(1, 0, 10, [Record(b"a")], [0]))
    with pytest.raises(InvalidArgument, match="contiguous"):
        builder.add_batch(encode_batch(1, 0, 12, [Record(b"a")], [0]))
    builder.add_batch(encode_batch(2, 0, 0, [Record(b"b")], [0]))
    with pytest.raises(InvalidArgument, match="together"):
        builder.add_batch(encode_batch(1, 0, 11, [Record(b"a")], [0]))
    with pytest.raises(InvalidArgument, match="exactly one batch"):
        builder.add_batch(encode_batch(2, 0, 1, [Record(b"b")], [0]) * 2)
    with pytest.raises(InvalidArgument, match="not an encoded batch"):
        builder.add_batch(b"\x00" * 40)
    built = builder.finish()
    assert [s.end_offset for s in built.slices] == [11, 1]
    with pytest.raises(InvalidArgument):
        builder.add_batch(encode_batch(3, 0, 0, [Record(b"c")], [0]))
    with pytest.raises(InvalidArgument, match="at least one batch"):
        ObjectBuilder().finish()
    with pytest.raises(InvalidArgument):
        ObjectBuilder(block_target_bytes=0)


def test_batches_added_with_known_headers_build_the_same_object() -> None:
    """The uploader hands the builder its cached batches with the offsets it encoded them
    with (no header decoded again): the object must be byte for byte the one ``add_batch``
    builds, blocks cut at the same places, and a gap is still refused."""
    identity = ObjectIdentity(bytes(range(16)), 42)
    streams = {
        4: [encode_batch(4, 1, n, [Record(b"four-%d" % n * 30)], [n]) for n in range(40)],
        9: [encode_batch(9, 2, 100 + 2 * n, [Record(b"a"), Record(b"b")], [1, 2]) for n in range(7)],
    }
    by_header = ObjectBuilder(block_target_bytes=700, identity=identity)
    known = ObjectBuilder(block_target_bytes=700, identity=identity)
    for stream_id, batches in streams.items():
        for batch in batches:
            by_header.add_batch(batch)
        first = 0 if stream_id == 4 else 100
        step = 1 if stream_id == 4 else 2
        known.add_stream_batches(
            stream_id,
            [(batch, first + step * n, first + step * (n + 1)) for n, batch in enumerate(batches)],
        )
    expected, got = by_header.finish(), known.finish()
    assert got.data == expected.data and got.slices == expected.slices
    assert len(parse_index(got.data[-got.index_size :], len(got.data)).entries) > 2
    gap = ObjectBuilder()
    gap.add_stream_batches(1, [(streams[4][0], 0, 1)])
    with pytest.raises(InvalidArgument, match="contiguous"):
        gap.add_stream_batches(1, [(streams[4][2], 2, 3)])


@settings(max_examples=120, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=60),
    block_target_bytes=st.sampled_from([1, 40, 200, 700, 5000]),
    then_more=st.integers(0, 3),
)
def test_a_stream_added_as_one_run_builds_the_same_object(
    sizes: list[int], block_target_bytes: int, then_more: int
) -> None:
    """The uploader adds each stream of a block as one run (blocks found by a search over the
    running sizes, joined once); the object must be byte for byte what adding the batches one
    by one builds, whatever the batch sizes against the block target, including when more
    batches of another stream follow and when the same stream goes on batch by batch."""
    identity = ObjectIdentity(bytes(range(16)), 7)
    batches = [encode_batch(3, 1, 50 + n, [Record(b"v" * size)], [n]) for n, size in enumerate(sizes)]
    more = [encode_batch(3, 1, 50 + len(sizes) + n, [Record(b"m")], [0]) for n in range(then_more)]
    other = encode_batch(8, 1, 0, [Record(b"other")], [0])
    one_by_one = ObjectBuilder(block_target_bytes=block_target_bytes, identity=identity)
    as_run = ObjectBuilder(block_target_bytes=block_target_bytes, identity=identity)
    for batch in batches + more:
        one_by_one.add_batch(batch)
    one_by_one.add_batch(other)
    bases = [50 + n for n in range(len(sizes))]
    as_run.add_stream_run(3, batches, bases, [base + 1 for base in bases])
    for batch in more:
        as_run.add_batch(batch)
    as_run.add_batch(other)
    expected, got = one_by_one.finish(), as_run.finish()
    assert got.data == expected.data and got.slices == expected.slices


def test_a_run_whose_batches_fill_a_block_exactly_cuts_it_where_one_by_one_does() -> None:
    batches = [encode_batch(3, 1, n, [Record(b"x" * 10)], [0]) for n in range(7)]
    target = 2 * len(batches[0])  # two batches fill a block to the byte
    one_by_one = ObjectBuilder(block_target_bytes=target)
    for batch in batches:
        one_by_one.add_batch(batch)
    as_run = ObjectBuilder(block_target_bytes=target)
    as_run.add_stream_run(3, batches, list(range(7)), list(range(1, 8)))
    expected, got = one_by_one.finish(), as_run.finish()
    assert got.data == expected.data
    assert len(parse_index(got.data[-got.index_size :], len(got.data)).entries) == 4


@pytest.mark.parametrize("block_target_bytes", [1, 40, 1 << 20])
def test_streams_of_one_batch_added_whole_build_the_same_bytes(block_target_bytes: int) -> None:
    """The uploader adds a stream of one batch with add_stream_batch: byte for byte what
    adding it batch by batch builds, with a stream of several batches after it too."""
    identity = ObjectIdentity(bytes(range(16)), 7)
    singles = [encode_batch(s, 1, 10 * s, [Record(b"v" * s)], [s]) for s in range(1, 30)]
    tail = [encode_batch(99, 1, n, [Record(b"t")], [0]) for n in range(3)]
    one_by_one = ObjectBuilder(block_target_bytes=block_target_bytes, identity=identity)
    whole = ObjectBuilder(block_target_bytes=block_target_bytes, identity=identity)
    for batch in singles + tail:
        one_by_one.add_batch(batch)
    for s, batch in enumerate(singles, 1):
        whole.add_stream_batch(s, batch, 10 * s, 10 * s + 1)
    whole.add_stream_run(99, tail, [0, 1, 2], [1, 2, 3])
    expected, got = one_by_one.finish(), whole.finish()
    assert got.data == expected.data and got.slices == expected.slices
    builder = ObjectBuilder()
    builder.add_stream_batch(1, singles[0], 10, 11)
    builder.add_stream_batch(2, singles[1], 20, 21)
    with pytest.raises(InvalidArgument, match="together"):
        builder.add_stream_batch(1, singles[0], 11, 12)


def test_a_run_with_a_gap_or_an_empty_batch_is_refused() -> None:
    batch = encode_batch(1, 0, 0, [Record(b"a")], [0])
    with pytest.raises(InvalidArgument, match="contiguous"):
        ObjectBuilder().add_stream_run(1, [batch, batch], [0, 2], [1, 3])
    with pytest.raises(InvalidArgument, match="no records"):
        ObjectBuilder().add_stream_run(1, [batch, batch], [0, 1], [1, 1])
    builder = ObjectBuilder()
    builder.add_stream_run(1, [batch], [0], [1])
    builder.add_batch(encode_batch(2, 0, 0, [Record(b"b")], [0]))
    with pytest.raises(InvalidArgument, match="together"):
        builder.add_stream_run(1, [batch], [1], [2])


# ---------------------------------------------------------------- index search


def test_index_sorted_and_binary_search_finds_every_offset() -> None:
    builder = ObjectBuilder(block_target_bytes=100)
    # Physical order 9, 3, 7; the index must still sort by (stream_id, start_offset).
    layout = {9: (50, 40), 3: (0, 35), 7: (1000, 17)}
    for stream_id, (start, count) in layout.items():
        for offset in range(start, start + count):
            builder.add_batch(encode_batch(stream_id, 0, offset, [Record(b"x" * 30)], [0]))
    built = builder.finish()
    index = parse_index(built.data[-built.index_size :], len(built.data))
    keys = [(e.stream_id, e.start_offset) for e in index.entries]
    assert keys == sorted(keys) and len(keys) > 30
    assert [e.position for e in index.entries] != sorted(e.position for e in index.entries)
    for stream_id, (start, count) in layout.items():
        stream_blocks = [e for e in index.entries if e.stream_id == stream_id]
        for offset in range(start, start + count):
            (hit,) = index.blocks_for(stream_id, offset, offset + 1)
            assert hit.start_offset <= offset < hit.end_offset
            following = index.blocks_for(stream_id, offset)
            assert following == stream_blocks[stream_blocks.index(hit) :]
        assert index.blocks_for(stream_id, 0, start) == []
        assert index.blocks_for(stream_id, start + count) == []
        assert index.blocks_for(stream_id, 0) == stream_blocks
        assert index.blocks_for(stream_id, start, start + count) == stream_blocks
    assert index.blocks_for(4, 0) == []
    assert index.blocks_for(100, 0) == []


# ---------------------------------------------------------------- store reads


async def test_any_offset_is_reached_with_at_most_two_gets() -> None:
    streams = small_streams()
    built = build(streams, block_target_bytes=120)
    store = CountingStore()
    key = object_key(42, DEPLOYMENT)
    await store.put(key, built.data)
    for stream_id, batches in streams:
        for expected in expected_records(stream_id, batches):
            store.gets = 0
            index = await read_index(
                store, key, len(built.data), built.index_size, expected=IDENTITY
            )
            (entry,) = index.blocks_for(stream_id, expected.offset, expected.offset + 1)
            block = await store.get(key, entry.position, entry.position + entry.size)
            records = decode_block_records(block, entry, index.block_crc_seed)
            found = [r for r in records if r.offset == expected.offset]
            assert found == [expected]
            assert store.gets <= 2


async def test_read_index_without_index_size_takes_two_gets() -> None:
    built = build(small_streams(), block_target_bytes=120)
    store = CountingStore()
    await store.put("obj", built.data)
    index = await read_index(store, "obj")
    assert store.gets == 2
    assert index.entries == verify_object(built.data).entries
    store.gets = 0
    assert (await read_index(store, "obj", index_size=built.index_size)).entries == index.entries
    assert store.gets == 1


async def test_read_index_with_a_too_small_index_size_is_corruption() -> None:
    built = build(small_streams(), block_target_bytes=120)
    store = MemoryObjectStore()
    await store.put("obj", built.data)
    with pytest.raises(CorruptionError, match="obj"):
        await read_index(store, "obj", len(built.data), built.index_size - INDEX_ENTRY_SIZE)
    with pytest.raises(CorruptionError):
        await read_index(store, "obj", len(built.data) + 1, built.index_size)


# ---------------------------------------------------------------- corruption


def _flip(data: bytes, position: int, mask: int = 0xFF) -> bytes:
    return data[:position] + bytes([data[position] ^ mask]) + data[position + 1 :]


def _read_all_or_raise(data: bytes) -> dict[int, list[SequencedRecord]]:
    index = parse_index(data, len(data))
    return {sid: read_stream(data, index, sid, 0) for sid in index.stream_ids()}


@pytest.mark.parametrize("identity", [IDENTITY, None], ids=["v2", "v1"])
def test_flipping_any_byte_of_a_small_object_is_detected(identity: ObjectIdentity | None) -> None:
    streams = small_streams()
    built = build(streams, block_target_bytes=120, identity=identity)
    good = built.data
    original = parse_index(good, len(good))
    expected = {sid: expected_records(sid, batches) for sid, batches in streams}
    for position in range(len(good)):
        bad = _flip(good, position)
        with pytest.raises(CorruptionError):
            verify_object(bad)
        with pytest.raises(CorruptionError):
            _read_all_or_raise(bad)
        if position >= original.index_position:
            with pytest.raises(CorruptionError):
                parse_index(bad, len(bad))
            continue
        # A flip in the data area spoils only the block holding it; the others still read back,
        # whether a block is checked on its own or in place in a larger range (a reader's GET).
        index = parse_index(bad, len(bad))
        for entry in index.entries:
            block = bad[entry.position : entry.position + entry.size]
            if entry.position <= position < entry.position + entry.size:
                with pytest.raises(CorruptionError):
                    decode_block_records(block, entry, index.block_crc_seed)
                with pytest.raises(CorruptionError):
                    decode_block_records(bad, entry, index.block_crc_seed, at=entry.position)
            else:
                records = decode_block_records(block, entry, index.block_crc_seed)
                assert records == [
                    r
                    for r in expected[entry.stream_id]
                    if entry.start_offset <= r.offset < entry.end_offset
                ]
                in_place = decode_block_records(bad, entry, index.block_crc_seed, at=entry.position)
                assert in_place == records


@pytest.fixture(scope="module")
def big_object() -> BuiltObject:
    streams: StreamBatches = [
        (sid, [[Record(bytes([sid, i % 251]) * 2000, key=b"k")] * 4 for i in range(120)])
        for sid in (3, 1, 2)
    ]
    return build(streams)  # ~5.8 MiB, several 1 MiB blocks per stream


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position_fraction=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
async def test_flipping_a_sampled_byte_of_a_big_object_is_detected(
    big_object: BuiltObject, position_fraction: float, mask: int
) -> None:
    good = big_object.data
    position = int(position_fraction * len(good))
    bad = _flip(good, position, mask)
    store = MemoryObjectStore()
    await store.put("big", bad)
    try:
        index = await read_index(store, "big", len(bad), big_object.index_size)
    except CorruptionError:
        assert position >= len(good) - big_object.index_size
        return
    (entry,) = [e for e in index.entries if e.position <= position < e.position + e.size]
    block = await store.get("big", entry.position, entry.position + entry.size)
    with pytest.raises(CorruptionError):
        decode_block(block, entry, index.block_crc_seed)


@pytest.mark.parametrize("identity", [IDENTITY, None], ids=["v2", "v1"])
def test_truncation_at_every_length_is_detected(identity: ObjectIdentity | None) -> None:
    good = build(small_streams(), block_target_bytes=120, identity=identity).data
    for length in range(len(good)):
        cut = good[:length]
        with pytest.raises(CorruptionError):
            parse_index(cut, length)
        with pytest.raises(CorruptionError):
            verify_object(cut)


async def test_truncated_object_read_with_recorded_sizes_is_detected() -> None:
    built = build(small_streams(), block_target_bytes=120)
    store = MemoryObjectStore()
    for length in range(0, len(built.data), 7):
        await store.put("obj", built.data[:length])
        with pytest.raises(CorruptionError):
            # metadata still says the full size: the suffix read lands on the wrong bytes
            await read_index(store, "obj", len(built.data), built.index_size)
        with pytest.raises(CorruptionError):
            await read_index(store, "obj")


def test_a_block_read_short_or_against_the_wrong_entry_is_detected() -> None:
    built = build(small_streams(), block_target_bytes=120)
    index = parse_index(built.data, len(built.data))
    first, second = index.entries[0], index.entries[1]
    seed = index.block_crc_seed
    block = built.data[first.position : first.position + first.size]
    assert decode_block(block, first, seed)
    with pytest.raises(CorruptionError, match="bytes"):
        decode_block(block[:-1], first, seed)
    with pytest.raises(CorruptionError):
        decode_block(block, second, seed)
    shifted = IndexEntry(
        first.stream_id,
        first.start_offset + 1,
        first.end_offset + 1,
        first.record_count,
        first.position,
        first.size,
    )
    with pytest.raises(CorruptionError):
        decode_block(block, shifted, seed)
    # In place in a larger range: a range that ends inside the block, or a block checked at the
    # wrong place or against the wrong entry, is detected as well.
    data = built.data
    end = second.position + second.size
    assert decode_block_records(data[:end], second, seed, at=second.position)
    with pytest.raises(CorruptionError, match="bytes"):
        decode_block_records(data[: end - 1], second, seed, at=second.position)
    with pytest.raises(CorruptionError):
        decode_block_records(data, second, seed, at=second.position + 1)
    with pytest.raises(CorruptionError):
        decode_block_records(data, second, seed, at=first.position)
    with pytest.raises(CorruptionError):
        decode_block_records(data, shifted, seed, at=first.position)


@settings(max_examples=300, deadline=None)
@given(junk=st.binary(max_size=400))
def test_random_bytes_only_ever_raise_corruption(junk: bytes) -> None:
    with pytest.raises(CorruptionError):
        verify_object(junk)
    with pytest.raises(CorruptionError):
        verify_object(junk + OBJECT_MAGIC)
    with pytest.raises(CorruptionError):
        verify_object(junk + OBJECT_MAGIC_V1)


_FIELD_NAMES = (
    "index_position",
    "index_length",
    "index_crc",
    "entry_count",
    "version",
    "flags",
    "deployment_id",
    "object_id",
)


def _refooter(data: bytes, **changes: int | bytes) -> bytes:
    """Rewrite the fields of a version-3 footer with a valid footer CRC, to test checks beyond
    the checksum."""
    fields = struct.Struct(">QIIIHH16sQI8s")
    names = (*_FIELD_NAMES, "page_entries")
    values: dict[str, int | bytes] = dict(
        zip(names, fields.unpack_from(data, len(data) - FOOTER_SIZE)[:9], strict=True)
    )
    values.update(changes)
    packed = fields.pack(*values.values(), bytes(8))
    footer = packed + struct.pack(">I", crc32c.crc32c(packed)) + OBJECT_MAGIC
    return data[:-FOOTER_SIZE] + footer


def test_footer_checks_beyond_the_checksum() -> None:
    good = build(small_streams(), block_target_bytes=120).data
    assert _refooter(good) == good
    with pytest.raises(CorruptionError, match="version 4 is not supported"):
        parse_footer(_refooter(good, version=4)[-FOOTER_SIZE:], len(good))
    with pytest.raises(CorruptionError, match="version 2 is not supported"):
        parse_footer(_refooter(good, version=2)[-FOOTER_SIZE:], len(good))
    with pytest.raises(CorruptionError, match="flags"):
        parse_index(_refooter(good, flags=1), len(good))
    with pytest.raises(CorruptionError, match="entries"):
        parse_index(_refooter(good, entry_count=1), len(good))
    with pytest.raises(CorruptionError, match="a page"):
        parse_index(_refooter(good, page_entries=0), len(good))
    with pytest.raises(CorruptionError):
        parse_index(_refooter(good, page_entries=1), len(good))
    with pytest.raises(CorruptionError):
        parse_index(_refooter(good, index_position=0), len(good))


# ---------------------------------------------------------------- inspect and keys


def test_describe_object_lists_the_footer_and_every_block() -> None:
    built = build(small_streams(), block_target_bytes=120)
    index = parse_index(built.data, len(built.data))
    lines = describe_object(built.data)
    assert f"format version {FORMAT_VERSION}" in lines[0]
    assert lines[1] == f"identity: deployment {DEPLOYMENT.hex()}, object id 42"
    assert len(lines) == 3 + len(index.entries)
    assert all("crc ok" in line for line in lines[3:])
    victim = index.entries[3]
    bad = _flip(built.data, victim.position + 5)
    lines = describe_object(bad)
    bad_lines = [line for line in lines if "BAD" in line]
    assert len(bad_lines) == 1 and f"position {victim.position} " in bad_lines[0]


def test_describe_object_of_a_version_1_object_says_it_has_no_identity() -> None:
    built = build(small_streams(), block_target_bytes=120, identity=None)
    lines = describe_object(built.data)
    assert "format version 1" in lines[0]
    assert lines[1] == "identity: none (format version 1 carries no identity)"
    assert all("crc ok" in line for line in lines[3:])


def test_object_keys_are_stable_and_spread_over_hashed_prefixes() -> None:
    assert object_key(1, DEPLOYMENT) == object_key(1, DEPLOYMENT)
    key = object_key(0x1234, DEPLOYMENT, prefix="objects/")
    assert re.fullmatch(
        r"objects/[0-9a-f]{2}/[0-9a-f]{2}/0123456789abcdef-0000000000001234\.wso", key
    )
    firsts = Counter(object_key(object_id, DEPLOYMENT)[:2] for object_id in range(65536))
    assert len(firsts) == 256
    assert min(firsts.values()) > 160 and max(firsts.values()) < 360
    assert object_key(1, DEPLOYMENT)[:5] != object_key(2, DEPLOYMENT)[:5]
    with pytest.raises(InvalidArgument):
        object_key(-1, DEPLOYMENT)
    with pytest.raises(InvalidArgument):
        object_key(1, b"short")


def test_two_deployments_never_share_an_object_key() -> None:
    ours = {object_key(object_id, DEPLOYMENT) for object_id in range(2000)}
    theirs = {object_key(object_id, OTHER_DEPLOYMENT) for object_id in range(2000)}
    assert not ours & theirs
    assert all(is_identity_key(key) for key in ours)


def test_legacy_keys_are_unchanged_and_not_identity_keys() -> None:
    key = legacy_object_key(0x1234, prefix="objects/")
    assert re.fullmatch(r"objects/[0-9a-f]{2}/[0-9a-f]{2}/0000000000001234\.wso", key)
    assert not is_identity_key(key)


# ---------------------------------------------------------------- identity


async def test_an_object_of_another_deployment_or_id_is_an_identity_mismatch() -> None:
    streams = small_streams()
    ours = build(streams, block_target_bytes=120)
    key = object_key(42, DEPLOYMENT)
    foreign = {
        "another deployment": build(streams, 120, ObjectIdentity(OTHER_DEPLOYMENT, 42)),
        "another object id": build(streams, 120, ObjectIdentity(DEPLOYMENT, 43)),
        "another deployment, other size": build(
            streams[:2], 120, ObjectIdentity(OTHER_DEPLOYMENT, 42)
        ),
    }
    for case, built in foreign.items():
        store = MemoryObjectStore()
        await store.put(key, built.data)
        for object_size, index_size in (
            (len(ours.data), ours.index_size),  # sizes from metadata
            (None, None),  # sizes from the store
        ):
            with pytest.raises(IdentityMismatch) as caught:
                await read_index(store, key, object_size, index_size, expected=IDENTITY)
            message = str(caught.value)
            assert key in message, case
            assert f"expected deployment {DEPLOYMENT.hex()} object 42" in message, case
            found = parse_footer(built.data, len(built.data)).identity
            assert found is not None
            assert f"found deployment {found.deployment_id.hex()} object {found.object_id}" in (
                message
            ), case
        with pytest.raises(IdentityMismatch):
            verify_object(built.data, IDENTITY)
    verify_object(ours.data, IDENTITY)


def test_a_block_from_another_object_fails_its_check_even_with_the_same_layout() -> None:
    streams = small_streams()
    ours = build(streams, block_target_bytes=120)
    theirs = build(streams, 120, ObjectIdentity(OTHER_DEPLOYMENT, 42))
    index = parse_index(ours.data, len(ours.data))
    assert parse_index(theirs.data, len(theirs.data)).entries == index.entries
    for entry in index.entries:
        block = theirs.data[entry.position : entry.position + entry.size]
        with pytest.raises(CorruptionError, match="another object"):
            decode_block(block, entry, index.block_crc_seed)


async def test_version_1_objects_are_still_read() -> None:
    streams = small_streams()
    built = build(streams, block_target_bytes=120, identity=None)
    assert built.data.endswith(OBJECT_MAGIC_V1)
    assert (
        built.index_size
        == len(parse_index(built.data, len(built.data)).entries) * (INDEX_ENTRY_SIZE)
        + FOOTER_SIZE_V1
    )
    store = MemoryObjectStore()
    key = legacy_object_key(42)
    await store.put(key, built.data)
    for sizes in ((len(built.data), built.index_size), (None, None)):
        index = await read_index(store, key, *sizes, expected=IDENTITY)
        assert index.version == 1 and index.identity is None
        for stream_id, batches in streams:
            assert read_stream(built.data, index, stream_id, 0) == expected_records(
                stream_id, batches
            )


async def test_a_version_1_file_under_an_identity_key_is_a_mismatch() -> None:
    built = build(small_streams(), block_target_bytes=120, identity=None)
    store = MemoryObjectStore()
    key = object_key(42, DEPLOYMENT)
    await store.put(key, built.data)
    with pytest.raises(IdentityMismatch, match="version-1 object without an identity"):
        await read_index(store, key, len(built.data), built.index_size, expected=IDENTITY)
