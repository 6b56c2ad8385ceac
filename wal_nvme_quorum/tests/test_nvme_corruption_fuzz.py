"""Seeded corruption fuzzing of the nvme-quorum WAL: damage chunk-server segment files on disk.

Every case writes acknowledged records in rounds (concurrent appends, each round awaited) to three
chunk servers, abandons the writer, stops the servers, damages their segment files (bit flips at
sampled positions on one, two or all servers, truncated segments, another deployment's files
swapped in), restarts them and recovers with a fresh WAL. :func:`classify_recovery` sorts the
outcome; the records of the last round may be lost as a torn tail (no later write attests them),
anything else missing must be reported. The servers run in this process (the real
:class:`ChunkServer` and :class:`ChunkStore` on real files) so a case costs milliseconds.

``WALSTREAM_SEED`` picks the seed; ``--soak`` runs many more cases.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from walstream.wal import WalMode, WalRecord
from walstream_conformance.corruption import (
    FuzzReport,
    classify_recovery,
    recover_fresh,
    write_rounds,
)
from walstream_wal_nvme_quorum.testing.inprocess import InProcessServers as Servers

DEPLOYMENT = bytes.fromhex("5eed0000000000000000000000000001")
OTHER_DEPLOYMENT = bytes.fromhex("0be7000000000000000000000000ffff")
LOG = "node-1"
CI_CASES = 36
SOAK_CASES = 600


async def write_abandoned(
    servers: Servers, rng: random.Random, deployment: bytes
) -> tuple[list[tuple[int, bytes]], int]:
    """Acknowledged ``(offset, data)`` in append order and the size of the last round; the
    writer is abandoned (its servers stop under it) without a clean shutdown."""
    wal = servers.wal(max_chunk_delay_s=0.0005)
    wal.bind_deployment(deployment)
    await wal.start(1, 1, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    acked, last_round = await write_rounds(wal, rng, rounds=(3, 7))
    await servers.stop()
    await wal.close()
    return acked, last_round


def segments(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.seg"))


def flip_bit(path: Path, position: int, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    if not data:
        return
    position = min(position, len(data) - 1)
    data[position] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def damage(
    servers: Servers,
    foreign: Servers,
    acked: Sequence[tuple[int, bytes]],
    rng: random.Random,
) -> tuple[str, str]:
    """Damage the stopped servers' files; returns ``(target, kind)`` for the report."""
    count = rng.choice([1, 1, 2, 2, 3])
    target = {1: "one server", 2: "two servers", 3: "all servers"}[count]
    victims = rng.sample(servers.folders, count)
    kind = rng.choice(["flip in a record", "flip anywhere", "truncate a segment", "foreign files"])
    if kind == "flip in a record":
        # The same acknowledged record on every victim: with all servers hit, no copy is left.
        _, payload = rng.choice(acked)
        for folder in victims:
            for path in segments(folder):
                found = path.read_bytes().find(payload)
                if found >= 0:
                    flip_bit(path, found + rng.randrange(len(payload)), rng)
    elif kind == "flip anywhere":
        for folder in victims:
            for _ in range(rng.randint(1, 3)):
                path = rng.choice(segments(folder))
                flip_bit(path, rng.randrange(max(1, path.stat().st_size)), rng)
    elif kind == "truncate a segment":
        for folder in victims:
            path = rng.choice(segments(folder))
            with open(path, "r+b") as file:
                file.truncate(rng.randrange(max(1, path.stat().st_size)))
    else:
        whole = rng.random() < 0.5
        kind = "foreign folder" if whole else "foreign segment"
        for folder in victims:
            source = foreign.folders[servers.folders.index(folder)]
            if whole:
                shutil.rmtree(folder)
                shutil.copytree(source, folder)
            else:
                last = segments(folder)[-1]
                donor = rng.choice(segments(source))
                shutil.copy(donor, folder / f"{int(last.stem) + 1:010d}.seg")
    return target, kind


async def recover(servers: Servers) -> tuple[list[WalRecord] | None, BaseException | None]:
    wal = servers.wal()
    wal.bind_deployment(DEPLOYMENT)
    try:
        return await recover_fresh(wal, 1, 2)
    finally:
        await wal.close()


@pytest.mark.slow
async def test_nvme_quorum_corruption_fuzz(tmp_path: Path, soak: bool) -> None:
    seed = int(os.environ.get("WALSTREAM_SEED", "1107"))
    rng = random.Random(seed)
    cases = SOAK_CASES if soak else CI_CASES
    report = FuzzReport(f"nvme-quorum corruption fuzz (seed {seed}, {cases} cases)")
    foreign = Servers(tmp_path / "foreign", segment_bytes=2048)
    await foreign.start()
    await write_abandoned(foreign, random.Random(seed + 1), OTHER_DEPLOYMENT)
    for case in range(cases):
        servers = Servers(tmp_path / f"case-{case}", segment_bytes=rng.choice([1024, 2048, 8192]))
        await servers.start()
        acked, last_round = await write_abandoned(servers, rng, DEPLOYMENT)
        target, kind = damage(servers, foreign, acked, rng)
        await servers.start()
        try:
            recovered, error = await recover(servers)
        finally:
            await servers.stop()
        outcome = classify_recovery(acked, recovered, error, torn_tail_allowance=last_round)
        report.add(target, kind, outcome, f"(seed {seed} case {case}: {error!r})")
        shutil.rmtree(tmp_path / f"case-{case}")
    report.assert_safe()
