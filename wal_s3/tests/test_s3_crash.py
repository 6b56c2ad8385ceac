"""Crash harness: the writer process is SIGKILLed mid-stream again and again against the moto
S3 server; every acknowledged, untrimmed record is recovered exactly once.

The writer and the checks are the shared crash harness
(:mod:`walstream_conformance.harness.crash`): each writer recovers (checked against every
earlier report), trims behind itself, is killed once it saw a seeded number of
acknowledgements, and a last process recovers everything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from walstream_conformance.backends import BackendSpec
from walstream_conformance.harness.crash import KillSchedule, WriterOptions, run_crash_cycles


@pytest.mark.slow
def test_s3_wal_survives_sigkill_loop(s3_bucket: Any, tmp_path: Path, soak: bool) -> None:
    cycles = 100 if soak else 6
    spec = BackendSpec(
        "wal", name="s3", section=s3_bucket.options(max_batch_interval="5ms", max_inflight=4)
    )
    report = run_crash_cycles(
        spec,
        cycles=cycles,
        seed=20240601,
        workdir=tmp_path,
        writer=WriterOptions(window=4, keep=100),
        schedule=KillSchedule(recovery_kill_chance=0.0, kill_after_acks=(5, 120)),
    )
    assert report.acknowledged >= cycles * 5
    assert report.recovered_last > 0, "no acknowledged record was left to recover"
