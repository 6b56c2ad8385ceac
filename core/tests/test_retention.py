"""Retention by age and delete-on-empty, enforced by each node's lifecycle loop: the start moves
past expired records (never past an unexpired one), reads below it raise the trimmed error, the
object files that held only expired records are deleted, and all of it holds across a restart
and for a stream whose owner is down. The clock is a ManualClock: the test decides when time
passes and waits for the loop's pass (an event), never for wall-clock time."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from walstream import Client, EngineConfig, Record, StreamConfig
from walstream.clock import ManualClock
from walstream.config import CompactionConfig, UploadConfig
from walstream.config.engine import StreamDefaults
from walstream.errors import OutOfRangeError, StreamNotFound
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream.server.cluster_status import lifecycle_metrics
from walstream.wal.memory import MemoryWal

CONFIG = EngineConfig(
    upload=UploadConfig(max_interval_s=3600),  # uploads when the test flushes
    compaction=CompactionConfig(enabled=False),
    streams=StreamDefaults(lifecycle_interval_s=1.0),
)


class Node:
    """A node's disks (WAL, object folder, SQLite file) that outlive each client."""

    def __init__(self, root: Path, clock: ManualClock, node_id: int = 1) -> None:
        self.root = root
        self.clock = clock
        self.node_id = node_id
        self.wal_name = f"wal-{node_id}-{os.urandom(4).hex()}"

    def client(self) -> Client:
        return Client(
            wal=MemoryWal(name=self.wal_name),
            objects=LocalObjectStore(self.root / "objects"),
            metadata=SqliteMetadataStore(self.root / "meta.db", clock=self.clock),
            config=EngineConfig(
                node_id=self.node_id,
                upload=CONFIG.upload,
                compaction=CONFIG.compaction,
                streams=CONFIG.streams,
            ),
            clock=self.clock,
        )

    def object_files(self) -> int:
        return sum(1 for path in (self.root / "objects").rglob("*") if path.is_file())


async def until(
    condition: Callable[[], object], what: str, clock: ManualClock, most_s: float
) -> None:
    """Let virtual time pass in steps of 0.1 s, up to ``most_s``, until ``condition()`` holds
    (each step gives the loop's timer its chance; real time at most 60 s, a generous bound, not
    a latency claim)."""
    advanced = 0.0
    for _ in range(6000):
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if advanced + 0.1 <= most_s + 1e-9:
            clock.advance(0.1)
            advanced += 0.1
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def start_of(client: Client, name: str) -> int:
    return (await client.metadata.get_stream(name)).start_offset


async def test_expired_records_are_trimmed_and_their_objects_deleted(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000_000)
    node = Node(tmp_path, clock)
    client = await node.client().start()
    # Uncapped: the records carry the timestamps the test gives, later ones in the future, so
    # nothing expires before the test moves the clock.
    stream = await client.create_stream(
        "events", config=StreamConfig(retention_age_s=2, uncapped=True)
    )
    t0 = clock.now_ms()
    # Three objects: a0, a1 at t0; b0, b1 at t0 + 1 s; c0 at t0 + 1.5 s with c1 at t0 + 3 s
    # (one object whose records expire at different times).
    await stream.append([Record(b"a0", timestamp_ms=t0), Record(b"a1", timestamp_ms=t0)])
    await client.flush()
    await stream.append([Record(b"b0", timestamp_ms=t0 + 1000), Record(b"b1")])
    await client.flush()
    await stream.append(
        [Record(b"c0", timestamp_ms=t0 + 1500), Record(b"c1", timestamp_ms=t0 + 3000)]
    )
    await client.flush()
    files_before = node.object_files()
    assert files_before == 3
    await client.run_lifecycle()
    assert await start_of(client, "events") == 0

    # t0 + 2.5 s: the cutoff is t0 + 0.5 s; a0, a1 have expired.
    clock.advance(2.5)
    await client.run_lifecycle()
    assert await start_of(client, "events") == 2
    with pytest.raises(OutOfRangeError) as trimmed:
        await stream.read(0)
    assert trimmed.value.start_offset == 2
    assert node.object_files() == files_before - 1, "the object of expired records was kept"

    # The loop does it by itself once time passes: from t0 + 3.6 s b0, b1 and c0 have expired
    # but not c1 (t0 + 3 s, until t0 + 5 s), which shares c0's object: that object stays.
    clock.advance(1.1)

    async def moved() -> bool:
        return await start_of(client, "events") > 2

    # At most one interval of the loop (1 s) later, still before c1 expires.
    await until(moved, "the lifecycle loop's pass", clock, most_s=1.2)
    assert await start_of(client, "events") == 5, "the start passed an unexpired record or lagged"
    assert [r.value for r in (await stream.read(5)).records] == [b"c1"]
    assert node.object_files() == files_before - 2
    assert client.lifecycle.records_expired == 5 and client.lifecycle.objects_collected == 2
    # /metrics shows the same work (the server's exposition appends these families).
    exposition = lifecycle_metrics(client).splitlines()
    assert "walstream_retention_expired_records_total 5" in exposition
    assert "walstream_retention_objects_deleted_total 2" in exposition
    assert "walstream_retention_trims_total 2" in exposition
    await client.close()

    # After a restart the due time is still in the metadata store: c1 expires at t0 + 5 s.
    restarted = await node.client().start()
    clock.advance(1.5)
    await restarted.run_lifecycle()
    assert await start_of(restarted, "events") == 6
    stream = await restarted.open_stream("events")
    with pytest.raises(OutOfRangeError):
        await stream.read(5)
    assert node.object_files() == 0
    # New records are kept for their own 2 s.
    ack = await stream.append([Record(b"d0")])
    assert ack.start == 6
    await restarted.flush()
    await restarted.run_lifecycle()
    assert [r.value for r in (await stream.read(6)).records] == [b"d0"]
    await restarted.close()


async def test_infinite_retention_and_other_streams_are_left_alone(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000_000)
    node = Node(tmp_path, clock)
    client = await node.client().start()
    kept = await client.create_stream("kept")
    aged = await client.create_stream("aged", config=StreamConfig(retention_age_s=60))
    await kept.append([Record(b"k")])
    await aged.append([Record(b"a")])
    await client.flush()
    clock.advance(120.0)
    await client.run_lifecycle()
    assert await start_of(client, "kept") == 0
    assert await start_of(client, "aged") == 1
    # Retention switched off: nothing more is trimmed, and nothing stays due.
    await aged.append([Record(b"b")])
    await aged.reconfigure(retention_age_s=None)
    await client.flush()
    clock.advance(120.0)
    await client.run_lifecycle()
    assert await start_of(client, "aged") == 1
    assert await client.metadata.due_streams(clock.now_ms() + 10**9) == []
    await client.close()


async def test_a_stream_whose_owner_is_down_is_trimmed_by_another_node(tmp_path: Path) -> None:
    """Node 1 writes the stream and stops holding a lease it no longer renews (its process is
    gone); node 2's lifecycle loop trims the stream through the metadata store."""
    clock = ManualClock(1_800_000_000_000)
    first = await Node(tmp_path, clock, 1).client().start()
    stream = await first.create_stream("orphan", config=StreamConfig(retention_age_s=10))
    await stream.append([Record(b"x"), Record(b"y")])
    await first.flush()
    info = await first.metadata.get_stream("orphan")
    assert info.owner_node_id == 1
    # Node 1's lease ran out (its process died without a clean stop).
    await first.metadata.renew_lease(1, first.node_epoch, 1)
    second = await Node(tmp_path, clock, 2).client().start()
    clock.advance(30.0)
    await second.run_lifecycle()
    assert await start_of(second, "orphan") == 2
    assert (await second.metadata.get_stream("orphan")).owner_node_id == 1, (
        "the trim claimed the stream"
    )
    await second.close()


async def test_a_stream_empty_for_its_min_age_is_deleted(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000_000)
    node = Node(tmp_path, clock)
    client = await node.client().start()
    config = StreamConfig(delete_on_empty_min_age_s=60)
    stream = await client.create_stream("brief", config=config)
    busy = await client.create_stream("busy", config=config)
    await busy.append([Record(b"kept")])
    await client.run_lifecycle()  # both seen: "brief" empty since now, "busy" not empty
    clock.advance(59.0)
    await client.run_lifecycle()
    assert (await client.open_stream("brief")).stream_id == stream.stream_id
    # An append and a trim back to empty start the count again.
    await stream.append([Record(b"r")])
    await stream.trim(1)
    clock.advance(2.0)
    await client.run_lifecycle()
    await client.open_stream("brief")
    clock.advance(59.0)
    await client.run_lifecycle()
    await client.open_stream("brief")
    clock.advance(2.0)
    await client.run_lifecycle()
    with pytest.raises(StreamNotFound):
        await client.open_stream("brief")
    assert client.lifecycle.streams_deleted == 1
    clock.advance(600.0)
    await client.run_lifecycle()
    assert [r.value for r in (await busy.read(0)).records] == [b"kept"]
    await client.close()


CHILD = """
import asyncio, sys, walstream

async def main():
    client = await walstream.open(sys.argv[1])
    stream = await client.create_stream(
        "expiring", config=walstream.StreamConfig(retention_age_s=2)
    )
    for i in range(20):
        await stream.append([walstream.Record(b"record-%d" % i)])
    await client.flush()
    print("DONE", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _cluster_node(root: Path, node_id: int) -> Path:
    path = root / f"node{node_id}.yaml"
    path.write_text(
        f"node: {{id: {node_id}, advertise: 'http://127.0.0.1:{7400 + node_id}'}}\n"
        f"wal: {{type: ebs, path: wal{node_id}.img, capacity: 16MiB}}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "compaction: {enabled: false}\n"
        "streams: {lifecycle_interval: 200ms}\n"
        "cluster: {lease_duration: 1s, heartbeat_interval: 200ms}\n"
    )
    return path


@pytest.mark.slow
async def test_retention_runs_when_the_owner_was_killed(tmp_path: Path) -> None:
    """Node 1 writes a stream with 2 s of retention and is killed with SIGKILL; node 2 trims
    it and deletes its objects (real clock and processes; the waits are generous bounds)."""
    import sys

    import walstream

    survivor = await walstream.open(_cluster_node(tmp_path, 2))
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(_cluster_node(tmp_path, 1)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stderr is not None
        line = (await asyncio.wait_for(child.stdout.readline(), 60)).decode()
        assert line.startswith("DONE"), (await child.stderr.read()).decode()
        objects_before = sum(1 for p in (tmp_path / "objects").rglob("*") if p.is_file())
        assert objects_before >= 1
        child.kill()
        await child.wait()

        async def trimmed() -> bool:
            return (await survivor.metadata.get_stream("expiring")).start_offset == 20

        for _ in range(1200):
            if await trimmed():
                break
            await asyncio.sleep(0.05)
        assert await trimmed(), "the survivor did not apply the dead owner's stream retention"
        stream = await survivor.open_stream("expiring")
        with pytest.raises(OutOfRangeError):
            await stream.read(0)
        for _ in range(1200):
            if not any(p.is_file() for p in (tmp_path / "objects").rglob("*")):
                break
            await asyncio.sleep(0.05)
        assert not any(p.is_file() for p in (tmp_path / "objects").rglob("*")), (
            "the expired records' objects were kept"
        )
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await survivor.close()


async def test_a_reconfigure_through_another_node_reaches_the_owner(tmp_path: Path) -> None:
    """Node 2 changes the timestamping of a stream node 1 writes: node 1's next lifecycle pass
    takes the new config for its appends."""
    clock = ManualClock(1_800_000_000_000)
    owner = await Node(tmp_path, clock, 1).client().start()
    other = await Node(tmp_path, clock, 2).client().start()
    stream = await owner.create_stream("shared")
    assert (await stream.append([Record(b"a", timestamp_ms=5)])).first_timestamp_ms == 5
    await (await other.open_stream("shared")).reconfigure(timestamping="arrival")
    await owner.run_lifecycle()
    ack = await stream.append([Record(b"b", timestamp_ms=6)])
    assert ack.first_timestamp_ms == clock.now_ms(), "the owner kept the old timestamping"
    assert await owner.metadata.due_streams(clock.now_ms() + 10**9) == []
    await other.close()
    await owner.close()
