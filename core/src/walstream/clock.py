"""Injected time and randomness: core logic never calls ``time.time()`` or ``random`` directly,
so a test can drive time and a failing seed replays."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock", "make_rng"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (record timestamps, TTLs)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (ages, deadlines, latency)."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it instantly."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._mono = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._now_ms += int(seconds * 1000)

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


def make_rng(seed: int | None) -> random.Random:
    """A seeded RNG; ``None`` draws a seed from the OS (callers log it so a failure replays)."""
    return random.Random(seed)
