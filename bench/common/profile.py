"""py-spy profiles of the benchmarks as short top lists (``bench/run_all.py --profile``).

A benchmark that names its measured phase (``WINDOWS``) runs it inside ``measured(label)``: with
``WALSTREAM_BENCH_PROFILE=RAW`` in the environment, py-spy is attached to the benchmark's own
process (and its children, e.g. chunk servers) only for that phase, and the raw stacks of every
window are appended to ``RAW``. Set-up, the peer's or device's side-by-side run (Redis, fio, raw
PUTs and GETs) and plot writing are not sampled. A benchmark without a window is recorded whole
(``record_command``).

``write_top`` turns the raw file into a text top list: a few summary lines computed from the
samples (the windows, how often event loops sat idle in their selector, the share per component of
own time and of inclusive time), then the share of busy samples per function and line (own time)
and per function (inclusive). Every thread is sampled, idle or not (``--idle``): a thread blocked in
a system call (a write, an fsync, a device wait) counts as busy at the line that made the call.
Samples whose innermost frame is a wait — a selector's poll, an idle executor thread, a lock or
condition wait — are counted as waiting, not busy; samples taken while a module was being imported
and samples of test rig child processes (``-m <package>.testing.<module>``) are left out.
py-spy's ``process N:"command line"`` pseudo-frames are dropped and file paths are written
relative (to the package for installed modules, to the repository for its own files), so a top
list never names the machine it was recorded on.

    .venv/bin/python bench/common/profile.py RAW [OUT] [--title NAME]   # a top list from a raw file
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TOP = 25
RATE = 100
"""Samples per second."""
ENV = "WALSTREAM_BENCH_PROFILE"
"""Environment variable naming the raw file a benchmark's ``measured`` windows append to."""
REPO = Path(__file__).resolve().parents[2]

WINDOWS = {
    "engine_local": "engine_appends (walstream side: 64 clients x 1 KiB appends)",
    "wal_ebs": "measure_wal (the WAL's appends; fio not sampled)",
    "wal_s3": "measure_wal (the s3 WAL's appends; raw PUTs not sampled)",
    "wal_s3express": "measure (the s3express WAL's acknowledged appends)",
    "wal_nvme_quorum": "bench_quorum (client and chunk servers; the ebs WAL run not sampled)",
    "cold_read": "cold_read (the engine's catch-up read; raw ranged GETs not sampled)",
    "spark_replay": "replay_once (the timed replays and their Python workers; fill, warm-up not)",
}
"""Benchmarks whose measured phase runs inside ``measured``: what each window covers."""

_WAITS = {
    ("select", "selectors.py"),
    ("poll", "selectors.py"),
    ("_worker", "concurrent/futures/thread.py"),
    ("wait", "threading.py"),
    ("_wait_for_tstate_lock", "threading.py"),
    ("get", "queue.py"),
    ("readinto", "socket.py"),  # a blocking socket read: waiting for the peer
    ("manager", "daemon.py:184"),  # the pyspark daemon's poll for its next task
    ("poll", "accumulators.py"),  # pyspark's accumulator server polling its socket
    ("run", "clientserver.py:58"),  # py4j's finalizer thread sleeping
    ("read_int", "serializers.py"),  # a pyspark worker reading its next command from the JVM
    # uvloop's loop runs in C: waiting in epoll (and reading its sockets) has no Python frame
    # of its own, so the innermost one is the runner that started it.
    ("run", "asyncio/runners.py"),
}
"""Innermost frames (function, file) that mean the thread was waiting, not working."""

_STARTUP = "<frozen import"
"""A frame of the import machinery: start-up, not the measured path (``zipimport`` included)."""

_PROCESS = re.compile(r'^process \d+:".*"$')
"""py-spy's pseudo-frame at the root of each process's stacks (pid and command line)."""
_RIG_PROCESS = re.compile(r'^process \d+:".* -m [\w.]+\.testing\.')
"""A child process running a test rig (``-m <package>.testing.<module>``, e.g. the moto server
of the s3 benchmark): the peer's or rig's side, not the measured path."""

_LOOP = "_run_once (asyncio/base_events.py"
"""A frame of an asyncio event loop's iteration: the thread is an event loop's."""

_INSTALLED = re.compile(r"^.*/(?:site-packages|dist-packages|lib/python\d+(?:\.\d+)?)/")
_WINDOW = "# window "

COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("test rig (in-memory S3, latency model, moto)", ("/testing/", "moto/", "werkzeug/")),
    (
        "object store client",
        (
            "walstream/objects/",
            "walstream_wal_s3/objects.py",
            "walstream_wal_s3/client.py",
            "aiobotocore/",
            "botocore/",
            "aiohttp/",
            "urllib3/",
        ),
    ),
    ("WAL", ("walstream/wal/", "walstream_wal_", "libaio/")),
    ("format (encoding, checksums)", ("walstream/format/",)),
    ("metadata (SQLite commits)", ("walstream/metadata/", "sqlite3/")),
    ("engine", ("walstream/engine/",)),
    ("Spark", ("pyspark", "walstream_spark/", "py4j/", "daemon.py", "serializers.py", "worker.py")),
    ("asyncio event loop", ("asyncio/", "uvloop/", "selectors.py")),
    ("executor threads (innermost: in a C call)", ("concurrent/futures/", "threading.py")),
)
"""Components a frame's file belongs to (first match wins), for the summary lines."""
_EVERYWHERE = {"asyncio event loop", "executor threads (innermost: in a C call)"}
"""Components at the root of nearly every stack: shown for own time, not inclusive time."""


def _process_name(frame: str) -> str:
    """The program of a ``process N:"command line"`` frame: the module run with ``-m``, else the
    script's file name (never its folder)."""
    words = frame.partition(':"')[2].rstrip('"').split()
    if "-m" in words[:-1]:
        return words[words.index("-m") + 1]
    scripts = [word for word in words[1:] if not word.startswith("-")]
    return Path(scripts[0]).name if scripts else Path(words[0]).name if words else "?"


def _is_wait(frame: str) -> bool:
    function, _, place = frame.partition(" (")
    name = function.rsplit(".", 1)[-1]
    return any(name == wait and where in place for wait, where in _WAITS)


def relative_path(path: str) -> str:
    """``path`` without the machine's folders: package-relative for installed modules,
    repository-relative for the repository's files, else the last two components."""
    if not path.startswith("/"):
        return path
    installed = _INSTALLED.sub("", path)
    if installed != path:
        return installed
    for marker, kept in (("/src/", ""), ("/bench/", "bench/")):
        if marker in path:  # a dist's sources or a benchmark, of this checkout or another
            return kept + path.rsplit(marker, 1)[1]
    with contextlib.suppress(ValueError):
        return str(Path(path).relative_to(REPO))
    return "/".join(path.rsplit("/", 2)[-2:])


def clean_frame(frame: str) -> str:
    """A frame ``function (file:line)`` with its file made relative."""
    function, bracket, place = frame.partition(" (")
    if not bracket:
        return frame
    return f"{function} ({relative_path(place)}"


def component(frame: str) -> str | None:
    place = frame.partition(" (")[2]
    for name, markers in COMPONENTS:
        if any(marker in place for marker in markers):
            return name
    return None


def py_spy() -> str | None:
    """The py-spy executable: next to this Python's, else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def record_command(raw: Path, command: list[str], rate: int = RATE) -> list[str]:
    """``command`` run under ``py-spy record`` writing raw stacks to ``raw``; ``command`` itself
    when py-spy is not installed."""
    executable = py_spy()
    if executable is None:
        return command
    return [
        executable,
        "record",
        "--format",
        "raw",
        "--rate",
        str(rate),
        "--subprocesses",
        "--idle",
        "--nonblocking",
        "--output",
        str(raw),
        "--",
        *command,
    ]


def _attach(executable: str, part: Path, log: Path, rate: int) -> subprocess.Popen[bytes] | None:
    """py-spy recording this process (and its children) into ``part``, once it samples; None
    when it did not start within 30 s."""
    with log.open("w") as output:
        command = [executable, "record", "--pid", str(os.getpid()), "--format", "raw"]
        command += ["--rate", str(rate), "--subprocesses", "--idle", "--nonblocking"]
        spy = subprocess.Popen(
            [*command, "--output", str(part)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30.0
    while "Sampling" not in log.read_text(errors="replace"):
        if spy.poll() is not None or time.monotonic() > deadline:
            spy.kill()
            spy.wait()
            return None
        time.sleep(0.01)
    return spy


@contextlib.contextmanager
def measured(label: str, *, when: bool = True, rate: int = RATE) -> Iterator[None]:
    """Samples this process and its children with py-spy while the block runs, when
    ``WALSTREAM_BENCH_PROFILE`` names a raw file (else does nothing); the window's stacks are
    appended to that file after a ``# window LABEL SECONDS`` line. The block starts only once
    py-spy samples; if py-spy cannot start, the block runs unprofiled and a warning is printed.
    ``when=False``: the block is not a measured window (runs unprofiled)."""
    target = os.environ.get(ENV)
    executable = py_spy()
    if not when or not target or executable is None:
        yield
        return
    part, log = Path(f"{target}.part"), Path(f"{target}.spylog")
    part.unlink(missing_ok=True)
    spy = _attach(executable, part, log, rate)
    if spy is None:
        print(f"py-spy did not start; {label} runs unprofiled", file=sys.stderr)
        yield
        return
    started = time.monotonic()
    try:
        yield
    finally:
        seconds = time.monotonic() - started
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        spy.wait(timeout=120)
        stacks = part.read_text(errors="replace") if part.exists() else ""
        with open(target, "a") as raw:
            raw.write(f"{_WINDOW}{label} {seconds:.3f}\n{stacks}")
        part.unlink(missing_ok=True)
        log.unlink(missing_ok=True)


def _share(count: int, total: int) -> str:
    return f"{100 * count / max(total, 1):.0f}%"


@dataclass
class _Tally:
    """The samples of a raw file, counted as :func:`top_list` reports them."""

    own: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    own_parts: Counter[str] = field(default_factory=Counter)
    inclusive_parts: Counter[str] = field(default_factory=Counter)
    windows: Counter[str] = field(default_factory=Counter)
    programs: Counter[str] = field(default_factory=Counter)
    window_seconds: float = 0.0
    busy: int = 0
    idle: int = 0
    startup: int = 0
    loop: int = 0
    loop_idle: int = 0
    rig: int = 0

    def add_line(self, line: str) -> None:
        """A ``# window LABEL SECONDS`` line, or a stack and its sample count."""
        if line.startswith(_WINDOW):
            label, _, seconds = line[len(_WINDOW) :].rpartition(" ")
            self.windows[label] += 1
            with contextlib.suppress(ValueError):
                self.window_seconds += float(seconds)
            return
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            self.add_stack(stack.split(";"), int(number))

    def add_stack(self, stack: list[str], samples: int) -> None:
        if any(_RIG_PROCESS.match(frame) for frame in stack):
            self.rig += samples
            return
        processes = [frame for frame in stack if _PROCESS.match(frame)]
        frames = [clean_frame(frame) for frame in stack if not _PROCESS.match(frame)]
        if not frames:
            return
        in_loop = any(_LOOP in frame for frame in frames)
        self.loop += samples if in_loop else 0
        if _is_wait(frames[-1]):
            self.idle += samples
            self.loop_idle += samples if in_loop else 0
            return
        if any(_STARTUP in frame for frame in frames):
            self.startup += samples
            return
        self.busy += samples
        self.programs[_process_name(processes[-1]) if processes else "?"] += samples
        self.own[frames[-1]] += samples
        self.own_parts[component(frames[-1]) or "other"] += samples
        for function in {frame.rsplit(":", 1)[0] for frame in frames}:
            self.inclusive[function] += samples
        for part in {component(frame) for frame in frames} - {None, *_EVERYWHERE}:
            self.inclusive_parts[str(part)] += samples

    def shares(self, counter: Counter[str], count: int) -> str:
        return ", ".join(f"{name} {_share(n, self.busy)}" for name, n in counter.most_common(count))

    def summary(self, title: str) -> list[str]:
        """The lines above the lists: the scope, where the samples went, the shares."""
        if self.windows:
            spans = ", ".join(f"{n} x {label}" for label, n in self.windows.items())
            scope = f"measured windows only ({spans}; {self.window_seconds:.1f} s in total)"
        else:
            scope = "the whole benchmark process (set-up and plots included)"
        by_process = (
            "; by process: " + self.shares(self.programs, 4) if len(self.programs) > 1 else ""
        )
        return [
            f"py-spy profile of {title}: {scope}",
            f"  {self.busy + self.idle + self.startup + self.rig} thread samples: {self.busy} busy"
            " (on a CPU or in a system call),"
            f" {self.idle} waiting (selector poll, idle thread, lock), {self.startup} importing"
            f" modules, {self.rig} in test rig processes (left out); event loop threads idle in"
            f" the selector {_share(self.loop_idle, self.loop)} of their samples",
            "  shares below are of busy samples" + by_process,
            "  own time by component: " + self.shares(self.own_parts, 6),
            "  on the stack (inclusive): " + (self.shares(self.inclusive_parts, 6) or "-"),
        ]


def top_list(raw: Path, title: str, count: int = TOP) -> str:
    """The top list of a py-spy raw file (collapsed stacks, one ``frames count`` a line)."""
    tally = _Tally()
    for line in raw.read_text(errors="replace").splitlines():
        tally.add_line(line)
    busy = max(tally.busy, 1)
    lines = [*tally.summary(title), "", "own time (function, file:line)"]
    lines += [f"{100 * n / busy:6.1f}%  {frame}" for frame, n in tally.own.most_common(count)]
    lines += ["", "inclusive (function, file)"]
    lines += [
        f"{100 * n / busy:6.1f}%  {frame})" for frame, n in tally.inclusive.most_common(count)
    ]
    return "\n".join(lines) + "\n"


def write_top(raw: Path, out: Path, title: str) -> None:
    out.write_text(top_list(raw, title))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--title", default=None)
    parser.add_argument("--top", type=int, default=TOP)
    args = parser.parse_args()
    text = top_list(args.raw, args.title or args.raw.stem, args.top)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
