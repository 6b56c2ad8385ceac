"""Replay throughput of ``spark.read.format("walstream")``: local[1] vs local[2] on the same data.

    .venv/bin/python bench/spark_replay.py [--quick] [--streams 3] [--records 200000] [--value-bytes 200]

Fills a fresh embedded deployment (local object store, SQLite metadata), then for each master
runs a full replay (every column decoded, values summed so nothing is pruned) ``--warmup`` times
to warm up (Python workers, page cache, the JVM's JIT) and measures once; ``--runs`` rounds
alternate the two masters (one warm-up replay each after the first round), so the JVM's
compilations, which go on for several replays, warm both and not only the later one; reports
each master's best run.

What bounds the scaling is measured in the same runs, since py-spy sees only the Python side:
the CPU seconds each process spent in the best run — the JVM (Spark's task threads, Arrow to
rows, the aggregation), the Python workers (walstream reading and decoding, Arrow batches) and
this driver — read from ``/proc`` for this process and its descendants, and the cores they kept
busy. Two ceilings follow for local[2] over local[1]: the CPU one, ``cpus x seconds(local[1]) /
cpu_seconds(local[2])`` (local[2] doing its work with every core busy), and the task balance one,
``tasks / ceil(tasks / 2)`` (a task is one slice; equal slices on 2 slots). Prints a table and
writes ``bench/results/spark_replay.json`` and a plot beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import walstream
from common import cli, profile
from common.report import Column, Table, grouped_bars, save_plot, write_results
from walstream import Record

MASTERS = ("local[1]", "local[2]")
Replay = tuple[float, int, dict[str, float]]
"""(seconds, records, CPU seconds by kind of process) of one replay."""


async def fill(config: Path, streams: int, records: int, value_bytes: int) -> int:
    """``streams`` streams of ``records`` records each; the payload bytes written."""
    payload = 0
    async with walstream.open(str(config)) as client:
        for index in range(streams):
            stream = await client.create_stream(f"replay-{index}")
            for start in range(0, records, 2000):
                batch = [
                    Record(
                        f"{offset:012d}".encode().ljust(value_bytes, b"."),
                        key=b"k%d" % (offset % 97),
                    )
                    for offset in range(start, min(records, start + 2000))
                ]
                payload += sum(len(record.value) + len(record.key or b"") for record in batch)
                await stream.append(batch)
    return payload


def _descendants_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process and every descendant, by pid, with the kind
    of process: ``jvm``, ``python_workers`` (PySpark's daemon and the workers it forks),
    ``driver`` (this process) or ``other``."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, str, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                name, _, rest = stat.read().rpartition(")")
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        fields = rest.split()
        parent, cpu = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        table[int(entry)] = (parent, name.partition("(")[2], cpu, command)
    mine = os.getpid()
    found: dict[int, tuple[str, float]] = {}
    for pid, (_, comm, cpu, command) in table.items():
        ancestor = pid
        while ancestor not in (0, 1, mine) and ancestor in table:
            ancestor = table[ancestor][0]
        if ancestor != mine and pid != mine:
            continue
        if pid == mine:
            kind = "driver"
        elif comm == "java":
            kind = "jvm"
        elif "pyspark.daemon" in command or "pyspark/daemon" in command:
            kind = "python_workers"
        else:
            kind = "other"
        found[pid] = (kind, cpu)
    return found


def cpu_spent(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent by kind of process since ``before`` (processes started meanwhile
    count whole)."""
    spent: dict[str, float] = {}
    for pid, (kind, cpu) in _descendants_cpu().items():
        spent[kind] = spent.get(kind, 0.0) + cpu - before.get(pid, (kind, 0.0))[1]
    return {kind: round(seconds, 3) for kind, seconds in sorted(spent.items())}


def replay_once(spark: Any, config: Path, names: str) -> tuple[float, int, dict[str, float]]:
    from pyspark.sql import functions as F

    frame = (
        spark.read.format("walstream").option("config", str(config)).option("streams", names).load()
    )
    before = _descendants_cpu()
    started = time.perf_counter()
    row = frame.agg(
        F.count("*").alias("n"),
        F.sum(F.length("value")).alias("bytes"),
        F.max("offset"),
        F.count("key"),
        F.count("headers"),
    ).collect()[0]
    elapsed = time.perf_counter() - started
    return elapsed, int(row["n"]), cpu_spent(before)


def tasks_of(spark: Any, config: Path, names: str) -> int:
    """How many Spark tasks (slices) a replay runs."""
    frame = (
        spark.read.format("walstream").option("config", str(config)).option("streams", names).load()
    )
    return int(frame.rdd.getNumPartitions())


TABLE = Table(
    [
        Column("master", width=10, align="<"),
        Column("records", width=10),
        Column("seconds", width=10),
        Column("records_per_s", "records/s", 12),
        Column("mib_per_s", "MiB/s", 9),
        Column("tasks", width=7),
        Column("jvm_cpu_s", "JVM cpu s", 11),
        Column("python_cpu_s", "Python cpu s", 14),
        Column("cores_busy", "cores busy", 12),
    ],
    separator="",
)


@contextmanager
def deployment() -> Iterator[Path]:
    """A fresh embedded deployment (memory WAL, local objects, SQLite) in a throwaway folder."""
    with tempfile.TemporaryDirectory(prefix="walstream-spark-bench-") as folder:
        config = Path(folder) / "deploy.yaml"
        config.write_text(
            "node: {id: 1}\nwal: {type: memory}\n"
            "object_store: {type: local, root: objects}\nmetadata: {type: sqlite, path: meta.db}\n"
        )
        yield config


def measure(
    config: Path, names: str, args: argparse.Namespace
) -> tuple[dict[str, list[Replay]], dict[str, int]]:
    """``args.runs`` rounds alternating the masters: the replays of each and its task count."""
    from walstream_spark import local_session

    runs: dict[str, list[Replay]] = {master: [] for master in MASTERS}
    tasks: dict[str, int] = {}
    # Rounds alternate the masters: each JVM compilation warms both, not the later one.
    for round_number in range(args.runs):
        for master in MASTERS:
            spark = local_session(master, "walstream-replay-bench")
            try:
                # Python workers, JIT, page cache
                for _ in range(args.warmup if round_number == 0 else 1):
                    replay_once(spark, config, names)
                with profile.measured(f"replay_once {master}"):
                    runs[master].append(replay_once(spark, config, names))
                tasks[master] = tasks_of(spark, config, names)
            finally:
                spark.stop()
    return runs, tasks


def best_runs(
    runs: dict[str, list[Replay]], tasks: dict[str, int], total: int, payload: int
) -> list[dict[str, Any]]:
    """Each master's best replay as a row of the table."""
    results = []
    for master in MASTERS:
        seconds, count, cpu = min(runs[master], key=lambda run: run[0])
        assert count == total, f"replayed {count} records, expected {total}"
        results.append(
            {
                "master": master,
                "records": total,
                "payload_bytes": payload,
                "seconds": round(seconds, 3),
                "records_per_s": round(total / seconds),
                "mib_per_s": round(payload / seconds / (1 << 20), 2),
                "tasks": tasks[master],
                "cpu_seconds": cpu,
                "jvm_cpu_s": cpu.get("jvm", 0.0),
                "python_cpu_s": cpu.get("python_workers", 0.0),
                "cores_busy": round(sum(cpu.values()) / seconds, 2),
            }
        )
    return results


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(
            axis,
            [row["master"] for row in results],
            {"records/s": [row["records_per_s"] for row in results]},
        )
        axis.set_ylabel("records/s")
        axis.set_title('spark.read.format("walstream") replay: local[1] vs local[2]')

    return save_plot(path, draw, figsize=(6, 4))


def ceilings(results: list[dict[str, Any]], cpus: int) -> dict[str, Any]:
    """The scaling reached and the two ceilings of the module docstring."""
    one, two = results[0], results[1]
    two_cpu = sum(two["cpu_seconds"].values())
    tasks = two["tasks"]
    return {
        "scaling": round(one["seconds"] / two["seconds"], 3),
        "cpus": cpus,
        "cpu_ceiling": round(cpus * one["seconds"] / two_cpu, 3) if two_cpu else float("inf"),
        "balance_ceiling": round(tasks / -(-tasks // 2), 3),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "spark_replay", quick="small data: 30,000 records per stream")
    parser.add_argument("--streams", type=int, default=None, help="default 3 (smoke 1)")
    parser.add_argument("--records", type=int, default=None, help="records per stream")
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument(
        "--runs", type=int, default=None, help="measured rounds, each alternating the two masters"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="replays before the first round's measurement"
    )
    args = parser.parse_args(argv)
    args.streams = cli.sized(args, args.streams, full=3, quick=3, smoke=1)
    args.records = cli.sized(args, args.records, full=200_000, quick=30_000, smoke=2_000)
    args.runs = cli.sized(args, args.runs, full=3, quick=3, smoke=1)
    args.warmup = cli.sized(args, args.warmup, full=3, quick=3, smoke=0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with deployment() as config:
        payload = asyncio.run(fill(config, args.streams, args.records, args.value_bytes))
        names = ",".join(f"replay-{index}" for index in range(args.streams))
        runs, tasks = measure(config, names, args)
    results = best_runs(runs, tasks, args.streams * args.records, payload)
    TABLE.print(results)
    bounds = ceilings(results, os.cpu_count() or 1)
    print(
        f"local[2] / local[1] = {bounds['scaling']:.2f}x; this machine allows at most "
        f"{bounds['cpu_ceiling']:.2f}x by CPU ({bounds['cpus']} cores, local[1] keeps "
        f"{results[0]['cores_busy']:.2f} busy) and {bounds['balance_ceiling']:.2f}x by task "
        f"balance ({results[1]['tasks']} tasks on 2 slots)"
    )
    document = {
        "benchmark": "spark_replay",
        "mode": cli.mode(args),
        "quick": args.quick,
        "streams": args.streams,
        "records_per_stream": args.records,
        "value_bytes": args.value_bytes,
        "results": results,
        "bounds": bounds,
    }
    write_results(args.json, document, lambda png: plot(results, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
