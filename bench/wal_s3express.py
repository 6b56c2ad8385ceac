"""Benchmark of the s3express WAL: ack latency with all zones healthy, one zone slow, one down.

Three zones, each an in-memory bucket behind the production S3 client
(``walstream_wal_s3.testing.memory_s3``) whose every request first waits a lognormal latency
(p50 5 ms / p99 10 ms: the S3 Express order of magnitude; ``walstream_wal_s3.testing.latency``,
simulated in the event loop, so the model costs no CPU, unlike a proxy process). Scenarios:

- ``healthy``: all three zones with the latency model;
- ``one zone +50ms``: zone 3's requests take 50 ms longer;
- ``one zone down``: zone 3's requests fail as refused connections.

The ``raw PUT`` rows are the rig alone in the same run: one writer's 4 KiB PUTs to one zone, back
to back; ``p50/p99 vs PUT`` divide the WAL's ack latency by the raw PUT's.

Workloads: one appender with 4 KiB records (every append its own chunk) and 64 concurrent
appenders with 16 KiB records (chunks fill up to 512 KiB). For each: ack latency p50/p99 (call to
acknowledgement), throughput, and S3 PUTs per GiB appended (chunk PUTs in all zones, plus control
state). A table is printed, JSON goes to ``bench/results/wal_s3express.json`` and a plot to
``bench/results/wal_s3express.png`` (when matplotlib is installed).

The appenders and the raw writer are the shared closed loop (``bench/common/loadgen.py``).

    .venv/bin/python bench/wal_s3express.py            # 10 s per measurement
    .venv/bin/python bench/wal_s3express.py --quick    # 3 s per measurement
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from common import cli, profile
from common.loadgen import LoopResult, closed_loop
from common.report import Column, Table, grouped_bars, save_plot, write_results
from walstream.config import validate_options
from walstream.wal import WalMode
from walstream.wal.quorum import quorum_wal_options
from walstream_wal_s3.client import S3Settings
from walstream_wal_s3.testing.latency import LatencyModel
from walstream_wal_s3.testing.memory_s3 import MemoryBucket, MemoryS3Client
from walstream_wal_s3express import (
    S3EXPRESS_WAL,
    ZONE_CATCH_UP_PARALLELISM,
    ZONE_RETRY,
    S3ExpressWal,
    ZonalBucketReplica,
)
from walstream_wal_s3express.replica import DEFAULT_FENCE_LEASE_S
from walstream_wal_s3express.testing.zones import TEST_CREDENTIALS

P50_MS, P99_MS = 5.0, 10.0
SLOW_EXTRA_MS = 50.0
GiB = 1 << 30
RAW_PUT_BYTES = 4096
WORKLOADS = (("1 x 4KiB", 1, 4 << 10), ("64 x 16KiB", 64, 16 << 10))
ZONES = ("use1-az4", "use1-az5", "use1-az6")
SCENARIOS = (
    ("healthy", (0.0, 0.0, 0.0), False),
    (f"one zone +{SLOW_EXTRA_MS:g}ms", (0.0, 0.0, SLOW_EXTRA_MS), False),
    ("one zone down", (0.0, 0.0, 0.0), True),
)
"""(name, extra latency per zone, zone 3 down)."""


def zone_settings(zone: str, prefix: str = "") -> S3Settings:
    return S3Settings(
        bucket=f"walstream--{zone}--x-s3",
        prefix=prefix,
        endpoint_url="http://memory.invalid",
        region="us-east-1",
        read_timeout_s=1.0,
        connect_timeout_s=1.0,
        retry=ZONE_RETRY,
        access_key_id=TEST_CREDENTIALS["access_key_id"],
        secret_access_key=TEST_CREDENTIALS["secret_access_key"],
    )


def build_wal(buckets: list[MemoryBucket], run: int, fence_lease_s: float) -> S3ExpressWal:
    options = validate_options(
        S3EXPRESS_WAL,
        {"buckets": [zone_settings(zone).bucket for zone in ZONES], "request_timeout": "1s"},
        Path.cwd(),
        "wal",
    )
    replicas = [
        ZonalBucketReplica(
            MemoryS3Client(zone_settings(zone, f"bench-{run}/"), bucket),
            node_id=1,
            name=zone,
            fence_lease_s=fence_lease_s,
        )
        for zone, bucket in zip(ZONES, buckets, strict=True)
    ]
    return S3ExpressWal(
        replicas,
        log_id="node-1",
        write_quorum=2,
        catch_up_parallelism=ZONE_CATCH_UP_PARALLELISM,
        **quorum_wal_options(options),
    )


def latency_row(result: LoopResult, written: int) -> dict[str, Any]:
    return {
        "appends": result.operations,
        "ack_p50_ms": round(result.latency(0.50, 1e3), 2),
        "ack_p99_ms": round(result.latency(0.99, 1e3), 2),
        "throughput_mib_s": round(written / result.elapsed_s / (1 << 20), 2),
    }


async def measure_raw_put(bucket: MemoryBucket, seconds: float) -> dict[str, Any]:
    """The rig alone: one writer's 4 KiB PUTs to one zone, back to back."""
    client = MemoryS3Client(zone_settings(ZONES[0], "raw/"), bucket)
    body = b"r" * RAW_PUT_BYTES
    index = 0

    async def put(_: int) -> int:
        nonlocal index
        key, index = f"raw/{index:012d}", index + 1
        await client.call("put_object", write=True, Key=key, Body=body)
        return 1

    result = await closed_loop(put, 1, seconds)
    return {
        **latency_row(result, result.records * RAW_PUT_BYTES),
        "puts_per_gib": GiB // RAW_PUT_BYTES,
        "gets_lists_per_gib": 0,
    }


def requests_between(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], *operations: str
) -> int:
    return sum(
        after[zone].get(op, 0) - before.get(zone, {}).get(op, 0)
        for zone in after
        for op in operations
    )


async def measure(
    buckets: list[MemoryBucket],
    run: int,
    appenders: int,
    record_bytes: int,
    seconds: float,
    fence_lease_s: float,
) -> dict[str, Any]:
    wal = build_wal(buckets, run, fence_lease_s)
    await wal.start(1, 1, WalMode.READ_WRITE)
    _ = [record async for record in wal.recover()]
    before = wal.request_counts()
    payload = b"w" * record_bytes

    async def append(_: int) -> int:
        await wal.append(payload)
        return 1

    result = await closed_loop(append, appenders, seconds)
    after = wal.request_counts()
    await wal.close()
    appended = result.records * record_bytes
    puts = requests_between(before, after, "put_object")
    reads = requests_between(before, after, "get_object", "list_objects_v2")
    return {
        **latency_row(result, appended),
        "puts_per_gib": round(puts * GiB / max(appended, 1)),
        "gets_lists_per_gib": round(reads * GiB / max(appended, 1)),
    }


async def run_all(seconds: float, fence_lease_s: float) -> list[dict[str, Any]]:
    """The raw PUT row, then every scenario's workloads, in the same zones."""
    models = [LatencyModel(P50_MS, P99_MS, seed=zone) for zone in range(len(ZONES))]
    buckets = [MemoryBucket(model) for model in models]
    raw = await measure_raw_put(MemoryBucket(LatencyModel(P50_MS, P99_MS, seed=99)), seconds)
    # The raw row's ratios: its p99 over its own p50 (the WAL rows divide by the raw PUT's p50).
    rows = [{"scenario": "raw PUT", "workload": "1 x 4KiB", **raw}]
    TABLE.print_row(
        {**rows[-1], "p50_vs_put": 1.0, "p99_vs_put": raw["ack_p99_ms"] / raw["ack_p50_ms"]}
    )
    run = 0
    for scenario, extras, third_down in SCENARIOS:
        for model, extra in zip(models, extras, strict=True):
            model.extra_ms = extra
            model.down = False
        models[2].down = third_down
        for workload, appenders, record_bytes in WORKLOADS:
            run += 1
            window = scenario == "healthy" and workload == WORKLOADS[0][0]  # the targets' row
            with profile.measured(f"measure {scenario} {workload}", when=window):
                result = await measure(
                    buckets, run, appenders, record_bytes, seconds, fence_lease_s
                )
            result["p50_vs_put"] = round(result["ack_p50_ms"] / raw["ack_p50_ms"], 2)
            result["p99_vs_put"] = round(result["ack_p99_ms"] / raw["ack_p50_ms"], 2)
            rows.append({"scenario": scenario, "workload": workload, **result})
            TABLE.print_row(rows[-1])
    return rows


def ms(value: float) -> str:
    return f"{value:.2f} ms"


def times(value: float) -> str:
    return f"{value:.2f}x"


TABLE = Table(
    [
        Column("scenario", width=16, align="<"),
        Column("workload", width=11, align="<"),
        Column("ack_p50_ms", "p50", 10, ms),
        Column("ack_p99_ms", "p99", 10, ms),
        Column("p50_vs_put", "p50/PUT", 8, times),
        Column("p99_vs_put", "p99/PUT", 8, times),
        Column("throughput_mib_s", "MiB/s", 8, ".2f"),
        Column("puts_per_gib", "PUT/GiB", 8),
        Column("gets_lists_per_gib", "GET+LIST/GiB", 12),
    ],
    separator="  ",
)


def slow_over_healthy(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """p99 with one zone slow over p99 healthy, per workload."""
    ratio: dict[str, float | None] = {}
    for workload, _, _ in WORKLOADS:
        by = {row["scenario"]: row for row in rows if row["workload"] == workload}
        if "healthy" not in by:
            continue
        healthy = by["healthy"]["ack_p99_ms"]
        slow = by[f"one zone +{SLOW_EXTRA_MS:g}ms"]["ack_p99_ms"]
        ratio[workload] = round(slow / healthy, 3) if healthy else None
    return ratio


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    def draw(figure: Any, axis: Any) -> None:
        grouped_bars(
            axis,
            [f"{row['scenario']}\n{row['workload']}" for row in rows],
            {
                "p50": [row["ack_p50_ms"] for row in rows],
                "p99": [row["ack_p99_ms"] for row in rows],
            },
            fontsize=6,
        )
        axis.set_ylabel("ack latency (ms)")
        axis.set_title("s3express WAL ack latency vs a raw PUT (first bars)")
        axis.legend()

    return save_plot(path, draw)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "wal_s3express", quick="3 s per measurement")
    parser.add_argument("--seconds", type=float, default=None, help="per measurement (default 10)")
    parser.add_argument(
        "--fence-lease",
        type=float,
        default=DEFAULT_FENCE_LEASE_S,
        help="the zones' fence_lease in seconds (0: a successor check after every chunk, as "
        f"before the lease; default {DEFAULT_FENCE_LEASE_S:g})",
    )
    args = parser.parse_args(argv)
    args.seconds = cli.sized(args, args.seconds, full=10.0, quick=3.0, smoke=0.2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    TABLE.print_header()
    rows = asyncio.run(run_all(args.seconds, args.fence_lease))
    ratio = slow_over_healthy(rows)
    print(f"\np99(one zone +{SLOW_EXTRA_MS:g}ms) / p99(healthy):", ratio)
    document = {
        "benchmark": "wal_s3express",
        "mode": cli.mode(args),
        "latency_model": {
            "p50_ms": P50_MS,
            "p99_ms": P99_MS,
            "methods": "every request, in-memory zones",
            "slow_zone_extra_ms": SLOW_EXTRA_MS,
        },
        "seconds_per_measurement": args.seconds,
        "fence_lease_s": args.fence_lease,
        "rows": rows,
        "p99_slow_over_healthy": ratio,
    }
    write_results(args.json, document, lambda png: plot(rows, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
