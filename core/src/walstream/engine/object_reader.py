"""Reading committed stream data straight from object storage (DESIGN §5).

Used by the node's read path below its LogCache, and by readers that run no node at all (Spark
executors, ``walstream read`` on a stopped deployment): metadata says which objects hold a range,
one suffix GET reads an object's index, one ranged GET reads its blocks.

Identity: every index read checks that the footer names this deployment and the object id
metadata gave (:class:`IdentityMismatch` otherwise), and the data-block CRCs of a version-2 object
are seeded with that identity, so a block read from a replaced file fails its check too.

Pipelining: a sequential scan keeps its next read-ahead windows (up to ``_PREFETCH_DEPTH``) in
flight while the current one is decoded and consumed (the next runs of blocks of the same object,
or the index and first run of the object that follows), so a catch-up read overlaps the store's
latency instead of paying it once per window. At most ``4 x readahead_max_bytes`` are held. A prefetched range is only bytes: it is checked exactly like
a range fetched on demand, and a prefetch that failed is simply fetched again on demand, so errors
surface on the read that needs the data, as without prefetching.

Failure isolation: a block that fails its check fails only the reads whose records (within their
limits) lie in it. Nothing is cached for it (the block cache holds decoded good blocks only; an
index is cached only once it parsed), read-ahead never turns a bad following block into an error
of a read that ends before it, and the next read that reaches the bad block fetches it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from walstream.engine.cache import BlockCache
from walstream.engine.events import EngineHooks, NullHooks, ReadServed
from walstream.errors import (
    CorruptionError,
    DataLossError,
    IdentityMismatch,
    InvalidArgument,
    NotFound,
)
from walstream.format.batch import record_size
from walstream.format.object import (
    FOOTER_SIZE_V1,
    MAX_FOOTER_SIZE,
    IndexEntry,
    ObjectIdentity,
    ObjectIndex,
    check_foreign_footer,
    decode_block_records,
    parse_footer_checked,
    parse_index,
)
from walstream.format.object_keys import is_identity_key
from walstream.metadata.contract import MetadataStore, ObjectInfo
from walstream.objects.contract import ObjectStore
from walstream.records import SequencedRecord

__all__ = ["ObjectReader", "read_index"]

log = logging.getLogger(__name__)

_INDEX_CACHE_ENTRIES = 4096
_MAX_STALE_RETRIES = 3
_PREFETCH_DEPTH = 3
"""Windows of one sequential scan in flight beyond the one being read."""
_PREFETCH_BUDGET_WINDOWS = 4
"""Bytes held for read-ahead (in flight or fetched, not yet read), all streams together, in
``readahead_max_bytes``: to start another, the oldest are dropped."""


@dataclass
class _Sequential:
    next_offset: int
    window_bytes: int


@dataclass
class _Prefetch:
    """A read-ahead GET in flight: about ``size`` bytes of an object from ``first`` (``None``
    until the object's index said where the stream's blocks start)."""

    first: int | None
    size: int
    task: asyncio.Task[tuple[int, int, bytes] | None]


class ObjectReader:
    """Reads a stream's committed records through a bounded BlockCache with read-ahead.

    Read-ahead: a reader that keeps reading where it stopped gets a window that doubles from
    ``readahead_min_bytes`` to ``readahead_max_bytes``; the window's following blocks of the
    same object are fetched with the same ranged GET.

    ``deployment_id`` is the deployment whose objects this reader accepts; when not given it is
    loaded once from ``metadata``.
    """

    def __init__(
        self,
        objects: ObjectStore,
        metadata: MetadataStore,
        block_cache_bytes: int = 128 << 20,
        readahead_min_bytes: int = 512 << 10,
        readahead_max_bytes: int = 32 << 20,
        hooks: EngineHooks | None = None,
        deployment_id: bytes | None = None,
    ) -> None:
        self.objects = objects
        self.deployment_id = deployment_id
        self.metadata = metadata
        self.blocks: BlockCache[tuple[int, int], list[SequencedRecord]] = BlockCache(
            block_cache_bytes
        )
        self._indexes: BlockCache[int, ObjectIndex] = BlockCache(_INDEX_CACHE_ENTRIES)
        self.readahead_min_bytes = readahead_min_bytes
        self.readahead_max_bytes = readahead_max_bytes
        self._sequential: dict[int, _Sequential] = {}
        self._hooks: EngineHooks = hooks or NullHooks()
        self._prefetches: dict[tuple[int, int, int | None], _Prefetch] = {}
        """(stream id, object id, first byte or None) → a read-ahead in flight."""
        self.prefetch_bytes = 0
        """Bytes of the read-ahead ranges held (in flight or fetched, not yet read)."""
        self.gets = 0
        self.prefetched_gets = 0
        """GETs whose bytes a read used from a prefetch (included in ``gets``)."""

    async def read(
        self,
        stream_id: int,
        start: int,
        end: int | None,
        limit_records: int,
        limit_bytes: int,
    ) -> list[SequencedRecord]:
        """Committed records of ``stream_id`` in ``[start, end)``, at most the limits (at least
        one record when any exists). Stops early at the end of committed data, and before a
        recorded data-loss gap; a read that starts inside one raises :class:`DataLossError`.
        Raises :class:`CorruptionError` (or :class:`IdentityMismatch`) when a record within the
        limits lies in a block that fails its check; a read that ends before that block succeeds."""
        records: list[SequencedRecord] = []
        size = 0
        position = start
        window = [self._window(stream_id, start)]
        stale_retries = 0
        while (
            len(records) < limit_records and size < limit_bytes and (end is None or position < end)
        ):
            infos = await self.metadata.get_objects(stream_id, position, end, limit=16)
            if not infos or infos[0].ranges[0].start_offset > position:
                if not records:
                    await self._raise_if_lost(stream_id, position)
                break
            before = position
            try:
                for number, info in enumerate(infos):
                    if info.ranges[0].start_offset > position:
                        break  # a hole (a data-loss gap): the next round reports it
                    range_end = info.ranges[0].end_offset
                    if end is not None:
                        range_end = min(range_end, end)
                    if (
                        number + 1 < len(infos)
                        and window[0] > self.readahead_min_bytes
                        and (end is None or range_end < end)
                        and infos[number + 1].ranges[0].start_offset == range_end
                    ):
                        # A sequential scan will go on into the next object: start on its
                        # index and first window now.
                        self._prefetch_object(
                            infos[number + 1], stream_id, range_end, end, window[0]
                        )
                    # One object may take several read-ahead windows to consume.
                    while position < range_end and not self._full(
                        records, size, limit_records, limit_bytes
                    ):
                        progress = position
                        for block_records in await self._records_in(
                            info, stream_id, position, end, window
                        ):
                            position, size = _take(
                                block_records, records, position, end, size, limit_records,
                                limit_bytes,
                            )  # fmt: skip
                        if position == progress:
                            raise CorruptionError(
                                f"object {info.key} lacks offset {position} of stream {stream_id} "
                                "that metadata says it holds"
                            )
                    if (
                        self._full(records, size, limit_records, limit_bytes)
                        or position < range_end
                    ):
                        break
            except NotFound:
                # The object was compacted away between the metadata lookup and the GET.
                stale_retries += 1
                if stale_retries > _MAX_STALE_RETRIES:
                    raise
                continue
            if position == before:
                break
        if records:
            self._sequential[stream_id] = _Sequential(records[-1].offset + 1, window[0])
            self._hooks.emit(ReadServed(stream_id, len(records), size, "object"))
        return records

    async def _raise_if_lost(self, stream_id: int, position: int) -> None:
        """No object holds ``position``: if it lies in a recorded data-loss gap, say so."""
        for gap in await self.metadata.get_data_loss(stream_id, position, position + 1):
            raise DataLossError(
                f"stream {stream_id}: offsets [{gap.start_offset}, {gap.end_offset}) were "
                f"recorded as lost ({gap.reason}); read from {gap.end_offset} to continue",
                stream_id,
                gap.start_offset,
                gap.end_offset,
            )

    @staticmethod
    def _full(
        records: list[SequencedRecord], size: int, limit_records: int, limit_bytes: int
    ) -> bool:
        return len(records) >= limit_records or size >= limit_bytes

    def _window(self, stream_id: int, start: int) -> int:
        state = self._sequential.get(stream_id)
        if state is not None and state.next_offset == start:
            return state.window_bytes
        return self.readahead_min_bytes

    async def _records_in(
        self, info: ObjectInfo, stream_id: int, start: int, end: int | None, window: list[int]
    ) -> list[list[SequencedRecord]]:
        """Decoded blocks of ``stream_id`` from ``start``; fetches at most one read-ahead
        window beyond what is cached. ``window[0]`` doubles after each GET of a sequential scan."""
        pending = self._prefetches.get((stream_id, info.object_id, None))
        if pending is not None:
            # Its index is being read by the prefetch: wait for that instead of a second GET.
            await asyncio.wait({pending.task})
        index = await self.index(info)
        entries = index.blocks_for(stream_id, start, end)
        seed = index.block_crc_seed
        result: list[list[SequencedRecord]] = []
        position = 0
        while position < len(entries):
            entry = entries[position]
            cached = self.blocks.get((info.object_id, entry.position))
            if cached is not None:
                result.append(cached)
                position += 1
                continue
            # Fetch this block and, within the read-ahead window, the physically following
            # blocks of the same stream with one ranged GET.
            run = self._run_from(info, entries, position, window[0])
            run_bytes = sum(item.size for item in run)
            following = position + len(run)
            ahead: list[list[IndexEntry]] = []
            if window[0] > self.readahead_min_bytes and run_bytes >= window[0]:
                # A sequential scan: its next windows are fetched while this one is decoded
                # (with the sizes the scan will ask for: the window doubles after each GET).
                next_window = window[0]
                while following < len(entries) and len(ahead) < _PREFETCH_DEPTH:
                    next_window = min(self.readahead_max_bytes, next_window * 2)
                    ahead.append(self._run_from(info, entries, following, next_window))
                    following += len(ahead[-1])
            fetched = await self._fetch_run(info, run, seed, stream_id, ahead)
            for number, decoded in enumerate(fetched):
                if isinstance(decoded, CorruptionError):
                    if result or number > 0:
                        # Only read-ahead reached the bad block: serve what precedes it.
                        return result
                    raise await self._explain(info, index, decoded)
                result.append(decoded)
            position += len(run)
            fetched_window = window[0]
            window[0] = min(self.readahead_max_bytes, window[0] * 2)
            if run_bytes >= fetched_window:
                break
        return result

    def _run_from(
        self, info: ObjectInfo, entries: list[IndexEntry], position: int, window_bytes: int
    ) -> list[IndexEntry]:
        """``entries[position]`` and the physically adjacent, uncached entries after it, up to
        ``window_bytes`` (always at least the first)."""
        run = [entries[position]]
        run_bytes = run[0].size
        while (
            position + len(run) < len(entries)
            and run_bytes < window_bytes
            and entries[position + len(run)].position == run[-1].position + run[-1].size
            and (info.object_id, entries[position + len(run)].position) not in self.blocks
        ):
            run.append(entries[position + len(run)])
            run_bytes += run[-1].size
        return run

    def _start_prefetch(
        self,
        key: tuple[int, int, int | None],
        size: int,
        load: Callable[[], Coroutine[Any, Any, tuple[int, int, bytes] | None]],
    ) -> None:
        if key in self._prefetches:
            return
        budget = _PREFETCH_BUDGET_WINDOWS * self.readahead_max_bytes
        while self._prefetches and self.prefetch_bytes + size > budget:
            # The oldest first: a scan that stopped leaves its prefetches unclaimed.
            dropped = self._drop_prefetch(next(iter(self._prefetches)))
            assert dropped is not None
            dropped.task.cancel()
        task = asyncio.create_task(load())
        # Nobody may await a prefetch: its failure is only logged (the read fetches again).
        task.add_done_callback(_log_prefetch_failure)
        self._prefetches[key] = _Prefetch(key[2], size, task)
        self.prefetch_bytes += size

    def _drop_prefetch(self, key: tuple[int, int, int | None]) -> _Prefetch | None:
        pending = self._prefetches.pop(key, None)
        if pending is not None:
            self.prefetch_bytes -= pending.size
        return pending

    def _prefetch_run(self, info: ObjectInfo, stream_id: int, run: list[IndexEntry]) -> None:
        first, last = run[0].position, run[-1].position + run[-1].size

        async def load() -> tuple[int, int, bytes] | None:
            return first, last, await self.objects.get(info.key, first, last)

        self._start_prefetch((stream_id, info.object_id, first), last - first, load)

    def _prefetch_object(
        self, info: ObjectInfo, stream_id: int, start: int, end: int | None, window_bytes: int
    ) -> None:
        async def load() -> tuple[int, int, bytes] | None:
            index = await self.index(info)
            entries = index.blocks_for(stream_id, start, end)
            if not entries or (info.object_id, entries[0].position) in self.blocks:
                return None
            run = self._run_from(info, entries, 0, window_bytes)
            first, last = run[0].position, run[-1].position + run[-1].size
            return first, last, await self.objects.get(info.key, first, last)

        self._start_prefetch((stream_id, info.object_id, None), window_bytes, load)

    def _claim_prefetch(self, info: ObjectInfo, stream_id: int, first: int) -> _Prefetch | None:
        """Take the stream's prefetch of ``info``'s object if it may start at ``first``."""
        return self._drop_prefetch((stream_id, info.object_id, first)) or self._drop_prefetch(
            (stream_id, info.object_id, None)
        )

    async def _use_prefetch(
        self, pending: _Prefetch, info: ObjectInfo, first: int, last: int
    ) -> bytes | None:
        """The bytes ``[first, last)`` of ``info``'s object from ``pending``, or their start
        from it and the rest fetched here; ``None`` when it holds another range or failed (the
        caller fetches the range itself)."""
        # wait() neither raises the prefetch's error nor cancels it when this read is cancelled.
        await asyncio.wait({pending.task})
        if pending.task.cancelled() or pending.task.exception() is not None:
            return None
        loaded = pending.task.result()
        if loaded is None or loaded[0] != first or len(loaded[2]) != loaded[1] - first:
            return None  # another range, or a short read: fetched afresh, checked as usual
        if loaded[1] < last:
            # The window grew since the prefetch started: fetch only the rest.
            self.gets += 1
            return loaded[2] + await self.objects.get(info.key, loaded[1], last)
        return loaded[2][: last - first]

    async def _fetch_run(
        self,
        info: ObjectInfo,
        run: list[IndexEntry],
        seed: int,
        stream_id: int,
        ahead: list[list[IndexEntry]] | None = None,
    ) -> list[list[SequencedRecord] | CorruptionError]:
        """Fetch the adjacent blocks of ``run`` with one ranged GET (or take them from the
        stream's prefetch), and start prefetching ``ahead`` meanwhile. Each block is checked on
        its own: a good block is cached and returned decoded, a bad one is returned as its
        error (and not cached), so a bad block never fails its neighbours."""
        first, last = run[0].position, run[-1].position + run[-1].size
        self.gets += 1
        pending = self._claim_prefetch(info, stream_id, first)
        for following in ahead or ():
            self._prefetch_run(info, stream_id, following)
        data = None if pending is None else await self._use_prefetch(pending, info, first, last)
        if data is None:
            data = await self.objects.get(info.key, first, last)
        else:
            self.prefetched_gets += 1
        decoded_run: list[list[SequencedRecord] | CorruptionError] = []
        for entry in run:
            if entry.position + entry.size - first > len(data):
                decoded_run.append(
                    CorruptionError(
                        f"object {info.key}: short read of {len(data)} of {last - first} bytes "
                        f"at {first} misses the block at {entry.position} (truncated object?)"
                    )
                )
                continue
            block = data[entry.position - first : entry.position - first + entry.size]
            try:
                decoded = decode_block_records(block, entry, seed)
            except CorruptionError as exc:
                decoded_run.append(CorruptionError(f"object {info.key}: {exc}"))
                continue
            self.blocks.put((info.object_id, entry.position), decoded, entry.size)
            decoded_run.append(decoded)
        return decoded_run

    async def _explain(
        self, info: ObjectInfo, cached: ObjectIndex, error: CorruptionError
    ) -> CorruptionError:
        """The error to raise for a bad block: :class:`IdentityMismatch` when the object now has
        another identity (the file was replaced after its index was cached), else ``error``.
        A changed index is dropped from the cache so later reads parse it afresh. ``NotFound``
        (the object was compacted away meanwhile) propagates: the read looks the range up again."""
        self.gets += 1
        try:
            fresh = await read_index(
                self.objects,
                info.key,
                info.size,
                info.index_size,
                expected=await self._identity(info),
            )
        except IdentityMismatch as mismatch:
            self._indexes.discard_if(lambda key: key == info.object_id)
            return mismatch
        except CorruptionError:
            self._indexes.discard_if(lambda key: key == info.object_id)
            return error
        if fresh.entries != cached.entries or fresh.identity != cached.identity:
            self._indexes.discard_if(lambda key: key == info.object_id)
        return error

    async def _identity(self, info: ObjectInfo) -> ObjectIdentity:
        if self.deployment_id is None:
            self.deployment_id = await self.metadata.deployment_id()
        return ObjectIdentity(self.deployment_id, info.object_id)

    async def index(self, info: ObjectInfo) -> ObjectIndex:
        """The index of ``info``'s object, its footer checked against this deployment and the
        object id (cached once it parsed; a failed read caches nothing)."""
        index = self._indexes.get(info.object_id)
        if index is None:
            expected = await self._identity(info)
            self.gets += 1
            index = await read_index(
                self.objects, info.key, info.size, info.index_size, expected=expected
            )
            self._indexes.put(info.object_id, index, 1)
        return index

    def forget_objects(self, object_ids: set[int]) -> None:
        self.blocks.discard_if(lambda key: key[0] in object_ids)
        self._indexes.discard_if(lambda key: key in object_ids)


def _log_prefetch_failure(task: asyncio.Task[tuple[int, int, bytes] | None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.debug("read-ahead failed (the read fetches the range itself): %s", error)


async def read_index(
    store: ObjectStore,
    key: str,
    object_size: int | None = None,
    index_size: int | None = None,
    *,
    expected: ObjectIdentity | None = None,
) -> ObjectIndex:
    """Load the index of object ``key``.

    With ``index_size`` (from metadata) this is ONE suffix GET; without it, a GET of the footer
    then a GET of the index. ``object_size`` comes from ``head`` when not given. With
    ``expected`` the footer must name that identity (:class:`IdentityMismatch` otherwise); a key
    of the identity scheme (:func:`is_identity_key`) must hold a version-2 object.
    """
    require = expected is not None and is_identity_key(key)
    if object_size is None:
        object_size = (await store.head(key)).size
    if index_size is not None:
        if index_size < FOOTER_SIZE_V1:
            raise InvalidArgument(f"index_size {index_size} is smaller than a footer")
        tail = await store.get(key, -index_size)
        if index_size > object_size or len(tail) < index_size:
            # Foreign or truncated: name the identity if the footer is a readable foreign one.
            check_foreign_footer(tail, key, expected, require)
            raise CorruptionError(
                f"object {key!r} is {min(object_size, len(tail))} bytes, smaller than its index "
                f"of {index_size} bytes (truncated object?)"
            )
        return _parse_index_of(key, tail, object_size, expected, require)
    if object_size < FOOTER_SIZE_V1:
        raise CorruptionError(
            f"object {key!r} is {object_size} bytes, too small for a footer (truncated object?)"
        )
    footer_bytes = await store.get(key, -min(object_size, MAX_FOOTER_SIZE))
    try:
        footer = parse_footer_checked(footer_bytes, object_size, key, expected, require)
    except IdentityMismatch:
        raise
    except CorruptionError as exc:
        raise CorruptionError(f"object {key!r}: {exc}") from None
    footer_bytes = footer_bytes[len(footer_bytes) - footer.size :]
    index_bytes = await store.get(
        key, footer.index_position, footer.index_position + footer.index_length
    )
    return _parse_index_of(key, index_bytes + footer_bytes, object_size, expected, require)


def _parse_index_of(
    key: str,
    tail: bytes,
    object_size: int,
    expected: ObjectIdentity | None,
    require_identity: bool,
) -> ObjectIndex:
    try:
        return parse_index(
            tail, object_size, key=key, expected=expected, require_identity=require_identity
        )
    except IdentityMismatch:
        raise
    except CorruptionError as exc:
        raise CorruptionError(f"object {key!r}: {exc}") from None


def _take(
    block_records: list[SequencedRecord],
    records: list[SequencedRecord],
    position: int,
    end: int | None,
    size: int,
    limit_records: int,
    limit_bytes: int,
) -> tuple[int, int]:
    """Append to ``records`` the records of one decoded block from offset ``position`` on (a
    block's offsets are consecutive), before ``end``, while the limits allow (at least one
    record in all); returns the new position and size. One pass without calls per record:
    a read takes thousands of them per block."""
    if not block_records:
        return position, size
    first = block_records[0].offset
    start = position - first if position > first else 0
    stop = len(block_records) if end is None else max(0, min(len(block_records), end - first))
    append = records.append
    for index in range(start, stop):
        if records and (len(records) >= limit_records or size >= limit_bytes):
            break
        record = block_records[index]
        append(record)
        key = record.key
        size += 18 + len(record.value) + (len(key) if key is not None else 0)
        if record.headers:
            size += record_size(record) - 18 - len(record.value) - (len(key) if key else 0)
        position = record.offset + 1
    return position, size
