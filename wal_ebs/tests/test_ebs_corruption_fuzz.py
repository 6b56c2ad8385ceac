"""Seeded corruption fuzzing of the ebs WAL: every damaged medium must end in a safe outcome.

Two base WAL files are written once: several laps of trimmed rounds (so the ring past the tail
holds stale, valid-looking records of earlier laps), then rounds of concurrent appends that are
awaited one round at a time and never trimmed: the acknowledged records. One base is closed
cleanly, the other abandoned like a killed process. Each case copies a base, damages it at a
sampled position (a header slot, a record header or body, a padding record, the stale region past
the end, a truncation, a few garbage bytes, another deployment's file swapped in), reopens it with
a fresh :class:`EbsWal`, recovers, and classifies the result with
:func:`~walstream_conformance.corruption.classify_recovery`. The torn-tail allowance is the number
of records of the last round: the only acknowledged records no later write attests.

Damage to a padding record or to the stale region must leave the recovery INTACT (neither taken
for data nor reported as damage). CI runs 300 cases; ``--soak`` runs 3,000.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from walstream.wal import WalMode, WalRecord
from walstream_conformance.corruption import (
    FuzzReport,
    Outcome,
    classify_recovery,
    flip_bit,
    overwrite,
    recover_fresh,
)
from walstream_wal_ebs import EbsWal
from walstream_wal_ebs.layout import (
    BLOCK_BYTES,
    RECORD_AREA_START,
    RECORD_HEADER_BYTES,
    HeaderSlot,
    pick_header,
)
from walstream_wal_ebs.scan import walk_log

SEED = 20261123
CI_CASES = 300
SOAK_CASES = 3000
RING_FILE_BYTES = RECORD_AREA_START + (1 << 20)
DEPLOYMENT = bytes.fromhex("5eed" * 8)
FOREIGN_DEPLOYMENT = bytes.fromhex("f0e1" * 8)
NODE_ID = 3
HEADER_USED_BYTES = 132
"""Bytes of a format-2 header slot covered by its CRC (the rest of the 4 KiB is unused)."""


@dataclass
class Base:
    """A written WAL file and what the test knows about it."""

    path: Path
    clean_close: bool
    acked: list[tuple[int, bytes]]
    """Acknowledged, untrimmed records in append order."""
    last_round: int
    """Records of the last round: the torn-tail allowance."""
    records: list[tuple[int, int]]
    """(file position, body length) of every acknowledged record."""
    paddings: list[tuple[int, int]]
    """(file position, total length) of every padding record between tail and end."""
    stale: tuple[int, int]
    """File positions [start, end) of the ring past the end of the log (may wrap: see below)."""
    capacity: int


async def write_base(path: Path, *, clean_close: bool, deployment: bytes, seed: int) -> Base:
    rng = random.Random(seed)
    wal = EbsWal(path, capacity_bytes=RING_FILE_BYTES)
    wal.bind_deployment(deployment)
    await wal.start(NODE_ID, 1, WalMode.READ_WRITE)
    assert [record async for record in wal.recover()] == []
    capacity = wal.capabilities.capacity_bytes
    assert capacity is not None

    async def one_round() -> list[tuple[int, bytes]]:
        payloads = [rng.randbytes(rng.choice([0, 7, 300, 1500, 4064, 5000])) for _ in range(8)]
        payloads = payloads[: rng.randint(1, 8)]
        offsets = await asyncio.gather(*(wal.append(data) for data in payloads))
        return list(zip(offsets, payloads, strict=True))

    # Earlier laps, trimmed as they go: the ring fills with stale records.
    while True:
        written = await one_round()
        await wal.trim(written[-1][0])
        if written[-1][0] > 2 * capacity + capacity // 2:
            break
    acked: list[tuple[int, bytes]] = []
    last: list[tuple[int, bytes]] = []
    for _ in range(12):
        last = await one_round()
        acked.extend(last)
    if clean_close:
        await wal.close()
    else:

        async def skip() -> None:
            return None

        wal._record_clean_close = skip  # type: ignore[method-assign]
        await wal.close()
    paddings, end = await chain_layout(path)
    first = acked[0][0]
    records = [(RECORD_AREA_START + offset % capacity, len(data)) for offset, data in acked]
    stale_start = RECORD_AREA_START + end % capacity
    stale_end = RECORD_AREA_START + first % capacity
    return Base(
        path, clean_close, acked, len(last), records, paddings, (stale_start, stale_end), capacity
    )


async def chain_layout(path: Path) -> tuple[list[tuple[int, int]], int]:
    """Positions of the padding records of the intact log, and where the log ends."""
    data = path.read_bytes()
    header, _ = pick_header([data[:BLOCK_BYTES], data[BLOCK_BYTES : 2 * BLOCK_BYTES]])
    assert header is not None

    async def read(position: int, length: int) -> bytes:
        return data[position : position + length].ljust(length, b"\0")

    paddings = []
    end = header.tail_offset
    async for item in walk_log(read, header):
        assert item.kind != "damage"
        if item.kind == "padding":
            position = header.area_start + item.offset % header.capacity_bytes
            paddings.append((position, item.end - item.offset))
        if item.kind == "end":
            end = item.offset
    return paddings, end


def damage_case(rng: random.Random, base: Base, foreign: Path, case: Path) -> tuple[str, str]:
    """Copy a base to ``case`` and damage it; returns (target, damage) for the report."""
    target = rng.choice(
        [
            "header slot",
            "both header slots",
            "record header",
            "record body",
            "padding",
            "stale region",
            "truncation",
            "garbage bytes",
            "foreign deployment",
        ]
    )
    shutil.copyfile(foreign if target == "foreign deployment" else base.path, case)
    bit = rng.randrange(8)
    if target == "header slot":
        slot = rng.randrange(2)
        flip_bit(case, slot * BLOCK_BYTES + rng.randrange(HEADER_USED_BYTES), bit)
        return target, "bit flip"
    if target == "both header slots":
        for slot in range(2):
            flip_bit(case, slot * BLOCK_BYTES + rng.randrange(HEADER_USED_BYTES), rng.randrange(8))
        return target, "bit flips"
    if target in ("record header", "record body", "garbage bytes"):
        position, length = rng.choice(base.records)
        if target == "record header" or length == 0:
            flip_bit(case, position + rng.randrange(RECORD_HEADER_BYTES), bit)
            return "record header", "bit flip"
        if target == "record body":
            flip_bit(case, position + RECORD_HEADER_BYTES + rng.randrange(length), bit)
            return target, "bit flip"
        overwrite(case, position + rng.randrange(RECORD_HEADER_BYTES + length), rng.randbytes(16))
        return "record", "16 random bytes"
    if target == "padding":
        position, length = rng.choice(base.paddings)
        inside = rng.randrange(RECORD_HEADER_BYTES) if rng.random() < 0.7 else rng.randrange(length)
        flip_bit(case, position + inside, bit)
        return target, "bit flip"
    if target == "stale region":
        start, end = base.stale
        span = (end - start) % base.capacity
        distance = rng.randrange(span)
        flip_bit(
            case, RECORD_AREA_START + (start - RECORD_AREA_START + distance) % base.capacity, bit
        )
        return target, "bit flip"
    if target == "truncation":
        full = case.stat().st_size
        size = rng.choice([0, 4 << 10, 8 << 10, rng.randrange(full), full - BLOCK_BYTES])
        os.truncate(case, size)
        return target, "cut file"
    return target, "swapped file"


@pytest.fixture
def case_dir(tmp_path: Path) -> Iterator[Path]:
    """Where damaged copies are opened: memory when available (the cases test recovery logic,
    not I/O; the bases were written with O_DIRECT on disk)."""
    if Path("/dev/shm").is_dir():
        with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="walstream-fuzz-") as folder:
            yield Path(folder)
    else:
        yield tmp_path


async def recover_case(case: Path) -> tuple[list[WalRecord] | None, BaseException | None]:
    wal = EbsWal(case, capacity_bytes=RING_FILE_BYTES, direct=False)
    wal.bind_deployment(DEPLOYMENT)
    try:
        return await recover_fresh(wal, NODE_ID, 2)
    finally:
        await wal.close()


@pytest.mark.slow
async def test_ebs_corruption_fuzz(tmp_path: Path, case_dir: Path, soak: bool) -> None:
    cases = SOAK_CASES if soak else CI_CASES
    bases = [
        await write_base(
            tmp_path / f"base-{clean}.img", clean_close=clean, deployment=DEPLOYMENT, seed=SEED
        )
        for clean in (True, False)
    ]
    foreign = await write_base(
        tmp_path / "foreign.img", clean_close=True, deployment=FOREIGN_DEPLOYMENT, seed=SEED
    )
    for base in bases:
        assert len(base.paddings) > 5 and len(base.acked) > 30
        assert (base.stale[1] - base.stale[0]) % base.capacity > 64 << 10
    rng = random.Random(SEED)
    report = FuzzReport(
        f"ebs WAL corruption fuzz: {cases} cases, seed {SEED} "
        "(base closed cleanly / abandoned like a killed process)"
    )
    spurious: list[str] = []
    case = case_dir / "case.img"
    for number in range(cases):
        base = rng.choice(bases)
        target, damage = damage_case(rng, base, foreign.path, case)
        recovered, error = await recover_case(case)
        try:
            outcome = classify_recovery(
                base.acked, recovered, error, torn_tail_allowance=base.last_round
            )
        except AssertionError as exc:  # an error that names no corruption
            report.failures.append(f"case {number} {target}/{damage}: {exc}")
            continue
        kind = "closed" if base.clean_close else "abandoned"
        report.add(f"{target} ({kind})", damage, outcome, f"case {number}")
        if target in ("padding", "stale region") and outcome is not Outcome.INTACT:
            spurious.append(f"case {number} {target}: {outcome.value}")
    report.assert_safe()
    assert not spurious, f"padding or stale bytes changed the recovery: {spurious[:10]}"
    seen = {outcome for _, _, outcome in report.counts}
    assert Outcome.DETECTED in seen and Outcome.INTACT in seen


def test_headers_of_the_fuzz_bases_record_the_deployment(tmp_path: Path) -> None:
    base = asyncio.run(
        write_base(tmp_path / "wal.img", clean_close=True, deployment=DEPLOYMENT, seed=1)
    )
    raw = base.path.read_bytes()
    header = max(
        (HeaderSlot.decode(raw[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES]) for i in range(2)),
        key=lambda slot: slot.sequence,
    )
    assert header.deployment_id == DEPLOYMENT and header.home_node_id == NODE_ID
    assert header.acked_through > base.acked[-1][0]


pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
