"""Benchmark of the s3 WAL: ack latency, throughput and S3 request cost.

Two endpoints, both real HTTP on 127.0.0.1:

- ``latency-model``: a fault proxy in front of a moto S3 server adds a lognormal latency
  (PUT p50 50 ms / p99 150 ms) to every WAL request (object PUTs and the fence LISTs);
- ``moto``: straight against the moto server.

Workloads: one appender with 4 KiB records (an idle WAL: every append is its own object) and
64 concurrent appenders with 64 KiB records (grouping, many PUTs in flight). For each it reports
ack latency p50/p99 (call to acknowledgement), throughput, and S3 PUTs/LISTs per GiB
appended. A table is printed and JSON goes to ``bench/results/wal_s3.json``.

    .venv/bin/python bench/wal_s3.py            # 10 s per measurement
    .venv/bin/python bench/wal_s3.py --quick    # 3 s per measurement
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from walstream.wal import WalMode
from walstream_wal_s3 import S3ObjectStore, S3Settings, S3Wal
from walstream_wal_s3.testing.moto import TEST_CREDENTIALS, FaultProxy, MotoServer

RESULTS = Path(__file__).resolve().parent / "results" / "wal_s3.json"
BUCKET = "walstream-bench"
PUT_P50_MS, PUT_P99_MS = 50.0, 150.0
GiB = 1 << 30
WORKLOADS = (("1 x 4KiB", 1, 4 << 10), ("64 x 64KiB", 64, 64 << 10))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def measure(
    endpoint_url: str,
    node_id: int,
    appenders: int,
    record_bytes: int,
    seconds: float,
    max_batch_bytes: int,
    max_batch_interval_s: float,
    max_inflight: int,
) -> dict[str, Any]:
    settings = S3Settings(
        bucket=BUCKET,
        endpoint_url=endpoint_url,
        region="us-east-1",
        max_pool_connections=64,
        **TEST_CREDENTIALS,
    )
    wal = S3Wal(
        S3ObjectStore(settings),
        max_batch_bytes=max_batch_bytes,
        max_batch_interval_s=max_batch_interval_s,
        max_inflight=max_inflight,
    )
    await wal.start(node_id, 1, WalMode.READ_WRITE)
    _ = [record async for record in wal.recover()]
    counts_before = dict(wal.store.client.request_counts)
    payload = b"w" * record_bytes
    latencies: list[float] = []
    appended = 0
    stop_at = time.monotonic() + seconds

    async def appender() -> None:
        nonlocal appended
        while time.monotonic() < stop_at:
            began = time.monotonic()
            await wal.append(payload)
            latencies.append(time.monotonic() - began)
            appended += record_bytes

    began = time.monotonic()
    await asyncio.gather(*(appender() for _ in range(appenders)))
    elapsed = time.monotonic() - began
    counts = {
        name: count - counts_before.get(name, 0)
        for name, count in wal.store.client.request_counts.items()
    }
    objects = wal.objects_written
    await wal.close()
    puts = counts.get("put_object", 0)
    lists = counts.get("list_objects_v2", 0)
    return {
        "appends": len(latencies),
        "ack_p50_ms": round(percentile(latencies, 0.50) * 1000, 1),
        "ack_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "ack_mean_ms": round(statistics.fmean(latencies) * 1000, 1),
        "throughput_mib_s": round(appended / elapsed / (1 << 20), 1),
        "wal_objects": objects,
        "avg_object_kib": round(appended / max(1, objects) / 1024, 1),
        "puts_per_gib": round(puts * GiB / max(1, appended)),
        "lists_per_gib": round(lists * GiB / max(1, appended)),
    }


async def run_all(moto: MotoServer, proxy: FaultProxy, seconds: float) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    node_id = 0
    for endpoint_name, endpoint_url in (
        ("latency-model", proxy.endpoint_url),
        ("moto", moto.endpoint_url),
    ):
        for workload, appenders, record_bytes in WORKLOADS:
            node_id += 1
            result = await measure(
                endpoint_url,
                node_id,
                appenders,
                record_bytes,
                seconds,
                max_batch_bytes=8 << 20,
                max_batch_interval_s=0.25,
                max_inflight=8,
            )
            results.append({"endpoint": endpoint_name, "workload": workload, **result})
            print_row(results[-1])
    return results


COLUMNS = (
    "endpoint",
    "workload",
    "appends",
    "ack_p50_ms",
    "ack_p99_ms",
    "throughput_mib_s",
    "avg_object_kib",
    "puts_per_gib",
    "lists_per_gib",
)


def print_row(row: dict[str, Any]) -> None:
    print("  ".join(f"{row[column]!s:>{max(len(column), 14)}}" for column in COLUMNS), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s per measurement")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    seconds = 3.0 if args.quick else 10.0
    with MotoServer() as moto, FaultProxy(moto.endpoint_url) as proxy:
        moto.create_bucket(BUCKET)
        proxy.configure(
            seed=1,
            methods=["PUT", "GET"],
            path_contains="wal",
            latency_p50_ms=PUT_P50_MS,
            latency_p99_ms=PUT_P99_MS,
        )
        print("  ".join(f"{column:>{max(len(column), 14)}}" for column in COLUMNS))
        results = asyncio.run(run_all(moto, proxy, seconds))
    report = {
        "benchmark": "wal_s3",
        "quick": args.quick,
        "seconds_per_measurement": seconds,
        "latency_model": {
            "put_p50_ms": PUT_P50_MS,
            "put_p99_ms": PUT_P99_MS,
            "applies_to": "every WAL PUT and fence LIST through the proxy",
        },
        "wal": {"max_batch_bytes": 8 << 20, "max_batch_interval_ms": 250, "max_inflight": 8},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
