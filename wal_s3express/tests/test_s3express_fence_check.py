"""The post-write fence check of a chunk write: a writer whose epoch was superseded while it kept
running (a zombie) acknowledges nothing more, although its chunk PUT itself succeeds (a PUT
cannot be conditional on another object). Runs on in-memory zones, so it is fast and exact."""

from __future__ import annotations

import pytest
from walstream.errors import FencedError
from walstream.wal import WalMode
from walstream_wal_s3.client import S3Settings
from walstream_wal_s3.testing.latency import LatencyModel
from walstream_wal_s3.testing.memory_s3 import MemoryBucket, MemoryS3Client
from walstream_wal_s3express import ZONE_RETRY, S3ExpressWal, ZonalBucketReplica

ZONES = ("use1-az4", "use1-az5", "use1-az6")


def wal_on(buckets: list[MemoryBucket]) -> S3ExpressWal:
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
        replicas.append(ZonalBucketReplica(MemoryS3Client(settings, bucket), node_id=1, name=zone))
    return S3ExpressWal(replicas, log_id="node-1", write_quorum=2, request_timeout_s=5.0)


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
