"""SIGKILL crash loops: a writer process appends continuously and is killed at a random moment;
the next writer process recovers, and every acknowledged record must come back exactly once, in
order, and nothing that was not written. On a file and on a loop block device.

The writer and the checks are the shared crash harness
(:mod:`walstream_conformance.harness.crash`); here the writer also trims behind itself and, in
15% of the cycles, resets the WAL right after recovering."""

from __future__ import annotations

from pathlib import Path

import pytest
from walstream_conformance.harness.crash import (
    CrashReport,
    KillSchedule,
    WriterOptions,
    run_crash_cycles,
)
from walstream_wal_ebs.testing.crash import crash_spec

SEED = 20240917

WRITER = WriterOptions(window=8, keep=16, reset_chance=0.15)
# 20% of the kills anywhere from start-up on (also during recovery and its header writes); the
# others while appending, counted from the end of recovery so that a loaded machine (slow
# imports) does not turn most cycles into kills before it.
SCHEDULE = KillSchedule(recovery_kill_chance=0.2, recovery_kill_s=(0.3, 1.3), kill_s=(0.05, 1.0))


def run(path: Path, workdir: Path, cycles: int, seed: int) -> CrashReport:
    return run_crash_cycles(
        crash_spec(path),
        cycles=cycles,
        seed=seed,
        workdir=workdir,
        writer=WRITER,
        schedule=SCHEDULE,
    )


@pytest.mark.slow
def test_ebs_sigkill_loop_on_file(tmp_path: Path, soak: bool) -> None:
    cycles = 200 if soak else 15
    report = run(tmp_path / "wal.img", tmp_path, cycles, SEED)
    assert report.recoveries_checked >= cycles * 2 // 3
    assert report.acknowledged > cycles * 50


@pytest.mark.slow
def test_ebs_sigkill_loop_on_block_device(loop_device: Path, tmp_path: Path, soak: bool) -> None:
    cycles = 200 if soak else 10
    report = run(loop_device, tmp_path, cycles, SEED + 1)
    assert report.recoveries_checked >= cycles * 2 // 3
    assert report.acknowledged > cycles * 50
