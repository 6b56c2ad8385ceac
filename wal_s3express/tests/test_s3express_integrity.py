"""Identity (WAL invariant 12) and damage reports (invariant 11) on zone buckets (moto)."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from walstream.config import BuildContext
from walstream.errors import IdentityMismatch
from walstream.wal import WalMode, WalRecord
from walstream.wal.quorum import LogIdentity, encode_chunk, offset_seq
from walstream_wal_s3express import S3EXPRESS_WAL, S3ExpressWal, ZonalBucketReplica
from walstream_wal_s3express.replica import parse_chunk_key
from walstream_wal_s3express.testing.zones import ZoneServer, zone_wal_options

DEPLOYMENT = bytes.fromhex("33333333333333333333333333333333")
OTHER = bytes.fromhex("44444444444444444444444444444444")
LOG = "node-1"
_numbers = itertools.count(1)


@pytest.fixture
def prefix() -> str:
    return f"integrity{next(_numbers)}-{time.monotonic_ns()}"


def build(zones: list[ZoneServer], prefix: str) -> S3ExpressWal:
    section = zone_wal_options(
        zones, prefix=prefix, request_timeout="2s", write_timeout="5s", max_chunk_delay="1ms"
    )
    return S3EXPRESS_WAL.build(section, BuildContext(node_id=1), "wal")


def zone_replicas(wal: S3ExpressWal) -> list[ZonalBucketReplica]:
    return [state.replica for state in wal._replicas.values()]  # type: ignore[misc]


async def write_rounds(
    zones: list[ZoneServer], prefix: str, rounds: int, deployment: bytes = DEPLOYMENT
) -> list[tuple[int, bytes]]:
    wal = build(zones, prefix)
    wal.bind_deployment(deployment)
    await wal.start(1, 1, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    acked: list[tuple[int, bytes]] = []
    for round_index in range(rounds):
        payloads = [f"round {round_index} record {i}".encode() for i in range(3)]
        offsets = await asyncio.gather(*(wal.append(payload) for payload in payloads))
        acked.extend(zip(offsets, payloads, strict=True))
    await wal.close()
    return acked


async def recover(zones: list[ZoneServer], prefix: str, epoch: int) -> list[WalRecord]:
    wal = build(zones, prefix)
    wal.bind_deployment(DEPLOYMENT)
    try:
        await wal.start(1, epoch, WalMode.READ_WRITE)
        return [record async for record in wal.recover()]
    finally:
        await wal.close()


async def chunk_objects(replica: ZonalBucketReplica, prefix: str, seq: int) -> list[str]:
    listed = await replica.client.call("list_objects_v2", Prefix=f"{prefix}/{LOG}/chunks/")
    keys = [item["Key"] for item in listed.get("Contents", [])]
    return [key for key in keys if (parsed := parse_chunk_key(key, 0)) and parsed.seq == seq]


async def damage_chunk(zones: list[ZoneServer], prefix: str, seq: int, count: int) -> None:
    tools = build(zones, prefix)
    try:
        for replica in zone_replicas(tools)[:count]:
            for key in await chunk_objects(replica, prefix, seq):
                response = await replica.client.call("get_object", Key=key, read_body=True)
                data = bytearray(response["Body"])
                data[len(data) // 2] ^= 0x20
                await replica.client.call("put_object", write=True, Key=key, Body=bytes(data))
    finally:
        await tools.close()


async def test_foreign_prefix_is_refused_and_left_unchanged(
    shared_zones: list[ZoneServer], prefix: str
) -> None:
    await write_rounds(shared_zones, prefix, 1, deployment=OTHER)
    wal = build(shared_zones, prefix)
    wal.bind_deployment(DEPLOYMENT)
    with pytest.raises(IdentityMismatch) as caught:
        await wal.start(1, 9, WalMode.READ_WRITE)
    await wal.close()
    message = str(caught.value)
    assert OTHER.hex() in message and DEPLOYMENT.hex() in message and "--x-s3" in message
    tools = build(shared_zones, prefix)
    for replica in zone_replicas(tools):
        listing = await replica.list_chunks(LOG)
        assert listing.claimed_epoch == 1 and listing.identity == LogIdentity(OTHER, 1)
    await tools.close()


@pytest.mark.slow
async def test_foreign_chunk_is_never_yielded(shared_zones: list[ZoneServer], prefix: str) -> None:
    acked = await write_rounds(shared_zones, prefix, 3)
    foreign = encode_chunk([b"not ours"], identity=LogIdentity(OTHER, 1))
    tools = build(shared_zones, prefix)
    for replica in zone_replicas(tools):
        await replica.write_chunk(LOG, 1, offset_seq(acked[-1][0]) + 1, foreign)
    await tools.close()
    recovered = await recover(shared_zones, prefix, 2)
    assert b"not ours" not in [record.data for record in recovered]
    assert [(r.offset, r.data) for r in recovered if not r.is_damage_report] == acked
    report = recovered[-1]
    assert report.is_damage_report and report.damage_before is not None
    assert "belongs to deployment" in report.damage_before.reason


@pytest.mark.slow
async def test_damaged_copies_on_two_zones_are_repaired(
    shared_zones: list[ZoneServer], prefix: str
) -> None:
    acked = await write_rounds(shared_zones, prefix, 3)
    seq = offset_seq(acked[4][0])
    await damage_chunk(shared_zones, prefix, seq, count=2)
    wal = build(shared_zones, prefix)
    wal.bind_deployment(DEPLOYMENT)
    await wal.start(1, 2, WalMode.READ_WRITE)
    recovered = [record async for record in wal.recover()]
    assert [(r.offset, r.data) for r in recovered] == acked
    for _ in range(300):
        if not wal.lagging_replicas():
            break
        await asyncio.sleep(0.02)
    for replica in zone_replicas(wal):
        _, data = await replica.read_chunk(LOG, seq)  # the newest copy verifies again
        assert acked[4][1] in data
    await wal.close()


@pytest.mark.slow
async def test_no_valid_copy_mid_log_is_reported_and_later_records_recovered(
    shared_zones: list[ZoneServer], prefix: str
) -> None:
    acked = await write_rounds(shared_zones, prefix, 4)
    seq = offset_seq(acked[4][0])
    await damage_chunk(shared_zones, prefix, seq, count=3)
    recovered = await recover(shared_zones, prefix, 2)
    lost = [item for item in acked if offset_seq(item[0]) == seq]
    assert [(r.offset, r.data) for r in recovered] == [i for i in acked if i not in lost]
    damaged = [record for record in recovered if record.damage_before is not None]
    assert len(damaged) == 1 and offset_seq(damaged[0].offset) == seq + 1
    damage = damaged[0].damage_before
    assert damage is not None and f"chunk {seq}" in damage.reason
    assert "does not match its checksum" in damage.reason
    again = await recover(shared_zones, prefix, 3)
    assert [r.offset for r in again if r.damage_before is not None] == [damaged[0].offset]


@pytest.mark.slow
async def test_data_of_the_previous_format_is_still_read(
    shared_zones: list[ZoneServer], prefix: str
) -> None:
    """A control state without identity and chunks of format 1, as the previous version wrote
    them, are recovered by a bound WAL, which then records its identity."""
    tools = build(shared_zones, prefix)
    for replica in zone_replicas(tools):
        await replica.claim(LOG, 1)
        for seq in (1, 2):
            await replica.write_chunk(LOG, 1, seq, encode_chunk([b"old %d" % seq], version=1))
    recovered = await recover(shared_zones, prefix, 2)
    assert [record.data for record in recovered] == [b"old 1", b"old 2"]
    for replica in zone_replicas(tools):
        assert (await replica.list_chunks(LOG)).identity == LogIdentity(DEPLOYMENT, 1)
    await tools.close()
