"""Node leases on PostgreSQL: expiries on the server's clock, and an automatic failover of a node
that stopped renewing, by the engine of a surviving node."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from walstream import Client, EngineConfig, FencedError, Record
from walstream.config import CompactionConfig, UploadConfig
from walstream.config.engine import ClusterConfig
from walstream.metadata import NodeState
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal

pytestmark = pytest.mark.asyncio


async def test_a_node_that_stops_renewing_is_failed_over_on_postgres(make_store: Any) -> None:
    name = f"pg-lease-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)

    def node(node_id: int) -> Client:
        client = Client(
            wal=MemoryWal(name=f"{name}-wal{node_id}"),
            objects=objects,
            metadata=make_store(),
            config=EngineConfig(
                node_id=node_id,
                upload=UploadConfig(max_interval_s=60.0),  # node 1's records stay in its WAL
                compaction=CompactionConfig(enabled=False),
                cluster=ClusterConfig(0.5, 0.1),
            ),
        )
        client.wal_factory = lambda info: MemoryWal(name=f"{name}-wal{info.node_id}")
        return client

    first, second = node(1), node(2)
    await first.start()
    await second.start()
    store = second.metadata
    before = await store.store_time_ms()
    info = await store.get_node(1)
    assert info is not None and before < info.lease_expires_ms <= before + 500
    stream = await first.create_stream("orders")
    for i in range(30):
        await stream.append([Record(b"%d" % i)])
    assert first.cluster is not None and second.cluster is not None
    await first.cluster.stop()
    while not second.cluster.stats.failovers_done:
        assert not second.cluster.stats.failovers_failed, second.cluster.stats
        await asyncio.sleep(0.05)  # bounded by the test's timeout
    info = await store.get_node(1)
    assert info is not None and info.state is NodeState.FAILED_OVER
    with pytest.raises(FencedError):
        await stream.append([Record(b"zombie")])
    taken = await second.open_stream("orders")
    result = await taken.read(start=0, limit_records=100)
    assert [r.value for r in result.records] == [b"%d" % i for i in range(30)]
    await first.close()
    await second.close()
