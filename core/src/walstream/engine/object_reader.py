"""Reading committed stream data straight from object storage (docs/architecture/read-path.md).

Used by the node's read path below its LogCache, and by readers that run no node at all (Spark
executors, ``walstream read`` on a stopped deployment): metadata says which objects hold a range,
one suffix GET reads an object's index, one ranged GET reads its blocks.

Identity: every index read checks that the footer names this deployment and the object id
metadata gave (:class:`IdentityMismatch` otherwise), and the data-block CRCs of a version-2 object
are seeded with that identity, so a block read from a replaced file fails its check too.

Pipelining: a sequential scan keeps what it reads next in flight, up to ``readahead_depth x
readahead_max_bytes`` for all streams together (:mod:`walstream.engine.readahead`), so a
catch-up read overlaps the store's latency instead of paying it once per window. A prefetched
range is checked exactly like a range fetched on demand, and a prefetch that failed is simply
fetched again on demand, so errors surface on the read that needs the data, as without
prefetching.

Failure isolation: a block that fails its check fails only the reads whose records (within their
limits) lie in it. Nothing is cached for it (the block cache holds decoded good blocks only; an
index is cached only once it parsed), read-ahead never turns a bad following block into an error
of a read that ends before it, and the next read that reaches the bad block fetches it again.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from walstream.config.engine import CacheConfig
from walstream.engine.cache import BlockCache
from walstream.engine.events import EngineHooks, NullHooks, ReadServed
from walstream.engine.readahead import Checked, ReadAhead, check_run, run_from
from walstream.errors import (
    CorruptionError,
    DataLossError,
    IdentityMismatch,
    InvalidArgument,
    NotFound,
)
from walstream.format.batch import record_size
from walstream.format.object import (
    DEFAULT_INDEX_PAGE_ENTRIES,
    FOOTER_SIZE,
    FOOTER_SIZE_V1,
    FORMAT_VERSION,
    INDEX_ENTRY_SIZE,
    MAX_FOOTER_SIZE,
    TOP_ENTRY_SIZE,
    IndexEntry,
    ObjectIdentity,
    ObjectIndex,
    check_foreign_footer,
    parse_footer_checked,
    parse_index,
    parse_index_pages,
    parse_index_top,
)
from walstream.format.object_keys import is_identity_key
from walstream.metadata.contract import MetadataStore, ObjectInfo
from walstream.objects.contract import ObjectStore
from walstream.records import SequencedRecord

__all__ = ["WHOLE_INDEX_BYTES", "ObjectReader", "read_index"]

log = logging.getLogger(__name__)

_INDEX_CACHE_ENTRIES = 4096
WHOLE_INDEX_BYTES = 16 << 10
"""An index of at most this many bytes (index, top index and footer) is read whole with one
suffix GET; a larger version-3 index is read in part (its top index, then the pages a stream
needs)."""
_MAX_STALE_RETRIES = 3


@dataclass
class _Sequential:
    next_offset: int
    window_bytes: int


class ObjectReader:
    """Reads a stream's committed records through a bounded BlockCache with read-ahead.

    Read-ahead: a reader that keeps reading where it stopped (or says it will: ``sequential``)
    gets a window that doubles from ``readahead_min_bytes`` to ``readahead_max_bytes``; the
    window's following blocks of the same object are fetched with the same ranged GET, and up
    to ``readahead_depth x readahead_max_bytes`` of the next windows (of this object and the
    following ones) are fetched meanwhile (``readahead_depth=0``: none).

    ``deployment_id`` is the deployment whose objects this reader accepts; when not given it is
    loaded once from ``metadata``.
    """

    def __init__(
        self,
        objects: ObjectStore,
        metadata: MetadataStore,
        block_cache_bytes: int = CacheConfig.block_cache_bytes,
        readahead_min_bytes: int = CacheConfig.readahead_min_bytes,
        readahead_max_bytes: int = CacheConfig.readahead_max_bytes,
        hooks: EngineHooks | None = None,
        deployment_id: bytes | None = None,
        readahead_depth: int = CacheConfig.readahead_depth,
    ) -> None:
        if readahead_depth < 0:
            raise InvalidArgument(f"readahead_depth must be >= 0, got {readahead_depth}")
        self.objects = objects
        self.deployment_id = deployment_id
        self.metadata = metadata
        self.blocks: BlockCache[tuple[int, int], list[SequencedRecord]] = BlockCache(
            block_cache_bytes
        )
        self._indexes: BlockCache[int, ObjectIndex] = BlockCache(_INDEX_CACHE_ENTRIES)
        self.readahead_min_bytes = readahead_min_bytes
        self.readahead_max_bytes = readahead_max_bytes
        self.readahead_depth = readahead_depth
        self._sequential: dict[int, _Sequential] = {}
        self._hooks: EngineHooks = hooks or NullHooks()
        self._ahead = ReadAhead(
            objects,
            self.blocks,
            self._indexes,
            _weakly(self.index),
            readahead_max_bytes,
            readahead_depth,
        )
        self.gets = 0
        self.prefetched_gets = 0
        """GETs whose bytes a read used from a prefetch (included in ``gets``)."""

    @property
    def readahead_budget_bytes(self) -> int:
        """Most bytes of read-ahead ranges held, all streams together."""
        return self._ahead.budget_bytes

    @property
    def prefetch_bytes(self) -> int:
        """Bytes of the read-ahead ranges held (in flight or fetched, not yet read)."""
        return self._ahead.prefetch_bytes

    @property
    def most_prefetch_bytes(self) -> int:
        """The largest ``prefetch_bytes`` seen."""
        return self._ahead.most_prefetch_bytes

    def forget_stream(self, stream_id: int) -> None:
        """The stream went idle: drop its scan position and read-ahead (a later read starts a
        new scan)."""
        self._sequential.pop(stream_id, None)
        self.release(stream_id)

    def release(self, stream_id: int) -> None:
        """Drop (and cancel) what was read ahead for ``stream_id``: its scan will not read it."""
        self._ahead.release(stream_id)

    async def read(
        self,
        stream_id: int,
        start: int,
        end: int | None,
        limit_records: int,
        limit_bytes: int,
        *,
        sequential: bool = False,
    ) -> list[SequencedRecord]:
        """Committed records of ``stream_id`` in ``[start, end)``, at most the limits (at least
        one record when any exists). Stops early at the end of committed data, and before a
        recorded data-loss gap; a read that starts inside one raises :class:`DataLossError`.
        Raises :class:`CorruptionError` (or :class:`IdentityMismatch`) when a record within the
        limits lies in a block that fails its check; a read that ends before that block succeeds.

        ``sequential``: the caller goes on reading where this read stops (a catch-up scan), so
        read-ahead starts with this read's first GET instead of with the stream's next read."""
        records: list[SequencedRecord] = []
        size = 0
        position = start
        state = self._sequential.get(stream_id)
        if state is not None and state.next_offset == start:
            window = [state.window_bytes]
            sequential = True
        else:
            # A new scan position: what was read ahead for the stream will not be read.
            self.release(stream_id)
            # A scan the caller says is sequential needs no ramp to find out.
            window = [self.readahead_max_bytes if sequential else self.readahead_min_bytes]
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
                    # One object may take several read-ahead windows to consume.
                    while position < range_end and not self._full(
                        records, size, limit_records, limit_bytes
                    ):
                        progress = position
                        for block_records in await self._records_in(
                            infos[number:], stream_id, position, end, window, sequential
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

    async def _records_in(
        self,
        infos: list[ObjectInfo],
        stream_id: int,
        start: int,
        end: int | None,
        window: list[int],
        sequential: bool,
    ) -> list[list[SequencedRecord]]:
        """Decoded blocks of ``stream_id`` in ``infos[0]`` from ``start``; fetches at most one
        read-ahead window (or one prefetched range) beyond what is cached. ``window[0]`` doubles
        after each GET. A sequential scan keeps its next GETs in flight meanwhile, on into the
        objects ``infos[1:]`` that follow."""
        info = infos[0]
        known = self._indexes.get(info.object_id)
        if sequential and (known is None or not known.covers(stream_id)):
            # The scan starts with this object: its index and first window at once, and the
            # indexes of the objects after it.
            self._ahead.plan_start(infos, stream_id, start, end, window[0])
        loading = self._ahead.index_load(info.object_id)
        if loading is not None:
            # Its index is being read ahead: wait for that instead of a second GET (a failure
            # leaves nothing cached, and the index is read here again).
            await asyncio.wait({loading})
        index = await self.index(info, stream_id)
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
            pending = self._ahead.claim(stream_id, info.object_id, entry)
            if pending is not None:
                # The blocks of the prefetched range from this one on (it starts before this
                # block when the blocks before it were cached meanwhile).
                run = [entry]
                while position + len(run) < len(entries) and pending.holds(
                    entries[position + len(run)]
                ):
                    run.append(entries[position + len(run)])
            else:
                run = run_from(self.blocks, info, entries, position, window[0])
            run_bytes = run[-1].position + run[-1].size - run[0].position
            if sequential or window[0] > self.readahead_min_bytes:
                self._ahead.plan_from(
                    infos,
                    stream_id,
                    entries,
                    position + len(run),
                    end,
                    window[0],
                    seed,
                )
            fetched = await self._fetch_run(
                info,
                run,
                seed,
                None if pending is None else await self._ahead.checked(pending, run),
            )
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
            if pending is not None or run_bytes >= fetched_window:
                break  # one window (or prefetched range) beyond what was cached
        return result

    async def _fetch_run(
        self,
        info: ObjectInfo,
        run: list[IndexEntry],
        seed: int,
        prefetched: list[Checked] | None = None,
    ) -> list[Checked]:
        """The blocks of ``run`` checked: fetched with one ranged GET, or ``prefetched`` (what
        the claimed read-ahead of these blocks checked). A good block is cached and returned
        decoded, a bad one is returned as its error (and not cached), so a bad block never
        fails its neighbours."""
        self.gets += 1
        if prefetched is None:
            first, last = run[0].position, run[-1].position + run[-1].size
            checked = check_run(
                info, run, seed, await self.objects.get(info.key, first, last), first
            )
        else:
            self.prefetched_gets += 1
            checked = prefetched
        for entry, decoded in zip(run, checked, strict=True):
            if not isinstance(decoded, CorruptionError):
                self.blocks.put((info.object_id, entry.position), decoded, entry.size)
        return checked

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
        if not set(cached.entries) <= set(fresh.entries) or fresh.identity != cached.identity:
            self._indexes.discard_if(lambda key: key == info.object_id)
        return error

    async def _identity(self, info: ObjectInfo) -> ObjectIdentity:
        if self.deployment_id is None:
            self.deployment_id = await self.metadata.deployment_id()
        return ObjectIdentity(self.deployment_id, info.object_id)

    async def index(self, info: ObjectInfo, stream_id: int | None = None) -> ObjectIndex:
        """The index of ``info``'s object, its footer checked against this deployment and the
        object id (cached once it parsed; a failed read caches nothing).

        With ``stream_id``, a large version-3 index is read only in part: the footer and top
        index, then the pages that can hold the stream (:meth:`ObjectIndex.covers` tells which
        streams a partial index answers for; later streams add their pages to it). A small
        index (at most :data:`WHOLE_INDEX_BYTES`) and any index of an earlier version is read
        whole with one suffix GET, as before."""
        index = self._indexes.get(info.object_id)
        if index is not None and (stream_id is None or index.covers(stream_id)):
            if stream_id is None and index.partial:
                index = None  # a caller that needs every entry: read it whole
            else:
                return index
        expected = await self._identity(info)
        if index is None:
            if stream_id is None or info.index_size <= WHOLE_INDEX_BYTES:
                self.gets += 1
                index = await read_index(
                    self.objects, info.key, info.size, info.index_size, expected=expected
                )
                self._indexes.put(info.object_id, index, 1)
                return index
            index = await self._read_top(info, expected)
            if index.top is None:
                self._indexes.put(info.object_id, index, 1)
                return index
        assert stream_id is not None and index.top is not None
        pages = index.top.pages_for(stream_id)
        missing = [number for number in pages if number not in index.loaded_pages]
        if missing:
            wanted = range(missing[0], missing[-1] + 1)
            first, last = index.top.byte_range(wanted)
            self.gets += 1
            data = await self.objects.get(info.key, first, last)
            try:
                index.add_pages(parse_index_pages(index.top, wanted, data, first))
            except CorruptionError as exc:
                raise CorruptionError(f"object {info.key!r}: {exc}") from None
        self._indexes.put(info.object_id, index, 1)
        return index

    async def _read_top(self, info: ObjectInfo, expected: ObjectIdentity) -> ObjectIndex:
        """A partial index of a version-3 object (footer and top index, no pages yet) with one
        suffix GET sized for the top index of an object of this ``index_size`` (two if the
        guess was short), or the whole index of an object of an earlier version."""
        entries = info.index_size // INDEX_ENTRY_SIZE  # at most this many: sizes the guess
        guess = min(
            info.index_size,
            FOOTER_SIZE + (entries // DEFAULT_INDEX_PAGE_ENTRIES + 2) * TOP_ENTRY_SIZE + 512,
        )
        self.gets += 1
        tail = await self.objects.get(info.key, -guess)
        require = is_identity_key(info.key)
        try:
            footer = parse_footer_checked(tail, info.size, info.key, expected, require)
            if footer.version != FORMAT_VERSION:
                rest = info.index_size - len(tail)
                if rest > 0:
                    self.gets += 1
                    tail = (
                        await self.objects.get(
                            info.key, info.size - info.index_size, info.size - len(tail)
                        )
                        + tail
                    )
                return parse_index(
                    tail, info.size, key=info.key, expected=expected, require_identity=require
                )
            needed = footer.top_length + footer.size
            if len(tail) < needed:
                self.gets += 1
                tail = (
                    await self.objects.get(info.key, info.size - needed, info.size - len(tail))
                    + tail
                )
            top = parse_index_top(
                tail, info.size, key=info.key, expected=expected, require_identity=require
            )
        except IdentityMismatch:
            raise
        except CorruptionError as exc:
            raise CorruptionError(f"object {info.key!r}: {exc}") from None
        if footer.tail_size != info.index_size:
            raise CorruptionError(
                f"object {info.key!r}: its index takes {footer.tail_size} bytes, metadata says "
                f"{info.index_size}"
            )
        return ObjectIndex(
            [], info.size, footer.index_position, footer.version, footer.identity, top
        )

    def forget_objects(self, object_ids: set[int]) -> None:
        self.blocks.discard_if(lambda key: key[0] in object_ids)
        self._indexes.discard_if(lambda key: key in object_ids)
        self._ahead.forget(object_ids)


def _weakly(
    method: Callable[[ObjectInfo, int], Awaitable[ObjectIndex]],
) -> Callable[[ObjectInfo, int], Awaitable[ObjectIndex]]:
    """``method``, called without holding its object: the read-ahead a reader owns would
    otherwise hold the reader in a reference cycle, and with it the reader's block cache (a
    scan's decoded records, tens of thousands of tracked objects), until a full collection of
    the cyclic garbage collector — which, in a Spark worker, runs after every task."""
    weak = weakref.WeakMethod(method)

    def call(info: ObjectInfo, stream_id: int) -> Awaitable[ObjectIndex]:
        bound = weak()
        if bound is None:
            raise RuntimeError("the ObjectReader of this read-ahead is gone")
        return bound(info, stream_id)

    return call


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
    index_bytes = await store.get(key, footer.index_position, object_size - footer.size)
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
