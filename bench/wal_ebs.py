"""Benchmark of the ebs WAL against fio on the same file, in the same run.

For 1 and 64 concurrent appenders at 1 KiB, 4 KiB, 64 KiB and 1 MiB records it measures append
latency (p50/p99/p999, from the call to the acknowledgement) and throughput (records/s, MB/s).
fio gives the physical limit on the same file: QD1 4 KiB random writes with O_DIRECT + O_DSYNC
(the WAL's own durability mode) for latency, and 1 MiB sequential O_DIRECT + O_DSYNC writes at
queue depth 1 and at the WAL's window (``max_inflight``) for bandwidth — and the same with the
WAL's own IO size for a 1 MiB append (1 MiB + 4 KiB: the record header needs a block more) and,
for latency, sequential 8 KiB writes at QD1 (a 4 KiB append's record header, too, takes a block
more), which show how much of the gap the IO's shape explains. The targets stay the ratios to
fio's own shapes (4 KiB QD1; 1 MiB at QD1 and at ``max_inflight``).

Both sides see the same conditions: the same file and region (the record area); every block
written once before anything is measured (the file is created with ``fallocate``, and the first
write into an unwritten extent also converts it, which would slow whoever writes first); fio and
the WAL alternating within each run (each run measures every fio job, then every WAL case); the
medians of several runs. fio's latency is its completion latency, which for ``psync`` is the
whole system call; the WAL's runs from the call to ``append`` to its acknowledgement, with all
the WAL does for it: the record's header and CRC, the copy into an aligned buffer, the fence
check and, every 100 ms, a trim (two header reads and two header writes, as the uploader's trims
cost a real node). Each measurement runs
several times; the table shows medians and the ratios to fio. JSON goes to
``bench/results/wal_ebs.json``, a plot to ``bench/results/wal_ebs.png`` (when matplotlib is
installed).

    .venv/bin/python bench/wal_ebs.py            # 3 runs of 3 s each, 1 GiB file
    .venv/bin/python bench/wal_ebs.py --quick    # 3 runs of 1 s each, 256 MiB file
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import _profile
from walstream.wal import WalMode
from walstream_wal_ebs import EbsWal
from walstream_wal_ebs.layout import RECORD_AREA_START

SIZES = {"1KiB": 1 << 10, "4KiB": 4 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20}
CONCURRENCY = (1, 64)
MAX_INFLIGHT = 4
RESULTS = Path(__file__).resolve().parent / "results" / "wal_ebs.json"
WAL_IO_BYTES = (1 << 20) + 4096
"""The one write a 1 MiB append takes: its 32-byte record header and the closing padding
record need one 4 KiB block more."""
WAL_SMALL_IO_BYTES = 8192
"""The one write a 4 KiB append takes (its record header needs a block more)."""


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


async def measure_wal(
    path: Path, capacity: int, epoch: int, appenders: int, record_bytes: int, seconds: float
) -> dict[str, float]:
    wal = EbsWal(path, capacity_bytes=capacity, max_inflight=MAX_INFLIGHT)
    await wal.start(1, epoch, WalMode.READ_WRITE)
    await wal.reset()
    payload = os.urandom(record_bytes)
    latencies: list[float] = []
    acked_offsets: list[int] = []
    stop_at = time.perf_counter() + seconds

    async def appender() -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            offset = await wal.append(payload)
            latencies.append(time.perf_counter() - started)
            acked_offsets.append(offset)

    async def trimmer() -> None:
        # Keep the ring from filling: trim behind the acknowledgements, as the uploader does.
        while time.perf_counter() < stop_at:
            await asyncio.sleep(0.1)
            if acked_offsets:
                await wal.trim(max(acked_offsets[-64:]))

    started = time.perf_counter()
    await asyncio.gather(trimmer(), *(appender() for _ in range(appenders)))
    elapsed = time.perf_counter() - started
    await wal.close()
    latencies.sort()
    count = len(latencies)
    return {
        "records": count,
        "records_per_s": count / elapsed,
        "mb_per_s": count * record_bytes / elapsed / 1e6,
        "p50_us": percentile(latencies, 0.50) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
        "p999_us": percentile(latencies, 0.999) * 1e6,
    }


def run_fio(path: Path, area_bytes: int, seconds: float, **job: Any) -> dict[str, Any]:
    command = [
        "fio",
        "--name=walstream",
        f"--filename={path}",
        "--direct=1",
        "--sync=dsync",
        f"--offset={RECORD_AREA_START}",
        f"--size={area_bytes}",
        *([f"--runtime={seconds}", "--time_based"] if seconds else []),
        "--output-format=json",
        "--percentile_list=50:99:99.9",
        *(f"--{key}={value}" for key, value in job.items()),
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    write = json.loads(output[output.index("{") :])["jobs"][0]["write"]
    percentiles = write["clat_ns"].get("percentile", {})
    return {
        "iops": write["iops"],
        "mb_per_s": write["bw_bytes"] / 1e6,
        "p50_us": percentiles.get("50.000000", float("nan")) / 1e3,
        "p99_us": percentiles.get("99.000000", float("nan")) / 1e3,
        "p999_us": percentiles.get("99.900000", float("nan")) / 1e3,
    }


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def plot(path: Path, wal: dict[str, dict[str, float]], fio: dict[str, dict[str, Any]]) -> bool:
    """Latency at QD1 and bandwidth of 1 MiB appends next to fio's; False without matplotlib."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (latency, bandwidth) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["wal 1x4KiB", "fio 4k QD1"]
    for index, metric in enumerate(("p50_us", "p99_us")):
        values = [wal["1x4KiB"][metric], fio["lat_4k_qd1"][metric]]
        latency.bar([x + index * 0.4 for x in range(2)], values, 0.4, label=metric[:3])
    latency.set_xticks([0.2, 1.2], names)
    latency.set_title("4 KiB durable append latency (us)")
    latency.legend()
    bandwidth.bar(
        ["wal 1x1MiB", "fio 1m QD1", "wal 64x1MiB", f"fio 1m QD{MAX_INFLIGHT}"],
        [
            wal["1x1MiB"]["mb_per_s"],
            fio["bw_1m_qd1"]["mb_per_s"],
            wal["64x1MiB"]["mb_per_s"],
            fio["bw_1m_qdN"]["mb_per_s"],
        ],
        color=["tab:blue", "tab:gray", "tab:blue", "tab:gray"],
    )
    bandwidth.set_title("1 MiB appends (MB/s)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 short runs on a smaller file")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="folder for the test file")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--seconds", type=float)
    args = parser.parse_args()
    runs = args.runs or 3
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    file_bytes = (256 << 20) if args.quick else (1 << 30)
    logging.basicConfig(level=logging.WARNING)
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed (Debian package fio); it gives the physical limit")

    workdir = Path(tempfile.mkdtemp(prefix="walstream-bench-", dir=args.dir))
    path = workdir / "wal.img"
    area_bytes = file_bytes - RECORD_AREA_START
    epoch = 0
    wal_runs: dict[str, list[dict[str, float]]] = {}
    fio_runs: dict[str, list[dict[str, Any]]] = {
        "lat_4k_qd1": [],
        "lat_walio_qd1": [],
        "bw_1m_qd1": [],
        "bw_1m_qdN": [],
        "bw_walio_qd1": [],
        "bw_walio_qdN": [],
    }
    try:
        # Format, then write every block once so neither side pays for first-touch extents.
        epoch += 1
        asyncio.run(measure_wal(path, file_bytes, epoch, 1, 1 << 10, 0.01))
        run_fio(path, area_bytes, 0, rw="write", bs="1m", iodepth=8, ioengine="libaio")
        for run in range(runs):
            fio_runs["lat_4k_qd1"].append(
                run_fio(
                    path, area_bytes, seconds, rw="randwrite", bs="4k", iodepth=1, ioengine="psync"
                )
            )
            # The WAL's own IO for a 4 KiB append: sequential, and a block more.
            fio_runs["lat_walio_qd1"].append(
                run_fio(
                    path,
                    area_bytes,
                    seconds,
                    rw="write",
                    bs=str(WAL_SMALL_IO_BYTES),
                    iodepth=1,
                    ioengine="psync",
                )
            )
            fio_runs["bw_1m_qd1"].append(
                run_fio(
                    path, area_bytes, seconds, rw="write", bs="1m", iodepth=1, ioengine="libaio"
                )
            )
            fio_runs["bw_1m_qdN"].append(
                run_fio(
                    path,
                    area_bytes,
                    seconds,
                    rw="write",
                    bs="1m",
                    iodepth=MAX_INFLIGHT,
                    ioengine="libaio",
                )
            )
            # The WAL's own IO for a 1 MiB append: the record header takes a block more.
            for depth, case in ((1, "bw_walio_qd1"), (MAX_INFLIGHT, "bw_walio_qdN")):
                fio_runs[case].append(
                    run_fio(
                        path,
                        area_bytes,
                        seconds,
                        rw="write",
                        bs=str(WAL_IO_BYTES),
                        iodepth=depth,
                        ioengine="libaio",
                    )
                )
            for appenders in CONCURRENCY:
                for size_name, size in SIZES.items():
                    epoch += 1
                    with _profile.measured(f"measure_wal {appenders}x{size_name}"):
                        result = asyncio.run(
                            measure_wal(path, file_bytes, epoch, appenders, size, seconds)
                        )
                    wal_runs.setdefault(f"{appenders}x{size_name}", []).append(result)
            print(f"run {run + 1}/{runs} done", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    wal = {name: median_of(values) for name, values in wal_runs.items()}
    fio = {name: median_of(values) for name, values in fio_runs.items()}
    ratios = {
        "p99_1x4KiB_over_fio_qd1_p99": wal["1x4KiB"]["p99_us"] / fio["lat_4k_qd1"]["p99_us"],
        "p99_1x4KiB_over_fio_walio_qd1_p99": (
            wal["1x4KiB"]["p99_us"] / fio["lat_walio_qd1"]["p99_us"]
        ),
        "bw_1x1MiB_over_fio_qd1_bw": wal["1x1MiB"]["mb_per_s"] / fio["bw_1m_qd1"]["mb_per_s"],
        f"bw_64x1MiB_over_fio_qd{MAX_INFLIGHT}_bw": (
            wal["64x1MiB"]["mb_per_s"] / fio["bw_1m_qdN"]["mb_per_s"]
        ),
        "bw_1x1MiB_over_fio_walio_qd1_bw": (
            wal["1x1MiB"]["mb_per_s"] / fio["bw_walio_qd1"]["mb_per_s"]
        ),
        f"bw_64x1MiB_over_fio_walio_qd{MAX_INFLIGHT}_bw": (
            wal["64x1MiB"]["mb_per_s"] / fio["bw_walio_qdN"]["mb_per_s"]
        ),
        "records_per_s_64x1KiB": wal["64x1KiB"]["records_per_s"],
        # 64 closed-loop appenders never have more than 64 records outstanding, so no WAL on
        # this medium exceeds 64 records per durable-write latency.
        "closed_loop_bound_64_over_fio_p50": 64 / (fio["lat_4k_qd1"]["p50_us"] / 1e6),
    }

    print(
        f"\nebs WAL on {args.dir} ({'quick' if args.quick else 'full'}: {runs} runs x "
        f"{seconds:g} s, medians; max_inflight={MAX_INFLIGHT})"
    )
    print(f"{'case':<22}{'p50 us':>10}{'p99 us':>10}{'p999 us':>10}{'rec/s':>12}{'MB/s':>10}")
    for name, row in wal.items():
        print(
            f"{'wal ' + name:<22}{row['p50_us']:>10.0f}{row['p99_us']:>10.0f}"
            f"{row['p999_us']:>10.0f}{row['records_per_s']:>12.0f}{row['mb_per_s']:>10.1f}"
        )
    for name, row in fio.items():
        print(
            f"{'fio ' + name:<22}{row['p50_us']:>10.0f}{row['p99_us']:>10.0f}"
            f"{row['p999_us']:>10.0f}{row['iops']:>12.0f}{row['mb_per_s']:>10.1f}"
        )
    print("\nratios (targets: p99 <= 1.5x fio, bandwidth >= 0.8x fio, >= 100k rec/s)")
    for name, value in ratios.items():
        print(f"  {name:<36}{value:>12.2f}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "wal_ebs",
                "quick": args.quick,
                "runs": runs,
                "seconds_per_measurement": seconds,
                "max_inflight": MAX_INFLIGHT,
                "host": {
                    "machine": platform.machine(),
                    "kernel": platform.release(),
                    "cpus": os.cpu_count(),
                    "folder": args.dir,
                },
                "wal": wal,
                "fio": fio,
                "ratios": ratios,
                "raw": {"wal": wal_runs, "fio": fio_runs},
            },
            indent=2,
        )
    )
    png = RESULTS.with_suffix(".png")
    drawn = plot(png, wal, fio)
    print(f"\nwrote {RESULTS}" + (f" and {png}" if drawn else " (no PNG: matplotlib missing)"))


if __name__ == "__main__":
    main()
