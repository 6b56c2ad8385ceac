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

    .venv/bin/python bench/wal_s3express.py            # 10 s per measurement
    .venv/bin/python bench/wal_s3express.py --quick    # 3 s per measurement
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import time
from pathlib import Path
from typing import Any

import _profile
from _report import grouped_bars, percentile, save_plot, write_json
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

RESULTS = Path(__file__).resolve().parent / "results" / "wal_s3express.json"
P50_MS, P99_MS = 5.0, 10.0
SLOW_EXTRA_MS = 50.0
GiB = 1 << 30
WORKLOADS = (("1 x 4KiB", 1, 4 << 10), ("64 x 16KiB", 64, 16 << 10))


ZONES = ("use1-az4", "use1-az5", "use1-az6")
FENCE_LEASE_S = [DEFAULT_FENCE_LEASE_S]
"""The zones' fence lease (``--fence-lease``)."""


def zone_settings(zone: str, prefix: str = "") -> S3Settings:
    return S3Settings(
        bucket=f"walstream--{zone}--x-s3",
        prefix=prefix,
        endpoint_url="http://memory.invalid",
        region="us-east-1",
        read_timeout_s=1.0,
        connect_timeout_s=1.0,
        retry=ZONE_RETRY,
        **TEST_CREDENTIALS,
    )


def build_wal(buckets: list[MemoryBucket], run: int) -> S3ExpressWal:
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
            fence_lease_s=FENCE_LEASE_S[0],
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


async def measure_raw_put(bucket: MemoryBucket, seconds: float) -> dict[str, Any]:
    """The rig alone: one writer's 4 KiB PUTs to one zone, back to back."""
    client = MemoryS3Client(zone_settings(ZONES[0], "raw/"), bucket)
    body = b"r" * 4096
    latencies: list[float] = []
    stop_at = time.monotonic() + seconds
    index = 0
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        await client.call("put_object", write=True, Key=f"raw/{index:012d}", Body=body)
        latencies.append((time.perf_counter() - started) * 1000)
        index += 1
    return {
        "appends": len(latencies),
        "ack_p50_ms": round(percentile(latencies, 0.50), 2),
        "ack_p99_ms": round(percentile(latencies, 0.99), 2),
        "throughput_mib_s": round(len(latencies) * 4096 / seconds / (1 << 20), 2),
        "puts_per_gib": 1 << 18,
        "gets_lists_per_gib": 0,
    }


async def measure(
    buckets: list[MemoryBucket], run: int, appenders: int, record_bytes: int, seconds: float
) -> dict[str, Any]:
    wal = build_wal(buckets, run)
    await wal.start(1, 1, WalMode.READ_WRITE)
    _ = [record async for record in wal.recover()]
    before = wal.request_counts()
    payload = b"w" * record_bytes
    latencies: list[float] = []
    appended = 0
    stop_at = time.monotonic() + seconds

    async def appender() -> None:
        nonlocal appended
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            await wal.append(payload)
            latencies.append((time.perf_counter() - started) * 1000)
            appended += record_bytes

    started = time.monotonic()
    await asyncio.gather(*(appender() for _ in range(appenders)))
    elapsed = time.monotonic() - started
    after = wal.request_counts()
    await wal.close()
    puts = sum(
        after[zone].get("put_object", 0) - before.get(zone, {}).get("put_object", 0)
        for zone in after
    )
    reads = sum(
        after[zone].get(op, 0) - before.get(zone, {}).get(op, 0)
        for zone in after
        for op in ("get_object", "list_objects_v2")
    )
    return {
        "appends": len(latencies),
        "ack_p50_ms": round(percentile(latencies, 0.50), 2),
        "ack_p99_ms": round(percentile(latencies, 0.99), 2),
        "throughput_mib_s": round(appended / elapsed / (1 << 20), 2),
        "puts_per_gib": round(puts * GiB / max(appended, 1)),
        "gets_lists_per_gib": round(reads * GiB / max(appended, 1)),
    }


async def run_all(seconds: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    models = [LatencyModel(P50_MS, P99_MS, seed=zone) for zone in range(len(ZONES))]
    buckets = [MemoryBucket(model) for model in models]
    scenarios = [
        ("healthy", [0.0, 0.0, 0.0], False),
        (f"one zone +{SLOW_EXTRA_MS:g}ms", [0.0, 0.0, SLOW_EXTRA_MS], False),
        ("one zone down", [0.0, 0.0, 0.0], True),
    ]
    raw = await measure_raw_put(MemoryBucket(LatencyModel(P50_MS, P99_MS, seed=99)), seconds)
    rows.append({"scenario": "raw PUT", "workload": "1 x 4KiB", **raw})
    print_row(rows[-1], raw)
    run = 0
    for scenario, extras, third_down in scenarios:
        for model, extra in zip(models, extras, strict=True):
            model.extra_ms = extra
            model.down = False
        models[2].down = third_down
        for workload, appenders, record_bytes in WORKLOADS:
            run += 1
            window = scenario == "healthy" and workload == WORKLOADS[0][0]  # the targets' row
            with _profile.measured(f"measure {scenario} {workload}", when=window):
                result = await measure(buckets, run, appenders, record_bytes, seconds)
            result["p50_vs_put"] = round(result["ack_p50_ms"] / raw["ack_p50_ms"], 2)
            result["p99_vs_put"] = round(result["ack_p99_ms"] / raw["ack_p50_ms"], 2)
            rows.append({"scenario": scenario, "workload": workload, **result})
            print_row(rows[-1], raw)
    return rows


def print_row(row: dict[str, Any], raw: dict[str, Any]) -> None:
    print(
        f"{row['scenario']:<16} {row['workload']:<11} p50 {row['ack_p50_ms']:>7.2f} ms  "
        f"p99 {row['ack_p99_ms']:>7.2f} ms  ({row.get('p50_vs_put', 1.0):>5.2f}x / "
        f"{row.get('p99_vs_put', raw['ack_p99_ms'] / raw['ack_p50_ms']):>5.2f}x PUT p50)  "
        f"{row['throughput_mib_s']:>7.2f} MiB/s  {row['puts_per_gib']:>8} PUT/GiB  "
        f"{row['gets_lists_per_gib']:>8} GET+LIST/GiB",
        flush=True,
    )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
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

    save_plot(path, draw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s per measurement")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument(
        "--fence-lease",
        type=float,
        default=DEFAULT_FENCE_LEASE_S,
        help="the zones' fence_lease in seconds (0: a successor check after every chunk, as "
        f"before the lease; default {DEFAULT_FENCE_LEASE_S:g})",
    )
    args = parser.parse_args()
    FENCE_LEASE_S[0] = args.fence_lease
    logging.basicConfig(level=logging.ERROR)
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    rows = asyncio.run(run_all(seconds))
    ratio = {}
    for workload, _, _ in WORKLOADS:
        by = {row["scenario"]: row for row in rows if row["workload"] == workload}
        if "healthy" not in by:
            continue
        healthy = by["healthy"]["ack_p99_ms"]
        slow = by[f"one zone +{SLOW_EXTRA_MS:g}ms"]["ack_p99_ms"]
        ratio[workload] = round(slow / healthy, 3) if healthy else None
    print("\np99(one zone +50ms) / p99(healthy):", ratio)
    write_json(
        RESULTS,
        {
            "benchmark": "wal_s3express",
            "latency_model": {
                "p50_ms": P50_MS,
                "p99_ms": P99_MS,
                "methods": "every request, in-memory zones",
                "slow_zone_extra_ms": SLOW_EXTRA_MS,
            },
            "seconds_per_measurement": seconds,
            "fence_lease_s": args.fence_lease,
            "python": platform.python_version(),
            "rows": rows,
            "p99_slow_over_healthy": ratio,
        },
    )
    plot(rows, RESULTS.with_suffix(".png"))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
