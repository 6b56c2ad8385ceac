"""Replay throughput of ``spark.read.format("walstream")``: local[1] vs local[2] on the same data.

    python bench/spark_replay.py [--quick] [--streams 3] [--records 200000] [--value-bytes 200]

Fills a fresh embedded deployment (local object store, SQLite metadata), then for each master
runs a full replay (every column decoded, values summed so nothing is pruned) once to warm up
and ``--runs`` times measured; reports the best run. Prints a table and writes
``bench/results/spark_replay.json`` and a plot beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import _profile
import walstream
from _report import Column, Table, grouped_bars, save_plot, write_json
from walstream import Record

RESULTS = Path(__file__).resolve().parent / "results" / "spark_replay.json"


async def fill(config: Path, streams: int, records: int, value_bytes: int) -> int:
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


def replay_once(spark: Any, config: Path, names: str) -> tuple[float, int]:
    from pyspark.sql import functions as F

    frame = (
        spark.read.format("walstream").option("config", str(config)).option("streams", names).load()
    )
    started = time.perf_counter()
    row = frame.agg(
        F.count("*").alias("n"),
        F.sum(F.length("value")).alias("bytes"),
        F.max("offset"),
        F.count("key"),
        F.count("headers"),
    ).collect()[0]
    return time.perf_counter() - started, int(row["n"])


TABLE = Table(
    [
        Column("master", width=10, align="<"),
        Column("records", width=10),
        Column("seconds", width=10),
        Column("records_per_s", "records/s", 12),
        Column("mib_per_s", "MiB/s", 9),
    ],
    separator="",
)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(
            axis,
            [row["master"] for row in results],
            {"records/s": [row["records_per_s"] for row in results]},
        )
        axis.set_ylabel("records/s")
        axis.set_title('spark.read.format("walstream") replay: local[1] vs local[2]')

    save_plot(path, draw, figsize=(6, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data, one measured run")
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000, help="records per stream")
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.records, args.runs = 30_000, 1

    from walstream_spark import local_session

    with tempfile.TemporaryDirectory(prefix="walstream-spark-bench-") as folder:
        data = Path(folder)
        config = data / "deploy.yaml"
        config.write_text(
            "node: {id: 1}\nwal: {type: memory}\n"
            "object_store: {type: local, root: objects}\nmetadata: {type: sqlite, path: meta.db}\n"
        )
        payload = asyncio.run(fill(config, args.streams, args.records, args.value_bytes))
        names = ",".join(f"replay-{index}" for index in range(args.streams))
        total = args.streams * args.records
        results = []
        for master in ("local[1]", "local[2]"):
            spark = local_session(master, "walstream-replay-bench")
            try:
                replay_once(spark, config, names)  # warm-up: Python workers, JIT, page cache
                with _profile.measured(f"replay_once {master}"):
                    best = min(replay_once(spark, config, names) for _ in range(args.runs))
                seconds, count = best
                assert count == total, f"replayed {count} records, expected {total}"
                results.append(
                    {
                        "master": master,
                        "records": total,
                        "payload_bytes": payload,
                        "seconds": round(seconds, 3),
                        "records_per_s": round(total / seconds),
                        "mib_per_s": round(payload / seconds / (1 << 20), 2),
                    }
                )
            finally:
                spark.stop()
    TABLE.print(results)
    write_json(
        RESULTS,
        {
            "benchmark": "spark_replay",
            "quick": args.quick,
            "streams": args.streams,
            "records_per_stream": args.records,
            "value_bytes": args.value_bytes,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "results": results,
        },
    )
    plot(results, RESULTS.with_suffix(".png"))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
