"""Run every benchmark: ``walstream bench`` on a fresh embedded deployment, then each script in
``bench/`` — each in its own process, each bounded by a timeout — and print one summary table.

    .venv/bin/python bench/run_all.py                 # every benchmark with --quick (make bench)
    .venv/bin/python bench/run_all.py --full          # full-length runs
    .venv/bin/python bench/run_all.py wal_s3 engine   # only these (script stems; engine =
                                                      #   walstream bench)

    .venv/bin/python bench/run_all.py --profile       # each script under py-spy as well (only
                                                      #   its measured phase, _profile.WINDOWS)

A benchmark's own table goes to ``bench/results/<name>.log``, its JSON stays where it writes it
(``bench/results/<name>.json``); ``bench/results/run_all.json`` lists every run: status
(``ok``, ``failed``, ``timeout``, ``skipped`` when a module or tool it needs is not installed),
seconds, exit code, and the benchmark's JSON when it wrote one. Exits 1 if any benchmark failed
or timed out. It also writes the two tables, with the date, the machine and its load, as a page of
the documentation site: ``docs/benchmarks/results/YYYY-MM-DD-<name>.md`` (``make-bench-quick``,
``make-bench-full``, or the names run; ``--no-results-page`` skips it).

After the runs it prints the targets table (``bench/_targets.py``): every target of the
project's paths with the figure reached, the device's, peer's or rig's figure measured in the
same run, the ratio, the target and whether it is met; a target not met names the py-spy top
list of its benchmark (``--profile`` writes ``bench/results/<name>.profile.txt`` for this run;
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

import _profile
import _report
import _targets

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
RESULTS_PAGES = BENCH.parent / "docs" / "benchmarks" / "results"
ENGINE = "engine"
_MISSING = re.compile(
    r"(?:ModuleNotFoundError: No module named '([^']+)'|"
    r"FileNotFoundError: \[Errno 2\] No such file or directory: '([^']+)')"
)


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


def plan(names: list[str], *, full: bool, workdir: Path, profile: bool = False) -> list[Run]:
    runs: list[Run] = []
    for name in names:
        if name == ENGINE:
            results = RESULTS / "engine.json"
            sizes = [] if full else ["--records", "20000"]
            command = [
                sys.executable,
                "-m",
                "walstream.cli",
                "bench",
                *sizes,
                "--json",
                str(results),
                "--no-progress",
            ]
            # The embedded deployment lands in ./walstream-data of a throwaway folder.
            runs.append(Run(name, command, results, cwd=workdir))
        else:
            command = [sys.executable, str(BENCH / f"{name}.py"), *([] if full else ["--quick"])]
            env: dict[str, str] = {}
            raw = RESULTS / f"{name}.pyspy.raw"
            if profile and name in _profile.WINDOWS:
                # py-spy is attached by the benchmark itself, only around its measured phase.
                env[_profile.ENV] = str(raw)
            elif profile:
                command = _profile.record_command(raw, command)
            runs.append(Run(name, command, RESULTS / f"{name}.json", env=env))
    return runs


def execute(run: Run, timeout_s: float) -> None:
    """Run one benchmark to completion or ``timeout_s``; fill in status, seconds and JSON."""
    log = RESULTS / f"{run.name}.log"
    for stale in (RESULTS / f"{run.name}.profile.txt", RESULTS / f"{run.name}.pyspy.raw"):
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
    text = log.read_text(errors="replace")
    if run.status != "timeout":
        missing = _MISSING.search(text)
        if run.returncode == 0:
            run.status = "ok"
        elif missing:
            run.status = "skipped"
            run.detail = f"needs {missing.group(1) or missing.group(2)}"
        else:
            run.status = "failed"
            tail = [line for line in text.splitlines() if line.strip()][-1:]
            run.detail = f"exit code {run.returncode}: {' '.join(tail)}"[:120]
    raw = RESULTS / f"{run.name}.pyspy.raw"
    if raw.exists() and raw.stat().st_mtime >= started_wall:
        _profile.write_top(raw, RESULTS / f"{run.name}.profile.txt", title=run.name)
    if run.results.exists() and run.results.stat().st_mtime >= started_wall:
        try:
            run.document = json.loads(run.results.read_text())
        except ValueError:
            run.detail = (run.detail + f"; {run.results.name} is not JSON").lstrip("; ")


def summary(runs: list[Run]) -> str:
    rows = [("BENCHMARK", "STATUS", "SECONDS", "RESULTS", "DETAIL")]
    for run in runs:
        shown = run.results.relative_to(BENCH.parent) if run.document is not None else "-"
        rows.append((run.name, run.status, f"{run.seconds:.1f}", str(shown), run.detail or "-"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        + "  "
        + row[-1]
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    available = [ENGINE, *scripts()]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(available)}")
    parser.add_argument("--full", action="store_true", help="full-length runs (no --quick)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile each script with py-spy (only its measured phase where it names one); "
        "top lists in bench/results/<name>.profile.txt",
    )
    parser.add_argument(
        "--no-results-page",
        action="store_true",
        help="do not write the dated results page under docs/benchmarks/results/",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per benchmark before it is stopped (default 600, 3600 with --full)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in available]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(available)}")
    timeout_s = args.timeout or (3600.0 if args.full else 600.0)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="walstream-bench-") as workdir:
        runs = plan(
            args.names or available, full=args.full, workdir=Path(workdir), profile=args.profile
        )
        for run in runs:
            print(f"running {run.name} (at most {timeout_s:.0f} s) ...", flush=True)
            execute(run, timeout_s)
            print(f"  {run.status} in {run.seconds:.1f} s", flush=True)
    table = summary(runs)
    print()
    print(table)
    documents = {run.name: run.document for run in runs if run.document is not None}
    targets = _targets.rows(documents, RESULTS)
    print(f"\ntargets ({'full' if args.full else 'quick'} runs; ratios within the same run)")
    print(_targets.render(targets))
    document = {
        "mode": "full" if args.full else "quick",
        "timeout_s": timeout_s,
        "targets": [dataclasses.asdict(row) for row in targets],
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
    out = RESULTS / "run_all.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(BENCH.parent)}; each benchmark's output: bench/results/*.log")
    if not args.no_results_page:
        page = write_results_page(
            table, _targets.render(targets), full=args.full, names=args.names, argv=argv
        )
        print(f"wrote {page.relative_to(BENCH.parent)}")
    return 1 if any(run.status in ("failed", "timeout") for run in runs) else 0


def write_results_page(
    table: str, targets: str, *, full: bool, names: list[str], argv: list[str] | None
) -> Path:
    """The dated results page of this run in ``docs/benchmarks/results/`` (a new file each run:
    ``-2``, ``-3`` … on the same day); its path."""
    day = time.strftime("%Y-%m-%d")
    name = "-".join(names) if names else f"make-bench-{'full' if full else 'quick'}"
    RESULTS_PAGES.mkdir(parents=True, exist_ok=True)
    page = RESULTS_PAGES / f"{day}-{name}.md"
    count = 1
    while page.exists():
        count += 1
        page = RESULTS_PAGES / f"{day}-{name}-{count}.md"
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    arguments = " ".join(sys.argv[1:] if argv is None else argv)
    system = _report.machine()
    page.write_text(
        f"# {day}: {name}\n\n"
        f"`python bench/run_all.py {arguments}`".replace("run_all.py `", "run_all.py`")
        + f" on Python {system['python']}, {system['platform']}, {os.cpu_count()} cores; "
        f"load average after the runs {load}. Written by `bench/run_all.py`; the method is on "
        "[the benchmarks page](../index.md).\n\n"
        f"## Targets\n\n```text\n{targets}\n```\n\n"
        f"## Runs\n\n```text\n{table}\n```\n"
    )
    return page


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
