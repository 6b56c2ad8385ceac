"""The metadata stores' hot paths, this checkout against an earlier commit, alternating runs.

A change to the SQL stores (SQLite, PostgreSQL) must not slow what the engine does all the time.
This runs the same workloads on the code of ``--baseline`` (a commit, extracted with
``git archive``; default ``HEAD``: what the working tree changes) and on the working tree, each
run in a fresh child process importing one tree (``PYTHONPATH``), alternating which goes first
from round to round (ABBA), on fresh stores: SQLite a file in a temporary folder (WAL journal,
synchronous=FULL); PostgreSQL one throwaway server on 127.0.0.1 (fsync on) shared by every run,
a fresh schema per run. Workloads, each through the shared closed loop
(``bench/common/loadgen.py``) for ``--seconds``:

- ``commit x1`` / ``commit x16``: 1 or 16 committers (a node and a stream each) commit one
  object of one range per ``commit_objects`` call, ids prepared beforehand (bench/metadata.py's
  shape);
- ``upload x16``: 16 committers each ``prepare_objects(1)`` then commit it (the engine's upload);
- ``commit wide``: 1 committer commits one stream-set object of 256 ranges per call, of streams
  drawn at random from 10,000 it owns (what a sealed block of appends to random streams
  commits; issue #31);
- ``read x16``: 16 readers call ``get_objects`` at random offsets of a stream of committed
  objects;
- ``renew x1``: one node renews its lease.

Prints per store and workload the medians over the rounds of ops/s, p99 latency and CPU time
per operation of the child process (every thread: on SQLite that is all the work, on PostgreSQL
the client's share) for the baseline and the working tree, their ratio (new / old), and the
median of the rounds' own new/old ratios (each round's two runs ran back to back, so this one
cancels the load other processes put on the machine between rounds; CPU time per operation is
the least disturbed by them). JSON in ``bench/results/metadata_ab.json``, plot beside it.

    .venv/bin/python bench/metadata_ab.py --baseline main          # 5 rounds of 3 s
    .venv/bin/python bench/metadata_ab.py --baseline main --quick  # 3 rounds of 1 s
    .venv/bin/python bench/metadata_ab.py --no-fsync   # the code's own cost: no fsync anywhere
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from common import cli
from common.loadgen import closed_loop
from common.report import Column, Table, grouped_bars, save_plot, write_results

ROOT = cli.BENCH.parent
STORES = ("sqlite", "postgres")
WORKLOADS = ("commit x1", "commit x16", "upload x16", "commit wide", "read x16", "renew x1")
#: ``commit wide``: streams owned, and ranges per committed object.
WIDE_STREAMS, WIDE_RANGES = 10_000, 256
SOURCES = ("core/src", "metadata_postgres/src")
Work = Callable[[], Awaitable[None]]


# -- the child: one tree, one store, every workload ------------------------------------------------


def _store(kind: str, where: str) -> Any:
    if kind == "sqlite":
        from walstream.metadata.sqlite import SqliteMetadataStore

        return SqliteMetadataStore(Path(where) / "meta.db")
    from walstream_metadata_postgres import PostgresMetadataStore

    dsn, schema = where.split(" ", 1)
    return PostgresMetadataStore(dsn, schema=schema, pool_max=16)


async def _measure(works: list[Work], seconds: float) -> dict[str, float]:
    async def operation(client: int) -> int:
        await works[client]()
        return 1

    result = await closed_loop(operation, len(works), seconds)
    return {
        "ops_per_s": result.operations_per_s,
        "p50_ms": result.latency(0.50, 1e3),
        "p99_ms": result.latency(0.99, 1e3),
        "cpu_us_per_op": result.cpu_s / max(1, result.operations) * 1e6,
    }


async def _child(kind: str, where: str, seconds: float, filled: int) -> dict[str, dict[str, float]]:
    from walstream.metadata import ObjectCommit, ObjectKind, StreamRange

    store = _store(kind, where)
    await store.deployment_id()  # create the schema outside the timing
    node_ids = iter(range(1, 1000))

    async def committer(label: str, prepare_each: bool) -> Work:
        node_id = next(node_ids)
        node = await store.register_node(node_id, {"type": "bench"})
        stream = await store.create_stream(f"{label}-{node_id}")
        epoch = (await store.claim_stream(stream.stream_id, node_id, node.node_epoch)).epoch
        ready: list[int] = [] if prepare_each else await store.prepare_objects(20_000, 3_600_000)
        end = 0

        async def commit() -> None:
            nonlocal end
            if prepare_each:
                object_id = (await store.prepare_objects(1, 3_600_000))[0]
            else:
                object_id = ready.pop()
            range_ = StreamRange(stream.stream_id, end, end + 100, epoch)
            commit = ObjectCommit(
                object_id, f"o/{object_id}", ObjectKind.STREAM, 1 << 20, 64, (range_,)
            )
            await store.commit_objects(node_id, node.node_epoch, [commit])
            end += 100

        return commit

    results: dict[str, dict[str, float]] = {}
    results["commit x1"] = await _measure([await committer("c1", False)], seconds)
    results["commit x16"] = await _measure(
        [await committer("c16", False) for _ in range(16)], seconds
    )
    results["upload x16"] = await _measure(
        [await committer("u16", True) for _ in range(16)], seconds
    )

    async def wide_committer() -> Work:
        node_id = next(node_ids)
        node = await store.register_node(node_id, {"type": "bench"})
        epochs: dict[int, int] = {}
        for first in range(0, WIDE_STREAMS, 1000):
            names = [f"wide-{i}" for i in range(first, first + 1000)]
            created = await store.create_streams(names)
            ids = [stream.stream_id for stream in created]
            claimed = await store.claim_streams(ids, node_id, node.node_epoch)
            epochs.update((stream_id, info.epoch) for stream_id, info in claimed.items())
        streams = sorted(epochs)
        ends = dict.fromkeys(streams, 0)
        ready = await store.prepare_objects(5_000, 3_600_000)
        rng = random.Random(31)

        async def commit() -> None:
            object_id = ready.pop()
            ranges = []
            for stream_id in sorted(rng.sample(streams, WIDE_RANGES)):
                end = ends[stream_id]
                ranges.append(StreamRange(stream_id, end, end + 4, epochs[stream_id], 1000, 2000))
                ends[stream_id] = end + 4
            commit = ObjectCommit(
                object_id, f"o/{object_id}", ObjectKind.STREAM_SET, 1 << 20, 64, tuple(ranges)
            )
            await store.commit_objects(node_id, node.node_epoch, [commit])

        return commit

    results["commit wide"] = await _measure([await wide_committer()], seconds)

    fill = await committer("read", False)
    for _ in range(filled):
        await fill()
    (stream,) = await store.list_streams("read-")
    rng = random.Random(7)

    async def read() -> None:
        found = await store.get_objects(stream.stream_id, rng.randrange(filled * 100), limit=10)
        assert found

    results["read x16"] = await _measure([read] * 16, seconds)

    node_id = next(node_ids)
    node = await store.register_node(node_id, {"type": "bench"})

    async def renew() -> None:
        await store.renew_lease(node_id, node.node_epoch, 60_000)

    results["renew x1"] = await _measure([renew], seconds)
    await store.close()
    return results


# -- the parent: trees, rounds, report -------------------------------------------------------------


def _extract(ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, *SOURCES],
        capture_output=True,
        check=True,
    ).stdout
    tree = into / "baseline"
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _run_child(
    tree: Path, kind: str, where: str, seconds: float, filled: int
) -> dict[str, dict[str, float]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(tree / source) for source in SOURCES))
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, where, str(seconds), str(filled)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=tree,
    )
    if done.returncode != 0:
        raise SystemExit(f"child ({tree}, {kind}) failed:\n{done.stderr}")
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "metadata_ab", quick="3 rounds of 1 s per workload")
    parser.add_argument(
        "--baseline", default="HEAD", help="the commit to compare with (a git ref; default HEAD)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="ABBA rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=None, help="per workload (default 3)")
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="SQLite files on /dev/shm and PostgreSQL with fsync=off: what the code costs, "
        "without the disk (shared disks make fsync the noisiest part of a run)",
    )
    parser.add_argument(
        "--sqlite-folder",
        default=None,
        help="where the SQLite files go (default: the system's temporary folder; /dev/shm with "
        "--no-fsync)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.rounds = cli.sized(args, args.rounds, full=5, quick=3, smoke=1)
    args.seconds = cli.sized(args, args.seconds, full=3.0, quick=1.0, smoke=0.2)
    args.filled = cli.sized(args, None, full=2000, quick=2000, smoke=100)
    if args.no_fsync and args.sqlite_folder is None:
        args.sqlite_folder = "/dev/shm"
    return args


def measure(args: argparse.Namespace) -> dict[str, dict[str, dict[str, list[dict[str, float]]]]]:
    """Every round's runs: store -> side ("old", "new") -> workload -> one row per round."""
    from walstream_metadata_postgres.testing import PostgresServer

    settings = {"fsync": "off", "synchronous_commit": "off"} if args.no_fsync else {}
    samples: dict[str, dict[str, dict[str, list[dict[str, float]]]]] = {
        store: {side: {w: [] for w in WORKLOADS} for side in ("old", "new")} for store in STORES
    }
    with (
        tempfile.TemporaryDirectory(prefix="walstream-bench-ab-") as folder,
        PostgresServer(settings=settings) as server,
    ):
        trees = {"old": _extract(args.baseline, Path(folder)), "new": ROOT}
        runs = 0
        for round_ in range(args.rounds):
            order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
            for store in STORES:
                for side in order:
                    runs += 1
                    if store == "sqlite":
                        where = tempfile.mkdtemp(prefix=f"run-{runs}-", dir=args.sqlite_folder)
                    else:
                        where = f"{server.dsn} ab_{runs}"
                    try:
                        result = _run_child(trees[side], store, where, args.seconds, args.filled)
                    finally:
                        if store == "sqlite":
                            shutil.rmtree(where, ignore_errors=True)
                    for workload, row in result.items():
                        samples[store][side][workload].append(row)
                    print(
                        f"round {round_ + 1}/{args.rounds} {store:8} {side}: "
                        + ", ".join(f"{w} {row['ops_per_s']:.0f}/s" for w, row in result.items()),
                        flush=True,
                    )
    return samples


def summarize(
    samples: dict[str, dict[str, dict[str, list[dict[str, float]]]]],
) -> list[dict[str, Any]]:
    """One row per store and workload: medians of each side, their ratio, and the median of
    the rounds' paired ratios."""

    def median(store: str, side: str, workload: str, key: str) -> float:
        return statistics.median(run[key] for run in samples[store][side][workload])

    def paired(store: str, workload: str, key: str) -> float:
        pairs = zip(samples[store]["old"][workload], samples[store]["new"][workload], strict=True)
        return statistics.median(new[key] / old[key] for old, new in pairs)

    rows = []
    for store in STORES:
        for workload in WORKLOADS:
            row: dict[str, Any] = {"store": store, "workload": workload}
            for key, short in (("ops_per_s", "ops"), ("p99_ms", "p99"), ("cpu_us_per_op", "cpu")):
                old, new = median(store, "old", workload, key), median(store, "new", workload, key)
                row |= {f"old_{short}": old, f"new_{short}": new}
                row[f"{short}_ratio"] = new / old
                row[f"{short}_paired"] = paired(store, workload, key)
            rows.append(row)
    return rows


TABLE = Table(
    [
        Column("store", width=8, align="<"),
        Column("workload", width=11, align="<"),
        Column("old_ops", "old ops/s", 10, ".0f"),
        Column("new_ops", "new ops/s", 10, ".0f"),
        Column("ops_ratio", "new/old", 8, ".2f"),
        Column("ops_paired", "paired", 7, ".2f"),
        Column("old_p99", "old p99 ms", 11, ".2f"),
        Column("new_p99", "new p99 ms", 11, ".2f"),
        Column("p99_paired", "paired", 7, ".2f"),
        Column("old_cpu", "old cpu us", 11, ".0f"),
        Column("new_cpu", "new cpu us", 11, ".0f"),
        Column("cpu_paired", "paired", 7, ".2f"),
    ]
)


def plot(rows: list[dict[str, Any]], baseline: str, png: Path) -> bool:
    def draw(figure: Any, axes: Any) -> None:
        for axis, store in zip(axes, STORES, strict=True):
            mine = [row for row in rows if row["store"] == store]
            grouped_bars(
                axis,
                [row["workload"] for row in mine],
                {"old": [row["old_ops"] for row in mine], "new": [row["new_ops"] for row in mine]},
            )
            axis.set_title(store)
            axis.set_ylabel("ops/s (median)")
            axis.legend(fontsize=8)
        figure.suptitle(f"metadata hot paths: {baseline} vs working tree")

    return save_plot(png, draw, figsize=(12, 4), columns=2, dpi=100)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        kind, where, seconds, filled = args.child
        print(json.dumps(asyncio.run(_child(kind, where, float(seconds), int(filled)))))
        return 0
    load_before = os.getloadavg()
    samples = measure(args)
    rows = summarize(samples)
    print(
        f"\nmetadata hot paths: {args.baseline} (old) against the working tree (new); medians of "
        f"{args.rounds} ABBA rounds x {args.seconds:g} s"
        f"{' without fsync' if args.no_fsync else ''}; load average {load_before[0]:.2f} before"
    )
    TABLE.print(rows)
    document = {
        "benchmark": "metadata_ab",
        "mode": cli.mode(args),
        "baseline": args.baseline,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "no_fsync": args.no_fsync,
        "sqlite_folder": args.sqlite_folder,
        "rows": rows,
        "runs": samples,
    }
    write_results(args.json, document, lambda png: plot(rows, args.baseline, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
