"""The crash harness: one writer process, one report protocol, one checker.

Every WAL's crash tests use these three pieces:

**The writer** (``python -m walstream_conformance.harness.crash``, run through
:class:`CrashWriter`) builds the WAL from a :class:`~walstream_conformance.backends.BackendSpec`
(JSON on stdin), starts it as node 1, recovers it reporting every record, then keeps a window of
appends in flight (one task: call order is log order) and, if asked, trims behind itself and
resets now and then — until it is SIGKILLed. Payloads are self-describing
(:func:`crash_payload`): a record read back names the writer (``cycle``) and append (``seq``)
that wrote it, and its bytes prove it.

**The report protocol**: one line per event, each written with one ``os.write`` *after* the
event happened, so a SIGKILL leaves at most a cut last line (dropped by the reader)::

    R <offset> <cycle> <seq>   recovered record ("R <offset> - -": bytes never appended)
    READY                      recovery finished; appends begin
    DONE                       recovery finished (--mode recover); the writer exits
    A <offset> <cycle> <seq>   append acknowledged
    P <offset> / T <offset>    trim started / finished
    X / Z                      reset started / finished
    E <message>                the writer failed

**The checker** (:class:`CrashModel`) keeps what must come back: every acknowledged record and
every record an earlier recovery returned, minus finished trims and resets. A recovery must
return

- offsets strictly increasing, records in append order (``(cycle, seq)`` increasing), each once;
- only bytes that were appended, and at an offset known to hold a record, that record;
- nothing at or below a finished trim;
- every record the model holds — except those at or below a trim that was started but not
  reported finished (a trim in flight at the kill may have applied, on a quorum WAL even on some
  replicas only), and everything when a reset was in flight and nothing came back;
- with ``contiguous``: per writer, one unbroken run of its appends (no holes);

and new acknowledged offsets are above every earlier one.

:func:`run_crash_cycles` runs the whole loop (kill at seeded random points, sometimes during
recovery; check each next recovery; a final recovery). Tests that also kill servers or zones
drive :class:`CrashWriter` themselves and check their own recoveries with
:meth:`CrashModel.check_records`. The same seed replays the same payloads and kill schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from walstream.wal import WalMode, WalRecord, WriteAheadLog

from ..backends import BackendSpec

__all__ = [
    "CrashCheckFailed",
    "CrashModel",
    "CrashReport",
    "CrashWriter",
    "KillSchedule",
    "WriterOptions",
    "crash_payload",
    "identify",
    "run_crash_cycles",
]

_HEADER = struct.Struct(">II")
# Sizes around the block and page boundaries file WALs care about, and a random one.
_SIZES = (0, 1, 50, 300, 1000, 2000, 4000, 4072, 4096, 9000, -1)
_NONE = -(1 << 62)


def crash_payload(seed: int, cycle: int, seq: int, max_body: int | None = None) -> bytes:
    """The self-describing bytes of append ``seq`` of writer ``cycle``: an 8-byte header and
    0 to ~9 KiB (at most ``max_body``) of seeded bytes."""
    rng = random.Random(f"crash/{seed}/{cycle}/{seq}")
    size = rng.choice(_SIZES)
    if size < 0:
        size = rng.randrange(0, 9000)
    if max_body is not None:
        size = min(size, max_body)
    return _HEADER.pack(cycle, seq) + rng.randbytes(size)


def identify(seed: int, data: bytes, max_body: int | None = None) -> tuple[int, int] | None:
    """``(cycle, seq)`` of a payload written with ``seed`` (and ``max_body``), or None if these
    bytes never were."""
    if len(data) < _HEADER.size:
        return None
    cycle, seq = _HEADER.unpack_from(data)
    return (cycle, seq) if crash_payload(seed, cycle, seq, max_body) == data else None


class CrashCheckFailed(AssertionError):
    """What a recovery returned contradicts what the writers reported."""


# -- the checker --------------------------------------------------------------------------------

Identity = tuple[int, int]


@dataclass
class CrashModel:
    """What the log must hold, from the writers' reports (see the module docstring)."""

    seed: int
    contiguous: bool = False
    """Also require each writer's recovered appends to be one run without holes."""
    replay_hint: str = ""
    """Appended to failure messages (how to replay this run)."""
    max_body: int | None = None
    """The writers' :attr:`WriterOptions.max_body`."""
    present: dict[int, Identity] = field(default_factory=dict)
    trim_point: int = _NONE
    """Highest finished trim: nothing at or below may come back."""
    maybe_trimmed: int = _NONE
    """Highest started trim: records at or below may or may not come back."""
    reset_in_doubt: bool = False
    highest_offset: int = _NONE
    acknowledged: int = 0
    recoveries_checked: int = 0

    def fail(self, cycle: int, message: str) -> NoReturn:
        hint = f" ({self.replay_hint})" if self.replay_hint else ""
        raise CrashCheckFailed(f"crash harness, seed {self.seed}, cycle {cycle}: {message}{hint}")

    # what the writers (or the test) did

    def apply(self, cycle: int, lines: Iterable[str]) -> None:
        """Account for a writer's report lines after its recovery (``R`` lines are skipped:
        they go through :meth:`check_recovery`)."""
        for line in lines:
            kind, *fields = line.split()
            if kind == "A":
                offset, record_cycle, seq = (int(value) for value in fields)
                if offset <= self.highest_offset:
                    self.fail(
                        cycle,
                        f"acknowledged offset {offset} is not above earlier offset "
                        f"{self.highest_offset}",
                    )
                self.present[offset] = (record_cycle, seq)
                self.highest_offset = offset
                self.acknowledged += 1
            elif kind == "P":
                self.maybe_trimmed = max(self.maybe_trimmed, int(fields[0]))
            elif kind == "T":
                self.trim(int(fields[0]))
            elif kind == "X":
                self.reset_in_doubt = True
            elif kind == "Z":
                self.reset()
            elif kind == "E":
                self.fail(cycle, f"the writer failed: {' '.join(fields)}")

    def trim(self, offset: int) -> None:
        """A trim through ``offset`` finished."""
        self.trim_point = max(self.trim_point, offset)
        self.maybe_trimmed = max(self.maybe_trimmed, offset)
        for known in [o for o in self.present if o <= self.trim_point]:
            del self.present[known]

    def reset(self) -> None:
        """A reset finished: nothing written so far may come back."""
        self.reset_in_doubt = False
        self.present.clear()
        self.trim_point = self.maybe_trimmed = max(self.trim_point, self.highest_offset)

    def absorb(self, cycle: int, lines: Sequence[str]) -> None:
        """Account for everything a killed writer reported: its recovery (checked, complete if
        it reported ``READY``), then what it did after."""
        if "READY" in lines:
            ready_at = lines.index("READY")
            self.check_lines(cycle, lines[:ready_at], complete=True)
            self.apply(cycle, lines[ready_at + 1 :])
        else:
            self.check_lines(cycle, lines, complete=False)

    # what a recovery returned

    def check_records(self, cycle: int, records: Sequence[WalRecord], *, complete: bool) -> None:
        """Check records a recovery in this process returned (see :meth:`check_recovery`)."""
        self.check_recovery(
            cycle,
            [
                (record.offset, identify(self.seed, bytes(record.data), self.max_body))
                for record in records
            ],
            complete=complete,
        )

    def check_lines(self, cycle: int, lines: Iterable[str], *, complete: bool) -> None:
        """Check the ``R`` lines a writer reported (``complete``: its recovery finished)."""
        recovered: list[tuple[int, Identity | None]] = []
        for line in lines:
            if line.startswith("R "):
                _, offset, record_cycle, seq = line.split()
                identity = None if record_cycle == "-" else (int(record_cycle), int(seq))
                recovered.append((int(offset), identity))
        self.check_recovery(cycle, recovered, complete=complete)

    def check_recovery(
        self, cycle: int, recovered: Sequence[tuple[int, Identity | None]], *, complete: bool
    ) -> None:
        """Check one recovery, ``(offset, identity)`` in the order it yielded them; a
        ``complete`` recovery must hold every record the model holds. The model then holds what
        came back (a recovered record must stay recoverable)."""
        last: tuple[int, Identity] | None = None
        for offset, identity in recovered:
            if identity is None:
                self.fail(cycle, f"recovered bytes at offset {offset} that were never appended")
            if last is not None and offset <= last[0]:
                self.fail(
                    cycle, f"recovery yielded offset {offset} after {last[0]} (order/duplicate)"
                )
            if last is not None and identity <= last[1]:
                self.fail(
                    cycle,
                    f"recovery yielded record {identity} at {offset} after record {last[1]} "
                    f"at {last[0]}: not in append order (or recovered twice)",
                )
            if offset <= self.trim_point:
                self.fail(
                    cycle,
                    f"recovered offset {offset} at or below the finished trim {self.trim_point}",
                )
            expected = self.present.get(offset)
            if expected is not None and expected != identity:
                self.fail(
                    cycle, f"offset {offset} holds record {identity}, acknowledged as {expected}"
                )
            last = (offset, identity)
        found = dict(recovered)
        for offset, identity in found.items():
            assert identity is not None
            self.present[offset] = identity
            self.highest_offset = max(self.highest_offset, offset)
        if not complete:
            return
        if self.reset_in_doubt and not found:
            self.present.clear()  # the reset in flight at the kill took effect
        missing = [o for o in sorted(self.present) if o not in found]
        for offset in [o for o in missing if o <= self.maybe_trimmed]:
            del self.present[offset]  # a trim in flight at the kill took effect: allowed
        missing = [o for o in missing if o > self.maybe_trimmed]
        if missing:
            self.fail(
                cycle,
                f"{len(missing)} acknowledged records were not recovered, "
                f"e.g. offsets {missing[:10]} "
                f"(records {[self.present[o] for o in missing[:5]]})",
            )
        if self.contiguous:
            runs: dict[int, list[int]] = {}
            for offset, identity in recovered:
                assert identity is not None
                if offset > self.maybe_trimmed:
                    runs.setdefault(identity[0], []).append(identity[1])
            for writer, seqs in runs.items():
                if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
                    holes = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs))
                    self.fail(
                        cycle, f"writer {writer} recovered with a hole: appends {holes[:10]} lost"
                    )
        self.reset_in_doubt = False
        self.recoveries_checked += 1


# -- the writer process, seen from the test ------------------------------------------------------


@dataclass(frozen=True)
class WriterOptions:
    """How the writer appends; passed on its command line."""

    window: int = 0
    """Appends in flight at once (0: a seeded choice of 1, 4 or 8 per writer)."""
    trims: bool = True
    """Trim all it recovered (half the time), and behind itself while appending."""
    keep: int = 200
    """While appending, trim once more than ``keep`` acknowledged records are untrimmed, down
    to ``keep // 2``."""
    reset_chance: float = 0.0
    """Chance the writer resets the WAL right after recovering."""
    max_body: int | None = None
    """Cap on the payload size after the header (the checker must be told the same)."""

    def arguments(self) -> list[str]:
        return [
            f"--window={self.window}",
            f"--keep={self.keep}",
            f"--reset-chance={self.reset_chance}",
            *([] if self.trims else ["--no-trims"]),
            *([] if self.max_body is None else [f"--max-body={self.max_body}"]),
        ]


class CrashWriter:
    """One writer process and the report lines it wrote (read on a thread as they come)."""

    def __init__(
        self,
        spec: BackendSpec,
        *,
        seed: int,
        cycle: int,
        epoch: int | None = None,
        mode: str = "write",
        options: WriterOptions = WriterOptions(),
        stderr: Path | None = None,
    ) -> None:
        self.cycle = cycle
        self._stderr_path = stderr
        command = [
            sys.executable,
            "-m",
            "walstream_conformance.harness.crash",
            f"--seed={seed}",
            f"--cycle={cycle}",
            f"--epoch={1000 + cycle if epoch is None else epoch}",
            f"--mode={mode}",
            *options.arguments(),
        ]
        err = stderr.open("wb") if stderr is not None else None
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )
        finally:
            if err is not None:
                err.close()
        assert self.process.stdin is not None
        self.process.stdin.write(spec.to_json().encode() + b"\n")
        self.process.stdin.close()
        self.lines: list[str] = []
        self.acks: list[tuple[int, int, int]] = []
        """``(offset, cycle, seq)`` of each acknowledged append, in order."""
        self.ready = threading.Event()
        """Set on ``READY`` or ``DONE`` (its recovery finished)."""
        self.ended = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            for raw in self.process.stdout:
                if not raw.endswith(b"\n"):
                    break  # cut by the kill
                line = raw.decode().rstrip("\n")
                if line.startswith("A "):
                    offset, cycle, seq = (int(value) for value in line.split()[1:])
                    self.acks.append((offset, cycle, seq))
                self.lines.append(line)
                if line in ("READY", "DONE"):
                    self.ready.set()
        finally:
            self.ended.set()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr_tail(self) -> str:
        path = self._stderr_path
        return path.read_text(errors="replace")[-2000:] if path and path.exists() else ""

    def wait_acks_blocking(self, count: int, timeout_s: float) -> bool:
        """Until ``count`` acknowledgements were reported; False if the writer ended or the
        time ran out first."""
        deadline = time.monotonic() + timeout_s
        while len(self.acks) < count:
            if self.ended.is_set() or time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    async def wait_acks(self, count: int, timeout_s: float = 20.0) -> None:
        """Until ``count`` acknowledgements were reported (asserts the writer lives and the
        time, ``timeout_s``, does not run out)."""
        deadline = time.monotonic() + timeout_s
        while len(self.acks) < count:
            assert not self.ended.is_set(), f"the writer died on its own: {self.stderr_tail()}"
            assert time.monotonic() < deadline, f"only {len(self.acks)} of {count} acks arrived"
            await asyncio.sleep(0.01)

    def kill(self) -> list[str]:
        """SIGKILL the writer; every complete line it wrote (they all happened)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        return self.finish()

    def finish(self, timeout_s: float = 10.0) -> list[str]:
        """Wait for the writer to end (bounded; SIGKILL after ``timeout_s``); its lines."""
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return list(self.lines)


# -- the whole loop -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KillSchedule:
    """When :func:`run_crash_cycles` kills each writer (seeded)."""

    recovery_kill_chance: float = 0.15
    """Chance a cycle's kill comes ``recovery_kill_s`` after the start, maybe during recovery."""
    recovery_kill_s: tuple[float, float] = (0.0, 0.6)
    kill_s: tuple[float, float] = (0.05, 0.8)
    """Otherwise: seconds after recovery finished."""
    kill_after_acks: tuple[int, int] | None = None
    """Instead of ``kill_s``: once this many appends (a seeded choice) were acknowledged."""
    ready_timeout_s: float = 90.0


@dataclass
class CrashReport:
    seed: int
    cycles: int
    acknowledged: int = 0
    """Acknowledgements observed over all cycles."""
    recovered_last: int = 0
    kills_during_recovery: int = 0
    recoveries_checked: int = 0
    log: list[str] = field(default_factory=list)


def run_crash_cycles(
    spec: BackendSpec,
    *,
    cycles: int,
    seed: int,
    workdir: Path,
    writer: WriterOptions = WriterOptions(),
    schedule: KillSchedule = KillSchedule(),
    contiguous: bool = False,
) -> CrashReport:
    """Run ``cycles`` kill/recover cycles, then a final recovery; raise
    :class:`CrashCheckFailed` on any violation."""
    report = CrashReport(seed=seed, cycles=cycles)
    model = CrashModel(
        seed,
        contiguous=contiguous,
        replay_hint=f"replay with --walstream-seed={seed}",
        max_body=writer.max_body,
    )
    rng = random.Random(f"crash-schedule/{seed}")
    for cycle in range(cycles):
        child = CrashWriter(
            spec,
            seed=seed,
            cycle=cycle,
            options=writer,
            stderr=workdir / f"crash-cycle-{cycle}.stderr",
        )
        try:
            if rng.random() < schedule.recovery_kill_chance:
                child.ready.wait(rng.uniform(*schedule.recovery_kill_s))
                if not child.ready.is_set():
                    if not child.alive:
                        model.fail(cycle, f"writer exited during recovery: {child.stderr_tail()}")
                    lines = child.kill()
                    # A partial recovery still must not show unappended or trimmed bytes.
                    model.check_lines(cycle, lines, complete=False)
                    report.kills_during_recovery += 1
                    continue
            if not child.ready.wait(schedule.ready_timeout_s):
                child.kill()
                model.fail(
                    cycle,
                    f"writer not ready after {schedule.ready_timeout_s}s: {child.stderr_tail()}",
                )
            if schedule.kill_after_acks is not None:
                wanted = rng.randint(*schedule.kill_after_acks)
                child.wait_acks_blocking(wanted, timeout_s=60.0)
            else:
                child.ended.wait(rng.uniform(*schedule.kill_s))
            exited = not child.alive
            lines = child.kill()
            if "READY" not in lines:
                model.fail(cycle, f"writer exited during recovery: {child.stderr_tail()}")
            ready_at = lines.index("READY")
            model.check_lines(cycle, lines[:ready_at], complete=True)
            # Lines written before the kill are acknowledgements the writer saw: they count.
            model.apply(cycle, lines[ready_at + 1 :])
            if exited:
                model.fail(
                    cycle,
                    f"writer exited by itself ({child.process.returncode}): {child.stderr_tail()}",
                )
        finally:
            if child.alive:
                child.kill()
    final = CrashWriter(
        spec,
        seed=seed,
        cycle=cycles,
        mode="recover",
        options=writer,
        stderr=workdir / "crash-final.stderr",
    )
    try:
        if not final.ready.wait(schedule.ready_timeout_s):
            final.kill()
            model.fail(cycles, f"final recovery did not finish: {final.stderr_tail()}")
        lines = final.finish(timeout_s=60.0)
        model.check_lines(cycles, lines, complete=True)
        report.recovered_last = sum(1 for line in lines if line.startswith("R "))
    finally:
        if final.alive:
            final.kill()
    report.acknowledged = model.acknowledged
    report.recoveries_checked = model.recoveries_checked
    return report


# -- the writer process -------------------------------------------------------------------------


def _say(line: str) -> None:
    # One write per line: a SIGKILL leaves at most a partial last line, which the reader drops.
    os.write(1, (line + "\n").encode())


async def _writer(args: argparse.Namespace, spec: BackendSpec) -> None:
    seed, cycle = args.seed, args.cycle
    rng = random.Random(f"crash-writer/{seed}/{cycle}")
    wal: WriteAheadLog = spec.build()
    await wal.start(1, args.epoch, WalMode.READ_WRITE)
    last_recovered = None
    async for record in wal.recover():
        identity = identify(seed, bytes(record.data), args.max_body)
        if identity is None:
            _say(f"R {record.offset} - -")
        else:
            _say(f"R {record.offset} {identity[0]} {identity[1]}")
        last_recovered = record.offset
    if args.mode == "recover":
        _say("DONE")
        await wal.close()
        return
    _say("READY")
    roll = rng.random()
    if roll < args.reset_chance:
        _say("X")
        await wal.reset()
        _say("Z")
    elif args.trims and last_recovered is not None and roll < args.reset_chance + 0.5:
        _say(f"P {last_recovered}")
        await wal.trim(last_recovered)
        _say(f"T {last_recovered}")
    window = args.window or rng.choice((1, 4, 8))
    acked: deque[int] = deque()

    async def appender() -> None:
        in_flight: deque[tuple[int, asyncio.Future[int]]] = deque()
        seq = 0
        while True:
            while len(in_flight) < window:
                data = crash_payload(seed, cycle, seq, args.max_body)
                in_flight.append((seq, wal.append(data)))
                seq += 1
            record_seq, future = in_flight.popleft()
            offset = await future
            _say(f"A {offset} {cycle} {record_seq}")
            acked.append(offset)

    async def trimmer() -> None:
        while True:
            await asyncio.sleep(rng.uniform(0.01, 0.1))
            if len(acked) > args.keep:
                target = acked[0]
                while len(acked) > args.keep // 2:
                    target = acked.popleft()
                _say(f"P {target}")
                await wal.trim(target)
                _say(f"T {target}")

    try:
        await asyncio.gather(appender(), *([trimmer()] if args.trims else []))
    except Exception as exc:
        _say(f"E {type(exc).__name__}: {exc}".replace("\n", " "))
        raise


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="walstream crash writer (BackendSpec on stdin)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--cycle", type=int, required=True)
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--mode", choices=("write", "recover"), default="write")
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--keep", type=int, default=200)
    parser.add_argument("--reset-chance", type=float, default=0.0)
    parser.add_argument("--no-trims", dest="trims", action="store_false")
    parser.add_argument("--max-body", type=int, default=None)
    args = parser.parse_args(argv)
    spec = BackendSpec.from_json(sys.stdin.readline())
    asyncio.run(_writer(args, spec))


if __name__ == "__main__":
    _main()
