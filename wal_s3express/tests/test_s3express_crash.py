"""Crashes with real processes: a zone's server SIGKILLed under a continuous append workload
(acks continue; restarted empty, it is re-replicated), then the writer SIGKILLed and recovered
with another zone down — every acknowledged record exactly once."""

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
from walstream_wal_s3express import build_replicas
from walstream_wal_s3express.testing.zones import ZoneServer, zone_wal_options

# 32 appends in flight, payloads up to 2 KB, no trims by the writer (the test trims and resets
# between cycles, in process).
WRITER = WriterOptions(window=32, trims=False, max_body=2000)


async def zone_holds(zone_options: dict[str, Any], log_id: str, seqs: set[int]) -> bool:
    replica = build_replicas(zone_options, node_id=1)[0]
    try:
        listing = await replica.list_chunks(log_id)
    except Exception:
        return False
    finally:
        await replica.close()
    return seqs <= set(listing.chunks)


@pytest.mark.slow
async def test_zone_kill_and_writer_kill_cycles_recover_every_ack_exactly_once(
    open_wal: Any,
    zones: list[ZoneServer],
    wal_options: dict[str, Any],
    wait_for: Any,
    soak: bool,
    tmp_path: Path,
) -> None:
    cycles = 30 if soak else 3
    seed = int(os.environ.get("WALSTREAM_SEED", "4242"))
    rng = random.Random(seed)
    model = CrashModel(
        seed,
        contiguous=True,
        replay_hint=f"replay with WALSTREAM_SEED={seed}",
        max_body=WRITER.max_body,
    )
    epoch = 0
    first_down = rng.randrange(3)
    for cycle in range(cycles):
        epoch += 1
        writer = CrashWriter(
            BackendSpec(kind="wal", name="s3express", section=wal_options),
            seed=seed,
            cycle=cycle,
            epoch=epoch,
            options=WRITER,
            stderr=tmp_path / f"writer-{cycle}.stderr",
        )
        await writer.wait_acks(rng.randrange(50, 300))
        # a zone's server is SIGKILLed under load: appends keep being acknowledged
        victim = zones[first_down]
        victim.kill()
        killed_at = len(writer.acks)
        await writer.wait_acks(killed_at + rng.randrange(300, 800), timeout_s=15)
        # it comes back empty; the writer re-replicates every acknowledged chunk to it
        victim.start()
        await writer.wait_acks(len(writer.acks) + 100)
        acked_seqs = {offset >> 24 for offset, _, _ in writer.acks}
        victim_options = zone_wal_options(
            [victim], prefix=wal_options["prefix"], request_timeout=1.0
        )
        await wait_for(
            lambda options=victim_options, seqs=acked_seqs: zone_holds(options, "node-1", seqs),
            20,
        )
        await asyncio.sleep(rng.random() * 0.05)
        model.absorb(cycle, writer.kill())
        # recover with a different zone down (killed; it returns empty afterwards)
        second_down = rng.choice([index for index in range(3) if index != first_down])
        zones[second_down].kill()
        epoch += 1
        mode = rng.choice([WalMode.READ_WRITE, WalMode.FAILOVER])
        wal, recovered = await open_wal(epoch, mode=mode)
        model.check_records(cycle, recovered, complete=True)
        zones[second_down].start()
        if mode is WalMode.READ_WRITE:
            # the recovering writer re-replicates to the returned zone before we go on
            await wait_for(lambda wal=wal: not wal.lagging_replicas(), 20)
            if rng.random() < 0.5:
                await wal.reset()
                model.reset()
            elif recovered:
                cut = recovered[rng.randrange(len(recovered))]
                await wal.trim(cut.offset)
                model.trim(cut.offset)
        # (a FAILOVER instance runs no catch-up: the next writer re-replicates the zone)
        await wal.close()
        first_down = second_down
    assert model.acknowledged > 0
