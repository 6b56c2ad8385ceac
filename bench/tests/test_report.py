"""What the benchmarks report with: the table, the estimator, the JSON and the PNG beside it, and
the targets read from the JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from common import report, targets


def test_a_column_formats_numbers_and_writes_anything_else_as_it_is() -> None:
    table = report.Table(
        [report.Column("peer", width=6, align="<"), report.Column("cpu_us", "CPU", 6, ",.0f")]
    )
    assert table.header() == "peer      CPU"
    assert table.line({"peer": "redis", "cpu_us": 1234.4}) == "redis   1,234"
    assert table.line({"peer": "inproc", "cpu_us": "-"}) == "inproc      -"
    assert table.line({"peer": "nats"}) == "nats   " + " " * 6, "a missing key prints empty"


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(value) for value in range(100, 0, -1)]
    assert report.percentile(values, 0.5) == 51.0
    assert report.percentile(values, 0.99) == 100.0
    assert report.percentile(values, 1.0) == 100.0
    assert report.percentile(sorted(values), 0.0, presorted=True) == 1.0
    assert math.isnan(report.percentile([], 0.5))


def test_write_results_records_the_machine_and_its_load_and_draws_the_png(tmp_path: Path) -> None:
    out = tmp_path / "results" / "example.json"
    (tmp_path / "results").mkdir()
    out.with_suffix(".png").write_bytes(b"an older plot")

    def plot(png: Path) -> bool:
        def draw(figure: Any, axis: Any) -> None:
            report.grouped_bars(axis, ["a", "b"], {"x": [1.0, 2.0], "y": [2.0, 1.0]})

        return report.save_plot(png, draw)

    report.write_results(out, {"benchmark": "example", "rows": [1, 2]}, plot)
    document = json.loads(out.read_text())
    assert document["rows"] == [1, 2]
    assert set(document["machine"]) >= {"python", "platform", "cpus"}
    assert len(document["load_average"]) == 3
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG"), "the older plot replaced"


def test_a_target_reads_its_benchmark_or_says_why_not(tmp_path: Path) -> None:
    documents = {
        "wal_s3express": {
            "latency_model": {"p50_ms": 5.0},
            "rows": [
                {"scenario": "raw PUT", "workload": "1 x 4KiB", "ack_p50_ms": 5.0},
                {
                    "scenario": "healthy",
                    "workload": "1 x 4KiB",
                    "ack_p50_ms": 6.0,
                    "ack_p99_ms": 30.0,
                },
            ],
        },
        "wal_nvme_quorum": {"results": {}},
    }
    rows = {row.path: row for row in targets.rows(documents, tmp_path)}
    p50 = rows["s3express, 5 ms PUT model, 1 x 4 KiB ack p50"]
    assert (p50.ratio, p50.met) == ("1.20x", True)
    p99 = rows["s3express, 5 ms PUT model, 1 x 4 KiB ack p99"]
    assert (p99.ratio, p99.met) == ("6.00x", False)
    assert p99.profile == "bench/figures/profile_wal_s3express.txt", "a missed target names it"
    assert (
        rows["nvme-quorum, 3 local chunk servers, p99"].reached
        == "no figure in wal_nvme_quorum.json"
    )
    assert rows["catch-up read of a cold stream"].reached == "not run"
