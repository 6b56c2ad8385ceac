"""The s3express WAL: configuration, acknowledgements with a zone down or hung, fencing of a
zombie writer, a trim point that survives the loss of any zone."""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import pytest
from walstream.config import BuildContext
from walstream.errors import ConfigError, FencedError, WalstreamError
from walstream.wal import WalMode
from walstream_wal_s3express import S3EXPRESS_WAL
from walstream_wal_s3express.replica import ZonalBucketReplica
from walstream_wal_s3express.testing.zones import ZoneServer


def test_entry_point_names_the_factory() -> None:
    (entry,) = [
        ep
        for ep in importlib.metadata.entry_points(group="walstream.wal")
        if ep.name == "s3express"
    ]
    assert entry.load() is S3EXPRESS_WAL


@pytest.mark.parametrize(
    ("section", "complaint"),
    [
        ({}, "wal.buckets: required"),
        ({"buckets": []}, "one S3 Express directory bucket per zone"),
        ({"buckets": ["plain-bucket"]}, "not a directory bucket name"),
        ({"buckets": ["a--use1-az4--x-s3", "b--use1-az4--x-s3"]}, "same availability zone"),
        ({"buckets": ["a--use1-az4--x-s3", "a--use1-az4--x-s3"]}, "listed twice"),
        (
            {"buckets": ["a--use1-az4--x-s3", "a--use1-az5--x-s3"], "endpoint_urls": ["http://x"]},
            "one endpoint per bucket",
        ),
        ({"buckets": ["a--use1-az4--x-s3"], "write_quorum": 2}, "wal.write_quorum"),
        ({"buckets": ["a--use1-az4--x-s3"], "max_chunk_bytes": "lots"}, "wal.max_chunk_bytes"),
        ({"buckets": ["a--use1-az4--x-s3"], "bukets": []}, "did you mean 'buckets'"),
    ],
)
def test_configuration_errors_name_the_key(section: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint.replace("(", r"\(")):
        S3EXPRESS_WAL.build(section, BuildContext(), "wal")


def test_defaults() -> None:
    wal = S3EXPRESS_WAL.build(
        {"buckets": ["w--use1-az4--x-s3", "w--use1-az5--x-s3", "w--use1-az6--x-s3"]},
        BuildContext(node_id=4),
        "wal",
    )
    assert (wal.replica_count, wal.write_quorum, wal.read_quorum) == (3, 2, 2)
    assert wal.max_group_bytes == 512 * 1024
    assert wal.log_id == "node-4"


@pytest.mark.slow
async def test_appends_acknowledged_while_a_zone_hangs_then_it_catches_up(
    open_shared_wal: Any, shared_zones: list[ZoneServer], wait_for: Any
) -> None:
    # A request timeout far above any append's latency on a loaded machine: an append that
    # waited for the hung zone would take at least this long, one that did not takes
    # milliseconds, so the per-append deadline below tells them apart without racing the load.
    request_timeout_s = 8.0
    wal, _ = await open_shared_wal(
        1, request_timeout=f"{request_timeout_s:g}s", write_timeout=f"{3 * request_timeout_s:g}s"
    )
    acked = [(await wal.append(b"before-%d" % i), b"before-%d" % i) for i in range(20)]
    hung = shared_zones[2]
    hung.freeze()
    try:
        for index in range(60):
            data = b"hung-%d" % index
            acked.append((await asyncio.wait_for(wal.append(data), request_timeout_s * 0.75), data))
        # its requests time out (bounded) and it is marked for catch-up
        await wait_for(lambda: hung.bucket in wal.lagging_replicas(), request_timeout_s * 3)
    finally:
        hung.thaw()
    await wait_for(lambda: not wal.lagging_replicas(), 15)
    replica = ZonalBucketReplica.from_settings(
        wal._replicas[hung.bucket].replica.client.settings  # type: ignore[attr-defined]
    )
    try:
        listing = await replica.list_chunks(wal.log_id)
    finally:
        await replica.close()
    assert {offset >> 24 for offset, _ in acked} <= set(listing.chunks)
    await wal.close()
    _, recovered = await open_shared_wal(2)
    assert [(record.offset, record.data) for record in recovered] == acked


@pytest.mark.slow
async def test_zombie_gets_no_ack_after_a_new_owner_claimed(open_shared_wal: Any) -> None:
    zombie, _ = await open_shared_wal(1)
    acked = [(await zombie.append(b"old-%d" % i), b"old-%d" % i) for i in range(10)]
    owner, recovered = await open_shared_wal(2, mode=WalMode.FAILOVER)
    assert [(record.offset, record.data) for record in recovered] == acked
    late_results = await asyncio.gather(
        *(zombie.append(b"late-%d" % i) for i in range(20)), return_exceptions=True
    )
    assert all(isinstance(result, WalstreamError) for result in late_results), late_results
    assert isinstance(late_results[0], FencedError), late_results[0]
    with pytest.raises(FencedError):
        await zombie.append(b"later")
    await owner.close()
    # the zombie's late chunks never show up: the new owner's seal invalidated them
    _, again = await open_shared_wal(3)
    assert [(record.offset, record.data) for record in again] == acked


@pytest.mark.slow
async def test_trim_point_survives_the_loss_of_any_zone(
    open_wal: Any, zones: list[ZoneServer]
) -> None:
    wal, _ = await open_wal(1)
    records = [(await wal.append(b"r%d" % i), b"r%d" % i) for i in range(30)]
    cut = records[17][0]
    await wal.trim(cut)
    await wal.close()
    epoch = 2
    for down in zones:
        down.freeze()
        try:
            reader, recovered = await open_wal(epoch, mode=WalMode.READ_ONLY)
            await reader.close()
        finally:
            down.thaw()
        epoch += 1
        assert [(record.offset, record.data) for record in recovered] == records[18:], (
            f"with zone {down.zone_id} down"
        )
