"""The closed loop every benchmark of ``bench/`` drives its load with.

:func:`closed_loop` runs ``clients`` coroutines; each calls ``operation(i)`` (``i`` its index),
waits for the answer, and calls it again, until the run ends:

- after ``seconds`` (an operation under way finishes; a new one is not started);
- once ``operations`` operations were started, by all clients together;
- once ``stop`` (an :class:`asyncio.Event`) is set;
- for one client, when its operation raises :class:`ClientDone` (it had no more work).

A latency is from the call to the answer (``time.perf_counter``); an operation returns how many
records it wrote (1 for an operation that is not an append). An error stops the run: the other
clients finish the operation they are in and stop, and the first error is raised (a benchmark
that fails says so). :func:`for_each` runs a list of work items through the same loop, a fixed
number at a time.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from common.report import percentile

__all__ = ["ClientDone", "LoopResult", "Operation", "closed_loop", "for_each"]

Operation = Callable[[int], Awaitable[int]]
"""One operation of client ``i``: returns how many records it wrote."""


class ClientDone(Exception):
    """Raised by an operation when its client has no more work: that client stops (the
    operation is not counted), the others go on."""


@dataclass
class LoopResult:
    """What one closed-loop run measured."""

    latencies_s: list[float]
    """Every operation's latency in seconds, sorted."""
    elapsed_s: float
    """From the start of the first client to the end of the last."""
    records: int
    """Records written: the sum of what the operations returned."""
    cpu_s: float
    """CPU seconds this process used during the run (every thread)."""

    @property
    def operations(self) -> int:
        return len(self.latencies_s)

    @property
    def operations_per_s(self) -> float:
        return self.operations / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def client_cpu(self) -> float:
        """CPU seconds this process spent per second: near 1.0 means the benchmark's own process
        (the clients, and the node itself for an in-process run) saturates its core."""
        return self.cpu_s / self.elapsed_s if self.elapsed_s else 0.0

    def latency(self, fraction: float, scale: float = 1.0) -> float:
        """The latency at ``fraction`` (nearest rank, :func:`common.report.percentile`) times
        ``scale`` (1e3: milliseconds, 1e6: microseconds); NaN when nothing completed."""
        if not self.latencies_s:
            return math.nan
        return percentile(self.latencies_s, fraction, presorted=True) * scale

    def mean(self, scale: float = 1.0) -> float:
        if not self.latencies_s:
            return math.nan
        return sum(self.latencies_s) / len(self.latencies_s) * scale

    def summary(self) -> dict[str, Any]:
        """Requests/s, records/s, p50/p99 in milliseconds, the client CPU and every latency in
        milliseconds (the shape ``bench/peers.py`` reports)."""
        return {
            "client_cpu": self.client_cpu,
            "requests": self.operations,
            "requests_per_s": self.operations_per_s,
            "records_per_s": self.records_per_s,
            "p50_ms": self.latency(0.50, 1e3),
            "p99_ms": self.latency(0.99, 1e3),
            "latencies_ms": [value * 1e3 for value in self.latencies_s],
        }


async def closed_loop(
    operation: Operation,
    clients: int,
    seconds: float | None = None,
    *,
    operations: int | None = None,
    stop: asyncio.Event | None = None,
) -> LoopResult:
    """Run ``clients`` closed loops of ``operation`` until ``seconds`` passed, ``operations`` were
    started or ``stop`` is set (see the module docstring); at least one must be given."""
    if seconds is None and operations is None and stop is None:
        raise ValueError("closed_loop needs seconds, operations or stop to end")
    clock = time.perf_counter
    latencies: list[float] = []
    records = 0
    started = 0
    limit = sys.maxsize if operations is None else operations
    errors: list[Exception] = []
    cpu_begun = time.process_time()
    begun = clock()
    stop_at = math.inf if seconds is None else begun + seconds

    async def client(index: int) -> None:
        nonlocal records, started
        while (
            not errors
            and started < limit
            and clock() < stop_at
            and (stop is None or not stop.is_set())
        ):
            started += 1
            called = clock()
            try:
                written = await operation(index)  # not `records += await ...`: that reads first
            except ClientDone:
                started -= 1
                return
            except Exception as error:
                errors.append(error)
                return
            latencies.append(clock() - called)
            records += written

    await asyncio.gather(*(client(index) for index in range(clients)))
    elapsed = clock() - begun
    cpu = time.process_time() - cpu_begun
    if errors:
        raise errors[0]
    latencies.sort()
    return LoopResult(latencies, elapsed, records, cpu)


async def for_each(
    count: int, work: Callable[[int], Awaitable[object]], parallel: int
) -> LoopResult:
    """``work(i)`` for every ``i`` in ``range(count)``, ``parallel`` at a time, in order of
    ``i`` (each free client takes the next)."""
    position = 0

    async def next_item(_client: int) -> int:
        nonlocal position
        index, position = position, position + 1
        await work(index)
        return 1

    return await closed_loop(next_item, min(parallel, count), operations=count)
