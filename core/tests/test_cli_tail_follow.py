"""``walstream tail -f`` beside writers, as real processes on the embedded default deployment:
following never takes the node, so ``walstream append`` in another process succeeds while the
tail runs, and the tail prints what was appended (once it is committed, which it says)."""

from __future__ import annotations

import importlib.util
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("walstream_wal_ebs") is None,
    reason="needs the ebs WAL of the embedded deployment",
)


def _walstream(cwd: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WALSTREAM, *args], input=input, capture_output=True, text=True, cwd=cwd, timeout=120
    )


class Lines:
    """The lines of a child's pipe, read by a thread, handed out as they arrive."""

    def __init__(self, pipe: IO[str]) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def next(self) -> str | None:
        """The next line (None: the pipe closed); the test's timeout is the only bound."""
        line = self._queue.get()
        if line is not None:
            self.seen.append(line)
        return line

    def until(self, predicate: str) -> str:
        while (line := self.next()) is not None:
            if predicate in line:
                return line
        raise AssertionError(f"the pipe closed before a line with {predicate!r}: {self.seen}")


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Lines, Lines]]:
    created = _walstream(tmp_path, "streams", "create", "orders")
    assert created.returncode == 0, created.stderr
    appended = _walstream(tmp_path, "append", "orders", input="before\n")
    assert appended.returncode == 0, appended.stderr
    process = subprocess.Popen(
        [WALSTREAM, "tail", "orders", "-f"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        yield process, Lines(process.stdout), Lines(process.stderr)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.slow
def test_append_succeeds_while_tail_follows_and_the_tail_prints_it(
    tmp_path: Path, follower: tuple[subprocess.Popen[str], Lines, Lines]
) -> None:
    process, stdout, stderr = follower
    # The tail prints what is there, then says how it follows: read-only, without the node.
    assert stdout.next() == "0\tbefore"
    note = stderr.until("following committed records read-only")
    assert "upload.max_interval (0.25s)" in note, note
    for round_index in range(2):
        values = [f"r{round_index}-{index}" for index in range(3)]
        appended = _walstream(tmp_path, "append", "orders", input="\n".join(values) + "\n")
        assert appended.returncode == 0, f"append beside tail -f failed: {appended.stderr}"
        first = 1 + 3 * round_index
        for offset, value in enumerate(values, start=first):
            assert stdout.next() == f"{offset}\t{value}"
    assert process.poll() is None, "tail -f exited on its own"
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0
    assert "NodeBusy" not in "\n".join(stderr.seen)


@pytest.mark.slow
def test_tail_without_follow_still_shows_the_last_records(tmp_path: Path) -> None:
    assert _walstream(tmp_path, "streams", "create", "s").returncode == 0
    assert _walstream(tmp_path, "append", "s", input="a\nb\nc\n").returncode == 0
    shown = _walstream(tmp_path, "tail", "s", "-n", "2")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["1\tb", "2\tc"]
