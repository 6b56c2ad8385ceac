"""py-spy profiles of the benchmarks as short top lists (``bench/run_all.py --profile``).

``record_command`` wraps a benchmark's command in ``py-spy record`` (raw collapsed stacks, child
processes included); ``write_top`` turns the raw file into a text top list: the share of busy
samples per function and line (own time) and per function (inclusive). Samples whose innermost
frame is a wait — a selector's poll, an idle executor thread, a lock or condition wait — are
left out, and so are samples taken while a module was being imported (start-up), so the shares
are of time spent working on the measured paths.

    .venv/bin/python bench/_profile.py RAW [OUT] [--title NAME]   # a top list from a raw file
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from pathlib import Path

TOP = 25
_WAITS = {
    "select": "selectors.py",
    "poll": "selectors.py",
    "_worker": "concurrent/futures/thread.py",
    "wait": "threading.py",
    "_wait_for_tstate_lock": "threading.py",
    "get": "queue.py",
}
"""Innermost frames (function, file) that mean the thread was waiting, not working."""


_STARTUP = "<frozen import"
"""A frame of the import machinery: start-up, not the measured path (``zipimport`` included)."""


def _is_wait(frame: str) -> bool:
    function, _, place = frame.partition(" (")
    where = _WAITS.get(function.rsplit(".", 1)[-1])
    return where is not None and where in place


def py_spy() -> str | None:
    """The py-spy executable: next to this Python's, else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def record_command(raw: Path, command: list[str], rate: int = 100) -> list[str]:
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
        "--nonblocking",
        "--output",
        str(raw),
        "--",
        *command,
    ]


def top_list(raw: Path, title: str, count: int = TOP) -> str:
    """The top list of a py-spy raw file (collapsed stacks, one ``frames count`` a line)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    busy = idle = startup = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        samples = int(number)
        frames = stack.split(";")
        if _is_wait(frames[-1]):
            idle += samples
            continue
        if any(_STARTUP in frame for frame in frames):
            startup += samples
            continue
        busy += samples
        own[frames[-1]] += samples
        for function in {frame.rsplit(":", 1)[0] for frame in frames}:
            inclusive[function] += samples
    lines = [
        f"py-spy profile of {title}: {busy} busy samples (left out: {idle} waiting, "
        f"{startup} importing modules)",
        "",
        "own time (function, file:line)",
    ]
    lines += [f"{100 * n / max(busy, 1):6.1f}%  {frame}" for frame, n in own.most_common(count)]
    lines += ["", "inclusive (function, file)"]
    lines += [
        f"{100 * n / max(busy, 1):6.1f}%  {frame})" for frame, n in inclusive.most_common(count)
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
