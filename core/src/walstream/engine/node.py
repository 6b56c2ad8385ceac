"""The engine: a node's :class:`Client` and its :class:`Stream` handles (DESIGN §3–5, §8).

Write path: ``append`` reserves offsets under the stream's lock, puts the encoded batch in the
LogCache and hands it to the WAL in the same step (so WAL order = cache order); the WAL
acknowledges in order; the acknowledgement makes the records readable and wakes tailing readers.
The uploader moves sealed cache blocks to object storage.

Read path: LogCache (hot tail) → metadata → BlockCache → object store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from walstream.clock import Clock, Rng, SystemClock, make_rng
from walstream.config.engine import EngineConfig
from walstream.engine.cache import CachedBatch, LogCache
from walstream.engine.compaction import Compactor
from walstream.engine.events import (
    EngineHooks,
    NullHooks,
    ReadServed,
    Recovered,
    WalAppended,
)
from walstream.engine.object_reader import ObjectReader
from walstream.engine.recovery import (
    ACCEPT_LOSS_COMMAND,
    RecoveryStats,
    failover_node,
    refusal,
    replay_wal,
)
from walstream.engine.upload import Uploader
from walstream.errors import (
    BackendUnavailable,
    CapacityError,
    DataLossError,
    FencedError,
    InvalidArgument,
    OutOfRangeError,
    StreamNotFound,
    TailMismatchError,
    WalstreamError,
)
from walstream.format.batch import decode_batch, encode_batch, record_size
from walstream.metadata.contract import MetadataStore, NodeState, StreamInfo, StreamState
from walstream.objects.contract import ObjectStore
from walstream.records import (
    MAX_FENCING_TOKEN_BYTES,
    MIN_I64,
    AppendAck,
    ReadResult,
    Record,
    SequencedRecord,
    check_int,
    check_optional_int,
    check_optional_text,
    check_stream_name,
    check_stream_ref,
    check_text,
    check_wait,
    describe,
)
from walstream.wal.contract import WalMode, WriteAheadLog

__all__ = ["Client", "Stream"]

log = logging.getLogger(__name__)

_DEFAULT_LIMIT_RECORDS = 1000
_DEFAULT_LIMIT_BYTES = 1 << 20
_REMOTE_POLL_S = 0.1


@dataclass(eq=False)
class _StreamState:
    info: StreamInfo
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    claimed: bool = False
    epoch: int = 0
    next_offset: int = 0
    """Next offset to reserve (includes appends in flight)."""
    acked_tail: int = 0
    """Records below it are acknowledged and readable."""
    start_offset: int = 0
    last_timestamp_ms: int = 0
    fencing_token: str | None = None
    deleted: bool = False

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class Stream:
    """A handle on one stream. Cheap; all handles of a stream in a client share its state."""

    def __init__(self, client: Client, state: _StreamState) -> None:
        self._client = client
        self._state = state

    @property
    def stream_id(self) -> int:
        return self._state.info.stream_id

    @property
    def name(self) -> str | None:
        return self._state.info.name

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
        if isinstance(records, Record) or not isinstance(records, Iterable):
            raise InvalidArgument(
                f"append takes an iterable of walstream.Record (e.g. a list), got "
                f"{describe(records)}"
            )
        return await self._client._append(self._state, list(records), match_tail, fencing_token)

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
        return await self._client._read(
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
        await self._client._trim(self._state, new_start)

    async def check_tail(self) -> int:
        """The next offset to be assigned (acknowledged records end there)."""
        return await self._client._check_tail(self._state)

    async def set_fencing_token(self, token: str | None) -> None:
        """Require ``fencing_token=token`` on later appends (``None`` removes it)."""
        check_optional_text(token, "fencing token", MAX_FENCING_TOKEN_BYTES)
        await self._client._set_fencing_token(self._state, token)

    async def start_offset(self) -> int:
        await self._client._refresh_remote(self._state)
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
        self._streams: dict[int, _StreamState] = {}
        self._cache = LogCache(self.config.cache.log_cache_bytes, self.clock)
        self.reader = ObjectReader(
            objects,
            metadata,
            self.config.cache.block_cache_bytes,
            self.config.cache.readahead_min_bytes,
            self.config.cache.readahead_max_bytes,
            self.hooks,
        )
        self._uploader: Uploader | None = None
        self._compactor: Compactor | None = None
        self._failure: BaseException | None = None
        self._started = False
        self._closed = False
        self._inflight: set[asyncio.Future[Any]] = set()
        self.recovery: RecoveryStats | None = None
        self.accept_loss_command = ACCEPT_LOSS_COMMAND
        """What a refusal to start tells the operator to run (``walstream.open`` names the
        deployment file in it)."""
        capacity = wal.capabilities.capacity_bytes
        self._unuploaded_limit = self.config.cache.log_cache_bytes
        if capacity:
            # WAL records take more room than their batches (headers, alignment): keep well below.
            self._unuploaded_limit = max(1, min(self._unuploaded_limit, capacity // 4))

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> Client:
        if self._started:
            return self
        self._started = True
        self.deployment_id = await self.metadata.deployment_id()
        await self.objects.check()
        node = await self.metadata.register_node(self.node_id, self.wal.describe())
        self.node_epoch = node.node_epoch
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
            is_live=self._is_live,
            on_fatal=self._on_fatal,
            trim_wal=False,
            deployment_id=self.deployment_id,
        )
        self._uploader.start()
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
        self._raise_if_failed()
        self.recovery = stats
        if stats.loss_detected and not accept_loss:
            # Refuse: the WAL is not reset and the streams stay owned by this node id, so no
            # node can claim them and reuse an offset that was acknowledged. close() (by the
            # caller) sees the failure and neither releases the streams nor marks the node
            # stopped; it only stops the uploader and closes the WAL.
            refused = refusal(stats, self.node_id, self.wal.describe(), self.accept_loss_command)
            self._failure = refused  # raised to the caller: no need to log it as well
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
            self._compactor = Compactor(
                objects=self.objects,
                metadata=self.metadata,
                config=self.config.compaction,
                hooks=self.hooks,
                clock=self.clock,
                on_destroyed=self.reader.forget_objects,
                deployment_id=self.deployment_id,
            )
            self._compactor.start()
        return self

    async def close(self) -> None:
        """Upload and commit everything acknowledged, close the WAL, mark the node STOPPED.

        A client built by :func:`walstream.open` owns its backends and closes them too."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._started:
                await self._stop()
        finally:
            if self.owns_backends:
                await self._close_backends()

    async def _close_backends(self) -> None:
        for backend in (self.objects, self.metadata):
            try:
                await backend.close()
            except Exception as exc:  # closing must not hide why the client stopped
                log.warning("closing %s failed: %s", type(backend).__name__, exc)

    async def _stop(self) -> None:
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        clean = self._failure is None
        if self._compactor is not None:
            await self._compactor.close()
        if self._uploader is not None:
            try:
                await self._uploader.close(abort=not clean)
            except WalstreamError as exc:
                clean = False
                log.error("final upload failed; the WAL keeps the data for recovery: %s", exc)
        await self.wal.close()
        if clean and self._uploader is not None and self._uploader.failure is None:
            try:
                await self.metadata.release_streams(self.node_id, self.node_epoch)
                await self.metadata.set_node_state(self.node_id, self.node_epoch, NodeState.STOPPED)
            except FencedError:
                log.warning("node %d was fenced by a newer epoch before it stopped", self.node_id)
        for state in self._streams.values():
            state.notify()

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self) -> None:
        """Upload and commit everything acknowledged so far."""
        self._check_open()
        assert self._uploader is not None
        await self._uploader.flush()
        self._raise_if_failed()

    async def compact(self) -> bool:
        """Run one compaction pass now (normally periodic); True if it rewrote objects."""
        self._check_open()
        compactor = self._compactor or Compactor(
            objects=self.objects,
            metadata=self.metadata,
            config=self.config.compaction,
            hooks=self.hooks,
            clock=self.clock,
            on_destroyed=self.reader.forget_objects,
            deployment_id=self.deployment_id,
        )
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
        self._check_open()
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

    # -- streams ------------------------------------------------------------------------------------

    async def create_stream(self, name: str | None = None) -> Stream:
        """Create a stream; ``name`` follows the stream-name rule of :mod:`walstream.records`
        (or is None for a stream addressed only by id)."""
        self._check_open()
        check_stream_name(name)
        info = await self.metadata.create_stream(name)
        return self._handle(info)

    async def open_stream(self, name_or_id: str | int) -> Stream:
        self._check_open()
        check_stream_ref(name_or_id)
        if isinstance(name_or_id, int):
            state = self._streams.get(name_or_id)
            if state is not None and not state.deleted:
                return Stream(self, state)
        info = await self.metadata.get_stream(name_or_id)
        return self._handle(info)

    async def list_streams(self, prefix: str = "") -> list[StreamInfo]:
        self._check_open()
        check_text(prefix, "prefix")
        return await self.metadata.list_streams(prefix)

    async def delete_stream(self, name_or_id: str | int) -> None:
        self._check_open()
        check_stream_ref(name_or_id)
        info = await self.metadata.get_stream(name_or_id)
        await self.metadata.delete_stream(info.stream_id)
        state = self._streams.pop(info.stream_id, None)
        if state is not None:
            state.deleted = True
            state.notify()
        self._cache.drop_stream(info.stream_id)

    def _handle(self, info: StreamInfo) -> Stream:
        state = self._streams.get(info.stream_id)
        if state is None or state.deleted:
            state = _StreamState(
                info=info,
                next_offset=info.committed_end,
                acked_tail=info.committed_end,
                start_offset=info.start_offset,
                fencing_token=info.fencing_token,
            )
            self._streams[info.stream_id] = state
        return Stream(self, state)

    def _is_live(self, stream_id: int) -> bool:
        state = self._streams.get(stream_id)
        return state is None or not state.deleted

    # -- write path ---------------------------------------------------------------------------------

    async def _claim(self, state: _StreamState) -> None:
        if state.claimed:
            return
        async with state.lock:
            if state.claimed:
                return
            info = await self.metadata.claim_stream(
                state.info.stream_id, self.node_id, self.node_epoch
            )
            state.info = info
            state.epoch = info.epoch
            state.next_offset = max(state.next_offset, info.committed_end)
            state.acked_tail = max(state.acked_tail, info.committed_end)
            state.start_offset = max(state.start_offset, info.start_offset)
            state.fencing_token = info.fencing_token
            cached = self._cache.stream_batches(info.stream_id)
            if cached:
                state.last_timestamp_ms = cached[-1].max_timestamp_ms
            state.claimed = True

    async def _append(
        self,
        state: _StreamState,
        records: list[Record],
        match_tail: int | None,
        fencing_token: str | None,
    ) -> AppendAck:
        self._check_writable(state)
        if not records:
            raise InvalidArgument("append needs at least one record")
        for record in records:
            if not isinstance(record, Record):
                raise InvalidArgument(
                    f"append takes walstream.Record objects, got {type(record).__name__}"
                )
        check_optional_int(match_tail, "match_tail")
        check_optional_text(fencing_token, "fencing_token", MAX_FENCING_TOKEN_BYTES)
        await self._claim(state)
        started = self.clock.monotonic()
        async with state.lock:
            self._check_writable(state)
            if fencing_token is not None and fencing_token != state.fencing_token:
                raise FencedError(
                    f"fencing token {fencing_token!r} does not match the stream's current token; "
                    "another writer fenced this stream"
                )
            if match_tail is not None and match_tail != state.next_offset:
                # Report a tail that reads agree with: let this stream's appends in flight settle.
                await self._wait_acked(state)
                raise TailMismatchError(
                    f"match_tail={match_tail} but the tail is {state.next_offset}",
                    state.next_offset,
                )
            now_ms = self.clock.now_ms()
            timestamps: list[int] = []
            last = state.last_timestamp_ms
            for record in records:
                timestamp = now_ms if record.timestamp_ms is None else record.timestamp_ms
                last = max(last, timestamp)  # timestamps never go backwards within a stream
                timestamps.append(last)
            base = state.next_offset
            data = encode_batch(state.info.stream_id, state.epoch, base, records, timestamps)
            if len(data) > self.wal.capabilities.max_record_bytes:
                limit = self.wal.capabilities.max_record_bytes
                if len(records) == 1:
                    raise CapacityError(
                        f"a single record of {len(data)} bytes (encoded) exceeds the WAL's "
                        f"maximum record of {limit} bytes; store large values elsewhere and "
                        "append a reference, or use a WAL with a larger max_record_bytes"
                    )
                raise CapacityError(
                    f"batch of {len(records)} records, {len(data)} bytes, exceeds the WAL's "
                    f"maximum record of {limit} bytes; append fewer records at once"
                )
            await self._wait_for_space(len(data))
            self._check_writable(state)
            # No await between the cache insert and the WAL submission: WAL order = cache order.
            batch = self._cache.add(
                state.info.stream_id,
                state.epoch,
                base,
                base + len(records),
                data,
                timestamps[0],
                timestamps[-1],
            )
            future = self.wal.append(data)
            future.add_done_callback(
                lambda done: self._on_wal_done(state, batch, done, len(records), started)
            )
            state.next_offset = base + len(records)
            state.last_timestamp_ms = last
            assert self._uploader is not None
            self._uploader.notify_added()
        self._inflight.add(future)
        try:
            await future
        finally:
            self._inflight.discard(future)
        return AppendAck(base, base + len(records), max(state.acked_tail, base + len(records)))

    async def _wait_acked(self, state: _StreamState) -> None:
        while state.acked_tail < state.next_offset:
            self._raise_if_failed()
            changed = state.changed
            await self.clock.wait(changed, 1.0)

    def _on_wal_done(
        self,
        state: _StreamState,
        batch: CachedBatch,
        future: asyncio.Future[int],
        count: int,
        started: float,
    ) -> None:
        # Runs in WAL order (the WAL completes futures in order; callbacks are FIFO).
        if future.cancelled() or future.exception() is not None:
            batch.failed = True
            batch.block.settle_one()
            error = (
                future.exception() if not future.cancelled() else BackendUnavailable("cancelled")
            )
            self._on_fatal(error or BackendUnavailable("WAL append failed"))
            return
        batch.wal_offset = future.result()
        batch.acked = True
        batch.block.settle_one()
        state.acked_tail = max(state.acked_tail, batch.end_offset)
        state.notify()
        self.hooks.emit(
            WalAppended(
                self.node_id,
                state.info.stream_id,
                count,
                len(batch.data),
                self.clock.monotonic() - started,
            )
        )

    async def _wait_for_space(self, size: int) -> None:
        cache = self._cache
        if cache.unuploaded_bytes + size <= self._unuploaded_limit or cache.unuploaded_bytes == 0:
            return
        assert self._uploader is not None
        deadline = self.clock.monotonic() + self.config.append_timeout_s
        while cache.unuploaded_bytes + size > self._unuploaded_limit and cache.unuploaded_bytes > 0:
            self._raise_if_failed()
            self._uploader.request_upload()
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                raise CapacityError(
                    f"append waited {self.config.append_timeout_s:.1f}s for uploads to free "
                    f"space ({cache.unuploaded_bytes} bytes not yet uploaded); the object store "
                    "may be slow or down — retry later or raise cache.log_cache_bytes"
                )
            cache.space_freed.clear()
            await self.clock.wait(cache.space_freed, min(remaining, 1.0))

    async def _trim(self, state: _StreamState, new_start: int) -> None:
        self._check_writable(state)
        await self._claim(state)
        async with state.lock:
            if new_start > state.next_offset or new_start < 0:
                raise OutOfRangeError(
                    f"trim({new_start}) is beyond the tail {state.next_offset}",
                    state.start_offset,
                    state.next_offset,
                )
            if new_start <= state.start_offset:
                return
            info = await self.metadata.trim_stream(state.info.stream_id, state.epoch, new_start)
            state.info = info
            state.start_offset = info.start_offset

    async def _set_fencing_token(self, state: _StreamState, token: str | None) -> None:
        self._check_writable(state)
        await self._claim(state)
        async with state.lock:
            await self.metadata.set_fencing_token(state.info.stream_id, state.epoch, token)
            state.fencing_token = token

    async def _check_tail(self, state: _StreamState) -> int:
        self._check_open()
        await self._refresh_remote(state)
        if state.deleted:
            raise StreamNotFound(f"stream {state.info.stream_id} was deleted")
        return state.acked_tail

    async def _refresh_remote(self, state: _StreamState) -> None:
        """A stream this node does not write: its tail is what is committed in metadata."""
        if state.claimed:
            return
        info = (await self.metadata.get_streams([state.info.stream_id])).get(state.info.stream_id)
        if info is None or info.state is StreamState.DELETED:
            state.deleted = True
            return
        state.info = info
        state.acked_tail = max(state.acked_tail, info.committed_end)
        state.next_offset = max(state.next_offset, info.committed_end)
        state.start_offset = max(state.start_offset, info.start_offset)

    # -- read path ----------------------------------------------------------------------------------

    async def _read(
        self,
        state: _StreamState,
        start: int | None,
        from_timestamp: int | None,
        tail_offset: int | None,
        limit_records: int,
        limit_bytes: int,
        wait: float,
    ) -> ReadResult:
        self._check_open()
        if sum(value is not None for value in (start, from_timestamp, tail_offset)) != 1:
            raise InvalidArgument("read needs exactly one of start, from_timestamp, tail_offset")
        check_optional_int(start, "start")
        check_optional_int(from_timestamp, "from_timestamp", minimum=MIN_I64)
        check_optional_int(tail_offset, "tail_offset")
        check_int(limit_records, "limit_records", minimum=1)
        check_int(limit_bytes, "limit_bytes", minimum=1)
        wait = check_wait(wait)
        await self._refresh_remote(state)
        if state.deleted:
            raise StreamNotFound(f"stream {state.info.stream_id} was deleted")
        if tail_offset is not None:
            if tail_offset < 0:
                raise InvalidArgument("tail_offset must be >= 0")
            start = max(state.start_offset, state.acked_tail - tail_offset)
        elif from_timestamp is not None:
            start = await self._offset_for_timestamp(state, from_timestamp)
        assert start is not None
        if start < state.start_offset or start > state.acked_tail:
            raise OutOfRangeError(
                f"offset {start} is outside [{state.start_offset}, {state.acked_tail}] of stream "
                f"{state.info.stream_id}" + (" (trimmed)" if start < state.start_offset else ""),
                state.start_offset,
                state.acked_tail,
            )
        deadline = self.clock.monotonic() + wait
        while start >= state.acked_tail:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0 or self._closed or state.deleted:
                return ReadResult([], state.acked_tail)
            changed = state.changed
            timeout = remaining if state.claimed else min(remaining, _REMOTE_POLL_S)
            await self.clock.wait(changed, timeout)
            await self._refresh_remote(state)
        records = await self._collect(state, start, limit_records, limit_bytes)
        if records and records[0].offset < state.start_offset:
            # A trim raced the read: never return trimmed records.
            records = [record for record in records if record.offset >= state.start_offset]
        return ReadResult(records, state.acked_tail)

    async def _collect(
        self, state: _StreamState, start: int, limit_records: int, limit_bytes: int
    ) -> list[SequencedRecord]:
        stream_id = state.info.stream_id
        records: list[SequencedRecord] = []
        size = 0
        position = start
        stale = 0
        while len(records) < limit_records and size < limit_bytes and position < state.acked_tail:
            cached = self._cache.batches_from(stream_id, position)
            served = 0
            if cached:
                for batch in cached:
                    if batch.base_offset >= state.acked_tail:
                        break
                    if batch.base_offset > position:
                        # A hole between cached batches: a recorded data-loss gap. Only the
                        # reader path below can tell, so stop serving from the cache here.
                        break
                    for record in decode_batch(batch.data)[1]:
                        if record.offset < position:
                            continue
                        if records and (len(records) >= limit_records or size >= limit_bytes):
                            break
                        records.append(record)
                        size += record_size(record)
                        served += 1
                        position = record.offset + 1
                    if len(records) >= limit_records or size >= limit_bytes:
                        break
                if served:
                    self.hooks.emit(ReadServed(stream_id, served, size, "log_cache"))
                    continue
            first_cached = self._cache.first_offset(stream_id)
            end = (
                first_cached
                if first_cached is not None and first_cached > position
                else state.acked_tail
            )
            try:
                found = await self.reader.read(
                    stream_id,
                    position,
                    end,
                    limit_records - len(records),
                    max(1, limit_bytes - size),
                )
            except DataLossError:
                if records:
                    return records  # the records up to the gap; the next read raises
                raise
            if not found:
                # Between the cache and the objects (an eviction or compaction raced us): retry.
                stale += 1
                if stale > 50:
                    raise BackendUnavailable(
                        f"stream {stream_id}: offset {position} is neither cached nor committed; "
                        "metadata and object store disagree"
                    )
                await self.clock.sleep(0.01)
                continue
            for record in found:
                records.append(record)
                size += record_size(record)
            position = found[-1].offset + 1
        return records

    async def _offset_for_timestamp(self, state: _StreamState, timestamp_ms: int) -> int:
        stream_id = state.info.stream_id
        position = state.start_offset
        while True:
            infos = await self.metadata.get_objects(stream_id, position, None, limit=100)
            if not infos:
                break
            for info in infos:
                stream_range = info.ranges[0]
                if stream_range.max_timestamp_ms >= timestamp_ms:
                    records = await self.reader.read(
                        stream_id,
                        max(position, stream_range.start_offset),
                        stream_range.end_offset,
                        1 << 30,
                        1 << 62,
                    )
                    for record in records:
                        if record.timestamp_ms >= timestamp_ms:
                            return record.offset
                position = stream_range.end_offset
        for batch in self._cache.stream_batches(stream_id):
            if (
                batch.acked
                and batch.end_offset > position
                and batch.max_timestamp_ms >= timestamp_ms
            ):
                for record in decode_batch(batch.data)[1]:
                    if record.offset >= position and record.timestamp_ms >= timestamp_ms:
                        return record.offset
        return state.acked_tail

    # -- state --------------------------------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        """The failure that stopped this node accepting writes (a fenced node, a failed WAL or
        upload), or ``None`` while it is healthy. Restart the client to recover."""
        return self._failure

    def _on_fatal(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
            log.error("node %d stopped accepting writes: %s", self.node_id, error)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            if isinstance(self._failure, FencedError):
                raise FencedError(f"node {self.node_id} was fenced: {self._failure}")
            raise BackendUnavailable(
                f"node {self.node_id} stopped accepting writes after a failure "
                f"({type(self._failure).__name__}: {self._failure}); restart the client so "
                "recovery can resolve what was written"
            )

    def _check_open(self) -> None:
        if not self._started:
            raise InvalidArgument("start() the client first (or use walstream.open)")
        if self._closed:
            raise InvalidArgument("the client is closed")

    def _check_writable(self, state: _StreamState) -> None:
        self._check_open()
        if state.deleted:
            raise StreamNotFound(f"stream {state.info.stream_id} was deleted")
        self._raise_if_failed()

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
