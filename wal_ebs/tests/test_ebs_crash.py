"""SIGKILL crash loops: a writer process appends continuously and is killed at a random moment;
the next writer process recovers, and every acknowledged record must come back exactly once, in
order, and nothing that was not written. On a file and on a loop block device."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from walstream_wal_ebs.testing.crashloop import digest, payload_for

SEED = 20240917


@dataclass
class CrashModel:
    """What the log must contain, from the writers' reports."""

    seed: int
    records: list[tuple[int, int, int, str]] = field(default_factory=list)
    """(offset, cycle, seq, digest) acknowledged (or recovered) and not known to be trimmed."""
    trimmed_to: int = -1
    """Completed trims: nothing at or below may come back."""
    trimming_to: int = -1
    """Issued trims: records at or below may or may not come back."""
    reset_in_doubt: bool = False
    highest_offset: int = -1
    acked: int = 0
    recoveries_checked: int = 0

    def check_recovery(self, cycle: int, recovered: list[tuple[int, int, int, str]]) -> None:
        where = f"cycle {cycle}"
        offsets = [offset for offset, *_ in recovered]
        assert offsets == sorted(set(offsets)), f"{where}: recovered offsets not increasing"
        identities = [(c, s) for _, c, s, _ in recovered]
        assert identities == sorted(set(identities)), f"{where}: records out of append order"
        for offset, c, s, found in recovered:
            assert 0 <= c < cycle, f"{where}: record at {offset} is not from an earlier writer"
            assert found == digest(payload_for(self.seed, c, s)), (
                f"{where}: record at {offset} holds bytes that were never appended"
            )
            assert offset > self.trimmed_to, f"{where}: trimmed record {offset} came back"
        if self.reset_in_doubt and not recovered:
            self.records.clear()
        else:
            by_offset = {offset: found for offset, _, _, found in recovered}
            for offset, c, s, expected in self.records:
                if offset <= self.trimming_to:
                    continue
                assert by_offset.get(offset) == expected, (
                    f"{where}: acknowledged record {offset} (writer {c}, append {s}) "
                    "was not recovered"
                )
            self.records = list(recovered)
        self.reset_in_doubt = False
        self.recoveries_checked += 1

    def apply(self, line: str) -> None:
        word, *rest = line.split()
        if word == "A":
            offset, c, s = (int(value) for value in rest[:3])
            assert offset > self.highest_offset, f"offset {offset} did not increase"
            self.highest_offset = offset
            self.records.append((offset, c, s, rest[3]))
            self.acked += 1
        elif word == "R":
            self.highest_offset = max(self.highest_offset, int(rest[0]))
        elif word == "trimming":
            self.trimming_to = max(self.trimming_to, int(rest[0]))
        elif word == "trimmed":
            self.trimmed_to = max(self.trimmed_to, int(rest[0]))
            self.records = [r for r in self.records if r[0] > self.trimmed_to]
        elif word == "resetting":
            self.reset_in_doubt = True
        elif word == "reset":
            self.reset_in_doubt = False
            self.records.clear()
            self.trimmed_to = self.trimming_to = self.highest_offset


def _wait_for_ready(report: Path, child: subprocess.Popen[bytes], deadline_s: float) -> None:
    """Until the writer reported the end of its recovery (or exited, or the deadline passed)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and child.poll() is None:
        if report.exists() and "ready\n" in report.read_text():
            return
        time.sleep(0.01)


def run_crash_cycles(path: Path, workdir: Path, cycles: int, seed: int) -> CrashModel:
    rng = random.Random(seed)
    model = CrashModel(seed)
    for cycle in range(cycles):
        report = workdir / f"report-{cycle}.txt"
        stderr_path = workdir / f"stderr-{cycle}.txt"
        with open(stderr_path, "wb") as stderr:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "walstream_wal_ebs.testing.crashloop",
                    str(path),
                    "--report",
                    str(report),
                    "--seed",
                    str(seed),
                    "--cycle",
                    str(cycle),
                    "--capacity",
                    str(1 << 20),
                ],
                stderr=stderr,
            )
            try:
                if rng.random() < 0.2:
                    # Anywhere from start-up on: also during recovery and its header writes.
                    child.wait(timeout=rng.uniform(0.3, 1.3))
                else:
                    # While appending: counted from the end of recovery, so that a loaded
                    # machine (slow imports) does not turn most cycles into kills before it.
                    _wait_for_ready(report, child, deadline_s=20.0)
                    child.wait(timeout=rng.uniform(0.05, 1.0))
            except subprocess.TimeoutExpired:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
            else:
                pytest.fail(
                    f"cycle {cycle}: the writer exited by itself ({child.returncode}): "
                    f"{stderr_path.read_text()[-2000:]}"
                )
        text = report.read_text() if report.exists() else ""
        lines = text.splitlines()
        if text and not text.endswith("\n"):
            lines.pop()  # a report line cut by the kill
        if "ready" in lines:
            ready = lines.index("ready")
            recovered = []
            for line in lines[:ready]:
                _, offset, c, s, found = line.split()
                recovered.append((int(offset), int(c), int(s), found))
            model.check_recovery(cycle, recovered)
        for line in lines:
            model.apply(line)
    return model


def test_ebs_sigkill_loop_on_file(tmp_path: Path, soak: bool) -> None:
    cycles = 200 if soak else 15
    model = run_crash_cycles(tmp_path / "wal.img", tmp_path, cycles, SEED)
    assert model.recoveries_checked >= cycles * 2 // 3
    assert model.acked > cycles * 50


def test_ebs_sigkill_loop_on_block_device(loop_device: Path, tmp_path: Path, soak: bool) -> None:
    cycles = 200 if soak else 10
    model = run_crash_cycles(loop_device, tmp_path, cycles, SEED + 1)
    assert model.recoveries_checked >= cycles * 2 // 3
    assert model.acked > cycles * 50
