"""What a conformance run certifies, as its user sees it (real child processes): the exit status
of ``walstream conformance`` is 0 certified, 1 failed, 3 not certified (an invariant that applies
was not checked); the summary names every unchecked invariant and what it needs; a backend's own
test module that provides the three optional fixtures is certified by ``pytest
--walstream-certify``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
PLANTED = HERE / "planted_backends.py"


def _run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _conformance(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "walstream.cli", "conformance", *args], cwd, env)


def test_a_store_suite_that_checks_every_invariant_is_certified(tmp_path: Path) -> None:
    done = _conformance("--object-store", "memory", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "  not checked   0" in done.stdout
    assert done.stdout.rstrip().endswith("CERTIFIED")
    assert "NOT CERTIFIED" not in done.stdout


def test_a_failing_backend_exits_1_and_is_named(tmp_path: Path) -> None:
    """A WAL whose trim is exclusive (it keeps the offset it was told to trim), installed as a
    real distribution (an entry point on the path), fails the trim invariant."""
    (tmp_path / "planted_plugin.py").write_text(
        textwrap.dedent(
            f"""
            from walstream.config import BackendFactory, Option
            from walstream_conformance.backends import load_target

            ExclusiveTrimWal = load_target({str(PLANTED)!r} + ":ExclusiveTrimWal")
            FACTORY = BackendFactory(
                kind="wal",
                name="planted-trim",
                description="a WAL whose trim keeps the offset it was told to trim",
                options=(Option("name", "str", "volume name"),),
                create=lambda options, context: ExclusiveTrimWal(options["name"] or "planted"),
            )
            """
        )
    )
    info = tmp_path / "planted_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[walstream.wal]\nplanted-trim = planted_plugin:FACTORY\n"
    )
    done = _conformance(
        "--wal",
        "planted-trim",
        "-k",
        "trim_inclusive",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert "  FAILED        test_trim_inclusive (call)" in done.stdout
    assert done.stdout.rstrip().endswith("FAILED")


def test_a_backend_s_own_tests_with_the_three_fixtures_are_certified(tmp_path: Path) -> None:
    """The example WAL's test module defines walstream_wal_spec, walstream_wal_power_loss and
    walstream_wal_medium_fault: nothing is left unchecked."""
    done = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"{HERE / 'test_conformance_example.py'}::TestAppendFileWal",
            "--walstream-certify",
            "--walstream-crash-cycles",
            "2",
        ],
        HERE.parent,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout[done.stdout.index("walstream conformance summary") :]
    assert "  failed        0" in summary and "  not checked   0" in summary, summary
    assert "CERTIFIED" in summary.splitlines() and "NOT CERTIFIED" not in summary


def test_without_the_fixtures_the_same_wal_is_not_certified_and_says_what_each_needs(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_bare.py").write_text(
        textwrap.dedent(
            f"""
            import pytest
            from walstream_conformance import WalSuite
            from walstream_conformance.backends import load_target

            AppendFileWal = load_target(
                {str(HERE.parent / "examples" / "appendfile_wal.py")!r} + ":AppendFileWal"
            )

            @pytest.fixture
            def walstream_wal_factory(tmp_path):
                return lambda: AppendFileWal(tmp_path / "wal.log")

            class TestBare(WalSuite):
                pass
            """
        )
    )
    done = _run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--walstream-certify"],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]  # pytest's own status
    summary = done.stdout[done.stdout.index("walstream conformance summary") :]
    assert "  not checked   3" in summary, summary
    for fixture in (
        "walstream_wal_spec",
        "walstream_wal_power_loss",
        "walstream_wal_medium_fault",
    ):
        assert f"needs fixture {fixture}:" in summary, summary
    assert "NOT CERTIFIED" in summary.splitlines()
