"""The WriteAheadLog invariants (walstream.wal docstring), one test each, on a real file."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from walstream.errors import (
    BackendUnavailable,
    CapacityError,
    FencedError,
    InvalidArgument,
    WalstreamError,
)
from walstream.wal import WalMode
from walstream_wal_ebs import EbsWal


def payloads(count: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([0, 1, 17, 1000, 4072, 4096, 10_000])) for _ in range(count)]


async def test_ack_order(wal_path: Path, open_wal) -> None:
    wal, _ = await open_wal(wal_path, max_inflight=8)
    completed: list[int] = []
    futures = []
    for index, data in enumerate(payloads(300)):
        future = wal.append(data)
        future.add_done_callback(lambda _f, index=index: completed.append(index))
        futures.append(future)
    offsets = await asyncio.gather(*futures)
    assert completed == list(range(300))
    assert offsets == sorted(offsets) and len(set(offsets)) == 300
    await wal.close()


async def test_acked_recovered(wal_path: Path, open_wal) -> None:
    wal, _ = await open_wal(wal_path)
    data = payloads(200)
    offsets = await asyncio.gather(*(wal.append(item) for item in data))
    await wal.close()
    reopened, records = await open_wal(wal_path, epoch=2)
    assert [record.offset for record in records] == offsets
    assert [record.data for record in records] == data
    await reopened.close()


async def test_a_group_mixing_small_and_large_records_is_recovered_byte_for_byte(
    wal_path: Path, open_wal
) -> None:
    """Small records are joined with their headers before one copy into the group's buffer,
    large ones copied into it directly; any mix of the two in one group must come back exactly,
    each at its offset."""
    rng = random.Random(11)
    sizes = [3, 20_000, 0, 5, 70_000, 16_383, 16_384, 1, 40_000, 2, 2]
    data = [rng.randbytes(size) for size in sizes]
    wal, _ = await open_wal(wal_path, capacity_bytes=4 << 20)
    offsets = await asyncio.gather(*(wal.append(item) for item in data))  # one group
    await wal.close()
    reopened, records = await open_wal(wal_path, epoch=2, capacity_bytes=4 << 20)
    assert [(record.offset, record.data) for record in records] == list(
        zip(offsets, data, strict=True)
    )
    await reopened.close()


async def test_recover_order_exactly_once(wal_path: Path, open_wal) -> None:
    expected: list[tuple[int, bytes]] = []
    for epoch in range(1, 5):
        wal, records = await open_wal(wal_path, epoch=epoch)
        assert [(r.offset, r.data) for r in records] == expected
        batch = payloads(40, seed=epoch)
        offsets = await asyncio.gather(*(wal.append(item) for item in batch))
        expected += list(zip(offsets, batch, strict=True))
        await wal.close()
    reader, records = await open_wal(wal_path, epoch=9, mode=WalMode.READ_ONLY)
    assert [(r.offset, r.data) for r in records] == expected
    await reader.close()


async def test_offsets_increase(wal_path: Path, open_wal) -> None:
    last = -1
    for epoch in range(1, 6):
        wal, _ = await open_wal(wal_path, epoch=epoch)
        for data in payloads(10, seed=epoch):
            offset = await wal.append(data)
            assert offset > last
            last = offset
        await wal.close()


async def test_trim_inclusive(wal_path: Path, open_wal) -> None:
    wal, _ = await open_wal(wal_path)
    data = payloads(50)
    offsets = await asyncio.gather(*(wal.append(item) for item in data))
    await wal.trim(offsets[19])
    await wal.trim(offsets[19])  # idempotent
    await wal.trim(offsets[5])  # never backwards
    await wal.close()
    wal, records = await open_wal(wal_path, epoch=2)
    assert [r.offset for r in records] == offsets[20:]
    assert [r.data for r in records] == data[20:]
    with pytest.raises(InvalidArgument):
        await wal.trim(offsets[-1] + 10**12)
    await wal.trim(offsets[-1])
    await wal.close()
    wal, records = await open_wal(wal_path, epoch=3)
    assert records == []
    await wal.close()


async def test_reset(wal_path: Path, open_wal) -> None:
    wal, _ = await open_wal(wal_path)
    offsets = await asyncio.gather(*(wal.append(item) for item in payloads(30)))
    await wal.close()
    wal = EbsWal(wal_path, capacity_bytes=1 << 20)
    await wal.start(1, 2, WalMode.READ_WRITE)
    await wal.reset()
    new_offset = await wal.append(b"after reset")
    assert new_offset > max(offsets)
    await wal.close()
    wal, records = await open_wal(wal_path, epoch=3)
    assert [(r.offset, r.data) for r in records] == [(new_offset, b"after reset")]
    await wal.reset()
    await wal.close()
    wal, records = await open_wal(wal_path, epoch=4)
    assert records == []
    await wal.close()


async def test_capacity(wal_path: Path, open_wal) -> None:
    wal, _ = await open_wal(wal_path, capacity_bytes=256 << 10, capacity_wait_s=0.3)
    with pytest.raises(CapacityError):
        wal.append(bytes(wal.capabilities.max_record_bytes + 1))
    record = bytes(30_000)
    acked = []
    with pytest.raises(CapacityError):
        for _ in range(20):
            acked.append(await wal.append(record))
    assert 4 <= len(acked) < 10
    # A trim frees room: appends that wait for it succeed.
    waiting = wal.append(record)
    await asyncio.sleep(0.05)
    await wal.trim(acked[-1])
    assert await waiting > acked[-1]
    await wal.close()


async def test_fencing(wal_path: Path, open_wal) -> None:
    writer, _ = await open_wal(wal_path, epoch=1)
    await writer.append(b"before")
    taker, records = await open_wal(wal_path, epoch=2, mode=WalMode.FAILOVER)
    assert [r.data for r in records] == [b"before"]
    with pytest.raises(FencedError):
        await writer.append(b"zombie")
    await taker.close()
    await writer.close()


async def test_errors_typed(wal_path: Path, open_wal, tmp_path: Path) -> None:
    missing = EbsWal(tmp_path / "absent.img", capacity_bytes=1 << 20, create=False)
    with pytest.raises(BackendUnavailable):
        await missing.start(1, 1, WalMode.READ_WRITE)
    writer, _ = await open_wal(wal_path, epoch=1)
    taker, _ = await open_wal(wal_path, epoch=2, mode=WalMode.FAILOVER)
    first = writer.append(b"x")
    with pytest.raises(FencedError):
        await first
    # After a failed write the WAL refuses every later append (no hole before an ack).
    with pytest.raises(WalstreamError):
        await writer.append(b"y")
    with pytest.raises(FencedError):
        await open_wal(wal_path, epoch=1)
    reader, _ = await open_wal(wal_path, epoch=5, mode=WalMode.READ_ONLY)
    with pytest.raises(InvalidArgument):
        reader.append(b"z")
    for wal in (writer, taker, reader):
        await wal.close()


async def test_close(wal_path: Path, open_wal) -> None:
    wal, _ = await open_wal(wal_path)
    futures = [wal.append(item) for item in payloads(100)]
    await wal.close()
    assert all(future.done() and not future.exception() for future in futures)
    with pytest.raises(InvalidArgument):
        wal.append(b"late")
    reopened, records = await open_wal(wal_path, epoch=2)
    assert [r.offset for r in records] == [future.result() for future in futures]
    await reopened.close()
