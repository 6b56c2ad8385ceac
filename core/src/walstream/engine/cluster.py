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
  in a task of its own, so the winner's heartbeats go on during a long replay. When a watch sees
  another node's lease (or failover lease) run out before the next heartbeat, the next
  heartbeat comes right after that expiry instead: detection costs a store round trip, not up
  to a heartbeat interval. Only a node that stopped renewing gets that close to its expiry (a
  live one renews ``lease_duration / heartbeat_interval`` times per lease), so the extra
  renewals are few; the claim itself stays the store's conditional write, so an early one is
  simply refused.
* **Failover leases.** The claim gives the winner a failover lease of ``lease_duration``, which
  it renews every ``heartbeat_interval`` while the replay runs
  (:meth:`~walstream.metadata.MetadataStore.renew_failover`). A failover that stops halfway —
  the claimer crashed, could not rebuild or read the WAL, or never learned that its claim
  committed — keeps no renewal going, so its failover lease expires and any live node (this one
  included) claims it again, with a newer epoch that fences the earlier claimer's commits. A
  node retries a failover that failed on it only after a backoff (``lease_duration`` doubling
  per failure, at most :data:`MAX_RETRY_BACKOFF_S`), so a WAL that cannot be read does not
  make it spin; a claimer whose failover lease renewal is fenced, or whose own view of the
  failover lease runs out, stops its replay — until the replay starts its final writes (the
  node's FAILED_OVER state, then the release of its streams: ``take_over`` sets the
  ``finishing`` event it is given). From then on the claimer lets the replay finish: the store
  checks those writes against the claimed epoch itself (a newer claim fences them), and once
  FAILED_OVER is committed no node can claim the failover again, so a replay stopped there
  would leave the node's streams owned and its failover never reported done. (The renewal
  that follows that commit is always fenced: the node is no longer FAILING_OVER.)

Time goes through the injected :class:`~walstream.clock.Clock` only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from walstream.clock import Clock
from walstream.config.engine import ClusterConfig
from walstream.engine.streams import NodeGate
from walstream.errors import FencedError, WalstreamError
from walstream.metadata.contract import MetadataStore, NodeInfo, NodeState
from walstream.metadata.rules import failover_claimable

__all__ = ["MAX_RETRY_BACKOFF_S", "ClusterMember", "ClusterStats"]

MAX_RETRY_BACKOFF_S = 60.0
"""The longest a node waits before claiming again a failover that failed on it."""

EXPIRY_SLACK_S = 0.005
"""How long after another node's expiry, as the store reported it, the early heartbeat comes:
the claim needs the expiry strictly in the past on the store's (millisecond) clock."""

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
    """Failovers this node claimed that raised (the failover lease then expires: retried)."""
    failovers_retried: int = 0
    """Claims won of a FAILING_OVER node whose earlier claimer stopped halfway."""
    failovers_fenced: int = 0
    """Failovers this node stopped because another node claimed them again (or its own view of
    the failover lease ran out)."""
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
        take_over: Callable[[NodeInfo, asyncio.Event], Coroutine[Any, Any, None]] | None,
    ) -> None:
        self._metadata = metadata
        self.config = config
        self._node_id = node_id
        self._gate = gate
        self._clock = clock
        self._take_over = take_over
        """Runs a claimed failover, and sets the event it is given when it starts the
        failover's final writes (module docstring); None: this node cannot replay others' WALs,
        so it never claims one (it still renews its own lease)."""
        self._node_epoch = -1
        self._task: asyncio.Task[None] | None = None
        self._failovers: set[asyncio.Task[None]] = set()
        self._replaying: set[int] = set()
        """Nodes whose failover this member is running now: never claimed again from here."""
        self._attempts: dict[int, int] = {}
        """Failures in a row of this member's failovers, by node (the backoff grows with it)."""
        self._retry_at: dict[int, float] = {}
        """Monotonic time before which this member does not claim that node again."""
        self._wake_at: float | None = None
        """Monotonic time just after the soonest expiry of another node's lease or failover
        lease that this member could claim, as of the last watch (None: none to wait for)."""
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

    def next_heartbeat_s(self) -> float:
        """Seconds until the next heartbeat: ``heartbeat_interval``, or less when another
        node's lease that this member could claim runs out sooner (module docstring)."""
        wait = self.config.heartbeat_interval_s
        if self._wake_at is not None:
            wait = min(wait, max(self._wake_at - self._clock.monotonic(), EXPIRY_SLACK_S))
        return wait

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self.next_heartbeat_s())
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
        """List the nodes and claim the failover of every node whose lease expired (RUNNING)
        or whose claimer's failover lease expired (FAILING_OVER: that failover stopped
        halfway); each claim won starts ``take_over`` in its own task. Returns the nodes
        claimed."""
        nodes = await self._metadata.list_nodes()
        now_ms = await self._metadata.store_time_ms()
        read_at = self._clock.monotonic()
        self.nodes = nodes
        self.stats.nodes_total = len(nodes)
        self.stats.nodes_live = sum(1 for node in nodes if node.live(now_ms))
        claimed: list[NodeInfo] = []
        self._wake_at = None
        if self._take_over is None:
            return claimed
        lease_ms = int(self.config.lease_duration_s * 1000)
        self._wake_at = self._soonest_expiry(nodes, now_ms, read_at)
        for node in nodes:
            if node.node_id == self._node_id or not failover_claimable(node, now_ms):
                continue
            if node.node_id in self._replaying:
                continue  # this member's own failover of it still runs (and renews its lease)
            if self._clock.monotonic() < self._retry_at.get(node.node_id, 0.0):
                continue  # it failed here recently: back off (another node may claim it)
            won = await self._metadata.claim_failover(
                node.node_id, node.node_epoch, self._node_id, lease_ms
            )
            if won is None:
                continue  # another node claimed it first, or it renewed meanwhile
            retried = node.state is NodeState.FAILING_OVER
            log.warning(
                "node %d: %s; this node won its failover (epoch %d)",
                self._node_id,
                f"the failover of node {node.node_id} stopped halfway (its failover lease expired)"
                if retried
                else f"the lease of node {node.node_id} expired",
                won.node_epoch,
            )
            self.stats.failovers_claimed += 1
            if retried:
                self.stats.failovers_retried += 1
            claimed.append(won)
            self._replaying.add(node.node_id)
            task = asyncio.create_task(
                self._run_failover(won), name=f"walstream-failover-{node.node_id}"
            )
            self._failovers.add(task)
            task.add_done_callback(self._failovers.discard)
        return claimed

    def _soonest_expiry(self, nodes: list[NodeInfo], now_ms: int, read_at: float) -> float | None:
        """The monotonic time just after the soonest lease expiry (store time ``now_ms`` read
        at ``read_at``) among the nodes this member could claim once it expires."""
        soonest: int | None = None
        for node in nodes:
            if (
                node.node_id == self._node_id
                or node.node_id in self._replaying
                or node.state not in (NodeState.RUNNING, NodeState.FAILING_OVER)
                or node.lease_expires_ms < now_ms
            ):
                continue  # ours, being replayed here, holding no lease, or claimable now
            if soonest is None or node.lease_expires_ms < soonest:
                soonest = node.lease_expires_ms
        if soonest is None:
            return None
        return read_at + (soonest - now_ms) / 1000 + EXPIRY_SLACK_S

    async def _run_failover(self, node: NodeInfo) -> None:
        assert self._take_over is not None
        finishing = asyncio.Event()
        replay = asyncio.create_task(
            self._take_over(node, finishing),
            name=f"walstream-replay-{node.node_id}-{node.node_epoch}",
        )
        lost: list[FencedError] = []
        holder = asyncio.create_task(
            self._hold_failover(node, replay, finishing, lost),
            name=f"walstream-failover-lease-{node.node_id}",
        )
        try:
            await replay
        except (asyncio.CancelledError, FencedError) as error:
            if isinstance(error, asyncio.CancelledError) and not lost:
                raise  # this task itself was cancelled
            # Stopped by the holder, or fenced by the store: another node claimed it again.
            self.stats.failovers_fenced += 1
            backoff = self._back_off(node.node_id)
            log.warning(
                "node %d: stopped the failover of node %d (epoch %d): %s; this node claims it "
                "again after %.1fs if no other node finished it",
                self._node_id,
                node.node_id,
                node.node_epoch,
                lost[0] if lost else error,
                backoff,
            )
            return
        except Exception as error:
            self.stats.failovers_failed += 1
            backoff = self._back_off(node.node_id)
            log.error(
                "node %d: failover of node %d failed (%s: %s); it stays failing_over and keeps "
                "its streams until a live node finishes it: its failover lease expires within "
                "%.1fs and any live node claims it again (this one after %.1fs). If it keeps "
                "failing, fix the cause (e.g. make its WAL reachable) or run "
                "`walstream recover -c <its deployment>`",
                self._node_id,
                node.node_id,
                type(error).__name__,
                error,
                self.config.lease_duration_s,
                backoff,
            )
            return
        finally:
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            self._replaying.discard(node.node_id)
        self._attempts.pop(node.node_id, None)
        self._retry_at.pop(node.node_id, None)
        self.stats.failovers_done += 1

    def _back_off(self, node_id: int) -> float:
        """Count a failover of ``node_id`` that did not finish here; the seconds this node
        waits before claiming it again (``lease_duration`` doubling per failure in a row)."""
        failures = self._attempts.get(node_id, 0) + 1
        self._attempts[node_id] = failures
        backoff = min(self.config.lease_duration_s * 2.0 ** (failures - 1), MAX_RETRY_BACKOFF_S)
        self._retry_at[node_id] = self._clock.monotonic() + backoff
        return backoff

    async def _hold_failover(
        self,
        node: NodeInfo,
        replay: asyncio.Task[None],
        finishing: asyncio.Event,
        lost: list[FencedError],
    ) -> None:
        """Renew the failover lease of ``node`` while ``replay`` runs; cancel the replay when
        another node claimed the failover again (the renewal is fenced) or when this node's
        own view of the failover lease runs out (another node may claim it any moment) —
        unless the replay is ``finishing``: then stop renewing and let it finish (module
        docstring)."""
        lease_s = self.config.lease_duration_s
        lease_ms = int(lease_s * 1000)
        # The claim was sent before now: the failover lease is measured from here at the latest.
        deadline = self._clock.monotonic() + lease_s - self.config.fence_margin_s
        while not replay.done():
            await self._clock.sleep(self.next_heartbeat_s())
            if replay.done():
                return
            sent = self._clock.monotonic()
            try:
                # Waiting past the deadline is pointless: the replay stops there (before the
                # store's expiry, from which on another node may claim the failover).
                await self._clock.wait_for(
                    self._metadata.renew_failover(node.node_id, node.node_epoch, lease_ms),
                    max(deadline - sent, 0.001),
                )
            except FencedError as error:
                if finishing.is_set():
                    return  # FAILED_OVER is (being) committed: the store fences the rest
                lost.append(error)
                replay.cancel()
                return
            except (WalstreamError, TimeoutError) as error:
                if self._clock.monotonic() >= deadline:
                    if finishing.is_set():
                        return  # as above: the replay's final writes are the store's to fence
                    lost.append(
                        FencedError(
                            "its failover lease ran out without a renewal (last error: "
                            f"{type(error).__name__}: {error})"
                        )
                    )
                    replay.cancel()
                    return
                log.warning(
                    "node %d could not renew its failover lease of node %d: %s",
                    self._node_id,
                    node.node_id,
                    error,
                )
                continue
            deadline = max(deadline, sent + lease_s - self.config.fence_margin_s)
