"""A zombie writer keeps appending while another node takes its WAL over (FAILOVER)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from walstream.errors import FencedError, WalstreamError
from walstream.wal import WalMode


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
    assert any(isinstance(exc, FencedError) for exc in failures), [repr(exc) for exc in failures][:3]
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
