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
whole system call; the WAL's runs from the call to ``append`` to its acknowledgement (the shared
closed loop, ``bench/common/loadgen.py``), with all the WAL does for it: the record's header and
CRC, the copy into an aligned buffer, the fence check and, every 100 ms, a trim (two header
reads and two header writes, as the uploader's trims cost a real node). Each measurement runs
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
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import cli, profile
from common.loadgen import closed_loop
from common.processes import require_tools
from common.report import median_of, save_plot, write_results
from walstream.wal import WalMode
from walstream_wal_ebs import EbsWal
from walstream_wal_ebs.layout import RECORD_AREA_START

SIZES = {"1KiB": 1 << 10, "4KiB": 4 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20}
CONCURRENCY = (1, 64)
MAX_INFLIGHT = 4
WAL_IO_BYTES = (1 << 20) + 4096
"""The one write a 1 MiB append takes: its 32-byte record header and the closing padding
record need one 4 KiB block more."""
WAL_SMALL_IO_BYTES = 8192
"""The one write a 4 KiB append takes (its record header needs a block more)."""
FIO_JOBS: dict[str, dict[str, Any]] = {
    "lat_4k_qd1": {"rw": "randwrite", "bs": "4k", "iodepth": 1, "ioengine": "psync"},
    # The WAL's own IO for a 4 KiB append: sequential, and a block more.
    "lat_walio_qd1": {"rw": "write", "bs": WAL_SMALL_IO_BYTES, "iodepth": 1, "ioengine": "psync"},
    "bw_1m_qd1": {"rw": "write", "bs": "1m", "iodepth": 1, "ioengine": "libaio"},
    "bw_1m_qdN": {"rw": "write", "bs": "1m", "iodepth": MAX_INFLIGHT, "ioengine": "libaio"},
    # The WAL's own IO for a 1 MiB append: the record header takes a block more.
    "bw_walio_qd1": {"rw": "write", "bs": WAL_IO_BYTES, "iodepth": 1, "ioengine": "libaio"},
    "bw_walio_qdN": {
        "rw": "write",
        "bs": WAL_IO_BYTES,
        "iodepth": MAX_INFLIGHT,
        "ioengine": "libaio",
    },
}
"""fio's jobs, measured in this order in every run."""


@dataclass
class Disk:
    """The file both sides write: its path, size and record area."""

    path: Path
    file_bytes: int

    @property
    def area_bytes(self) -> int:
        return self.file_bytes - RECORD_AREA_START


async def measure_wal(
    disk: Disk, epoch: int, appenders: int, record_bytes: int, seconds: float
) -> dict[str, float]:
    wal = EbsWal(disk.path, capacity_bytes=disk.file_bytes, max_inflight=MAX_INFLIGHT)
    await wal.start(1, epoch, WalMode.READ_WRITE)
    await wal.reset()
    payload = os.urandom(record_bytes)
    acked_offsets: list[int] = []
    done = asyncio.Event()

    async def append(_: int) -> int:
        acked_offsets.append(await wal.append(payload))
        return 1

    async def trimmer() -> None:
        # Keep the ring from filling: trim behind the acknowledgements, as the uploader does.
        while not done.is_set():
            await asyncio.sleep(0.1)
            if acked_offsets:
                await wal.trim(max(acked_offsets[-64:]))

    async def appenders_then_done() -> Any:
        try:
            return await closed_loop(append, appenders, seconds)
        finally:
            done.set()

    result, _ = await asyncio.gather(appenders_then_done(), trimmer())
    await wal.close()
    return {
        "records": result.operations,
        "records_per_s": result.records_per_s,
        "mb_per_s": result.records * record_bytes / result.elapsed_s / 1e6,
        "p50_us": result.latency(0.50, 1e6),
        "p99_us": result.latency(0.99, 1e6),
        "p999_us": result.latency(0.999, 1e6),
    }


def run_fio(disk: Disk, seconds: float, **job: Any) -> dict[str, Any]:
    """One fio job on the record area of ``disk`` (``seconds`` 0: write the area once)."""
    command = ["fio", "--name=walstream", f"--filename={disk.path}", "--direct=1", "--sync=dsync"]
    command += [f"--offset={RECORD_AREA_START}", f"--size={disk.area_bytes}"]
    if seconds:
        command += [f"--runtime={round(seconds * 1000)}ms", "--time_based"]
    command += ["--output-format=json", "--percentile_list=50:99:99.9"]
    command += [f"--{key}={value}" for key, value in job.items()]
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


def measure(
    disk: Disk, runs: int, seconds: float
) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """Every run: each fio job, then each WAL case; the runs of both sides by case."""
    wal_runs: dict[str, list[Any]] = {}
    fio_runs: dict[str, list[Any]] = {name: [] for name in FIO_JOBS}
    epoch = 1
    # Format, then write every block once so neither side pays for first-touch extents.
    asyncio.run(measure_wal(disk, epoch, 1, 1 << 10, 0.01))
    run_fio(disk, 0, rw="write", bs="1m", iodepth=8, ioengine="libaio")
    for run in range(runs):
        for name, job in FIO_JOBS.items():
            fio_runs[name].append(run_fio(disk, seconds, **job))
        for appenders in CONCURRENCY:
            for size_name, size in SIZES.items():
                epoch += 1
                with profile.measured(f"measure_wal {appenders}x{size_name}"):
                    result = asyncio.run(measure_wal(disk, epoch, appenders, size, seconds))
                wal_runs.setdefault(f"{appenders}x{size_name}", []).append(result)
        print(f"run {run + 1}/{runs} done", flush=True)
    return wal_runs, fio_runs


def ratios_of(
    wal: dict[str, dict[str, float]], fio: dict[str, dict[str, float]]
) -> dict[str, float]:
    return {
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


def print_table(
    wal: dict[str, dict[str, float]], fio: dict[str, dict[str, float]], ratios: dict[str, float]
) -> None:
    print(f"{'case':<22}{'p50 us':>10}{'p99 us':>10}{'p999 us':>10}{'rec/s':>12}{'MB/s':>10}")
    for side, rows, rate in (("wal", wal, "records_per_s"), ("fio", fio, "iops")):
        for name, row in rows.items():
            print(
                f"{side + ' ' + name:<22}{row['p50_us']:>10.0f}{row['p99_us']:>10.0f}"
                f"{row['p999_us']:>10.0f}{row[rate]:>12.0f}{row['mb_per_s']:>10.1f}"
            )
    print("\nratios (targets: p99 <= 1.5x fio, bandwidth >= 0.8x fio, >= 100k rec/s)")
    for name, value in ratios.items():
        print(f"  {name:<36}{value:>12.2f}")


def plot(path: Path, wal: dict[str, dict[str, float]], fio: dict[str, dict[str, Any]]) -> bool:
    """Latency at QD1 and bandwidth of 1 MiB appends next to fio's; False without matplotlib."""

    def draw(figure: Any, axes: Any) -> None:
        latency, bandwidth = axes
        for index, metric in enumerate(("p50_us", "p99_us")):
            values = [wal["1x4KiB"][metric], fio["lat_4k_qd1"][metric]]
            latency.bar([x + index * 0.4 for x in range(2)], values, 0.4, label=metric[:3])
        latency.set_xticks([0.2, 1.2], ["wal 1x4KiB", "fio 4k QD1"])
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

    return save_plot(path, draw, figsize=(10, 4), columns=2, dpi=100)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "wal_ebs", quick="3 short runs on a smaller file")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="folder for the test file")
    parser.add_argument("--runs", type=int, help="default 3 (smoke 1)")
    parser.add_argument("--seconds", type=float, help="default 3 (quick 1)")
    args = parser.parse_args(argv)
    args.runs = cli.sized(args, args.runs, full=3, quick=3, smoke=1)
    args.seconds = cli.sized(args, args.seconds, full=3.0, quick=1.0, smoke=0.1)
    args.file_bytes = cli.sized(args, None, full=1 << 30, quick=256 << 20, smoke=32 << 20)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    require_tools("fio")  # it gives the physical limit (Debian package fio)
    workdir = Path(tempfile.mkdtemp(prefix="walstream-bench-", dir=args.dir))
    try:
        wal_runs, fio_runs = measure(
            Disk(workdir / "wal.img", args.file_bytes), args.runs, args.seconds
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wal = {name: median_of(values) for name, values in wal_runs.items()}
    fio = {name: median_of(values) for name, values in fio_runs.items()}
    ratios = ratios_of(wal, fio)
    print(
        f"\nebs WAL on {args.dir} ({cli.mode(args)}: {args.runs} runs x {args.seconds:g} s, "
        f"medians; max_inflight={MAX_INFLIGHT})"
    )
    print_table(wal, fio, ratios)
    document = {
        "benchmark": "wal_ebs",
        "mode": cli.mode(args),
        "quick": args.quick,
        "runs": args.runs,
        "seconds_per_measurement": args.seconds,
        "max_inflight": MAX_INFLIGHT,
        "folder": args.dir,
        "wal": wal,
        "fio": fio,
        "ratios": ratios,
        "raw": {"wal": wal_runs, "fio": fio_runs},
    }
    write_results(args.json, document, lambda png: plot(png, wal, fio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
