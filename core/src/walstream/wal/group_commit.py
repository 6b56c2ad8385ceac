"""GroupCommitWal: the shared group-commit machinery every WAL plugin builds on.

A plugin implements a handful of medium-specific primitives (``_open``, ``_prepare_group``,
``_write_group``, ``_recover``, ``_trim``, ``_reset``, ``_close``); grouping of concurrent appends,
the sliding window of in-flight writes, in-order acknowledgement and error translation live here,
once.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from walstream.clock import Clock, SystemClock
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    FencedError,
    InvalidArgument,
    WalstreamError,
)
from walstream.wal._waits import wait_for
from walstream.wal.contract import WalCapabilities, WalMode, WalOffset, WalRecord, WriteAheadLog

__all__ = [
    "GroupCommitWal",
    "PreparedGroup",
    "WalCallback",
]

WalCallback = Callable[[WalOffset, "BaseException | None"], None]
"""Told the outcome of one record appended with :meth:`GroupCommitWal.append_then`:
``(offset, None)`` once it is durable, or ``(-1, error)`` once it failed."""


log = logging.getLogger(__name__)


@dataclass
class PreparedGroup:
    """A group of records with offsets assigned, ready for ``_write_group``."""

    offsets: list[WalOffset]
    payloads: list[bytes]
    state: Any = None
    """Whatever the plugin needs to write the group (buffer, position, object key, ...)."""


@dataclass
class _Group:
    prepared: PreparedGroup
    waiters: list[asyncio.Future[WalOffset] | WalCallback]
    done: bool = False


class GroupCommitWal(WriteAheadLog):
    """Group commit with a sliding window of in-flight writes, acknowledged in order.

    Grouping policy: when no write is in flight, pending records are written at once (an idle
    appender never waits for company). While writes are in flight, records accumulate until a
    window slot is free and either ``max_group_bytes`` is reached or the oldest pending record
    has waited ``max_group_delay_s``.

    Subclasses implement:

    - ``_open(node_id, node_epoch, mode)``: open the medium; in FAILOVER mode, fence first.
    - ``_prepare_group(payloads) -> PreparedGroup``: synchronous; assigns offsets in order.
      Raise :class:`CapacityError` when the records do not fit until a trim frees space.
    - ``async _write_group(group)``: make the group durable; groups may be written concurrently
      (up to ``max_inflight``); re-check the fence before returning; raise a walstream error.
    - optionally ``_start_write(group)``: synchronous, called right after ``_prepare_group``
      (in group order) and before ``_write_group`` runs in its own task: a medium can issue the
      group's I/O here, a turn of the event loop earlier. It must not raise: a failure belongs
      to ``_write_group``, which reports it.
    - ``_recover() -> AsyncIterator[WalRecord]``: the records after the trim point.
    - ``async _trim(offset)``, ``async _reset()``, ``async _close()``.
    """

    def __init__(
        self,
        *,
        capabilities: WalCapabilities,
        max_group_bytes: int = 1 << 20,
        max_group_delay_s: float = 0.002,
        max_inflight: int = 4,
        capacity_wait_s: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        self.capabilities = capabilities
        self.max_group_bytes = max_group_bytes
        self.max_group_delay_s = max_group_delay_s
        self.max_inflight = max(1, max_inflight)
        self.capacity_wait_s = capacity_wait_s
        self.clock: Clock = clock or SystemClock()
        self.node_id = -1
        self.node_epoch = -1
        self.mode: WalMode | None = None
        self._pending: deque[tuple[bytes, asyncio.Future[WalOffset] | WalCallback]] = deque()
        self._write_tasks: set[asyncio.Task[None]] = set()
        self._pending_bytes = 0
        self._pending_since = 0.0
        self._inflight: deque[_Group] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the WAL was started on; ``append`` makes its futures there without asking
        for the running loop (which costs a system call per call on CPython 3.11)."""
        self._wake: asyncio.Event | None = None
        self._trimmed_event: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._failure: WalstreamError | None = None
        self._writable = False
        self._closed = False

    # -- the contract ---------------------------------------------------------------------------

    async def start(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        if self.mode is not None:
            raise InvalidArgument("WAL already started")
        self.node_id, self.node_epoch, self.mode = node_id, node_epoch, mode
        await self._open(node_id, node_epoch, mode)
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._trimmed_event = asyncio.Event()
        if mode is WalMode.READ_WRITE:
            self._flusher = asyncio.create_task(self._flush_loop(), name=f"wal-flush-{node_id}")

    def append(self, data: bytes) -> asyncio.Future[WalOffset]:
        if self._loop is None:
            self._refuse_append()  # not started
        assert self._loop is not None
        future: asyncio.Future[WalOffset] = self._loop.create_future()
        self._enqueue(data, future)
        return future

    def append_then(self, data: bytes, callback: WalCallback) -> None:
        """:meth:`append` without a future: ``callback(offset, None)`` is called once the
        record is durable, ``callback(-1, error)`` once it failed — exactly once, in append
        order, synchronously in the step of the event loop that settles the record's group (no
        loop turn per record, as a future's done callback takes). It must be cheap and must not
        raise (an exception is logged and ignored). Raises as :meth:`append` does when the
        record is refused before it is taken; the callback is then never called."""
        self._enqueue(data, callback)

    def _enqueue(self, data: bytes, waiter: asyncio.Future[WalOffset] | WalCallback) -> None:
        if not self._writable or self._failure is not None or self._closed:
            self._refuse_append()
        size = len(data)
        if size > self.capabilities.max_record_bytes:
            raise CapacityError(
                f"record of {size} bytes exceeds this WAL's maximum of "
                f"{self.capabilities.max_record_bytes} bytes; split the batch"
            )
        pending = self._pending
        if not pending:
            self._pending_since = self.clock.monotonic()
        pending.append((data if type(data) is bytes else bytes(data), waiter))
        self._pending_bytes += size
        assert self._wake is not None
        self._wake.set()

    def _refuse_append(self) -> None:
        """Raise why :meth:`append` cannot take a record now (it checks only that it can)."""
        self._check_can_write("append")
        if not self._writable:
            raise InvalidArgument("call recover() (to the end) or reset() before append()")
        if isinstance(self._failure, FencedError):
            raise FencedError(f"this WAL writer was fenced: {self._failure}")
        if self._failure is not None:
            raise BackendUnavailable(
                f"the WAL refused appends after an earlier failure ({self._failure}); "
                "restart the node so recovery can resolve what was written"
            )

    async def recover(self) -> AsyncIterator[WalRecord]:  # type: ignore[override]
        if self.mode is None:
            raise InvalidArgument("start() the WAL before recover()")
        async for record in self._recover():
            yield record
        if self.mode is WalMode.READ_WRITE:
            self._writable = True

    async def trim(self, offset: WalOffset) -> None:
        self._check_can_write("trim")
        await self._trim(offset)
        if self._trimmed_event is not None:
            self._trimmed_event.set()

    async def reset(self) -> None:
        self._check_can_write("reset")
        if self._pending or self._inflight:
            raise InvalidArgument("reset() with appends in flight")
        await self._reset()
        if self.mode is WalMode.READ_WRITE:
            self._writable = True
        if self._trimmed_event is not None:
            self._trimmed_event.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None:
            assert self._wake is not None
            self._wake.set()
            try:
                await self._flusher
            finally:
                self._flusher = None
        await self._close()

    # -- primitives for subclasses ------------------------------------------------------------------

    @abstractmethod
    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None: ...

    @abstractmethod
    def _prepare_group(self, payloads: Sequence[bytes]) -> PreparedGroup: ...

    @abstractmethod
    async def _write_group(self, group: PreparedGroup) -> None: ...

    def _start_write(self, group: PreparedGroup) -> None:
        """Issue the group's I/O now (see the class docstring); by default nothing."""
        return None

    @abstractmethod
    def _recover(self) -> AsyncIterator[WalRecord]: ...

    @abstractmethod
    async def _trim(self, offset: WalOffset) -> None: ...

    @abstractmethod
    async def _reset(self) -> None: ...

    @abstractmethod
    async def _close(self) -> None: ...

    # -- machinery ------------------------------------------------------------------------------------

    def acknowledged_below(self, default: WalOffset) -> WalOffset:
        """Every record at an offset below the returned one is durable and acknowledged now: the
        first offset of the oldest group still in flight, or ``default`` (the first offset of the
        group being formed) when none is. A medium writes it into each group, so that recovery
        can tell damage below it from a torn tail (invariant 11)."""
        return self._inflight[0].prepared.offsets[0] if self._inflight else default

    @property
    def failed(self) -> WalstreamError | None:
        """The failure that stopped appends, if any."""
        return self._failure

    def _check_can_write(self, operation: str) -> None:
        if self._closed:
            raise InvalidArgument(f"{operation}() on a closed WAL")
        if self.mode is None:
            raise InvalidArgument(f"start() the WAL before {operation}()")
        if self.mode is WalMode.READ_ONLY:
            raise InvalidArgument(f"{operation}() on a WAL opened READ_ONLY")
        if self.mode is WalMode.FAILOVER and operation == "append":
            raise InvalidArgument("append() on a WAL opened for FAILOVER; it only recovers")

    async def _flush_loop(self) -> None:
        changed = self._wake
        assert changed is not None
        while True:
            changed.clear()
            if not self._pending:
                if self._closed and not self._inflight:
                    return
                await changed.wait()
                continue
            if len(self._inflight) >= self.max_inflight:
                await changed.wait()
                continue
            if self._inflight and not self._closed and self._pending_bytes < self.max_group_bytes:
                remaining = self.max_group_delay_s - (self.clock.monotonic() - self._pending_since)
                if remaining > 0:
                    try:
                        await wait_for(self.clock, changed.wait(), remaining)
                    except TimeoutError:
                        pass
                    if self.clock.monotonic() - self._pending_since < self.max_group_delay_s:
                        continue
            await self._seal_and_write()

    def _take_pending(self) -> list[tuple[bytes, asyncio.Future[WalOffset] | WalCallback]]:
        taken: list[tuple[bytes, asyncio.Future[WalOffset] | WalCallback]] = []
        size = 0
        while self._pending and (
            not taken or size + len(self._pending[0][0]) <= self.max_group_bytes
        ):
            item = self._pending.popleft()
            taken.append(item)
            size += len(item[0])
        self._pending_bytes -= size
        self._pending_since = self.clock.monotonic()
        return taken

    async def _seal_and_write(self) -> None:
        items = self._take_pending()
        payloads = [data for data, _ in items]
        waiters = [waiter for _, waiter in items]
        if self._failure is not None:
            self._fail_waiters(waiters, self._failure)
            return
        deadline = self.clock.monotonic() + self.capacity_wait_s
        while True:
            try:
                prepared = self._prepare_group(payloads)
                break
            except CapacityError as exc:
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0 or self._closed:
                    # Nothing of this group nor of the pending ones was written: a definite
                    # failure, and the WAL stays usable once trimmed.
                    self._fail_waiters(waiters, exc)
                    rest = [waiter for _, waiter in self._pending]
                    self._pending.clear()
                    self._pending_bytes = 0
                    self._fail_waiters(rest, exc)
                    return
                assert self._trimmed_event is not None
                self._trimmed_event.clear()
                try:
                    await wait_for(self.clock, self._trimmed_event.wait(), min(remaining, 0.05))
                except TimeoutError:
                    pass
            except WalstreamError as exc:
                self._record_failure(exc)
                self._fail_waiters(waiters, self._failure or exc)
                return
        group = _Group(prepared, waiters)
        self._inflight.append(group)
        self._start_write(prepared)
        task = asyncio.create_task(self._run_write(group))
        self._write_tasks.add(task)
        task.add_done_callback(self._write_tasks.discard)

    async def _run_write(self, group: _Group) -> None:
        try:
            await self._write_group(group.prepared)
        except BaseException as exc:
            self._record_failure(exc)
            # Acknowledge nothing from here on: this group and every later one fail.
            failure = self._failure
            assert failure is not None
            while self._inflight:
                failed = self._inflight.popleft()
                self._fail_waiters(failed.waiters, failure)
            rest = [waiter for _, waiter in self._pending]
            self._pending.clear()
            self._pending_bytes = 0
            self._fail_waiters(rest, failure)
            self._wake_flusher()
            if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                raise
            return
        group.done = True
        while self._inflight and self._inflight[0].done:
            finished = self._inflight.popleft()
            for waiter, offset in zip(finished.waiters, finished.prepared.offsets, strict=True):
                if isinstance(waiter, asyncio.Future):
                    if not waiter.done():
                        waiter.set_result(offset)
                else:
                    _tell(waiter, offset, None)
        self._wake_flusher()

    def _wake_flusher(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _record_failure(self, exc: BaseException) -> None:
        if self._failure is not None:
            return
        if isinstance(exc, FencedError):
            self._failure = exc
        elif isinstance(exc, AmbiguousError):
            self._failure = exc
        else:
            ambiguous = AmbiguousError(
                f"WAL write failed after it was issued ({type(exc).__name__}: {exc}); "
                "the records may or may not be recovered after a restart"
            )
            ambiguous.__cause__ = exc
            self._failure = ambiguous
        log.error("WAL node=%s failed: %s", self.node_id, self._failure)

    @staticmethod
    def _fail_waiters(
        waiters: Sequence[asyncio.Future[WalOffset] | WalCallback], exc: BaseException
    ) -> None:
        for waiter in waiters:
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_exception(exc)
                    # The engine may have stopped awaiting; keep asyncio from logging it twice.
                    waiter.exception()
            else:
                _tell(waiter, -1, exc)


def _tell(callback: WalCallback, offset: WalOffset, error: BaseException | None) -> None:
    try:
        callback(offset, error)
    except Exception:
        log.exception("a WAL append callback raised; ignored")
