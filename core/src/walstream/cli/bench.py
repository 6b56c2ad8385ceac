"""``walstream bench``: append throughput and latency of a node, then a cold read back.

On the deployment of ``--config`` (default: the embedded one in ``./walstream-data``) it

1. creates fresh streams ``bench-<run>-<n>`` (the run number follows earlier runs' streams),
2. runs ``concurrency`` appenders at once — appender ``i`` writes to stream ``i % streams`` —
   that together append ``records`` records of ``value_bytes`` bytes in batches of ``batch``,
   timing every acknowledged batch,
3. closes the client (which uploads and commits everything) and opens a new one, so the read
   starts cold: empty caches, every byte from object storage,
4. reads every stream back concurrently and checks that each appender's records arrived
   complete, in order and intact,
5. prints a table (append records/s, MiB/s, p50/p99/p999 batch latency, read MiB/s), writes the
   numbers as JSON when asked, and deletes its streams unless ``keep``.

Values carry ``(appender, sequence)`` in their first eight bytes, so verification needs no copy
of what was written. Throughput counts value bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from walstream.errors import InvalidArgument
from walstream.records import Record

__all__ = ["BenchReport", "PhaseResult", "run_bench"]

STREAM_PREFIX = "bench-"
_RUN_NAME = re.compile(r"^bench-(\d+)-\d+$")
_SEQUENCE = struct.Struct(">II")  # appender, sequence number
READ_PAGE_RECORDS = 5000
READ_PAGE_BYTES = 8 << 20
MIB = 1 << 20


def _filler(value_bytes: int) -> bytes:
    """Deterministic bytes after the (appender, sequence) prefix of every value."""
    wanted = max(0, value_bytes - _SEQUENCE.size)
    block = hashlib.blake2b(b"walstream bench", digest_size=64).digest()
    return (block * (wanted // len(block) + 1))[:wanted]


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class PhaseResult:
    records: int = 0
    value_bytes: int = 0
    seconds: float = 0.0

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mib_per_second(self) -> float:
        return self.value_bytes / MIB / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "value_bytes": self.value_bytes,
            "seconds": round(self.seconds, 6),
            "records_per_s": round(self.records_per_second, 1),
            "mib_per_s": round(self.mib_per_second, 3),
        }


@dataclass
class BenchReport:
    streams: list[str]
    records: int
    value_bytes: int
    batch_records: int
    concurrency: int
    append: PhaseResult
    read: PhaseResult
    batch_latencies_s: list[float]
    mismatches: list[str] = field(default_factory=list)
    deployment: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def latency_ms(self, fraction: float) -> float:
        return _percentile(sorted(self.batch_latencies_s), fraction) * 1000.0

    def as_dict(self) -> dict[str, Any]:
        def milliseconds(fraction: float) -> float | None:
            value = self.latency_ms(fraction)
            return None if math.isnan(value) else round(value, 3)

        return {
            "parameters": {
                "streams": len(self.streams),
                "records": self.records,
                "value_bytes": self.value_bytes,
                "batch": self.batch_records,
                "concurrency": self.concurrency,
            },
            "deployment": self.deployment,
            "stream_names": self.streams,
            "append": {
                **self.append.as_dict(),
                "batches": len(self.batch_latencies_s),
                "latency_ms": {
                    "p50": milliseconds(0.5),
                    "p99": milliseconds(0.99),
                    "p999": milliseconds(0.999),
                },
            },
            "read_cold": self.read.as_dict(),
            "verified": self.ok,
            "mismatches": self.mismatches[:20],
        }

    def table(self) -> str:
        from walstream.cli.output import table as _table

        def number(value: float, digits: int = 1) -> str:
            return "-" if math.isnan(value) else f"{value:,.{digits}f}"

        header = (
            "PHASE",
            "RECORDS",
            "MiB",
            "SECONDS",
            "RECORDS/S",
            "MiB/S",
            "P50 MS",
            "P99 MS",
            "P999 MS",
        )
        rows = [
            (
                "append",
                f"{self.append.records:,}",
                number(self.append.value_bytes / MIB),
                number(self.append.seconds, 2),
                number(self.append.records_per_second, 0),
                number(self.append.mib_per_second),
                number(self.latency_ms(0.5), 2),
                number(self.latency_ms(0.99), 2),
                number(self.latency_ms(0.999), 2),
            ),
            (
                "read (cold)",
                f"{self.read.records:,}",
                number(self.read.value_bytes / MIB),
                number(self.read.seconds, 2),
                number(self.read.records_per_second, 0),
                number(self.read.mib_per_second),
                "-",
                "-",
                "-",
            ),
        ]
        title = (
            f"walstream bench: {len(self.streams)} streams, {self.records:,} records of "
            f"{self.value_bytes:,} B, batches of {self.batch_records}, "
            f"{self.concurrency} appenders"
        )
        verdict = (
            f"verification: OK ({self.read.records:,} records read back)"
            if self.ok
            else f"verification: FAILED ({len(self.mismatches)} problems; first: "
            f"{self.mismatches[0]})"
        )
        return "\n".join([title, "", _table(rows, header), "", verdict])


def _shares(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


async def _next_run_number(client: Any) -> int:
    runs = [
        int(match.group(1))
        for info in await client.list_streams(prefix=STREAM_PREFIX)
        if info.name and (match := _RUN_NAME.match(info.name))
    ]
    return max(runs, default=0) + 1


async def _append_share(
    stream: Any,
    appender: int,
    count: int,
    batch_records: int,
    filler: bytes,
    latencies: list[float],
    progress: Any,
) -> None:
    sequence = 0
    while sequence < count:
        size = min(batch_records, count - sequence)
        records = [
            Record(_SEQUENCE.pack(appender, sequence + index) + filler) for index in range(size)
        ]
        started = time.perf_counter()
        await stream.append(records)
        latencies.append(time.perf_counter() - started)
        sequence += size
        progress.update(size)


async def _read_stream(
    stream: Any,
    expected: dict[int, int],
    filler: bytes,
    mismatches: list[str],
    totals: PhaseResult,
    progress: Any,
) -> None:
    """Read ``stream`` from its start to its tail; check every appender's sequence numbers
    arrive in order and complete (``expected``: appender → record count)."""
    next_sequence = dict.fromkeys(expected, 0)
    tail = await stream.check_tail()
    position = 0
    while position < tail:
        result = await stream.read(
            start=position, limit_records=READ_PAGE_RECORDS, limit_bytes=READ_PAGE_BYTES
        )
        if not result.records:
            mismatches.append(
                f"{stream.name}: read at {position} returned nothing before the tail {tail}"
            )
            return
        for record in result.records:
            value = record.value
            totals.records += 1
            totals.value_bytes += len(value)
            if len(value) < _SEQUENCE.size or value[_SEQUENCE.size :] != filler:
                mismatches.append(f"{stream.name}@{record.offset}: damaged value")
                continue
            appender, sequence = _SEQUENCE.unpack_from(value)
            if next_sequence.get(appender) != sequence:
                mismatches.append(
                    f"{stream.name}@{record.offset}: appender {appender} record {sequence}, "
                    f"expected {next_sequence.get(appender)}"
                )
            next_sequence[appender] = sequence + 1
        progress.update(len(result.records))
        position = result.records[-1].offset + 1
    for appender, count in expected.items():
        if next_sequence[appender] != count:
            mismatches.append(
                f"{stream.name}: appender {appender} has "
                f"{next_sequence[appender]} of {count} records"
            )


async def run_bench(
    config: Any = None,
    *,
    streams: int = 4,
    records: int = 50_000,
    value_bytes: int = 1024,
    batch_records: int = 100,
    concurrency: int = 8,
    json_path: str | Path | None = None,
    keep: bool = False,
    progress: bool = True,
) -> BenchReport:
    """Run the benchmark on the deployment ``config``; print the table; return the report."""
    import walstream
    from walstream.cli.output import progress_bar

    if value_bytes < _SEQUENCE.size:
        raise InvalidArgument(f"value_bytes must be at least {_SEQUENCE.size}")
    if min(streams, records, batch_records, concurrency) < 1:
        raise InvalidArgument("streams, records, batch and concurrency must be at least 1")
    filler = _filler(value_bytes)
    shares = _shares(records, concurrency)
    latencies: list[float] = []
    append = PhaseResult()

    async with walstream.open(config) as client:
        run = await _next_run_number(client)
        names = [f"{STREAM_PREFIX}{run:04d}-{index}" for index in range(streams)]
        handles = [await client.create_stream(name) for name in names]
        description = client.describe()
        bar = progress_bar(records, "append", unit="records", enabled=progress)
        started = time.perf_counter()
        try:
            await asyncio.gather(
                *(
                    _append_share(
                        handles[appender % streams],
                        appender,
                        count,
                        batch_records,
                        filler,
                        latencies,
                        bar,
                    )
                    for appender, count in enumerate(shares)
                    if count
                )
            )
        finally:
            bar.close()
        append.seconds = time.perf_counter() - started
        append.records = records
        append.value_bytes = records * value_bytes

    # A new client: empty caches, every read comes from object storage.
    read = PhaseResult()
    mismatches: list[str] = []
    async with walstream.open(config) as client:
        expected: list[dict[int, int]] = [{} for _ in names]
        for appender, count in enumerate(shares):
            if count:
                expected[appender % streams][appender] = count
        reopened = [await client.open_stream(name) for name in names]
        bar = progress_bar(records, "read (cold)", unit="records", enabled=progress)
        started = time.perf_counter()
        try:
            await asyncio.gather(
                *(
                    _read_stream(stream, expected[index], filler, mismatches, read, bar)
                    for index, stream in enumerate(reopened)
                )
            )
        finally:
            bar.close()
        read.seconds = time.perf_counter() - started
        if not keep:
            for name in names:
                await client.delete_stream(name)

    report = BenchReport(
        streams=names,
        records=records,
        value_bytes=value_bytes,
        batch_records=batch_records,
        concurrency=concurrency,
        append=append,
        read=read,
        batch_latencies_s=latencies,
        mismatches=mismatches,
        deployment={
            "wal": _kind(description.get("wal")),
            "object_store": _kind(description.get("objects")),
            "metadata": _kind(description.get("metadata")),
        },
    )
    print(report.table(), flush=True)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(report.as_dict(), indent=2, default=str) + "\n")
    return report


def _kind(description: Any) -> Any:
    """The backend's type from its ``describe()``, or the whole description."""
    if isinstance(description, dict):
        return description.get("type", description)
    return description
