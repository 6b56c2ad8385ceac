"""How soon a live node notices an expired lease: right after the expiry (a store round trip),
not up to a heartbeat interval later, and never before it."""

from __future__ import annotations

import asyncio
import os

import pytest
from walstream.clock import ManualClock
from walstream.config.engine import ClusterConfig
from walstream.engine.cluster import EXPIRY_SLACK_S, ClusterMember
from walstream.engine.streams import NodeGate
from walstream.metadata import NodeInfo, NodeState
from walstream.metadata.memory import MemoryMetadataStore

pytestmark = pytest.mark.asyncio

LEASE_S, HEARTBEAT_S = 3.0, 1.0


class ClaimLog(MemoryMetadataStore):
    """Records the store time and the virtual monotonic time of every failover claim won."""

    def __init__(self, name: str, clock: ManualClock) -> None:
        super().__init__(name, clock=clock)
        self.manual_clock = clock
        self.claims: list[tuple[int, float]] = []

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        won = await super().claim_failover(node_id, node_epoch, by_node_id, lease_ms)
        if won is not None:
            self.claims.append((await self.store_time_ms(), self.manual_clock.monotonic()))
        return won


async def test_an_expiry_between_heartbeats_is_claimed_right_after_it() -> None:
    """Node 1 renews once and dies; its lease ends 0.3 s after one of node 2's heartbeats
    (heartbeat 1 s). Node 2 claims it just after the expiry on the store's clock, not at its
    next regular heartbeat 0.7 s later; the virtual clock makes the times exact."""
    clock = ManualClock()
    store = ClaimLog(f"detect-{os.urandom(4).hex()}", clock)
    dead = await store.register_node(1, {"type": "memory"})
    expiry_ms = (await store.renew_lease(1, dead.node_epoch, int(LEASE_S * 1000))).lease_expires_ms
    clock.advance(0.3)  # node 2 starts 0.3 s later: its heartbeats fall at 1.3, 2.3, 3.3 s

    claimed = asyncio.Event()

    async def take_over(node: NodeInfo, finishing: asyncio.Event) -> None:
        claimed.set()

    live = await store.register_node(2, {"type": "memory"})
    member = ClusterMember(
        metadata=store,
        config=ClusterConfig(LEASE_S, HEARTBEAT_S),
        node_id=2,
        gate=NodeGate(2),
        clock=clock,
        take_over=take_over,
    )
    await member.start(live.node_epoch)
    try:
        await asyncio.wait_for(claimed.wait(), 10)
    finally:
        await member.stop()
    [(claimed_ms, claimed_at)] = store.claims
    assert claimed_ms > expiry_ms  # never before the lease ran out on the store's clock
    # Right after the expiry (3.0 s), well before the heartbeat at 3.3 s.
    assert claimed_at == pytest.approx(LEASE_S + EXPIRY_SLACK_S, abs=0.01)
    info = await store.get_node(1)
    assert info is not None and info.state is NodeState.FAILING_OVER


async def test_live_nodes_keep_the_heartbeat_interval() -> None:
    """A lease that is renewed never comes within a heartbeat of expiring, so the member waits
    a whole heartbeat between watches; one that stopped being renewed is watched again just
    after its expiry."""
    clock = ManualClock()
    store = MemoryMetadataStore(f"detect-{os.urandom(4).hex()}", clock=clock)
    other = await store.register_node(1, {"type": "memory"})
    await store.renew_lease(1, other.node_epoch, int(LEASE_S * 1000))
    live = await store.register_node(2, {"type": "memory"})

    async def take_over(node: NodeInfo, finishing: asyncio.Event) -> None:
        raise AssertionError(f"node {node.node_id} is live and must not be claimed")

    member = ClusterMember(
        metadata=store,
        config=ClusterConfig(LEASE_S, HEARTBEAT_S),
        node_id=2,
        gate=NodeGate(2),
        clock=clock,
        take_over=take_over,
    )
    del live  # watched by hand: no heartbeat task runs in this test
    await member.watch()
    assert member.next_heartbeat_s() == HEARTBEAT_S
    await store.renew_lease(1, other.node_epoch, int(LEASE_S * 1000))
    clock.advance(LEASE_S - HEARTBEAT_S / 2)  # node 1 now half a heartbeat from its expiry
    await member.watch()
    assert member.next_heartbeat_s() == pytest.approx(HEARTBEAT_S / 2 + EXPIRY_SLACK_S)
