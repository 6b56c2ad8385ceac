"""Crashes with real processes: a zone's server SIGKILLed under a continuous append workload
(acks continue; restarted empty, it is re-replicated), then the writer SIGKILLed and recovered
with another zone down — every acknowledged record exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from walstream.wal import WalMode, WalRecord
from walstream_wal_s3express import build_replicas
from walstream_wal_s3express.zones import ZoneServer, zone_wal_options


def check_recovery(recovered: list[WalRecord], expected: dict[str, int], context: str) -> None:
    """Every acknowledged record exactly once at its offset, in order; per writer, what came
    back is one contiguous run of its appends (no holes, nothing invented)."""
    offsets = [record.offset for record in recovered]
    assert offsets == sorted(set(offsets)), f"{context}: offsets not strictly increasing"
    names = [":".join(record.data.decode().split(":")[:2]) for record in recovered]
    assert len(names) == len(set(names)), f"{context}: a record was recovered twice"
    found = dict(zip(names, offsets, strict=True))
    missing = [name for name in expected if name not in found]
    assert not missing, f"{context}: acknowledged records lost: {missing[:5]}"
    moved = [name for name, offset in expected.items() if found[name] != offset]
    assert not moved, f"{context}: records recovered at another offset: {moved[:5]}"
    by_writer: dict[str, list[int]] = {}
    for name in names:
        writer_epoch, index = name.split(":")
        by_writer.setdefault(writer_epoch, []).append(int(index))
    for writer_epoch, indexes in by_writer.items():
        assert indexes == list(range(indexes[0], indexes[0] + len(indexes))), (
            f"{context}: writer {writer_epoch} recovered with a hole"
        )


class Writer:
    """The writer subprocess and the acknowledgements it reported."""

    def __init__(self, script: Path, options: dict[str, Any], epoch: int, seed: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(script), json.dumps(options), str(epoch), str(seed)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.acks: list[tuple[int, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("ACK "):
                _, offset, name = line.split()
                self.acks.append((int(offset), name))

    def kill(self) -> list[tuple[int, str]]:
        assert self.process.poll() is None, "the writer died on its own"
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return list(self.acks)


async def wait_acks(writer: Writer, count: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(writer.acks) < count:
        assert writer.process.poll() is None, "the writer died on its own"
        assert time.monotonic() < deadline, f"only {len(writer.acks)} of {count} acks arrived"
        await asyncio.sleep(0.01)


async def zone_holds(zone_options: dict[str, Any], log_id: str, seqs: set[int]) -> bool:
    replica = build_replicas(zone_options, node_id=1)[0]
    try:
        listing = await replica.list_chunks(log_id)
    except Exception:
        return False
    finally:
        await replica.close()
    return seqs <= set(listing.chunks)


async def test_zone_kill_and_writer_kill_cycles_recover_every_ack_exactly_once(
    open_wal: Any,
    zones: list[ZoneServer],
    wal_options: dict[str, Any],
    writer_script: Path,
    wait_for: Any,
    soak: bool,
) -> None:
    cycles = 30 if soak else 3
    seed = int(os.environ.get("WALSTREAM_SEED", "4242"))
    rng = random.Random(seed)
    expected: dict[str, int] = {}  # acknowledged record name -> offset, since the last reset
    epoch = 0
    first_down = rng.randrange(3)
    for cycle in range(cycles):
        context = f"seed={seed} cycle={cycle}"
        epoch += 1
        writer = Writer(writer_script, wal_options, epoch, rng.randrange(1 << 30))
        await wait_acks(writer, rng.randrange(50, 300))
        # a zone's server is SIGKILLed under load: appends keep being acknowledged
        victim = zones[first_down]
        victim.kill()
        killed_at = len(writer.acks)
        await wait_acks(writer, killed_at + rng.randrange(300, 800), timeout_s=15)
        # it comes back empty; the writer re-replicates every acknowledged chunk to it
        victim.start()
        await wait_acks(writer, len(writer.acks) + 100)
        acked_seqs = {offset >> 24 for offset, _ in writer.acks}
        victim_options = zone_wal_options(
            [victim], prefix=wal_options["prefix"], request_timeout=1.0
        )
        await wait_for(
            lambda options=victim_options, seqs=acked_seqs: zone_holds(options, "node-1", seqs),
            20,
        )
        await asyncio.sleep(rng.random() * 0.05)
        acks = writer.kill()
        expected.update({name: offset for offset, name in acks})
        # recover with a different zone down (killed; it returns empty afterwards)
        second_down = rng.choice([index for index in range(3) if index != first_down])
        zones[second_down].kill()
        epoch += 1
        mode = rng.choice([WalMode.READ_WRITE, WalMode.FAILOVER])
        wal, recovered = await open_wal(epoch, mode=mode)
        check_recovery(recovered, expected, f"{context} zone {second_down} down")
        zones[second_down].start()
        if mode is WalMode.READ_WRITE:
            # the recovering writer re-replicates to the returned zone before we go on
            await wait_for(lambda wal=wal: not wal.lagging_replicas(), 20)
            if rng.random() < 0.5:
                await wal.reset()
                expected.clear()
            elif recovered:
                cut = recovered[rng.randrange(len(recovered))]
                await wal.trim(cut.offset)
                expected = {name: offset for name, offset in expected.items()
                            if offset > cut.offset}
        # (a FAILOVER instance runs no catch-up: the next writer re-replicates the zone)
        await wal.close()
        first_down = second_down
