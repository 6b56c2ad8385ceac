"""Benchmark: catch-up read of a cold stream (every record only in object storage) beside the
ranged-GET throughput of the same store, measured in the same run.

The stream is written through the engine (memory WAL, memory metadata) into an in-memory S3
bucket behind the production S3 client (``walstream_wal_s3.testing.memory_s3``); then a fresh
reader with empty caches reads it from the start with ``walstream.engine.read.read_committed``
(what ``walstream read`` and Spark executors do) — with read-ahead pipelining and, for
comparison, without (``(serial)`` rows: ``readahead_depth=0``) — while every GET waits a
lognormal latency (p50 50 ms / p99 150 ms by default, ``walstream_wal_s3.testing.latency``).
The ``(no GET latency)`` row is the same read with the latency model off: what decoding and
checking the records costs, the ceiling of the latency rows. ``raw`` is the store alone:
back-to-back ranged GETs over the same objects, neither checked nor decoded, of
``--raw-get-bytes`` by 1 and by ``--raw-concurrency`` readers, and of the reader's own GET size
and depth (``readahead_max_bytes`` by ``readahead_depth`` readers). Every row is run
``--runs`` times; run n of every row draws the same latencies (seed n), and the summary line
compares medians. The latency model has no bandwidth term, so a GET of 32 MiB takes as long as
one of 8 MiB: ranged-GET throughput here is the bytes in flight over the latency, and only the
raw row with the reader's GET size and depth compares like with like. Requests are counted at
the store: GETs, HEADs and LISTs per GiB read (and PUTs per GiB written by the upload). Prints a
table, writes ``bench/results/cold_read.json`` and a PNG (when matplotlib is installed).

    .venv/bin/python bench/cold_read.py            # 512 MiB stream
    .venv/bin/python bench/cold_read.py --quick    # 128 MiB stream
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time
from pathlib import Path
from typing import Any

import _profile
from _report import Table, grouped_bars, save_plot, write_json
from walstream import Client, EngineConfig, Record
from walstream.config import CacheConfig, CompactionConfig, UploadConfig
from walstream.engine.object_reader import ObjectReader
from walstream.engine.read import read_committed
from walstream.metadata import ObjectState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.wal.memory import MemoryWal
from walstream_wal_s3 import S3ObjectStore, S3Settings
from walstream_wal_s3.testing.latency import LatencyModel
from walstream_wal_s3.testing.memory_s3 import MemoryBucket, MemoryS3Client

RESULTS = Path(__file__).resolve().parent / "results" / "cold_read.json"
MiB = 1 << 20
GiB = 1 << 30
SETTINGS = S3Settings(
    bucket="cold-read",
    endpoint_url="http://memory.invalid",
    region="us-east-1",
    access_key_id="bench",
    secret_access_key="bench",
    max_pool_connections=64,
)


def store_on(bucket: MemoryBucket) -> S3ObjectStore:
    return S3ObjectStore(SETTINGS, client=MemoryS3Client(SETTINGS, bucket))


def per_gib(requests: dict[str, int], before: dict[str, int], size: int) -> dict[str, float]:
    def rate(operation: str) -> float:
        return round((requests.get(operation, 0) - before.get(operation, 0)) * GiB / size, 1)

    return {
        "gets_per_gib": rate("get_object"),
        "heads_per_gib": rate("head_object"),
        "lists_per_gib": rate("list_objects_v2"),
        "puts_per_gib": rate("put_object"),
    }


async def write_stream(bucket: MemoryBucket, total_bytes: int, record_bytes: int) -> Any:
    name = f"cold-{time.monotonic_ns()}"
    metadata = MemoryMetadataStore(name=name)
    config = EngineConfig(
        upload=UploadConfig(max_bytes=64 << 20, max_interval_s=60.0),
        compaction=CompactionConfig(enabled=False),
    )
    payload = b"c" * record_bytes
    async with Client(
        wal=MemoryWal(name=name), objects=store_on(bucket), metadata=metadata, config=config
    ) as client:
        stream = await client.create_stream("cold")
        batch = [Record(payload)] * max(1, (1 << 20) // record_bytes)
        written = 0
        while written < total_bytes:
            await stream.append(batch)
            written += len(batch) * record_bytes
        await client.flush()
        return metadata, stream.stream_id, written


async def cold_read(
    bucket: MemoryBucket, metadata: Any, stream_id: int, pipelined: bool = True
) -> dict[str, Any]:
    store = store_on(bucket)
    # Without pipelining every window is fetched when needed: what pipelining buys.
    reader = (
        ObjectReader(store, metadata)
        if pipelined
        else ObjectReader(store, metadata, readahead_depth=0)
    )
    before = dict(bucket.requests)
    records = size = 0
    started = time.perf_counter()
    async for record in read_committed(store, metadata, stream_id, 0, reader=reader):
        records += 1
        size += len(record.value)
    elapsed = time.perf_counter() - started
    return {
        "mib_per_s": round(size / elapsed / MiB, 1),
        "records": records,
        "seconds": round(elapsed, 2),
        **per_gib(bucket.requests, before, size),
    }


async def raw_gets(
    bucket: MemoryBucket, keys: list[tuple[str, int]], get_bytes: int, concurrency: int
) -> dict[str, Any]:
    store = store_on(bucket)
    ranges = [
        (key, start, min(start + get_bytes, size))
        for key, size in keys
        for start in range(0, size, get_bytes)
    ]
    before = dict(bucket.requests)
    total = 0
    started = time.perf_counter()

    async def reader(worker: int) -> None:
        nonlocal total
        for key, start, end in ranges[worker::concurrency]:
            data = await store.get(key, start, end)
            total += len(data)

    await asyncio.gather(*(reader(worker) for worker in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {
        "mib_per_s": round(total / elapsed / MiB, 1),
        "records": len(ranges),
        "seconds": round(elapsed, 2),
        **per_gib(bucket.requests, before, total),
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    bucket = MemoryBucket(LatencyModel(0.0, 0.0))
    metadata, stream_id, written = await write_stream(
        bucket, args.stream_mib * MiB, args.record_bytes
    )
    upload = per_gib(bucket.requests, {}, written)
    objects = await metadata.list_objects(state=ObjectState.COMMITTED)
    keys = [(info.key, len(bucket.objects[SETTINGS.prefix + info.key])) for info in objects]

    def latency(run: int) -> None:
        # Run n of every row draws the same latencies (seed n): rows that make as many GETs
        # wait as long, whatever ran before them.
        bucket.latency = LatencyModel(
            args.get_p50_ms, args.get_p99_ms, methods=frozenset({"GET", "HEAD"}), seed=run
        )

    rows: list[dict[str, Any]] = []
    for run_number in range(1, args.runs + 1):
        for pipelined in (True, False):
            latency(run_number)
            with _profile.measured("cold_read pipelined", when=pipelined):
                result = await cold_read(bucket, metadata, stream_id, pipelined)
            rows.append(
                {"reader": "cold read_committed" + ("" if pipelined else " (serial)"), **result}
            )
            TABLE.print_row(rows[-1])
    bucket.latency = LatencyModel(0.0, 0.0)
    rows.append(
        {
            "reader": "cold read_committed (no GET latency)",
            **await cold_read(bucket, metadata, stream_id),
        }
    )
    TABLE.print_row(rows[-1])
    cache = CacheConfig()
    for concurrency, get_bytes in (
        (1, args.raw_get_bytes),
        (args.raw_concurrency, args.raw_get_bytes),
        (cache.readahead_depth, cache.readahead_max_bytes),
    ):
        for run_number in range(1, args.runs + 1):
            latency(run_number)
            rows.append(
                {
                    "reader": f"raw {concurrency} x {get_bytes // MiB}MiB GET",
                    **await raw_gets(bucket, keys, get_bytes, concurrency),
                }
            )
            TABLE.print_row(rows[-1])

    def median_of(reader: str) -> float:
        values = sorted(row["mib_per_s"] for row in rows if row["reader"] == reader)
        return float(values[len(values) // 2])

    median = median_of("cold read_committed")
    raws = list(dict.fromkeys(row["reader"] for row in rows if row["reader"].startswith("raw")))
    ratios = {reader: round(median / median_of(reader), 2) for reader in raws}
    for row in rows:
        if row["reader"] in ratios:
            row["cold_over_raw"] = ratios[row["reader"]]
    print(
        f"objects: {len(objects)} ({written / len(objects) / MiB:.1f} MiB each); upload: "
        f"{upload['puts_per_gib']} PUT/GiB; medians of {args.runs} runs: cold read {median} "
        f"MiB/s (serial {median_of('cold read_committed (serial)')}) = "
        + ", ".join(
            f"{ratio}x {reader} ({median_of(reader)} MiB/s)" for reader, ratio in ratios.items()
        )
    )
    return rows


TABLE = Table.of_keys(
    ("reader", "mib_per_s", "seconds", "gets_per_gib", "heads_per_gib", "lists_per_gib"), 14
)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(
            axis,
            [row["reader"] for row in rows],
            {"MiB/s": [row["mib_per_s"] for row in rows]},
            fontsize=7,
        )
        axis.set_ylabel("MiB/s")
        axis.set_title("cold catch-up read vs raw ranged GETs of the same store")

    save_plot(path, draw, figsize=(8, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 128 MiB stream")
    parser.add_argument("--stream-mib", type=int, default=None)
    parser.add_argument("--record-bytes", type=int, default=4096)
    parser.add_argument("--get-p50-ms", type=float, default=50.0)
    parser.add_argument("--get-p99-ms", type=float, default=150.0)
    parser.add_argument("--raw-get-bytes", type=int, default=8 * MiB)
    parser.add_argument("--raw-concurrency", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.stream_mib is None:
        args.stream_mib = 128 if args.quick else 512
    TABLE.print_header()
    rows = asyncio.run(run(args))
    write_json(
        RESULTS,
        {
            "benchmark": "cold_read",
            "arguments": vars(args),
            "python": platform.python_version(),
            "rows": rows,
        },
    )
    plot(rows, RESULTS.with_suffix(".png"))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
