"""Crash harness: the writer process is SIGKILLed mid-stream again and again against the moto
S3 server; every acknowledged, untrimmed record is recovered exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from walstream.wal import WalMode

WRITER = Path(__file__).with_name("s3_crash_writer.py")


def run_writer_until_killed(s3_bucket: Any, epoch: int, kill_after_acks: int) -> list[str]:
    """Run one writer, SIGKILL it once it printed ``kill_after_acks`` acks; its output lines."""
    process = subprocess.Popen(
        [sys.executable, str(WRITER), s3_bucket.endpoint_url, s3_bucket.bucket, str(epoch),
         f"run{epoch}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    acks = 0
    deadline = time.monotonic() + 60
    while acks < kill_after_acks and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        acks += line.startswith("ACK ")
    os.kill(process.pid, signal.SIGKILL)
    rest, errors = process.communicate()
    lines.extend(line.strip() for line in rest.splitlines())  # printed before the kill
    assert acks >= kill_after_acks, f"writer stopped early: {errors[-2000:]}"
    return lines


async def test_s3_wal_survives_sigkill_loop(s3_bucket: Any, make_wal: Any, soak: bool) -> None:
    cycles = 100 if soak else 6
    rng = random.Random(20240601)
    acked: dict[int, str] = {}
    trimmed_through = -1
    for epoch in range(1, cycles + 1):
        for line in run_writer_until_killed(s3_bucket, epoch, rng.randint(5, 120)):
            kind, _, rest = line.partition(" ")
            if kind == "ACK":
                offset, payload = rest.split(" ", 1)
                assert int(offset) not in acked, f"offset {offset} acknowledged twice"
                acked[int(offset)] = payload
            elif kind == "TRIM":
                trimmed_through = max(trimmed_through, int(rest))

    wal = make_wal()
    await wal.start(1, cycles + 1, WalMode.READ_ONLY)
    recovered = [record async for record in wal.recover()]
    await wal.close()
    offsets = [record.offset for record in recovered]
    assert offsets == sorted(set(offsets)), "recovery out of order or duplicated"
    by_offset = {record.offset: record.data.decode() for record in recovered}
    payloads = [record.data for record in recovered]
    assert len(payloads) == len(set(payloads)), "a record was recovered twice"
    missing = {
        offset: payload for offset, payload in acked.items()
        if offset > trimmed_through and by_offset.get(offset) != payload
    }
    sample = list(missing.items())[:3]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sample}"
    assert len([offset for offset in acked if offset > trimmed_through]) > 0
