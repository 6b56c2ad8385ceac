"""The post-write fence check of a chunk write: a writer whose epoch was superseded while it kept
running (a zombie) acknowledges nothing more, although its chunk PUT itself succeeds (a PUT
cannot be conditional on another object). Runs on in-memory zones, so it is fast and exact."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from walstream.clock import Clock, ManualClock
from walstream.errors import FencedError, InvalidArgument
from walstream.wal import WalMode
from walstream_wal_s3.client import S3Settings
from walstream_wal_s3.testing.latency import LatencyModel
from walstream_wal_s3.testing.memory_s3 import MemoryBucket, MemoryS3Client
from walstream_wal_s3express import ZONE_RETRY, S3ExpressWal, ZonalBucketReplica

ZONES = ("use1-az4", "use1-az5", "use1-az6")


def wal_on(
    buckets: list[MemoryBucket], fence_lease_s: float = 0.5, clock: Clock | None = None
) -> S3ExpressWal:
    replicas = []
    for zone, bucket in zip(ZONES, buckets, strict=True):
        settings = S3Settings(
            bucket=f"wal--{zone}--x-s3",
            endpoint_url="http://memory.invalid",
            region="us-east-1",
            access_key_id="walstream-test",
            secret_access_key="walstream-test",
            retry=ZONE_RETRY,
        )
        replicas.append(
            ZonalBucketReplica(
                MemoryS3Client(settings, bucket),
                node_id=1,
                name=zone,
                fence_lease_s=fence_lease_s,
                clock=clock,
            )
        )
    return S3ExpressWal(replicas, log_id="node-1", write_quorum=2, request_timeout_s=5.0)


@pytest.mark.slow
async def test_a_superseded_writer_acknowledges_nothing_and_loses_no_ack() -> None:
    buckets = [MemoryBucket(LatencyModel(0.5, 1.0, seed=zone)) for zone in range(3)]
    zombie = wal_on(buckets)
    await zombie.start(1, 1, WalMode.READ_WRITE)
    _ = [record async for record in zombie.recover()]
    acked = [await zombie.append(f"a{index}".encode()) for index in range(3)]

    owner = wal_on(buckets)
    await owner.start(1, 2, WalMode.FAILOVER)
    recovered = [(record.offset, record.data) async for record in owner.recover()]
    assert recovered == list(zip(acked, [b"a0", b"a1", b"a2"], strict=True))

    puts_before = sum(bucket.requests.get("put_object", 0) for bucket in buckets)
    with pytest.raises(FencedError, match="epoch"):
        await zombie.append(b"after the takeover")
    # The zombie's chunk did reach the zones: only the check after it refused the ack.
    assert sum(bucket.requests.get("put_object", 0) for bucket in buckets) > puts_before
    with pytest.raises(FencedError):
        await zombie.append(b"and nothing later either")
    await zombie.close()
    await owner.close()

    reader = wal_on(buckets)
    await reader.start(1, 3, WalMode.FAILOVER)
    assert [(record.offset, record.data) async for record in reader.recover()] == recovered
    await reader.close()


@pytest.mark.slow
async def test_a_claim_waits_out_the_lease_of_a_writer_acknowledging_under_it() -> None:
    # The zombie's lease comes from checks that ran before the new claim's successor markers
    # existed; its chunk lands on the zones after they exist and is acknowledged under the
    # lease. The claim must list the zones only after that lease ran out, or the recovery
    # loses an acknowledged record.
    buckets = [MemoryBucket(LatencyModel(0.5, 1.0, seed=zone)) for zone in range(3)]
    zombie = wal_on(buckets, fence_lease_s=3.0)
    await zombie.start(1, 1, WalMode.READ_WRITE)
    _ = [record async for record in zombie.recover()]
    first = await zombie.append(b"first")
    gate = asyncio.Event()
    for replica in zombie.replicas:
        create = replica._create  # type: ignore[attr-defined]

        async def held_create(key: str, data: bytes, create=create) -> bool:  # type: ignore[no-untyped-def]
            if "/chunks/" in key:
                await gate.wait()
            return bool(await create(key, data))

        replica._create = held_create  # type: ignore[attr-defined]
    write = asyncio.ensure_future(zombie.append(b"acknowledged under the lease"))
    owner = wal_on(buckets)
    takeover = asyncio.create_task(owner.start(1, 2, WalMode.FAILOVER))
    while sum(any("successor/" in key for key in bucket.objects) for bucket in buckets) < 2:
        assert not takeover.done()
        await asyncio.sleep(0.005)
    # Well after the markers exist (a claim that did not wait would have listed by now),
    # within the zombie's lease.
    await asyncio.sleep(0.5)
    gate.set()
    second = await write
    await takeover
    recovered = [(record.offset, record.data) async for record in owner.recover()]
    assert recovered == [(first, b"first"), (second, b"acknowledged under the lease")]
    await owner.close()
    await zombie.close()


async def test_a_claim_records_the_longer_of_its_lease_and_the_superseded_one() -> None:
    # A writer with a long lease is superseded by a claimant with a short one, which might
    # crash before its wait is over: the long lease may still run then, so the next claim
    # waits it out too.
    clock = ManualClock()
    buckets = [MemoryBucket() for _ in range(3)]
    writer = wal_on(buckets, fence_lease_s=3.0, clock=clock)
    await writer.start(1, 1, WalMode.READ_WRITE)
    _ = [record async for record in writer.recover()]
    await writer.append(b"a")
    claimant = wal_on(buckets, fence_lease_s=0.1, clock=clock)
    await claimant.start(1, 2, WalMode.FAILOVER)  # as if it crashed right after this
    before = clock.monotonic()
    successor = wal_on(buckets, fence_lease_s=0.1, clock=clock)
    await successor.start(1, 3, WalMode.FAILOVER)
    assert clock.monotonic() - before >= 3.0 * 1.25
    assert [record.data async for record in successor.recover()] == [b"a"]
    for wal in (successor, claimant, writer):
        await wal.close()


@pytest.mark.parametrize("lease_s", [-1.0, 61.0])
def test_a_zone_refuses_an_out_of_range_fence_lease(lease_s: float) -> None:
    with pytest.raises(InvalidArgument, match=r"wal.fence_lease: between 0 and 60 s"):
        ZonalBucketReplica(cast(Any, None), fence_lease_s=lease_s)
