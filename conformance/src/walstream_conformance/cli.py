"""``walstream conformance``: run the suite against installed backends, for CI.

Prints each backend's capability table, runs the suites of the chosen kinds with pytest (progress
once: dots, or a line per test with ``-v``), ends with the certification summary
(:mod:`.certification`: what passed and failed, every invariant not checked and what it needs,
what the backend does not claim) and writes JUnit XML. Exit status: 0 certified, 1 failed,
2 usage, 3 not certified (:data:`EXIT_NOT_CERTIFIED`)::

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
from pathlib import Path
from typing import Any

import pytest

from .backends import backend_options, isolation_changes, load_factory, read_config_section
from .certification import EXIT_FAILED, EXIT_NOT_CERTIFIED, EXIT_USAGE, Certification
from .requirements import SUITE_VERSION, ObjectStoreRequirements, WalRequirements

__all__ = ["COMMAND", "EPILOG", "EXIT_NOT_CERTIFIED", "add_arguments", "main", "run"]

EPILOG = """\
examples:
  walstream conformance --wal ebs                   # a throwaway instance (provision hook)
  walstream conformance --wal s3 --config wal-s3.yaml --junit-xml report.xml
  walstream conformance --wal memory --object-store local --metadata sqlite

Ends with a summary: what passed and failed, every invariant this run could not check and
what checking it needs (a fixture of the backend's own tests, a smaller instance), and what
the backend does not claim (capabilities it declares it lacks).

Exit status: 0 certified (with -k: every selected test passed); 1 a test failed;
2 bad options or a backend that cannot be built; 3 not certified: nothing failed, but an
invariant that applies to the backend was not checked (the summary names it).
"""

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


_SUITE_CLASSES = {
    "wal": "TestSelectedWal",
    "object_store": "TestSelectedObjectStore",
    "metadata": "TestSelectedMetadata",
}


def run(args: argparse.Namespace) -> int:
    chosen = {kind: getattr(args, attr.replace("-", "_"), None) for kind, attr, _ in _KINDS}
    if not any(chosen.values()):
        print(
            "walstream conformance: choose at least one of --wal, --object-store, --metadata",
            file=sys.stderr,
        )
        return EXIT_USAGE
    verbose = bool(getattr(args, "verbose", False))
    wal_config = getattr(args, "config", None)  # a str when `walstream -c FILE` gave it
    configs = {
        "wal": None if wal_config is None else Path(wal_config),
        "object_store": getattr(args, "object_store_config", None),
        "metadata": getattr(args, "metadata_config", None),
    }
    print(f"walstream conformance suite version {SUITE_VERSION}")
    selected = Path(__file__).with_name("selected.py")
    # Only the suites of the chosen kinds are collected: the others would only skip.
    pytest_args = [f"{selected}::{_SUITE_CLASSES[kind]}" for kind, name in chosen.items() if name]
    pytest_args += [
        "-p",
        "no:cacheprovider",
        "-o",
        "asyncio_mode=auto",
        # Progress dots (-v: a line per test) and failures; the certification summary
        # replaces pytest's own closing line (only_summary), so the result shows once.
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
            return EXIT_USAGE
        pytest_args += [f"--walstream-{option}", name]
        if configs[kind] is not None:
            pytest_args += [f"--walstream-{option}-config", str(configs[kind])]
    not_run = [f"{label} (add --{option} NAME)" for kind, option, label in _KINDS if not chosen[kind]]
    if args.junit_xml is not None:
        pytest_args += ["--junit-xml", str(args.junit_xml)]
    if args.crash_cycles is not None:
        pytest_args += ["--walstream-crash-cycles", str(args.crash_cycles)]
    if args.seed is not None:
        pytest_args += ["--walstream-seed", str(args.seed)]
    keyword = getattr(args, "keyword", None)
    if keyword:
        pytest_args += ["-k", keyword]
    pytest_args += list(getattr(args, "pytest_arg", []) or [])
    certification = Certification(
        partial=bool(keyword),
        suites_not_run=not_run,
        notes=[] if args.junit_xml is None else [f"JUnit XML written to {args.junit_xml}"],
        only_summary=True,
    )
    print()
    status = int(pytest.main(pytest_args, plugins=[certification]))
    if status in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED):
        return EXIT_USAGE if status == pytest.ExitCode.USAGE_ERROR else EXIT_FAILED
    if status == pytest.ExitCode.INTERNAL_ERROR:
        return EXIT_FAILED
    return certification.exit_code


class ConformanceCommand:
    """``walstream conformance``: what the ``walstream.cli`` entry point names (see
    :mod:`walstream.cli.extensions`)."""

    description = "Run the shared conformance suite against a backend."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.epilog = EPILOG
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        return run(args)


COMMAND = ConformanceCommand()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="walstream conformance",
        description="Run the walstream conformance suite against installed backends.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
