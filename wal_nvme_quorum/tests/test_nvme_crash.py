"""Crashes with real processes: a chunk server SIGKILLed under load, the writer SIGKILLed and
recovered with another server down — every acknowledged record exactly once."""

from __future__ import annotations

import asyncio
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
from walstream_wal_nvme_quorum import ChunkServerProcess, ChunkServerReplica


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


async def test_server_sigkill_during_appends_then_it_catches_up(
    open_wal: Any, chunk_servers: list[ChunkServerProcess], wait_for: Any
) -> None:
    wal, _ = await open_wal(1)
    acked: list[tuple[int, bytes]] = []
    stop = asyncio.Event()

    async def workload() -> None:
        index = 0
        while not stop.is_set():
            batch = [f"w{index + i}".encode() for i in range(8)]
            offsets = await asyncio.gather(*(wal.append(data) for data in batch))
            acked.extend(zip(offsets, batch, strict=True))
            index += len(batch)
            await asyncio.sleep(0.002)

    running = asyncio.create_task(workload())
    await wait_for(lambda: len(acked) >= 200)
    victim = chunk_servers[1]
    victim.kill()
    killed_at = len(acked)
    await wait_for(lambda: len(acked) >= killed_at + 400, timeout_s=10)
    assert victim.address in wal.lagging_replicas()
    victim.start()
    await asyncio.sleep(0.3)
    stop.set()
    await running
    await wait_for(lambda: not wal.lagging_replicas(), timeout_s=15)
    # the restarted server holds every acknowledged chunk again
    replica = ChunkServerReplica(victim.address)
    listing = await replica.list_chunks(wal.log_id)
    await replica.close()
    acked_seqs = {offset >> 24 for offset, _ in acked}
    assert acked_seqs <= set(listing.chunks)
    await wal.close()
    # and it can stand in for another server: recover with server 0 down
    chunk_servers[0].kill()
    _, recovered = await open_wal(2)
    assert [(record.offset, record.data) for record in recovered] == acked


class Writer:
    """The writer subprocess and the acknowledgements it reported."""

    def __init__(self, script: Path, servers: list[ChunkServerProcess], epoch: int, seed: int):
        addresses = ",".join(server.address for server in servers)
        self.process = subprocess.Popen(
            [sys.executable, str(script), addresses, str(epoch), str(seed)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.acks: list[tuple[int, str]] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("READY"):
                self.ready.set()
            elif line.startswith("ACK "):
                _, offset, name = line.split()
                self.acks.append((int(offset), name))

    def kill(self) -> list[tuple[int, str]]:
        assert self.process.poll() is None, "the writer died on its own"
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(timeout=10)
        return list(self.acks)


async def wait_acks(writer: Writer, count: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(writer.acks) < count:
        assert writer.process.poll() is None, "the writer died on its own"
        assert time.monotonic() < deadline, f"only {len(writer.acks)} of {count} acks arrived"
        await asyncio.sleep(0.01)


async def test_writer_sigkill_cycles_recover_every_ack_exactly_once(
    open_wal: Any, chunk_servers: list[ChunkServerProcess], writer_script: Path, soak: bool
) -> None:
    cycles = 100 if soak else 5
    seed = int(os.environ.get("WALSTREAM_SEED", "8008"))
    rng = random.Random(seed)
    expected: dict[str, int] = {}  # acknowledged record name -> offset, since the last reset
    epoch = 0
    for cycle in range(cycles):
        context = f"seed={seed} cycle={cycle}"
        epoch += 1
        writer = Writer(writer_script, chunk_servers, epoch, rng.randrange(1 << 30))
        await wait_acks(writer, rng.randrange(20, 200))
        # one server dies under load; appends continue; it comes back before the writer dies
        first_down = rng.randrange(3)
        chunk_servers[first_down].kill()
        await wait_acks(writer, len(writer.acks) + rng.randrange(50, 300))
        chunk_servers[first_down].start()
        await wait_acks(writer, len(writer.acks) + rng.randrange(0, 200))
        await asyncio.sleep(rng.random() * 0.05)
        acks = writer.kill()
        expected.update({name: offset for offset, name in acks})
        # recover with a different server down
        second_down = rng.choice([index for index in range(3) if index != first_down])
        chunk_servers[second_down].kill()
        epoch += 1
        mode = rng.choice([WalMode.READ_WRITE, WalMode.FAILOVER])
        wal, recovered = await open_wal(epoch, mode=mode)
        check_recovery(recovered, expected, context)
        chunk_servers[second_down].start()
        if mode is WalMode.READ_WRITE and rng.random() < 0.5:
            await wal.reset()
            expected.clear()
        elif rng.random() < 0.3 and recovered:
            cut = recovered[rng.randrange(len(recovered))]
            await wal.trim(cut.offset)
            expected = {name: offset for name, offset in expected.items() if offset > cut.offset}
        await wal.close()
