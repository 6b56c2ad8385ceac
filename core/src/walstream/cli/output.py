"""What commands show: progress bars on stderr, records in the output formats, tables.

``bench`` and ``demo`` draw their progress and tables with these too.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Sequence
from typing import IO, Any, Protocol

from walstream.records import SequencedRecord

__all__ = [
    "PROG",
    "NoProgress",
    "ProgressBar",
    "enum_value",
    "format_record",
    "human",
    "out",
    "plural",
    "progress_bar",
    "table",
]

PROG = "walstream"


# -- progress -------------------------------------------------------------------------------------


class ProgressBar(Protocol):
    def update(self, amount: int) -> Any: ...

    def close(self) -> Any: ...


class _TextProgress:
    """A dependency-free progress line on stderr, redrawn at most ten times a second."""

    def __init__(self, total: int | None, description: str, unit: str, stream: IO[str]) -> None:
        self._total = total
        self._description = description
        self._unit = unit
        self._stream = stream
        self._done = 0
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._drawn_width = 0

    def update(self, amount: int) -> None:
        self._done += amount
        now = time.monotonic()
        if now - self._last_draw >= 0.1:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._started, 1e-9)
        done = human(self._done, self._unit)
        rate = human(int(self._done / elapsed), self._unit)
        if self._total:
            percent = 100.0 * self._done / self._total
            width = 30
            filled = int(width * min(self._done, self._total) / self._total)
            bar = "#" * filled + "-" * (width - filled)
            line = f"{self._description} [{bar}] {percent:5.1f}% {done} {rate}/s"
        else:
            line = f"{self._description} {done} {rate}/s"
        # Pad over the rest of a longer previous line.
        self._stream.write("\r" + line.ljust(self._drawn_width))
        self._drawn_width = len(line)
        self._stream.flush()

    def close(self) -> None:
        self._draw(time.monotonic())
        self._stream.write("\n")
        self._stream.flush()


class NoProgress:
    def update(self, amount: int) -> None:
        return None

    def close(self) -> None:
        return None


def human(amount: int, unit: str) -> str:
    if unit != "B":
        return f"{amount} {unit}"
    value = float(amount)
    for suffix in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or suffix == "GiB":
            return f"{value:.0f} {suffix}" if suffix == "B" else f"{value:.1f} {suffix}"
        value /= 1024
    return f"{amount} B"


def progress_bar(
    total: int | None, description: str, unit: str = "B", enabled: bool = True
) -> ProgressBar:
    """A progress bar on stderr: tqdm when installed, else a plain redrawn line."""
    if not enabled:
        return NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _TextProgress(total, description, unit, sys.stderr)
    bar: ProgressBar = tqdm(
        total=total,
        desc=description,
        unit=unit,
        unit_scale=unit == "B",
        unit_divisor=1024,
        file=sys.stderr,
        leave=True,
        dynamic_ncols=True,
    )
    return bar


# -- formatting -----------------------------------------------------------------------------------


def _text(data: bytes | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", errors="backslashreplace")


def _json_bytes(data: bytes | None) -> Any:
    """UTF-8 text when the bytes are valid UTF-8, else ``{"base64": ...}``: never lossy."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def format_record(record: SequencedRecord, output_format: str) -> str:
    if output_format == "json":
        return json.dumps(
            {
                "offset": record.offset,
                "timestamp_ms": record.timestamp_ms,
                "key": _json_bytes(record.key),
                "value": _json_bytes(record.value),
                "headers": [[name, _json_bytes(value)] for name, value in record.headers],
            },
            ensure_ascii=False,
        )
    if output_format == "hex":
        key = "" if record.key is None else record.key.hex()
        return f"{record.offset}\t{key}\t{record.value.hex()}"
    return f"{record.offset}\t{_text(record.value)}"


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in cells
    ]
    return "\n".join(line.rstrip() for line in lines)


def enum_value(value: Any) -> Any:
    return getattr(value, "value", value)


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def plural(count: int, noun: str) -> str:
    """``1 record``, ``2 records``, ``1 batch``, ``3 batches``."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}es" if noun.endswith(("s", "sh", "ch", "x")) else f"{count} {noun}s"
