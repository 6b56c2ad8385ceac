"""Node leases: heartbeat, self-fencing and automatic failover (the ``cluster:`` section).

A node with a ``cluster:`` section holds a lease in the metadata store
(:meth:`~walstream.metadata.MetadataStore.renew_lease`). :class:`ClusterMember` renews it every
``heartbeat_interval`` and keeps the node's own view of it:

* **Self-fencing.** The store sets the expiry to *its* clock at the moment it applied the renewal
  plus the lease; the node cannot know that moment, only that it came after the renewal was
  *sent*. So the node's deadline is ``sent + lease - margin`` on its monotonic clock, which ends
  before the store's expiry as long as the two clocks run at rates within ``margin / lease`` of
  each other. Past the deadline the node acknowledges nothing (:meth:`NodeGate.lease_lost`
  latches a :class:`FencedError`), and another node may claim it only after the store's expiry:
  so every acknowledged record is in the WAL the claimer replays.
* **Watching.** Each heartbeat also lists the nodes; for a RUNNING node whose lease expired on the
  store's clock, it tries :meth:`~walstream.metadata.MetadataStore.claim_failover` (one
  conditional write: exactly one claimer wins) and the winner runs the failover (``take_over``)
  in a task of its own, so the winner's heartbeats go on during a long replay.

Time goes through the injected :class:`~walstream.clock.Clock` only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from walstream.clock import Clock
from walstream.config.engine import ClusterConfig
from walstream.engine.streams import NodeGate
from walstream.errors import FencedError, WalstreamError
from walstream.metadata.contract import MetadataStore, NodeInfo, NodeState

__all__ = ["ClusterMember", "ClusterStats"]

log = logging.getLogger(__name__)


@dataclass
class ClusterStats:
    """What ``/health``, ``/metrics`` and ``walstream cluster status`` show of this member."""

    renewals: int = 0
    renew_failures: int = 0
    failovers_claimed: int = 0
    """Failovers of other nodes this node won the claim of."""
    failovers_done: int = 0
    failovers_failed: int = 0
    last_renew_ms: float = 0.0
    """Round trip of the last successful renewal, in milliseconds."""
    nodes_live: int = 0
    """Live nodes (this one included) at the last watch."""
    nodes_total: int = 0


class ClusterMember:
    """A node's lease and its watch over the other nodes (module docstring)."""

    def __init__(
        self,
        *,
        metadata: MetadataStore,
        config: ClusterConfig,
        node_id: int,
        gate: NodeGate,
        clock: Clock,
        take_over: Callable[[NodeInfo], Awaitable[None]] | None,
    ) -> None:
        self._metadata = metadata
        self.config = config
        self._node_id = node_id
        self._gate = gate
        self._clock = clock
        self._take_over = take_over
        """Runs a claimed failover; None: this node cannot replay others' WALs, so it never
        claims one (it still renews its own lease)."""
        self._node_epoch = -1
        self._task: asyncio.Task[None] | None = None
        self._failovers: set[asyncio.Task[None]] = set()
        self.stats = ClusterStats()
        self.nodes: list[NodeInfo] = []
        """The nodes at the last watch."""

    @property
    def lease_remaining_s(self) -> float | None:
        """Time left of this node's own view of its lease (None before the first renewal)."""
        deadline = self._gate.lease_deadline
        return None if deadline is None else deadline - self._clock.monotonic()

    async def start(self, node_epoch: int) -> None:
        """Take the first lease (before the node acknowledges anything) and start heartbeats.

        Raises what the first renewal raises: a node that cannot take a lease does not start."""
        self._node_epoch = node_epoch
        self._gate.lease_clock = self._clock
        await self._renew(raise_errors=True)
        self._task = asyncio.create_task(self._run(), name=f"walstream-lease-{self._node_id}")

    async def stop(self) -> None:
        """Stop renewing (the lease then runs out unless the node is marked STOPPED) and wait
        for failovers this node is running."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._failovers:
            await asyncio.gather(*self._failovers, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self.config.heartbeat_interval_s)
            if self._gate.failure is not None or self._gate.lease_lost():
                # A failed node stops renewing: its lease runs out and another node replays
                # its WAL, which is what a failed node needs. (A closing node renews on until
                # its final upload is committed: :meth:`stop`.)
                return
            await self._renew(raise_errors=False)
            if self._gate.failure is None and not self._gate.closed:
                try:
                    await self.watch()
                except WalstreamError as error:
                    log.warning("node %d could not watch the other nodes: %s", self._node_id, error)

    async def _renew(self, raise_errors: bool) -> None:
        sent = self._clock.monotonic()
        lease_s = self.config.lease_duration_s
        try:
            # Waiting longer than the lease is pointless: the node fences itself by then.
            await self._clock.wait_for(
                self._metadata.renew_lease(self._node_id, self._node_epoch, int(lease_s * 1000)),
                lease_s,
            )
        except FencedError as error:
            self.stats.renew_failures += 1
            fenced = FencedError(
                f"node {self._node_id} lost its lease: {error}; another node failed it over or a "
                "newer process took its id. Restart this node: it registers with a new epoch"
            )
            self._gate.latch(fenced)
            if raise_errors:
                raise fenced from error
            return
        except (WalstreamError, TimeoutError) as error:
            self.stats.renew_failures += 1
            if raise_errors:
                raise
            remaining = self.lease_remaining_s
            log.warning(
                "node %d could not renew its lease (%s); it stops acknowledging in %.2fs "
                "unless a renewal succeeds",
                self._node_id,
                error,
                remaining if remaining is not None else 0.0,
            )
            return
        deadline = sent + lease_s - self.config.fence_margin_s
        current = self._gate.lease_deadline
        self._gate.lease_deadline = deadline if current is None else max(current, deadline)
        self.stats.renewals += 1
        self.stats.last_renew_ms = (self._clock.monotonic() - sent) * 1000

    async def watch(self) -> list[NodeInfo]:
        """List the nodes and claim the failover of every RUNNING node whose lease expired;
        each claim won starts ``take_over`` in its own task. Returns the nodes claimed."""
        nodes = await self._metadata.list_nodes()
        now_ms = await self._metadata.store_time_ms()
        self.nodes = nodes
        self.stats.nodes_total = len(nodes)
        self.stats.nodes_live = sum(1 for node in nodes if node.live(now_ms))
        claimed: list[NodeInfo] = []
        if self._take_over is None:
            return claimed
        for node in nodes:
            if node.node_id == self._node_id or node.live(now_ms) or node.lease_expires_ms == 0:
                continue
            if node.state is not NodeState.RUNNING:
                continue
            won = await self._metadata.claim_failover(node.node_id, node.node_epoch, self._node_id)
            if won is None:
                continue  # another node claimed it first, or it renewed meanwhile
            log.warning(
                "node %d: the lease of node %d expired; this node won its failover (epoch %d)",
                self._node_id,
                node.node_id,
                won.node_epoch,
            )
            self.stats.failovers_claimed += 1
            claimed.append(won)
            task = asyncio.create_task(
                self._run_failover(won), name=f"walstream-failover-{node.node_id}"
            )
            self._failovers.add(task)
            task.add_done_callback(self._failovers.discard)
        return claimed

    async def _run_failover(self, node: NodeInfo) -> None:
        assert self._take_over is not None
        try:
            await self._take_over(node)
        except Exception as error:  # reported; the node stays FAILING_OVER for an operator
            self.stats.failovers_failed += 1
            log.error(
                "node %d: failover of node %d failed (%s: %s); it stays failing_over and "
                "keeps its streams: once the cause is fixed, restart that node or run "
                "`walstream recover -c <its deployment>` (either replays its WAL)",
                self._node_id,
                node.node_id,
                type(error).__name__,
                error,
            )
            return
        self.stats.failovers_done += 1
