"""Bounded waits on an injected :class:`~walstream.clock.Clock`: the WALs' timeouts run on the
clock they were given, so a test clock drives them too.

Any clock works by racing the wait against ``clock.sleep``. The :class:`SystemClock` sleeps on
the event loop's timer, so for it the clock's own ``wait_for`` (the loop's timeout) is the same
clock and spares the racing task (these waits sit on the write path: one per replica request, one per group)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from walstream.clock import Clock, SystemClock

__all__ = ["wait_for", "wait_tasks"]

T = TypeVar("T")
F = TypeVar("F", bound="asyncio.Future[Any]")


async def wait_for(clock: Clock, awaitable: Awaitable[T], timeout_s: float) -> T:
    """What ``awaitable`` returns or raises, or :class:`TimeoutError` (and ``awaitable``
    cancelled) when it has not finished after ``timeout_s`` on ``clock``. Cancelling the caller
    cancels ``awaitable``."""
    if type(clock) is SystemClock:
        return await clock.wait_for(awaitable, timeout_s)
    task = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(max(0.0, timeout_s)))
    try:
        await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        timer.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise TimeoutError
    return task.result()


async def wait_tasks(
    clock: Clock, tasks: Iterable[F], timeout_s: float, *, first: bool = False
) -> tuple[set[F], set[F]]:
    """``(done, pending)`` once every task finished (``first``: any task), or after
    ``timeout_s`` on ``clock``; like :func:`asyncio.wait`, nothing is cancelled."""
    waiting = set(tasks)
    done = {task for task in waiting if task.done()}
    pending = waiting - done
    if not pending or (first and done):
        return done, pending
    if type(clock) is SystemClock:
        finished, pending = await asyncio.wait(
            pending,
            timeout=max(0.0, timeout_s),
            return_when=asyncio.FIRST_COMPLETED if first else asyncio.ALL_COMPLETED,
        )
        return done | finished, pending
    timer = asyncio.ensure_future(clock.sleep(max(0.0, timeout_s)))
    try:
        while pending and not timer.done():
            racing: set[asyncio.Future[Any]] = {*pending, timer}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            finished = {task for task in pending if task.done()}
            done |= finished
            pending -= finished
            if first and finished:
                break
    finally:
        timer.cancel()
    return done, pending
