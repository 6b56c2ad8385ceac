"""The write path of a node (docs/architecture/write-path.md).

``append`` reserves offsets under the stream's lock, puts the encoded batch in the LogCache and
hands it to the WAL in the same step (so WAL order = cache order); the WAL acknowledges in order;
appends to one stream get their offsets in the order their calls began (an append that must wait
holds back every later one, see :meth:`StreamWriter.append`);
the acknowledgement makes the records readable and wakes tailing readers. The uploader moves
sealed cache blocks to object storage; when too much is not yet uploaded, appends wait for it
(backpressure) and give up with :class:`CapacityError` after ``append_timeout_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from walstream.clock import Clock
from walstream.engine.cache import LogBlock, LogCache
from walstream.engine.claims import ClaimBatcher
from walstream.engine.events import EngineHooks, NullHooks, WalAppended
from walstream.engine.streams import LocalStream, NodeGate
from walstream.engine.upload import Uploader
from walstream.errors import (
    BackendUnavailable,
    CapacityError,
    FencedError,
    InvalidArgument,
    OutOfRangeError,
    TailMismatchError,
)
from walstream.format.batch import encode_batch
from walstream.metadata.contract import MetadataStore, StreamInfo
from walstream.records import (
    AppendAck,
    Record,
)
from walstream.stream_config import StreamConfig, Timestamping
from walstream.wal.contract import WriteAheadLog
from walstream.wal.group_commit import GroupCommitWal, WalCallback

__all__ = ["StreamWriter"]


class _Submitted:
    """An append handed to the WAL: the caller awaits ``answer``."""

    __slots__ = ("answer", "end", "first_timestamp_ms", "last_timestamp_ms")

    def __init__(
        self,
        answer: asyncio.Future[None],
        end: int,
        first_timestamp_ms: int,
        last_timestamp_ms: int,
    ) -> None:
        self.answer = answer
        self.end = end
        self.first_timestamp_ms = first_timestamp_ms
        self.last_timestamp_ms = last_timestamp_ms


class _MustWait:
    """An append that must wait, under the stream's lock: for ``space_bytes`` of room under
    the bound of bytes not yet uploaded, or (0) for its appends in flight before it reports
    a tail mismatch."""

    __slots__ = ("space_bytes",)

    def __init__(self, space_bytes: int) -> None:
        self.space_bytes = space_bytes


_MUST_WAIT_FOR_TAIL = _MustWait(0)


class StreamWriter:
    """Appends, trims and fencing tokens of the streams this node writes.

    Built with the client; :meth:`attach` gives it the node epoch and the uploader once the node
    is registered (no stream handle exists before that)."""

    def __init__(
        self,
        *,
        wal: WriteAheadLog,
        metadata: MetadataStore,
        cache: LogCache,
        gate: NodeGate,
        hooks: EngineHooks,
        clock: Clock,
        append_timeout_s: float,
    ) -> None:
        self._wal = wal
        self._metadata = metadata
        self._claims = ClaimBatcher(metadata, gate.node_id, lambda: self._node_epoch)
        self._cache = cache
        self._gate = gate
        self._hooks = hooks
        self._report_appends = not isinstance(hooks, NullHooks)
        """Build a WalAppended event per acknowledgement only for hooks that listen."""
        self._clock = clock
        self._append_timeout_s = append_timeout_s
        self._node_epoch = -1
        self._uploader: Uploader | None = None
        self._unsettled = 0
        """Batches handed to the WAL whose outcome has not come back yet."""
        self._all_settled: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # A GroupCommitWal that keeps the base class's append() settles records through
        # callbacks (no future and no loop turn per record); a WAL with an append() of its own
        # (a wrapper, a subclass adding checks) is used through that append().
        self._append_then: Callable[[bytes, WalCallback], None] = (
            wal.append_then
            if isinstance(wal, GroupCommitWal) and type(wal).append is GroupCommitWal.append
            else self._append_through_future
        )
        self._unuploaded_limit = cache.max_bytes
        capacity = wal.capabilities.capacity_bytes
        if capacity:
            # WAL records take more room than their batches (headers, alignment): keep well below.
            self._unuploaded_limit = max(1, min(self._unuploaded_limit, capacity // 4))

    def attach(self, uploader: Uploader, node_epoch: int) -> None:
        """Start writing as ``node_epoch`` through ``uploader``."""
        self._uploader = uploader
        self._node_epoch = node_epoch
        self._loop = asyncio.get_running_loop()

    async def drain(self) -> None:
        """Wait until every WAL append in flight has settled (acknowledged or failed)."""
        if self._unsettled:
            if self._all_settled is None:
                self._all_settled = asyncio.Event()
            await self._all_settled.wait()

    def _append_through_future(self, data: bytes, callback: WalCallback) -> None:
        """:meth:`GroupCommitWal.append_then` for a WAL that offers only the contract's
        future: its outcome is handed to ``callback`` from the future's done callback."""
        future = self._wal.append(data)

        def settled(done: asyncio.Future[int]) -> None:
            if done.cancelled():
                callback(-1, BackendUnavailable("the WAL cancelled an append it had taken"))
            elif (error := done.exception()) is not None:
                callback(-1, error)
            else:
                callback(done.result(), None)

        future.add_done_callback(settled)

    async def _claim(self, state: LocalStream) -> None:
        if state.claimed:
            return
        async with state.lock:
            await self._claim_locked(state)

    async def _claim_locked(self, state: LocalStream) -> None:
        """Claim ``state``'s stream for this node, unless it is claimed already; the caller
        holds ``state.lock``."""
        if not state.claimed:
            info = await self._claims.claim(state.info.stream_id)
            state.info = info
            state.epoch = info.epoch
            state.next_offset = max(state.next_offset, info.committed_end)
            state.acked_tail = max(state.acked_tail, info.committed_end)
            state.start_offset = max(state.start_offset, info.start_offset)
            state.fencing_token = info.fencing_token
            newest = self._cache.last_batch(info.stream_id)
            if newest is not None:
                state.last_timestamp_ms = max(state.last_timestamp_ms, newest.max_timestamp_ms)
            elif info.committed_end > 0:
                # Everything is uploaded (a restart, a move, a failover): the newest committed
                # range carries the last timestamp, so timestamps go on from it.
                state.last_timestamp_ms = max(
                    state.last_timestamp_ms, await self._last_committed_timestamp(info)
                )
            state.claimed = True

    async def _last_committed_timestamp(self, info: StreamInfo) -> int:
        """The largest timestamp of the stream's committed records (0 when none is known: the
        objects holding them are gone, trimmed or expired)."""
        end = info.committed_end
        if end == 0:
            return 0
        found = await self._metadata.get_objects(info.stream_id, end - 1, end, limit=1)
        return max((r.max_timestamp_ms for o in found for r in o.ranges), default=0)

    async def append(
        self,
        state: LocalStream,
        records: list[Record],
        match_tail: int | None,
        fencing_token: str | None,
    ) -> AppendAck:
        """Append ``records`` (checked by the caller: :func:`walstream.records.check_append_input`)."""
        gate = self._gate
        gate.check_writable(state)
        started = self._clock.monotonic() if self._report_appends else 0.0
        lock = state.lock
        submitted: _Submitted | _MustWait | None = None
        if state.claimed and not state.queued and not lock.locked():
            # Nobody holds the stream or waits for it (no append waiting to claim it, for space,
            # for its tail or for its turn; no trim or release under way): an append that need
            # not wait reserves its offsets and reaches the WAL in this step of the event loop,
            # which nothing can interleave, so it needs no lock. One that must wait queues below.
            submitted = self._submit(state, records, match_tail, fencing_token, started)
        if type(submitted) is not _Submitted:
            # Queue up in the order the appends began: the count makes every later append queue
            # too (even in the moment between a release of the lock and the wake-up of its next
            # waiter, when the lock reads as free), and the lock hands itself over first come,
            # first served.
            must_claim = not state.claimed
            state.queued += 1
            try:
                async with lock:
                    if must_claim:
                        # Only an append that found the stream unclaimed claims it: one queued
                        # behind a release fails in _submit, as the release promises.
                        await self._claim_locked(state)
                    while True:
                        gate.check_writable(state)
                        submitted = self._submit(state, records, match_tail, fencing_token, started)
                        if type(submitted) is _Submitted:
                            break
                        assert type(submitted) is _MustWait
                        if submitted.space_bytes:
                            await self._wait_for_space(submitted.space_bytes)
                            continue
                        # Report a tail that reads agree with: let this stream's appends in
                        # flight settle.
                        await self._wait_acked(state)
                        raise TailMismatchError(
                            f"match_tail={match_tail} but the tail is {state.next_offset}",
                            state.next_offset,
                        )
            finally:
                state.queued -= 1
        assert type(submitted) is _Submitted
        await submitted.answer
        if gate.lease_deadline is not None:
            gate.raise_if_failed()  # the lease ran out while the WAL wrote: no acknowledgement
        end = submitted.end
        return AppendAck(
            end - len(records),
            end,
            max(state.acked_tail, end),
            submitted.first_timestamp_ms,
            submitted.last_timestamp_ms,
        )

    def _submit(
        self,
        state: LocalStream,
        records: list[Record],
        match_tail: int | None,
        fencing_token: str | None,
        started: float,
    ) -> _Submitted | _MustWait:
        """Reserve the batch's offsets, put it in the LogCache and hand it to the WAL, in one
        step (no await: WAL order = cache order = offset order); or say what it must wait for
        first. Raises what refuses the append."""
        if not state.claimed:
            raise FencedError(
                f"stream {state.info.stream_id} was moved off node {self._gate.node_id} while "
                "this append waited; retry through the stream's new owner"
            )
        if fencing_token is not None and fencing_token != state.fencing_token:
            raise FencedError(
                f"fencing token {fencing_token!r} does not match the stream's current token; "
                "another writer fenced this stream"
            )
        base = state.next_offset
        if match_tail is not None and match_tail != base:
            return _MUST_WAIT_FOR_TAIL
        timestamps, last = stamp(records, state.info.config, self._clock.now_ms(), state)
        count = len(records)
        stream_id = state.info.stream_id
        epoch = state.epoch
        data = encode_batch(stream_id, epoch, base, records, timestamps)
        size = len(data)
        limit = self._wal.capabilities.max_record_bytes
        if size > limit:
            if count == 1:
                raise CapacityError(
                    f"a single record of {size} bytes (encoded) exceeds the WAL's "
                    f"maximum record of {limit} bytes; store large values elsewhere and "
                    "append a reference, or use a WAL with a larger max_record_bytes"
                )
            raise CapacityError(
                f"batch of {count} records, {size} bytes, exceeds the WAL's "
                f"maximum record of {limit} bytes; append fewer records at once"
            )
        cache = self._cache
        unuploaded = cache.unuploaded_bytes
        if unuploaded and unuploaded + size > self._unuploaded_limit:
            return _MustWait(size)
        end = base + count
        # No await between the cache insert and the WAL submission: WAL order = cache order.
        block = cache.active  # add() puts the batch in the active block
        index = cache.add(stream_id, epoch, base, end, data, timestamps[0], last)
        # The caller waits on a future of its own: cancelling the caller (a timeout, a client
        # gone) must not cancel the WAL's record, whose outcome the write path needs whatever
        # the caller does (the WAL may already hold the batch).
        assert self._loop is not None  # attach() came first: nothing is claimed before it
        answer: asyncio.Future[None] = self._loop.create_future()
        try:
            self._append_then(
                data,
                lambda offset, error: self._on_wal_done(
                    state, block, index, end, count, started, answer, offset, error
                ),
            )
        except BaseException as refused:
            # The WAL refused the batch before taking it (it is fenced or failed): nothing
            # was written, and the node stops writing exactly as when the WAL fails a batch
            # later. The cached batch settles as failed, so no reader or upload waits on it
            # and the next append cannot reuse its offsets.
            block.fail(index)
            self._gate.latch(refused)
            raise
        self._unsettled += 1
        state.next_offset = end
        state.last_timestamp_ms = last
        assert self._uploader is not None
        self._uploader.notify_added()
        return _Submitted(answer, end, timestamps[0], last)

    async def _wait_acked(self, state: LocalStream) -> None:
        while state.acked_tail < state.next_offset:
            self._gate.raise_if_failed()
            await self._clock.wait(state.changed, 1.0)

    def _on_wal_done(
        self,
        state: LocalStream,
        block: LogBlock,
        index: int,
        end: int,
        count: int,
        started: float,
        answer: asyncio.Future[None],
        wal_offset: int,
        error: BaseException | None,
    ) -> None:
        # Runs in WAL order, once per batch (the WAL's callbacks come in append order).
        self._unsettled -= 1
        if not self._unsettled and self._all_settled is not None:
            self._all_settled.set()
            self._all_settled = None
        if self._gate.lease_deadline is not None and self._gate.lease_lost():
            # Past this node's lease another node may be replaying the WAL already: a batch the
            # WAL confirms now must not become readable or acknowledged here. The caller's
            # answer is then the node's failure (raise_if_failed after the wait).
            block.fail(index)
            if not answer.done():
                answer.set_result(None)
            return
        if error is not None:
            block.fail(index)
            self._gate.latch(error)
            if not answer.done():
                answer.set_exception(error)
            return
        block.settle(index, wal_offset)
        if end > state.acked_tail:
            state.acked_tail = end
        # Readers waiting at the tail first: they resume ahead of the appender and of what it
        # does next (the next append, the WAL's next write).
        state.notify()
        if not answer.done():
            answer.set_result(None)
        if self._report_appends:
            self._hooks.emit(
                WalAppended(
                    self._gate.node_id,
                    state.info.stream_id,
                    count,
                    len(block.data[index]),
                    self._clock.monotonic() - started,
                )
            )

    async def _wait_for_space(self, size: int) -> None:
        """Back-pressure: wait until the batch fits under the bound of bytes not yet uploaded."""
        cache = self._cache
        if cache.unuploaded_bytes + size <= self._unuploaded_limit or cache.unuploaded_bytes == 0:
            return
        assert self._uploader is not None
        deadline = self._clock.monotonic() + self._append_timeout_s
        while cache.unuploaded_bytes + size > self._unuploaded_limit and cache.unuploaded_bytes > 0:
            self._gate.raise_if_failed()
            self._uploader.request_upload()
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                raise CapacityError(
                    f"append waited {self._append_timeout_s:.1f}s for uploads to free "
                    f"space ({cache.unuploaded_bytes} bytes not yet uploaded); the object store "
                    "may be slow or down — retry later or raise cache.log_cache_bytes"
                )
            cache.space_freed.clear()
            await self._clock.wait(cache.space_freed, min(remaining, 1.0))

    async def trim(self, state: LocalStream, new_start: int) -> None:
        self._gate.check_writable(state)
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
            info = await self._metadata.trim_stream(state.info.stream_id, state.epoch, new_start)
            state.info = info
            state.start_offset = info.start_offset
            if info.config.delete_on_empty_min_age_s:
                # Perhaps empty now: delete-on-empty starts counting (engine/retention.py).
                await self._metadata.set_lifecycle_due(
                    info.stream_id, self._clock.now_ms(), if_due_ms=info.lifecycle_due_ms
                )

    async def set_fencing_token(self, state: LocalStream, token: str | None) -> None:
        self._gate.check_writable(state)
        await self._claim(state)
        async with state.lock:
            await self._metadata.set_fencing_token(state.info.stream_id, state.epoch, token)
            state.fencing_token = token

    async def release(
        self, state: LocalStream, handoff: Callable[[], Awaitable[None]] | None
    ) -> bool:
        """Stop writing ``state``'s stream here: with its appends held, upload and commit
        everything acknowledged, release it in metadata, then run ``handoff`` (the new owner
        claims it) before appends waiting here fail with :class:`FencedError`. False when this
        node was not writing the stream."""
        if not state.claimed:
            return False
        async with state.lock:
            if not state.claimed:
                return False
            await self._wait_acked(state)
            assert self._uploader is not None
            await self._uploader.flush()
            self._gate.raise_if_failed()
            info = await self._metadata.release_stream(
                state.info.stream_id, self._gate.node_id, self._node_epoch
            )
            state.claimed = False
            state.info = info
            if handoff is not None:
                await handoff()
        return True


def stamp(
    records: list[Record], config: StreamConfig, now_ms: int, state: LocalStream
) -> tuple[list[int], int]:
    """The timestamps of ``records`` under the stream's timestamping mode, and the last one.

    ``client-prefer``: the record's timestamp when it has one, capped at ``now_ms`` (the
    arrival time) unless ``uncapped``, else ``now_ms``; ``client-require``: the same, and a
    record without one refuses the whole append (:class:`InvalidArgument`); ``arrival``:
    ``now_ms``. Then never below the stream's last timestamp: timestamps do not go backwards
    within a stream."""
    mode = config.timestamping
    uncapped = config.uncapped
    last = state.last_timestamp_ms
    timestamps: list[int] = []
    for index, record in enumerate(records):
        given = record.timestamp_ms
        if given is None or mode is Timestamping.ARRIVAL:
            if given is None and mode is Timestamping.CLIENT_REQUIRE:
                raise InvalidArgument(
                    f"records[{index}] has no timestamp, and stream {state.info.stream_id} "
                    "requires one (timestamping client-require); give every record a "
                    "timestamp_ms, or reconfigure the stream's timestamping"
                )
            timestamp = now_ms
        else:
            timestamp = given if uncapped or given < now_ms else now_ms
        if timestamp > last:
            last = timestamp  # timestamps never go backwards within a stream
        timestamps.append(last)
    return timestamps, last
