"""``walstream serve`` under attack: the issue's table, measured. Each attack of
:mod:`walstream_conformance.harness.hostile` runs twice against one server process with its
default ``server.*`` bounds, from its own loopback address (127.0.0.2), while another client
(127.0.0.1) asks for ``/health`` and appends a record in turn, a new connection each time.

Per attack and run: the server's RSS before (idle) and its peak during the run (the kernel's
high-water mark, reset per run), the CPU seconds the server used, how many ``/health`` and append
probes were answered and the slowest of each (a probe waits up to 30 s), and the second run's
peak (nothing may accumulate). ``--before PATH`` runs the same attacks against another checkout
(e.g. a worktree of main before the change), served from its sources, for a side-by-side table.

    .venv/bin/python bench/hostile.py                      # 10 s per attack run
    .venv/bin/python bench/hostile.py --quick              # 3 s per attack run
    .venv/bin/python bench/hostile.py --seconds 3 --only ping_flood rapid_reset
    .venv/bin/python bench/hostile.py --before ../http-before

It exits 1 when an attack on this checkout exceeds a bound (not with ``--smoke``: one attack,
0.5 s runs, to check the script runs).

Writes ``bench/results/hostile.json`` and ``bench/results/hostile.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import cli
from common.report import Column, Table, grouped_bars, save_plot, write_results
from common.serve import checkout_environment
from walstream_conformance.harness.hostile import (
    ATTACKS,
    MemoryWatch,
    ProbeResult,
    Probes,
    Target,
    cpu_seconds,
    prefill,
    rss_bytes,
)
from walstream_conformance.harness.serve import WalstreamServe

TOKEN = "hostile-bench"
MIB = 1 << 20
#: The issue's bound: RSS above idle during an attack.
RSS_BOUND_MIB = 256
#: A probe answered later than this counts as not answered in time (the issue's 2 s).
ANSWERED_IN_S = 2.0
SMOKE_ATTACK = "smuggling"
"""The one attack a smoke run makes."""

TABLE = Table(
    [
        Column("attack", width=20, align="<"),
        Column("idle_mib", "idle MiB", 8, ".0f"),
        Column("peak_mib", "peak MiB", 8, ".0f"),
        Column("above_idle_mib", "+MiB", 7, ".0f"),
        Column("cpu_s", "CPU s", 7, ".2f"),
        Column("health_answered", "health<2s", 10),
        Column("health_max_ms", "max ms", 8, ".0f"),
        Column("append_answered", "append<2s", 10),
        Column("append_max_ms", "max ms", 8, ".0f"),
        Column("second_peak_mib", "2nd peak", 9, ".0f"),
    ]
)


def probe_figures(results: list[ProbeResult]) -> dict[str, Any]:
    """Per kind of probe: answered in time of sent, whether all were, the slowest and median."""
    figures: dict[str, Any] = {}
    for kind in ("health", "append"):
        of_kind = [result for result in results if result.kind == kind]
        in_time = [r for r in of_kind if r.ok and r.seconds <= ANSWERED_IN_S]
        figures[f"{kind}_answered"] = f"{len(in_time)}/{len(of_kind)}"
        figures[f"{kind}_all_in_time"] = bool(of_kind) and len(in_time) == len(of_kind)
        seconds_taken = [r.seconds for r in of_kind]
        figures[f"{kind}_max_ms"] = max(seconds_taken, default=0.0) * 1000
        figures[f"{kind}_median_ms"] = statistics.median(seconds_taken) * 1000 if of_kind else 0.0
    return figures


async def one_run(target: Target, pid: int, name: str, args: argparse.Namespace) -> dict[str, Any]:
    await asyncio.sleep(args.settle)  # what the previous run left is closing
    idle = rss_bytes(pid)
    watch = MemoryWatch(pid)
    watch.start()
    cpu_before = cpu_seconds(pid)
    probes = Probes(target, timeout_s=30.0)
    stop = asyncio.Event()
    probing = asyncio.ensure_future(probes.run(stop))
    try:
        await asyncio.wait_for(
            ATTACKS[name].run(target, args.scale, args.seconds), args.seconds + 120
        )
    finally:
        stop.set()
        await probing
    peak = watch.stop()
    return {
        "idle_mib": idle / MIB,
        "peak_mib": peak / MIB,
        "above_idle_mib": (peak - idle) / MIB,
        "cpu_s": cpu_seconds(pid) - cpu_before,
        **probe_figures(probes.results),
    }


def start_server(label: str, checkout: Path | None) -> WalstreamServe:
    """``walstream serve`` from ``checkout`` (None: this one) on a memory WAL, with the token."""
    folder = Path(tempfile.mkdtemp(prefix=f"hostile-{label}-"))
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        f"wal: {{type: memory, name: hostile-{label}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
    )
    server = WalstreamServe(deployment, token=TOKEN, environ=checkout_environment(checkout) or {})
    server.start()
    return server


async def measure(
    label: str, checkout: Path | None, names: list[str], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Every attack twice against one server; a row per attack, printed as it is measured."""
    server = start_server(label, checkout)
    print(
        f"\n{label}: walstream serve from {checkout or 'this checkout'}, {args.seconds:g} s per run"
    )
    TABLE.print_header()
    results: dict[str, dict[str, Any]] = {}
    try:
        target = Target("127.0.0.1", server.port, TOKEN)
        await prefill(target)
        for name in names:
            first = await one_run(target, server.pid, name, args)
            second = await one_run(target, server.pid, name, args)
            results[name] = {
                "attack": name,
                **first,
                "second_peak_mib": second["peak_mib"],
                "second_run": second,
                "description": ATTACKS[name].description,
            }
            TABLE.print_row(results[name])
    finally:
        server.stop_and_read_log()
    return results


def verdicts(results: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """The issue's three checks per attack."""
    return {
        name: (
            row["above_idle_mib"] <= RSS_BOUND_MIB
            and row["second_run"]["above_idle_mib"] <= RSS_BOUND_MIB
            and row["health_all_in_time"]
            and row["append_all_in_time"]
            and row["second_run"]["health_all_in_time"]
            and row["second_run"]["append_all_in_time"]
            and row["second_peak_mib"] <= row["peak_mib"] + 8
        )
        for name, row in results.items()
    }


def plot(measured: dict[str, dict[str, dict[str, Any]]], path: Path) -> bool:
    names = list(next(iter(measured.values())))

    def draw(figure: Any, axes: Any) -> None:
        memory, latency = axes
        grouped_bars(
            memory,
            names,
            {
                f"{label} run {run}": [
                    (rows[n] if run == 1 else rows[n]["second_run"])["above_idle_mib"]
                    for n in names
                ]
                for label, rows in measured.items()
                for run in (1, 2)
            },
            fontsize=6,
        )
        memory.axhline(RSS_BOUND_MIB, color="red", linestyle="--", linewidth=1)
        memory.set_ylabel("RSS above idle (MiB)")
        memory.set_title(f"peak RSS during the attack (bound {RSS_BOUND_MIB} MiB)")
        memory.legend(fontsize=6)
        memory.tick_params(axis="x", rotation=60)
        grouped_bars(
            latency,
            names,
            {
                f"{label} {kind}": [rows[n][f"{kind}_max_ms"] / 1000 for n in names]
                for label, rows in measured.items()
                for kind in ("health", "append")
            },
            fontsize=6,
        )
        latency.axhline(ANSWERED_IN_S, color="red", linestyle="--", linewidth=1)
        latency.set_ylabel("slowest probe (s)")
        latency.set_title("another client's /health and append during the attack")
        latency.legend(fontsize=6)
        latency.tick_params(axis="x", rotation=60)

    return save_plot(path, draw, figsize=(14, 5), columns=2)


async def run(args: argparse.Namespace) -> dict[str, dict[str, dict[str, Any]]]:
    """The attacks against ``--before`` (when given), then against this checkout."""
    names = args.only or ([SMOKE_ATTACK] if args.smoke else list(ATTACKS))
    measured: dict[str, dict[str, dict[str, Any]]] = {}
    if args.before is not None:
        measured["before"] = await measure("before", args.before, names, args)
    measured["after"] = await measure("after", None, names, args)
    return measured


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "hostile", quick="3 s per attack run (make bench)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per attack run")
    parser.add_argument("--scale", type=int, default=1, help="multiply each attack's counts")
    parser.add_argument("--only", nargs="+", choices=list(ATTACKS), metavar="ATTACK")
    parser.add_argument("--before", type=Path, default=None, help="a checkout to compare with")
    args = parser.parse_args(argv)
    args.seconds = cli.sized(args, args.seconds, full=10.0, quick=3.0, smoke=0.5)
    args.settle = cli.sized(args, None, full=1.0, quick=1.0, smoke=0.2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    measured = asyncio.run(run(args))
    checks = {label: verdicts(rows) for label, rows in measured.items()}
    for label, verdict in checks.items():
        failed = [name for name, ok in verdict.items() if not ok]
        print(
            f"{label}: {len(verdict) - len(failed)} of {len(verdict)} attacks within the bounds"
            + (f"; not: {', '.join(failed)}" if failed else "")
        )
    document = {
        "benchmark": "hostile",
        "mode": cli.mode(args),
        "seconds_per_run": args.seconds,
        "scale": args.scale,
        "bounds": {"rss_above_idle_mib": RSS_BOUND_MIB, "probe_answered_in_s": ANSWERED_IN_S},
        "results": measured,
        "within_bounds": checks,
    }
    write_results(args.json, document, lambda png: plot(measured, png))
    return 0 if args.smoke or all(checks["after"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
