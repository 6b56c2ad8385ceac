"""``walstream demo`` (what ``make run`` runs): a write, read, restart, verify round trip.

On the embedded default deployment (or ``--config``) it

1. creates fresh streams (``demo-<run>-<n>``; the run number follows the streams earlier runs left,
   so repeated runs on one ``./walstream-data`` never collide),
2. appends a generated workload to them concurrently — one appender per stream, batches of
   ``batch_records`` — timing every acknowledged batch,
3. reads everything back and compares it byte for byte with what was generated,
4. closes the client (a restart), opens a new one and verifies again (now from object storage),
5. prints a summary table on stdout; progress goes to stderr.

Every value is derived from ``(stream name, offset)``, so the verifier needs no copy of what was
written. Exit status 0 when every record matched, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.errors import InvalidArgument
from walstream.metadata.contract import ObjectState
from walstream.records import Record

__all__ = ["DemoReport", "expected_value", "run_demo"]

STREAM_PREFIX = "demo-"
_RUN_NAME = re.compile(r"^demo-(\d+)-\d+$")
READ_PAGE_RECORDS = 2000


def expected_value(stream_name: str, offset: int, value_bytes: int) -> bytes:
    """The value of record ``offset`` of ``stream_name``: a readable prefix, then bytes expanded
    from a hash of (stream, offset) — any misplaced, reordered or damaged record shows."""
    prefix = f"{stream_name}:{offset}:".encode()
    filler = hashlib.blake2b(prefix, digest_size=64).digest()
    return (prefix + filler * (value_bytes // len(filler) + 1))[:value_bytes]


def expected_key(offset: int) -> bytes:
    return f"k{offset % 97}".encode()


@dataclass
class Verification:
    records: int = 0
    value_bytes: int = 0
    seconds: float = 0.0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def mib_per_second(self) -> float:
        return self.value_bytes / (1 << 20) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class DemoReport:
    streams: list[str]
    records: int
    value_bytes: int
    append_seconds: float
    batch_latencies_s: list[float]
    objects_written: int
    object_bytes: int
    first_read: Verification
    after_restart: Verification

    @property
    def ok(self) -> bool:
        return self.first_read.ok and self.after_restart.ok

    def percentile_ms(self, fraction: float) -> float:
        if not self.batch_latencies_s:
            return 0.0
        ordered = sorted(self.batch_latencies_s)
        index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
        return ordered[index] * 1000.0

    def table(self) -> str:
        mib = self.value_bytes / (1 << 20)
        append_rate = mib / self.append_seconds if self.append_seconds > 0 else 0.0
        rows = [
            ("streams", f"{len(self.streams)} ({self.streams[0]} .. {self.streams[-1]})"),
            ("records", f"{self.records:,}"),
            ("value MiB", f"{mib:.1f}"),
            (
                "append MiB/s",
                f"{append_rate:.1f} ({self.records / self.append_seconds:,.0f} records/s)"
                if self.append_seconds > 0
                else "-",
            ),
            ("append p50 (ms/batch)", f"{self.percentile_ms(0.50):.2f}"),
            ("append p99 (ms/batch)", f"{self.percentile_ms(0.99):.2f}"),
            (
                "objects written",
                f"{self.objects_written} ({self.object_bytes / (1 << 20):.1f} MiB)",
            ),
            ("read MiB/s", f"{self.first_read.mib_per_second:.1f}"),
            ("read MiB/s after restart", f"{self.after_restart.mib_per_second:.1f}"),
            (
                "verification",
                _verdict(self.first_read) + " / after restart: " + _verdict(self.after_restart),
            ),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
        rule = "-" * max(len(line) for line in lines)
        return "\n".join(["walstream demo summary", rule, *lines, rule])


def _verdict(verification: Verification) -> str:
    if verification.ok:
        return f"OK ({verification.records:,} records)"
    return f"FAILED ({len(verification.mismatches)} problems)"


async def _next_run_number(client: Any) -> int:
    infos = await client.list_streams(prefix=STREAM_PREFIX)
    runs = [
        int(match.group(1)) for info in infos if info.name and (match := _RUN_NAME.match(info.name))
    ]
    return max(runs, default=0) + 1


async def _append_stream(
    stream: Any,
    name: str,
    records: int,
    value_bytes: int,
    batch_records: int,
    latencies_s: list[float],
    progress: Any,
) -> None:
    offset = 0
    while offset < records:
        count = min(batch_records, records - offset)
        batch = [
            Record(expected_value(name, position, value_bytes), key=expected_key(position))
            for position in range(offset, offset + count)
        ]
        started = time.perf_counter()
        # match_tail makes the offsets certain: the values were generated for exactly them.
        ack = await stream.append(batch, match_tail=offset)
        latencies_s.append(time.perf_counter() - started)
        if ack.start != offset or ack.end != offset + count:
            raise AssertionError(
                f"{name}: batch for [{offset}, {offset + count}) was acknowledged "
                f"at [{ack.start}, {ack.end})"
            )
        offset = ack.end
        progress.update(count)


async def _verify_stream(
    stream: Any,
    name: str,
    records: int,
    value_bytes: int,
    verification: Verification,
    progress: Any,
) -> None:
    position = 0
    while position < records:
        result = await stream.read(
            start=position, limit_records=min(READ_PAGE_RECORDS, records - position)
        )
        if not result.records:
            verification.mismatches.append(
                f"{name}: no records at offset {position} (tail {result.tail})"
            )
            return
        for record in result.records:
            if record.offset != position:
                verification.mismatches.append(
                    f"{name}: expected offset {position}, read offset {record.offset}"
                )
                return
            if record.value != expected_value(name, position, value_bytes):
                verification.mismatches.append(f"{name}: value of offset {position} differs")
            elif record.key != expected_key(position):
                verification.mismatches.append(f"{name}: key of offset {position} differs")
            verification.records += 1
            verification.value_bytes += len(record.value)
            position += 1
            if position >= records:
                break
        progress.update(len(result.records))
    tail = await stream.check_tail()
    if tail != records:
        verification.mismatches.append(f"{name}: tail is {tail}, expected {records}")


async def _verify_all(
    client: Any,
    names: Sequence[str],
    records: int,
    value_bytes: int,
    label: str,
    show_progress: bool,
) -> Verification:
    from walstream.cli.output import progress_bar

    verification = Verification()
    progress = progress_bar(records * len(names), label, unit="records", enabled=show_progress)
    started = time.perf_counter()
    try:
        streams = [await client.open_stream(name) for name in names]
        await asyncio.gather(
            *(
                _verify_stream(stream, name, records, value_bytes, verification, progress)
                for stream, name in zip(streams, names, strict=True)
            )
        )
    finally:
        progress.close()
    verification.seconds = time.perf_counter() - started
    return verification


async def _objects_of(client: Any, stream_ids: set[int]) -> tuple[int, int]:
    """Committed objects holding data of ``stream_ids``: (count, bytes)."""
    objects = await client.metadata.list_objects(state=ObjectState.COMMITTED)
    ours = [info for info in objects if any(rng.stream_id in stream_ids for rng in info.ranges)]
    return len(ours), sum(info.size for info in ours)


def _open(config: Any) -> Any:
    import walstream

    return walstream.open(config)


async def run_demo(
    config: Any = None,
    streams: int = 3,
    records: int = 20_000,
    value_bytes: int = 256,
    batch_records: int = 100,
    progress: bool = True,
) -> int:
    """Run the demo; print the summary on stdout; return 0 when everything verified, else 1."""
    from walstream.cli.output import progress_bar

    if streams < 1 or records < 1 or value_bytes < 1 or batch_records < 1:
        raise InvalidArgument("--streams, --records, --value-bytes and --batch must be >= 1")
    log = sys.stderr
    async with _open(config) as client:
        run = await _next_run_number(client)
        names = [f"{STREAM_PREFIX}{run:04d}-{index}" for index in range(streams)]
        print(
            f"demo run {run}: {streams} streams x {records:,} records of {value_bytes} bytes "
            f"in batches of {batch_records}",
            file=log,
        )
        handles = [await client.create_stream(name) for name in names]
        stream_ids = {handle.stream_id for handle in handles}
        latencies_s: list[float] = []
        bar = progress_bar(records * streams, "append", unit="records", enabled=progress)
        started = time.perf_counter()
        try:
            await asyncio.gather(
                *(
                    _append_stream(
                        handle, name, records, value_bytes, batch_records, latencies_s, bar
                    )
                    for handle, name in zip(handles, names, strict=True)
                )
            )
        finally:
            bar.close()
        append_seconds = time.perf_counter() - started
        first_read = await _verify_all(client, names, records, value_bytes, "read back", progress)
        await client.flush()
        objects_written, object_bytes = await _objects_of(client, stream_ids)
    print("restarting the client", file=log)
    async with _open(config) as client:
        after_restart = await _verify_all(
            client, names, records, value_bytes, "verify after restart", progress
        )
    report = DemoReport(
        streams=names,
        records=records * streams,
        value_bytes=records * streams * value_bytes,
        append_seconds=append_seconds,
        batch_latencies_s=latencies_s,
        objects_written=objects_written,
        object_bytes=object_bytes,
        first_read=first_read,
        after_restart=after_restart,
    )
    for problem in (first_read.mismatches + after_restart.mismatches)[:20]:
        print(f"mismatch: {problem}", file=log)
    print(report.table())
    return 0 if report.ok else 1
