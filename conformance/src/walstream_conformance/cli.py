"""``walstream conformance``: run the suite against installed backends, for CI.

Prints each backend's capability table, runs the suites with pytest, prints a pass/fail summary
(with the reason of every skip) and writes JUnit XML::

    walstream conformance --wal ebs [--config wal.yaml] [--object-store local] [--metadata sqlite]
                          [--junit-xml report.xml] [--crash-cycles 50] [--seed 7]

Without a config file, a backend with a ``provision`` hook makes a throwaway instance of itself.

``walstream conformance`` reaches :data:`COMMAND` through the ``walstream.cli`` entry point this
distribution registers (core never imports the suite); ``python -m walstream_conformance.cli``
runs the same command on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .backends import backend_options, isolation_changes, load_factory, read_config_section
from .requirements import SUITE_VERSION, ObjectStoreRequirements, WalRequirements

__all__ = ["COMMAND", "add_arguments", "main", "run"]

_KINDS = (
    ("wal", "wal", "WAL"),
    ("object_store", "object-store", "object store"),
    ("metadata", "metadata", "metadata store"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``walstream conformance``. ``--config``/``-c`` and ``-v`` default to
    "absent" (not ``None``), so ``walstream -c FILE -v conformance …`` can fill them in from the
    options given before the command."""
    parser.add_argument("--wal", metavar="NAME", help="WAL backend to test (entry-point name)")
    parser.add_argument(
        "--config",
        "-c",
        metavar="FILE",
        type=Path,
        default=argparse.SUPPRESS,
        help="YAML options of the WAL: a bare section (type: s3, bucket: …) or a whole "
        "deployment whose wal section is used. Each test gets a fresh WAL derived from it "
        "(a new key prefix, log id or file next to the configured path)",
    )
    parser.add_argument("--object-store", metavar="NAME", help="object-store backend to test")
    parser.add_argument(
        "--object-store-config",
        metavar="FILE",
        type=Path,
        help="YAML options of the object store (a bare section or a whole deployment); each "
        "test gets a fresh prefix or folder derived from it (default: a throwaway instance)",
    )
    parser.add_argument("--metadata", metavar="NAME", help="metadata backend to test")
    parser.add_argument(
        "--metadata-config",
        metavar="FILE",
        type=Path,
        help="YAML options of the metadata store (a bare section or a whole deployment); each "
        "test gets a fresh database derived from it (default: a throwaway instance)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="one line per test (pytest -v)",
    )
    parser.add_argument("--junit-xml", metavar="PATH", type=Path, help="write a JUnit XML report")
    parser.add_argument(
        "--crash-cycles", metavar="N", type=int, help="kill/recover cycles of the crash harness"
    )
    parser.add_argument("--seed", type=int, help="seed to replay a failure")
    parser.add_argument("-k", dest="keyword", metavar="EXPR", help="only tests matching EXPR")
    parser.add_argument(
        "--pytest-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument passed to pytest (repeatable)",
    )


class _Summary:
    """A pytest plugin collecting outcomes for the summary."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.failed: list[str] = []
        self.skipped: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.skipped:
                reason = (
                    report.longrepr[2]
                    if isinstance(report.longrepr, tuple)
                    else str(report.longrepr)
                )
                reason = reason.removeprefix("Skipped: ")
                if reason.startswith("needs fixture "):
                    # Such a fixture is defined in a backend's own tests, not on a command line.
                    reason += "; only a backend's own test module can provide it"
                self.skipped[reason] += 1
                self.outcomes["skipped"] += 1
            elif report.failed:
                self.outcomes["failed"] += 1
                self.failed.append(report.nodeid.rsplit("::", 2)[-1] + f" ({report.when})")
            elif report.when == "call":
                self.outcomes["passed"] += 1


def _capabilities(kind: Any, name: str, config: Path | None) -> list[tuple[str, str]]:
    factory = load_factory(kind, name)
    rows = [
        ("backend", f"{name} — {factory.description}"),
        ("contract_version", str(factory.contract_version)),
    ]
    with (
        tempfile.TemporaryDirectory(prefix="walstream-conformance-") as scratch,
        backend_options(kind, name, config, Path(scratch)) as spec,
    ):
        if config is not None:
            configured = read_config_section(config, kind)
            rows += [
                (f"per-test {option}", change)
                for option, change in isolation_changes(factory, configured, spec.section)
            ]
        backend = spec.build()
        try:
            if kind == "wal":
                rows += WalRequirements(backend.capabilities).table()
            elif kind == "object_store":
                rows += ObjectStoreRequirements(backend.capabilities).table()
        finally:
            if kind != "wal":  # a WAL that was never started holds nothing
                asyncio.run(backend.close())
    return rows


def _print_table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(key) for key, _ in rows)
    print(f"\n{title}")
    print("-" * len(title))
    for key, value in rows:
        print(f"  {key.ljust(width)}  {value}")


def run(args: argparse.Namespace) -> int:
    chosen = {kind: getattr(args, attr.replace("-", "_"), None) for kind, attr, _ in _KINDS}
    if not any(chosen.values()):
        print(
            "walstream conformance: choose at least one of --wal, --object-store, --metadata",
            file=sys.stderr,
        )
        return 2
    verbose = bool(getattr(args, "verbose", False))
    wal_config = getattr(args, "config", None)  # a str when `walstream -c FILE` gave it
    configs = {
        "wal": None if wal_config is None else Path(wal_config),
        "object_store": getattr(args, "object_store_config", None),
        "metadata": getattr(args, "metadata_config", None),
    }
    print(f"walstream conformance suite version {SUITE_VERSION}")
    pytest_args = [
        str(Path(__file__).with_name("selected.py")),
        "-p",
        "no:cacheprovider",
        "-o",
        "asyncio_mode=auto",
        "-v" if verbose else "-q",
        "--no-header",
        "-rN",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--walstream-hints=cli",
    ]
    for kind, option, label in _KINDS:
        name = chosen[kind]
        if not name:
            continue
        try:
            _print_table(f"{label} {name!r}", _capabilities(kind, name, configs[kind]))
        except Exception as exc:
            print(f"walstream conformance: cannot build {label} {name!r}: {exc}", file=sys.stderr)
            return 2
        pytest_args += [f"--walstream-{option}", name]
        if configs[kind] is not None:
            pytest_args += [f"--walstream-{option}-config", str(configs[kind])]
    if args.junit_xml is not None:
        pytest_args += ["--junit-xml", str(args.junit_xml)]
    if args.crash_cycles is not None:
        pytest_args += ["--walstream-crash-cycles", str(args.crash_cycles)]
    if args.seed is not None:
        pytest_args += ["--walstream-seed", str(args.seed)]
    if getattr(args, "keyword", None):
        pytest_args += ["-k", args.keyword]
    pytest_args += list(getattr(args, "pytest_arg", []) or [])
    summary = _Summary()
    print()
    exit_code = int(pytest.main(pytest_args, plugins=[summary]))
    print("\nSummary")
    print("-------")
    for outcome in ("passed", "failed", "skipped"):
        print(f"  {outcome:8} {summary.outcomes[outcome]}")
    for test in summary.failed:
        print(f"  FAILED   {test}")
    for reason, count in sorted(summary.skipped.items()):
        print(f"  skipped  {count} x {reason}")
    if args.junit_xml is not None:
        print(f"  JUnit XML written to {args.junit_xml}")
    verdict = "PASS" if exit_code == 0 else "FAIL"
    print(f"\n{verdict}")
    return exit_code


class ConformanceCommand:
    """``walstream conformance``: what the ``walstream.cli`` entry point names (see
    :mod:`walstream.cli.extensions`)."""

    description = "Run the shared conformance suite against a backend."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        return run(args)


COMMAND = ConformanceCommand()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="walstream conformance",
        description="Run the walstream conformance suite against installed backends.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
