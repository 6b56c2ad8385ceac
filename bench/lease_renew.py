"""Benchmark of the lease renewal (``renew_lease``) that the ``cluster:`` defaults rest on.

Times renewals of one node's lease on SQLite (a file in a temporary folder, synchronous=FULL) and
on PostgreSQL (a throwaway server on 127.0.0.1, fsync on, over TCP with asyncpg), next to the
peer that bounds it from below on the same store: one read of the node (``get_node``, no write,
no fsync), one call at a time (the shared closed loop with one client). Reports p50/p99/max per
store (medians of the runs) and renewal/read ratios; then the
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
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from common import cli
from common.loadgen import closed_loop
from common.report import Column, Table, grouped_bars, save_plot, write_results
from walstream.config.engine import ClusterConfig
from walstream.metadata import MetadataStore
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream_metadata_postgres import PostgresMetadataStore
from walstream_metadata_postgres.testing import PostgresServer

STORES = ("sqlite", "postgres")
Run = dict[str, dict[str, float]]
"""One run on one store: ``renew`` and ``read``, each p50/p99/max in ms."""


async def timed(call: Callable[[], Awaitable[Any]], count: int) -> dict[str, float]:
    """``count`` calls one after the other; p50, p99 and max in milliseconds."""

    async def once(_: int) -> int:
        await call()
        return 1

    result = await closed_loop(once, 1, operations=count)
    return {
        "p50_ms": statistics.median(result.latencies_s) * 1000,
        "p99_ms": result.latency(0.99, 1e3),
        "max_ms": result.latency(1.0, 1e3),
    }


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


async def measure_store(store: MetadataStore, count: int) -> Run:
    node = await store.register_node(1, {"type": "bench"})
    lease_ms = int(ClusterConfig().lease_duration_s * 1000)
    renew = await timed(lambda: store.renew_lease(1, node.node_epoch, lease_ms), count)
    read = await timed(lambda: store.get_node(1), count)
    await store.close()
    return {"renew": renew, "read": read}


async def measure(runs: int, count: int) -> dict[str, list[Run]]:
    """``runs`` runs, each on a fresh SQLite file then a fresh PostgreSQL schema."""
    results: dict[str, list[Run]] = {store: [] for store in STORES}
    with tempfile.TemporaryDirectory() as folder, PostgresServer() as server:
        for run in range(runs):
            sqlite = SqliteMetadataStore(Path(folder) / f"meta-{run}.db")
            results["sqlite"].append(await measure_store(sqlite, count))
            postgres = PostgresMetadataStore(server.dsn, schema=f"bench_{run}")
            results["postgres"].append(await measure_store(postgres, count))
    return results


def summarize(store_runs: list[Run], budget_ms: float) -> dict[str, float]:
    """Medians of the runs, the renew/read ratio, and the fence budget over the worst renewal."""
    row = {
        f"{kind}_{key}": statistics.median(run[kind][key] for run in store_runs)
        for kind in ("renew", "read")
        for key in ("p50_ms", "p99_ms", "max_ms")
    }
    row["renew_over_read_p50"] = row["renew_p50_ms"] / row["read_p50_ms"]
    worst = max(run["renew"]["max_ms"] for run in store_runs)
    row["fence_budget_over_worst_renew"] = budget_ms / worst
    return row


def plot(stores: dict[str, dict[str, float]], path: Path) -> bool:
    names = list(stores)

    def draw(figure: Any, axis: Any) -> None:
        keys = ("renew_p50_ms", "renew_p99_ms", "read_p50_ms")
        grouped_bars(
            axis,
            names,
            {
                key.replace("_ms", "").replace("_", " "): [stores[name][key] for name in names]
                for key in keys
            },
            fontsize=10,
        )
        axis.set_ylabel("ms")
        axis.set_title("renew_lease latency vs one read of the node")
        axis.legend()

    return save_plot(path, draw, figsize=(7, 4), dpi=100)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "lease_renew", quick="3 runs of 100 renewals")
    args = parser.parse_args(argv)
    args.runs = cli.sized(args, None, full=5, quick=3, smoke=1)
    args.count = cli.sized(args, None, full=300, quick=100, smoke=20)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(measure(args.runs, args.count))
    config = ClusterConfig()
    budget_ms = (config.lease_duration_s - config.fence_margin_s) * 1000
    stores = {name: summarize(store_runs, budget_ms) for name, store_runs in results.items()}
    print(f"renew_lease, medians of {args.runs} runs of {args.count} calls (ms)")
    TABLE.print({"store": name, **row} for name, row in stores.items())
    for name, row in stores.items():
        print(
            f"{name}: defaults (lease {config.lease_duration_s:g}s, heartbeat "
            f"{config.heartbeat_interval_s:g}s) fence after {budget_ms / 1000:g}s without a "
            f"renewal = {row['fence_budget_over_worst_renew']:.0f}x the slowest renewal measured"
        )
    summary = {
        "benchmark": "lease_renew",
        "mode": cli.mode(args),
        "runs": args.runs,
        "renewals_per_run": args.count,
        "stores": stores,
    }
    write_results(args.json, summary, lambda png: plot(stores, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
