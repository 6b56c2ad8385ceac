"""The injected clock's waits: the system clock's timeouts are real, the manual clock's expire
only when a test advances it."""

from __future__ import annotations

import asyncio

import pytest
from walstream.clock import ManualClock, SystemClock


async def test_system_clock_wait_reports_whether_the_event_was_set() -> None:
    clock = SystemClock()
    event = asyncio.Event()
    assert await clock.wait(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await clock.wait(event, 5.0) is True
    assert await clock.wait(event, 0) is True  # already set: no waiting at all


async def test_system_clock_wait_resumes_in_the_first_loop_step_after_the_event_is_set() -> None:
    """No task of its own around the event: setting it schedules the waiter itself, so a
    waiter set before another task yields once has resumed by the time that task resumes."""
    clock = SystemClock()
    event = asyncio.Event()
    waiter = asyncio.create_task(clock.wait(event, 30.0))
    await asyncio.sleep(0)
    assert not waiter.done()
    event.set()
    await asyncio.sleep(0)
    assert waiter.done() and waiter.result() is True


async def test_system_clock_wait_for_times_out_and_cancels_the_work() -> None:
    clock = SystemClock()
    assert await clock.wait_for(asyncio.sleep(0, result=7), 1.0) == 7
    work = asyncio.ensure_future(asyncio.Event().wait())
    with pytest.raises(TimeoutError):
        await clock.wait_for(work, 0.01)
    assert work.cancelled()


async def test_manual_clock_timeouts_expire_only_when_it_is_advanced() -> None:
    clock = ManualClock()
    event = asyncio.Event()
    waiter = asyncio.ensure_future(clock.wait(event, 10.0))
    await asyncio.sleep(0.05)  # real time passes, the manual clock does not
    assert not waiter.done()
    clock.advance(9.9)
    await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance(0.1)
    assert await asyncio.wait_for(waiter, 1.0) is False


async def test_manual_clock_wait_returns_when_the_event_is_set() -> None:
    clock = ManualClock()
    event = asyncio.Event()
    waiter = asyncio.ensure_future(clock.wait(event, 10.0))
    await asyncio.sleep(0)
    event.set()
    assert await asyncio.wait_for(waiter, 1.0) is True
    assert clock.monotonic() == 0.0


async def test_manual_clock_wait_for_cancels_the_work_on_timeout_and_on_cancel() -> None:
    clock = ManualClock()
    work = asyncio.ensure_future(asyncio.Event().wait())
    waiter = asyncio.ensure_future(clock.wait_for(work, 1.0))
    await asyncio.sleep(0)
    clock.advance(1.0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(waiter, 1.0)
    assert work.cancelled()

    other = asyncio.ensure_future(asyncio.Event().wait())
    waiter = asyncio.ensure_future(clock.wait_for(other, 1.0))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.sleep(0)
    assert other.cancelled()
    assert await clock.wait_for(asyncio.sleep(0, result="done"), 1.0) == "done"


async def test_manual_clock_sleep_moves_time_and_fires_timers() -> None:
    clock = ManualClock()
    event = asyncio.Event()
    waiter = asyncio.ensure_future(clock.wait(event, 3.0))
    await asyncio.sleep(0)
    await clock.sleep(5.0)
    assert clock.monotonic() == 5.0
    assert await asyncio.wait_for(waiter, 1.0) is False
