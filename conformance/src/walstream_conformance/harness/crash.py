"""The crash harness: SIGKILL a WAL writer at seeded random points and check what a fresh process
recovers against what was acknowledged.

Each cycle starts a child process (``python -m walstream_conformance.harness.crash``) that builds the WAL
from a :class:`~walstream_conformance.backends.BackendSpec`, recovers it (reporting every record),
then appends from several concurrent tasks, reporting each acknowledgement and each started and
finished trim on stdout. The parent kills it with SIGKILL after a seeded random delay (sometimes during its
recovery), keeps every fully reported line as the acknowledged log, and verifies the next
cycle's recovery:

- offsets strictly increase (append order, each record once);
- every recovered record carries bytes that were appended (payloads are self-describing);
- every acknowledged record above the last finished trim is recovered with its exact bytes,
  and so is every record an earlier recovery yielded — except records at or below a trim that
  was started (``P`` line) but not reported finished: a trim in flight at the kill may have
  taken effect, on a quorum WAL even on some replicas only;
- nothing at or below a finished trim comes back;
- new offsets are above every earlier one.

The same seed replays the same kill schedule and payloads.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from walstream.wal import WalMode, WriteAheadLog

from ..backends import BackendSpec

__all__ = ["CrashReport", "crash_payload", "run_crash_cycles"]

_READY_TIMEOUT_S = 90.0


def crash_payload(seed: int, cycle: int, seq: int) -> bytes:
    """Self-describing bytes of record ``seq`` written in ``cycle``."""
    rng = random.Random(f"crash/{seed}/{cycle}/{seq}")
    return struct.pack(">II", cycle, seq) + rng.randbytes(rng.choice((0, 1, 50, 300, 2000, 9000)))


def _identify(seed: int, data: bytes) -> tuple[int, int] | None:
    if len(data) < 8:
        return None
    cycle, seq = struct.unpack(">II", data[:8])
    return (cycle, seq) if crash_payload(seed, cycle, seq) == data else None


@dataclass
class CrashReport:
    seed: int
    cycles: int
    acknowledged: int = 0
    """Acknowledgements observed over all cycles."""
    recovered_last: int = 0
    kills_during_recovery: int = 0
    log: list[str] = field(default_factory=list)


@dataclass
class _Model:
    """What must be recovered: acknowledged or previously recovered records above the trim."""

    present: dict[int, tuple[int, int]] = field(default_factory=dict)
    trim_point: int = -(1 << 62)
    maybe_trimmed: int = -(1 << 62)
    """Highest trim that was started (``P``): killed mid-trim, it may or may not have applied."""
    highest_offset: int = -(1 << 62)

    def trim(self, offset: int) -> None:
        self.trim_point = max(self.trim_point, offset)
        for known in [o for o in self.present if o <= self.trim_point]:
            del self.present[known]


class CrashCheckFailed(AssertionError):
    pass


def _fail(report: CrashReport, cycle: int, message: str) -> None:
    raise CrashCheckFailed(
        f"crash harness, seed {report.seed}, cycle {cycle}: {message} "
        f"(replay with --walstream-seed={report.seed})"
    )


def _spawn(
    spec: BackendSpec, seed: int, cycle: int, mode: str, workdir: Path
) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "walstream_conformance.harness.crash",
        "--seed",
        str(seed),
        "--cycle",
        str(cycle),
        "--mode",
        mode,
    ]
    stderr = (workdir / f"crash-cycle-{cycle}.stderr").open("w")
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=workdir,
    )
    stderr.close()
    assert process.stdin is not None
    process.stdin.write(spec.to_json() + "\n")
    process.stdin.close()
    return process


class _LineReader:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._fd = process.stdout.fileno()
        self._buffer = b""
        self.eof = False

    def read_until(self, deadline: float) -> list[str]:
        """Complete lines available before ``deadline`` (monotonic seconds)."""
        lines: list[str] = []
        while not self.eof:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                break
            chunk = os.read(self._fd, 65536)
            if not chunk:
                self.eof = True
                break
            self._buffer += chunk
            *complete, self._buffer = self._buffer.split(b"\n")
            decoded = [line.decode() for line in complete]
            lines.extend(decoded)
            if any(line in ("READY", "DONE") for line in decoded):
                break
        return lines


def _stderr_tail(workdir: Path, cycle: int) -> str:
    path = workdir / f"crash-cycle-{cycle}.stderr"
    return path.read_text()[-2000:] if path.exists() else ""


def _check_recovery(
    report: CrashReport, cycle: int, model: _Model, lines: list[str], complete: bool
) -> None:
    offsets: list[int] = []
    for line in lines:
        if not line.startswith("R "):
            continue
        _, offset_text, cycle_text, seq_text = line.split()
        offset = int(offset_text)
        if cycle_text == "-":
            _fail(report, cycle, f"recovered bytes at offset {offset} that were never appended")
        identity = (int(cycle_text), int(seq_text))
        if offsets and offset <= offsets[-1]:
            _fail(
                report,
                cycle,
                f"recovery yielded offset {offset} after {offsets[-1]} (order/duplicate)",
            )
        if offset <= model.trim_point:
            _fail(
                report,
                cycle,
                f"recovered offset {offset} at or below the finished trim {model.trim_point}",
            )
        expected = model.present.get(offset)
        if expected is not None and expected != identity:
            _fail(
                report,
                cycle,
                f"offset {offset} holds record {identity}, acknowledged as {expected}",
            )
        offsets.append(offset)
        model.present[offset] = identity  # a recovered record must stay recoverable
        model.highest_offset = max(model.highest_offset, offset)
    if complete:
        missing = sorted(set(model.present) - set(offsets))
        for offset in [o for o in missing if o <= model.maybe_trimmed]:
            # A trim in flight when the writer was killed took effect: allowed.
            del model.present[offset]
        missing = [o for o in missing if o > model.maybe_trimmed]
        if missing:
            _fail(
                report,
                cycle,
                f"{len(missing)} acknowledged records were not recovered, "
                f"e.g. offsets {missing[:10]} "
                f"(records {[model.present[o] for o in missing[:5]]})",
            )
        report.recovered_last = len(offsets)


def _apply_writer_lines(report: CrashReport, cycle: int, model: _Model, lines: list[str]) -> None:
    for line in lines:
        kind, *fields = line.split()
        if kind == "A":
            offset, record_cycle, seq = (int(value) for value in fields)
            if offset <= model.highest_offset and offset not in model.present:
                _fail(
                    report,
                    cycle,
                    f"acknowledged offset {offset} is not above earlier offset "
                    f"{model.highest_offset}",
                )
            model.present[offset] = (record_cycle, seq)
            model.highest_offset = max(model.highest_offset, offset)
            report.acknowledged += 1
        elif kind == "P":
            model.maybe_trimmed = max(model.maybe_trimmed, int(fields[0]))
        elif kind == "T":
            model.trim(int(fields[0]))
        elif kind == "E":
            _fail(report, cycle, f"the writer failed: {' '.join(fields)}")


def run_crash_cycles(spec: BackendSpec, *, cycles: int, seed: int, workdir: Path) -> CrashReport:
    """Run ``cycles`` kill/recover cycles, then a final recovery; raise on any violation."""
    report = CrashReport(seed=seed, cycles=cycles)
    rng = random.Random(f"crash-schedule/{seed}")
    model = _Model()
    for cycle in range(cycles):
        process = _spawn(spec, seed, cycle, "write", workdir)
        reader = _LineReader(process)
        try:
            kill_in_recovery = rng.random() < 0.15
            if kill_in_recovery:
                deadline = time.monotonic() + rng.uniform(0.0, 0.6)
                lines = reader.read_until(deadline)
                if not any(line == "READY" for line in lines):
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                    lines += reader.read_until(time.monotonic() + 5)
                    # A partial recovery still must not show unappended or trimmed bytes.
                    _check_recovery(
                        report, cycle, model, [x for x in lines if x.startswith("R ")], False
                    )
                    report.kills_during_recovery += 1
                    continue
            else:
                lines = []
            while not any(line in ("READY", "DONE") for line in lines) and not reader.eof:
                more = reader.read_until(time.monotonic() + _READY_TIMEOUT_S)
                if not more and not reader.eof:
                    _fail(
                        report,
                        cycle,
                        f"writer not ready after {_READY_TIMEOUT_S}s: "
                        f"{_stderr_tail(workdir, cycle)}",
                    )
                lines += more
            if "READY" not in lines:
                _fail(
                    report, cycle, f"writer exited during recovery: {_stderr_tail(workdir, cycle)}"
                )
            ready_at = lines.index("READY")
            _check_recovery(report, cycle, model, lines[:ready_at], True)
            _apply_writer_lines(report, cycle, model, lines[ready_at + 1 :])
            kill_at = time.monotonic() + rng.uniform(0.05, 0.8)
            _apply_writer_lines(report, cycle, model, reader.read_until(kill_at))
            while not reader.eof and time.monotonic() < kill_at:
                _apply_writer_lines(report, cycle, model, reader.read_until(kill_at))
            process.send_signal(signal.SIGKILL)
            process.wait()
            # Lines written before the kill are acknowledgements the writer saw: they count.
            _apply_writer_lines(report, cycle, model, reader.read_until(time.monotonic() + 5))
            if process.returncode != -signal.SIGKILL:
                _fail(
                    report,
                    cycle,
                    f"writer exited by itself ({process.returncode}): "
                    f"{_stderr_tail(workdir, cycle)}",
                )
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
    final = _spawn(spec, seed, cycles, "recover", workdir)
    reader = _LineReader(final)
    final_lines: list[str] = []
    try:
        while "DONE" not in final_lines and not reader.eof:
            more = reader.read_until(time.monotonic() + _READY_TIMEOUT_S)
            if not more and not reader.eof:
                break
            final_lines += more
        if "DONE" not in final_lines:
            _fail(report, cycles, f"final recovery did not finish: {_stderr_tail(workdir, cycles)}")
        _check_recovery(report, cycles, model, final_lines, True)
    finally:
        final.wait(timeout=60)
        if final.stdout is not None:
            final.stdout.close()
    return report


# -- the child process --------------------------------------------------------------------------


def _say(line: str) -> None:
    # One write per line: a SIGKILL leaves at most a partial last line, which the parent drops.
    os.write(1, (line + "\n").encode())


async def _child(spec: BackendSpec, seed: int, cycle: int, mode: str) -> None:
    rng = random.Random(f"crash-writer/{seed}/{cycle}")
    wal: WriteAheadLog = spec.build()
    await wal.start(1, 1000 + cycle, WalMode.READ_WRITE)
    last_recovered = None
    async for record in wal.recover():
        identity = _identify(seed, bytes(record.data))
        if identity is None:
            _say(f"R {record.offset} - -")
        else:
            _say(f"R {record.offset} {identity[0]} {identity[1]}")
        last_recovered = record.offset
    if mode == "recover":
        _say("DONE")
        await wal.close()
        return
    _say("READY")
    if last_recovered is not None and rng.random() < 0.5:
        _say(f"P {last_recovered}")
        await wal.trim(last_recovered)
        _say(f"T {last_recovered}")
    sequence = iter(range(1 << 30))
    acked: list[int] = []

    async def appender() -> None:
        while True:
            seq = next(sequence)
            offset = await wal.append(crash_payload(seed, cycle, seq))
            _say(f"A {offset} {cycle} {seq}")
            acked.append(offset)

    async def trimmer() -> None:
        while True:
            await asyncio.sleep(rng.uniform(0.01, 0.1))
            if len(acked) > 20:
                target = acked[len(acked) // 2]
                _say(f"P {target}")
                await wal.trim(target)
                _say(f"T {target}")

    try:
        await asyncio.gather(*[appender() for _ in range(rng.choice((1, 4, 8)))], trimmer())
    except Exception as exc:
        _say(f"E {type(exc).__name__}: {exc}".replace("\n", " "))
        raise


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="walstream crash-harness child (spec on stdin)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--cycle", type=int, required=True)
    parser.add_argument("--mode", choices=("write", "recover"), required=True)
    args = parser.parse_args(argv)
    spec = BackendSpec.from_json(sys.stdin.readline())
    asyncio.run(_child(spec, args.seed, args.cycle, args.mode))


if __name__ == "__main__":
    _main()
