"""The two ways to run the suite from outside: ``walstream conformance`` (CLI) and
``pytest --walstream-wal=NAME`` (plugin options), each in a real child process."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_cli_prints_capabilities_summary_and_junit(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    done = _run(
        [
            sys.executable,
            "-m",
            "walstream_conformance.cli",
            "--wal",
            "memory",
            "--object-store",
            "memory",
            "--metadata",
            "memory",
            "--junit-xml",
            str(report),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "supports_failover" in done.stdout and "conditional_put" in done.stdout
    assert "needs capability survives_process_kill" in done.stdout
    assert done.stdout.rstrip().endswith("PASS")
    suites = ElementTree.parse(report).getroot()
    cases = suites.findall(".//testcase")
    names = {case.get("name") for case in cases}
    assert {"test_ack_order", "test_put_if_absent", "test_epochs_fence"} <= names
    assert not suites.findall(".//failure")


def test_cli_fails_loudly_on_an_unknown_backend(tmp_path: Path) -> None:
    done = _run(
        [sys.executable, "-m", "walstream_conformance.cli", "--wal", "no-such-wal"], tmp_path
    )
    assert done.returncode == 2
    assert "no-such-wal" in done.stderr and "memory" in done.stderr  # names the installed ones


def test_pytest_option_runs_the_suite_against_an_installed_backend(tmp_path: Path) -> None:
    done = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=strict",
            "--walstream-wal=memory",
            "-k",
            "ack_order or trim_inclusive",
            "-q",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout
