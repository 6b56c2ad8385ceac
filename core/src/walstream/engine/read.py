"""The read path (docs/architecture/read-path.md): LogCache (hot tail) → metadata → BlockCache → object store.

:class:`StreamReader` serves a node's reads: acknowledged records still in the LogCache come from
memory, older ones through the :class:`~walstream.engine.object_reader.ObjectReader`; at the tail
a read waits (up to its ``wait``) for the next acknowledgement, or, for a stream another node
writes, polls metadata for newly committed records. The acknowledgement itself wakes a read
waiting here, ahead of the appender: the read has returned the records by the time the
``append`` that wrote them returns.

:func:`read_committed` reads committed records with no node at all (Spark, tools on a stopped
deployment).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from walstream.clock import Clock
from walstream.engine.cache import LogCache
from walstream.engine.events import EngineHooks, ReadServed
from walstream.engine.object_reader import ObjectReader
from walstream.engine.streams import LocalStream, NodeGate, StreamRegistry
from walstream.errors import (
    BackendUnavailable,
    DataLossError,
    InvalidArgument,
    OutOfRangeError,
    StreamNotFound,
)
from walstream.format.batch import decode_batch, record_size
from walstream.metadata.contract import MetadataStore
from walstream.objects.contract import ObjectStore
from walstream.records import (
    MIN_I64,
    ReadResult,
    SequencedRecord,
    check_int,
    check_optional_int,
    check_wait,
)

__all__ = ["StreamReader", "read_committed"]

_REMOTE_POLL_S = 0.1
"""How often a read waiting at the tail of a stream another node writes looks at metadata."""
_STALE_RETRIES = 50
"""Rounds a read retries an offset that is neither cached nor committed (an eviction or a
compaction raced it) before it reports metadata and object store as disagreeing."""


class StreamReader:
    """Reads, tails and timestamp lookups of one node's streams."""

    def __init__(
        self,
        *,
        metadata: MetadataStore,
        cache: LogCache,
        objects: ObjectReader,
        registry: StreamRegistry,
        gate: NodeGate,
        hooks: EngineHooks,
        clock: Clock,
    ) -> None:
        self._metadata = metadata
        self._cache = cache
        self._objects = objects
        self._registry = registry
        self._gate = gate
        self._hooks = hooks
        self._clock = clock

    async def check_tail(self, state: LocalStream) -> int:
        self._gate.check_open()
        await self._registry.refresh_remote(state)
        if state.deleted:
            raise StreamNotFound(f"stream {state.info.stream_id} was deleted")
        self._gate.check_tail_current(state)  # never a tail the node can no longer vouch for
        return state.acked_tail

    async def read(
        self,
        state: LocalStream,
        start: int | None,
        from_timestamp: int | None,
        tail_offset: int | None,
        limit_records: int,
        limit_bytes: int,
        wait: float,
    ) -> ReadResult:
        self._gate.check_open()
        if sum(value is not None for value in (start, from_timestamp, tail_offset)) != 1:
            raise InvalidArgument("read needs exactly one of start, from_timestamp, tail_offset")
        check_optional_int(start, "start")
        check_optional_int(from_timestamp, "from_timestamp", minimum=MIN_I64)
        check_optional_int(tail_offset, "tail_offset")
        check_int(limit_records, "limit_records", minimum=1)
        check_int(limit_bytes, "limit_bytes", minimum=1)
        wait = check_wait(wait)
        await self._registry.refresh_remote(state)
        if state.deleted:
            raise StreamNotFound(f"stream {state.info.stream_id} was deleted")
        # A node past its lease may have been failed over: neither its tail nor an out-of-range
        # answer built on it may be older than an append acknowledged elsewhere since.
        self._gate.check_tail_current(state)
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
        deadline = self._clock.monotonic() + wait
        while start >= state.acked_tail:
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0 or self._gate.closed or state.deleted:
                self._gate.check_tail_current(state)
                return ReadResult([], state.acked_tail)
            timeout = remaining if state.claimed else min(remaining, _REMOTE_POLL_S)
            await self._clock.wait(state.changed, timeout)
            await self._registry.refresh_remote(state)
        records = await self._collect(state, start, limit_records, limit_bytes)
        if records and records[0].offset < state.start_offset:
            # A trim raced the read: never return trimmed records.
            records = [record for record in records if record.offset >= state.start_offset]
        self._gate.check_tail_current(state)  # the lease may have run out while it read
        return ReadResult(records, state.acked_tail)

    async def _collect(
        self, state: LocalStream, start: int, limit_records: int, limit_bytes: int
    ) -> list[SequencedRecord]:
        stream_id = state.info.stream_id
        records: list[SequencedRecord] = []
        size = 0
        position = start
        stale = 0
        while len(records) < limit_records and size < limit_bytes and position < state.acked_tail:
            cached = self._cache.batches_from(stream_id, position)
            served = 0
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
                self._hooks.emit(ReadServed(stream_id, served, size, "log_cache"))
                continue
            first_cached = self._cache.first_offset(stream_id)
            end = (
                first_cached
                if first_cached is not None and first_cached > position
                else state.acked_tail
            )
            try:
                found = await self._objects.read(
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
                if stale > _STALE_RETRIES:
                    raise BackendUnavailable(
                        f"stream {stream_id}: offset {position} is neither cached nor committed; "
                        "metadata and object store disagree"
                    )
                await self._clock.sleep(0.01)
                continue
            for record in found:
                records.append(record)
                size += record_size(record)
            position = found[-1].offset + 1
        return records

    async def _offset_for_timestamp(self, state: LocalStream, timestamp_ms: int) -> int:
        stream_id = state.info.stream_id
        position = state.start_offset
        while True:
            infos = await self._metadata.get_objects(stream_id, position, None, limit=100)
            if not infos:
                break
            for info in infos:
                stream_range = info.ranges[0]
                if stream_range.max_timestamp_ms >= timestamp_ms:
                    records = await self._objects.read(
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


async def read_committed(
    objects: ObjectStore,
    metadata: MetadataStore,
    stream_id: int,
    start: int,
    end: int | None = None,
    *,
    batch_records: int = 10_000,
    reader: ObjectReader | None = None,
) -> AsyncIterator[SequencedRecord]:
    """Every committed record of ``stream_id`` in ``[max(start, start_offset), end)``, in order,
    read straight from the object store (no node involved). Reaching a recorded data-loss gap
    raises :class:`DataLossError` after the records before it were yielded. The scan reads ahead
    from its first GET (see :class:`ObjectReader`); what it read ahead is released when it ends,
    is closed early or is cancelled."""
    reader = reader or ObjectReader(objects, metadata)
    info = (await metadata.get_streams([stream_id])).get(stream_id)
    if info is None:
        return
    position = max(start, info.start_offset)
    stop = info.committed_end if end is None else min(end, info.committed_end)
    try:
        while position < stop:
            records = await reader.read(
                stream_id, position, stop, batch_records, 64 << 20, sequential=True
            )
            if not records:
                break
            for record in records:
                yield record
            position = records[-1].offset + 1
    finally:
        # Ended, closed early or cancelled: nothing read ahead for the scan will be read.
        reader.release(stream_id)
