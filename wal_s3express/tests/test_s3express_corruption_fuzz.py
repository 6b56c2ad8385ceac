"""Seeded corruption fuzzing of the s3express WAL: damage the zone buckets' chunk objects (moto).

Every case writes acknowledged records in rounds (concurrent appends, each round awaited) to three
zones under a prefix of its own, abandons the writer, damages chunk objects (bit flips at sampled
positions on one, two or all zones, truncated or deleted objects, another deployment's chunk or
control state swapped in) and recovers with a fresh WAL. :func:`classify_recovery` sorts the
outcome; the records of the last round may be lost as a torn tail (no later write attests them),
anything else missing must be reported.

``WALSTREAM_SEED`` picks the seed; ``--soak`` runs many more cases.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Sequence
from typing import Any

import pytest
from walstream.config import BuildContext
from walstream.wal import WalMode, WalRecord
from walstream.wal.quorum import chunk_crc
from walstream_conformance.corruption import (
    FuzzReport,
    classify_recovery,
    recover_fresh,
    write_rounds,
)
from walstream_wal_s3express import S3EXPRESS_WAL, S3ExpressWal, ZonalBucketReplica
from walstream_wal_s3express.replica import chunk_key, parse_chunk_key
from walstream_wal_s3express.testing.zones import ZoneServer, zone_wal_options

DEPLOYMENT = bytes.fromhex("5eed0000000000000000000000000002")
OTHER_DEPLOYMENT = bytes.fromhex("0be7000000000000000000000000fffe")
CI_CASES = 8
SOAK_CASES = 120
KINDS = (
    "flip in a chunk",
    "flip anywhere",
    "truncate a chunk",
    "delete a chunk",
    "foreign chunk",
    "foreign state",
)
#: The first cases (all of them in CI, where cases are few) cover the damage that matters most;
#: later cases draw kind and zone count at random.
PLANNED = (
    ("flip in a chunk", 3),
    ("delete a chunk", 3),
    ("foreign chunk", 3),
    ("flip in a chunk", 2),
    ("truncate a chunk", 1),
    ("foreign state", 1),
    ("flip anywhere", 2),
    ("foreign chunk", 2),
)
_prefixes = itertools.count(1)


def build(zones: list[ZoneServer], prefix: str, **options: Any) -> S3ExpressWal:
    section = zone_wal_options(
        zones, prefix=prefix, request_timeout="2s", write_timeout="5s", **options
    )
    return S3EXPRESS_WAL.build(section, BuildContext(node_id=1), "wal")


async def write_abandoned(
    zones: list[ZoneServer], prefix: str, rng: random.Random, deployment: bytes
) -> tuple[list[tuple[int, bytes]], int]:
    """Acknowledged ``(offset, data)`` in append order and the size of the last round."""
    wal = build(zones, prefix, max_chunk_delay="1ms")
    wal.bind_deployment(deployment)
    await wal.start(1, 1, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    acked, last_round = await write_rounds(
        wal, rng, rounds=(3, 5), per_round=(1, 4), sizes=(8, 300)
    )
    # Abandoned: no trim, no reset; close only stops its background tasks.
    await wal.close()
    return acked, last_round


class Zone:
    """Raw access to one zone's objects under a log's root."""

    def __init__(self, replica: ZonalBucketReplica, root: str) -> None:
        self.replica = replica
        self.root = root

    async def chunk_keys(self) -> list[str]:
        listed = await self.replica.client.call("list_objects_v2", Prefix=self.root + "chunks/")
        return sorted(item["Key"] for item in listed.get("Contents", []))

    async def get(self, key: str) -> bytes:
        response = await self.replica.client.call("get_object", Key=key, read_body=True)
        return bytes(response["Body"])

    async def put(self, key: str, data: bytes) -> None:
        await self.replica.client.call("put_object", write=True, Key=key, Body=data)

    async def delete(self, key: str) -> None:
        await self.replica.client.call(
            "delete_objects", write=True, Delete={"Objects": [{"Key": key}], "Quiet": True}
        )


def zones_of(wal: S3ExpressWal, log_id: str) -> list[Zone]:
    replicas = [state.replica for state in wal._replicas.values()]
    return [
        Zone(replica, f"{replica.client.settings.prefix}{log_id}/")  # type: ignore[attr-defined]
        for replica in replicas
    ]


def flipped(data: bytes, rng: random.Random) -> bytes:
    damaged = bytearray(data)
    damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
    return bytes(damaged)


async def damage(
    zones: list[Zone],
    foreign: list[Zone],
    acked: Sequence[tuple[int, bytes]],
    rng: random.Random,
    case: int,
) -> tuple[str, str]:
    if case < len(PLANNED):
        kind, count = PLANNED[case]
    else:
        kind, count = rng.choice(KINDS), rng.choice([1, 1, 2, 2, 3])
    target = {1: "one zone", 2: "two zones", 3: "all zones"}[count]
    victims = rng.sample(range(len(zones)), count)
    # The chunk of one acknowledged record: with all zones hit, no copy of it is left.
    seq = rng.choice(acked)[0] >> 24
    for index in victims:
        zone = zones[index]
        keys = await zone.chunk_keys()
        if kind == "flip anywhere":
            chosen = [rng.choice(keys)]
        else:
            chosen = [key for key in keys if parse_chunk_key(key, 0).seq == seq]  # type: ignore[union-attr]
        for key in chosen:
            data = await zone.get(key)
            if kind in ("flip in a chunk", "flip anywhere"):
                await zone.put(key, flipped(data, rng))
            elif kind == "truncate a chunk":
                await zone.put(key, data[: rng.randrange(len(data))])
            elif kind == "delete a chunk":
                await zone.delete(key)
            elif kind == "foreign chunk":
                donors = await foreign[index].chunk_keys()
                donor = await foreign[index].get(rng.choice(donors))
                stored = parse_chunk_key(key, 0)
                assert stored is not None
                await zone.delete(key)
                await zone.put(
                    chunk_key(zone.root, stored.seq, stored.epoch, chunk_crc(donor), 1), donor
                )
        if kind == "foreign state":
            listed = await foreign[index].replica.client.call(
                "list_objects_v2", Prefix=foreign[index].root + "state/"
            )
            donor_key = sorted(item["Key"] for item in listed["Contents"])[-1]
            donor = await foreign[index].get(donor_key)
            ours = await zone.replica.client.call("list_objects_v2", Prefix=zone.root + "state/")
            newest = sorted(item["Key"] for item in ours["Contents"])[-1]
            await zone.put(newest, donor)
    return target, kind


async def recover(
    zones: list[ZoneServer], prefix: str
) -> tuple[list[WalRecord] | None, BaseException | None]:
    wal = build(zones, prefix)
    wal.bind_deployment(DEPLOYMENT)
    try:
        return await recover_fresh(wal, 1, 2)
    finally:
        await wal.close()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the soak length; CI cases take well under a minute
async def test_s3express_corruption_fuzz(shared_zones: list[ZoneServer], soak: bool) -> None:
    seed = int(os.environ.get("WALSTREAM_SEED", "2207"))
    rng = random.Random(seed)
    cases = SOAK_CASES if soak else CI_CASES
    report = FuzzReport(f"s3express corruption fuzz (seed {seed}, {cases} cases)")
    run = f"fuzz{time.monotonic_ns()}"
    foreign_prefix = f"{run}-foreign"
    await write_abandoned(shared_zones, foreign_prefix, random.Random(seed + 1), OTHER_DEPLOYMENT)
    tools = build(shared_zones, foreign_prefix)
    try:
        foreign = zones_of(tools, "node-1")
        for case in range(cases):
            prefix = f"{run}-case{case}-{next(_prefixes)}"
            acked, last_round = await write_abandoned(shared_zones, prefix, rng, DEPLOYMENT)
            ours = build(shared_zones, prefix)
            try:
                target, kind = await damage(zones_of(ours, "node-1"), foreign, acked, rng, case)
            finally:
                await ours.close()
            recovered, error = await recover(shared_zones, prefix)
            outcome = classify_recovery(acked, recovered, error, torn_tail_allowance=last_round)
            report.add(target, kind, outcome, f"(seed {seed} case {case}: {error!r})")
    finally:
        await tools.close()
    report.assert_safe()
