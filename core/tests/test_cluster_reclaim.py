"""Failover leases: a failover that stops halfway (the claimer crashed, could not rebuild the WAL,
or hangs) is claimed again by a live node once the claimer's failover lease expires, and the
earlier claimer's commits are fenced by the newer epoch."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import pytest
from walstream import Client, EngineConfig, FencedError, Record
from walstream.clock import SystemClock, make_rng
from walstream.config import CompactionConfig, UploadConfig
from walstream.config.engine import ClusterConfig
from walstream.engine.events import NullHooks
from walstream.engine.recovery import failover_node
from walstream.errors import AmbiguousError, ConfigError
from walstream.metadata import NodeInfo, NodeState, ObjectCommit
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal
from walstream_conformance.waiting import eventually

pytestmark = pytest.mark.asyncio

LEASE, HEARTBEAT = 0.4, 0.05


def config(node_id: int, upload_interval_s: float = 0.02) -> EngineConfig:
    return EngineConfig(
        node_id=node_id,
        upload=UploadConfig(max_interval_s=upload_interval_s),
        compaction=CompactionConfig(enabled=False),
        cluster=ClusterConfig(LEASE, HEARTBEAT),
        advertise=f"http://127.0.0.1:{7400 + node_id}",
    )



class HeldCommits(MemoryMetadataStore):
    """The store as a stalled claimer sees it: its commits wait until ``release`` is set."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def commit_objects(
        self, node_id: int, node_epoch: int, objects: Sequence[ObjectCommit]
    ) -> None:
        self.waiting.set()
        await self.release.wait()
        await super().commit_objects(node_id, node_epoch, objects)


class AmbiguousFirstClaim(MemoryMetadataStore):
    """The first failover claim is applied, but its answer is lost (an ambiguous COMMIT)."""

    lost_answers = 0

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        claimed = await super().claim_failover(node_id, node_epoch, by_node_id, lease_ms)
        if claimed is not None and AmbiguousFirstClaim.lost_answers == 0:
            AmbiguousFirstClaim.lost_answers += 1
            raise AmbiguousError("the connection dropped during COMMIT; the claim may be applied")
        return claimed


class FrozenFailoverRenewals(MemoryMetadataStore):
    """A store that stops answering one claimer's failover lease renewals (they hang)."""

    async def renew_failover(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def dead_node_with_acked_records(name: str, objects: MemoryObjectStore) -> list[bytes]:
    """Node 1 acknowledges 20 records that stay in its WAL only, then stops renewing."""
    first = Client(
        wal=MemoryWal(name=f"{name}-wal1"),
        objects=objects,
        metadata=MemoryMetadataStore(name),
        config=config(1, upload_interval_s=60.0),
    )
    await first.start()
    stream = await first.create_stream("orders")
    acked = []
    for i in range(20):
        await stream.append([Record(b"r%d" % i)])
        acked.append(b"r%d" % i)
    assert first.cluster is not None
    await first.cluster.stop()  # node 1 "dies": no renewal, nothing uploaded
    return acked


async def read_all(client: Client) -> list[bytes]:
    stream = await client.open_stream("orders")
    result = await stream.read(start=0, limit_records=1000)
    return [record.value for record in result.records]


def survivor(name: str, objects: MemoryObjectStore, node_id: int, **kwargs: Any) -> Client:
    client = Client(
        wal=MemoryWal(name=f"{name}-wal{node_id}"),
        objects=objects,
        metadata=kwargs.pop("metadata", None) or MemoryMetadataStore(name),
        config=config(node_id),
    )
    client.wal_factory = kwargs.pop("wal_factory", None) or (
        lambda info: MemoryWal(name=f"{name}-wal{info.node_id}")
    )
    return client


async def test_a_claimer_stalled_before_its_commit_is_replaced_and_fenced() -> None:
    """A claimer wins node 1's failover, replays and uploads, then stalls before its commit
    renewing nothing (as if it crashed). Once its failover lease expires, live node 2 claims the
    failover again and finishes it; when the stalled claimer wakes up its commit is refused, and
    every acknowledged record is readable exactly once."""
    name = f"reclaim-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)
    acked = await dead_node_with_acked_records(name, objects)
    store = MemoryMetadataStore(name)
    dead = await store.get_node(1)
    assert dead is not None

    async def expired() -> bool:
        return await store.store_time_ms() > dead.lease_expires_ms

    await eventually(expired, "the lease to expire")
    stale = await store.claim_failover(1, dead.node_epoch, 9, int(LEASE * 1000))
    assert stale is not None and stale.state is NodeState.FAILING_OVER
    held = HeldCommits(name)
    stale_replay = asyncio.create_task(
        failover_node(
            dead_node_id=1,
            wal=MemoryWal(name=f"{name}-wal1"),
            objects=objects,
            metadata=held,
            config=config(9),
            hooks=NullHooks(),
            clock=SystemClock(),
            rng=make_rng(1),
            claimed=stale,
        )
    )
    await asyncio.wait_for(held.waiting.wait(), 10)
    second = survivor(name, objects, 2)
    await second.start()
    member = second.cluster
    assert member is not None

    async def finished() -> bool:
        return member.stats.failovers_done > 0

    await eventually(finished, "the reclaim to finish")
    assert (member.stats.failovers_retried, member.stats.failovers_failed) == (1, 0)
    info = await store.get_node(1)
    assert info is not None and info.state is NodeState.FAILED_OVER
    assert info.node_epoch == stale.node_epoch + 1
    held.release.set()
    with pytest.raises(FencedError):
        await asyncio.wait_for(stale_replay, 10)
    assert await read_all(second) == acked
    taken = await second.open_stream("orders")
    await taken.append([Record(b"after")])
    assert await taken.check_tail() == len(acked) + 1
    await second.close()


async def test_a_failover_that_failed_is_retried_by_the_same_node_after_a_backoff() -> None:
    """The only live node cannot rebuild the dead node's WAL at first: the failover fails, its
    failover lease expires, and the same node claims it again after its backoff and finishes."""
    name = f"retry-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)
    acked = await dead_node_with_acked_records(name, objects)
    attempts: list[float] = []

    def flaky(info: NodeInfo) -> MemoryWal:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise ConfigError(f"the WAL of node {info.node_id} is not reachable yet")
        return MemoryWal(name=f"{name}-wal{info.node_id}")

    second = survivor(name, objects, 2, wal_factory=flaky)
    await second.start()
    member = second.cluster
    assert member is not None

    async def finished() -> bool:
        return member.stats.failovers_done > 0

    await eventually(finished, "the reclaim to finish")
    stats = member.stats
    assert (stats.failovers_claimed, stats.failovers_failed, stats.failovers_retried) == (2, 1, 1)
    # Not before the failed attempt's failover lease expired (nor the node's own backoff).
    assert attempts[1] - attempts[0] >= LEASE * 0.9
    info = await second.metadata.get_node(1)
    assert info is not None and info.state is NodeState.FAILED_OVER
    assert await read_all(second) == acked
    await second.close()


async def test_a_claimer_that_cannot_renew_its_failover_lease_stops_and_another_finishes() -> None:
    """Node 2 claims the failover, its replay hangs and its failover lease renewals hang: it
    stops its own replay once its view of the failover lease runs out, and node 3 claims the
    failover after the store's expiry and finishes it."""
    name = f"hung-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)
    acked = await dead_node_with_acked_records(name, objects)
    calls: list[int] = []

    class HangingWal(MemoryWal):
        async def start(self, *args: Any, **kwargs: Any) -> None:
            await asyncio.Event().wait()

    def hangs_once(info: NodeInfo) -> MemoryWal:
        calls.append(info.node_epoch)
        if len(calls) == 1:
            return HangingWal(name=f"{name}-wal{info.node_id}")
        return MemoryWal(name=f"{name}-wal{info.node_id}")

    second = survivor(
        name, objects, 2, metadata=FrozenFailoverRenewals(name), wal_factory=hangs_once
    )
    await second.start()
    assert second.cluster is not None
    member = second.cluster

    async def claimed() -> bool:
        return member.stats.failovers_claimed > 0

    await eventually(claimed, "the stream to be claimed")
    third = survivor(name, objects, 3)
    await third.start()
    store = MemoryMetadataStore(name)

    async def finished() -> bool:
        node = await store.get_node(1)
        done = node is not None and node.state is NodeState.FAILED_OVER
        return done and member.stats.failovers_fenced > 0

    await eventually(finished, "the reclaim to finish")
    assert member.stats.failovers_fenced == 1
    assert third.cluster is not None
    retried = member.stats.failovers_retried + third.cluster.stats.failovers_retried
    assert retried == 1, f"the stopped failover was claimed again {retried} times"
    assert member.stats.failovers_done + member.stats.failovers_failed <= 1
    assert await read_all(third) == acked
    for client in (second, third):
        await client.close()


async def test_a_claim_whose_commit_was_ambiguous_is_claimed_again_after_its_lease() -> None:
    """The claim was applied but the claimer never learned it: nobody replays, the failover
    lease expires, and the failover is claimed again and finished."""
    name = f"ambiguous-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)
    acked = await dead_node_with_acked_records(name, objects)
    AmbiguousFirstClaim.lost_answers = 0
    second = survivor(name, objects, 2, metadata=AmbiguousFirstClaim(name))
    await second.start()
    member = second.cluster
    assert member is not None

    async def finished() -> bool:
        return member.stats.failovers_done > 0

    await eventually(finished, "the reclaim to finish")
    assert AmbiguousFirstClaim.lost_answers == 1
    assert (member.stats.failovers_claimed, member.stats.failovers_retried) == (1, 1)
    info = await second.metadata.get_node(1)
    assert info is not None and info.state is NodeState.FAILED_OVER
    assert info.node_epoch == 3, "expected: registered 1, lost claim 2, retried claim 3"
    assert await read_all(second) == acked
    await second.close()


@pytest.mark.slow
async def test_a_replay_longer_than_the_lease_keeps_its_failover_lease() -> None:
    """The claimer renews its failover lease while a replay outlasts several leases: no other
    live node claims the failover meanwhile, and the claimer finishes it."""
    name = f"long-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)
    acked = await dead_node_with_acked_records(name, objects)

    class SlowWal(MemoryWal):
        async def start(self, *args: Any, **kwargs: Any) -> None:
            await asyncio.sleep(LEASE * 3)
            await super().start(*args, **kwargs)

    second = survivor(name, objects, 2, wal_factory=lambda info: SlowWal(name=f"{name}-wal1"))
    await second.start()
    assert second.cluster is not None
    member = second.cluster

    async def claimed() -> bool:
        return member.stats.failovers_claimed > 0

    await eventually(claimed, "the stream to be claimed")
    third = survivor(name, objects, 3)
    await third.start()
    assert third.cluster is not None

    async def finished() -> bool:
        return member.stats.failovers_done > 0

    await eventually(finished, "the reclaim to finish")
    assert third.cluster.stats.failovers_claimed == 0, "a renewed failover was claimed again"
    assert member.stats.failovers_fenced == 0
    assert await read_all(third) == acked
    for client in (second, third):
        await client.close()


class RenewalDuringTheFinalWrites(MemoryMetadataStore):
    """The claimer's last write of a failover (releasing the dead node's streams) waits until a
    failover lease renewal has run after the node became FAILED_OVER: the renewal is refused
    (``refuse``), or, renewals hanging from then on, given up at the claimer's deadline."""

    def __init__(self, name: str, *, hang: bool) -> None:
        super().__init__(name)
        self.hang = hang
        self.renewal_after_outcome = asyncio.Event()

    async def renew_failover(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        node = await self.get_node(node_id)
        if node is None or node.state is not NodeState.FAILED_OVER:
            return await super().renew_failover(node_id, node_epoch, lease_ms)
        try:
            if self.hang:
                await asyncio.Event().wait()  # given up (cancelled) at the claimer's deadline
            return await super().renew_failover(node_id, node_epoch, lease_ms)
        finally:
            self.renewal_after_outcome.set()

    async def release_streams(self, node_id: int, node_epoch: int) -> None:
        if node_id == 1:
            await self.renewal_after_outcome.wait()
        await super().release_streams(node_id, node_epoch)


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "timed-out"])
async def test_a_failover_lease_lost_after_the_node_is_failed_over_does_not_stop_the_failover(
    hang: bool,
) -> None:
    """Once the claimer committed FAILED_OVER, its next failover lease renewal is refused (or,
    here, times out at the claimer's deadline) while it still releases the dead node's streams.
    The failover is not stopped there (nobody could claim it again: the streams would stay
    owned by the dead node and the failover never be reported): it is done, the streams are
    released, and every acknowledged record is readable."""
    name = f"finish-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)
    acked = await dead_node_with_acked_records(name, objects)
    store = RenewalDuringTheFinalWrites(name, hang=hang)
    second = survivor(name, objects, 2, metadata=store)
    await second.start()
    member = second.cluster
    assert member is not None
    stats = member.stats

    async def ended() -> bool:  # bounded whichever way it ends: done, failed or stopped
        return stats.failovers_done + stats.failovers_failed + stats.failovers_fenced > 0

    await eventually(ended, "the failover to end")
    assert store.renewal_after_outcome.is_set()
    assert (stats.failovers_done, stats.failovers_failed, stats.failovers_fenced) == (1, 0, 0)
    info = await store.get_node(1)
    assert info is not None and info.state is NodeState.FAILED_OVER
    assert (await store.get_stream("orders")).owner_node_id is None
    assert await read_all(second) == acked
    await second.close()
