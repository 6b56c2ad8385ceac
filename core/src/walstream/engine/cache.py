"""The two caches of a node (DESIGN §4–5).

**LogCache** — the hot tail: every appended batch, in append order, grouped in blocks. The active
block is sealed by size or age and uploaded; a committed block becomes evictable (FIFO). Bytes not
yet uploaded are bounded: appends wait for uploads (back-pressure) instead of growing memory.

**BlockCache** — cold reads: an LRU of decoded object data blocks, bounded in bytes.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from walstream.clock import Clock

__all__ = ["BlockCache", "CachedBatch", "LogBlock", "LogCache"]


@dataclass(eq=False, slots=True)
class CachedBatch:
    """One appended batch in the LogCache. It holds no reference to its block: a block's
    batches referring back to it would make every evicted block a reference cycle, freed only
    by the cyclic garbage collector (whose full passes over the cache then stall the loop);
    whoever settles a batch keeps its block (the active block when the batch was added)."""

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


@dataclass(eq=False)
class LogBlock:
    block_id: int
    created_at: float
    batches: list[CachedBatch] = field(default_factory=list)
    size_bytes: int = 0
    sealed: bool = False
    committed: bool = False
    pending: int = 0
    """Batches neither acknowledged nor failed yet."""
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when ``pending`` reaches 0 after sealing: the block can be uploaded."""

    def settle_one(self) -> None:
        self.pending -= 1
        if self.sealed and self.pending == 0:
            self.settled.set()

    @property
    def last_acked_wal_offset(self) -> int:
        offsets = [batch.wal_offset for batch in self.batches if batch.acked]
        return max(offsets) if offsets else -1


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
        self._per_stream: dict[int, list[CachedBatch]] = {}
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
    ) -> CachedBatch:
        block = self.active
        if not block.batches:
            block.created_at = self._clock.monotonic()
        batch = CachedBatch(
            stream_id, epoch, base_offset, end_offset, data, min_timestamp_ms, max_timestamp_ms
        )
        block.batches.append(batch)
        block.size_bytes += len(data)
        block.pending += 1
        self._per_stream.setdefault(stream_id, []).append(batch)
        self.total_bytes += len(data)
        self.unuploaded_bytes += len(data)
        return batch

    def seal_active(self) -> LogBlock | None:
        """Seal the active block (if it holds anything) and open a new one."""
        block = self.active
        if not block.batches:
            return None
        block.sealed = True
        if block.pending == 0:
            block.settled.set()
        self.active = self._new_block()
        return block

    def active_age(self) -> float:
        if not self.active.batches:
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
            for batch in block.batches:
                counts[batch.stream_id] = counts.get(batch.stream_id, 0) + 1
            for stream_id, count in counts.items():
                cached = self._per_stream.get(stream_id)
                if cached is None:
                    continue
                del cached[:count]
                if not cached:
                    del self._per_stream[stream_id]

    def batches_from(self, stream_id: int, offset: int) -> list[CachedBatch]:
        """Acknowledged cached batches of ``stream_id`` from the one holding ``offset`` on.

        Empty when the cache does not hold ``offset`` (it is older than the cache, or not yet
        acknowledged).
        """
        cached = self._per_stream.get(stream_id)
        if not cached or offset < cached[0].base_offset:
            return []
        index = bisect.bisect_right(cached, offset, key=lambda batch: batch.base_offset) - 1
        result: list[CachedBatch] = []
        for batch in cached[index:]:
            if not batch.acked:
                break
            result.append(batch)
        return result

    def first_offset(self, stream_id: int) -> int | None:
        cached = self._per_stream.get(stream_id)
        return cached[0].base_offset if cached else None

    def stream_batches(self, stream_id: int) -> list[CachedBatch]:
        return list(self._per_stream.get(stream_id, ()))

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
