"""The coalesced superseded-epoch check (walstream.wal.fencing) shared by the s3 and s3express
WALs: a write is confirmed only by a check that started after it, and checks are shared; and
the fence lease over it: a check that found no newer owner covers, for the lease from its start,
the writes completing meanwhile."""

from __future__ import annotations

import asyncio

import pytest
from walstream.clock import ManualClock
from walstream.errors import BackendUnavailable, FencedError, InvalidArgument
from walstream.wal import FenceLease, SupersededCheck, checked_lease_s, lease_wait_s


class Medium:
    """A log owner marker that a test moves; every read waits until the test releases it."""

    def __init__(self) -> None:
        self.superseded = False
        self.failing = False
        self.reads = 0
        self.release = asyncio.Event()
        self.release.set()
        self.reading = asyncio.Event()

    async def check(self) -> None:
        self.reads += 1
        superseded, failing = self.superseded, self.failing  # what the read sees when sent
        self.reading.set()
        await self.release.wait()
        if failing:
            raise BackendUnavailable("medium unreachable")
        if superseded:
            raise FencedError("a newer epoch owns the log")


async def test_callers_arriving_during_a_run_share_the_next_one() -> None:
    medium = Medium()
    fence = SupersededCheck(medium.check)
    medium.release.clear()
    first = asyncio.ensure_future(fence.confirm())
    await medium.reading.wait()
    later = [asyncio.ensure_future(fence.confirm()) for _ in range(5)]
    await asyncio.sleep(0)
    medium.release.set()
    await asyncio.gather(first, *later)
    assert (medium.reads, fence.checks) == (2, 2)


async def test_a_run_that_started_before_the_call_never_confirms_it() -> None:
    medium = Medium()
    fence = SupersededCheck(medium.check)
    medium.release.clear()
    first = asyncio.ensure_future(fence.confirm())
    await medium.reading.wait()  # this run saw "not superseded"
    medium.superseded = True  # a new owner claims while it is in flight
    late = asyncio.ensure_future(fence.confirm())
    await asyncio.sleep(0)
    medium.release.set()
    await first
    with pytest.raises(FencedError):
        await late


async def test_fenced_is_latched_and_read_no_more() -> None:
    medium = Medium()
    medium.superseded = True
    fence = SupersededCheck(medium.check)
    with pytest.raises(FencedError):
        await fence.confirm()
    medium.superseded = False
    with pytest.raises(FencedError):
        await fence.confirm()
    assert medium.reads == 1
    assert fence.fenced is not None


async def test_other_errors_reach_that_run_only() -> None:
    medium = Medium()
    medium.failing = True
    fence = SupersededCheck(medium.check)
    with pytest.raises(BackendUnavailable):
        await fence.confirm()
    medium.failing = False
    await fence.confirm()
    assert fence.fenced is None and medium.reads == 2


async def test_a_caller_that_gives_up_does_not_cancel_the_shared_run() -> None:
    medium = Medium()
    fence = SupersededCheck(medium.check)
    medium.release.clear()
    impatient = asyncio.ensure_future(fence.confirm())
    await medium.reading.wait()
    patient = asyncio.ensure_future(fence.confirm())
    await asyncio.sleep(0)
    impatient.cancel()
    await asyncio.gather(impatient, return_exceptions=True)
    medium.release.set()
    await patient
    assert fence.checks == 2


async def test_close_stops_the_run_in_progress() -> None:
    medium = Medium()
    fence = SupersededCheck(medium.check)
    medium.release.clear()
    waiting = asyncio.ensure_future(fence.confirm())
    await medium.reading.wait()
    queued = asyncio.ensure_future(fence.confirm())
    await asyncio.sleep(0)
    await fence.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert fence.checks == 1


# -- FenceLease ----------------------------------------------------------------------------------


async def test_a_lease_covers_writes_completing_within_it_from_its_runs_start() -> None:
    clock = ManualClock()
    medium = Medium()

    async def slow_check() -> None:
        clock.advance(0.3)  # the read takes 0.3 s: the lease counts from its start
        await medium.check()

    lease = FenceLease(slow_check, 1.0, clock)
    await lease.written()  # no lease yet: waits for a run
    assert medium.reads == 1
    clock.advance(0.1)  # 0.4 s after the run started
    await lease.written()
    assert medium.reads == 1  # covered: no read
    clock.advance(0.65)  # 1.05 s after the run started: the lease ran out
    await lease.written()
    assert medium.reads == 2


async def test_a_lease_is_renewed_in_the_background_past_its_half() -> None:
    clock = ManualClock()
    medium = Medium()
    lease = FenceLease(medium.check, 1.0, clock)
    await lease.confirm()
    clock.advance(0.6)
    await lease.written()  # covered, and a renewal starts
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert medium.reads == 2
    clock.advance(0.6)  # 1.2 s after the first run, 0.6 s after the renewal's
    await lease.written()
    assert medium.reads == 2
    await lease.close()


async def test_a_run_that_finds_a_newer_owner_ends_the_lease() -> None:
    clock = ManualClock()
    medium = Medium()
    lease = FenceLease(medium.check, 1.0, clock)
    await lease.confirm()
    medium.superseded = True
    clock.advance(0.6)
    await lease.written()  # still covered: the renewal it starts finds the newer owner
    for _ in range(3):
        await asyncio.sleep(0)
    assert isinstance(lease.fenced, FencedError)
    with pytest.raises(FencedError):
        await lease.written()
    await lease.close()


async def test_without_a_lease_every_write_waits_for_a_run() -> None:
    clock = ManualClock()
    medium = Medium()
    lease = FenceLease(medium.check, 0.0, clock)
    for _ in range(3):
        await lease.written()
    assert medium.reads == 3
    assert lease_wait_s(0.0) == 0.0
    assert lease_wait_s(1.0) == pytest.approx(1.251)


def test_a_fence_lease_outside_zero_to_the_wals_maximum_is_refused() -> None:
    assert checked_lease_s(0.0, 10.0) == 0.0
    assert checked_lease_s(10.0, 10.0) == 10.0
    for wrong in (-0.001, 10.001):
        with pytest.raises(InvalidArgument, match=r"wal.fence_lease: between 0 and 10 s"):
            checked_lease_s(wrong, 10.0)
