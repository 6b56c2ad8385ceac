"""Crashes with real processes: a chunk server SIGKILLed under load, the writer SIGKILLed and
recovered with another server down — every acknowledged record exactly once."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import pytest
from walstream.wal import WalMode
from walstream_conformance.backends import BackendSpec
from walstream_conformance.harness.crash import CrashModel, CrashWriter, WriterOptions
from walstream_wal_nvme_quorum import ChunkServerReplica
from walstream_wal_nvme_quorum.testing import ChunkServerProcess

# 32 appends in flight, payloads up to 2 KB, no trims by the writer (the test trims and resets
# between cycles, in process).
WRITER = WriterOptions(window=32, trims=False, max_body=2000)


@pytest.mark.slow
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


@pytest.mark.slow
async def test_writer_sigkill_cycles_recover_every_ack_exactly_once(
    open_wal: Any, chunk_servers: list[ChunkServerProcess], soak: bool, tmp_path: Path
) -> None:
    """The shared crash writer (32 appends in flight) is SIGKILLed after a server died and came
    back under load; recovery with another server down returns every acknowledged record
    exactly once, in order, each writer's appends without holes."""
    cycles = 100 if soak else 5
    seed = int(os.environ.get("WALSTREAM_SEED", "8008"))
    rng = random.Random(seed)
    model = CrashModel(
        seed,
        contiguous=True,
        replay_hint=f"replay with WALSTREAM_SEED={seed}",
        max_body=WRITER.max_body,
    )
    epoch = 0
    for cycle in range(cycles):
        epoch += 1
        spec = BackendSpec(
            kind="wal",
            name="nvme-quorum",
            section={
                "servers": [server.address for server in chunk_servers],
                "request_timeout": "1s",
                "write_timeout": "5s",
            },
        )
        writer = CrashWriter(
            spec,
            seed=seed,
            cycle=cycle,
            epoch=epoch,
            options=WRITER,
            stderr=tmp_path / f"writer-{cycle}.stderr",
        )
        await writer.wait_acks(rng.randrange(20, 200))
        # one server dies under load; appends continue; it comes back before the writer dies
        first_down = rng.randrange(3)
        chunk_servers[first_down].kill()
        await writer.wait_acks(len(writer.acks) + rng.randrange(50, 300))
        chunk_servers[first_down].start()
        await writer.wait_acks(len(writer.acks) + rng.randrange(0, 200))
        await asyncio.sleep(rng.random() * 0.05)
        model.absorb(cycle, writer.kill())
        # recover with a different server down
        second_down = rng.choice([index for index in range(3) if index != first_down])
        chunk_servers[second_down].kill()
        epoch += 1
        mode = rng.choice([WalMode.READ_WRITE, WalMode.FAILOVER])
        wal, recovered = await open_wal(epoch, mode=mode)
        model.check_records(cycle, recovered, complete=True)
        chunk_servers[second_down].start()
        if mode is WalMode.READ_WRITE and rng.random() < 0.5:
            await wal.reset()
            model.reset()
        elif rng.random() < 0.3 and recovered:
            cut = recovered[rng.randrange(len(recovered))]
            await wal.trim(cut.offset)
            model.trim(cut.offset)
        await wal.close()
    assert model.acknowledged > 0
