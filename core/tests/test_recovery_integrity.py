"""Recovery of a WAL that lost acknowledged records: the node refuses to start, the operator's
accept-loss records the lost ranges, reads of them raise DataLossError and no acknowledged
offset is ever assigned again.

Damage is simulated at recovery time on a memory WAL, the way a flipped bit on a disk shows up
on the next start: records dropped (the next one carrying ``damage_before``, WAL invariant 11),
records whose bytes are garbled, or trailing damage reported by an empty record.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest
from walstream import Client, EngineConfig, FencedError, Record
from walstream.cli import main
from walstream.config import CompactionConfig, RecoveryConfig, UploadConfig
from walstream.engine.read import read_committed
from walstream.engine.recovery import RecoveryRefused, max_records_in
from walstream.errors import CorruptionError, DataLossError
from walstream.metadata import MetadataStore, NodeState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal import WalDamage, WalRecord
from walstream.wal.memory import _WAL_VOLUMES, MemoryWal

# Nothing is uploaded unless a test flushes: the WAL holds every acknowledged record.
NO_UPLOADS = EngineConfig(
    upload=UploadConfig(max_bytes=64 << 20, max_interval_s=3600),
    compaction=CompactionConfig(enabled=False),
)
ACCEPT = dataclasses.replace(NO_UPLOADS, recovery=RecoveryConfig(accept_loss=True))
DAMAGE_REASON = "checksum mismatch"


class DamagedMemoryWal(MemoryWal):
    """A memory WAL whose recovery sees damage: records at ``lose`` are gone (the next valid
    record reports them as ``damage_before``; at the end, an empty record does when
    ``report_trailing``), records at ``garble`` come back with a broken batch header."""

    def __init__(
        self,
        name: str,
        *,
        lose: Iterable[int] = (),
        garble: Iterable[int] = (),
        report_trailing: bool = True,
        fail_reset: bool = False,
    ) -> None:
        super().__init__(name=name)
        self.lose = set(lose)
        self.garble = set(garble)
        self.report_trailing = report_trailing
        self.fail_reset = fail_reset

    async def _recover(self) -> AsyncIterator[WalRecord]:
        pending: WalDamage | None = None
        async for record in super()._recover():
            if record.offset in self.lose:
                start = record.offset if pending is None else pending.start
                size = len(record.data) + (0 if pending is None else pending.damaged_bytes)
                pending = WalDamage(start, record.offset + 1, size, DAMAGE_REASON)
                continue
            data = record.data
            if record.offset in self.garble:
                data = b"\x00" + data[1:]  # the batch magic is gone
            yield WalRecord(record.offset, data, pending)
            pending = None
        if pending is not None and self.report_trailing:
            yield WalRecord(pending.end, b"", pending)

    async def _reset(self) -> None:
        if self.fail_reset:
            raise OSError("simulated crash before the WAL was reset")
        await super()._reset()


class Deployment:
    """Backends that outlive clients (the way disks outlive processes)."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.name = f"integrity-{kind}-{os.urandom(4).hex()}"
        self.objects = (
            MemoryObjectStore(self.name) if kind == "memory" else LocalObjectStore(root / "objects")
        )

    def metadata(self) -> MetadataStore:
        if self.kind == "memory":
            return MemoryMetadataStore(name=self.name)
        return SqliteMetadataStore(self.root / "meta.db")

    def client(
        self, config: EngineConfig = NO_UPLOADS, wal: MemoryWal | None = None, node: str = ""
    ) -> Client:
        return Client(
            wal=wal or MemoryWal(name=self.name + node),
            objects=self.objects,
            metadata=self.metadata(),
            config=config,
        )

    def damaged(self, **damage: object) -> DamagedMemoryWal:
        return DamagedMemoryWal(self.name, **damage)  # type: ignore[arg-type]

    def wal_offsets(self) -> list[int]:
        return [record.offset for record in _WAL_VOLUMES[self.name].records]


@pytest.fixture(params=["memory", "sqlite"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Deployment:
    return Deployment(request.param, tmp_path)


def value(stream: str, offset: int) -> bytes:
    return f"{stream}-{offset}".encode()


async def write_interleaved(client: Client) -> dict[str, list[int]]:
    """Stream c gets one record, then a and b take turns (10 single-record appends each).
    Returns each stream's WAL offsets, indexed by stream offset."""
    volume = client.wal._volume  # type: ignore[attr-defined]
    wal_offsets: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    streams = {name: await client.create_stream(name) for name in "abc"}
    await streams["c"].append([Record(value("c", 0))])
    wal_offsets["c"].append(volume.records[-1].offset)
    for offset in range(10):
        for name in "ab":
            ack = await streams[name].append([Record(value(name, offset))])
            assert ack.start == offset
            wal_offsets[name].append(volume.records[-1].offset)
    return wal_offsets


def lost_bound(deployment: Deployment, wal_offsets: Iterable[int]) -> int:
    """What the test WAL's damage reports allow: each lost record one damaged region."""
    wanted = set(wal_offsets)
    volume = _WAL_VOLUMES[deployment.name]
    return sum(max_records_in(len(r.data)) for r in volume.records if r.offset in wanted)


async def read_values(client: Client, name: str, start: int = 0) -> list[tuple[int, bytes]]:
    stream = await client.open_stream(name)
    result = await stream.read(start=start, limit_records=1000)
    return [(record.offset, record.value) for record in result.records]


# -- refuse -----------------------------------------------------------------------------------------


async def test_restart_refuses_naming_the_wal_the_damage_and_the_streams(
    deployment: Deployment,
) -> None:
    crashed = await deployment.client().start()
    offsets = await write_interleaved(crashed)
    streams = {info.name: info.stream_id for info in await crashed.list_streams()}
    # a's record at offset 2 and c's only record are lost; b continues without a gap.
    lost = [offsets["a"][2], offsets["c"][0]]

    for attempt in range(2):  # refusing changes nothing: the second start refuses the same way
        with pytest.raises(CorruptionError) as refused:
            await deployment.client(wal=deployment.damaged(lose=lost)).start()
        message = str(refused.value)
        assert isinstance(refused.value, RecoveryRefused)
        assert "node 1 refuses to start" in message
        assert "{'type': 'memory'" in message, "the message names the WAL (wal.describe())"
        assert f"WAL offsets [{offsets['a'][2]}, {offsets['a'][2] + 1})" in message
        assert DAMAGE_REASON in message
        assert f"stream {streams['a']} ('a'): offsets [2, 3) are lost" in message
        assert f"stream {streams['c']} ('c'): offsets from 0 may be lost" in message
        assert f"stream {streams['b']} ('b')" not in message, "b lost nothing"
        assert "walstream recover --accept-loss" in message
        losses = {
            (loss.stream_id, loss.start_offset, loss.exact) for loss in refused.value.stats.losses
        }
        assert losses == {(streams["a"], 2, True), (streams["c"], 0, False)}, attempt

    # Nothing was reset or released: the WAL still holds every record, node 1 still owns the
    # streams (no other node can claim one and reuse a lost offset).
    assert len(deployment.wal_offsets()) == 21
    metadata = deployment.metadata()
    node = await metadata.get_node(1)
    assert node is not None and node.state is NodeState.RUNNING
    by_id = await metadata.get_streams(list(streams.values()))
    # Committed: a up to its gap, b entirely (it continued after the damage), nothing of c.
    assert {name: by_id[stream_id].committed_end for name, stream_id in streams.items()} == {
        "a": 2,
        "b": 10,
        "c": 0,
    }
    assert all(info.owner_node_id == 1 for info in by_id.values())
    other = await deployment.client(
        node="-node2", config=dataclasses.replace(NO_UPLOADS, node_id=2)
    ).start()
    with pytest.raises(FencedError):
        await (await other.open_stream("a")).append([Record(b"reuse?")])
    await other.close()


async def test_record_that_is_not_a_batch_refuses(deployment: Deployment) -> None:
    crashed = await deployment.client().start()
    offsets = await write_interleaved(crashed)
    garbled = offsets["b"][4]
    with pytest.raises(RecoveryRefused) as refused:
        await deployment.client(wal=deployment.damaged(garble=[garbled])).start()
    message = str(refused.value)
    assert f"the WAL record at offset {garbled}" in message
    assert "is not a valid batch" in message and "bad batch magic" in message
    assert "b'): offsets [4, 5) are lost" in message


async def test_stream_discontinuity_without_a_damage_report_refuses(
    deployment: Deployment,
) -> None:
    """A WAL that drops a record without reporting it still cannot hide the loss: the stream's
    next batch starts above its expected offset."""
    crashed = await deployment.client().start()
    offsets = await write_interleaved(crashed)
    volume = _WAL_VOLUMES[deployment.name]
    volume.records = [r for r in volume.records if r.offset != offsets["a"][6]]
    with pytest.raises(RecoveryRefused) as refused:
        await deployment.client().start()
    message = str(refused.value)
    assert "a'): offsets [6, 7) are lost" in message
    assert "stream discontinuity" in message


async def test_deleted_streams_and_committed_batches_are_not_loss(deployment: Deployment) -> None:
    """Dropping what is already committed or belongs to a deleted stream is not loss: an
    undamaged WAL holding such batches starts without refusing and records nothing."""
    crashed = await deployment.client().start()
    await write_interleaved(crashed)
    await crashed.flush()  # a, b, c committed; the WAL keeps records until its next trim
    doomed = await crashed.create_stream("doomed")
    for offset in range(3):
        await doomed.append([Record(value("doomed", offset))])
    await crashed.delete_stream("doomed")
    client = await deployment.client(wal=deployment.damaged()).start()
    assert client.recovery is not None and not client.recovery.loss_detected
    assert client.recovery.losses == [] and client.recovery.recorded_gaps == []
    assert client.recovery.dropped_batches >= 3, "the deleted stream's batches were in the WAL"
    for name in "ab":
        assert await read_values(client, name) == [(i, value(name, i)) for i in range(10)]
    await client.close()


# -- accept ----------------------------------------------------------------------------------------


async def test_accept_loss_records_gaps_reads_raise_and_offsets_are_never_reused(
    deployment: Deployment,
) -> None:
    crashed = await deployment.client().start()
    offsets = await write_interleaved(crashed)
    lost = [offsets["a"][2], offsets["a"][3], offsets["c"][0]]
    c_bound = lost_bound(deployment, lost)
    wal = deployment.damaged(lose=lost)
    client = await deployment.client(ACCEPT, wal=wal).start()
    assert client.recovery is not None
    gaps = {(g.stream_id, g.start_offset, g.end_offset) for g in client.recovery.recorded_gaps}
    ids = {info.name: info.stream_id for info in await client.list_streams()}
    # c has no record after the damage: it may have had records in any of the three damaged
    # regions, each one WAL record that could hold max_records_in(its size) records.
    assert c_bound == 3, "three separate one-record regions, each room for one small record"
    assert gaps == {(ids["a"], 2, 4), (ids["c"], 0, c_bound)}, "b lost nothing"
    c_gap = (ids["c"], 0, c_bound)
    assert deployment.wal_offsets() == [], "accept-loss resets the WAL"

    # Every other acknowledged record is intact.
    assert await read_values(client, "b") == [(i, value("b", i)) for i in range(10)]
    assert await read_values(client, "a") == [(0, value("a", 0)), (1, value("a", 1))], (
        "a read that starts before a gap returns the records up to it"
    )
    assert await read_values(client, "a", 4) == [(i, value("a", i)) for i in range(4, 10)]
    stream_a = await client.open_stream("a")
    for start in (2, 3):
        with pytest.raises(DataLossError) as lost_read:
            await stream_a.read(start=start)
        error = lost_read.value
        assert (error.stream_id, error.start_offset, error.end_offset) == (ids["a"], 2, 4)
        assert "read from 4 to continue" in str(error)
    with pytest.raises(DataLossError):
        await (await client.open_stream("c")).read(start=0)

    # New appends land above every offset ever acknowledged.
    assert (await stream_a.append([Record(b"new-a")])).start == 10
    ack_c = await (await client.open_stream("c")).append([Record(b"new-c")])
    assert ack_c.start == c_gap[2] and ack_c.start > 0
    await client.close()

    # The gaps are durable: after an undamaged restart reads of them still raise.
    restarted = await deployment.client().start()
    assert restarted.recovery is not None and not restarted.recovery.loss_detected
    with pytest.raises(DataLossError):
        await (await restarted.open_stream("a")).read(start=3)
    assert (await read_values(restarted, "a", 4))[-1] == (10, b"new-a")
    await restarted.close()


async def test_trailing_damage_report_accepts_with_a_bounded_gap(deployment: Deployment) -> None:
    crashed = await deployment.client().start()
    offsets = await write_interleaved(crashed)
    # The last records of a and b are in damage at the very end, reported as not torn.
    lost = [offsets["a"][9], offsets["b"][9]]
    with pytest.raises(RecoveryRefused) as refused:
        await deployment.client(wal=deployment.damaged(lose=lost)).start()
    assert "a'): offsets from 9 may be lost" in str(refused.value)
    assert "b'): offsets from 9 may be lost" in str(refused.value)

    client = await deployment.client(ACCEPT, wal=deployment.damaged(lose=lost)).start()
    for name in "ab":
        stream = await client.open_stream(name)
        assert await read_values(client, name) == [(i, value(name, i)) for i in range(9)]
        with pytest.raises(DataLossError):
            await stream.read(start=9)
        ack = await stream.append([Record(b"after")])
        assert ack.start > 9, "offset 9 was acknowledged before the crash"
    await client.close()


async def test_undamaged_restart_records_nothing(deployment: Deployment) -> None:
    crashed = await deployment.client().start()
    await write_interleaved(crashed)
    client = await deployment.client(ACCEPT, wal=deployment.damaged()).start()
    assert client.recovery is not None
    assert not client.recovery.loss_detected and client.recovery.recorded_gaps == []
    assert client.recovery.records == 21
    for name in "ab":
        assert await read_values(client, name) == [(i, value(name, i)) for i in range(10)]
        assert await client.metadata.get_data_loss((await client.open_stream(name)).stream_id) == []
    await client.close()


async def test_interrupted_accept_loss_is_not_recorded_twice(deployment: Deployment) -> None:
    crashed = await deployment.client().start()
    offsets = await write_interleaved(crashed)
    lost = [offsets["a"][5], offsets["c"][0], offsets["b"][9]]
    with pytest.raises(OSError):
        await deployment.client(ACCEPT, wal=deployment.damaged(lose=lost, fail_reset=True)).start()
    metadata = deployment.metadata()
    streams = await metadata.list_streams()
    first = {s.name: await metadata.get_data_loss(s.stream_id) for s in streams}
    # a: exactly [5, 6), and maybe records in b's trailing damage after a's last record; b: its
    # trailing record; c: any of the three regions after its only record... which is lost too.
    assert {
        name: [(g.start_offset, g.end_offset) for g in gaps] for name, gaps in first.items()
    } == {
        "a": [(5, 6), (10, 11)],
        "b": [(9, 10)],
        "c": [(0, 3)],
    }
    ends = {s.stream_id: s.committed_end for s in streams}

    client = await deployment.client(ACCEPT, wal=deployment.damaged(lose=lost)).start()
    streams = await client.metadata.list_streams()
    again = {s.name: await client.metadata.get_data_loss(s.stream_id) for s in streams}
    assert {k: [(g.start_offset, g.end_offset) for g in v] for k, v in again.items()} == {
        k: [(g.start_offset, g.end_offset) for g in v] for k, v in first.items()
    }
    assert {s.stream_id: s.committed_end for s in streams} == ends
    await client.close()


# -- reads ----------------------------------------------------------------------------------------


async def test_nodeless_reader_and_tail_surface_the_gap(deployment: Deployment) -> None:
    crashed = await deployment.client().start()
    offsets = await write_interleaved(crashed)
    client = await deployment.client(ACCEPT, wal=deployment.damaged(lose=[offsets["b"][3]])).start()
    stream = await client.open_stream("b")
    seen: list[int] = []
    with pytest.raises(DataLossError) as lost:
        async for record in read_committed(client.objects, client.metadata, stream.stream_id, 0):
            seen.append(record.offset)
    assert seen == [0, 1, 2] and lost.value.start_offset == 3 and lost.value.end_offset == 4
    followed: list[int] = []
    with pytest.raises(DataLossError):
        async for record in stream.tail(start=1):
            followed.append(record.offset)
    assert followed == [1, 2]
    await client.close()


# -- failover -------------------------------------------------------------------------------------


async def test_failover_refuses_then_accepts(tmp_path: Path) -> None:
    deployment = Deployment("memory", tmp_path)
    dead = await deployment.client().start()
    offsets = await write_interleaved(dead)
    survivor = await deployment.client(
        dataclasses.replace(NO_UPLOADS, node_id=2), node="-node2"
    ).start()
    lost = [offsets["a"][7]]
    with pytest.raises(RecoveryRefused) as refused:
        await survivor.failover(1, deployment.damaged(lose=lost))
    assert "node 1 refuses to start" in str(refused.value)
    assert "a'): offsets [7, 8) are lost" in str(refused.value)
    assert "accept_loss=True" in str(refused.value)
    node = await survivor.metadata.get_node(1)
    assert node is not None and node.state is NodeState.FAILING_OVER
    with pytest.raises(FencedError):  # the dead node's streams stay unclaimable
        await (await survivor.open_stream("a")).append([Record(b"x")])

    stats = await survivor.failover(1, deployment.damaged(lose=lost), accept_loss=True)
    ids = {info.name: info.stream_id for info in await survivor.list_streams()}
    # a: exactly the lost record; c: its only record came before the damage, so it may have
    # had more in it (b continued after it: nothing lost).
    assert {(g.stream_id, g.start_offset, g.end_offset) for g in stats.recorded_gaps} == {
        (ids["a"], 7, 8),
        (ids["c"], 1, 2),
    }
    taken = await survivor.open_stream("a")
    assert (await taken.append([Record(b"a-10")])).start == 10
    assert await read_values(survivor, "a", 8) == [
        (8, value("a", 8)),
        (9, value("a", 9)),
        (10, b"a-10"),
    ]
    await survivor.close()


# -- the command line -------------------------------------------------------------------------------


def test_cli_recover_refuses_then_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"cli-recover-{os.urandom(4).hex()}"
    config = tmp_path / "deploy.yaml"
    config.write_text(
        f"node: {{id: 1}}\nwal: {{type: memory, name: {name}}}\n"
        f"object_store: {{type: local, root: {tmp_path / 'objects'}}}\n"
        f"metadata: {{type: sqlite, path: {tmp_path / 'meta.db'}}}\n"
        "upload: {max_bytes: 64MiB, max_interval: 1h}\ncompaction: {enabled: false}\n"
    )
    import asyncio

    import walstream

    async def write() -> None:
        client = await walstream.open(config)
        stream = await client.create_stream("orders")
        for offset in range(5):
            await stream.append([Record(value("orders", offset))])
        # Crash: abandon the client; then a record disappears from the WAL.

    asyncio.run(write())
    volume = _WAL_VOLUMES[name]
    volume.records = [volume.records[0], *volume.records[2:]]

    assert main(["recover", "-c", str(config)]) == 2
    refused = capsys.readouterr()
    assert "RecoveryRefused" in refused.err and "offsets [1, 2) are lost" in refused.err
    assert f"walstream recover --accept-loss -c {config}" in refused.err
    assert refused.err.count("refuses to start") == 1

    assert main(["recover", "-c", str(config), "--accept-loss"]) == 0
    accepted = capsys.readouterr().out
    assert "recorded as lost (1 gap;" in accepted and "[1, 2)" in accepted

    assert main(["recover", "-c", str(config), "--accept-loss"]) == 2
    assert "nothing to accept" in capsys.readouterr().out
    assert main(["recover", "-c", str(config)]) == 0
    assert "nothing was lost" in capsys.readouterr().out

    assert main(["inspect", "metadata", "-c", str(config)]) == 0
    assert "data-loss gaps (1; reads of them raise DataLossError)" in capsys.readouterr().out

    assert main(["read", "-c", str(config), "orders", "--start", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{i}\torders-{i}" for i in range(2, 5)]
    assert main(["read", "-c", str(config), "orders", "--start", "1"]) == 1
    assert "DataLossError" in capsys.readouterr().err
