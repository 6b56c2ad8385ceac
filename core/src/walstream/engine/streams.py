"""A node's streams: the state every handle of a stream shares, the registry that creates, opens
and deletes them, and the gate every stream operation passes first.

The gate holds the node's lifecycle flags and its failure latch: the first fatal error (a fenced
node, a failed WAL append or upload) is kept, and from then on every write raises a typed error
that names it; reads of committed data go on working.

Memory per stream follows activity, not the number of streams (like s2-lite, which keeps a task
only per *active* stream): a stream untouched for :data:`IDLE_AFTER_S` with nothing in flight is
*parked*. Its :class:`LocalStream` (lock, events, metadata row) is dropped and, when this node
writes it, only a compact :class:`_Parked` record of its offsets and epoch is kept, so its next
append needs no metadata round trip; a stream this node only read keeps nothing. A handle that
still holds the dropped state keeps it alive (a weak map finds it again), and every use of a
handle brings its state back first, so one stream never has two states.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.clock import Clock
from walstream.engine.cache import LogCache
from walstream.errors import BackendUnavailable, FencedError, InvalidArgument, StreamNotFound
from walstream.metadata.contract import MetadataStore, StreamInfo, StreamState
from walstream.records import check_stream_name, check_stream_ref, check_text
from walstream.stream_config import StreamConfig

__all__ = ["IDLE_AFTER_S", "LocalStream", "NodeGate", "StreamRegistry"]

log = logging.getLogger("walstream.engine.client")

IDLE_AFTER_S = 60.0
"""A stream untouched for between this and twice this many seconds, with nothing in flight, is
parked (its per-stream state released)."""


@dataclass(eq=False, slots=True, weakref_slot=True)
class LocalStream:
    """This node's view of one stream, shared by all its :class:`walstream.Stream` handles."""

    info: StreamInfo
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
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
    queued: int = 0
    """Appends that began and wait for their turn under :attr:`lock` (to claim the stream, for
    room under the upload bound, or behind another waiting append). While any waits, a new
    append queues behind them instead of taking the lock-free path, so appends reach the WAL in
    the order they began."""
    _changed: asyncio.Event | None = field(default=None, repr=False)

    @property
    def changed(self) -> asyncio.Event:
        """The event the next :meth:`notify` sets (made when first asked for: most
        acknowledgements have nobody waiting)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def notify(self) -> None:
        """Wake everyone waiting on :attr:`changed` (a new event for the next waiters)."""
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    @property
    def idle(self) -> bool:
        """Nothing in flight, queued, locked or waited on: the state can be parked."""
        return (
            self.next_offset == self.acked_tail
            and not self.queued
            and self._changed is None
            and not self.lock.locked()
            and not self.deleted
        )


class _Parked:
    """What a parked stream this node writes keeps: enough to write it again at once."""

    __slots__ = ("epoch", "fencing_token", "info", "last_timestamp_ms", "next_offset", "start")

    def __init__(self, state: LocalStream) -> None:
        self.info = state.info
        self.epoch = state.epoch
        self.next_offset = state.next_offset
        self.start = state.start_offset
        self.last_timestamp_ms = state.last_timestamp_ms
        self.fencing_token = state.fencing_token

    def revive(self) -> LocalStream:
        return LocalStream(
            info=self.info,
            claimed=True,
            epoch=self.epoch,
            next_offset=self.next_offset,
            acked_tail=self.next_offset,
            start_offset=self.start,
            last_timestamp_ms=self.last_timestamp_ms,
            fencing_token=self.fencing_token,
        )


class NodeGate:
    """Started, not closed, not failed: what an operation of the node checks before it acts."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.started = False
        self.closed = False
        self.failure: BaseException | None = None
        """The first fatal error; once set, the node accepts no more writes."""
        self.lease_deadline: float | None = None
        """With a ``cluster:`` section: the monotonic time this node's own view of its lease
        ends (set by :class:`walstream.engine.cluster.ClusterMember`); None: no lease."""
        self.lease_clock: Clock | None = None

    def lease_lost(self) -> bool:
        """True (and the failure latched) once this node's view of its lease has run out: from
        then on it acknowledges nothing, before another node may claim its failover."""
        deadline = self.lease_deadline
        if deadline is None or self.lease_clock is None:
            return False
        if self.lease_clock.monotonic() < deadline:
            return False
        self.latch(
            FencedError(
                f"node {self.node_id} lost its lease: no renewal reached the metadata store "
                "in time, so it stopped acknowledging before another node could fail it over; "
                "restart it once the metadata store is reachable (it registers with a new epoch)"
            )
        )
        return True

    def vouches_for(self, state: LocalStream) -> bool:
        """True when this node writes ``state``'s stream and can prove its own view of the
        stream's tail is current: it claimed the stream and, running with a lease, its lease
        has not run out and it was not fenced. A node past its lease may have been failed over
        (its streams released and appended to elsewhere), so what it remembers of a stream it
        claimed may be older than an append another node acknowledged since."""
        if not state.claimed:
            return False
        if self.lease_deadline is None:
            return True  # no lease: nobody takes this node's streams while it runs
        return not self.lease_lost() and not isinstance(self.failure, FencedError)

    def check_tail_current(self, state: LocalStream) -> None:
        """Raise :class:`BackendUnavailable` when ``state`` is claimed here but this node cannot
        vouch for its tail (:meth:`vouches_for`): it must not answer a read or a tail from
        what it remembers, and metadata may lag what it acknowledged before its lease ran out
        (not uploaded yet), so it cannot answer from metadata either."""
        if state.claimed and not self.vouches_for(state):
            raise BackendUnavailable(
                f"node {self.node_id} lost its lease or was fenced, so it cannot prove that its "
                f"view of stream {state.info.stream_id} is current (another node may have taken "
                "the stream over and acknowledged appends since); retry: through another node, "
                "or here once this node has rejoined with a new epoch"
            )

    def latch(self, error: BaseException) -> None:
        """Record a fatal error (the first one wins) and stop accepting writes."""
        if self.failure is None:
            self.failure = error
            log.error("node %d stopped accepting writes: %s", self.node_id, error)

    def raise_if_failed(self) -> None:
        if self.lease_deadline is not None:
            self.lease_lost()
        if self.failure is not None:
            if isinstance(self.failure, FencedError):
                raise FencedError(f"node {self.node_id} was fenced: {self.failure}")
            raise BackendUnavailable(
                f"node {self.node_id} stopped accepting writes after a failure "
                f"({type(self.failure).__name__}: {self.failure}); restart the client so "
                "recovery can resolve what was written"
            )

    def check_open(self) -> None:
        if not self.started:
            raise InvalidArgument("start() the client first (or use walstream.open)")
        if self.closed:
            raise InvalidArgument("the client is closed")

    def check_writable(self, state: LocalStream) -> None:
        self.check_open()
        if state.deleted:
            raise StreamNotFound(f"stream {state.info.stream_id} was deleted")
        self.raise_if_failed()


class StreamRegistry:
    """The streams this node has handed out handles for, by stream id: active ones in full,
    idle ones parked (see the module docstring)."""

    def __init__(
        self,
        metadata: MetadataStore,
        cache: LogCache,
        gate: NodeGate,
        clock: Clock | None = None,
        idle_after_s: float = IDLE_AFTER_S,
    ) -> None:
        self._metadata = metadata
        self._cache = cache
        self._gate = gate
        self._clock = clock
        self._idle_after_s = idle_after_s
        self._streams: dict[int, LocalStream] = {}
        self._touched: set[int] = set()
        self._held: weakref.WeakValueDictionary[int, LocalStream] = weakref.WeakValueDictionary()
        """Parked states a handle still holds."""
        self._parked: dict[int, _Parked] = {}
        self._last_sweep = clock.monotonic() if clock is not None else 0.0
        self.on_park: list[Callable[[int], None]] = []
        """Called with each stream id parked (caches drop what they hold for it)."""

    @property
    def active_count(self) -> int:
        return len(self._streams)

    @property
    def parked_count(self) -> int:
        return len(self._parked)

    def touch(self, state: LocalStream) -> LocalStream:
        """``state`` is being used: make it active again if it was parked."""
        stream_id = state.info.stream_id
        if self._streams.get(stream_id) is not state and not state.deleted:
            self._streams[stream_id] = state
            self._parked.pop(stream_id, None)
            self._held.pop(stream_id, None)
        self._touched.add(stream_id)
        if self._clock is not None:
            self._maybe_sweep()
        return state

    def _maybe_sweep(self) -> None:
        assert self._clock is not None
        now = self._clock.monotonic()
        if now - self._last_sweep >= self._idle_after_s:
            self._last_sweep = now
            self.park_idle()

    def park_idle(self, *, all_idle: bool = False) -> int:
        """Park every idle stream not touched since the last sweep (``all_idle``: touched or
        not); how many were parked."""
        parked = 0
        for stream_id, state in list(self._streams.items()):
            if (stream_id in self._touched and not all_idle) or not state.idle:
                continue
            del self._streams[stream_id]
            if state.claimed:
                self._parked[stream_id] = _Parked(state)
            self._held[stream_id] = state
            for callback in self.on_park:
                callback(stream_id)
            parked += 1
        self._touched.clear()
        return parked

    def _known(self, stream_id: int) -> LocalStream | None:
        """The stream's state if this node has one, active, held by a handle, or parked."""
        state = self._streams.get(stream_id)
        if state is None:
            state = self._held.get(stream_id)
            if state is None:
                parked = self._parked.get(stream_id)
                if parked is None:
                    return None
                state = parked.revive()
            self.touch(state)
        return state

    async def create(
        self, name: str | None, config: StreamConfig, creation_token: str | None = None
    ) -> LocalStream:
        self._gate.check_open()
        check_stream_name(name)
        info = await self._metadata.create_stream(name, config, creation_token=creation_token)
        return self.track(info)

    async def reconfigure(self, state: LocalStream, changes: dict[str, Any]) -> StreamConfig:
        """Apply ``changes`` to the stream's stored config; this node's appends use the new
        config from the next one on. The cipher is fixed when the stream is created."""
        self._gate.check_open()
        if "cipher" in changes and changes["cipher"] != state.info.config.cipher:
            raise InvalidArgument(
                "a stream's cipher is fixed when it is created; create a new stream with the "
                "cipher and copy the records into it"
            )
        info = await self._metadata.reconfigure_stream(state.info.stream_id, changes)
        state.info = dataclasses.replace(state.info, config=info.config)
        return info.config

    async def open(self, name_or_id: str | int) -> LocalStream:
        self._gate.check_open()
        check_stream_ref(name_or_id)
        if isinstance(name_or_id, int):
            state = self._known(name_or_id)
            if state is not None and not state.deleted:
                return self.touch(state)
        info = await self._metadata.get_stream(name_or_id)
        return self.track(info)

    async def create_many(self, names: Sequence[str], config: StreamConfig) -> list[LocalStream]:
        self._gate.check_open()
        infos = await self._metadata.create_streams(names, config)
        return [self.track(info) for info in infos]

    async def list(
        self, prefix: str, start_after: str | int | None = None, limit: int | None = None
    ) -> list[StreamInfo]:
        self._gate.check_open()
        check_text(prefix, "prefix")
        return await self._metadata.list_streams(prefix, start_after, limit)

    async def delete(self, name_or_id: str | int) -> None:
        self._gate.check_open()
        check_stream_ref(name_or_id)
        info = await self._metadata.get_stream(name_or_id)
        await self._metadata.delete_stream(info.stream_id)
        state = self._known(info.stream_id)
        self._streams.pop(info.stream_id, None)
        self._parked.pop(info.stream_id, None)
        self._held.pop(info.stream_id, None)
        if state is not None:
            state.deleted = True
            state.notify()
        self._cache.drop_stream(info.stream_id)

    def track(self, info: StreamInfo) -> LocalStream:
        """The shared state of ``info``'s stream, created from metadata on first use."""
        state = self._known(info.stream_id)
        if state is None or state.deleted:
            state = LocalStream(
                info=info,
                next_offset=info.committed_end,
                acked_tail=info.committed_end,
                start_offset=info.start_offset,
                fencing_token=info.fencing_token,
            )
            self._streams[info.stream_id] = state
        return self.touch(state)

    def update_config(self, info: StreamInfo) -> None:
        """Take ``info``'s config (read from the metadata store) for a stream this node knows:
        a reconfigure made through another node reaches the owner's appends this way."""
        state = self._known(info.stream_id)
        if state is not None and state.info.config != info.config:
            state.info = dataclasses.replace(state.info, config=info.config)

    def adopt(self, infos: Sequence[StreamInfo]) -> None:
        """Streams this node claimed again at start (:func:`walstream.engine.claims.adopt_owned`):
        kept parked, ready to be written without another claim."""
        for info in infos:
            if self._known(info.stream_id) is not None:
                continue
            newest = self._cache.last_batch(info.stream_id)
            state = LocalStream(
                info=info,
                claimed=True,
                epoch=info.epoch,
                next_offset=info.committed_end,
                acked_tail=info.committed_end,
                start_offset=info.start_offset,
                last_timestamp_ms=0 if newest is None else newest.max_timestamp_ms,
                fencing_token=info.fencing_token,
            )
            self._parked[info.stream_id] = _Parked(state)

    def is_live(self, stream_id: int) -> bool:
        """False once this node deleted the stream (the uploader drops its batches)."""
        state = self._streams.get(stream_id)
        return state is None or not state.deleted

    def notify_all(self) -> None:
        for state in [*self._streams.values(), *self._held.values()]:
            state.notify()

    async def refresh_remote(self, state: LocalStream) -> None:
        """A stream this node does not write: its tail is what is committed in metadata."""
        if state.claimed:
            return
        info = (await self._metadata.get_streams([state.info.stream_id])).get(state.info.stream_id)
        if info is None or info.state is StreamState.DELETED:
            state.deleted = True
            return
        state.info = info
        state.acked_tail = max(state.acked_tail, info.committed_end)
        state.next_offset = max(state.next_offset, info.committed_end)
        state.start_offset = max(state.start_offset, info.start_offset)
