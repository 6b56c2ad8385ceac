"""Object-file fuzz: damage one committed object and read every range back.

The object holds three streams in many small blocks. Each case damages it one way — a bit
flipped at a sampled position of a region (data-block batch header, block payload, block CRC,
index, footer, the footer's identity bytes), a truncation, appended bytes, or a whole other file
swapped in (another deployment's object of the same id and layout, another object id's file,
a version-1 file without identity, another object's content) — and then reads every stream from
every offset through the real :class:`ObjectReader` (twice, so the second round runs on warm
caches), and for the first cases of each kind through the engine's read path too.

Every read must return exactly the records stored at its offsets (a short read is fine) or raise
a typed :class:`CorruptionError` / :class:`IdentityMismatch`: never other bytes, and never an
empty answer for offsets metadata says exist. Classes are the shared ``Outcome`` ones. Besides,
damage inside one data block may fail only reads whose records (start .. start + limit) reach
into that block (failure isolation).

The format has no padding bytes: every byte belongs to a block, the index or the footer, and
the block-CRC region stands in for the bytes between blocks. CI runs a bounded sample; ``--soak``
flips a bit of every byte position and truncates at every fifth length.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import pytest
from walstream import Client, EngineConfig
from walstream.config import CompactionConfig
from walstream.engine.object_reader import ObjectReader
from walstream.errors import CorruptionError, IdentityMismatch, WalstreamError
from walstream.format.batch import BATCH_HEADER, decode_batch_header, encode_batch
from walstream.format.object import (
    FOOTER_SIZE,
    ObjectIdentity,
    ObjectIndex,
    parse_index,
)
from walstream.format.object_builder import ObjectBuilder
from walstream.format.object_keys import object_key
from walstream.metadata import ObjectCommit, ObjectKind, StreamRange
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.records import Record, SequencedRecord
from walstream.wal.memory import MemoryWal
from walstream_conformance.corruption import FuzzReport, Outcome

STREAMS = {"alpha": 30, "beta": 24, "gamma": 18}
"""Stream name → records."""
BLOCK_TARGET_BYTES = 160
READ_LIMIT = 4
OTHER_DEPLOYMENT = bytes.fromhex("feedfacecafebeef0011223344556677")


def _record(name: str, offset: int, foreign: bool = False) -> Record:
    """Record ``offset`` of stream ``name``; ``foreign`` gives other bytes of the same sizes (the
    data another deployment or object would hold in the same layout)."""
    tag = name.upper() if foreign else name
    value = f"{tag}:{offset}:".encode() * (1 + offset % 4)
    key = None if offset % 5 == 0 else f"k{offset}".encode()
    headers = (("h", bytes([offset % 256])),) if offset % 3 == 0 else ()
    return Record(value, key=key, headers=headers)


def _timestamp(offset: int) -> int:
    return 1_700_000_000_000 + offset


@dataclass
class Fixture:
    store: MemoryObjectStore
    metadata_name: str
    deployment_id: bytes
    object_id: int
    key: str
    good: bytes
    index: ObjectIndex
    stream_ids: dict[str, int]
    expected: dict[int, list[SequencedRecord]]
    swaps: dict[str, bytes]

    def metadata(self) -> MemoryMetadataStore:
        return MemoryMetadataStore(name=self.metadata_name)


def _build(
    stream_ids: dict[str, int],
    epoch: int,
    identity: ObjectIdentity | None,
    shift: int = 0,
    foreign: bool = False,
) -> tuple[bytes, int]:
    builder = ObjectBuilder(BLOCK_TARGET_BYTES, identity=identity)
    for name, count in STREAMS.items():
        offset = 0
        size = 1
        while offset < count:
            size = min(1 + (offset + shift) % 3, count - offset)
            records = [_record(name, offset + shift + n, foreign) for n in range(size)]
            timestamps = [_timestamp(offset + n) for n in range(size)]
            builder.add_batch(encode_batch(stream_ids[name], epoch, offset, records, timestamps))
            offset += size
    built = builder.finish()
    return built.data, built.index_size


async def _fixture() -> Fixture:
    name = f"fuzz-{random.getrandbits(32):08x}"
    metadata = MemoryMetadataStore(name=name)
    deployment_id = await metadata.deployment_id()
    node = await metadata.register_node(1, {})
    stream_ids: dict[str, int] = {}
    epochs: dict[int, int] = {}
    for stream_name in STREAMS:
        info = await metadata.create_stream(stream_name)
        claimed = await metadata.claim_stream(info.stream_id, 1, node.node_epoch)
        stream_ids[stream_name] = info.stream_id
        epochs[info.stream_id] = claimed.epoch
    (epoch,) = set(epochs.values())
    (object_id,) = await metadata.prepare_objects(1, 600_000)
    good, index_size = _build(stream_ids, epoch, ObjectIdentity(deployment_id, object_id))
    key = object_key(object_id, deployment_id)
    store = MemoryObjectStore()
    await store.put_if_absent(key, good)
    ranges = tuple(
        StreamRange(stream_ids[n], 0, count, epoch, _timestamp(0), _timestamp(count - 1))
        for n, count in STREAMS.items()
    )
    commit = ObjectCommit(object_id, key, ObjectKind.STREAM_SET, len(good), index_size, ranges)
    await metadata.commit_objects(1, node.node_epoch, [commit])
    await metadata.release_streams(1, node.node_epoch)
    expected = {
        stream_ids[n]: [
            SequencedRecord(
                offset,
                bytes(record.value),
                None if record.key is None else bytes(record.key),
                tuple((h, bytes(v)) for h, v in record.headers),
                _timestamp(offset),
            )
            for offset, record in ((o, _record(n, o)) for o in range(count))
        ]
        for n, count in STREAMS.items()
    }
    swaps = {
        "another deployment's object": _build(
            stream_ids, epoch, ObjectIdentity(OTHER_DEPLOYMENT, object_id), foreign=True
        )[0],
        "another object id's file": _build(
            stream_ids, epoch, ObjectIdentity(deployment_id, object_id + 1), foreign=True
        )[0],
        "version-1 file, no identity": _build(stream_ids, epoch, None, foreign=True)[0],
        "another object's content": _build(
            stream_ids, epoch, ObjectIdentity(deployment_id, object_id + 7), shift=1
        )[0],
    }
    for label, data in swaps.items():
        assert data != good, label
    for label in ("another deployment's object", "another object id's file"):
        # Same layout, other bytes: only the identity checks can tell these from ours.
        assert len(swaps[label]) == len(good)
        assert parse_index(swaps[label], len(good)).entries == parse_index(good, len(good)).entries
    return Fixture(
        store,
        name,
        deployment_id,
        object_id,
        key,
        good,
        parse_index(good, len(good)),
        stream_ids,
        expected,
        swaps,
    )


# ---------------------------------------------------------------- damage


@dataclass(frozen=True)
class Case:
    damage: str
    data: bytes
    bad_block: tuple[int, int, int] | None = None
    """``(stream_id, start_offset, end_offset)`` of the one data block the damage lies in."""


def _regions(fixture: Fixture) -> dict[str, list[tuple[int, tuple[int, int, int] | None]]]:
    """Byte positions of each region, with the data block each one lies in."""
    regions: dict[str, list[tuple[int, tuple[int, int, int] | None]]] = {
        "flip block header": [],
        "flip block payload": [],
        "flip block crc": [],
        "flip index": [],
        "flip footer": [],
        "flip footer identity": [],
    }
    for entry in fixture.index.entries:
        block = (entry.stream_id, entry.start_offset, entry.end_offset)
        end = entry.position + entry.size
        # Batch headers of every batch in the block (the first one's position is known; the
        # rest are found by walking the sizes in the header).
        position = entry.position
        while position < end - 4:
            size = decode_batch_header(fixture.good[position : end - 4]).size
            header_end = position + BATCH_HEADER.size
            regions["flip block header"].extend((p, block) for p in range(position, header_end))
            regions["flip block payload"].extend(
                (p, block) for p in range(header_end, position + size)
            )
            position += size
        regions["flip block crc"].extend((p, block) for p in range(end - 4, end))
    index_end = len(fixture.good) - FOOTER_SIZE
    regions["flip index"] = [(p, None) for p in range(fixture.index.index_position, index_end)]
    identity_first = index_end + 24  # after index_position, lengths, crc, count, version, flags
    regions["flip footer identity"] = [
        (p, None) for p in range(identity_first, identity_first + 24)
    ]
    regions["flip footer"] = [
        (p, None)
        for p in range(index_end, len(fixture.good))
        if not identity_first <= p < identity_first + 24
    ]
    return regions


def _cases(fixture: Fixture, rng: random.Random, soak: bool) -> list[Case]:
    cases: list[Case] = []
    good = fixture.good
    for damage, positions in _regions(fixture).items():
        assert positions, damage
        chosen = positions if soak else rng.sample(positions, min(len(positions), 40))
        for position, block in chosen:
            bit = rng.randrange(8)
            data = good[:position] + bytes([good[position] ^ (1 << bit)]) + good[position + 1 :]
            cases.append(Case(damage, data, block))
    lengths = list(range(0, len(good), 5)) if soak else rng.sample(range(len(good)), 40)
    cases.extend(Case("truncate", good[:length]) for length in lengths)
    for extra in (1, 7, FOOTER_SIZE, 500):
        cases.append(Case("append bytes", good + bytes(rng.randrange(256) for _ in range(extra))))
    for label, data in fixture.swaps.items():
        cases.append(Case(f"swap: {label}", data))
    return cases


# ---------------------------------------------------------------- reading and classifying


@dataclass
class Observation:
    outcome: Outcome
    detail: str = ""
    isolation: str = ""


def _judge(
    expected: list[SequencedRecord], start: int, records: list[SequencedRecord]
) -> tuple[Outcome, str]:
    if not records:
        return Outcome.SILENT_LOSS, f"empty read at committed offset {start}"
    want = expected[start : start + len(records)]
    if records != want:
        return Outcome.WRONG_DATA, f"read at {start} returned other records"
    return Outcome.INTACT, ""


async def _read_with_object_reader(fixture: Fixture, case: Case) -> Observation:
    reader = ObjectReader(
        fixture.store, fixture.metadata(), readahead_min_bytes=400, readahead_max_bytes=4000
    )
    detected = False
    isolation: list[str] = []
    for _round in range(2):
        for stream_id, expected in fixture.expected.items():
            for start in range(len(expected)):
                try:
                    records = await reader.read(stream_id, start, None, READ_LIMIT, 1 << 20)
                except CorruptionError:
                    detected = True
                    bad = case.bad_block
                    needs_bad = (
                        bad is not None
                        and bad[0] == stream_id
                        and start < bad[2]
                        and start + READ_LIMIT > bad[1]
                    )
                    if bad is not None and not needs_bad:
                        isolation.append(f"stream {stream_id} offset {start}")
                    continue
                except WalstreamError as exc:
                    raise AssertionError(f"{case.damage}: untyped failure {exc!r}") from exc
                outcome, detail = _judge(expected, start, records)
                if outcome is not Outcome.INTACT:
                    return Observation(outcome, detail)
    return Observation(
        Outcome.DETECTED if detected else Outcome.INTACT, isolation="; ".join(isolation[:3])
    )


async def _read_with_engine(fixture: Fixture, case: Case) -> Observation:
    client = Client(
        wal=MemoryWal(name=f"{fixture.metadata_name}-engine-{random.getrandbits(32)}"),
        objects=fixture.store,
        metadata=fixture.metadata(),
        config=EngineConfig(node_id=2, compaction=CompactionConfig(enabled=False)),
    )
    detected = False
    async with client:
        for name, stream_id in fixture.stream_ids.items():
            stream = await client.open_stream(name)
            expected = fixture.expected[stream_id]
            for start in range(0, len(expected), 3):
                try:
                    result = await stream.read(
                        start=start, limit_records=READ_LIMIT, limit_bytes=1 << 20
                    )
                except CorruptionError:
                    detected = True
                    continue
                outcome, detail = _judge(expected, start, list(result.records))
                if outcome is not Outcome.INTACT:
                    return Observation(outcome, f"engine: {detail}")
    return Observation(Outcome.DETECTED if detected else Outcome.INTACT)


@pytest.mark.slow
async def test_damaged_objects_read_back_correct_or_fail_typed(soak: bool) -> None:
    began = time.monotonic()
    rng = random.Random(20261123)
    fixture = await _fixture()
    assert len(fixture.index.entries) >= 15, "several blocks per stream"
    report = FuzzReport("object files: bit flips, truncation, appended bytes, swapped files")
    # The pristine object reads back intact both ways.
    pristine = Case("none", fixture.good)
    assert (await _read_with_object_reader(fixture, pristine)).outcome is Outcome.INTACT
    assert (await _read_with_engine(fixture, pristine)).outcome is Outcome.INTACT

    isolation_failures: list[str] = []
    engine_runs: dict[str, int] = {}
    cases = _cases(fixture, rng, soak)
    for case in cases:
        await fixture.store.put(fixture.key, case.data)
        observed = await _read_with_object_reader(fixture, case)
        report.add("object reader", case.damage, observed.outcome, observed.detail)
        if observed.isolation:
            isolation_failures.append(
                f"{case.damage}: reads outside the bad block failed at {observed.isolation}"
            )
        if engine_runs.get(case.damage, 0) < 2:
            engine_runs[case.damage] = engine_runs.get(case.damage, 0) + 1
            engine = await _read_with_engine(fixture, case)
            report.add("engine read", case.damage, engine.outcome, engine.detail)
    await fixture.store.put(fixture.key, fixture.good)

    elapsed = time.monotonic() - began
    print(f"\n{len(cases)} damaged objects in {elapsed:.1f}s")
    report.assert_safe()
    assert not isolation_failures, "\n".join(isolation_failures[:10])
    # Every swapped-in file of another identity is named as such, not just as corruption.
    for label, data in fixture.swaps.items():
        await fixture.store.put(fixture.key, data)
        reader = ObjectReader(fixture.store, fixture.metadata())
        stream_id = fixture.stream_ids["alpha"]
        try:
            await reader.read(stream_id, 0, None, READ_LIMIT, 1 << 20)
        except CorruptionError as exc:
            assert isinstance(exc, IdentityMismatch), (label, exc)
            assert fixture.key in str(exc), label
        else:
            raise AssertionError(f"swap {label!r} was read without an error")
    await fixture.store.put(fixture.key, fixture.good)

    detected = sum(
        count
        for (_t, damage, outcome), count in report.counts.items()
        if outcome is Outcome.DETECTED and damage != "append bytes"
    )
    assert detected > 0
    if not soak:
        assert elapsed < 60
