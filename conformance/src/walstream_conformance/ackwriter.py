"""A WAL writer process for crash tests that kill more than the writer (replicas, zones).

``python -m walstream_conformance.ackwriter SPEC_JSON EPOCH SEED`` builds the WAL from a
:class:`~walstream_conformance.backends.BackendSpec` (JSON), starts it as node 1 with ``EPOCH``,
recovers it, prints ``READY``, then appends records ``b"<epoch>:<index>:<padding>"`` with up to
32 in flight and prints ``ACK <offset> <epoch>:<index>`` for each acknowledgement, in order,
flushed at once — until it is killed.

:class:`AckWriter` runs it and collects the acknowledgements; :func:`check_recovery` checks what
a later recovery returned against them.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import deque

from walstream.wal import WalMode, WalRecord

from .backends import BackendSpec

__all__ = ["AckWriter", "check_recovery", "wait_acks"]

_IN_FLIGHT = 32


class AckWriter:
    """The writer subprocess and the acknowledgements it reported."""

    def __init__(self, spec: BackendSpec, epoch: int, seed: int) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "walstream_conformance.ackwriter",
                spec.to_json(),
                str(epoch),
                str(seed),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.acks: list[tuple[int, str]] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("READY"):
                self.ready.set()
            elif line.startswith("ACK "):
                _, offset, name = line.split()
                self.acks.append((int(offset), name))

    def kill(self) -> list[tuple[int, str]]:
        """SIGKILL the writer; the acknowledgements it reported before dying."""
        assert self.process.poll() is None, "the writer died on its own"
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return list(self.acks)


async def wait_acks(writer: AckWriter, count: int, timeout_s: float = 20.0) -> None:
    """Wait until ``writer`` reported ``count`` acknowledgements (bounded)."""
    deadline = time.monotonic() + timeout_s
    while len(writer.acks) < count:
        assert writer.process.poll() is None, "the writer died on its own"
        assert time.monotonic() < deadline, f"only {len(writer.acks)} of {count} acks arrived"
        await asyncio.sleep(0.01)


def check_recovery(recovered: list[WalRecord], expected: dict[str, int], context: str) -> None:
    """Every acknowledged record (name → offset) exactly once at its offset, in order; per
    writer, what came back is one contiguous run of its appends (no holes, nothing invented)."""
    offsets = [record.offset for record in recovered]
    assert offsets == sorted(set(offsets)), f"{context}: offsets not strictly increasing"
    names = [":".join(record.data.decode().split(":")[:2]) for record in recovered]
    assert len(names) == len(set(names)), f"{context}: a record was recovered twice"
    found = dict(zip(names, offsets, strict=True))
    missing = [name for name in expected if name not in found]
    assert not missing, f"{context}: acknowledged records lost: {missing[:5]}"
    moved = [name for name, offset in expected.items() if found[name] != offset]
    assert not moved, f"{context}: records recovered at another offset: {moved[:5]}"
    by_writer: dict[str, list[int]] = {}
    for name in names:
        writer_epoch, index = name.split(":")
        by_writer.setdefault(writer_epoch, []).append(int(index))
    for writer_epoch, indexes in by_writer.items():
        assert indexes == list(range(indexes[0], indexes[0] + len(indexes))), (
            f"{context}: writer {writer_epoch} recovered with a hole"
        )


async def _write(spec: BackendSpec, epoch: int, seed: int) -> None:
    rng = random.Random(seed)
    wal = spec.build()
    await wal.start(1, epoch, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    print("READY", flush=True)
    in_flight: deque[tuple[str, asyncio.Future[int]]] = deque()
    index = 0
    while True:
        while len(in_flight) < _IN_FLIGHT:
            name = f"{epoch}:{index}"
            data = f"{name}:".encode() + b"p" * rng.randrange(0, 2000)
            in_flight.append((name, wal.append(data)))
            index += 1
        name, future = in_flight.popleft()
        offset = await future
        sys.stdout.write(f"ACK {offset} {name}\n")
        sys.stdout.flush()
        if rng.random() < 0.05:
            await asyncio.sleep(rng.random() * 0.01)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m walstream_conformance.ackwriter SPEC_JSON EPOCH SEED")
    asyncio.run(_write(BackendSpec.from_json(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
