"""Benchmark of the s3 WAL: ack latency, throughput and S3 request cost, beside the rig's own
raw PUT throughput measured in the same run.

Two stores:

- ``latency-model``: an in-memory bucket behind the production ``S3Client``
  (``walstream_wal_s3.testing.memory_s3``: retries, error translation and request counting run,
  the store itself costs a dict operation); every PUT, GET and LIST of a WAL key waits a
  lognormal latency first (p50 50 ms / p99 150 ms, ``walstream_wal_s3.testing.latency``,
  simulated in the event loop: the model costs no CPU, unlike a proxy process);
- ``moto``: real HTTP to a moto S3 server on 127.0.0.1, no added latency (moto's own cost).

Workloads: one appender with 4 KiB records (an idle WAL: every append is its own object) and
64 concurrent appenders with 64 KiB records (grouping, many PUTs in flight). For each it reports
ack latency p50/p99 (call to acknowledgement), throughput, and S3 PUTs/GETs/LISTs per GiB
appended, counted at the client. The ``raw`` rows are the rig alone: plain PUTs of the same sizes
by as many concurrent writers (and 8 writers of 4 MiB objects, the WAL's group size under load),
through the same latency model; ``vs raw`` is the WAL's throughput over the raw PUTs of its
shape (the wide workload, 1024 appenders, is compared with the 4 MiB PUTs its groups are made
of). A table is printed, JSON goes to ``bench/results/wal_s3.json`` and a plot to
``bench/results/wal_s3.png``.

The WAL's appenders and the raw writers are the shared closed loop
(``bench/common/loadgen.py``).

    .venv/bin/python bench/wal_s3.py            # 10 s per measurement
    .venv/bin/python bench/wal_s3.py --quick    # 3 s per measurement
    .venv/bin/python bench/wal_s3.py --quick --fence-lease 0   # a LIST after every group
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sys
from pathlib import Path
from typing import Any

from common import cli, profile
from common.loadgen import LoopResult, closed_loop
from common.report import Table, grouped_bars, save_plot, write_results
from walstream.wal import WalMode
from walstream_wal_s3 import S3ObjectStore, S3Settings, S3Wal
from walstream_wal_s3.testing.latency import LatencyModel
from walstream_wal_s3.testing.memory_s3 import MemoryBucket, MemoryS3Client
from walstream_wal_s3.testing.moto import TEST_CREDENTIALS, MotoServer
from walstream_wal_s3.wal import DEFAULT_FENCE_LEASE_S

BUCKET = "walstream-bench"
PUT_P50_MS, PUT_P99_MS = 50.0, 150.0
GiB = 1 << 30
MiB = 1 << 20
Shape = tuple[str, int, int]
"""(name, appenders or writers, bytes per append or PUT)."""
WORKLOADS: tuple[Shape, ...] = (("1 x 4KiB", 1, 4 << 10), ("64 x 64KiB", 64, 64 << 10))
#: Enough appenders that the WAL's own window (8 PUTs of up to 8 MiB), not the appenders' wait
#: for their acknowledgements, bounds throughput (latency model only).
WIDE: Shape = ("1024 x 64KiB", 1024, 64 << 10)
RAW_BIG: Shape = ("8 x 4MiB", 8, 4 << 20)
TARGET_MIB_S = 200.0
MAX_BATCH_BYTES = 8 << 20
MAX_BATCH_INTERVAL_S = 0.25


def store_for(endpoint_url: str | None, model: LatencyModel | None) -> S3ObjectStore:
    """A store on moto (``endpoint_url``) or, without one, on an in-memory bucket with ``model``."""
    settings = S3Settings(
        bucket=BUCKET,
        endpoint_url=endpoint_url or "http://memory.invalid",
        region="us-east-1",
        max_pool_connections=64,
        access_key_id=TEST_CREDENTIALS["access_key_id"],
        secret_access_key=TEST_CREDENTIALS["secret_access_key"],
    )
    if endpoint_url is None:
        return S3ObjectStore(settings, client=MemoryS3Client(settings, MemoryBucket(model)))
    return S3ObjectStore(settings)


def model_for(endpoint_url: str | None) -> LatencyModel | None:
    """A fresh model per measurement (the same seeded latency sequence for each); none on moto."""
    if endpoint_url is not None:
        return None
    return LatencyModel(
        PUT_P50_MS, PUT_P99_MS, methods=frozenset({"PUT", "GET"}), url_contains="wal"
    )


def per_gib(counts: dict[str, int], appended: int) -> dict[str, int]:
    def rate(*operations: str) -> int:
        return round(sum(counts.get(op, 0) for op in operations) * GiB / max(1, appended))

    return {
        "puts_per_gib": rate("put_object"),
        "gets_per_gib": rate("get_object", "head_object"),
        "lists_per_gib": rate("list_objects_v2"),
    }


def latency_row(result: LoopResult, written: int) -> dict[str, Any]:
    return {
        "appends": result.operations,
        "ack_p50_ms": round(result.latency(0.50, 1e3), 1),
        "ack_p99_ms": round(result.latency(0.99, 1e3), 1),
        "ack_mean_ms": round(result.mean(1e3), 1),
        "throughput_mib_s": round(written / result.elapsed_s / MiB, 2),
    }


async def measure_wal(
    endpoint_url: str | None, node_id: int, shape: Shape, seconds: float, fence_lease_s: float
) -> dict[str, Any]:
    _, appenders, record_bytes = shape
    wal = S3Wal(
        store_for(endpoint_url, model_for(endpoint_url)),
        max_batch_bytes=MAX_BATCH_BYTES,
        max_batch_interval_s=MAX_BATCH_INTERVAL_S,
        fence_lease_s=fence_lease_s,
    )
    await wal.start(node_id, 1, WalMode.READ_WRITE)
    _ = [record async for record in wal.recover()]
    counts_before = dict(wal.store.client.request_counts)
    payload = b"w" * record_bytes

    async def append(_: int) -> int:
        await wal.append(payload)
        return 1

    result = await closed_loop(append, appenders, seconds)
    counts = {
        name: count - counts_before.get(name, 0)
        for name, count in wal.store.client.request_counts.items()
    }
    objects = wal.objects_written
    await wal.close()
    appended = result.records * record_bytes
    return {
        **latency_row(result, appended),
        "avg_object_kib": round(appended / max(1, objects) / 1024, 1),
        **per_gib(counts, appended),
    }


async def measure_raw(endpoint_url: str | None, shape: Shape, seconds: float) -> dict[str, Any]:
    """The rig alone: ``writers`` tasks PUT ``size``-byte objects back to back."""
    _, writers, size = shape
    store = store_for(endpoint_url, model_for(endpoint_url))
    body = b"r" * size
    names = itertools.count()

    async def put(_: int) -> int:
        await store.put(f"raw/wal/{next(names):012d}", body)
        return 1

    result = await closed_loop(put, writers, seconds)
    counts = dict(store.client.request_counts)
    await store.close()
    written = result.records * size
    return {
        **latency_row(result, written),
        "avg_object_kib": size // 1024,
        **per_gib(counts, written),
    }


async def measure(moto: MotoServer, seconds: float, fence_lease_s: float) -> list[dict[str, Any]]:
    """Per endpoint and shape: the raw PUTs, then the WAL (the wide shape against the 4 MiB
    PUTs its groups are made of)."""
    results: list[dict[str, Any]] = []
    node_id = 0
    for endpoint_name, endpoint_url in (("latency-model", None), ("moto", moto.endpoint_url)):
        shapes = (*WORKLOADS, RAW_BIG, WIDE) if endpoint_url is None else (*WORKLOADS, RAW_BIG)
        for shape in shapes:
            workload = shape[0]
            if shape == WIDE:
                raw = next(row for row in results if row["workload"] == f"raw {RAW_BIG[0]}")
            else:
                raw = await measure_raw(endpoint_url, shape, seconds)
                results.append({"endpoint": endpoint_name, "workload": f"raw {workload}", **raw})
                TABLE.print_row(results[-1])
            if shape == RAW_BIG:
                continue
            node_id += 1
            # Profiled: the targets' workloads on the latency model.
            window = endpoint_url is None and workload != WORKLOADS[0][0]
            with profile.measured(f"measure_wal {workload}", when=window):
                result = await measure_wal(endpoint_url, node_id, shape, seconds, fence_lease_s)
            result["vs_raw"] = round(
                result["throughput_mib_s"] / max(raw["throughput_mib_s"], 1e-9), 2
            )
            results.append({"endpoint": endpoint_name, "workload": f"wal {workload}", **result})
            TABLE.print_row(results[-1])
    return results


TABLE = Table.of_keys(
    (
        "endpoint",
        "workload",
        "appends",
        "ack_p50_ms",
        "ack_p99_ms",
        "throughput_mib_s",
        "vs_raw",
        "avg_object_kib",
        "puts_per_gib",
        "gets_per_gib",
        "lists_per_gib",
    ),
    13,
)


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(
            axis,
            [f"{row['endpoint']}\n{row['workload']}" for row in results],
            {"MiB/s": [row["throughput_mib_s"] for row in results]},
            fontsize=6,
            colors=[
                "tab:gray" if row["workload"].startswith("raw") else "tab:blue" for row in results
            ],
        )
        axis.axhline(TARGET_MIB_S, color="tab:red", linestyle="--", label="target 200 MiB/s")
        axis.set_ylabel("MiB/s")
        axis.set_title("s3 WAL (blue) vs raw PUTs of the same shape (gray)")
        axis.legend()

    return save_plot(path, draw)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "wal_s3", quick="3 s per measurement")
    parser.add_argument("--seconds", type=float, default=None, help="per measurement (default 10)")
    parser.add_argument(
        "--fence-lease",
        type=float,
        default=DEFAULT_FENCE_LEASE_S,
        help="the WAL's fence_lease in seconds (0: a LIST after every group, as before the "
        f"lease; default {DEFAULT_FENCE_LEASE_S:g})",
    )
    args = parser.parse_args(argv)
    args.seconds = cli.sized(args, args.seconds, full=10.0, quick=3.0, smoke=0.1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with MotoServer() as moto:
        moto.create_bucket(BUCKET)
        TABLE.print_header()
        results = asyncio.run(measure(moto, args.seconds, args.fence_lease))
    document = {
        "benchmark": "wal_s3",
        "mode": cli.mode(args),
        "quick": args.quick,
        "seconds_per_measurement": args.seconds,
        "latency_model": {
            "put_p50_ms": PUT_P50_MS,
            "put_p99_ms": PUT_P99_MS,
            "applies_to": "every PUT, GET and LIST of a WAL key, in-memory bucket",
        },
        "wal": {
            "max_batch_bytes": MAX_BATCH_BYTES,
            "max_batch_interval_ms": round(MAX_BATCH_INTERVAL_S * 1000),
            "max_inflight": 8,
            "fence_lease_s": args.fence_lease,
        },
        "results": results,
    }
    write_results(args.json, document, lambda png: plot(results, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
