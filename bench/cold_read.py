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
and depth (``readahead_max_bytes`` by ``readahead_depth`` readers; each reader a client of the
shared closed loop, ``bench/common/loadgen.py``, with its share of the ranges). Every row is run
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
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import cli, profile
from common.loadgen import ClientDone, closed_loop
from common.report import Table, grouped_bars, save_plot, write_results
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
COLD = "cold read_committed"


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


async def write_stream(
    bucket: MemoryBucket, total_bytes: int, record_bytes: int
) -> tuple[MemoryMetadataStore, int, int]:
    """The stream written through the engine; its metadata, stream id and bytes written."""
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
    bucket: MemoryBucket, metadata: MemoryMetadataStore, stream_id: int, pipelined: bool = True
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
    """Back-to-back ranged GETs of ``get_bytes`` over every object by ``concurrency`` readers,
    reader i taking every i-th range."""
    store = store_on(bucket)
    ranges = [
        (key, start, min(start + get_bytes, size))
        for key, size in keys
        for start in range(0, size, get_bytes)
    ]
    shares: list[Iterator[tuple[str, int, int]]] = [
        iter(ranges[worker::concurrency]) for worker in range(concurrency)
    ]
    before = dict(bucket.requests)
    total = 0

    async def get(worker: int) -> int:
        nonlocal total
        key, start, end = next(shares[worker], ("", 0, 0))
        if not key:
            raise ClientDone
        data = await store.get(key, start, end)
        total += len(data)  # not `total += len(await ...)`: that reads total first
        return 1

    result = await closed_loop(get, concurrency, operations=len(ranges))
    return {
        "mib_per_s": round(total / result.elapsed_s / MiB, 1),
        "records": len(ranges),
        "seconds": round(result.elapsed_s, 2),
        **per_gib(bucket.requests, before, total),
    }


class Rows:
    """The rows measured so far, each printed as it comes."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, reader: str, figures: dict[str, Any]) -> None:
        self.rows.append({"reader": reader, **figures})
        TABLE.print_row(self.rows[-1])

    def median(self, reader: str) -> float:
        values = sorted(row["mib_per_s"] for row in self.rows if row["reader"] == reader)
        return float(values[len(values) // 2])


@dataclass
class Written:
    """The stream as written: its bytes, the objects they went into, the PUTs per GiB."""

    bytes: int
    objects: int
    puts_per_gib: float


async def measure(args: argparse.Namespace) -> tuple[Rows, Written]:
    """The stream written, then every row ``args.runs`` times."""
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

    rows = Rows()
    for run_number in range(1, args.runs + 1):
        for pipelined in (True, False):
            latency(run_number)
            with profile.measured("cold_read pipelined", when=pipelined):
                result = await cold_read(bucket, metadata, stream_id, pipelined)
            rows.add(COLD + ("" if pipelined else " (serial)"), result)
    bucket.latency = LatencyModel(0.0, 0.0)
    rows.add(f"{COLD} (no GET latency)", await cold_read(bucket, metadata, stream_id))
    cache = CacheConfig()
    for concurrency, get_bytes in (
        (1, args.raw_get_bytes),
        (args.raw_concurrency, args.raw_get_bytes),
        (cache.readahead_depth, cache.readahead_max_bytes),
    ):
        for run_number in range(1, args.runs + 1):
            latency(run_number)
            reader = f"raw {concurrency} x {get_bytes // MiB}MiB GET"
            rows.add(reader, await raw_gets(bucket, keys, get_bytes, concurrency))
    return rows, Written(written, len(objects), upload["puts_per_gib"])


def compare(rows: Rows, written: Written, runs: int) -> None:
    """The cold read's median over each raw row's (``cold_over_raw`` on the raw rows)."""
    median = rows.median(COLD)
    raws = list(
        dict.fromkeys(row["reader"] for row in rows.rows if row["reader"].startswith("raw"))
    )
    ratios = {reader: round(median / rows.median(reader), 2) for reader in raws}
    for row in rows.rows:
        if row["reader"] in ratios:
            row["cold_over_raw"] = ratios[row["reader"]]
    print(
        f"objects: {written.objects} ({written.bytes / written.objects / MiB:.1f} MiB each); "
        f"upload: {written.puts_per_gib} PUT/GiB; medians of {runs} runs: cold read {median} "
        f"MiB/s (serial {rows.median(COLD + ' (serial)')}) = "
        + ", ".join(
            f"{ratio}x {reader} ({rows.median(reader)} MiB/s)" for reader, ratio in ratios.items()
        )
    )


TABLE = Table.of_keys(
    ("reader", "mib_per_s", "seconds", "gets_per_gib", "heads_per_gib", "lists_per_gib"), 14
)


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(
            axis,
            [row["reader"] for row in rows],
            {"MiB/s": [row["mib_per_s"] for row in rows]},
            fontsize=7,
        )
        axis.set_ylabel("MiB/s")
        axis.set_title("cold catch-up read vs raw ranged GETs of the same store")

    return save_plot(path, draw, figsize=(8, 4))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "cold_read", quick="a 128 MiB stream")
    parser.add_argument("--stream-mib", type=int, default=None, help="default 512 (quick 128)")
    parser.add_argument("--record-bytes", type=int, default=4096)
    parser.add_argument("--get-p50-ms", type=float, default=50.0)
    parser.add_argument("--get-p99-ms", type=float, default=150.0)
    parser.add_argument("--raw-get-bytes", type=int, default=8 * MiB)
    parser.add_argument("--raw-concurrency", type=int, default=4)
    parser.add_argument("--runs", type=int, default=None, help="default 3 (smoke 1)")
    args = parser.parse_args(argv)
    args.stream_mib = cli.sized(args, args.stream_mib, full=512, quick=128, smoke=8)
    args.runs = cli.sized(args, args.runs, full=3, quick=3, smoke=1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    TABLE.print_header()
    rows, written = asyncio.run(measure(args))
    compare(rows, written, args.runs)
    document = {
        "benchmark": "cold_read",
        "mode": cli.mode(args),
        "arguments": {
            key: str(value) if isinstance(value, Path) else value
            for key, value in vars(args).items()
        },
        "rows": rows.rows,
    }
    write_results(args.json, document, lambda png: plot(rows.rows, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
