"""Run every benchmark: ``walstream bench`` on a fresh embedded deployment, then each script in
``bench/`` — each in its own process, each bounded by a timeout — and print one summary table.

    .venv/bin/python bench/run_all.py                 # every benchmark with --quick (make bench)
    .venv/bin/python bench/run_all.py --full          # full-length runs
    .venv/bin/python bench/run_all.py wal_s3 engine   # only these (script stems; engine =
                                                      #   walstream bench)
    .venv/bin/python bench/run_all.py --smoke         # every script in seconds, to check they
                                                      #   run (the figures mean nothing)
    .venv/bin/python bench/run_all.py --profile       # each script under py-spy as well (only
                                                      #   its measured phase, common/profile.py,
                                                      #   WINDOWS)

A benchmark's own table goes to ``bench/results/<name>.log``, its JSON to
``bench/results/<name>.json`` (``--results DIR``: both in DIR; each script is told where with
``--json``); ``run_all.json`` beside them lists every run: status (``ok``, ``failed``,
``timeout``, ``skipped`` when a module or tool it needs is not installed), seconds, exit code,
and the benchmark's JSON when it wrote one. Exits 1 if any benchmark failed or timed out. It also
writes the two tables, with the date, the machine and its load, as a page of the documentation
site: ``docs/benchmarks/results/YYYY-MM-DD-<name>.md`` (``make-bench-quick``,
``make-bench-full``, or the names run; ``--no-results-page`` skips it, and a ``--smoke`` run
writes none).

After the runs it prints the targets table (``bench/common/targets.py``): every target of the
project's paths with the figure reached, the device's, peer's or rig's figure measured in the
same run, the ratio, the target and whether it is met; a target not met names the py-spy top
list of its benchmark (``--profile`` writes ``<results>/<name>.profile.txt`` for this run;
else the one saved in ``bench/figures/profile_<name>.txt``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import profile as bench_profile
from common import report, targets
from common.cli import BENCH, RESULTS

RESULTS_PAGES = BENCH.parent / "docs" / "benchmarks" / "results"
ENGINE = "engine"
_MISSING = re.compile(
    r"(?:ModuleNotFoundError: No module named '([^']+)'|"
    r"FileNotFoundError: \[Errno 2\] No such file or directory: '([^']+)')"
)
ENGINE_RECORDS = {"full": [], "quick": ["--records", "20000"], "smoke": ["--records", "1000"]}
"""``walstream bench``'s size per mode."""
TIMEOUT_S = {"full": 3600.0, "quick": 600.0, "smoke": 300.0}
"""Seconds per benchmark before it is stopped, per mode."""


@dataclass
class Run:
    """One benchmark's run and what it left behind."""

    name: str
    command: list[str]
    results: Path
    cwd: Path = BENCH.parent
    env: dict[str, str] = field(default_factory=dict)
    """Added to the environment of the benchmark's process."""
    status: str = "not run"
    seconds: float = 0.0
    returncode: int | None = None
    detail: str = ""
    document: Any = field(default=None)


def scripts() -> list[str]:
    """Every benchmark script in ``bench/`` (not this one, not private modules)."""
    return sorted(
        path.stem
        for path in BENCH.glob("*.py")
        if path.name != Path(__file__).name and not path.name.startswith("_")
    )


def plan(
    names: list[str], *, mode: str, workdir: Path, results: Path = RESULTS, profile: bool = False
) -> list[Run]:
    """The runs of ``names`` in ``mode`` (``full``, ``quick``, ``smoke``), writing to
    ``results``; ``profile``: under py-spy."""
    runs: list[Run] = []
    for name in names:
        out = results / f"{name}.json"
        if name == ENGINE:
            command = [sys.executable, "-m", "walstream.cli", "bench", *ENGINE_RECORDS[mode]]
            command += ["--json", str(out), "--no-progress"]
            # The embedded deployment lands in ./walstream-data of a throwaway folder.
            runs.append(Run(name, command, out, cwd=workdir))
            continue
        command = [sys.executable, str(BENCH / f"{name}.py"), "--json", str(out)]
        command += [] if mode == "full" else [f"--{mode}"]
        env: dict[str, str] = {}
        raw = results / f"{name}.pyspy.raw"
        if profile and name in bench_profile.WINDOWS:
            # py-spy is attached by the benchmark itself, only around its measured phase.
            env[bench_profile.ENV] = str(raw)
        elif profile:
            command = bench_profile.record_command(raw, command)
        runs.append(Run(name, command, out, env=env))
    return runs


def execute(run: Run, timeout_s: float, results: Path = RESULTS) -> None:
    """Run one benchmark to completion or ``timeout_s``; fill in status, seconds and JSON."""
    log = results / f"{run.name}.log"
    raw = results / f"{run.name}.pyspy.raw"
    for stale in (results / f"{run.name}.profile.txt", raw):
        stale.unlink(missing_ok=True)  # a profile of an earlier run must not pass for this one's
    started_wall = time.time()
    started = time.monotonic()
    with log.open("w") as output:
        process = subprocess.Popen(
            run.command,
            cwd=run.cwd,
            env={**os.environ, **run.env},
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            run.returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            run.status = "timeout"
            run.detail = f"stopped after {timeout_s:.0f} s"
    run.seconds = time.monotonic() - started
    if run.status != "timeout":
        classify(run, log.read_text(errors="replace"))
    if raw.exists() and raw.stat().st_mtime >= started_wall:
        bench_profile.write_top(raw, results / f"{run.name}.profile.txt", title=run.name)
    if run.results.exists() and run.results.stat().st_mtime >= started_wall:
        try:
            run.document = json.loads(run.results.read_text())
        except ValueError:
            run.detail = (run.detail + f"; {run.results.name} is not JSON").lstrip("; ")


def classify(run: Run, output: str) -> None:
    """``ok``, ``skipped`` (a module or tool it needs is missing) or ``failed``, from the exit
    code and the output."""
    missing = _MISSING.search(output)
    if run.returncode == 0:
        run.status = "ok"
    elif missing:
        run.status = "skipped"
        run.detail = f"needs {missing.group(1) or missing.group(2)}"
    else:
        run.status = "failed"
        tail = [line for line in output.splitlines() if line.strip()][-1:]
        run.detail = f"exit code {run.returncode}: {' '.join(tail)}"[:120]


def summary(runs: list[Run]) -> str:
    rows = [("BENCHMARK", "STATUS", "SECONDS", "RESULTS", "DETAIL")]
    for run in runs:
        shown = relative(run.results) if run.document is not None else "-"
        rows.append((run.name, run.status, f"{run.seconds:.1f}", shown, run.detail or "-"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        + "  "
        + row[-1]
        for row in rows
    )


def relative(path: Path) -> str:
    try:
        return str(path.relative_to(BENCH.parent))
    except ValueError:
        return str(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    available = [ENGINE, *scripts()]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(available)}")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--full", action="store_true", help="full-length runs (no --quick)")
    modes.add_argument(
        "--smoke",
        action="store_true",
        help="every script with --smoke: seconds each, to check they run (no results page)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile each script with py-spy (only its measured phase where it names one); "
        "top lists in <results>/<name>.profile.txt",
    )
    parser.add_argument(
        "--no-results-page",
        action="store_true",
        help="do not write the dated results page under docs/benchmarks/results/",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        metavar="DIR",
        help=f"where the logs and JSON go (default {relative(RESULTS)})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per benchmark before it is stopped (default 600, 3600 with --full, "
        "300 with --smoke)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in available]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(available)}")
    args.given = list(args.names)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    args.names = args.names or available
    args.mode = "full" if args.full else "smoke" if args.smoke else "quick"
    args.timeout = args.timeout or TIMEOUT_S[args.mode]
    return args


def run_benchmarks(args: argparse.Namespace) -> list[Run]:
    """Every benchmark named, one after the other."""
    args.results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="walstream-bench-") as workdir:
        runs = plan(
            args.names,
            mode=args.mode,
            workdir=Path(workdir),
            results=args.results,
            profile=args.profile,
        )
        for run in runs:
            print(f"running {run.name} (at most {args.timeout:.0f} s) ...", flush=True)
            execute(run, args.timeout, args.results)
            print(f"  {run.status} in {run.seconds:.1f} s", flush=True)
    return runs


def write_document(
    args: argparse.Namespace, runs: list[Run], target_rows: list[targets.Row]
) -> Path:
    """``run_all.json``: the mode, the targets and every run with its JSON."""
    document = {
        "mode": args.mode,
        "timeout_s": args.timeout,
        "load_average": report.load_average(),
        "targets": [dataclasses.asdict(row) for row in target_rows],
        "runs": [
            {
                "name": run.name,
                "command": run.command,
                "status": run.status,
                "seconds": round(run.seconds, 3),
                "returncode": run.returncode,
                "detail": run.detail,
                "results_file": str(run.results) if run.document is not None else None,
                "results": run.document,
            }
            for run in runs
        ],
    }
    out: Path = args.results / "run_all.json"
    report.write_json(out, document)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = run_benchmarks(args)
    table = summary(runs)
    print()
    print(table)
    documents = {run.name: run.document for run in runs if run.document is not None}
    target_rows = targets.rows(documents, args.results)
    targets_table = targets.render(target_rows)
    print(f"\ntargets ({args.mode} runs; ratios within the same run)")
    print(targets_table)
    out = write_document(args, runs, target_rows)
    print(f"\nwrote {relative(out)}; each benchmark's output: {relative(args.results)}/*.log")
    if not args.no_results_page and args.mode != "smoke":
        page = write_results_page(table, targets_table, args)
        print(f"wrote {relative(page)}")
    return 1 if any(run.status in ("failed", "timeout") for run in runs) else 0


def write_results_page(table: str, targets_table: str, args: argparse.Namespace) -> Path:
    """The dated results page of this run in ``docs/benchmarks/results/`` (a new file each run:
    ``-2``, ``-3`` … on the same day); its path."""
    day = time.strftime("%Y-%m-%d")
    name = "-".join(args.given) if args.given else f"make-bench-{args.mode}"
    RESULTS_PAGES.mkdir(parents=True, exist_ok=True)
    page = RESULTS_PAGES / f"{day}-{name}.md"
    count = 1
    while page.exists():
        count += 1
        page = RESULTS_PAGES / f"{day}-{name}-{count}.md"
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    command = " ".join(["python bench/run_all.py", *args.argv])
    system = report.machine()
    page.write_text(
        f"# {day}: {name}\n\n"
        f"`{command}` on Python {system['python']}, {system['platform']}, {os.cpu_count()} cores; "
        f"load average after the runs {load}. Written by `bench/run_all.py`; the method is on "
        "[the benchmarks page](../index.md).\n\n"
        f"## Targets\n\n```text\n{targets_table}\n```\n\n"
        f"## Runs\n\n```text\n{table}\n```\n"
    )
    return page


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
