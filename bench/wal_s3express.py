"""Benchmark of the s3express WAL: ack latency with all zones healthy, one zone slow, one down.

Three zones, each a moto S3 server (``walstream_wal_s3express.testing.zones``) behind a fault proxy
(``walstream_wal_s3.testing.moto.FaultProxy``) that adds a lognormal latency to every request
(p50 5 ms / p99 10 ms: the S3 Express order of magnitude). Scenarios:

- ``healthy``: all three zones with the latency model;
- ``one zone +50ms``: zone 3's requests take 50 ms longer;
- ``one zone down``: zone 3's endpoint refuses connections.

Workloads: one appender with 4 KiB records (every append its own chunk) and 64 concurrent
appenders with 16 KiB records (chunks fill up to 512 KiB). For each: ack latency p50/p99 (call to
acknowledgement), throughput, and S3 PUTs per GiB appended (chunk PUTs in all zones, plus control
state). A table is printed and JSON goes to ``bench/results/wal_s3express.json``.

    .venv/bin/python bench/wal_s3express.py            # 10 s per measurement
    .venv/bin/python bench/wal_s3express.py --quick    # 3 s per measurement
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import platform
import time
from pathlib import Path
from typing import Any

from walstream.config import BuildContext
from walstream.wal import WalMode
from walstream_wal_s3.testing.moto import FaultProxy
from walstream_wal_s3express import S3EXPRESS_WAL
from walstream_wal_s3express.testing.zones import TEST_CREDENTIALS, zone_servers

RESULTS = Path(__file__).resolve().parent / "results" / "wal_s3express.json"
P50_MS, P99_MS = 5.0, 10.0
SLOW_EXTRA_MS = 50.0
GiB = 1 << 30
WORKLOADS = (("1 x 4KiB", 1, 4 << 10), ("64 x 16KiB", 64, 16 << 10))
ALL_METHODS = ["PUT", "GET", "POST", "DELETE", "HEAD"]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def measure(
    options: dict[str, Any], run: int, appenders: int, record_bytes: int, seconds: float
) -> dict[str, Any]:
    wal = S3EXPRESS_WAL.build({**options, "prefix": f"bench-{run}"}, BuildContext(node_id=1), "wal")
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
    with contextlib.ExitStack() as stack:
        zones = stack.enter_context(zone_servers())
        proxies = [stack.enter_context(FaultProxy(zone.endpoint_url)) for zone in zones]
        options = {
            "buckets": [zone.bucket for zone in zones],
            "endpoint_urls": [proxy.endpoint_url for proxy in proxies],
            "region": "us-east-1",
            "request_timeout": "1s",
            "max_pool_connections": 64,
            **TEST_CREDENTIALS,
        }

        def latency(extra_ms: float = 0.0) -> dict[str, Any]:
            return {
                "methods": ALL_METHODS,
                "latency_p50_ms": P50_MS + extra_ms,
                "latency_p99_ms": P99_MS + extra_ms,
            }

        scenarios = [
            ("healthy", [latency(), latency(), latency()]),
            (f"one zone +{SLOW_EXTRA_MS:g}ms", [latency(), latency(), latency(SLOW_EXTRA_MS)]),
            ("one zone down", [latency(), latency(), None]),
        ]
        run = 0
        for scenario, configs in scenarios:
            for proxy, config in zip(proxies, configs, strict=True):
                if config is None:
                    proxy.stop()
                else:
                    proxy.configure(**config)
            for workload, appenders, record_bytes in WORKLOADS:
                run += 1
                result = await measure(options, run, appenders, record_bytes, seconds)
                rows.append({"scenario": scenario, "workload": workload, **result})
                print(
                    f"{scenario:<16} {workload:<11} p50 {result['ack_p50_ms']:>7.2f} ms  "
                    f"p99 {result['ack_p99_ms']:>7.2f} ms  {result['throughput_mib_s']:>7.2f} "
                    f"MiB/s  {result['puts_per_gib']:>8} PUT/GiB",
                    flush=True,
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s per measurement")
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    rows = asyncio.run(run_all(seconds))
    ratio = {}
    for workload, _, _ in WORKLOADS:
        by = {row["scenario"]: row for row in rows if row["workload"] == workload}
        healthy = by["healthy"]["ack_p99_ms"]
        slow = by[f"one zone +{SLOW_EXTRA_MS:g}ms"]["ack_p99_ms"]
        ratio[workload] = round(slow / healthy, 3) if healthy else None
    print("\np99(one zone +50ms) / p99(healthy):", ratio)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "wal_s3express",
                "latency_model": {
                    "p50_ms": P50_MS,
                    "p99_ms": P99_MS,
                    "methods": ALL_METHODS,
                    "slow_zone_extra_ms": SLOW_EXTRA_MS,
                },
                "seconds_per_measurement": seconds,
                "python": platform.python_version(),
                "rows": rows,
                "p99_slow_over_healthy": ratio,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
