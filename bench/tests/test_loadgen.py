"""The shared closed loop: how a run ends, what it counts, and what an error does."""

from __future__ import annotations

import asyncio

import pytest
from common.loadgen import ClientDone, closed_loop, for_each


async def test_a_run_of_seconds_stops_every_client_and_counts_each_answer() -> None:
    calls: dict[int, int] = {}

    async def operation(index: int) -> int:
        calls[index] = calls.get(index, 0) + 1
        await asyncio.sleep(0)
        return 3

    result = await closed_loop(operation, 4, 0.05)
    assert sorted(calls) == [0, 1, 2, 3], "every client ran"
    assert result.operations == sum(calls.values()), "one latency per answered operation"
    assert result.records == 3 * result.operations
    assert result.elapsed_s >= 0.05
    assert result.latencies_s == sorted(result.latencies_s)
    assert result.summary()["requests"] == result.operations


async def test_operations_bounds_the_operations_started_by_all_clients_together() -> None:
    started: list[int] = []

    async def operation(index: int) -> int:
        started.append(index)
        await asyncio.sleep(0)
        return 1

    result = await closed_loop(operation, 8, operations=21)
    assert len(started) == 21 and result.operations == 21
    assert len(set(started)) == 8, "the operations are spread over the clients"


async def test_a_stop_event_ends_the_run_after_the_operations_under_way() -> None:
    stop = asyncio.Event()
    finished = 0

    async def operation(index: int) -> int:
        nonlocal finished
        await asyncio.sleep(0.001)
        finished += 1
        if finished == 10:
            stop.set()
        return 1

    result = await closed_loop(operation, 3, stop=stop)
    assert result.operations == finished, "the operations under way finished and were counted"
    assert 10 <= finished <= 12, "no client started an operation once stop was set"


async def test_client_done_stops_only_that_client() -> None:
    work = {0: 2, 1: 5}

    async def operation(index: int) -> int:
        if work[index] == 0:
            raise ClientDone
        work[index] -= 1
        await asyncio.sleep(0)
        return 1

    result = await closed_loop(operation, 2, operations=100)
    assert result.operations == 7, "both clients did all their work and nothing more"


async def test_an_error_stops_the_other_clients_and_is_raised() -> None:
    after_error: list[int] = []
    failed = False

    async def operation(index: int) -> int:
        nonlocal failed
        if failed:
            after_error.append(index)
        await asyncio.sleep(0.001)
        if index == 0:
            failed = True
            raise RuntimeError("answered 500")
        return 1

    with pytest.raises(RuntimeError, match="answered 500"):
        await closed_loop(operation, 4, 5.0)
    assert not after_error, "no operation started after the error"


async def test_a_run_needs_a_way_to_end() -> None:
    async def operation(index: int) -> int:
        return 1

    with pytest.raises(ValueError, match="seconds, operations or stop"):
        await closed_loop(operation, 1)


async def test_for_each_runs_every_item_once_a_few_at_a_time() -> None:
    running = peak = 0
    seen: list[int] = []

    async def work(index: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001)
        seen.append(index)
        running -= 1

    result = await for_each(25, work, 4)
    assert sorted(seen) == list(range(25)) and result.operations == 25
    assert peak == 4
