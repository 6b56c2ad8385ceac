"""Seeded corruption fuzz of the S3 WAL against a moto S3 server.

Each case writes acknowledged records in rounds (concurrent appends, each round awaited), leaves
the WAL without trimming, damages one stored WAL object (a flipped bit at a sampled position, a
truncation, a deletion, another deployment's object under the same key), reopens a fresh
:class:`S3Wal` at the next epoch and classifies what recovery returns with
:func:`classify_recovery`. The only records the WAL may drop unreported are those of the last
round (no later write followed them): that is the torn-tail allowance, known from the test's own
rounds. Offsets of acknowledged records must not be reused after a reported damage either.

CI runs a bounded number of cases; ``--soak`` runs many more. Run with ``-s`` to see the table.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from walstream.wal import WalMode
from walstream_conformance.corruption import (
    FuzzReport,
    Outcome,
    classify_recovery,
    recover_fresh,
    write_rounds,
)
from walstream_wal_s3 import S3ObjectStore, S3Settings
from walstream_wal_s3.client import RetryPolicy
from walstream_wal_s3.layout import WalKeys, encode_wal_object
from walstream_wal_s3.wal import S3Wal

SEED = 20261123
CI_CASES = 16
SOAK_CASES = 480
DAMAGES = ("bitflip", "truncate", "delete", "foreign")
TARGETS = ("first", "middle", "last")
OURS = bytes.fromhex("5157a1e5000000000000000000000001")
THEIRS = bytes.fromhex("0f0f0f0f000000000000000000000002")


@pytest_asyncio.fixture
async def store(s3_bucket: Any) -> AsyncIterator[S3ObjectStore]:
    shared = S3ObjectStore(
        S3Settings(**s3_bucket.options(), retry=RetryPolicy(max_attempts=5, base_delay_s=0.005))
    )
    yield shared
    await shared.close()


def make_wal(store: S3ObjectStore, **options: Any) -> S3Wal:
    wal = S3Wal(store, owns_store=False, max_batch_interval_s=0.002, **options)
    wal.bind_deployment(OURS)
    return wal


async def write_abandoned(
    store: S3ObjectStore, node: int, rng: random.Random
) -> tuple[list[tuple[int, bytes]], int]:
    """Acknowledged ``(offset, data)`` in append order, and how many the last round wrote."""
    wal = make_wal(
        store,
        max_inflight=rng.choice((1, 2, 4, 8)),
        max_batch_bytes=rng.choice((40, 120, 400, 8 << 20)),
    )
    await wal.start(node, 1, WalMode.READ_WRITE)
    assert [record async for record in wal.recover()] == []
    acked, last_round = await write_rounds(
        wal, rng, rounds=(2, 5), per_round=(1, 12), sizes=(1, 90)
    )
    await wal.close()  # nothing in flight; no trim
    return acked, last_round


async def damage_one_object(
    store: S3ObjectStore, keys: WalKeys, damage: str, where: str, rng: random.Random
) -> str:
    """Damage one WAL object (the first, the last or one in the middle of the chain); returns
    where the damaged object sat."""
    data_keys = [meta.key async for meta in store.list(keys.data)]
    if where == "first":
        index = 0
    elif where == "last" or len(data_keys) < 3:
        index = len(data_keys) - 1
    else:
        index = rng.randrange(1, len(data_keys) - 1)
    key = data_keys[index]
    target = "last" if index == len(data_keys) - 1 else "first" if index == 0 else "middle"
    stored = await store.get(key)
    if damage == "bitflip":
        bit = rng.randrange(len(stored) * 8)
        flipped = bytearray(stored)
        flipped[bit // 8] ^= 1 << (bit % 8)
        await store.put(key, bytes(flipped))
    elif damage == "truncate":
        await store.put(key, stored[: rng.randrange(len(stored))])
    elif damage == "delete":
        await store.delete([key])
    else:
        name = keys.parse_data(key)
        assert name is not None
        count = name.last - name.first + 1
        foreign = encode_wal_object(
            int(keys.root.split("/")[1]),
            name.epoch,
            name.first,
            [rng.randbytes(rng.randint(1, 90)) for _ in range(count)],
            deployment_id=THEIRS,
            durable_before=name.first,
        )
        await store.put(key, foreign)
    return target


async def run_case(store: S3ObjectStore, case: int, rng: random.Random, report: FuzzReport) -> None:
    node = 1000 + case
    damage = DAMAGES[case % len(DAMAGES)]
    where = TARGETS[case // len(DAMAGES) % len(TARGETS)]
    acked, last_round = await write_abandoned(store, node, rng)
    target = await damage_one_object(store, WalKeys.for_node(node), damage, where, rng)

    wal = make_wal(store)
    recovered, error = await recover_fresh(wal, node, 2)
    outcome = classify_recovery(acked, recovered, error, torn_tail_allowance=last_round)
    detail = f"(case {case}, node {node}, seed {SEED})"
    if error is None and outcome is not Outcome.TORN_TAIL:
        # Nothing dropped as torn: a new record must not take an acknowledged offset.
        offset = await wal.append(b"after recovery")
        if offset <= acked[-1][0]:
            outcome = Outcome.WRONG_DATA
            detail += f" offset {offset} reused after recovery"
    await wal.close()
    report.add(f"s3 wal object ({target})", damage, outcome, detail)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the soak length; CI runs a few seconds
async def test_s3_wal_corruption_fuzz(store: S3ObjectStore, soak: bool) -> None:
    cases = SOAK_CASES if soak else CI_CASES
    rng = random.Random(SEED)
    report = FuzzReport(f"S3 WAL corruption fuzz: {cases} cases, seed {SEED}")
    for case in range(cases):
        await run_case(store, case, rng, report)
    report.assert_safe()
    counts = {outcome: 0 for outcome in Outcome}
    for (_, _, outcome), count in report.counts.items():
        counts[outcome] += count
    # Damage that leaves acknowledged records behind it is reported, not just survived.
    assert counts[Outcome.DETECTED] > 0 and sum(counts.values()) == cases
