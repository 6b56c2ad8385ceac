"""S3ObjectStore against a moto S3 server: every ObjectStore invariant, multipart, conditional
writes, throttling and error translation."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from walstream.config import BuildContext, validate_options
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    ConfigError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    Throttled,
    WalstreamError,
)
from walstream_wal_s3.client import RetryPolicy
from walstream_wal_s3.factories import S3_OBJECT_STORE
from walstream_wal_s3.objects import S3ObjectStore

MiB = 1 << 20


def pattern(size: int, seed: int = 0) -> bytes:
    block = bytes((seed + index) % 251 for index in range(4096))
    return (block * (size // len(block) + 1))[:size]


async def list_multipart_uploads(store: S3ObjectStore) -> list[Any]:
    response = await store.client.call("list_multipart_uploads")
    return list(response.get("Uploads", []))


async def test_s3_put_get_roundtrip_and_overwrite(make_store: Any) -> None:
    store = make_store()
    await store.put("a/1", b"first")
    assert await store.get("a/1") == b"first"
    await store.put("a/1", b"second version")
    assert await store.get("a/1") == b"second version"
    await store.put("empty", b"")
    assert await store.get("empty") == b""
    await store.close()


async def test_s3_ranged_get(make_store: Any) -> None:
    store = make_store()
    data = pattern(1000)
    await store.put("r", data)
    assert await store.get("r", 10, 20) == data[10:20]
    assert await store.get("r", 990) == data[990:]
    assert await store.get("r", 900, 5000) == data[900:]
    assert await store.get("r", 1000) == b""
    assert await store.get("r", 2000, 3000) == b""
    assert await store.get("r", 50, 50) == b""
    assert await store.get("r", -7) == data[-7:]
    assert await store.get("r", -5000) == data
    await store.put("empty", b"")
    assert await store.get("empty", -3) == b""
    assert await store.get("empty", 1, 4) == b""
    with pytest.raises(InvalidArgument):
        await store.get("r", -5, 10)
    with pytest.raises(NotFound):
        await store.get("missing", 3, 3)
    await store.close()


async def test_s3_head_and_not_found(make_store: Any) -> None:
    store = make_store()
    await store.put("h", b"12345")
    meta = await store.head("h")
    assert (meta.key, meta.size) == ("h", 5)
    with pytest.raises(NotFound):
        await store.head("nope")
    with pytest.raises(NotFound):
        await store.get("nope")
    await store.close()


async def test_s3_prefix_isolates_keys(make_store: Any) -> None:
    tenant_a = make_store(settings={"prefix": "tenant-a"})
    tenant_b = make_store(settings={"prefix": "tenant-b/"})
    await tenant_a.put("k", b"a")
    await tenant_b.put("k", b"b")
    assert await tenant_a.get("k") == b"a"
    assert [meta.key async for meta in tenant_b.list()] == ["k"]
    await tenant_a.close()
    await tenant_b.close()


@pytest.mark.slow
async def test_s3_list_paginates_and_delete_batches(make_store: Any) -> None:
    store = make_store()
    keys = [f"p/{index:05d}" for index in range(1203)]
    gate = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with gate:
            await store.put(key, key.encode())

    await asyncio.gather(*(put(key) for key in keys))
    await store.put("q/other", b"x")
    listed = [meta.key async for meta in store.list("p/")]
    assert listed == keys  # every key once, in order, across two pages
    assert store.client.request_counts["list_objects_v2"] == 2
    await store.delete([*keys, "p/never-existed"])
    assert store.client.request_counts["delete_objects"] == 2  # <= 1000 keys a call
    assert [meta.key async for meta in store.list("p/")] == []
    await store.delete(keys)  # idempotent
    assert [meta.key async for meta in store.list()] == ["q/other"]
    await store.close()


@pytest.mark.slow
async def test_s3_put_if_absent_single_and_race(make_store: Any) -> None:
    store = make_store()
    await store.put_if_absent("once", b"winner")
    with pytest.raises(PreconditionFailed):
        await store.put_if_absent("once", b"loser")
    assert await store.get("once") == b"winner"
    assert store.capabilities.conditional_put is True

    racers = [make_store() for _ in range(12)]
    for racer in racers:
        await racer.ensure_probed()

    async def create(index: int) -> int | None:
        try:
            await racers[index].put_if_absent("race", f"creator-{index}".encode())
            return index
        except PreconditionFailed:
            return None

    for round_number in range(3):
        await store.delete(["race"])
        results = await asyncio.gather(*(create(index) for index in range(len(racers))))
        winners = [index for index in results if index is not None]
        assert len(winners) == 1, f"round {round_number}: winners {winners}"
        assert await store.get("race") == f"creator-{winners[0]}".encode()
    for racer in racers:
        await racer.close()
    await store.close()


@pytest.mark.slow
async def test_s3_multipart_put_uploads_parts_concurrently(
    make_store: Any, fault_proxy: Any
) -> None:
    store = make_store(
        fault_proxy.endpoint_url,
        multipart_threshold_bytes=5 * MiB,
        multipart_part_bytes=5 * MiB,
        part_concurrency=4,
    )
    fault_proxy.configure(path_contains="partNumber=", latency_p50_ms=150, latency_p99_ms=160)
    data = pattern(17 * MiB, seed=3)
    await store.put("big", data)
    stats = fault_proxy.stats()
    assert stats["matched"] == 4  # four parts: 5 + 5 + 5 + 2 MiB
    assert stats["max_concurrent"] >= 2  # parts overlapped in flight
    assert await store.get("big") == data
    assert (await store.head("big")).size == len(data)
    assert await store.get("big", 5 * MiB - 3, 5 * MiB + 3) == data[5 * MiB - 3 : 5 * MiB + 3]
    await store.close()


async def test_s3_multipart_aborted_on_part_failure(make_store: Any, fault_proxy: Any) -> None:
    store = make_store(
        fault_proxy.endpoint_url,
        multipart_threshold_bytes=5 * MiB,
        multipart_part_bytes=5 * MiB,
        settings={"retry": RetryPolicy(max_attempts=2, base_delay_s=0.001)},
    )
    fault_proxy.configure(path_contains="partNumber=3", fail_rate=1.0)
    # A 500 on a write may hide an applied write: ambiguous for that part, and the upload is
    # aborted so nothing is published either way.
    with pytest.raises(AmbiguousError):
        await store.put("doomed", pattern(16 * MiB))
    fault_proxy.clear()
    with pytest.raises(NotFound):
        await store.head("doomed")
    assert await list_multipart_uploads(store) == []
    await store.close()


async def test_s3_writer_publishes_on_close_and_leaves_nothing_on_abort(make_store: Any) -> None:
    store = make_store(multipart_part_bytes=5 * MiB)
    data = pattern(11 * MiB + 123, seed=7)
    writer = store.writer("streamed")
    for first in range(0, len(data), 1 * MiB):
        await writer.write(data[first : first + 1 * MiB])
    with pytest.raises(NotFound):
        await store.head("streamed")  # nothing visible before close
    meta = await writer.close()
    assert meta.size == len(data)
    assert await store.get("streamed") == data

    async with store.writer("small") as small:
        await small.write(b"tiny")
    assert await store.get("small") == b"tiny"

    aborted = store.writer("aborted")
    await aborted.write(pattern(6 * MiB))
    await aborted.abort()
    with pytest.raises(NotFound):
        await store.head("aborted")
    assert await list_multipart_uploads(store) == []

    with pytest.raises(RuntimeError):
        async with store.writer("failed-body") as failing:
            await failing.write(pattern(6 * MiB))
            raise RuntimeError("producer crashed")
    with pytest.raises(NotFound):
        await store.head("failed-body")
    assert await list_multipart_uploads(store) == []
    await store.close()


async def test_s3_throttling_is_retried_then_typed(make_store: Any, fault_proxy: Any) -> None:
    store = make_store(fault_proxy.endpoint_url)
    fault_proxy.configure(methods=["PUT", "GET"], throttle_next=4)
    await store.put("t", b"through the burst")
    assert fault_proxy.stats()["throttled"] == 4
    assert await store.get("t") == b"through the burst"

    impatient = make_store(
        fault_proxy.endpoint_url,
        settings={"retry": RetryPolicy(max_attempts=3, throttle_base_delay_s=0.001)},
    )
    fault_proxy.configure(methods=["GET"], throttle_next=50)
    with pytest.raises(Throttled):
        await impatient.get("t")
    await impatient.close()
    await store.close()


async def test_s3_written_but_reported_failed_put_if_absent_resolves(
    make_store: Any, fault_proxy: Any
) -> None:
    store = make_store(fault_proxy.endpoint_url)
    await store.ensure_probed()
    fault_proxy.configure(written_but_failed_next=1)
    await store.put_if_absent("mine", b"token-1")  # our own first attempt created it
    assert await store.get("mine") == b"token-1"
    fault_proxy.configure(written_but_failed_next=1)
    other = make_store()
    await other.put_if_absent("theirs", b"token-2")
    with pytest.raises(PreconditionFailed):
        await store.put_if_absent("theirs", b"token-3")
    await other.close()
    await store.close()


async def test_s3_probe_detects_ignored_conditional_writes(
    make_store: Any, fault_proxy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fault_proxy.configure(ignore_conditional=True)
    lenient = make_store(fault_proxy.endpoint_url)
    with caplog.at_level(logging.WARNING):
        await lenient.put_if_absent("k", b"1")
    assert lenient.capabilities.conditional_put is False
    assert "ignores conditional writes" in caplog.text
    # Even where the header is ignored, an existing object is never replaced.
    with pytest.raises(PreconditionFailed):
        await lenient.put_if_absent("k", b"2")
    assert await lenient.get("k") == b"1"
    strict = make_store(fault_proxy.endpoint_url, require_conditional_put=True)
    with pytest.raises(ConfigError):
        await strict.put_if_absent("k2", b"1")
    fault_proxy.clear()
    honest = make_store(fault_proxy.endpoint_url, require_conditional_put=True)
    assert await honest.ensure_probed() is True
    for store in (lenient, strict, honest):
        await store.close()


async def test_s3_errors_are_typed(make_store: Any, s3_bucket: Any) -> None:
    unreachable = make_store(
        "http://127.0.0.1:9", settings={"retry": RetryPolicy(max_attempts=2, base_delay_s=0.001)}
    )
    with pytest.raises(BackendUnavailable):
        await unreachable.put("k", b"v")
    no_bucket = make_store(settings={"bucket": "no-such-bucket"})
    # A missing bucket is a configuration error (retrying cannot help), named with its fix.
    with pytest.raises(ConfigError, match="create_bucket"):
        await no_bucket.get("k")
    with pytest.raises(ConfigError, match="no-such-bucket"):
        await no_bucket.check()
    for store in (unreachable, no_bucket):
        with pytest.raises(WalstreamError):
            await store.head("k")
        await store.close()


async def test_s3_factory_options_and_create_bucket(s3_bucket: Any) -> None:
    section = s3_bucket.options(
        bucket="made-on-demand", create_bucket=True, multipart_threshold="32MiB"
    )
    store = S3_OBJECT_STORE.build(section, BuildContext(), "object_store")
    assert store.multipart_threshold_bytes == 32 * MiB
    await store.put("k", b"v")
    assert await store.get("k") == b"v"
    await store.close()
    with pytest.raises(ConfigError, match=r"object_store\.multipart_part_size"):
        validate_options(
            S3_OBJECT_STORE,
            s3_bucket.options(multipart_part_size="1MiB"),
            BuildContext().base_dir,
            "object_store",
        )
    with pytest.raises(ConfigError, match=r"object_store\.bucket"):
        validate_options(S3_OBJECT_STORE, {}, BuildContext().base_dir, "object_store")


@pytest.mark.slow
async def test_s3_multipart_put_if_absent_never_replaces_an_existing_object(
    make_store: Any,
) -> None:
    store = make_store(multipart_threshold_bytes=5 * MiB, multipart_part_bytes=5 * MiB)
    first = pattern(11 * MiB, seed=1)
    await store.put_if_absent("big-once", first)
    assert await store.get("big-once") == first
    with pytest.raises(PreconditionFailed):
        await store.put_if_absent("big-once", pattern(11 * MiB, seed=2))
    assert await store.get("big-once") == first
    assert await list_multipart_uploads(store) == []
    await store.close()


async def test_s3_conditional_writer_never_replaces_an_existing_object(make_store: Any) -> None:
    store = make_store(multipart_part_bytes=5 * MiB)
    await store.put("w-taken", b"first")
    writer = store.writer("w-taken", if_absent=True)
    await writer.write(pattern(6 * MiB))  # one full part: a multipart upload
    with pytest.raises(PreconditionFailed):
        await writer.close()
    assert await store.get("w-taken") == b"first"
    assert await list_multipart_uploads(store) == []
    await store.close()


@pytest.mark.parametrize("endpoint", ["127.0.0.1:9000", "localhost", "ftp://host", "http://"])
def test_endpoint_url_without_an_http_scheme_is_a_config_error(endpoint: str) -> None:
    from walstream.errors import ConfigError
    from walstream_wal_s3.client import S3Settings

    with pytest.raises(ConfigError, match=r"endpoint_url: .* http:// or https://"):
        S3Settings(bucket="data", endpoint_url=endpoint)
    assert S3Settings(bucket="data", endpoint_url="http://127.0.0.1:9000").endpoint_url


async def test_s3_stores_share_the_parsed_service_model(make_store: Any) -> None:
    """Each store has its own botocore session (credentials, configuration) but not its own copy
    of S3's service model: a second store of the process, e.g. the one a failover opens for a
    dead node's WAL, does not parse it again."""
    first, second = make_store(), make_store()
    await first.put("shared-model/a", b"a")
    await second.put("shared-model/b", b"b")
    sessions = (first.client._session, second.client._session)
    assert sessions[0] is not sessions[1]
    loaders = [session.get_component("data_loader") for session in sessions]
    assert loaders[0] is loaders[1]
    assert await second.get("shared-model/a") == b"a"
    await first.close()
    await second.close()
