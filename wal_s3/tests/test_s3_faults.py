"""Injected S3 faults (through the fault proxy in front of moto): PUT failures, writes that
succeed but are reported failed, dropped connections and 503 bursts — nothing acknowledged is
lost, and appends resume when the faults stop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from walstream.errors import AmbiguousError, WalstreamError
from walstream.wal import WalMode
from walstream_wal_s3.client import RetryPolicy


async def recover_all(make_wal: Any, epoch: int) -> dict[int, bytes]:
    wal = make_wal()
    await wal.start(7, epoch, WalMode.READ_WRITE)
    records = {record.offset: record.data async for record in wal.recover()}
    await wal.close()
    return records


async def append_many(wal: Any, count: int, tag: str) -> dict[int, bytes]:
    async def one(index: int) -> tuple[int, bytes]:
        data = f"{tag}-{index}".encode() * 8
        return await wal.append(data), data

    acked: dict[int, bytes] = {}
    for first in range(0, count, 50):
        for offset, data in await asyncio.gather(*(one(i) for i in range(first, first + 50))):
            acked[offset] = data
    return acked


@pytest.mark.slow
async def test_s3_wal_rides_through_put_failures(make_wal: Any, fault_proxy: Any) -> None:
    wal = make_wal(fault_proxy.endpoint_url, max_inflight=4, max_batch_bytes=256)
    await wal.start(7, 1, WalMode.READ_WRITE)
    assert [record async for record in wal.recover()] == []
    fault_proxy.configure(
        seed=11, path_contains="/wal/7/data/", fail_rate=0.10,
        written_but_failed_rate=0.05, drop_after_write_rate=0.03,
    )
    acked = await append_many(wal, 400, "faulty")
    stats = fault_proxy.stats()
    assert stats.get("failed", 0) > 0 and stats.get("written_but_failed", 0) > 0
    fault_proxy.clear()
    acked.update(await append_many(wal, 50, "clean"))
    await wal.close()
    recovered = await recover_all(make_wal, 2)
    assert all(recovered.get(offset) == data for offset, data in acked.items())


@pytest.mark.slow
async def test_s3_wal_rides_through_throttling_bursts(make_wal: Any, fault_proxy: Any) -> None:
    wal = make_wal(fault_proxy.endpoint_url)
    await wal.start(7, 1, WalMode.READ_WRITE)
    _ = [record async for record in wal.recover()]
    acked: dict[int, bytes] = {}
    for burst in range(3):
        fault_proxy.configure(methods=["PUT", "GET"], path_contains="/wal/7/", throttle_next=6)
        acked.update(await append_many(wal, 100, f"burst{burst}"))
        assert fault_proxy.stats()["throttled"] == 6
    await wal.close()
    recovered = await recover_all(make_wal, 2)
    assert all(recovered.get(offset) == data for offset, data in acked.items())


async def test_s3_wal_fails_closed_then_resumes_after_restart(
    make_wal: Any, fault_proxy: Any
) -> None:
    patience = {"retry": RetryPolicy(max_attempts=3, base_delay_s=0.001)}
    wal = make_wal(fault_proxy.endpoint_url, settings=patience)
    await wal.start(7, 1, WalMode.READ_WRITE)
    _ = [record async for record in wal.recover()]
    acked = await append_many(wal, 100, "before")
    fault_proxy.configure(path_contains="/wal/7/data/", written_but_failed_rate=1.0)
    with pytest.raises(AmbiguousError):
        await wal.append(b"written, reported failed every time")
    with pytest.raises(WalstreamError):
        wal.append(b"refused after a failure")  # a hole is never followed by an ack
    await wal.close()
    fault_proxy.clear()

    restarted = make_wal(fault_proxy.endpoint_url)
    await restarted.start(7, 2, WalMode.READ_WRITE)
    recovered = {record.offset: record.data async for record in restarted.recover()}
    assert all(recovered.get(offset) == data for offset, data in acked.items())
    acked.update(await append_many(restarted, 50, "after"))  # appends resume
    await restarted.close()
    final = await recover_all(make_wal, 3)
    assert all(final.get(offset) == data for offset, data in acked.items())
