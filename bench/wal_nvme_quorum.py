"""Benchmark: the nvme-quorum WAL on 3 local chunk servers — all healthy, one slowed by +50 ms,
one down — beside the ebs WAL on the same disk (when walstream_wal_ebs is installed).

    .venv/bin/python bench/wal_nvme_quorum.py [--quick] [--records N] [--concurrency C]

Prints a table and writes bench/results/wal_nvme_quorum.json (with the requests sent to the chunk
servers per GiB appended, by operation) and a plot beside it. The acknowledgement latency is
measured per append (from ``append`` to its acknowledgement) with C appenders running at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _profile
from _report import Column, Table, grouped_bars, machine, percentile, save_plot, write_json
from walstream.config import BuildContext
from walstream.wal import WalMode, WriteAheadLog
from walstream_wal_nvme_quorum import NVME_QUORUM_WAL
from walstream_wal_nvme_quorum.testing import ChunkServerProcess, chunk_servers

RESULTS = Path(__file__).resolve().parent / "results" / "wal_nvme_quorum.json"


async def run_workload(
    wal: WriteAheadLog, records: int, record_bytes: int, concurrency: int
) -> dict[str, float]:
    payload = b"w" * record_bytes
    latencies: list[float] = []
    remaining = records

    async def appender() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await wal.append(payload)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(appender() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {
        "records": len(latencies),
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000,
        "records_per_s": len(latencies) / elapsed,
        "mib_per_s": len(latencies) * record_bytes / elapsed / (1 << 20),
    }


async def bench_quorum(
    servers: list[ChunkServerProcess], epoch: int, args: argparse.Namespace
) -> dict[str, float]:
    options: dict[str, Any] = {
        "servers": [server.address for server in servers],
        "log_id": "bench",
    }
    if args.max_chunk_delay is not None:
        options["max_chunk_delay"] = args.max_chunk_delay
    if args.max_inflight is not None:
        options["max_inflight"] = args.max_inflight
    wal = NVME_QUORUM_WAL.build(options, BuildContext(node_id=1), "wal")
    await wal.start(1, epoch, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    await wal.reset()
    await run_workload(wal, args.records // 10, args.record_bytes, args.concurrency)  # warm-up
    before = request_counts(wal)
    result = await run_workload(wal, args.records, args.record_bytes, args.concurrency)
    after = request_counts(wal)
    await wal.close()
    appended = result["records"] * args.record_bytes
    for operation in sorted(after):
        sent = after[operation] - before.get(operation, 0)
        result[f"{operation.lower()}_requests_per_gib"] = round(sent * (1 << 30) / appended)
    return result


def request_counts(wal: WriteAheadLog) -> dict[str, int]:
    """Requests sent to all chunk servers, by operation."""
    totals: dict[str, int] = {}
    for replica in getattr(wal, "replicas", ()):
        for operation, count in replica.request_counts.items():
            totals[operation] = totals.get(operation, 0) + count
    return totals


async def bench_ebs(folder: Path, args: argparse.Namespace) -> dict[str, float] | None:
    try:
        from walstream_wal_ebs import EBS_WAL
        from walstream_wal_ebs.device import supports_direct_io
    except ImportError:
        return None
    options = {
        "path": str(folder / "wal.img"),
        "capacity": "256MiB",
        "direct": supports_direct_io(folder),
    }
    wal = EBS_WAL.build(options, BuildContext(node_id=1, base_dir=folder), "wal")
    await wal.start(1, 1, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    await wal.reset()
    await run_workload(wal, args.records // 10, args.record_bytes, args.concurrency)
    result = await run_workload(wal, args.records, args.record_bytes, args.concurrency)
    await wal.close()
    return result


@contextlib.contextmanager
def slowed(servers: list[ChunkServerProcess], index: int, delay_ms: float) -> Iterator[None]:
    server = servers[index]
    server.stop()
    server.delay_ms = delay_ms
    server.start()
    try:
        yield
    finally:
        server.stop()
        server.delay_ms = 0.0
        server.start()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-nvme-quorum-", dir=args.dir) as folder:
        root = Path(folder)
        with chunk_servers(root / "servers") as servers:
            with _profile.measured("bench_quorum healthy"):
                results["nvme-quorum healthy"] = await bench_quorum(servers, 1, args)
            with slowed(servers, 2, args.slow_ms):
                await asyncio.sleep(0.2)
                results[f"nvme-quorum one +{args.slow_ms:g}ms"] = await bench_quorum(
                    servers, 2, args
                )
            servers[2].kill()
            results["nvme-quorum one down"] = await bench_quorum(servers, 3, args)
        ebs = await bench_ebs(root, args)
        if ebs is not None:
            results["ebs (same disk)"] = ebs
    return results


TABLE = Table(
    [
        Column("scenario", width=26, align="<"),
        Column("p50_ms", "p50 ms", 8, ".2f"),
        Column("p99_ms", "p99 ms", 8, ".2f"),
        Column("records_per_s", "rec/s", 9, ".0f"),
        Column("mib_per_s", "MiB/s", 7, ".2f"),
        Column("write_requests_per_gib", "writes/GiB", 11),
    ]
)


def plot(results: dict[str, Any], path: Path) -> None:
    def draw(figure: Any, axis: Any) -> None:
        names = list(results)
        grouped_bars(
            axis,
            names,
            {
                "p50": [results[name]["p50_ms"] for name in names],
                "p99": [results[name]["p99_ms"] for name in names],
            },
        )
        axis.set_ylabel("ack latency (ms)")
        axis.set_title("nvme-quorum WAL (3 chunk servers) vs the ebs WAL on the same disk")
        axis.legend()

    save_plot(path, draw)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (CI, smoke)")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--max-chunk-delay", default=None, help="the WAL's max_chunk_delay (default: its own)"
    )
    parser.add_argument(
        "--max-inflight", type=int, default=None, help="the WAL's max_inflight (default: its own)"
    )
    parser.add_argument("--slow-ms", type=float, default=50.0)
    parser.add_argument("--dir", default=None, help="folder for data (default: system temp)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.records is None:
        args.records = 3000 if args.quick else 30000
    results = asyncio.run(main(args))
    TABLE.print(
        {"scenario": name, "write_requests_per_gib": "-", **row} for name, row in results.items()
    )
    healthy = results["nvme-quorum healthy"]["p99_ms"]
    slow = results[f"nvme-quorum one +{args.slow_ms:g}ms"]["p99_ms"]
    ratio = slow / healthy
    print(f"p99 with one server +{args.slow_ms:g}ms / healthy p99 = {ratio:.2f} (target <= 1.2)")
    document = {
        "benchmark": "wal_nvme_quorum",
        "settings": {
            "records": args.records,
            "record_bytes": args.record_bytes,
            "concurrency": args.concurrency,
            "slow_ms": args.slow_ms,
            "servers": 3,
            "write_quorum": 2,
            "quick": args.quick,
        },
        "machine": machine(),
        "results": results,
        "slow_p99_over_healthy_p99": ratio,
    }
    write_json(args.out, document)
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    cli()
