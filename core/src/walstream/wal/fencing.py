"""The coalesced "was my epoch superseded?" check of a WAL whose medium cannot make a write
conditional on the owner's epoch (an object store).

Such a WAL writes first and then asks the medium whether a newer epoch claimed the log; only a
write followed by a check that *started after it completed* and found no newer owner may be
acknowledged. A recovery claims before it lists, so either the claim came first (the check sees
it) or the write did (the recovery's listing sees it). Concurrent writers share checks: one read
covers every write completed before it began.

A :class:`FenceLease` saves most of those reads: a check that found no newer owner also covers,
for a lease from the moment it *started*, the writes that complete meanwhile. The medium records
the lease where a new owner finds it, and the new owner waits it out (:func:`lease_wait_s`)
after its claim and before it lists: a check that missed the claim started before the claim
existed, so a write it covers completed before the listing.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from walstream.clock import Clock
from walstream.errors import FencedError, InvalidArgument, WalstreamError

__all__ = ["LEASE_MARGIN", "FenceLease", "SupersededCheck", "checked_lease_s", "lease_wait_s"]

log = logging.getLogger(__name__)

LEASE_MARGIN = 1.25
"""A new owner waits this many leases (plus a millisecond): room for the two clocks' rates to
differ."""


def checked_lease_s(lease_s: float, maximum_s: float) -> float:
    """``lease_s``, the ``wal.fence_lease`` option of a WAL, if it is between 0 and the WAL's
    ``maximum_s``; else :class:`InvalidArgument`."""
    if not 0 <= lease_s <= maximum_s:
        raise InvalidArgument(f"wal.fence_lease: between 0 and {maximum_s:g} s, got {lease_s!r}")
    return lease_s


def lease_wait_s(lease_s: float) -> float:
    """How long a new owner waits after its claim for a superseded writer's ``lease_s`` to run
    out (0 for no lease)."""
    return lease_s * LEASE_MARGIN + 0.001 if lease_s > 0 else 0.0


class SupersededCheck:
    """Coalesced runs of ``check``, which reads the medium once and raises
    :class:`FencedError` when a newer epoch owns the log.

    :meth:`confirm` returns once a run that started after the call found no newer owner. A
    caller that arrives while a run is in progress waits for the next run, which starts when
    the current one ends and is shared by every caller that arrived meanwhile. The first
    :class:`FencedError` is latched in ``fenced``: every later :meth:`confirm` raises it without
    reading (an epoch, once superseded, stays superseded). Other errors go to the callers of
    that run only. ``checks`` counts the runs.
    """

    def __init__(self, check: Callable[[], Awaitable[None]]) -> None:
        self._check = check
        self._running: asyncio.Future[None] | None = None
        self._queued: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.fenced: FencedError | None = None
        self.checks = 0

    async def confirm(self) -> None:
        if self.fenced is not None:
            raise self.fenced
        loop = asyncio.get_running_loop()
        if self._running is None:
            future: asyncio.Future[None] = loop.create_future()
            self._launch(future)
        else:
            if self._queued is None:
                self._queued = loop.create_future()
            future = self._queued
        # A caller that gives up (a request timeout) must not cancel the run others share.
        await asyncio.shield(future)

    async def close(self) -> None:
        """Stop the run in progress (its callers see it cancelled) and start no other."""
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _launch(self, future: asyncio.Future[None]) -> None:
        self._running = future
        self._task = asyncio.get_running_loop().create_task(self._run(future))

    async def _run(self, future: asyncio.Future[None]) -> None:
        self.checks += 1
        try:
            await self._check()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            if isinstance(exc, FencedError):
                self.fenced = exc
            future.set_exception(exc)
            future.exception()  # waiters re-raise it; keep asyncio from logging it twice
        else:
            future.set_result(None)
        finally:
            self._running = None
            self._task = None
            queued, self._queued = self._queued, None
            if queued is not None:
                if self._closed:
                    queued.cancel()
                else:
                    self._launch(queued)


class FenceLease:
    """A :class:`SupersededCheck` (``runs``) whose runs that found no newer owner cover, for
    ``lease_s`` from their start, the writes that complete meanwhile (module doc).

    :meth:`written`: a write completed just now; returns at once under the lease (starting a
    renewal in the background once less than half of it is left), else when a run that started
    after the call found no newer owner. A run that finds a newer owner ends the lease, and its
    :class:`FencedError` is latched as in ``runs``. ``lease_s`` 0: every write waits for a run.
    """

    def __init__(self, check: Callable[[], Awaitable[None]], lease_s: float, clock: Clock) -> None:
        self.lease_s = lease_s
        self._check = check
        self._clock = clock
        self._until = -math.inf
        self._renewal: asyncio.Task[None] | None = None
        self.runs = SupersededCheck(self._timed)

    @property
    def fenced(self) -> FencedError | None:
        return self.runs.fenced

    @property
    def checks(self) -> int:
        return self.runs.checks

    async def confirm(self) -> None:
        """Return once a run that started after the call found no newer owner."""
        await self.runs.confirm()

    async def written(self) -> None:
        now = self._clock.monotonic()
        if now < self._until and self.runs.fenced is None:
            if self._until - now < self.lease_s / 2:
                self._renew()
            return
        await self.runs.confirm()

    async def close(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            await asyncio.gather(self._renewal, return_exceptions=True)
        await self.runs.close()

    async def _timed(self) -> None:
        started = self._clock.monotonic()
        try:
            await self._check()
        except FencedError:
            self._until = -math.inf
            raise
        self._until = max(self._until, started + self.lease_s)

    def _renew(self) -> None:
        """A run nobody waits for, one at a time: a write completing after the lease ran out
        waits for a run of its own."""
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.get_running_loop().create_task(self._renew_once())

    async def _renew_once(self) -> None:
        try:
            await self.runs.confirm()
        except WalstreamError as exc:
            log.info("fence lease not renewed: %s", exc)
