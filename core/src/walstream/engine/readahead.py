"""Read-ahead of sequential scans of objects, for the
:class:`~walstream.engine.object_reader.ObjectReader`.

A sequential scan keeps what it reads next in flight, up to ``depth x max_bytes``
(``readahead_depth x readahead_max_bytes``): ranged GETs of its next windows of the same object,
and on into the objects that follow (their indexes, several at once, then their windows), so a
catch-up read overlaps the store's latency instead of paying it once per window. The first window
of a stream object (which holds only that stream's blocks, from its first byte) is fetched
together with its index when the scan reads all of it.

Memory: read-ahead holds at most ``depth x max_bytes`` (in flight, or fetched and not yet read),
all streams together. A scan never drops its own read-ahead to start more; it drops the oldest of
other streams. A scan that stops releases what it held (:meth:`ReadAhead.release`: the reader
calls it when a read does not continue the stream's last read, and
:func:`~walstream.engine.read.read_committed` when it ends or is closed or cancelled), and a read
cancelled while it waits for a prefetched range cancels that GET.

Checks: a prefetched range is checked exactly like a range fetched on demand (the same per-block
check, :func:`check_run`, done as soon as its bytes arrive, while the loop would sit idle); a bad
block in it fails only the read that reaches it, and a prefetch that failed or came back short is
simply fetched again on demand, so errors surface on the read that needs the data, as without
prefetching.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from walstream.engine.cache import BlockCache
from walstream.errors import CorruptionError
from walstream.format.object import (
    INDEX_ENTRY_SIZE,
    MAX_FOOTER_SIZE,
    IndexEntry,
    ObjectIndex,
    decode_block_records,
)
from walstream.metadata.contract import ObjectInfo, ObjectKind
from walstream.objects.contract import ObjectStore
from walstream.records import SequencedRecord

__all__ = ["Checked", "Prefetch", "ReadAhead", "check_run", "run_from"]

log = logging.getLogger(__name__)

_PrefetchKey = tuple[int, int, int]
"""(stream id, object id, first byte) of a read-ahead range."""


Checked = list[SequencedRecord] | CorruptionError
"""A data block checked: its records, or the error that fails the reads reaching it."""


@dataclass
class Prefetch:
    """A read-ahead GET of bytes ``[first, last)`` of an object, in flight or done. Its task
    checks each block of the stream that the range holds as soon as the bytes arrive (the loop
    would sit idle otherwise) and gives those blocks with their results, or ``None`` when the
    GET failed or came back short (the read fetches the blocks itself then)."""

    first: int
    last: int
    task: asyncio.Task[tuple[list[IndexEntry], list[Checked]] | None]

    def holds(self, entry: IndexEntry) -> bool:
        return self.first <= entry.position and entry.position + entry.size <= self.last


@dataclass
class _Plan:
    """Where a sequential scan reads next: ``entries[following]`` of ``infos[0]``'s object
    (blocks checked with ``seed``; ``entries=None``: from offset ``start``, its index not read
    yet), then the objects ``infos[1:]``, up to offset ``end``, with GETs of ``window_bytes``
    and more."""

    infos: list[ObjectInfo]
    entries: list[IndexEntry] | None
    following: int
    end: int | None
    window_bytes: int
    seed: int
    start: int = 0


class ReadAhead:
    """The read-ahead of one :class:`~walstream.engine.object_reader.ObjectReader`: it shares
    the reader's block cache and index cache, and loads indexes with ``load_index``."""

    def __init__(
        self,
        objects: ObjectStore,
        blocks: BlockCache[tuple[int, int], list[SequencedRecord]],
        indexes: BlockCache[int, ObjectIndex],
        load_index: Callable[[ObjectInfo, int], Awaitable[ObjectIndex]],
        max_bytes: int,
        depth: int,
    ) -> None:
        self._objects = objects
        self._blocks = blocks
        self._indexes = indexes
        self._load_index = load_index
        self.max_bytes = max_bytes
        self.budget_bytes = depth * max_bytes
        """Most bytes of read-ahead ranges held, all streams together."""
        self._prefetches: dict[_PrefetchKey, Prefetch] = {}
        """Read-ahead ranges in flight or fetched and not yet read, oldest first."""
        self._index_loads: dict[int, asyncio.Task[None]] = {}
        """Object id → a read-ahead of that object's index in flight."""
        self._plans: dict[int, _Plan] = {}
        """Stream id → where its sequential scan reads next."""
        self.prefetch_bytes = 0
        """Bytes of the read-ahead ranges held (in flight or fetched, not yet read)."""
        self.most_prefetch_bytes = 0
        """The largest ``prefetch_bytes`` seen."""

    def index_load(self, object_id: int) -> asyncio.Task[None] | None:
        """The read-ahead of the object's index in flight, if any."""
        return self._index_loads.get(object_id)

    def forget(self, object_ids: set[int]) -> None:
        """Drop (and cancel) what was read ahead of these objects (compacted away)."""
        for key in [key for key in self._prefetches if key[1] in object_ids]:
            dropped = self._drop(key)
            if dropped is not None:
                dropped.task.cancel()

    def plan_from(
        self,
        infos: list[ObjectInfo],
        stream_id: int,
        entries: list[IndexEntry],
        following: int,
        end: int | None,
        window_bytes: int,
        seed: int,
    ) -> None:
        """Remember where the scan reads next (``entries[following]`` of ``infos[0]``'s object,
        then the objects ``infos[1:]``) and keep as much of it in flight as the budget allows
        (:meth:`_plan`)."""
        if self.budget_bytes:
            self._plans[stream_id] = _Plan(infos, entries, following, end, window_bytes, seed)
            self._plan(stream_id)

    def plan_start(
        self,
        infos: list[ObjectInfo],
        stream_id: int,
        start: int,
        end: int | None,
        window_bytes: int,
    ) -> None:
        """A scan starts at offset ``start`` of ``infos[0]``'s object, whose index is not read
        yet: read its index (and first window) ahead, and the indexes of the objects after it;
        their windows follow in order as the indexes arrive."""
        if self.budget_bytes:
            self._plans[stream_id] = _Plan(infos, None, 0, end, window_bytes, 0, start)
            self._plan(stream_id)

    def _plan(self, stream_id: int) -> None:
        """Start the GETs of what the stream's scan reads next, in order, while the budget
        allows: the runs of its current object from where it reads, then of the objects that
        follow as long as they continue the stream. Each run is one GET sized as the scan will
        ask for it (the window doubles after each GET); ranges in flight count as they are.
        An object whose index is not cached yet gets its index read ahead (with its first
        window, see :meth:`prefetch_index`, when the objects before it are indexed) and room
        kept for its blocks, which are planned when its index arrives; the objects after it
        are planned on in the room left."""
        plan = self._plans.get(stream_id)
        if plan is None:
            return
        infos, entries, following = plan.infos, plan.entries, plan.following
        end, window_bytes, seed = plan.end, plan.window_bytes, plan.seed
        ahead = 0
        indexed = True
        for number, info in enumerate(infos):
            if number > 0 or entries is None:
                first_offset = plan.start
                if number > 0:
                    first_offset = info.ranges[0].start_offset
                    if first_offset != infos[number - 1].ranges[0].end_offset or (
                        end is not None and first_offset >= end
                    ):
                        return
                index = self._indexes.get(info.object_id)
                if index is None or not index.covers(stream_id):
                    whole = first_offset <= info.ranges[0].start_offset
                    self.prefetch_index(info, stream_id, end, window_bytes, indexed and whole)
                    indexed = False
                    # Room kept for its blocks (at most this much of the object is the
                    # stream's) before the objects after it take any.
                    ahead += info.size - info.index_size
                    if ahead >= self.budget_bytes:
                        return
                    continue
                entries = index.blocks_for(stream_id, first_offset, end)
                seed = index.block_crc_seed
                following = 0
            while following < len(entries):
                entry = entries[following]
                if (info.object_id, entry.position) in self._blocks:
                    following += 1
                    continue
                window_bytes = min(self.max_bytes, window_bytes * 2)
                pending = self._holding(stream_id, info.object_id, entry)
                if pending is None:
                    # As much of the window as the budget has room for (others' read-ahead
                    # makes room, the room kept for objects before this one does not), at
                    # least one block.
                    room = self.budget_bytes - max(self._held_by(stream_id), ahead)
                    run = run_from(self._blocks, info, entries, following, window_bytes, room)
                    if run[0].size > room or not self._prefetch_run(info, stream_id, run, seed):
                        return  # the budget is full of the stream's own read-ahead
                    following += len(run)
                    ahead += run[-1].position + run[-1].size - run[0].position
                else:
                    while following < len(entries) and pending.holds(entries[following]):
                        following += 1
                    ahead += pending.last - pending.first

    def _held_by(self, stream_id: int) -> int:
        return sum(
            pending.last - pending.first
            for (stream, _obj, _first), pending in self._prefetches.items()
            if stream == stream_id
        )

    def _holding(self, stream_id: int, object_id: int, entry: IndexEntry) -> Prefetch | None:
        """The stream's read-ahead range of the object that holds the block ``entry``."""
        for (stream, obj, _first), pending in self._prefetches.items():
            if stream == stream_id and obj == object_id and pending.holds(entry):
                return pending
        return None

    def _prefetch_run(
        self, info: ObjectInfo, stream_id: int, run: list[IndexEntry], seed: int
    ) -> bool:
        """Start a GET of ``run`` for the stream's scan; ``False`` when the budget is full of
        the stream's own read-ahead (others' are dropped, oldest first, to make room)."""
        first, last = run[0].position, run[-1].position + run[-1].size

        async def load() -> tuple[list[IndexEntry], list[Checked]] | None:
            data = await self._objects.get(info.key, first, last)
            if len(data) != last - first:
                return None  # the read fetches the range again and reports what is missing
            return run, check_run(info, run, seed, data, first)

        return self._start((stream_id, info.object_id, first), last, load)

    def _start(
        self,
        key: _PrefetchKey,
        last: int,
        load: Callable[[], Coroutine[Any, Any, tuple[list[IndexEntry], list[Checked]] | None]],
    ) -> bool:
        """Start ``load`` as the stream's read-ahead of bytes ``[key[2], last)``; ``False``
        when the budget is full of the stream's own read-ahead (others' are dropped, oldest
        first, to make room)."""
        if key in self._prefetches:
            return True
        others = [held for held in self._prefetches if held[0] != key[0]]
        while self.prefetch_bytes + last - key[2] > self.budget_bytes:
            if not others:
                return False
            dropped = self._drop(others.pop(0))
            if dropped is not None:
                dropped.task.cancel()
        task = asyncio.create_task(load())
        # Nobody may await a prefetch: its failure is only logged (the read fetches again).
        task.add_done_callback(_log_prefetch_failure)
        self._prefetches[key] = Prefetch(key[2], last, task)
        self.prefetch_bytes += last - key[2]
        self.most_prefetch_bytes = max(self.most_prefetch_bytes, self.prefetch_bytes)
        return True

    def prefetch_index(
        self, info: ObjectInfo, stream_id: int, end: int | None, window_bytes: int, head: bool
    ) -> None:
        """Read the index of ``info``'s object ahead; when it arrives, the scans that read
        through the object plan on (:meth:`_plan`). With ``head``: a stream object holds only
        the stream's blocks, from its first byte on, so when the scan reads all of the stream's
        range in it, its first window is fetched together with the index (and checked once the
        index arrived, like any range)."""
        if info.object_id in self._index_loads:
            return

        async def load() -> None:
            try:
                await self._load_index(info, stream_id)
            finally:
                self._index_loads.pop(info.object_id, None)
            for scanning, plan in list(self._plans.items()):
                if any(planned.object_id == info.object_id for planned in plan.infos):
                    self._plan(scanning)

        loading = asyncio.create_task(load())
        loading.add_done_callback(_log_prefetch_failure)
        self._index_loads[info.object_id] = loading
        stream_range = info.ranges[0]
        data_bytes = info.size - info.index_size
        head_bytes = min(data_bytes, window_bytes)
        # The fewest blocks the index can list (from its size): a window shorter than twice
        # their mean size may not hold a whole block, and would be fetched for nothing.
        blocks = max(1, (info.index_size - MAX_FOOTER_SIZE) // INDEX_ENTRY_SIZE)
        if (
            not head
            or info.kind is not ObjectKind.STREAM
            or (head_bytes < data_bytes and head_bytes * blocks < 2 * data_bytes)
            or (end is not None and end < stream_range.end_offset)
        ):
            return

        async def load_head() -> tuple[list[IndexEntry], list[Checked]] | None:
            data = await self._objects.get(info.key, 0, head_bytes)
            await asyncio.wait({loading})
            index = self._indexes.get(info.object_id)
            if index is None or not index.covers(stream_id) or len(data) != head_bytes:
                return None  # the read reads the index and the blocks itself
            run: list[IndexEntry] = []
            for entry in index.blocks_for(stream_id, stream_range.start_offset, end):
                if entry.position + entry.size > head_bytes or (
                    run and entry.position != run[-1].position + run[-1].size
                ):
                    break
                run.append(entry)
            return run, check_run(info, run, index.block_crc_seed, data, 0)

        self._start((stream_id, info.object_id, 0), head_bytes, load_head)

    def _drop(self, key: _PrefetchKey) -> Prefetch | None:
        pending = self._prefetches.pop(key, None)
        if pending is not None:
            self.prefetch_bytes -= pending.last - pending.first
        return pending

    def claim(self, stream_id: int, object_id: int, entry: IndexEntry) -> Prefetch | None:
        """Take the stream's read-ahead range of the object that holds the block ``entry``; its
        ranges of the object that end before it will not be read (blocks cached meanwhile):
        they are dropped."""
        claimed = None
        for key, pending in list(self._prefetches.items()):
            if key[0] != stream_id or key[1] != object_id:
                continue
            if pending.holds(entry):
                claimed = self._drop(key)
            elif pending.last <= entry.position:
                self._drop(key)
                pending.task.cancel()
        return claimed

    def release(self, stream_id: int) -> None:
        """Drop (and cancel) what was read ahead for ``stream_id``: its scan will not read it.
        Index reads ahead that no other scan plans to use are cancelled too (a read waiting for
        one reads the index itself)."""
        self._plans.pop(stream_id, None)
        for key in [key for key in self._prefetches if key[0] == stream_id]:
            dropped = self._drop(key)
            if dropped is not None:
                dropped.task.cancel()
        planned = {info.object_id for plan in self._plans.values() for info in plan.infos}
        for object_id, loading in list(self._index_loads.items()):
            if object_id not in planned:
                loading.cancel()

    async def checked(self, pending: Prefetch, run: list[IndexEntry]) -> list[Checked] | None:
        """The blocks ``run`` as ``pending`` checked them once fetched, or ``None`` when it
        failed, was cancelled or does not hold them all (the caller then fetches them)."""
        try:
            # wait() neither raises the prefetch's error nor cancels it.
            await asyncio.wait({pending.task})
        except asyncio.CancelledError:
            pending.task.cancel()  # claimed by this read: nobody else will use it
            raise
        if pending.task.cancelled() or pending.task.exception() is not None:
            return None
        loaded = pending.task.result()
        if loaded is None:
            return None
        held, checked = loaded
        skip = next((number for number, entry in enumerate(held) if entry == run[0]), len(held))
        if held[skip : skip + len(run)] != run:
            return None  # not the blocks the read needs (the index changed?): fetch them
        return checked[skip : skip + len(run)]


def run_from(
    blocks: BlockCache[tuple[int, int], list[SequencedRecord]],
    info: ObjectInfo,
    entries: list[IndexEntry],
    position: int,
    window_bytes: int,
    limit_bytes: int | None = None,
) -> list[IndexEntry]:
    """``entries[position]`` and the physically adjacent, uncached entries after it, up to
    ``window_bytes`` (always at least the first), never past ``limit_bytes`` in all."""
    run = [entries[position]]
    run_bytes = run[0].size
    while (
        position + len(run) < len(entries)
        and run_bytes < window_bytes
        and entries[position + len(run)].position == run[-1].position + run[-1].size
        and (info.object_id, entries[position + len(run)].position) not in blocks
        and (limit_bytes is None or run_bytes + entries[position + len(run)].size <= limit_bytes)
    ):
        run.append(entries[position + len(run)])
        run_bytes += run[-1].size
    return run


def check_run(
    info: ObjectInfo, run: list[IndexEntry], seed: int, data: bytes, first: int
) -> list[Checked]:
    """Check each block of ``run`` in ``data`` (the object's bytes from ``first``) on its own:
    its records, or its error (a bad block or a short read never fails its neighbours)."""
    checked: list[Checked] = []
    last = run[-1].position + run[-1].size
    for entry in run:
        if entry.position + entry.size - first > len(data):
            checked.append(
                CorruptionError(
                    f"object {info.key}: short read of {len(data)} of {last - first} bytes "
                    f"at {first} misses the block at {entry.position} (truncated object?)"
                )
            )
            continue
        try:
            checked.append(decode_block_records(data, entry, seed, at=entry.position - first))
        except CorruptionError as exc:
            checked.append(CorruptionError(f"object {info.key}: {exc}"))
    return checked


def _log_prefetch_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.debug("read-ahead failed (the read fetches the range itself): %s", error)
