""":func:`walstream_conformance.waiting.eventually` explains a long wait in the test's log: what
it waits for, and once the wait is long, where every task of the event loop is suspended."""

from __future__ import annotations

import asyncio
import logging

import pytest
from walstream_conformance.waiting import eventually

pytestmark = pytest.mark.asyncio


async def parked_forever(parked: asyncio.Event) -> None:
    parked.set()
    await asyncio.Event().wait()  # a stuck task, like a replay waiting on a future never resolved


async def test_a_long_wait_logs_the_stacks_of_the_loops_tasks_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parked = asyncio.Event()
    stuck = asyncio.create_task(parked_forever(parked), name="walstream-stuck-task")
    await parked.wait()
    polls = 0

    def after_a_few_reports() -> bool:
        nonlocal polls
        polls += 1
        return polls > 40

    try:
        with caplog.at_level(logging.WARNING, logger="walstream_conformance.waiting"):
            await eventually(
                after_a_few_reports,
                "the stuck task",
                poll_s=0.001,
                report_every_s=0.0,
                stacks_after_s=0.01,
            )
    finally:
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("still waiting for the stuck task after") for m in messages)
    dumps = [m for m in messages if "the tasks of the event loop" in m]
    assert len(dumps) == 1, "the stacks are logged once per wait"
    [dump] = dumps
    assert "--- task 'walstream-stuck-task'" in dump
    assert "parked_forever" in dump and "await asyncio.Event().wait()" in dump
    assert ": this wait" in dump


async def test_a_short_wait_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    ready = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, ready.set)
    with caplog.at_level(logging.WARNING, logger="walstream_conformance.waiting"):
        await eventually(ready.is_set, "the event")
    assert caplog.records == []
