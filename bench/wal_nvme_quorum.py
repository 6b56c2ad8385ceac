"""Benchmark: the nvme-quorum WAL on 3 local chunk servers — all healthy, one slowed by +50 ms,
one down — beside the ebs WAL on the same disk (when walstream_wal_ebs is installed).

    .venv/bin/python bench/wal_nvme_quorum.py [--quick] [--records N] [--concurrency C]

Prints a table and writes bench/results/wal_nvme_quorum.json (with the requests sent to the chunk
servers per GiB appended, by operation) and a plot beside it. The acknowledgement latency is
measured per append (from ``append`` to its acknowledgement) with C appenders running at once
(the shared closed loop, ``bench/common/loadgen.py``, until N appends were made).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import cli, profile
from common.loadgen import closed_loop
from common.report import Column, Table, grouped_bars, save_plot, write_results
from walstream.config import BuildContext
from walstream.wal import WalMode, WriteAheadLog
from walstream_wal_nvme_quorum import NVME_QUORUM_WAL
from walstream_wal_nvme_quorum.testing import ChunkServerProcess, chunk_servers


async def run_workload(
    wal: WriteAheadLog, records: int, record_bytes: int, concurrency: int
) -> dict[str, float]:
    payload = b"w" * record_bytes

    async def append(_: int) -> int:
        await wal.append(payload)
        return 1

    result = await closed_loop(append, concurrency, operations=records)
    return {
        "records": result.operations,
        "p50_ms": result.latency(0.50, 1e3),
        "p99_ms": result.latency(0.99, 1e3),
        "mean_ms": result.mean(1e3),
        "records_per_s": result.records_per_s,
        "mib_per_s": result.records * record_bytes / result.elapsed_s / (1 << 20),
    }


async def started(wal: WriteAheadLog, epoch: int) -> WriteAheadLog:
    """``wal`` started at ``epoch``, recovered and reset, ready for appends."""
    await wal.start(1, epoch, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    await wal.reset()
    return wal


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
    wal = await started(NVME_QUORUM_WAL.build(options, BuildContext(node_id=1), "wal"), epoch)
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
    context = BuildContext(node_id=1, base_dir=folder)
    wal = await started(EBS_WAL.build(options, context, "wal"), 1)
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


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Healthy, one server slowed, one down; then the ebs WAL on the same disk."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-nvme-quorum-", dir=args.dir) as folder:
        root = Path(folder)
        with chunk_servers(root / "servers") as servers:
            with profile.measured("bench_quorum healthy"):
                results["nvme-quorum healthy"] = await bench_quorum(servers, 1, args)
            with slowed(servers, 2, args.slow_ms):
                await asyncio.sleep(0.2)
                slow = await bench_quorum(servers, 2, args)
                results[f"nvme-quorum one +{args.slow_ms:g}ms"] = slow
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


def plot(results: dict[str, Any], path: Path) -> bool:
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

    return save_plot(path, draw)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(
        __doc__, "wal_nvme_quorum", quick="a short run (3,000 records)", json_aliases=("--out",)
    )
    parser.add_argument("--records", type=int, default=None, help="default 30,000")
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
    args = parser.parse_args(argv)
    args.records = cli.sized(args, args.records, full=30000, quick=3000, smoke=200)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(measure(args))
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
            "mode": cli.mode(args),
        },
        "results": results,
        "slow_p99_over_healthy_p99": ratio,
    }
    write_results(args.json, document, lambda png: plot(results, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
