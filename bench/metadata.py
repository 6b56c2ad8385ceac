"""Benchmark of the metadata stores' commit path: SQLite and PostgreSQL side by side.

Each committer is a node owning one stream; it commits one object (one range) per
``commit_objects`` call, the engine's upload shape, with ids prepared beforehand, so only the
commit is timed. 1 and 16 concurrent committers share one store instance (as an engine node
does). SQLite is a file in a temporary folder (WAL journal, synchronous=FULL); PostgreSQL is a
throwaway server on 127.0.0.1 (fsync on, synchronous_commit on) reached over TCP with asyncpg.
Both fsync every commit on the same disk.

Reports commit p50/p99 latency and commits/s per store and committer count (medians of the
runs), the PostgreSQL/SQLite ratio, and the reference figure of KIP-1150's PostgreSQL batch
coordinator (commit p99 10-20 ms). Table on stdout, JSON in ``bench/results/metadata.json``,
plot in ``bench/results/metadata.png``.

    .venv/bin/python bench/metadata.py            # 5 runs of 5 s per measurement
    .venv/bin/python bench/metadata.py --quick    # 3 runs of 1 s
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _report import Column, Table, grouped_bars, median_of, percentile, save_plot, write_json
from walstream.metadata import MetadataStore, ObjectCommit, ObjectKind, StreamRange
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream_metadata_postgres import PostgresMetadataStore
from walstream_metadata_postgres.testing import PostgresServer

RESULTS = Path(__file__).resolve().parent / "results" / "metadata.json"
PLOT = RESULTS.with_suffix(".png")
COMMITTERS = (1, 16)
REFERENCE_P99_MS = (10.0, 20.0)  # KIP-1150 reference implementation, PostgreSQL commit p99
_nodes = itertools.count(1)


async def measure(store: MetadataStore, committers: int, seconds: float) -> dict[str, float]:
    """``committers`` nodes commit for ``seconds``; latency quantiles and commits/s."""
    writers = []
    for _ in range(committers):
        node_id = next(_nodes)
        node = await store.register_node(node_id, {"type": "bench"})
        stream = await store.create_stream(f"bench-{node_id}")
        epoch = (await store.claim_stream(stream.stream_id, node_id, node.node_epoch)).epoch
        ids = await store.prepare_objects(max(2000, int(3000 * seconds / committers)), 3_600_000)
        writers.append((node_id, node.node_epoch, stream.stream_id, epoch, ids))
    latencies: list[float] = []
    stop_at = time.monotonic() + seconds

    async def commit_loop(
        node_id: int, node_epoch: int, stream_id: int, epoch: int, ids: list[int]
    ) -> None:
        end = 0
        for object_id in ids:
            if time.monotonic() >= stop_at:
                return
            commit = ObjectCommit(
                object_id,
                f"objects/{object_id:012d}",
                ObjectKind.STREAM,
                1 << 20,
                4096,
                (StreamRange(stream_id, end, end + 100, epoch),),
            )
            began = time.perf_counter()
            await store.commit_objects(node_id, node_epoch, [commit])
            latencies.append(time.perf_counter() - began)
            end += 100

    began = time.monotonic()
    await asyncio.gather(*(commit_loop(*writer) for writer in writers))
    elapsed = time.monotonic() - began
    return {
        "p50_ms": percentile(latencies, 0.50) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "commits_per_s": len(latencies) / elapsed,
        "commits": float(len(latencies)),
    }


async def run_store(
    make: Callable[[], MetadataStore], runs: int, seconds: float
) -> dict[int, dict[str, Any]]:
    results: dict[int, dict[str, Any]] = {}
    store = make()
    try:
        await store.deployment_id()  # create / migrate the schema outside the timing
        for committers in COMMITTERS:
            samples = [await measure(store, committers, seconds) for _ in range(runs)]
            results[committers] = median_of(samples) | {"runs": samples}
    finally:
        await store.close()
    return results


def commit_table(first: str) -> Table:
    """The commit-path table: ``first`` (store or driver), committers, p50/p99 ms, commits/s."""
    return Table(
        [
            Column(first, width=10, align="<"),
            Column("committers", width=10),
            Column("p50_ms", "p50 ms", 8, ".2f"),
            Column("p99_ms", "p99 ms", 8, ".2f"),
            Column("commits_per_s", "commits/s", 10, ".0f"),
        ]
    )


def plot(results: dict[str, dict[int, dict[str, Any]]]) -> bool:
    """Write the PNG; False when matplotlib is not installed (the table and JSON still are)."""
    labels = [
        f"{store}\n{n} committer{'s' if n > 1 else ''}" for store in results for n in COMMITTERS
    ]

    def values(key: str) -> list[float]:
        return [results[store][n][key] for store in results for n in COMMITTERS]

    def draw(figure: Any, axes: Any) -> None:
        latency, rate = axes
        grouped_bars(latency, labels, {"p50": values("p50_ms"), "p99": values("p99_ms")})
        latency.axhspan(*REFERENCE_P99_MS, color="grey", alpha=0.2, label="KIP-1150 p99 10-20 ms")
        latency.set_ylabel("commit latency (ms)")
        latency.legend(fontsize=8)
        grouped_bars(rate, labels, {"commits/s": values("commits_per_s")})
        rate.set_ylabel("commits/s")
        figure.suptitle("metadata commit path: SQLite vs PostgreSQL (fsync on)")

    return save_plot(PLOT, draw, figsize=(10, 4), columns=2, dpi=100)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs of 1 s per measurement")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 5)
    seconds = args.seconds or (1.0 if args.quick else 5.0)

    results: dict[str, dict[int, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="walstream-bench-metadata-") as folder:
        results["sqlite"] = await run_store(
            lambda: SqliteMetadataStore(Path(folder) / "meta.db"), runs, seconds
        )
    with PostgresServer() as server:
        results["postgres"] = await run_store(
            lambda: PostgresMetadataStore(server.dsn, schema="bench", pool_max=16), runs, seconds
        )

    print(f"\nmetadata commit path ({runs} runs x {seconds:g} s, medians; fsync on)")
    commit_table("store").print(
        {"store": store, "committers": committers, **row}
        for store, by_count in results.items()
        for committers, row in by_count.items()
    )
    ratios = {
        committers: {
            "p99": results["postgres"][committers]["p99_ms"]
            / results["sqlite"][committers]["p99_ms"],
            "commits_per_s": results["postgres"][committers]["commits_per_s"]
            / results["sqlite"][committers]["commits_per_s"],
        }
        for committers in COMMITTERS
    }
    for committers, ratio in ratios.items():
        print(
            f"postgres/sqlite at {committers:>2} committers: p99 x{ratio['p99']:.2f}, "
            f"commits/s x{ratio['commits_per_s']:.2f}"
        )
    print(
        f"reference: KIP-1150's PostgreSQL commit p99 {REFERENCE_P99_MS[0]:g}-"
        f"{REFERENCE_P99_MS[1]:g} ms; postgres here at 16 committers: "
        f"{results['postgres'][16]['p99_ms']:.1f} ms"
    )

    write_json(
        RESULTS,
        {
            "benchmark": "metadata",
            "quick": args.quick,
            "runs": runs,
            "seconds": seconds,
            "machine": platform.platform(),
            "results": {
                store: {str(n): row for n, row in rows.items()} for store, rows in results.items()
            },
            "postgres_over_sqlite": {str(n): ratio for n, ratio in ratios.items()},
            "reference_p99_ms": REFERENCE_P99_MS,
        },
    )
    if plot(results):
        print(f"\nwrote {RESULTS} and {PLOT}")
    else:
        print(f"\nwrote {RESULTS} (no plot)")


if __name__ == "__main__":
    asyncio.run(main())
