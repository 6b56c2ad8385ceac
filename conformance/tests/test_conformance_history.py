"""The linearizability checker: accepts correct histories (also with ambiguous outcomes), finds
planted bugs, and checks the real engine under faults."""

from __future__ import annotations

import asyncio
import importlib.util
import random
from collections.abc import Sequence

import pytest
from walstream.errors import AmbiguousError, OutOfRangeError, TailMismatchError
from walstream_conformance.history import (
    History,
    check_linearizable,
    run_engine_workload,
    run_stream_workload,
)


class InTestStream:
    """A small in-memory stream. ``bug`` plants one defect:

    - ``lost_update``: append reads the tail, yields, then writes there (concurrent appends
      overwrite each other, both acknowledged);
    - ``stale_read``: reads are served from a snapshot refreshed only every few calls;
    - ``trimmed_read``: reads below the trim point still return the old records.

    ``ambiguous_rate`` makes appends fail with AmbiguousError, half of them after applying.
    """

    def __init__(
        self, rng: random.Random, bug: str | None = None, ambiguous_rate: float = 0.0
    ) -> None:
        self.values: list[bytes] = []
        self.start_offset = 0
        self.rng = rng
        self.bug = bug
        self.ambiguous_rate = ambiguous_rate
        self._snapshot: list[bytes] = []
        self._reads = 0

    async def _pause(self) -> None:
        await asyncio.sleep(self.rng.choice((0, 0, 0.0003)))

    async def append(self, values: Sequence[bytes], match_tail: int | None) -> tuple[int, int]:
        await self._pause()
        if self.rng.random() < self.ambiguous_rate and self.rng.random() < 0.5:
            raise AmbiguousError("timed out before sending")
        tail = len(self.values)
        if match_tail is not None and match_tail != tail:
            raise TailMismatchError("tail moved", tail)
        if self.bug == "lost_update":
            await asyncio.sleep(0.0005)
            self.values[tail : tail + len(values)] = values
        else:
            self.values.extend(values)
        if self.rng.random() < self.ambiguous_rate:
            raise AmbiguousError("applied, then the connection dropped")
        await self._pause()
        return tail, tail + len(values)

    async def read(self, start: int, limit: int) -> tuple[tuple[bytes, ...], int]:
        await self._pause()
        self._reads += 1
        values = self.values
        if self.bug == "stale_read":
            if self._reads % 5 == 0:
                self._snapshot = list(self.values)
            values = self._snapshot
        floor = 0 if self.bug == "trimmed_read" else self.start_offset
        if start < floor or start > len(values):
            raise OutOfRangeError("out of range", self.start_offset, len(values))
        return tuple(values[start : start + limit]), len(values)

    async def trim(self, new_start: int) -> None:
        await self._pause()
        if new_start > len(self.values):
            raise OutOfRangeError("beyond tail", self.start_offset, len(self.values))
        self.start_offset = max(self.start_offset, new_start)

    async def check_tail(self) -> int:
        await self._pause()
        return len(self.values)


@pytest.mark.parametrize("seed", range(6))
async def test_correct_stream_is_linearizable(seed: int) -> None:
    history = await run_stream_workload(InTestStream(random.Random(seed)), random.Random(seed))
    result = check_linearizable(history)
    assert result, result.message


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
async def test_ambiguous_outcomes_are_accepted(seed: int) -> None:
    stream = InTestStream(random.Random(seed), ambiguous_rate=0.2)
    history = await run_stream_workload(stream, random.Random(seed))
    assert any(op.outcome == "ambiguous" for op in history.operations)
    result = check_linearizable(history)
    assert result, result.message


@pytest.mark.parametrize("bug", ["lost_update", "stale_read", "trimmed_read"])
async def test_planted_bugs_are_found(bug: str) -> None:
    found = 0
    for seed in range(5):
        stream = InTestStream(random.Random(seed), bug=bug)
        history = await run_stream_workload(
            stream, random.Random(seed), trim_weight=0.15 if bug == "trimmed_read" else 0.05
        )
        result = check_linearizable(history)
        found += not result
        if not result:
            assert "not linearizable" in result.message
    assert found >= 3, f"the checker found the planted {bug} bug in only {found} of 5 seeded runs"


def test_hand_written_lost_update() -> None:
    """Two acknowledged appends got the same offsets: no order explains it."""
    history = History()
    first = history.invoke(0, "append", values=(b"a",), match_tail=None)
    second = history.invoke(1, "append", values=(b"b",), match_tail=None)
    history.ok(first, (0, 1))
    history.ok(second, (0, 1))
    result = check_linearizable(history)
    assert not result
    history = History()
    first = history.invoke(0, "append", values=(b"a",), match_tail=None)
    history.ok(first, (0, 1))
    read = history.invoke(1, "read", start=0, limit=5)
    history.ok(read, ((), 0))  # a read after the ack that misses it
    assert not check_linearizable(history)


def test_ambiguous_append_may_appear_later_or_never() -> None:
    history = History()
    append = history.invoke(0, "append", values=(b"x",), match_tail=None)
    history.failed(append, AmbiguousError("timeout"))
    empty = history.invoke(1, "read", start=0, limit=5)
    history.ok(empty, ((), 0))
    found = history.invoke(1, "read", start=0, limit=5)
    history.ok(found, ((b"x",), 1))
    assert check_linearizable(history)
    gone = history.invoke(1, "read", start=0, limit=5)
    history.ok(gone, ((), 0))  # it cannot vanish once seen
    assert not check_linearizable(history)


needs_engine = pytest.mark.skipif(
    importlib.util.find_spec("walstream.engine.client") is None, reason="engine not installed"
)


@needs_engine
async def test_engine_is_linearizable_under_faults() -> None:
    """Appends, reads, trims and tail checks on the real engine, with object-store errors,
    "written but reported failed" puts, latency and delayed WAL acks."""
    faults = 0
    for seed in range(4):
        history, result = await run_engine_workload(
            seed, match_tail_fraction=0.0, object_error_rate=0.15, object_ambiguous_rate=0.1
        )
        assert len(history.operations) > 100
        assert result, f"seed {seed}: {result.message}"
        faults += history.notes["object_faults"]
    assert faults > 0, "no fault was injected in any run: the runs prove little"


@needs_engine
async def test_engine_match_tail_is_linearizable() -> None:
    failures = []
    for seed in range(4):
        _, result = await run_engine_workload(seed, match_tail_fraction=0.3)
        if not result:
            failures.append(result.message)
    assert not failures, failures[0]
