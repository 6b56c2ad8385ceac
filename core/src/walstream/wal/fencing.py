"""The coalesced "was my epoch superseded?" check of a WAL whose medium cannot make a write
conditional on the owner's epoch (an object store).

Such a WAL writes first and then asks the medium whether a newer epoch claimed the log; only a
write followed by a check that *started after it completed* and found no newer owner may be
acknowledged. A recovery claims before it lists, so either the claim came first (the check sees
it) or the write did (the recovery's listing sees it). Concurrent writers share checks: one read
covers every write completed before it began.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from walstream.errors import FencedError

__all__ = ["SupersededCheck"]


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
