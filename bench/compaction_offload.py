"""What running compaction's CPU work in a worker thread buys the event loop, under the GIL.

A compaction pass over ``--objects`` stream-set objects of ``--streams`` streams each (memory
object store and metadata: no disk, so only CPU and the GIL are measured) runs while a ticker
task on the same event loop sleeps 1 ms in a loop; the ticker's lateness is the delay any append
or read would see. Each round runs the pass with its CPU work in the worker thread (the default)
and inline on the loop, alternating, ``--runs`` rounds; the table shows the medians of the
pass time and of the ticker's p50, p99 and worst lateness, and the inline ÷ thread ratios.

    .venv/bin/python bench/compaction_offload.py            # 5 rounds
    .venv/bin/python bench/compaction_offload.py --quick    # 3 rounds, smaller objects

JSON to ``bench/results/compaction_offload.json``, a plot to ``compaction_offload.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from _report import Column, Table, grouped_bars, machine, percentile, save_plot, write_json
from walstream import Client, EngineConfig, Record
from walstream.config import CompactionConfig, UploadConfig
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal

RESULTS = Path(__file__).resolve().parent / "results"


async def one_pass(objects: int, streams: int, in_thread: bool) -> dict[str, float]:
    config = EngineConfig(
        upload=UploadConfig(max_bytes=256 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False, min_objects=2, max_bytes_per_s=0),
    )
    client = Client(
        wal=MemoryWal(), objects=MemoryObjectStore(), metadata=MemoryMetadataStore(), config=config
    )
    await client.start()
    try:
        handles = [await client.create_stream(f"s{i}") for i in range(streams)]
        value = os.urandom(200)
        for _ in range(objects):
            await asyncio.gather(*(h.append([Record(value)]) for h in handles))
            await client.flush()
        compactor = client._runtime.new_compactor()
        compactor.in_thread = in_thread
        lateness: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                started = time.perf_counter()
                await asyncio.sleep(0.001)
                lateness.append(time.perf_counter() - started - 0.001)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        lateness.clear()
        started = time.perf_counter()
        assert await compactor.compact_once()
        elapsed = time.perf_counter() - started
        done.set()
        await tick
    finally:
        await client.close()
    return {
        "pass_s": elapsed,
        "lag_p50_ms": percentile(lateness, 0.5) * 1e3,
        "lag_p99_ms": percentile(lateness, 0.99) * 1e3,
        "lag_max_ms": max(lateness) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.objects, args.streams, args.runs = 8, 3000, 3
    keys = ("pass_s", "lag_p50_ms", "lag_p99_ms", "lag_max_ms")
    runs: dict[str, list[dict[str, float]]] = {"thread": [], "inline": []}
    table = Table([Column("mode", width=8, align="<"), Column("round", width=5)]
                  + [Column(key, width=11, spec=".2f") for key in keys])  # fmt: skip
    table.print_header()
    for number in range(args.runs):
        for mode in ("thread", "inline"):
            result = asyncio.run(one_pass(args.objects, args.streams, mode == "thread"))
            runs[mode].append(result)
            table.print_row({"mode": mode, "round": number + 1, **result})
    medians = {mode: {k: statistics.median(r[k] for r in rows) for k in keys}
               for mode, rows in runs.items()}  # fmt: skip
    print("\nmedians")
    for mode, row in medians.items():
        table.print_row({"mode": mode, "round": "", **row})
    ratios = {k: medians["inline"][k] / medians["thread"][k] for k in keys}
    print("inline ÷ thread: " + ", ".join(f"{k} {v:.2f}×" for k, v in ratios.items()))
    print(f"load average: {os.getloadavg()[0]:.1f}")
    document: dict[str, Any] = {
        "machine": machine(),
        "load": os.getloadavg()[0],
        "options": vars(args),
        "runs": runs,
        "medians": medians,
        "inline_over_thread": ratios,
    }
    out = RESULTS / "compaction_offload.json"
    write_json(out, document)

    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(axis, list(keys), {m: [medians[m][k] for k in keys] for m in medians})
        axis.set_yscale("log")
        axis.set_title("compaction pass: CPU work in a thread vs on the loop (medians)")

    save_plot(out.with_suffix(".png"), draw)


if __name__ == "__main__":
    main()
