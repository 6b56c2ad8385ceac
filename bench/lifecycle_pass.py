"""Benchmark of a retention pass: its time follows the expired work, not the number of streams.

On SQLite (a file in a temporary folder, synchronous=FULL) with a local object folder, a node
holds N idle streams (no lifecycle setting) and, in each run, 10 streams with 1 s of retention
whose one object has expired. A run times one lifecycle pass (``Client.run_lifecycle``: the due
index, 10 trims, the garbage collection of 10 objects) and, alternating with it, its peer: one
listing of every stream (``list_streams``), the least a pass that scans all streams would read.
Medians of the runs per N; the pass should stay flat as N grows while the scan grows with it.
Table on stdout, JSON in ``bench/results/lifecycle_pass.json``, plot beside it.

    .venv/bin/python bench/lifecycle_pass.py            # N = 0, 1000, 5000; 7 runs each
    .venv/bin/python bench/lifecycle_pass.py --quick    # N = 0, 1000; 5 runs
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import cli
from common.report import Column, Table, grouped_bars, save_plot, write_results
from walstream import Client, EngineConfig, Record, StreamConfig
from walstream.clock import ManualClock
from walstream.config import CompactionConfig, UploadConfig
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream.wal.memory import MemoryWal

EXPIRING = 10
"""Streams whose records expire in each run (the work a pass has to do)."""

TABLE = Table(
    [
        Column("streams", "idle streams", 12),
        Column("pass_ms", "pass ms", 9, ".2f"),
        Column("scan_ms", "scan ms", 9, ".2f"),
        Column("scan_over_pass", "scan/pass", 10, lambda ratio: f"{ratio:.2f}x"),
        Column("trims", "trims/run", 10),
    ]
)


async def measure_size(idle: int, runs: int, folder: Path) -> dict[str, float]:
    clock = ManualClock(1_800_000_000_000)
    client = Client(
        wal=MemoryWal(name=f"bench-{os.getpid()}-{idle}"),
        objects=LocalObjectStore(folder / "objects"),
        metadata=SqliteMetadataStore(folder / "meta.db", clock=clock),
        config=EngineConfig(
            upload=UploadConfig(max_interval_s=3600), compaction=CompactionConfig(enabled=False)
        ),
        clock=clock,
    )
    await client.start()
    for index in range(idle):
        await client.metadata.create_stream(f"idle-{index}")
    passes: list[float] = []
    scans: list[float] = []
    trims: list[int] = []
    for run in range(runs):
        for index in range(EXPIRING):
            stream = await client.create_stream(
                f"expiring-{run}-{index}", config=StreamConfig(retention_age_s=1)
            )
            await stream.append([Record(b"x" * 100)])
        await client.flush()
        await client.run_lifecycle()  # nothing expired yet: the due times are set
        clock.advance(2.0)
        before = client.lifecycle.trims
        started = time.perf_counter()
        await client.run_lifecycle()
        passes.append((time.perf_counter() - started) * 1000)
        trims.append(client.lifecycle.trims - before)
        started = time.perf_counter()
        await client.metadata.list_streams()
        scans.append((time.perf_counter() - started) * 1000)
    await client.close()
    await client.metadata.close()
    pass_ms = statistics.median(passes)
    scan_ms = statistics.median(scans)
    return {
        "streams": idle,
        "pass_ms": pass_ms,
        "scan_ms": scan_ms,
        "scan_over_pass": scan_ms / pass_ms,
        "trims": statistics.median(trims),
    }


async def measure(sizes: list[int], runs: int) -> list[dict[str, float]]:
    rows = []
    TABLE.print_header()
    for idle in sizes:
        with tempfile.TemporaryDirectory() as folder:
            row = await measure_size(idle, runs, Path(folder))
        TABLE.print_row(row)
        rows.append(row)
    return rows


def plot(rows: list[dict[str, float]], path: Path) -> bool:
    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(
            axis,
            [f"{int(row['streams'])} idle" for row in rows],
            {
                "lifecycle pass (10 expired streams)": [row["pass_ms"] for row in rows],
                "scan of every stream (peer)": [row["scan_ms"] for row in rows],
            },
        )
        axis.set_ylabel("ms (median)")
        axis.set_title("A retention pass follows the expired work, not the stream count")

    return save_plot(path, draw, figsize=(7, 4), dpi=100)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "lifecycle_pass", quick="N = 0, 1000; 5 runs")
    parser.add_argument("--runs", type=int, help="runs per size")
    args = parser.parse_args(argv)
    args.runs = cli.sized(args, args.runs, full=7, quick=5, smoke=2)
    args.sizes = cli.sized(args, None, full=[0, 1000, 5000], quick=[0, 1000], smoke=[0, 20])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = asyncio.run(measure(args.sizes, args.runs))
    document = {"mode": cli.mode(args), "runs": args.runs, "expiring": EXPIRING, "rows": rows}
    write_results(args.json, document, lambda png: plot(rows, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
