"""A writer process for crash testing the ebs WAL: ``python -m walstream_wal_ebs.testing.crashloop``.

It starts the WAL READ_WRITE with a fresh epoch, recovers, reports every recovered record, then
appends deterministic payloads forever (a window of appends in flight), trims behind itself and
sometimes resets, reporting each step to a report file *after* it happened, one ``os.write`` per
line. The test kills it with SIGKILL at a random moment and checks the next process's recovery
against the report.

Report lines::

    R <offset> <cycle> <seq> <digest>   recovered record
    ready                               recovery finished
    A <offset> <cycle> <seq> <digest>   append acknowledged
    trimming <offset> / trimmed <offset>
    resetting / reset
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import struct
from collections import deque

from walstream.wal import WalMode, WalOffset

from ..wal import EbsWal

__all__ = ["digest", "parse_identity", "payload_for"]

_IDENTITY = struct.Struct(">II")


def payload_for(seed: int, cycle: int, seq: int) -> bytes:
    """The deterministic payload of append ``seq`` of writer ``cycle`` (0 to ~9 KiB)."""
    rng = random.Random(f"{seed}:{cycle}:{seq}")
    size = rng.choice([0, 1, 100, 1000, 4000, 4072, 4096, 9000, rng.randrange(0, 9000)])
    pattern = hashlib.blake2b(f"{seed}:{cycle}:{seq}".encode()).digest()
    body = (pattern * (size // len(pattern) + 1))[:size]
    return _IDENTITY.pack(cycle, seq) + body


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def parse_identity(data: bytes) -> tuple[int, int]:
    if len(data) < _IDENTITY.size:
        return (-1, -1)
    cycle, seq = _IDENTITY.unpack_from(data)
    return cycle, seq


class _Report:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def say(self, line: str) -> None:
        os.write(self._fd, (line + "\n").encode())


async def _run(args: argparse.Namespace) -> None:
    report = _Report(args.report)
    rng = random.Random(f"{args.seed}:{args.cycle}:writer")
    wal = EbsWal(
        args.path,
        capacity_bytes=args.capacity,
        max_inflight=args.max_inflight,
        max_group_bytes=64 << 10,
        max_group_delay_s=0.0002,
        capacity_wait_s=2.0,
    )
    await wal.start(1, args.cycle + 1, WalMode.READ_WRITE)
    recovered: list[WalOffset] = []
    async for record in wal.recover():
        cycle, seq = parse_identity(record.data)
        report.say(f"R {record.offset} {cycle} {seq} {digest(record.data)}")
        recovered.append(record.offset)
    report.say("ready")
    acked: deque[WalOffset] = deque(recovered)
    if rng.random() < 0.15:
        report.say("resetting")
        await wal.reset()
        report.say("reset")
        acked.clear()
    in_flight: deque[tuple[int, bytes, asyncio.Future[WalOffset]]] = deque()
    seq = 0
    while True:
        while len(in_flight) < args.window:
            data = payload_for(args.seed, args.cycle, seq)
            in_flight.append((seq, data, wal.append(data)))
            seq += 1
        record_seq, data, future = in_flight.popleft()
        offset = await future
        report.say(f"A {offset} {args.cycle} {record_seq} {digest(data)}")
        acked.append(offset)
        if len(acked) > args.keep and rng.random() < 0.2:
            while len(acked) > args.keep // 2:
                trim_to = acked.popleft()
            report.say(f"trimming {trim_to}")
            await wal.trim(trim_to)
            report.say(f"trimmed {trim_to}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--report", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--cycle", type=int, required=True)
    parser.add_argument("--capacity", type=int, default=512 << 10)
    parser.add_argument("--max-inflight", type=int, default=4)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--keep", type=int, default=16)
    args = parser.parse_args(argv)
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
