"""A zombie writer keeps appending while another node takes its WAL over (FAILOVER)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from walstream.clock import ManualClock
from walstream.errors import FencedError, InvalidArgument, WalstreamError
from walstream.wal import WalMode
from walstream_wal_ebs import EbsWal
from walstream_wal_ebs.layout import BLOCK_BYTES, FORMAT_VERSION, HeaderSlot, pick_header


async def test_zombie_gets_no_acknowledgement_after_failover(wal_path: Path, open_wal) -> None:
    # Room for the whole run: the zombie must meet the fence, not a full ring.
    capacity = 256 << 20
    zombie, _ = await open_wal(wal_path, epoch=1, max_inflight=8, capacity_bytes=capacity)
    acknowledged: dict[int, bytes] = {}
    failures: list[BaseException] = []
    fence_landed = asyncio.Event()
    acked_after_fence: list[int] = []

    async def keep_appending(worker: int) -> None:
        sequence = 0
        while True:
            data = f"zombie {worker} {sequence}".encode() * 20
            sequence += 1
            called_after_fence = fence_landed.is_set()
            try:
                offset = await zombie.append(data)
            except WalstreamError as exc:
                failures.append(exc)
                return
            if called_after_fence:
                acked_after_fence.append(offset)
            acknowledged[offset] = data

    workers = [asyncio.create_task(keep_appending(worker)) for worker in range(16)]
    for _ in range(500):
        if len(acknowledged) >= 50:
            break
        await asyncio.sleep(0.01)
    assert acknowledged, "the zombie should have been acknowledged before the failover"
    taker, recovered = await open_wal(
        wal_path, epoch=2, mode=WalMode.FAILOVER, capacity_bytes=capacity
    )
    fence_landed.set()
    await asyncio.wait_for(asyncio.gather(*workers), 10)
    # Appends issued after the takeover all fail, and none is acknowledged.
    with pytest.raises(WalstreamError):
        await zombie.append(b"after the fence")
    assert acked_after_fence == []
    assert any(isinstance(exc, FencedError) for exc in failures), [repr(exc) for exc in failures][
        :3
    ]
    # Every record the zombie was acknowledged for is in the new owner's recovery.
    recovered_map = {record.offset: record.data for record in recovered}
    for offset, data in acknowledged.items():
        assert recovered_map.get(offset) == data
    await taker.reset()
    await taker.close()
    await zombie.close()


async def test_failover_needs_a_higher_epoch(wal_path: Path, open_wal) -> None:
    owner, _ = await open_wal(wal_path, epoch=3)
    with pytest.raises(FencedError):
        await open_wal(wal_path, epoch=3, mode=WalMode.FAILOVER)
    with pytest.raises(FencedError):
        await open_wal(wal_path, epoch=2, mode=WalMode.READ_WRITE)
    assert await owner.append(b"still the owner") > 0
    await owner.close()


async def test_zombie_trim_cannot_undo_the_fence(wal_path: Path, open_wal) -> None:
    zombie, _ = await open_wal(wal_path, epoch=1)
    offset = await zombie.append(b"x")
    taker, _ = await open_wal(wal_path, epoch=2, mode=WalMode.FAILOVER)
    with pytest.raises(FencedError):
        await zombie.trim(offset)
    with pytest.raises(FencedError):
        await open_wal(wal_path, epoch=1)
    await taker.close()
    await zombie.close()


# -- the fence lease ------------------------------------------------------------------------------


async def test_takeover_waits_out_the_fence_lease(wal_path: Path, open_wal) -> None:
    # One clock for both: the taker's wait moves it past the zombie's lease.
    clock = ManualClock()
    zombie, _ = await open_wal(wal_path, epoch=1, clock=clock)
    first = await zombie.append(b"acknowledged under the lease")
    assert zombie.fence_reads == 1
    started = clock.monotonic()
    taker, recovered = await open_wal(wal_path, epoch=2, mode=WalMode.FAILOVER, clock=clock)
    assert clock.monotonic() - started >= zombie.fence_lease_s
    assert [(record.offset, record.data) for record in recovered] == [
        (first, b"acknowledged under the lease")
    ]
    with pytest.raises(FencedError, match="taken over by node 1 epoch 2"):
        await zombie.append(b"issued after the takeover")
    await taker.close()
    await zombie.close()


async def test_write_after_the_lease_ran_out_reads_the_header(wal_path: Path, open_wal) -> None:
    # Separate clocks: the taker's wait does not move the zombie's, so only the zombie's own
    # lease check (its lease ran out) stands between it and an acknowledgement after the fence.
    zombie_clock, taker_clock = ManualClock(), ManualClock()
    zombie, _ = await open_wal(wal_path, epoch=1, clock=zombie_clock)
    await zombie.append(b"under the lease")
    zombie_clock.advance(zombie.fence_lease_s)
    taker, _ = await open_wal(wal_path, epoch=2, mode=WalMode.FAILOVER, clock=taker_clock)
    with pytest.raises(FencedError):
        await zombie.append(b"after the lease ran out")
    assert zombie.fence_reads == 2
    await taker.close()
    await zombie.close()


async def test_lease_spares_header_reads_and_zero_reads_every_group(
    wal_path: Path, open_wal
) -> None:
    clock = ManualClock()
    wal, _ = await open_wal(wal_path, epoch=1, clock=clock)
    for index in range(10):
        await wal.append(b"record %d" % index)
    assert wal.fence_reads == 1  # one read, then nine groups under its lease
    await wal.close()
    every, _ = await open_wal(wal_path, epoch=2, clock=clock, fence_lease_s=0)
    for index in range(10):
        await every.append(b"record %d" % index)
    assert every.fence_reads == 10
    await every.close()


async def test_clean_close_gives_the_lease_back(wal_path: Path, open_wal) -> None:
    clock = ManualClock()
    owner, _ = await open_wal(wal_path, epoch=1, clock=clock)
    await owner.append(b"x")
    header = HeaderSlot.decode(wal_path.read_bytes()[:BLOCK_BYTES])
    other = HeaderSlot.decode(wal_path.read_bytes()[BLOCK_BYTES : 2 * BLOCK_BYTES])
    newest = max(header, other, key=lambda slot: slot.sequence)
    assert (newest.version, newest.fence_lease_us) == (FORMAT_VERSION, 20_000)
    await owner.close()
    slots = wal_path.read_bytes()[: 2 * BLOCK_BYTES]
    header, _ = pick_header([slots[:BLOCK_BYTES], slots[BLOCK_BYTES:]])
    assert header is not None and header.fence_lease_us == 0
    started = clock.monotonic()
    successor, records = await open_wal(wal_path, epoch=2, clock=clock)
    assert clock.monotonic() == started  # nothing to wait for
    assert [record.data for record in records] == [b"x"]
    await successor.close()


class _HeldHeaderRead:
    """Holds the result of the WAL's next fence read until :meth:`release`: the read has looked
    at the header, and its answer is still on its way (a read under way)."""

    def __init__(self, wal: EbsWal) -> None:
        self._original = wal._read_header
        self.entered = asyncio.Event()
        self._gate = asyncio.Event()
        self._held = False
        wal._read_header = self._read  # type: ignore[method-assign]

    async def _read(self) -> HeaderSlot:
        header = await self._original()
        if not self._held:
            self._held = True
            self.entered.set()
            await self._gate.wait()
        return header

    def release(self) -> None:
        self._gate.set()


async def _until_waiting_for_fence(wal: EbsWal, count: int) -> None:
    async with asyncio.timeout(10):
        while len(wal._fence_waiters) < count:
            await asyncio.sleep(0.001)


async def test_read_under_way_acknowledges_writes_durable_within_its_lease(
    wal_path: Path, open_wal
) -> None:
    clock = ManualClock()
    wal, _ = await open_wal(wal_path, epoch=1, clock=clock)
    await wal.append(b"first")
    clock.advance(wal.fence_lease_s)  # the lease ran out: the next group reads the header
    held = _HeldHeaderRead(wal)
    reads = wal.fence_reads
    first = asyncio.ensure_future(wal.append(b"a"))
    await held.entered.wait()
    second = asyncio.ensure_future(wal.append(b"b"))
    clock.advance(wal.fence_lease_s / 2)  # b is sealed and durable within the read's lease
    await _until_waiting_for_fence(wal, 1)
    held.release()
    offsets = await asyncio.gather(first, second)
    assert offsets[0] < offsets[1]
    assert wal.fence_reads == reads + 1  # b needed no read of its own
    await wal.close()


async def test_write_durable_after_the_lease_of_the_read_under_way_waits_for_the_next_read(
    wal_path: Path, open_wal
) -> None:
    # The read under way saw this writer the owner, but b was durable after the lease that read
    # gives; a FAILOVER completed meanwhile, so only a's acknowledgement is safe.
    clock = ManualClock()
    zombie, _ = await open_wal(wal_path, epoch=1, clock=clock)
    await zombie.append(b"first")
    clock.advance(zombie.fence_lease_s)
    held = _HeldHeaderRead(zombie)
    reads = zombie.fence_reads
    first = asyncio.ensure_future(zombie.append(b"a"))
    await held.entered.wait()
    second = asyncio.ensure_future(zombie.append(b"b"))
    clock.advance(zombie.fence_lease_s * 1.5)
    await _until_waiting_for_fence(zombie, 1)
    taker, recovered = await open_wal(wal_path, epoch=2, mode=WalMode.FAILOVER, clock=ManualClock())
    held.release()
    offset = await first
    with pytest.raises(FencedError, match="taken over by node 1 epoch 2"):
        await second
    assert zombie.fence_reads == reads + 2
    assert offset in [record.offset for record in recovered]
    await taker.close()
    await zombie.close()


@pytest.mark.parametrize("lease_s", [-0.5, 10.5])
def test_an_out_of_range_fence_lease_is_refused_before_the_file_is_touched(
    tmp_path: Path, lease_s: float
) -> None:
    with pytest.raises(InvalidArgument, match=r"wal.fence_lease: between 0 and 10 s"):
        EbsWal(tmp_path / "wal.img", capacity_bytes=1 << 20, fence_lease_s=lease_s)
    assert not (tmp_path / "wal.img").exists()
