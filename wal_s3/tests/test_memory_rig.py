"""The benchmark rig (in-memory bucket behind the real S3 client, in-loop latency model) answers
like S3: the WAL works on it and its errors are S3's."""

from __future__ import annotations

import pytest
from walstream.errors import BackendUnavailable, FencedError, NotFound, PreconditionFailed
from walstream.wal import WalMode
from walstream_wal_s3 import S3ObjectStore, S3Settings, S3Wal
from walstream_wal_s3.client import RetryPolicy
from walstream_wal_s3.testing.latency import LatencyModel
from walstream_wal_s3.testing.memory_s3 import MemoryBucket, MemoryS3Client

SETTINGS = S3Settings(
    bucket="rig",
    endpoint_url="http://memory.invalid",
    region="us-east-1",
    access_key_id="walstream-test",
    secret_access_key="walstream-test",
    retry=RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.01),
)


def store_on(bucket: MemoryBucket) -> S3ObjectStore:
    return S3ObjectStore(SETTINGS, client=MemoryS3Client(SETTINGS, bucket))


async def test_memory_bucket_answers_like_s3() -> None:
    store = store_on(MemoryBucket())
    await store.put_if_absent("a/1", b"one")
    with pytest.raises(PreconditionFailed):
        await store.put_if_absent("a/1", b"other")
    assert await store.get("a/1") == b"one"
    await store.put("a/2", b"0123456789")
    assert await store.get("a/2", 2, 5) == b"234"
    assert await store.get("a/2", -3) == b"789"
    assert await store.get("a/2", 20) == b""
    for index in range(3, 1005):
        await store.put(f"a/{index:04d}", b"")
    listed = [meta.key async for meta in store.list("a/")]
    assert len(listed) == 1004 and listed == sorted(listed)
    assert [meta.key async for meta in store.list("a/", start_after="a/1003", limit=5)] == [
        "a/1004",
        "a/2",
    ]
    await store.delete(["a/1", "a/missing"])
    with pytest.raises(NotFound):
        await store.get("a/1")


@pytest.mark.slow
async def test_wal_on_the_rig_recovers_and_fences() -> None:
    bucket = MemoryBucket(LatencyModel(1.0, 3.0))
    first = S3Wal(store_on(bucket))
    await first.start(1, 1, WalMode.READ_WRITE)
    _ = [record async for record in first.recover()]
    offsets = [await first.append(f"r{index}".encode()) for index in range(5)]
    second = S3Wal(store_on(bucket))
    await second.start(1, 2, WalMode.FAILOVER)
    assert [record.data async for record in second.recover()] == [
        f"r{index}".encode() for index in range(5)
    ]
    with pytest.raises(FencedError):
        await first.append(b"zombie")
    assert offsets == [0, 1, 2, 3, 4]
    await first.close()
    await second.close()


async def test_latency_model_down_is_an_unreachable_endpoint() -> None:
    model = LatencyModel(down=True)
    store = store_on(MemoryBucket(model))
    with pytest.raises(BackendUnavailable, match="cannot connect"):
        await store.put("k", b"v")
    assert model.requests["PUT"] == 2
