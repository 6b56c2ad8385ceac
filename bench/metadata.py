"""Benchmark of the metadata stores' commit path: SQLite and PostgreSQL side by side.

Each committer is a node owning one stream; it commits one object (one range) per
``commit_objects`` call, the engine's upload shape, with ids prepared beforehand, so only the
commit is timed (each committer a client of the shared closed loop, ``bench/common/loadgen.py``). 1 and 16 concurrent committers share one store instance (as an engine node
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
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import cli
from common.loadgen import ClientDone, closed_loop
from common.report import Column, Table, grouped_bars, median_of, save_plot, write_results
from walstream.metadata import MetadataStore, ObjectCommit, ObjectKind, StreamRange
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream_metadata_postgres import PostgresMetadataStore
from walstream_metadata_postgres.testing import PostgresServer

COMMITTERS = (1, 16)
REFERENCE_P99_MS = (10.0, 20.0)  # KIP-1150 reference implementation, PostgreSQL commit p99
_nodes = itertools.count(1)


@dataclass
class Committer:
    """A node owning one stream, with object ids prepared for its commits."""

    node_id: int
    node_epoch: int
    stream_id: int
    epoch: int
    ids: Iterator[int]
    end: int = 0

    def next_commit(self) -> ObjectCommit:
        """The next object, one range of 100 records after the last (ClientDone: no ids left)."""
        object_id = next(self.ids, None)
        if object_id is None:
            raise ClientDone
        commit = ObjectCommit(
            object_id,
            f"objects/{object_id:012d}",
            ObjectKind.STREAM,
            1 << 20,
            4096,
            (StreamRange(self.stream_id, self.end, self.end + 100, self.epoch),),
        )
        self.end += 100
        return commit


async def committer(store: MetadataStore, ids: int) -> Committer:
    node_id = next(_nodes)
    node = await store.register_node(node_id, {"type": "bench"})
    stream = await store.create_stream(f"bench-{node_id}")
    epoch = (await store.claim_stream(stream.stream_id, node_id, node.node_epoch)).epoch
    prepared = await store.prepare_objects(ids, 3_600_000)
    return Committer(node_id, node.node_epoch, stream.stream_id, epoch, iter(prepared))


async def measure(store: MetadataStore, committers: int, seconds: float) -> dict[str, float]:
    """``committers`` nodes commit for ``seconds``; latency quantiles and commits/s."""
    ids = max(2000, int(3000 * seconds / committers))
    writers = [await committer(store, ids) for _ in range(committers)]

    async def commit(index: int) -> int:
        writer = writers[index]
        await store.commit_objects(writer.node_id, writer.node_epoch, [writer.next_commit()])
        return 1

    result = await closed_loop(commit, committers, seconds)
    return {
        "p50_ms": result.latency(0.50, 1e3),
        "p99_ms": result.latency(0.99, 1e3),
        "commits_per_s": result.operations_per_s,
        "commits": float(result.operations),
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


async def measure_stores(runs: int, seconds: float) -> dict[str, dict[int, dict[str, Any]]]:
    """SQLite in a temporary folder, then PostgreSQL on a throwaway server."""
    results: dict[str, dict[int, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="walstream-bench-metadata-") as folder:
        results["sqlite"] = await run_store(
            lambda: SqliteMetadataStore(Path(folder) / "meta.db"), runs, seconds
        )
    with PostgresServer() as server:
        results["postgres"] = await run_store(
            lambda: PostgresMetadataStore(server.dsn, schema="bench", pool_max=16), runs, seconds
        )
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


def ratios_of(results: dict[str, dict[int, dict[str, Any]]]) -> dict[int, dict[str, float]]:
    """PostgreSQL over SQLite per committer count: p99 and commits/s."""
    postgres, sqlite = results["postgres"], results["sqlite"]
    return {
        committers: {
            "p99": postgres[committers]["p99_ms"] / sqlite[committers]["p99_ms"],
            "commits_per_s": postgres[committers]["commits_per_s"]
            / sqlite[committers]["commits_per_s"],
        }
        for committers in COMMITTERS
    }


def plot(results: dict[str, dict[int, dict[str, Any]]], path: Path) -> bool:
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

    return save_plot(path, draw, figsize=(10, 4), columns=2, dpi=100)


def print_report(
    results: dict[str, dict[int, dict[str, Any]]], ratios: dict[int, dict[str, float]]
) -> None:
    commit_table("store").print(
        {"store": store, "committers": committers, **row}
        for store, by_count in results.items()
        for committers, row in by_count.items()
    )
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "metadata", quick="3 runs of 1 s per measurement")
    parser.add_argument("--runs", type=int, default=None, help="default 5 (quick 3)")
    parser.add_argument("--seconds", type=float, default=None, help="default 5 (quick 1)")
    args = parser.parse_args(argv)
    args.runs = cli.sized(args, args.runs, full=5, quick=3, smoke=1)
    args.seconds = cli.sized(args, args.seconds, full=5.0, quick=1.0, smoke=0.2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(measure_stores(args.runs, args.seconds))
    ratios = ratios_of(results)
    print(f"\nmetadata commit path ({args.runs} runs x {args.seconds:g} s, medians; fsync on)")
    print_report(results, ratios)
    document = {
        "benchmark": "metadata",
        "mode": cli.mode(args),
        "quick": args.quick,
        "runs": args.runs,
        "seconds": args.seconds,
        "results": {
            store: {str(n): row for n, row in rows.items()} for store, rows in results.items()
        },
        "postgres_over_sqlite": {str(n): ratio for n, ratio in ratios.items()},
        "reference_p99_ms": REFERENCE_P99_MS,
    }
    write_results(args.json, document, lambda png: plot(results, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
