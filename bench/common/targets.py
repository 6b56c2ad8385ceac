"""The performance targets of the project's paths and how each is read from the JSON that the
benchmarks of ``bench/`` write: one row per target, with the figure reached, the side-by-side
figure measured in the same run (a device, a peer or the rig itself), their ratio, the target,
and whether it is met. ``bench/run_all.py`` prints them as one table.

A row whose benchmark did not run (or wrote no JSON) reads "not run"; a row whose target is not
met names the profile that shows what bounds it: the py-spy top list that ``run_all.py
--profile`` wrote in this run (``bench/results/<bench>.profile.txt``), else the one saved in
``bench/figures/profile_<bench>.txt``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    """One target and what the last run measured for it."""

    path: str
    bench: str
    target: str
    reached: str = "-"
    reference: str = "-"
    ratio: str = "-"
    met: bool | None = None
    """None: not measured in this run."""
    profile: str = "-"


Reading = tuple[str, str, float, bool]
"""(reached, side-by-side figure, ratio, met)."""


def _ebs_p99(doc: dict[str, Any]) -> Reading:
    wal, fio = doc["wal"]["1x4KiB"]["p99_us"], doc["fio"]["lat_4k_qd1"]["p99_us"]
    ratio = wal / fio
    return f"p99 {wal:.0f} us", f"fio 4k QD1 O_DIRECT+O_DSYNC p99 {fio:.0f} us", ratio, ratio <= 1.5


def _ebs_bw(appenders: int, depth: str, fio_label: str) -> Callable[[dict[str, Any]], Reading]:
    def read(doc: dict[str, Any]) -> Reading:
        wal = doc["wal"][f"{appenders}x1MiB"]["mb_per_s"]
        fio = doc["fio"][f"bw_1m_{depth}"]["mb_per_s"]
        ratio = wal / fio
        reference = f"fio {fio_label} {fio:.0f} MB/s"
        same_io = doc["fio"].get(f"bw_walio_{depth}")
        if same_io:
            # The ratio stays against 1 MiB writes; the WAL's own IO shape is shown beside it.
            reference += f" (1028 KiB IOs as the WAL's: {same_io['mb_per_s']:.0f})"
        return f"{wal:.0f} MB/s", reference, ratio, ratio >= 0.8

    return read


def _engine_throughput(doc: dict[str, Any]) -> Reading:
    ours, redis = doc["results"]["walstream_appends"], doc["results"]["redis_appends"]
    ratio = ours["records_per_s"] / redis["records_per_s"]
    return (
        f"{ours['records_per_s'] / 1e3:.1f}k rec/s",
        f"Redis appendfsync always {redis['records_per_s'] / 1e3:.1f}k rec/s",
        ratio,
        ratio >= 1.0,
    )


def _engine_p99(doc: dict[str, Any]) -> Reading:
    ours, redis = doc["results"]["walstream_appends"], doc["results"]["redis_appends"]
    ratio = ours["p99_ms"] / redis["p99_ms"]
    return (
        f"p99 {ours['p99_ms']:.1f} ms",
        f"Redis p99 {redis['p99_ms']:.1f} ms",
        ratio,
        ratio <= 2.0,
    )


def _tail(doc: dict[str, Any]) -> Reading:
    ours, redis = doc["results"]["walstream_tail"], doc["results"]["redis_tail"]
    # The reader is woken by the acknowledgement itself, so the path from the append call to
    # the reader (durable, then delivered) is shown beside it.
    return (
        f"p99 {ours['p99_ms']:.2f} ms; from the append call {ours['from_call_p99_ms']:.2f} ms",
        f"Redis XADD -> XREAD BLOCK p99 {redis['p99_ms']:.2f} ms; from the XADD call "
        f"{redis['from_call_p99_ms']:.2f} ms",
        ours["p99_ms"] / 1.0,
        ours["p99_ms"] <= 1.0,
    )


def _s3(workload: str, raw_workload: str) -> Callable[[dict[str, Any]], Reading]:
    def read(doc: dict[str, Any]) -> Reading:
        rows = {
            row["workload"]: row for row in doc["results"] if row.get("endpoint") == "latency-model"
        }
        wal = rows[f"wal {workload}"]["throughput_mib_s"]
        raw = rows[f"raw {raw_workload}"]["throughput_mib_s"]
        ratio = wal / raw
        return (
            f"{wal:.1f} MiB/s",
            f"raw PUTs ({raw_workload}) {raw:.1f} MiB/s",
            ratio,
            wal >= 200 or (raw < 200 and ratio >= 0.8),
        )

    return read


def _s3express(metric: str, bound: float) -> Callable[[dict[str, Any]], Reading]:
    def read(doc: dict[str, Any]) -> Reading:
        rows = {(row["scenario"], row["workload"]): row for row in doc["rows"]}
        put = rows[("raw PUT", "1 x 4KiB")]["ack_p50_ms"]
        ack = rows[("healthy", "1 x 4KiB")][metric]
        ratio = ack / put
        return (
            f"{metric[4:7]} {ack:.1f} ms",
            f"PUT p50 {put:.1f} ms (model {doc['latency_model']['p50_ms']:g} ms)",
            ratio,
            ratio <= bound,
        )

    return read


def _nvme(metric: str) -> Callable[[dict[str, Any]], Reading]:
    def read(doc: dict[str, Any]) -> Reading:
        quorum, ebs = doc["results"]["nvme-quorum healthy"], doc["results"]["ebs (same disk)"]
        ratio = quorum[metric] / ebs[metric]
        if metric == "p99_ms":
            return (
                f"p99 {quorum[metric]:.2f} ms",
                f"ebs WAL same disk p99 {ebs[metric]:.2f} ms",
                ratio,
                ratio <= 2.0,
            )
        return (
            f"{quorum[metric]:.0f} rec/s",
            f"ebs WAL same disk {ebs[metric]:.0f} rec/s",
            ratio,
            ratio >= 0.8,
        )

    return read


def _cold_read(doc: dict[str, Any]) -> Reading:
    cold = statistics.median(
        row["mib_per_s"] for row in doc["rows"] if row["reader"] == "cold read_committed"
    )
    runs: dict[str, list[float]] = {}
    for row in doc["rows"]:
        if row["reader"].startswith("raw"):
            runs.setdefault(row["reader"], []).append(row["mib_per_s"])
    raw = {reader: statistics.median(values) for reader, values in runs.items()}  # as cold
    best = max(raw.values())
    described = ", ".join(f"{name[4:]} {value:.0f}" for name, value in raw.items())
    # The same read without GET latency: what checking and decoding alone allow.
    ceiling = [
        row["mib_per_s"]
        for row in doc["rows"]
        if row["reader"] == "cold read_committed (no GET latency)"
    ]
    if ceiling:
        described += f"; decoding alone {ceiling[0]:.0f}"
    return f"{cold:.0f} MiB/s", f"ranged GETs {described} MiB/s", cold / best, cold / best >= 0.8


def _spark(doc: dict[str, Any]) -> Reading:
    rates = {row["master"]: row["records_per_s"] for row in doc["results"]}
    one, two = rates["local[1]"], rates["local[2]"]
    scaling = two / one
    bounds = doc.get("bounds")
    limit = "linear: 2.00x"
    if bounds:
        # Measured in the same runs: what the machine's cores and the slices allow.
        limit += (
            f"; {bounds['cpus']} cores allow {bounds['cpu_ceiling']:.2f}x, "
            f"{doc['results'][1]['tasks']} tasks {bounds['balance_ceiling']:.2f}x"
        )
    return f"{one / 1e3:.0f}k -> {two / 1e3:.0f}k rec/s", limit, scaling, scaling >= 1.7


def _kafka(doc: dict[str, Any]) -> Reading:
    workload = "64c x 100 rec"
    kafka = doc["summary"]["walstream-kafka"][workload]["records_per_s"]
    redis = doc["summary"]["redis"][workload]["records_per_s"]
    ratio = kafka / redis
    return f"{kafka:,.0f} rec/s", f"Redis MULTI/EXEC XADD {redis:,.0f} rec/s", ratio, ratio >= 1.0


TARGETS: list[tuple[Row, Callable[[dict[str, Any]], Reading]]] = [
    (Row("ebs WAL, 1 appender x 4 KiB, p99", "wal_ebs", "<= 1.5x fio"), _ebs_p99),
    (
        Row("ebs WAL, 1 appender x 1 MiB, bandwidth", "wal_ebs", ">= 0.8x fio"),
        _ebs_bw(1, "qd1", "1m QD1"),
    ),
    (
        Row("ebs WAL, 64 appenders x 1 MiB, bandwidth", "wal_ebs", ">= 0.8x fio"),
        _ebs_bw(64, "qdN", "1m QD4 (= WAL window)"),
    ),
    (
        Row("engine in-process, 64 x 1 KiB appends, rec/s", "engine_local", ">= 1.0x Redis"),
        _engine_throughput,
    ),
    (
        Row("engine in-process, 64 x 1 KiB appends, p99", "engine_local", "<= 2x Redis"),
        _engine_p99,
    ),
    (
        Row("s3 WAL, 64 x 64 KiB (PUT p50 50 / p99 150 ms)", "wal_s3", ">= 200 MiB/s or 0.8x"),
        _s3("64 x 64KiB", "64 x 64KiB"),
    ),
    (
        Row("s3 WAL, 1024 x 64 KiB (same model)", "wal_s3", ">= 200 MiB/s or 0.8x"),
        _s3("1024 x 64KiB", "8 x 4MiB"),
    ),
    (
        Row("s3express, 5 ms PUT model, 1 x 4 KiB ack p50", "wal_s3express", "<= 2x PUT"),
        _s3express("ack_p50_ms", 2.0),
    ),
    (
        Row("s3express, 5 ms PUT model, 1 x 4 KiB ack p99", "wal_s3express", "<= 4x PUT"),
        _s3express("ack_p99_ms", 4.0),
    ),
    (
        Row("nvme-quorum, 3 local chunk servers, p99", "wal_nvme_quorum", "<= 2x ebs"),
        _nvme("p99_ms"),
    ),
    (
        Row("nvme-quorum, 3 local chunk servers, rec/s", "wal_nvme_quorum", ">= 0.8x ebs"),
        _nvme("records_per_s"),
    ),
    (
        Row("tail read: acknowledged -> visible, p99", "engine_local", "<= 1.0x 1 ms"),
        _tail,
    ),
    (Row("catch-up read of a cold stream", "cold_read", ">= 0.8x GETs"), _cold_read),
    (Row("Spark replay local[1] -> local[2]", "spark_replay", ">= 1.7x"), _spark),
    (
        Row("Kafka produce, 64 producers x 100 x 1 KiB, rec/s", "kafka", ">= 1.0x Redis"),
        _kafka,
    ),
]


def profile_for(bench: str, results: Path) -> str:
    """The py-spy top list of ``bench``: this run's if ``--profile`` wrote one, else the saved
    one; "-" when there is neither."""
    for candidate in (results / f"{bench}.profile.txt", BENCH / "figures" / f"profile_{bench}.txt"):
        if candidate.exists():
            inside = candidate.is_relative_to(BENCH.parent)
            return str(candidate.relative_to(BENCH.parent) if inside else candidate)
    return "-"


def rows(documents: dict[str, Any], results: Path) -> list[Row]:
    """Every target, read from the benchmarks' JSON documents (by script stem)."""
    table: list[Row] = []
    for template, read in TARGETS:
        row = Row(template.path, template.bench, template.target)
        document = documents.get(row.bench)
        if document is None:
            row.reached = "not run"
        else:
            try:
                row.reached, row.reference, ratio, row.met = read(document)
                row.ratio = f"{ratio:.2f}x"
            except (KeyError, TypeError, ValueError, ZeroDivisionError, statistics.StatisticsError):
                row.reached = f"no figure in {row.bench}.json"
        if row.met is False:
            row.profile = profile_for(row.bench, results)
        table.append(row)
    return table


def render(table: list[Row]) -> str:
    """The rows as an aligned text table."""
    header = ("PATH", "REACHED", "SIDE BY SIDE (SAME RUN)", "RATIO", "TARGET", "MET", "PROFILE")
    cells = [header] + [
        (
            row.path,
            row.reached,
            row.reference,
            row.ratio,
            row.target,
            {True: "met", False: "NOT MET", None: "-"}[row.met],
            row.profile,
        )
        for row in table
    ]
    widths = [max(len(line[column]) for line in cells) for column in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + "  "
        + line[-1]
        for line in cells
    )
