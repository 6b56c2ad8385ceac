"""The engine: a node's :class:`Client` and its :class:`Stream` handles (docs/architecture/write-path.md,
docs/architecture/read-path.md, docs/architecture/recovery.md).

:class:`Client` is the node's API and its failure latch. It builds the parts that do the work and
forwards to them: the lifecycle (register, recover, upload, stop: :mod:`walstream.engine.lifecycle`),
the stream registry (:mod:`walstream.engine.streams`), the write path
(:mod:`walstream.engine.append`) and the read path (:mod:`walstream.engine.read`). A
:class:`Stream` is a cheap handle that forwards to them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from walstream.clock import Clock, Rng, SystemClock, make_rng
from walstream.config.engine import EngineConfig
from walstream.encryption import EncryptionKey, encrypt_record, open_records
from walstream.engine.append import StreamWriter
from walstream.engine.cache import LogCache
from walstream.engine.cluster import ClusterMember
from walstream.engine.events import EngineHooks, NullHooks
from walstream.engine.lifecycle import NodeRuntime
from walstream.engine.node_lock import NodeLock
from walstream.engine.object_reader import ObjectReader
from walstream.engine.read import StreamReader
from walstream.engine.recovery import ACCEPT_LOSS_COMMAND, RecoveryRefused, RecoveryStats
from walstream.engine.retention import LifecycleStats, StreamLifecycle
from walstream.engine.streams import LocalStream, NodeGate, StreamRegistry
from walstream.metadata.contract import MetadataStore, NodeInfo, StreamInfo
from walstream.objects.contract import ObjectStore
from walstream.records import (
    MAX_FENCING_TOKEN_BYTES,
    AppendAck,
    ReadResult,
    Record,
    SequencedRecord,
    check_append_input,
    check_int,
    check_optional_int,
    check_optional_text,
)
from walstream.stream_config import StreamConfig
from walstream.wal.contract import WriteAheadLog

__all__ = ["Client", "Stream"]

log = logging.getLogger(__name__)

_DEFAULT_LIMIT_RECORDS = 1000
_DEFAULT_LIMIT_BYTES = 1 << 20


class Stream:
    """A handle on one stream. Cheap; all handles of a stream in a client share its state."""

    def __init__(self, client: Client, state: LocalStream) -> None:
        self._client = client
        self._held_state = state

    @property
    def _state(self) -> LocalStream:
        """The stream's shared state, made active again if the node parked it while idle."""
        return self._client._streams.touch(self._held_state)

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
        *,
        encryption: EncryptionKey | None = None,
    ) -> AppendAck:
        """Append ``records`` atomically; durable in the WAL when this returns.

        ``match_tail``: append only if the stream's tail equals it (else
        :class:`TailMismatchError` carrying the actual tail). ``fencing_token``: must equal the
        token set with :meth:`set_fencing_token` (else :class:`FencedError`).
        ``encryption``: seal each record with this key before it reaches the WAL
        (:mod:`walstream.encryption`; readers need the same key).
        """
        checked = check_append_input(records, match_tail, fencing_token)
        if encryption is not None:
            stream_id = self.stream_id
            checked = [encrypt_record(record, encryption, stream_id) for record in checked]
        return await self._client._writer.append(self._state, checked, match_tail, fencing_token)

    async def read(
        self,
        start: int | None = None,
        *,
        from_timestamp: int | None = None,
        tail_offset: int | None = None,
        limit_records: int = _DEFAULT_LIMIT_RECORDS,
        limit_bytes: int = _DEFAULT_LIMIT_BYTES,
        wait: float = 0.0,
        encryption: EncryptionKey | None = None,
        stored: bool = False,
    ) -> ReadResult:
        """Records from a position given by exactly one of ``start`` (an offset),
        ``from_timestamp`` (first record with ``timestamp_ms >=`` it) or ``tail_offset`` (that
        many records before the tail). At least one record is returned when any exists; at
        the tail, waits up to ``wait`` seconds for new records.

        ``encryption``: the key encrypted records were appended with (they are returned
        decrypted; :class:`DecryptionFailed` for a record it does not open). Without it, an
        encrypted record raises :class:`EncryptionKeyRequired`. ``limit_bytes`` counts the
        stored (encrypted) sizes. ``stored=True`` returns the records as stored, encrypted ones
        sealed (their timestamps and offsets are true; the envelopes can be opened elsewhere,
        ``docs/architecture/encryption.md``)."""
        result = await self._client._reader.read(
            self._state, start, from_timestamp, tail_offset, limit_records, limit_bytes, wait
        )
        if stored:
            return result
        records = open_records(result.records, encryption, self.stream_id)
        if records is result.records:
            return result
        return dataclasses.replace(result, records=records)

    async def tail(
        self, start: int | None = None, *, encryption: EncryptionKey | None = None
    ) -> AsyncIterator[SequencedRecord]:
        """Every record from ``start`` (default: the current tail) on, following new ones
        (``encryption``: as :meth:`read`)."""
        check_optional_int(start, "start")
        position = await self.check_tail() if start is None else start
        while True:
            result = await self.read(start=position, wait=30.0, encryption=encryption)
            for record in result.records:
                yield record
            if result.records:
                position = result.records[-1].offset + 1

    @property
    def config(self) -> StreamConfig:
        """The stream's configuration as this node last read or changed it."""
        return self._state.info.config

    async def reconfigure(self, **changes: Any) -> StreamConfig:
        """Change the settings named (``retention_age_s=3600``, ``timestamping="arrival"`` …;
        :class:`~walstream.stream_config.StreamConfig`'s fields), keep the others, and return
        the new config. Appends through this node use it from the next one; retention and
        delete-on-empty are applied within their bound (docs/guides/lifecycle.md). The
        cipher cannot change (:class:`~walstream.errors.InvalidArgument`)."""
        return await self._client._streams.reconfigure(self._state, changes)

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
        self.owns_backends = False
        """Set by :func:`walstream.open`: :meth:`close` closes the object and metadata stores."""
        self.node_lock: NodeLock | None = None
        """Set by :func:`walstream.open` when it took the node lock: :meth:`close` releases it."""
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
            readahead_depth=cache.readahead_depth,
        )
        self._streams = StreamRegistry(metadata, self._cache, self._gate, self.clock)
        self._streams.on_park.append(self.reader.forget_stream)
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
        self._runtime = NodeRuntime(
            wal=wal,
            objects=objects,
            metadata=metadata,
            config=self.config,
            hooks=self.hooks,
            clock=self.clock,
            rng=self._rng,
            gate=self._gate,
            cache=self._cache,
            streams=self._streams,
            writer=self._writer,
            reader=self.reader,
        )
        self._lifecycle: StreamLifecycle | None = None
        self.wal_section: dict[str, Any] | None = None
        """With a ``cluster:`` section, the WAL config this node registers (set by
        :func:`walstream.open` from the deployment's ``wal`` section, secrets left out): what
        another node rebuilds this node's WAL from to fail it over. None: ``wal.describe()``."""
        self.wal_factory: Callable[[NodeInfo], WriteAheadLog] | None = None
        """With a ``cluster:`` section: builds a dead node's WAL from its registered config for
        an automatic failover (set by :func:`walstream.open`). None: this node never claims
        another node's failover."""

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> Client:
        if self._gate.started:
            return self
        self._gate.started = True
        try:
            await self._runtime.start(
                registered=self.wal_section,
                wal_factory=self.wal_factory,
                accept_loss_command=self.accept_loss_command,
            )
        except RecoveryRefused as refused:
            if self._gate.failure is refused:  # the start-up replay refused: stop what started
                await self.close()
            raise
        self._lifecycle = StreamLifecycle(
            self, self.config.streams.lifecycle_interval_s, self.clock
        )
        self._lifecycle.start()
        return self

    @property
    def lifecycle(self) -> LifecycleStats:
        """What this node's retention and delete-on-empty work did (:mod:`walstream.engine.retention`)."""
        return self._lifecycle.stats if self._lifecycle is not None else LifecycleStats()

    async def run_lifecycle(self) -> int:
        """Run one pass of retention and delete-on-empty now (it also runs every
        ``streams.lifecycle_interval``); how many due streams it handled."""
        self._gate.check_open()
        assert self._lifecycle is not None
        return await self._lifecycle.run_once()

    async def collect_garbage(self) -> int:
        """Delete the objects metadata marked destroyed (trimmed, expired, compacted away) from
        the object store; how many were removed."""
        self._gate.check_open()
        compactor = self._runtime.compactor or self._runtime.new_compactor()
        return await compactor.collect_garbage()

    @property
    def node_epoch(self) -> int:
        """This process's node epoch (-1 before :meth:`start`)."""
        return self._runtime.node_epoch

    @property
    def deployment_id(self) -> bytes:
        """Set by :meth:`start` from the metadata store (docs/architecture/invariants.md: identity everywhere)."""
        return self._runtime.deployment_id

    @property
    def recovery(self) -> RecoveryStats | None:
        """What the start-up replay of the WAL found (None before :meth:`start`)."""
        return self._runtime.recovery

    @property
    def cluster(self) -> ClusterMember | None:
        """This node's lease and watch (``config.cluster``), started by :meth:`start`."""
        return self._runtime.cluster

    async def close(self) -> None:
        """Upload and commit everything acknowledged, close the WAL, mark the node STOPPED.

        A client built by :func:`walstream.open` owns its backends and closes them too."""
        if self._gate.closed:
            return
        if self._lifecycle is not None:
            await self._lifecycle.close()
        self._gate.closed = True
        try:
            if self._gate.started:
                await self._runtime.stop()
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

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self) -> None:
        """Upload and commit everything acknowledged so far."""
        self._gate.check_open()
        assert self._runtime.uploader is not None
        await self._runtime.uploader.flush()
        self._gate.raise_if_failed()

    async def compact(self) -> bool:
        """Run one compaction pass now (normally periodic); True if it rewrote objects."""
        self._gate.check_open()
        if self._runtime.compactor is None:
            # Kept, so that close() cancels a pass run by hand too.
            self._runtime.compactor = self._runtime.new_compactor()
        compactor = self._runtime.compactor
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
        return await self._runtime.failover(dead_node_id, wal, accept_loss)

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(
        self,
        name: str | None = None,
        *,
        config: StreamConfig | None = None,
        creation_token: str | None = None,
    ) -> Stream:
        """Create a stream; ``name`` follows the stream-name rule of :mod:`walstream.records`
        (or is None for a stream addressed only by id). ``config``: its configuration
        (:class:`~walstream.stream_config.StreamConfig`; None: the deployment's ``streams:``
        defaults, infinite retention unless configured). ``creation_token``: kept with the
        stream (``StreamInfo.creation_token``), so a retried create can tell it made it."""
        chosen = self.config.streams.config if config is None else config
        return Stream(self, await self._streams.create(name, chosen, creation_token))

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

    async def create_streams(
        self, names: Sequence[str], *, config: StreamConfig | None = None
    ) -> list[Stream]:
        """Create streams named ``names`` (1 to 10,000 distinct names), each with ``config``
        (None: the deployment's ``streams:`` defaults), in one metadata transaction: all of
        them, or none (:class:`~walstream.errors.StreamExists` naming the first name taken).
        Their handles, in order."""
        chosen = self.config.streams.config if config is None else config
        return [Stream(self, state) for state in await self._streams.create_many(names, chosen)]

    async def list_streams(
        self, prefix: str = "", start_after: str | int | None = None, limit: int | None = None
    ) -> list[StreamInfo]:
        """Active streams whose name starts with ``prefix``, a page at a time: streams without
        a name first (by id, with an empty ``prefix`` only), then by name in byte order. At most
        ``limit`` (1 to 10,000; None: all that are left); the next page starts after
        :func:`walstream.metadata.contract.page_key` of this page's last stream. Each page is
        read through an index."""
        return await self._streams.list(prefix, start_after, limit)

    async def delete_stream(self, name_or_id: str | int) -> None:
        await self._streams.delete(name_or_id)

    # -- state --------------------------------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        """The failure that stopped this node accepting writes (a fenced node, a failed WAL or
        upload), or ``None`` while it is healthy. Restart the client to recover."""
        return self._gate.failure

    def describe(self) -> dict[str, Any]:
        uploader = self._runtime.uploader
        return {
            "node_id": self.node_id,
            "node_epoch": self.node_epoch,
            "wal": self.wal.describe(),
            "objects": self.objects.describe(),
            "metadata": self.metadata.describe(),
            "log_cache_bytes": self._cache.total_bytes,
            "unuploaded_bytes": self._cache.unuploaded_bytes,
            "objects_written": uploader.objects_written if uploader else 0,
        }
