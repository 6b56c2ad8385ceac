"""Compaction as a user sees it: small streams stay together in stream-set objects, a stream
gets objects of its own only past ``stream_split_bytes``, a pass never raises the object count,
reads each source once, copies nothing it could not check, keeps trims and data-loss gaps, and
stops when the client closes. Each rule has a test here that fails when the rule is broken."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from walstream import Client, EngineConfig, Record
from walstream.config import CompactionConfig, UploadConfig
from walstream.config.engine import engine_config_from_sections
from walstream.engine.events import Compacted, EngineEvent
from walstream.errors import (
    ConfigError,
    CorruptionError,
    DataLossError,
    InvalidArgument,
    OutOfRangeError,
)
from walstream.metadata import ObjectKind, ObjectState
from walstream.metadata.contract import DataLossGap, MetadataStore, ObjectCommit
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal
from walstream_conformance.faults import FaultyObjectStore

SPLIT = 4 << 10
SMALL = 16 << 10
LIMIT = 64 << 10


def compaction(**overrides: object) -> EngineConfig:
    options: dict[str, object] = {
        "enabled": False,
        "min_objects": 2,
        "stream_split_bytes": SPLIT,
        "small_object_bytes": SMALL,
        "max_object_bytes": LIMIT,
    }
    options.update(overrides)
    return EngineConfig(
        upload=UploadConfig(max_bytes=8 << 20, max_interval_s=3600, split_bytes=8 << 20),
        compaction=CompactionConfig(**options),  # type: ignore[arg-type]
    )


def value_for(stream: str, offset: int, size: int = 100) -> bytes:
    seed = hashlib.blake2b(f"{stream}:{offset}".encode(), digest_size=16).digest()
    return (seed * (size // 16 + 1))[:size]


class CountingStore(FaultyObjectStore):
    """Counts the GETs (and their bytes) per key."""

    def __init__(self, inner: MemoryObjectStore) -> None:
        super().__init__(inner)
        self.gets: Counter[str] = Counter()
        self.bytes_read = 0

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await super().get(key, start, end)
        self.gets[key] += 1
        self.bytes_read += len(data)
        return data


@dataclass
class Events:
    compacted: list[Compacted] = field(default_factory=list)

    def emit(self, event: EngineEvent) -> None:
        if isinstance(event, Compacted):
            self.compacted.append(event)


class Rig:
    """Backends that outlive a client, and the client's events."""

    def __init__(self, config: EngineConfig) -> None:
        self.name = f"compaction-{os.urandom(4).hex()}"
        self.inner = MemoryObjectStore(self.name)
        self.objects = CountingStore(self.inner)
        self.config = config
        self.events = Events()

    def metadata(self) -> MetadataStore:
        return MemoryMetadataStore(name=self.name)

    def client(self, metadata: MetadataStore | None = None) -> Client:
        return Client(
            wal=MemoryWal(name=self.name),
            objects=self.objects,
            metadata=metadata or self.metadata(),
            config=self.config,
            hooks=self.events,  # type: ignore[arg-type]
        )


async def fill(client: Client, names: list[str], rounds: int, per_round: dict[str, int]) -> None:
    """``rounds`` uploads (one stream-set object each); stream ``name`` gets ``per_round[name]``
    records of 100 bytes in each."""
    streams = {}
    for name in names:
        try:
            streams[name] = await client.open_stream(name)
        except Exception:
            streams[name] = await client.create_stream(name)
    for _ in range(rounds):
        for name in names:
            stream = streams[name]
            tail = await stream.check_tail()
            count = per_round[name]
            await stream.append([Record(value_for(name, tail + i)) for i in range(count)])
        await client.flush()


async def read_values(client: Client, name: str, start: int = 0) -> list[bytes]:
    stream = await client.open_stream(name)
    values: list[bytes] = []
    position = start
    while True:
        result = await stream.read(start=position, limit_records=100_000, limit_bytes=64 << 20)
        if not result.records:
            return values
        assert result.records[0].offset == position, "records skipped or repeated"
        values.extend(record.value for record in result.records)
        position = result.records[-1].offset + 1


async def check_all(rig: Rig, expected: dict[str, range]) -> None:
    """Read every stream back through a new client (no LogCache: from the objects)."""
    async with rig.client() as fresh:
        for name, offsets in expected.items():
            assert await read_values(fresh, name, offsets.start) == [
                value_for(name, offset) for offset in offsets
            ], name


async def stopped(pass_: asyncio.Task[bool]) -> None:
    """The pass ended (the timeout only detects a pass left running) with the typed error."""
    done, _ = await asyncio.wait({pass_}, timeout=120)
    assert pass_ in done, "close() left the compaction pass running"
    with pytest.raises(InvalidArgument):
        await pass_


async def committed(client: Client) -> list:  # type: ignore[type-arg]
    return await client.metadata.list_objects(state=ObjectState.COMMITTED)


async def test_small_streams_stay_together_and_a_big_stream_is_split() -> None:
    rig = Rig(compaction())
    names = [f"small{i}" for i in range(20)] + ["big"]
    per_round = {name: 1 for name in names} | {"big": 12}  # big: 1.2 KiB a round
    async with rig.client() as client:
        await fill(client, names, 6, per_round)
        before = await committed(client)
        assert len(before) == 6
        assert await client.compact()
        after = await committed(client)
        kinds = sorted((info.kind.value, len(info.ranges)) for info in after)
        # "big" holds ~7 KiB >= 4 KiB: its own stream object; the 20 small ones share one.
        assert kinds == [("stream", 1), ("stream_set", 20)]
        big = await client.open_stream("big")
        (own,) = [info for info in after if info.kind is ObjectKind.STREAM]
        assert own.ranges[0].stream_id == big.stream_id
        assert {meta.key async for meta in rig.inner.list()} == {info.key for info in after}
    await check_all(rig, {name: range(6 * per_round[name]) for name in names})


async def test_below_the_split_threshold_a_stream_gets_no_object_of_its_own() -> None:
    rig = Rig(compaction(stream_split_bytes=LIMIT))
    names = ["a", "b", "c"]
    async with rig.client() as client:
        await fill(client, names, 5, {"a": 30, "b": 1, "c": 1})  # a: 15 KiB in all
        assert await client.compact()
        after = await committed(client)
        assert [info.kind for info in after] == [ObjectKind.STREAM_SET]


async def test_a_step_never_writes_more_objects_than_it_replaces() -> None:
    # Two sources, five streams each over the split size: splitting all of them would write
    # five objects for two. The planner splits only as many as keep the count down.
    rig = Rig(compaction())
    names = [f"s{i}" for i in range(5)]
    async with rig.client() as client:
        await fill(client, names, 2, {name: 25 for name in names})
        before = len(await committed(client))
        assert await client.compact()
        assert rig.events.compacted
        for event in rig.events.compacted:
            assert len(event.new_object_ids) <= len(event.source_object_ids)
        assert len(await committed(client)) <= before
    await check_all(rig, {name: range(50) for name in names})


async def test_a_pass_reads_each_source_once_and_only_its_bytes() -> None:
    rig = Rig(compaction())
    names = [f"s{i}" for i in range(30)]
    async with rig.client() as client:
        await fill(client, names, 12, {name: 2 for name in names})
        sources = {info.object_id: info for info in await committed(client)}
        rig.objects.gets.clear()
        rig.objects.bytes_read = 0
        assert await client.compact()
        replaced = [sources[i] for event in rig.events.compacted for i in event.source_object_ids]
        assert len(rig.events.compacted) >= 2, "expected a pass of several steps"
        assert dict(rig.objects.gets) == {info.key: 1 for info in replaced}
        assert rig.objects.bytes_read == sum(info.size for info in replaced)


async def test_trimmed_data_is_dropped_and_live_data_kept() -> None:
    rig = Rig(compaction(stream_split_bytes=LIMIT))
    async with rig.client() as client:
        await fill(client, ["t", "u"], 6, {"t": 10, "u": 10})
        stream = await client.open_stream("t")
        await stream.trim(25)  # inside the third object's block of "t"
        assert await client.compact()
        with pytest.raises(OutOfRangeError):
            await stream.read(start=0, limit_records=1)
        (output,) = await committed(client)
        (t_range,) = [r for r in output.ranges if r.stream_id == stream.stream_id]
        # Whole blocks below the trim point are gone; the block holding 25 stays whole.
        assert t_range.start_offset == 20
    await check_all(rig, {"t": range(25, 60), "u": range(60)})


async def test_a_deleted_stream_is_dropped_and_others_survive() -> None:
    rig = Rig(compaction())
    async with rig.client() as client:
        await fill(client, ["gone", "kept"], 4, {"gone": 10, "kept": 10})
        await client.delete_stream("gone")
        assert await client.compact()
        (output,) = await committed(client)
        kept = await client.open_stream("kept")
        assert [r.stream_id for r in output.ranges] == [kept.stream_id]
    await check_all(rig, {"kept": range(40)})


async def test_a_data_loss_gap_stays_a_gap_after_compaction() -> None:
    rig = Rig(compaction())
    async with rig.client() as client:
        await fill(client, ["g", "h"], 2, {"g": 5, "h": 5})
        stream = await client.open_stream("g")
        gap = DataLossGap(stream.stream_id, 10, 13, "lost in a test")
        await client.metadata.record_data_loss(client.node_id, client.node_epoch, gap)
    async with rig.client() as client:
        await fill(client, ["g", "h"], 2, {"g": 5, "h": 5})
        assert await client.compact()
        for event in rig.events.compacted:
            assert len(event.new_object_ids) <= len(event.source_object_ids)
    async with rig.client() as client:
        stream = await client.open_stream("g")
        result = await stream.read(start=0, limit_records=100)
        assert [r.value for r in result.records] == [value_for("g", o) for o in range(10)]
        with pytest.raises(DataLossError):
            await stream.read(start=10, limit_records=100)
        assert await read_values(client, "g", 13) == [value_for("g", o) for o in range(13, 23)]


async def test_a_corrupt_source_is_never_rewritten() -> None:
    rig = Rig(compaction())
    async with rig.client() as client:
        await fill(client, ["c", "d"], 4, {"c": 10, "d": 10})
        sources = await committed(client)
        victim = sources[1]
        data = bytearray(rig.inner._objects[victim.key])
        data[50] ^= 0xFF  # inside the first data block
        rig.inner._objects[victim.key] = bytes(data)
        await client.compact()
        assert victim.object_id in {info.object_id for info in await committed(client)}
    async with rig.client() as client:
        with pytest.raises(CorruptionError):
            await read_values(client, "c")


async def test_appends_reads_and_trims_during_a_pass_stay_correct() -> None:
    rig = Rig(compaction())
    async with rig.client() as client:
        names = ["p", "q", "r"]
        await fill(client, names, 4, {name: 10 for name in names})
        gate = rig.objects.gate("put_if_absent", count=1)  # the pass's first output
        pass_ = asyncio.create_task(client.compact())
        await gate.arrived.wait()
        # Meanwhile: appends (uploaded too), reads and a trim.
        await fill(client, names, 1, {name: 10 for name in names})
        stream = await client.open_stream("q")
        await stream.trim(15)
        assert await read_values(client, "p") == [value_for("p", o) for o in range(50)]
        gate.release()
        assert await pass_
    await check_all(rig, {"p": range(50), "q": range(15, 50), "r": range(50)})


async def test_a_source_trimmed_away_during_a_step_drops_the_step_and_its_outputs() -> None:
    rig = Rig(compaction())
    async with rig.client() as client:
        await fill(client, ["only"], 3, {"only": 10})
        await fill(client, ["other"], 1, {"other": 10})  # so the sources are stream-set objects
        gate = rig.objects.gate("put_if_absent", count=1)
        pass_ = asyncio.create_task(client.compact())
        await gate.arrived.wait()
        stream = await client.open_stream("only")
        await stream.trim(20)  # the first two sources now hold only trimmed data
        gate.release()
        await pass_
        keys = {meta.key async for meta in rig.inner.list()}
        live = {info.key for info in await committed(client)}
        destroyed = {
            info.key
            for info in await client.metadata.list_objects(state=ObjectState.MARK_DESTROYED)
        }
        assert keys <= live | destroyed, "an output of a step that lost its race was left behind"
    await check_all(rig, {"only": range(20, 30), "other": range(10)})


class ReplaceThenHang(MemoryMetadataStore):
    """``replace_objects`` commits, then the answer never comes (a lost reply)."""

    replaced = asyncio.Event

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.committed_replace = asyncio.Event()

    async def replace_objects(self, source_ids: list[int], new_objects: list[ObjectCommit]) -> None:  # type: ignore[override]
        await super().replace_objects(source_ids, new_objects)
        self.committed_replace.set()
        await asyncio.Event().wait()


async def test_close_during_a_replace_that_committed_keeps_its_outputs() -> None:
    rig = Rig(compaction())
    async with rig.client() as client:
        await fill(client, ["x", "y"], 4, {"x": 10, "y": 10})
    metadata = ReplaceThenHang(rig.name)
    client = rig.client(metadata)
    await client.start()
    pass_ = asyncio.create_task(client.compact())
    await metadata.committed_replace.wait()
    await asyncio.wait_for(client.close(), 120)
    await stopped(pass_)
    await check_all(rig, {"x": range(40), "y": range(40)})


async def test_close_cancels_a_running_pass() -> None:
    rig = Rig(compaction())
    async with rig.client() as client:
        await fill(client, ["a", "b"], 4, {"a": 10, "b": 10})
    client = rig.client()
    await client.start()
    gate = rig.objects.gate("get", count=None)  # every GET of the pass waits: forever
    pass_ = asyncio.create_task(client.compact())
    await gate.arrived.wait()
    # Without cancellation close() waits for a pass that never ends (the timeout is a hang
    # detector, not a latency bound).
    await asyncio.wait_for(client.close(), 120)
    await stopped(pass_)
    gate.release()
    await check_all(rig, {"a": range(40), "b": range(40)})


async def test_an_interrupted_pass_keeps_the_steps_it_committed() -> None:
    rig = Rig(compaction(max_object_bytes=8 << 10, small_object_bytes=4 << 10))
    async with rig.client() as client:
        await fill(client, ["a", "b"], 12, {"a": 5, "b": 5})
        before = await committed(client)
        assert len(client._runtime.new_compactor().plan_steps(before)) >= 2

    gates = []
    first_step = asyncio.Event()

    class HoldAfterFirstStep(Events):
        def emit(self, event: EngineEvent) -> None:
            super().emit(event)
            if isinstance(event, Compacted) and not gates:
                gates.append(rig.objects.gate("get", count=None))  # the next step's GETs wait
                first_step.set()

    rig.events = HoldAfterFirstStep()
    client = rig.client()
    await client.start()
    pass_ = asyncio.create_task(client.compact())
    await first_step.wait()
    await gates[0].arrived.wait()
    await asyncio.wait_for(client.close(), 120)
    await stopped(pass_)
    gates[0].release()
    assert len(rig.events.compacted) == 1
    async with rig.client() as client:
        assert len(await committed(client)) < len(before)
    await check_all(rig, {"a": range(60), "b": range(60)})


def test_split_size_larger_than_the_step_is_refused() -> None:
    with pytest.raises(ConfigError, match="stream_split_bytes"):
        CompactionConfig(stream_split_bytes=128 << 20, max_object_bytes=64 << 20)
    with pytest.raises(ConfigError, match="small_object_bytes"):
        CompactionConfig(small_object_bytes=128 << 20, max_object_bytes=64 << 20)


async def test_many_random_passes_keep_every_record() -> None:
    rng = random.Random(31)
    rig = Rig(compaction())
    names = [f"r{i}" for i in range(12)]
    expected = dict.fromkeys(names, 0)
    async with rig.client() as client:
        for _ in range(6):
            per_round = {name: rng.choice([0, 1, 3, 20]) for name in names}
            active = [name for name in names if per_round[name]]
            await fill(client, active, rng.randint(1, 4), per_round)
            for name in active:
                expected[name] = await (await client.open_stream(name)).check_tail()
            before = len(await committed(client))
            await client.compact()
            assert len(await committed(client)) <= before
    await check_all(rig, {name: range(tail) for name, tail in expected.items() if tail})


def test_the_split_size_is_a_deployment_option() -> None:
    from walstream.config.engine import ENGINE_SECTIONS

    sections = {
        name: {o.name: o.default for o in options} for name, options in ENGINE_SECTIONS.items()
    }
    sections["compaction"]["stream_split_bytes"] = 1 << 20
    sections["node"]["id"] = 1
    sections["append_timeout"] = 30.0
    config = engine_config_from_sections(sections)
    assert config.compaction.stream_split_bytes == 1 << 20
