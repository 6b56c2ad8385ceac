"""Benchmark of the lease renewal (``renew_lease``) that the ``cluster:`` defaults rest on.

Times renewals of one node's lease on SQLite (a file in a temporary folder, synchronous=FULL) and
on PostgreSQL (a throwaway server on 127.0.0.1, fsync on, over TCP with asyncpg), next to the
peer that bounds it from below on the same store: one read of the node (``get_node``, no write,
no fsync). Reports p50/p99/max per store (medians of the runs) and renewal/read ratios; then the
margin the defaults leave: the 2.7 s a node may go without a successful renewal before it fences
itself, as a multiple of the slowest renewal measured. Table on stdout, JSON in
``bench/results/lease_renew.json``, plot in ``bench/results/lease_renew.png``.

    .venv/bin/python bench/lease_renew.py            # 5 runs of 300 renewals per store
    .venv/bin/python bench/lease_renew.py --quick    # 3 runs of 100
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _report import Column, Table, grouped_bars, save_plot, write_json
from walstream.config.engine import ClusterConfig
from walstream.metadata import MetadataStore
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream_metadata_postgres import PostgresMetadataStore
from walstream_metadata_postgres.testing import PostgresServer

RESULTS = Path(__file__).resolve().parent / "results" / "lease_renew.json"
PLOT = RESULTS.with_suffix(".png")


async def _timed(call: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return sorted(times)


TABLE = Table(
    [
        Column("store", width=10, align="<"),
        Column("renew_p50_ms", "renew p50", 10, ".2f"),
        Column("renew_p99_ms", "p99", 8, ".2f"),
        Column("renew_max_ms", "max", 8, ".2f"),
        Column("read_p50_ms", "read p50", 9, ".2f"),
        Column("renew_over_read_p50", "ratio", 7, lambda ratio: f"{ratio:.1f}x"),
    ]
)


def _summary(times: list[float]) -> dict[str, float]:
    return {
        "p50_ms": statistics.median(times),
        "p99_ms": times[int(0.99 * (len(times) - 1))],
        "max_ms": times[-1],
    }


async def _measure(store: MetadataStore, count: int) -> dict[str, dict[str, float]]:
    node = await store.register_node(1, {"type": "bench"})
    lease_ms = int(ClusterConfig().lease_duration_s * 1000)
    renew = await _timed(lambda: store.renew_lease(1, node.node_epoch, lease_ms), count)
    read = await _timed(lambda: store.get_node(1), count)
    return {"renew": _summary(renew), "read": _summary(read)}


def _median_of(runs: list[dict[str, dict[str, float]]], kind: str, key: str) -> float:
    return statistics.median(run[kind][key] for run in runs)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 runs of 100 renewals")
    args = parser.parse_args()
    runs, count = (3, 100) if args.quick else (5, 300)
    results: dict[str, list[dict[str, dict[str, float]]]] = {"sqlite": [], "postgres": []}
    with tempfile.TemporaryDirectory() as folder, PostgresServer() as server:
        for run in range(runs):
            sqlite = SqliteMetadataStore(Path(folder) / f"meta-{run}.db")
            results["sqlite"].append(await _measure(sqlite, count))
            await sqlite.close()
            postgres = PostgresMetadataStore(server.dsn, schema=f"bench_{run}")
            results["postgres"].append(await _measure(postgres, count))
            await postgres.close()
    config = ClusterConfig()
    budget_ms = (config.lease_duration_s - config.fence_margin_s) * 1000
    summary: dict[str, Any] = {"runs": runs, "renewals_per_run": count, "stores": {}}
    print(f"renew_lease, medians of {runs} runs of {count} calls (ms)")
    TABLE.print_header()
    for name, store_runs in results.items():
        row = {
            f"{kind}_{key}": _median_of(store_runs, kind, key)
            for kind in ("renew", "read")
            for key in ("p50_ms", "p99_ms", "max_ms")
        }
        row["renew_over_read_p50"] = row["renew_p50_ms"] / row["read_p50_ms"]
        worst = max(run["renew"]["max_ms"] for run in store_runs)
        row["fence_budget_over_worst_renew"] = budget_ms / worst
        summary["stores"][name] = row
        TABLE.print_row({"store": name, **row})
    for name, row in summary["stores"].items():
        print(
            f"{name}: defaults (lease {config.lease_duration_s:g}s, heartbeat "
            f"{config.heartbeat_interval_s:g}s) fence after {budget_ms / 1000:g}s without a "
            f"renewal = {row['fence_budget_over_worst_renew']:.0f}x the slowest renewal measured"
        )
    write_json(RESULTS, summary)
    names = list(summary["stores"])

    def draw(figure: Any, axis: Any) -> None:
        keys = ("renew_p50_ms", "renew_p99_ms", "read_p50_ms")
        grouped_bars(
            axis,
            names,
            {
                key.replace("_ms", "").replace("_", " "): [
                    summary["stores"][name][key] for name in names
                ]
                for key in keys
            },
            fontsize=10,
        )
        axis.set_ylabel("ms")
        axis.set_title("renew_lease latency vs one read of the node")
        axis.legend()

    save_plot(PLOT, draw, figsize=(7, 4), dpi=100)
    print(f"wrote {RESULTS} and {PLOT}")


if __name__ == "__main__":
    asyncio.run(main())
