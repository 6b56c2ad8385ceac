"""Every benchmark script still runs: a refactor that breaks one fails here, not at the next
``make bench``.

- every script takes the options ``bench/run_all.py`` gives it (``--quick``, ``--smoke``,
  ``--json``);
- every script runs end to end in its smoke mode through ``bench/run_all.py --smoke`` (seconds
  each), writes its JSON and PNG where it is told, and the targets table reads its figures;
- Spark's replay and the failover benchmark start a JVM and a three-node cluster (half a minute
  each): with ``--soak`` they run end to end the same way; without, their report is driven on
  figures of the shape their measurement returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import run_all

BENCH = Path(__file__).resolve().parents[1]
HEAVY = ("spark_replay", "failover")
"""Scripts whose smoke run starts a JVM or a cluster: end to end only with ``--soak``."""

_OPTIONS_CHECK = """
import importlib, sys
from pathlib import Path
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    for mode in ("--quick", "--smoke"):
        parsed = module.parse_args([mode, "--json", "elsewhere.json"])
        args = parsed[0] if isinstance(parsed, tuple) else parsed
        assert args.json == Path("elsewhere.json"), (name, args.json)
        assert getattr(args, mode[2:]) is True, (name, mode)
    print(name, "ok")
"""


def run_benchmarks(names: list[str], results: Path) -> dict[str, Any]:
    """``bench/run_all.py --smoke`` of ``names`` into ``results``; its run_all.json."""
    command = [sys.executable, str(BENCH / "run_all.py"), "--smoke", "--results", str(results)]
    done = subprocess.run(
        [*command, *names], capture_output=True, text=True, timeout=550, check=False
    )
    assert (results / "run_all.json").exists(), done.stdout + done.stderr
    document: dict[str, Any] = json.loads((results / "run_all.json").read_text())
    failed = {
        run["name"]: (results / f"{run['name']}.log").read_text()[-3000:]
        for run in document["runs"]
        if run["status"] != "ok"
    }
    assert not failed, "\n\n".join(f"== {name}\n{log}" for name, log in failed.items())
    assert done.returncode == 0, done.stdout[-3000:]
    return document


def check_results(document: dict[str, Any], results: Path) -> None:
    """Each script's JSON and PNG where it was told, and every target of a script that ran read
    from its JSON."""
    for run in document["runs"]:
        if run["name"] == run_all.ENGINE:  # walstream bench's own JSON
            assert run["results"]["verified"] is True
            continue
        out = results / f"{run['name']}.json"
        assert run["results_file"] == str(out)
        assert {"machine", "load_average"} <= set(run["results"]), run["name"]
        assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG"), run["name"]
    ran = {run["name"] for run in document["runs"]}
    for target in document["targets"]:
        if target["bench"] in ran:
            assert target["ratio"] != "-", target


@pytest.mark.slow
def test_every_script_takes_the_options_run_all_gives_it() -> None:
    names = run_all.scripts()
    assert {"peers", "hostile", "streams_scale", "serve_cpu", "wal_ebs"} <= set(names)
    done = subprocess.run(
        [sys.executable, "-c", _OPTIONS_CHECK, *names],
        cwd=BENCH,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [word for name in names for word in (name, "ok")]


@pytest.mark.slow
def test_every_benchmark_runs_end_to_end_in_its_smoke_mode(tmp_path: Path) -> None:
    names = [run_all.ENGINE, *(name for name in run_all.scripts() if name not in HEAVY)]
    document = run_benchmarks(names, tmp_path)
    assert [run["name"] for run in document["runs"]] == names
    check_results(document, tmp_path)


@pytest.mark.slow
def test_spark_replay_and_failover(tmp_path: Path, soak: bool) -> None:
    if soak:
        check_results(run_benchmarks(list(HEAVY), tmp_path), tmp_path)
        return
    spark_report(tmp_path)
    failover_report(tmp_path)


def spark_report(folder: Path) -> None:
    """spark_replay's report on two replays of the shape ``measure`` returns."""
    import spark_replay

    args = spark_replay.parse_args(["--smoke", "--json", str(folder / "spark_replay.json")])
    assert (args.streams, args.records, args.runs, args.warmup) == (1, 2000, 1, 0)
    cpu = {"driver": 0.1, "jvm": 1.0, "python_workers": 0.5}
    runs = {"local[1]": [(2.0, 2000, cpu), (1.8, 2000, cpu)], "local[2]": [(1.0, 2000, cpu)]}
    results = spark_replay.best_runs(runs, {"local[1]": 2, "local[2]": 2}, 2000, 400_000)
    assert [row["seconds"] for row in results] == [1.8, 1.0], "each master's best run"
    bounds = spark_replay.ceilings(results, 2)
    assert bounds["scaling"] == 1.8 and bounds["balance_ceiling"] == 2.0
    assert spark_replay.plot(results, folder / "spark_replay.png")


def failover_report(folder: Path) -> None:
    """failover's recovery times and report on rounds of the shape ``one_round`` returns."""
    import failover

    args = failover.parse_args(["--smoke", "--wal", "nvme-quorum"])
    assert (args.kills, args.streams, args.lease) == (1, 1, "2s")
    assert args.json.name == "failover-nvme-quorum.json"
    stream = failover.StreamRun("s")
    stream.ack_times, stream.sent_times = [9.0, 10.1, 13.5], [8.9, 9.95, 10.5]
    assert stream.recovered_after(10.0) == pytest.approx(3.5), "an answer on its way is no recovery"
    rounds: list[dict[str, Any]] = [
        {"round": 1, "recovery_s": {"a": 3.5, "b": 4.0}, "acknowledged": 90, "lost": 0,
         "duplicated": 0, "unacknowledged_extra": 0, "errors": []},
        {"round": 2, "recovery_s": {"a": 3.0, "b": None}, "acknowledged": 80, "lost": 0,
         "duplicated": 0, "unacknowledged_extra": 1, "errors": []},
    ]  # fmt: skip
    summary = failover.summarize(rounds, 30.0)
    assert (summary["samples"], summary["recovered"], summary["recovery_max_s"]) == (4, 3, 4.0)
    document = {"settings": {"lease_s": 2.0, "mode": "failover", "wal": "s3"}, "rounds": rounds,
                "summary": summary}  # fmt: skip
    text = failover.table(document)
    assert "recovery p50" in text and "streams recovered 3/4" in text
    assert failover.plot(document, folder / "failover.png")
