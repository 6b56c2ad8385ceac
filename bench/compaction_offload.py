"""What running compaction's CPU work in a worker thread buys the event loop, under the GIL.

A compaction pass over ``--objects`` stream-set objects of ``--streams`` streams each (memory
object store and metadata: no disk, so only CPU and the GIL are measured) runs while a ticker
task on the same event loop sleeps 1 ms in a loop (a client of the shared closed loop,
``bench/common/loadgen.py``, whose operation is the sleep); the ticker's lateness, the latency of
a sleep less 1 ms, is the delay any append or read would see. Each round runs the pass with its CPU work in the worker thread (the default)
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
import sys
import time
from pathlib import Path
from typing import Any

from common import cli
from common.loadgen import closed_loop
from common.report import Column, Table, grouped_bars, save_plot, write_results
from walstream import Client, EngineConfig, Record
from walstream.config import CompactionConfig, UploadConfig
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal

TICK_S = 0.001
KEYS = ("pass_s", "lag_p50_ms", "lag_p99_ms", "lag_max_ms")
MODES = ("thread", "inline")


async def stream_set_objects(objects: int, streams: int) -> Client:
    """A started client whose store holds ``objects`` stream-set objects of ``streams`` streams
    (periodic uploads and compaction off)."""
    config = EngineConfig(
        upload=UploadConfig(max_bytes=256 << 20, max_interval_s=3600),
        compaction=CompactionConfig(enabled=False, min_objects=2, max_bytes_per_s=0),
    )
    client = Client(
        wal=MemoryWal(), objects=MemoryObjectStore(), metadata=MemoryMetadataStore(), config=config
    )
    await client.start()
    handles = [await client.create_stream(f"s{i}") for i in range(streams)]
    value = os.urandom(200)
    for _ in range(objects):
        await asyncio.gather(*(h.append([Record(value)]) for h in handles))
        await client.flush()
    return client


async def tick(_: int) -> int:
    await asyncio.sleep(TICK_S)
    return 1


async def one_pass(objects: int, streams: int, in_thread: bool) -> dict[str, float]:
    """One compaction pass with the ticker running; the pass time and the ticker's lateness."""
    client = await stream_set_objects(objects, streams)
    try:
        compactor = client._runtime.new_compactor()
        compactor.in_thread = in_thread
        await closed_loop(tick, 1, 0.05)  # the ticker runs before the pass starts
        done = asyncio.Event()
        ticker = asyncio.create_task(closed_loop(tick, 1, stop=done))
        started = time.perf_counter()
        assert await compactor.compact_once()
        elapsed = time.perf_counter() - started
        done.set()
        ticks = await ticker
    finally:
        await client.close()
    return {
        "pass_s": elapsed,
        "lag_p50_ms": (ticks.latency(0.5) - TICK_S) * 1e3,
        "lag_p99_ms": (ticks.latency(0.99) - TICK_S) * 1e3,
        "lag_max_ms": (ticks.latency(1.0) - TICK_S) * 1e3,
    }


TABLE = Table(
    [Column("mode", width=8, align="<"), Column("round", width=5)]
    + [Column(key, width=11, spec=".2f") for key in KEYS]
)


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """``args.runs`` rounds, each a pass in the thread then one inline."""
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    TABLE.print_header()
    for number in range(args.runs):
        for mode in MODES:
            result = asyncio.run(one_pass(args.objects, args.streams, mode == "thread"))
            runs[mode].append(result)
            TABLE.print_row({"mode": mode, "round": number + 1, **result})
    return runs


def plot(medians: dict[str, dict[str, float]], path: Path) -> bool:
    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(axis, list(KEYS), {m: [medians[m][k] for k in KEYS] for m in medians})
        axis.set_yscale("log")
        axis.set_title("compaction pass: CPU work in a thread vs on the loop (medians)")

    return save_plot(path, draw)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "compaction_offload", quick="3 rounds, smaller objects")
    parser.add_argument("--objects", type=int, default=None, help="default 16 (quick 8)")
    parser.add_argument("--streams", type=int, default=None, help="default 5000 (quick 3000)")
    parser.add_argument("--runs", type=int, default=None, help="default 5 (quick 3)")
    args = parser.parse_args(argv)
    args.objects = cli.sized(args, args.objects, full=16, quick=8, smoke=2)
    args.streams = cli.sized(args, args.streams, full=5000, quick=3000, smoke=100)
    args.runs = cli.sized(args, args.runs, full=5, quick=3, smoke=1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = measure(args)
    medians = {
        mode: {key: statistics.median(run[key] for run in rows) for key in KEYS}
        for mode, rows in runs.items()
    }
    print("\nmedians")
    for mode, row in medians.items():
        TABLE.print_row({"mode": mode, "round": "", **row})
    ratios = {key: medians["inline"][key] / medians["thread"][key] for key in KEYS}
    print("inline ÷ thread: " + ", ".join(f"{k} {v:.2f}×" for k, v in ratios.items()))
    document: dict[str, Any] = {
        "benchmark": "compaction_offload",
        "mode": cli.mode(args),
        "load": os.getloadavg()[0],
        "options": {key: value for key, value in vars(args).items() if key != "json"},
        "runs": runs,
        "medians": medians,
        "inline_over_thread": ratios,
    }
    write_results(args.json, document, lambda png: plot(medians, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
