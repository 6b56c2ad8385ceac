"""Injected time and randomness: core logic never calls ``time.time()``, ``asyncio.sleep``,
``asyncio.wait_for`` or ``random`` directly, so a test can drive time and a failing seed replays.

Every wait with a timeout goes through :meth:`Clock.wait` (an event, or the timeout) or
:meth:`Clock.wait_for` (an awaitable, or :class:`TimeoutError`), so on a :class:`ManualClock` a
timeout passes when the test advances the clock, not when the wall clock says so.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

__all__ = ["Clock", "ManualClock", "Rng", "SystemClock", "make_rng"]

T = TypeVar("T")

#: The random-number generator core logic is given (seeded by :func:`make_rng`).
Rng = random.Random


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (record timestamps, TTLs)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (ages, deadlines, latency)."""

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Wait until ``event`` is set or ``timeout`` seconds pass; True if the event is set.
        A timeout of zero or less only looks at the event (after yielding once)."""

    async def wait_for(self, awaitable: Awaitable[T], timeout: float) -> T:
        """The result of ``awaitable``, or :class:`TimeoutError` (the awaitable cancelled) when
        it takes longer than ``timeout`` seconds."""


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        # The loop's own timeout around the event, as in wait_for: ``asyncio.wait_for`` would
        # wrap event.wait() in a task of its own on Python 3.11, and a set event would then
        # resume the waiter two steps of the loop later (a reader at the tail would see an
        # acknowledged record only after the appender, and whatever it runs, went first).
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await event.wait()
        except TimeoutError:
            return event.is_set()
        return True

    async def wait_for(self, awaitable: Awaitable[T], timeout: float) -> T:
        # The loop's own timeout: no extra task per call (these waits sit on the write path).
        async with asyncio.timeout(max(0.0, timeout)):
            return await awaitable


class ManualClock:
    """A clock that moves only when told to (:meth:`advance`); ``sleep`` advances it instantly.

    Timeouts of :meth:`wait` and :meth:`wait_for` are virtual: they expire when the clock is
    advanced past them, never because real time passed, so a test decides when they fire."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._mono = 0.0
        self._timers: list[tuple[float, int, asyncio.Event]] = []
        self._sequence = itertools.count()

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._now_ms += int(seconds * 1000)
        while self._timers and self._timers[0][0] <= self._mono:
            heapq.heappop(self._timers)[2].set()

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)

    def _timer(self, timeout: float) -> asyncio.Event:
        expired = asyncio.Event()
        if timeout <= 0:
            expired.set()
        else:
            heapq.heappush(self._timers, (self._mono + timeout, next(self._sequence), expired))
        return expired

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        try:
            await self.wait_for(event.wait(), timeout)
        except TimeoutError:
            return event.is_set()
        return True

    async def wait_for(self, awaitable: Awaitable[T], timeout: float) -> T:
        work = asyncio.ensure_future(awaitable)
        if timeout <= 0:
            await asyncio.sleep(0)
        else:
            expiry = asyncio.ensure_future(self._timer(timeout).wait())
            try:
                await asyncio.wait({work, expiry}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                work.cancel()  # the waiter was cancelled: the work must not outlive it
                raise
            finally:
                expiry.cancel()
        if work.done():
            return work.result()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise TimeoutError(f"timed out after {timeout}s of the manual clock")


def make_rng(seed: int | None) -> Rng:
    """A seeded RNG; ``None`` draws a seed from the OS (callers log it so a failure replays)."""
    return random.Random(seed)
