"""The engine: a node's :class:`Client` and its :class:`Stream` handles (DESIGN §3–5, §8).

:class:`Client` owns the node's lifecycle (register, recover, upload, stop) and its failure latch,
and builds the parts that do the work: the stream registry (:mod:`walstream.engine.streams`),
the write path (:mod:`walstream.engine.append`) and the read path
(:mod:`walstream.engine.read`). A :class:`Stream` is a cheap handle that forwards to them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from walstream.clock import Clock, Rng, SystemClock, make_rng
from walstream.config.engine import EngineConfig
from walstream.engine.append import StreamWriter
from walstream.engine.cache import LogCache
from walstream.engine.cluster import ClusterMember
from walstream.engine.compaction import Compactor
from walstream.engine.events import EngineHooks, NullHooks, Recovered
from walstream.engine.live import NodeLock
from walstream.engine.object_reader import ObjectReader
from walstream.engine.read import StreamReader
from walstream.engine.recovery import (
    ACCEPT_LOSS_COMMAND,
    RecoveryStats,
    failover_node,
    refusal,
    replay_wal,
)
from walstream.engine.streams import LocalStream, NodeGate, StreamRegistry
from walstream.engine.upload import Uploader
from walstream.errors import FencedError, InvalidArgument, WalstreamError
from walstream.metadata.contract import MetadataStore, NodeInfo, NodeState, StreamInfo
from walstream.objects.contract import ObjectStore
from walstream.records import (
    MAX_FENCING_TOKEN_BYTES,
    AppendAck,
    ReadResult,
    Record,
    SequencedRecord,
    check_int,
    check_optional_int,
    check_optional_text,
    describe,
)
from walstream.wal.contract import WalMode, WriteAheadLog

__all__ = ["Client", "Stream"]

log = logging.getLogger(__name__)

_DEFAULT_LIMIT_RECORDS = 1000
_DEFAULT_LIMIT_BYTES = 1 << 20


class Stream:
    """A handle on one stream. Cheap; all handles of a stream in a client share its state."""

    def __init__(self, client: Client, state: LocalStream) -> None:
        self._client = client
        self._state = state

    @property
    def stream_id(self) -> int:
        return self._state.info.stream_id

    @property
    def name(self) -> str | None:
        return self._state.info.name

    @property
    def writing(self) -> bool:
        """True once this node claimed the stream for writing (it owns it until it stops)."""
        return self._state.claimed

    @property
    def owned_here(self) -> bool:
        """True while this node writes the stream and can vouch that its view of the stream is
        current: it claimed it and (in a cluster) still holds its lease and was not fenced. A
        stream claimed by a node that lost its lease is :attr:`writing` but not owned here:
        its reads and tails raise :class:`~walstream.errors.BackendUnavailable`."""
        return self._client._gate.vouches_for(self._state)

    def __repr__(self) -> str:
        return f"Stream(id={self.stream_id}, name={self.name!r})"

    async def append(
        self,
        records: Iterable[Record],
        match_tail: int | None = None,
        fencing_token: str | None = None,
    ) -> AppendAck:
        """Append ``records`` atomically; durable in the WAL when this returns.

        ``match_tail``: append only if the stream's tail equals it (else
        :class:`TailMismatchError` carrying the actual tail). ``fencing_token``: must equal the
        token set with :meth:`set_fencing_token` (else :class:`FencedError`).
        """
        # A list (the common case) skips the abstract-class check, which is slow.
        if type(records) is not list and (
            isinstance(records, Record) or not isinstance(records, Iterable)
        ):
            raise InvalidArgument(
                f"append takes an iterable of walstream.Record (e.g. a list), got "
                f"{describe(records)}"
            )
        return await self._client._writer.append(
            self._state, list(records), match_tail, fencing_token
        )

    async def read(
        self,
        start: int | None = None,
        *,
        from_timestamp: int | None = None,
        tail_offset: int | None = None,
        limit_records: int = _DEFAULT_LIMIT_RECORDS,
        limit_bytes: int = _DEFAULT_LIMIT_BYTES,
        wait: float = 0.0,
    ) -> ReadResult:
        """Records from a position given by exactly one of ``start`` (an offset),
        ``from_timestamp`` (first record with ``timestamp_ms >=`` it) or ``tail_offset`` (that
        many records before the tail). At least one record is returned when any exists; at
        the tail, waits up to ``wait`` seconds for new records."""
        return await self._client._reader.read(
            self._state, start, from_timestamp, tail_offset, limit_records, limit_bytes, wait
        )

    async def tail(self, start: int | None = None) -> AsyncIterator[SequencedRecord]:
        """Every record from ``start`` (default: the current tail) on, following new ones."""
        check_optional_int(start, "start")
        position = await self.check_tail() if start is None else start
        while True:
            result = await self.read(start=position, wait=30.0)
            for record in result.records:
                yield record
            if result.records:
                position = result.records[-1].offset + 1

    async def trim(self, new_start: int) -> None:
        """Make records before ``new_start`` unreadable (and their storage reclaimable)."""
        check_int(new_start, "new_start")
        await self._client._writer.trim(self._state, new_start)

    async def check_tail(self) -> int:
        """The next offset to be assigned (acknowledged records end there)."""
        return await self._client._reader.check_tail(self._state)

    async def set_fencing_token(self, token: str | None) -> None:
        """Require ``fencing_token=token`` on later appends (``None`` removes it)."""
        check_optional_text(token, "fencing token", MAX_FENCING_TOKEN_BYTES)
        await self._client._writer.set_fencing_token(self._state, token)

    @property
    def fencing_token(self) -> str | None:
        """The fencing token appends must carry, as this node last saw it (None: no token)."""
        return self._state.fencing_token

    async def start_offset(self) -> int:
        await self._client._streams.refresh_remote(self._state)
        return self._state.start_offset


class Client:
    """A walstream node: one WAL, an object store and a metadata store.

    ``await client.start()`` registers the node (a new node epoch fences any older process of the
    same node id), recovers its WAL and uploads what it held; ``await client.close()`` uploads
    everything and marks the node stopped.
    """

    def __init__(
        self,
        *,
        wal: WriteAheadLog,
        objects: ObjectStore,
        metadata: MetadataStore,
        config: EngineConfig | None = None,
        hooks: EngineHooks | None = None,
        clock: Clock | None = None,
        rng: Rng | None = None,
    ) -> None:
        self.wal = wal
        self.objects = objects
        self.metadata = metadata
        self.config = config or EngineConfig()
        self.hooks: EngineHooks = hooks or NullHooks()
        self.clock: Clock = clock or SystemClock()
        self._rng = rng or make_rng(None)
        self.node_id = self.config.node_id
        self.node_epoch = -1
        self.deployment_id = b""
        """Set by :meth:`start` from the metadata store (DESIGN §8: identity everywhere)."""
        self.owns_backends = False
        """Set by :func:`walstream.open`: :meth:`close` closes the object and metadata stores."""
        self.node_lock: NodeLock | None = None
        """Set by :func:`walstream.open` when it took the node lock: :meth:`close` releases it."""
        self.recovery: RecoveryStats | None = None
        self.accept_loss_command = ACCEPT_LOSS_COMMAND
        """What a refusal to start tells the operator to run (``walstream.open`` names the
        deployment file in it)."""
        cache = self.config.cache
        self._gate = NodeGate(self.node_id)
        self._cache = LogCache(cache.log_cache_bytes, self.clock)
        self.reader = ObjectReader(
            objects,
            metadata,
            cache.block_cache_bytes,
            cache.readahead_min_bytes,
            cache.readahead_max_bytes,
            self.hooks,
        )
        self._streams = StreamRegistry(metadata, self._cache, self._gate)
        self._writer = StreamWriter(
            wal=wal,
            metadata=metadata,
            cache=self._cache,
            gate=self._gate,
            hooks=self.hooks,
            clock=self.clock,
            append_timeout_s=self.config.append_timeout_s,
        )
        self._reader = StreamReader(
            metadata=metadata,
            cache=self._cache,
            objects=self.reader,
            registry=self._streams,
            gate=self._gate,
            hooks=self.hooks,
            clock=self.clock,
        )
        self._uploader: Uploader | None = None
        self._compactor: Compactor | None = None
        self.wal_section: dict[str, Any] | None = None
        """With a ``cluster:`` section, the WAL config this node registers (set by
        :func:`walstream.open` from the deployment's ``wal`` section, secrets left out): what
        another node rebuilds this node's WAL from to fail it over. None: ``wal.describe()``."""
        self.wal_factory: Callable[[NodeInfo], WriteAheadLog] | None = None
        """With a ``cluster:`` section: builds a dead node's WAL from its registered config for
        an automatic failover (set by :func:`walstream.open`). None: this node never claims
        another node's failover."""
        self.cluster: ClusterMember | None = None
        """This node's lease and watch (``config.cluster``), started by :meth:`start`."""

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> Client:
        if self._gate.started:
            return self
        self._gate.started = True
        self.deployment_id = await self.metadata.deployment_id()
        await self.objects.check()
        cluster = self.config.cluster
        registered = self.wal.describe()
        if cluster is not None and self.wal_section is not None:
            registered = self.wal_section
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
                gate=self._gate,
                clock=self.clock,
                take_over=self._take_over if self.wal_factory is not None else None,
            )
            await self.cluster.start(self.node_epoch)
        self.wal.bind_deployment(self.deployment_id)
        await self.wal.start(self.node_id, self.node_epoch, WalMode.READ_WRITE)
        self._uploader = Uploader(
            cache=self._cache,
            wal=self.wal,
            objects=self.objects,
            metadata=self.metadata,
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            config=self.config.upload,
            hooks=self.hooks,
            clock=self.clock,
            rng=self._rng,
            is_live=self._streams.is_live,
            on_fatal=self._gate.latch,
            trim_wal=False,
            deployment_id=self.deployment_id,
        )
        self._uploader.start()
        self._writer.attach(self._uploader, self.node_epoch)
        accept_loss = self.config.recovery.accept_loss
        stats = await replay_wal(
            wal=self.wal,
            metadata=self.metadata,
            cache=self._cache,
            uploader=self._uploader,
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            upload_max_bytes=self.config.upload.max_bytes,
            accept_loss=accept_loss,
        )
        await self._uploader.flush()
        self._gate.raise_if_failed()
        self.recovery = stats
        if stats.loss_detected and not accept_loss:
            # Refuse: the WAL is not reset and the streams stay owned by this node id, so no
            # node can claim them and reuse an offset that was acknowledged. close() (by the
            # caller) sees the failure and neither releases the streams nor marks the node
            # stopped; it only stops the uploader and closes the WAL.
            refused = refusal(stats, self.node_id, self.wal.describe(), self.accept_loss_command)
            self._gate.failure = refused  # raised to the caller: no need to log it as well
            await self.close()
            raise refused
        await self.wal.reset()
        self._uploader.trim_wal = True
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
        if self.config.compaction.enabled:
            self._compactor = self._new_compactor()
            self._compactor.start()
        return self

    def _new_compactor(self) -> Compactor:
        return Compactor(
            objects=self.objects,
            metadata=self.metadata,
            config=self.config.compaction,
            hooks=self.hooks,
            clock=self.clock,
            on_destroyed=self.reader.forget_objects,
            deployment_id=self.deployment_id,
        )

    async def close(self) -> None:
        """Upload and commit everything acknowledged, close the WAL, mark the node STOPPED.

        A client built by :func:`walstream.open` owns its backends and closes them too."""
        if self._gate.closed:
            return
        self._gate.closed = True
        try:
            if self._gate.started:
                await self._stop()
        finally:
            try:
                if self.owns_backends:
                    await self._close_backends()
            finally:
                if self.node_lock is not None:
                    self.node_lock.release()

    async def _close_backends(self) -> None:
        for backend in (self.objects, self.metadata):
            try:
                await backend.close()
            except Exception as exc:  # closing must not hide why the client stopped
                log.warning("closing %s failed: %s", type(backend).__name__, exc)

    async def _stop(self) -> None:
        await self._writer.drain()
        clean = self._gate.failure is None
        if self._compactor is not None:
            await self._compactor.close()
        if self._uploader is not None:
            try:
                await self._uploader.close(abort=not clean)
            except WalstreamError as exc:
                clean = False
                log.error("final upload failed; the WAL keeps the data for recovery: %s", exc)
        await self.wal.close()
        if self.cluster is not None:
            # Renewals went on through the final upload; STOPPED (below) ends the lease's use.
            await self.cluster.stop()
            clean = clean and self._gate.failure is None
        if clean and self._uploader is not None and self._uploader.failure is None:
            try:
                await self.metadata.release_streams(self.node_id, self.node_epoch)
                await self.metadata.set_node_state(self.node_id, self.node_epoch, NodeState.STOPPED)
            except FencedError:
                log.warning("node %d was fenced by a newer epoch before it stopped", self.node_id)
        self._streams.notify_all()

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self) -> None:
        """Upload and commit everything acknowledged so far."""
        self._gate.check_open()
        assert self._uploader is not None
        await self._uploader.flush()
        self._gate.raise_if_failed()

    async def compact(self) -> bool:
        """Run one compaction pass now (normally periodic); True if it rewrote objects."""
        self._gate.check_open()
        compactor = self._compactor or self._new_compactor()
        changed = await compactor.compact_once()
        await compactor.collect_garbage()
        return changed

    async def failover(
        self, dead_node_id: int, wal: WriteAheadLog, *, accept_loss: bool | None = None
    ) -> RecoveryStats:
        """Take over a dead node's WAL: fence it, upload what it acknowledged, release its
        streams (they can then be claimed by this or any node).

        Raises :class:`~walstream.engine.recovery.RecoveryRefused` when the WAL shows that acknowledged
        records may be lost, unless ``accept_loss`` (default: this client's
        ``config.recovery.accept_loss``) records them as data-loss gaps."""
        self._gate.check_open()
        return await failover_node(
            accept_loss=accept_loss,
            dead_node_id=dead_node_id,
            wal=wal,
            objects=self.objects,
            metadata=self.metadata,
            config=self.config,
            hooks=self.hooks,
            clock=self.clock,
            rng=self._rng,
        )

    async def _take_over(self, claimed: NodeInfo) -> None:
        """Fail over a node whose failover this node's :class:`ClusterMember` claimed."""
        assert self.wal_factory is not None
        wal = self.wal_factory(claimed)
        await failover_node(
            dead_node_id=claimed.node_id,
            wal=wal,
            objects=self.objects,
            metadata=self.metadata,
            config=self.config,
            hooks=self.hooks,
            clock=self.clock,
            rng=self._rng,
            claimed=claimed,
        )

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(self, name: str | None = None) -> Stream:
        """Create a stream; ``name`` follows the stream-name rule of :mod:`walstream.records`
        (or is None for a stream addressed only by id)."""
        return Stream(self, await self._streams.create(name))

    async def open_stream(self, name_or_id: str | int) -> Stream:
        return Stream(self, await self._streams.open(name_or_id))

    async def claim_stream(self, name_or_id: str | int) -> Stream:
        """Become the stream's writer now (as the first append would): the target of a move."""
        stream = await self.open_stream(name_or_id)
        self._gate.check_writable(stream._state)
        await self._writer._claim(stream._state)
        return stream

    async def release_stream(
        self, name_or_id: str | int, handoff: Callable[[], Awaitable[None]] | None = None
    ) -> bool:
        """Move a stream off this node: hold its appends, upload and commit everything
        acknowledged, release it in metadata (the next writer anywhere claims it), and run
        ``handoff`` (e.g. the target node claims it) before held appends fail with
        :class:`~walstream.errors.FencedError`. False when this node was not writing it."""
        self._gate.check_open()
        state = await self._streams.open(name_or_id)
        return await self._writer.release(state, handoff)

    async def list_streams(self, prefix: str = "") -> list[StreamInfo]:
        return await self._streams.list(prefix)

    async def delete_stream(self, name_or_id: str | int) -> None:
        await self._streams.delete(name_or_id)

    # -- state --------------------------------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        """The failure that stopped this node accepting writes (a fenced node, a failed WAL or
        upload), or ``None`` while it is healthy. Restart the client to recover."""
        return self._gate.failure

    def describe(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "node_epoch": self.node_epoch,
            "wal": self.wal.describe(),
            "objects": self.objects.describe(),
            "metadata": self.metadata.describe(),
            "log_cache_bytes": self._cache.total_bytes,
            "unuploaded_bytes": self._cache.unuploaded_bytes,
            "objects_written": self._uploader.objects_written if self._uploader else 0,
        }
