"""Node leases (the ``cluster:`` section): self-fencing before the lease can expire at the store,
automatic failover by exactly one surviving node, and a failed-over node fenced until restart."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from walstream import Client, EngineConfig, FencedError, Record
from walstream.clock import ManualClock
from walstream.config import CompactionConfig, UploadConfig
from walstream.config.engine import ClusterConfig, cluster_config_of
from walstream.errors import BackendUnavailable, ConfigError
from walstream.metadata import NodeInfo, NodeState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.group_commit import PreparedGroup
from walstream.wal.memory import MemoryWal
from walstream_conformance.waiting import eventually

pytestmark = pytest.mark.asyncio


class FreezableStore(MemoryMetadataStore):
    """A memory store whose lease renewals can be frozen: they hang, like a store that stopped
    answering (the node's own clock still runs)."""

    frozen = False

    async def renew_lease(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        if self.frozen:
            await asyncio.Event().wait()
        return await super().renew_lease(node_id, node_epoch, lease_ms)


def config(node_id: int, lease_s: float, heartbeat_s: float) -> EngineConfig:
    return EngineConfig(
        node_id=node_id,
        upload=UploadConfig(max_interval_s=0.02),
        compaction=CompactionConfig(enabled=False),
        cluster=ClusterConfig(lease_s, heartbeat_s),
        advertise=f"http://127.0.0.1:{7400 + node_id}",
    )


async def test_a_node_stops_acknowledging_before_another_may_claim_it() -> None:
    clock = ManualClock()
    name = f"lease-{os.urandom(4).hex()}"
    store = FreezableStore(name, clock=clock)
    node = Client(
        wal=MemoryWal(name=f"{name}-wal1"),
        objects=MemoryObjectStore(name),
        metadata=store,
        config=config(1, 3.0, 0.5),
        clock=clock,
    )
    await node.start()
    registered = await store.get_node(1)
    assert registered is not None and registered.address == "http://127.0.0.1:7401"
    expiry_ms = registered.lease_expires_ms
    assert expiry_ms == clock.now_ms() + 3000
    store.frozen = True  # from here on no renewal reaches the store
    stream = await node.create_stream("s")
    await stream.append([Record(b"before")])
    margin = node.config.cluster.fence_margin_s  # type: ignore[union-attr]
    deadline = 3.0 - margin
    while clock.monotonic() + 0.05 < deadline:
        clock.advance(0.05)
        ack = await stream.append([Record(b"%.2f" % clock.monotonic())])
        assert ack.end > ack.start
        # While the node acknowledges, the store does not let anyone claim it.
        assert await store.claim_failover(1, registered.node_epoch, 2, 3000) is None
    clock.advance(deadline - clock.monotonic())
    with pytest.raises(FencedError, match="lost its lease"):
        await stream.append([Record(b"after")])
    assert isinstance(node.failure, FencedError)
    # The store's expiry is still ahead: the node fenced itself `margin` before anyone may claim.
    assert await store.store_time_ms() < expiry_ms
    assert expiry_ms - await store.store_time_ms() >= margin * 1000 - 1
    assert await store.claim_failover(1, registered.node_epoch, 2, 3000) is None
    clock.advance(margin + 0.001)
    claimed = await store.claim_failover(1, registered.node_epoch, 2, 3000)
    assert claimed is not None and claimed.state is NodeState.FAILING_OVER
    with pytest.raises(FencedError):
        await stream.append([Record(b"zombie")])
    await node.close()


class HeldWal(MemoryWal):
    """A memory WAL whose group writes wait for ``release`` (a device that stalls)."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.release = asyncio.Event()

    async def _write_group(self, group: PreparedGroup) -> None:
        await self.release.wait()
        await super()._write_group(group)


async def test_an_append_whose_wal_write_outlasts_the_lease_is_not_acknowledged() -> None:
    clock = ManualClock()
    name = f"lease-{os.urandom(4).hex()}"
    store = FreezableStore(name, clock=clock)
    wal = HeldWal(name=f"{name}-wal1")
    node = Client(
        wal=wal,
        objects=MemoryObjectStore(name),
        metadata=store,
        config=config(1, 3.0, 0.5),
        clock=clock,
    )
    wal.release.set()
    await node.start()
    store.frozen = True
    stream = await node.create_stream("s")
    wal.release.clear()
    pending = asyncio.create_task(stream.append([Record(b"late")]))
    await asyncio.sleep(0.01)
    assert not pending.done()  # the WAL holds the write
    clock.advance(3.0)  # the lease runs out while the WAL write is in flight
    wal.release.set()
    with pytest.raises(FencedError, match="lost its lease"):
        await pending
    # Past its lease the node vouches for no tail (another node may own the stream by now):
    # nothing it confirmed after the lease is readable through it, nor any tail at all.
    with pytest.raises(BackendUnavailable, match="lost its lease or was fenced"):
        await stream.check_tail()
    await node.close()


async def test_without_a_cluster_section_a_node_holds_no_lease() -> None:
    name = f"nolease-{os.urandom(4).hex()}"
    store = MemoryMetadataStore(name)
    node = Client(
        wal=MemoryWal(name=f"{name}-wal"),
        objects=MemoryObjectStore(name),
        metadata=store,
        config=EngineConfig(compaction=CompactionConfig(enabled=False), advertise="http://h:1"),
    )
    await node.start()
    info = await store.get_node(1)
    assert info is not None and (info.lease_expires_ms, info.address) == (0, None)
    assert node.cluster is None
    stream = await node.create_stream("s")
    await stream.append([Record(b"x")])
    await node.close()


async def test_a_heartbeat_too_slow_for_the_lease_is_refused() -> None:
    assert cluster_config_of(None) is None
    assert cluster_config_of({"lease_duration": 3.0, "heartbeat_interval": 0.5}) == ClusterConfig()
    with pytest.raises(ConfigError, match=r"cluster\.heartbeat_interval"):
        cluster_config_of({"lease_duration": 1.0, "heartbeat_interval": 0.5})



async def test_a_dead_node_is_failed_over_by_exactly_one_survivor() -> None:
    """Node 1 stops heartbeating (as if killed); of nodes 2 and 3 exactly one claims it, replays
    its WAL and releases its streams; every acknowledged record is readable; node 1 is fenced
    until it restarts with a new epoch."""
    name = f"failover-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)
    lease, heartbeat = 0.4, 0.05

    def node(node_id: int) -> Client:
        client = Client(
            wal=MemoryWal(name=f"{name}-wal{node_id}"),
            objects=objects,
            metadata=MemoryMetadataStore(name),
            config=config(node_id, lease, heartbeat),
        )
        client.wal_factory = lambda info: MemoryWal(name=f"{name}-wal{info.node_id}")
        return client

    first, second, third = node(1), node(2), node(3)
    for client in (first, second, third):
        await client.start()
    stream = await first.create_stream("orders")
    acked = []
    for i in range(20):
        await stream.append([Record(b"%d" % i)])
        acked.append(b"%d" % i)
    assert first.cluster is not None
    await first.cluster.stop()  # node 1 "dies": no more renewals, nothing uploaded
    store = MemoryMetadataStore(name)

    async def failed_over() -> bool:
        return any(c.cluster.stats.failovers_done for c in (second, third) if c.cluster)

    await eventually(failed_over, "a survivor to fail the node over")
    info = await store.get_node(1)
    assert info is not None and info.state is NodeState.FAILED_OVER
    claims = [c.cluster.stats.failovers_claimed for c in (second, third) if c.cluster]
    assert sorted(claims) == [0, 1], f"failover claims per survivor: {claims}"
    assert (await store.get_stream("orders")).owner_node_id is None
    with pytest.raises(FencedError):
        await stream.append([Record(b"zombie")])
    taken = await second.open_stream("orders")
    await taken.append([Record(b"20")])
    values = [r.value for r in (await taken.read(start=0, limit_records=100)).records]
    assert values == [*acked, b"20"]
    await first.close()
    restarted = node(1)
    await restarted.start()
    info = await store.get_node(1)
    assert info is not None and info.state is NodeState.RUNNING and info.lease_expires_ms > 0
    for client in (restarted, second, third):
        await client.close()


CHILD = """
import asyncio, sys, walstream

async def main():
    client = await walstream.open(sys.argv[1])
    stream = await client.create_stream("killed")
    for i in range(int(sys.argv[2])):
        ack = await stream.append([walstream.Record(b"record-%d" % i)])
        print("ACKED", ack.start, flush=True)
    print("DONE", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _deployment(root: Any, node_id: int) -> Any:
    path = root / f"node{node_id}.yaml"
    path.write_text(
        f"node: {{id: {node_id}, advertise: 'http://127.0.0.1:{7400 + node_id}'}}\n"
        f"wal: {{type: ebs, path: wal{node_id}.img, capacity: 64MiB}}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "upload: {max_interval: 10s}\n"  # node 1 dies with its records only in its WAL
        "compaction: {enabled: false}\n"
        "cluster: {lease_duration: 1s, heartbeat_interval: 200ms}\n"
    )
    return path


@pytest.mark.slow
async def test_kill_9_of_a_node_is_failed_over_automatically(tmp_path: Any) -> None:
    """Two processes on one SQLite file with file WALs: node 1 is killed with SIGKILL after
    acknowledging 40 records; node 2 notices the expired lease, rebuilds node 1's WAL from its
    registered config, replays it, and every acknowledged record is readable through node 2."""
    import sys

    import walstream

    survivor = await walstream.open(_deployment(tmp_path, 2))
    # asyncio's subprocess: the survivor's heartbeats run while the test waits for the child.
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(_deployment(tmp_path, 1)),
        "40",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stderr is not None
        acked = []
        while line := (await asyncio.wait_for(child.stdout.readline(), 60)).decode():
            if line.startswith("ACKED"):
                acked.append(int(line.split()[1]))
            if line.startswith("DONE"):
                break
        assert acked == list(range(40)), (await child.stderr.read()).decode()
        child.kill()
        await child.wait()
        member = survivor.cluster
        assert member is not None

        async def failed_over() -> bool:
            return member.stats.failovers_done + member.stats.failovers_failed > 0

        await eventually(failed_over, "a survivor to fail the node over")
        assert (member.stats.failovers_done, member.stats.failovers_failed) == (1, 0)
        info = await survivor.metadata.get_node(1)
        assert info is not None and info.state is NodeState.FAILED_OVER
        stream = await survivor.open_stream("killed")
        result = await stream.read(start=0, limit_records=100)
        assert [r.value for r in result.records] == [b"record-%d" % i for i in range(40)]
        await stream.append([Record(b"after")])
        assert await stream.check_tail() == 41
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await survivor.close()


async def test_a_failover_that_cannot_rebuild_the_wal_is_reported_and_keeps_the_streams() -> None:
    name = f"unreachable-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)
    clients = []
    for node_id in (1, 2):
        client = Client(
            wal=MemoryWal(name=f"{name}-wal{node_id}"),
            objects=objects,
            metadata=MemoryMetadataStore(name),
            config=config(node_id, 0.4, 0.05),
        )

        def unreachable(info: NodeInfo) -> MemoryWal:
            raise ConfigError(f"the WAL of node {info.node_id} is not reachable from here")

        client.wal_factory = unreachable
        await client.start()
        clients.append(client)
    first, second = clients
    stream = await first.create_stream("kept")
    await stream.append([Record(b"acked")])
    assert first.cluster is not None and second.cluster is not None
    await first.cluster.stop()
    member = second.cluster

    async def reported() -> bool:
        # Left to its failover lease, the failover is claimed again and fails again.
        return member.stats.failovers_failed > 1

    await eventually(reported, "the failover to be reported")
    assert member.stats.failovers_retried >= 1
    store = MemoryMetadataStore(name)
    info = await store.get_node(1)
    assert info is not None and info.state is NodeState.FAILING_OVER
    assert (await store.get_stream("kept")).owner_node_id == 1, "streams released unreplayed"
    assert member.stats.failovers_done == 0
    for client in clients:
        await client.close()
