"""The two caches of a node (docs/architecture/write-path.md, docs/architecture/read-path.md).

**LogCache** — the hot tail: every appended batch, in append order, grouped in blocks. The active
block is sealed by size or age and uploaded; a committed block becomes evictable (FIFO). Bytes not
yet uploaded are bounded: appends wait for uploads (back-pressure) instead of growing memory.

**BlockCache** — cold reads: an LRU of decoded object data blocks, bounded in bytes.
"""

from __future__ import annotations

import asyncio
import bisect
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from walstream.clock import Clock

__all__ = ["BlockCache", "CachedBatch", "LogBlock", "LogCache", "StreamRun"]

_PENDING, _ACKED, _FAILED = 0, 1, 2
#: Fixed-size fields of a cached batch, in this order, in :attr:`LogBlock.fields`.
_FIELDS = 7
_STREAM, _EPOCH, _BASE, _END, _MIN_TS, _MAX_TS, _WAL = range(_FIELDS)


@dataclass(eq=False, slots=True)
class CachedBatch:
    """A view of one batch of the LogCache, made when a reader or the uploader asks for it
    (the cache itself keeps batches as columns of its blocks, see :class:`LogBlock`)."""

    stream_id: int
    epoch: int
    base_offset: int
    end_offset: int
    data: bytes
    """The encoded batch, exactly as written to the WAL and to objects."""
    min_timestamp_ms: int
    max_timestamp_ms: int
    wal_offset: int = -1
    acked: bool = False
    failed: bool = False


class LogBlock:
    """A block of the LogCache: its batches, in append order, kept as columns — the fixed-size
    fields of batch ``i`` at ``fields[7*i : 7*i+7]`` (stream id, epoch, base and end offset,
    min and max timestamp, WAL offset), its state (pending, acknowledged, failed) in
    ``states[i]``, its bytes in ``data[i]``.

    Why columns: a node caches hundreds of thousands of small batches. As objects, each one is
    tracked by Python's cyclic garbage collector, whose full passes over them stall the event
    loop for tens of milliseconds; arrays of numbers and a list of bytes are not traversed."""

    __slots__ = (
        "__weakref__",
        "block_id",
        "committed",
        "created_at",
        "data",
        "fields",
        "pending",
        "sealed",
        "settled",
        "size_bytes",
        "states",
    )

    def __init__(self, block_id: int, created_at: float) -> None:
        self.block_id = block_id
        self.created_at = created_at
        self.fields = array("q")
        self.states = bytearray()
        self.data: list[bytes] = []
        self.size_bytes = 0
        self.sealed = False
        self.committed = False
        self.pending = 0
        """Batches neither acknowledged nor failed yet."""
        self.settled = asyncio.Event()
        """Set when ``pending`` reaches 0 after sealing: the block can be uploaded."""

    def __len__(self) -> int:
        return len(self.states)

    def settle(self, index: int, wal_offset: int) -> None:
        """Batch ``index`` is durable in the WAL at ``wal_offset`` (acknowledged)."""
        self.fields[_FIELDS * index + _WAL] = wal_offset
        self.states[index] = _ACKED
        self._settled_one()

    def fail(self, index: int) -> None:
        """Batch ``index`` will never be acknowledged (its WAL append failed or was refused)."""
        self.states[index] = _FAILED
        self._settled_one()

    def _settled_one(self) -> None:
        self.pending -= 1
        if self.sealed and self.pending == 0:
            self.settled.set()

    def acked(self, index: int) -> bool:
        return self.states[index] == _ACKED

    def stream_id(self, index: int) -> int:
        return self.fields[_FIELDS * index + _STREAM]

    def batch(self, index: int) -> CachedBatch:
        """A view of batch ``index``."""
        at = _FIELDS * index
        stream_id, epoch, base, end, min_ts, max_ts, wal_offset = self.fields[at : at + _FIELDS]
        state = self.states[index]
        return CachedBatch(
            stream_id,
            epoch,
            base,
            end,
            self.data[index],
            min_ts,
            max_ts,
            wal_offset,
            state == _ACKED,
            state == _FAILED,
        )

    @property
    def batches(self) -> list[CachedBatch]:
        """Views of every batch, in append order."""
        return [self.batch(index) for index in range(len(self.states))]

    def acked_runs(self) -> list[StreamRun]:
        """The acknowledged batches, one run per stream, streams in the order of their first
        batch here (what the uploader writes). One pass over the columns: each run gets its
        offsets, epoch, timestamps and size as it grows, so the uploader does no further work
        per batch to describe a stream (a block of random appends holds thousands of streams
        of one or two batches each)."""
        runs: dict[int, StreamRun] = {}
        fields, states, data = self.fields, self.states, self.data
        get = runs.get
        at = 0
        for index in range(len(states)):
            if states[index] != _ACKED:
                at += _FIELDS
                continue
            stream_id, epoch, base, end, min_ts, max_ts = fields[at : at + 6]
            at += _FIELDS
            run = get(stream_id)
            if run is None:
                runs[stream_id] = StreamRun(
                    self, stream_id, [index], len(data[index]), epoch, base, end, min_ts, max_ts
                )
                continue
            run.indexes.append(index)
            run.size_bytes += len(data[index])
            run.epoch = epoch
            run.end_offset = end
            if min_ts < run.min_timestamp_ms:
                run.min_timestamp_ms = min_ts
            if max_ts > run.max_timestamp_ms:
                run.max_timestamp_ms = max_ts
        return list(runs.values())

    @property
    def last_acked_wal_offset(self) -> int:
        fields, states = self.fields, self.states
        offsets = [
            fields[_FIELDS * index + _WAL] for index in range(len(states)) if states[index] == _ACKED
        ]
        return max(offsets) if offsets else -1


class StreamRun:
    """One stream's acknowledged batches in one block, in offset order: their places in the
    block, total size, offsets ``[start_offset, end_offset)``, the newest batch's epoch and the
    timestamps' range."""

    __slots__ = (
        "block",
        "end_offset",
        "epoch",
        "indexes",
        "max_timestamp_ms",
        "min_timestamp_ms",
        "size_bytes",
        "start_offset",
        "stream_id",
    )

    def __init__(
        self,
        block: LogBlock,
        stream_id: int,
        indexes: list[int],
        size_bytes: int,
        epoch: int,
        start_offset: int,
        end_offset: int,
        min_timestamp_ms: int,
        max_timestamp_ms: int,
    ) -> None:
        self.block = block
        self.stream_id = stream_id
        self.indexes = indexes
        self.size_bytes = size_bytes
        self.epoch = epoch
        self.start_offset = start_offset
        self.end_offset = end_offset
        self.min_timestamp_ms = min_timestamp_ms
        self.max_timestamp_ms = max_timestamp_ms

    def columns(self) -> tuple[list[bytes], Sequence[int], Sequence[int]]:
        """The encoded batches, their base offsets and their end offsets (whole columns of the
        block, sliced in C, when the run is the whole block)."""
        block, indexes = self.block, self.indexes
        fields, data = block.fields, block.data
        if len(indexes) == len(block):
            return data[:], fields[_BASE::_FIELDS], fields[_END::_FIELDS]
        return (
            [data[index] for index in indexes],
            [fields[_FIELDS * index + _BASE] for index in indexes],
            [fields[_FIELDS * index + _END] for index in indexes],
        )


class _StreamIndex:
    """Where one stream's cached batches are, in offset order: for batch ``i``, its base offset
    ``base_offsets[i]`` and its place ``(blocks[i], positions[i])``."""

    __slots__ = ("base_offsets", "blocks", "positions")

    def __init__(self) -> None:
        self.base_offsets = array("q")
        self.blocks: list[LogBlock] = []
        self.positions = array("q")

    def drop_first(self, count: int) -> None:
        del self.base_offsets[:count]
        del self.blocks[:count]
        del self.positions[:count]


class LogCache:
    """FIFO of blocks holding every batch that is not yet evicted.

    Invariants: per stream, cached batches are contiguous and ordered; a block is evicted only
    after it is committed to object storage, so ``[objects] ∪ [LogCache]`` always covers a
    stream's acknowledged data.
    """

    def __init__(self, max_bytes: int, clock: Clock) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self._next_block_id = 0
        self._blocks: deque[LogBlock] = deque()
        self.active = self._new_block()
        self._per_stream: dict[int, _StreamIndex] = {}
        self.total_bytes = 0
        self.unuploaded_bytes = 0
        self.space_freed = asyncio.Event()

    def _new_block(self) -> LogBlock:
        block = LogBlock(self._next_block_id, self._clock.monotonic())
        self._next_block_id += 1
        self._blocks.append(block)
        return block

    def add(
        self,
        stream_id: int,
        epoch: int,
        base_offset: int,
        end_offset: int,
        data: bytes,
        min_timestamp_ms: int,
        max_timestamp_ms: int,
    ) -> int:
        """Put a batch, pending, in the active block; returns its index there (the block
        settles it: :meth:`LogBlock.settle` or :meth:`LogBlock.fail`)."""
        block = self.active
        index = len(block.states)
        if not index:
            block.created_at = self._clock.monotonic()
        block.fields.extend(
            (stream_id, epoch, base_offset, end_offset, min_timestamp_ms, max_timestamp_ms, -1)
        )
        block.states.append(_PENDING)
        block.data.append(data)
        size = len(data)
        block.size_bytes += size
        block.pending += 1
        streams = self._per_stream.get(stream_id)
        if streams is None:
            streams = self._per_stream[stream_id] = _StreamIndex()
        streams.base_offsets.append(base_offset)
        streams.blocks.append(block)
        streams.positions.append(index)
        self.total_bytes += size
        self.unuploaded_bytes += size
        return index

    def seal_active(self) -> LogBlock | None:
        """Seal the active block (if it holds anything) and open a new one."""
        block = self.active
        if not len(block):
            return None
        block.sealed = True
        if block.pending == 0:
            block.settled.set()
        self.active = self._new_block()
        return block

    def active_age(self) -> float:
        if not len(self.active):
            return 0.0
        return self._clock.monotonic() - self.active.created_at

    def mark_committed(self, block: LogBlock) -> None:
        block.committed = True
        self.unuploaded_bytes -= block.size_bytes
        self._evict()
        self.space_freed.set()

    def _evict(self) -> None:
        while self._blocks and self._blocks[0].committed and self.total_bytes > self.max_bytes:
            block = self._blocks.popleft()
            self.total_bytes -= block.size_bytes
            counts: dict[int, int] = {}
            for index in range(len(block)):
                stream_id = block.stream_id(index)
                counts[stream_id] = counts.get(stream_id, 0) + 1
            for stream_id, count in counts.items():
                streams = self._per_stream.get(stream_id)
                if streams is None:
                    continue
                streams.drop_first(count)
                if not streams.blocks:
                    del self._per_stream[stream_id]

    def batches_from(self, stream_id: int, offset: int) -> Iterator[CachedBatch]:
        """Acknowledged cached batches of ``stream_id`` from the one holding ``offset`` on,
        made as they are taken (take them before the next await: the cache moves on).

        Nothing when the cache does not hold ``offset`` (it is older than the cache, or not
        yet acknowledged).
        """
        streams = self._per_stream.get(stream_id)
        if streams is None or not streams.base_offsets or offset < streams.base_offsets[0]:
            return
        index = bisect.bisect_right(streams.base_offsets, offset) - 1
        blocks, positions = streams.blocks, streams.positions
        for at in range(index, len(blocks)):
            block, position = blocks[at], positions[at]
            if not block.acked(position):
                return
            yield block.batch(position)

    def first_offset(self, stream_id: int) -> int | None:
        streams = self._per_stream.get(stream_id)
        return streams.base_offsets[0] if streams and streams.base_offsets else None

    def stream_batches(self, stream_id: int) -> list[CachedBatch]:
        """Views of every cached batch of ``stream_id``, in offset order."""
        streams = self._per_stream.get(stream_id)
        if streams is None:
            return []
        return [
            block.batch(position)
            for block, position in zip(streams.blocks, streams.positions, strict=True)
        ]

    def last_batch(self, stream_id: int) -> CachedBatch | None:
        """A view of the newest cached batch of ``stream_id``."""
        streams = self._per_stream.get(stream_id)
        if not streams or not streams.blocks:
            return None
        return streams.blocks[-1].batch(streams.positions[-1])

    def drop_stream(self, stream_id: int) -> None:
        """Forget a deleted stream's batches for reads (uploads skip them too)."""
        self._per_stream.pop(stream_id, None)

    def blocks(self) -> list[LogBlock]:
        return list(self._blocks)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BlockCache(Generic[K, V]):
    """An LRU bounded in bytes (each entry's size is given when it is put)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def put(self, key: K, value: V, size_bytes: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.size_bytes -= old[1]
        if size_bytes > self.max_bytes:
            return
        self._entries[key] = (value, size_bytes)
        self.size_bytes += size_bytes
        while self.size_bytes > self.max_bytes:
            _, (_, evicted_size) = self._entries.popitem(last=False)
            self.size_bytes -= evicted_size

    def discard_if(self, predicate: Callable[[K], bool]) -> None:
        for key in [key for key in self._entries if predicate(key)]:
            _, size = self._entries.pop(key)
            self.size_bytes -= size

    def __len__(self) -> int:
        return len(self._entries)
