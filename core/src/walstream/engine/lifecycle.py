"""What runs behind a started node: its lease, uploader and compactor (docs/architecture/cluster.md).

:class:`NodeRuntime` is the lifecycle half of :class:`~walstream.engine.client.Client`. It registers
the node (a new node epoch fences any older process of the same node id), takes the cluster lease
first when there is a ``cluster:`` section, replays the WAL, uploads what it held and starts the
background work; :meth:`NodeRuntime.stop` uploads everything acknowledged, closes the WAL and marks
the node STOPPED only when nothing failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from walstream.clock import Clock, Rng
from walstream.config.engine import EngineConfig
from walstream.engine.append import StreamWriter
from walstream.engine.cache import LogCache
from walstream.engine.claims import adopt_owned
from walstream.engine.cluster import ClusterMember
from walstream.engine.compaction import Compactor
from walstream.engine.events import EngineHooks, Recovered
from walstream.engine.object_reader import ObjectReader
from walstream.engine.recovery import RecoveryStats, failover_node, refusal, replay_wal
from walstream.engine.streams import NodeGate, StreamRegistry
from walstream.engine.upload import Uploader
from walstream.errors import FencedError, WalstreamError
from walstream.metadata.contract import MetadataStore, NodeInfo, NodeState
from walstream.objects.contract import ObjectStore
from walstream.wal.contract import WalMode, WriteAheadLog

__all__ = ["NodeRuntime"]

log = logging.getLogger(__name__)


class NodeRuntime:
    """Start-up, background work and the orderly stop of one node.

    The parts it drives (WAL, stores, cache, registry, writer, object reader) are built by the
    :class:`~walstream.engine.client.Client` and shared with it; this class only sequences them.
    """

    def __init__(
        self,
        *,
        wal: WriteAheadLog,
        objects: ObjectStore,
        metadata: MetadataStore,
        config: EngineConfig,
        hooks: EngineHooks,
        clock: Clock,
        rng: Rng,
        gate: NodeGate,
        cache: LogCache,
        streams: StreamRegistry,
        writer: StreamWriter,
        reader: ObjectReader,
    ) -> None:
        self.wal = wal
        self.objects = objects
        self.metadata = metadata
        self.config = config
        self.hooks = hooks
        self.clock = clock
        self.rng = rng
        self.gate = gate
        self.cache = cache
        self.streams = streams
        self.writer = writer
        self.reader = reader
        self.node_id = config.node_id
        self.node_epoch = -1
        self.deployment_id = b""
        self.recovery: RecoveryStats | None = None
        self.cluster: ClusterMember | None = None
        self.uploader: Uploader | None = None
        self.compactor: Compactor | None = None

    async def start(
        self,
        *,
        registered: dict[str, Any] | None,
        wal_factory: Callable[[NodeInfo], WriteAheadLog] | None,
        accept_loss_command: str,
    ) -> None:
        """Register, take the lease, replay the WAL and start the background work.

        ``registered`` is the WAL config other nodes fail this node over with (None:
        ``wal.describe()``); ``wal_factory`` builds a dead node's WAL for an automatic failover
        (None: this node never claims one). Raises
        :class:`~walstream.engine.recovery.RecoveryRefused` (after stopping what it started) when
        the WAL shows acknowledged records may be lost and ``recovery.accept_loss`` is off.
        """
        self.deployment_id = await self.metadata.deployment_id()
        await self.objects.check()
        cluster = self.config.cluster
        if cluster is None or registered is None:
            registered = self.wal.describe()
        node = await self.metadata.register_node(
            self.node_id, registered, self.config.advertise if cluster is not None else None
        )
        self.node_epoch = node.node_epoch
        if cluster is not None:
            # The lease comes first: nothing is acknowledged, replayed or uploaded without it.
            self.cluster = ClusterMember(
                metadata=self.metadata,
                config=cluster,
                node_id=self.node_id,
                gate=self.gate,
                clock=self.clock,
                take_over=self._take_over_with(wal_factory) if wal_factory is not None else None,
            )
            await self.cluster.start(self.node_epoch)
        self.wal.bind_deployment(self.deployment_id)
        await self.wal.start(self.node_id, self.node_epoch, WalMode.READ_WRITE)
        self.uploader = Uploader(
            cache=self.cache,
            wal=self.wal,
            objects=self.objects,
            metadata=self.metadata,
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            config=self.config.upload,
            hooks=self.hooks,
            clock=self.clock,
            rng=self.rng,
            is_live=self.streams.is_live,
            on_fatal=self.gate.latch,
            trim_wal=False,
            deployment_id=self.deployment_id,
        )
        self.uploader.start()
        self.writer.attach(self.uploader, self.node_epoch)
        await self._recover(accept_loss_command)
        # Streams this node still owns (it crashed, or stopped without releasing them): claimed
        # again in a few transactions now, rather than one per stream at its next append.
        self.streams.adopt(await adopt_owned(self.metadata, self.node_id, self.node_epoch))
        if self.config.compaction.enabled:
            self.compactor = self.new_compactor()
            self.compactor.start()

    async def _recover(self, accept_loss_command: str) -> None:
        accept_loss = self.config.recovery.accept_loss
        assert self.uploader is not None
        stats = await replay_wal(
            wal=self.wal,
            metadata=self.metadata,
            cache=self.cache,
            uploader=self.uploader,
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            upload_max_bytes=self.config.upload.max_bytes,
            accept_loss=accept_loss,
        )
        await self.uploader.flush()
        self.gate.raise_if_failed()
        self.recovery = stats
        if stats.loss_detected and not accept_loss:
            # Refuse: the WAL is not reset and the streams stay owned by this node id, so no
            # node can claim them and reuse an offset that was acknowledged. stop() sees the
            # failure and neither releases the streams nor marks the node stopped; it only
            # stops the uploader and closes the WAL.
            refused = refusal(stats, self.node_id, self.wal.describe(), accept_loss_command)
            self.gate.failure = refused  # raised to the caller: no need to log it as well
            raise refused
        await self.wal.reset()
        self.uploader.trim_wal = True
        self.hooks.emit(
            Recovered(self.node_id, stats.records, stats.batches, stats.dropped_batches, False)
        )
        if stats.batches:
            log.info(
                "node %d recovered %d records in %d batches (%d dropped)",
                self.node_id,
                stats.records,
                stats.batches,
                stats.dropped_batches,
            )

    def new_compactor(self) -> Compactor:
        return Compactor(
            objects=self.objects,
            metadata=self.metadata,
            config=self.config.compaction,
            hooks=self.hooks,
            clock=self.clock,
            on_destroyed=self.reader.forget_objects,
            deployment_id=self.deployment_id,
            rng=self.rng,
            prepare_ttl_ms=int(self.config.upload.prepare_ttl_s * 1000),
            object_format=self.config.upload.object_format,
        )

    async def stop(self) -> None:
        """Upload everything acknowledged, close the WAL; STOPPED only after a clean stop."""
        await self.writer.drain()
        clean = self.gate.failure is None
        if self.compactor is not None:
            await self.compactor.close()
        if self.uploader is not None:
            try:
                await self.uploader.close(abort=not clean)
            except WalstreamError as exc:
                clean = False
                log.error("final upload failed; the WAL keeps the data for recovery: %s", exc)
        await self.wal.close()
        if self.cluster is not None:
            # Renewals went on through the final upload; STOPPED (below) ends the lease's use.
            await self.cluster.stop()
            clean = clean and self.gate.failure is None
        if clean and self.uploader is not None and self.uploader.failure is None:
            try:
                await self.metadata.release_streams(self.node_id, self.node_epoch)
                await self.metadata.set_node_state(self.node_id, self.node_epoch, NodeState.STOPPED)
            except FencedError:
                log.warning("node %d was fenced by a newer epoch before it stopped", self.node_id)
        self.streams.notify_all()

    async def failover(
        self, dead_node_id: int, wal: WriteAheadLog, accept_loss: bool | None
    ) -> RecoveryStats:
        return await failover_node(
            accept_loss=accept_loss,
            dead_node_id=dead_node_id,
            wal=wal,
            objects=self.objects,
            metadata=self.metadata,
            config=self.config,
            hooks=self.hooks,
            clock=self.clock,
            rng=self.rng,
        )

    def _take_over_with(
        self, wal_factory: Callable[[NodeInfo], WriteAheadLog]
    ) -> Callable[[NodeInfo, asyncio.Event], Coroutine[Any, Any, None]]:
        async def take_over(claimed: NodeInfo, finishing: asyncio.Event) -> None:
            """Fail over a node whose failover this node's :class:`ClusterMember` claimed
            (``finishing``: see :func:`~walstream.engine.recovery.failover_node`)."""
            await failover_node(
                dead_node_id=claimed.node_id,
                wal=wal_factory(claimed),
                objects=self.objects,
                metadata=self.metadata,
                config=self.config,
                hooks=self.hooks,
                clock=self.clock,
                rng=self.rng,
                claimed=claimed,
                finishing=finishing,
            )

        return take_over
