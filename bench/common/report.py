"""What every benchmark in ``bench/`` reports with: a fixed-width table on stdout, a JSON file
and a PNG plot, and the statistics they are made of.

- :class:`Table` prints a header and rows of :class:`Column` (a row is a mapping; a missing key
  prints empty), one line at a time, so a long benchmark shows each row as it is measured;
- :func:`write_json` writes a document (creating ``bench/results/``), indented, newline-ended;
  :func:`write_results` adds what ran it and its load, then draws the PNG beside it;
- :func:`save_plot` draws a figure with matplotlib's Agg backend and writes it as a PNG; without
  matplotlib it says so and the table and JSON still stand; :func:`grouped_bars` is the bar chart
  most benchmarks draw (one group of bars per label, one bar per series);
- :func:`percentile` (nearest rank, the one estimator the benchmarks share), :func:`median_of`
  (the per-key median of several runs), :func:`machine` (what ran it) and
  :func:`load_average` (how busy the machine was: it is shared, so every result records it).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Column",
    "Table",
    "grouped_bars",
    "load_average",
    "machine",
    "median_of",
    "percentile",
    "save_plot",
    "write_json",
]


def percentile(values: Iterable[float], fraction: float, *, presorted: bool = False) -> float:
    """The value at rank ``int(fraction * n)`` of the sorted values (the largest for 1.0); NaN
    for no values. ``presorted``: ``values`` is a sorted sequence already (not copied)."""
    ordered = values if presorted and isinstance(values, Sequence) else sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def median_of(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The median of each key over ``runs`` (the keys of the first run)."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def machine() -> dict[str, Any]:
    """What a result was measured on: Python, the platform, the cores."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (``uptime``'s)."""
    return [round(value, 2) for value in os.getloadavg()]


@dataclass(frozen=True)
class Column:
    """One column: the row key it shows, its title, width and how a value is written.

    ``spec`` is a format spec for a number (``".2f"``) or a function to text; any other value,
    or any value without a spec, is written as ``str(value)``. Title and text are aligned with ``align`` in ``width``."""

    key: str
    title: str | None = None
    width: int = 0
    spec: str | Callable[[Any], str] = ""
    align: str = ">"

    def text(self, value: Any) -> str:
        if callable(self.spec):
            return self.spec(value)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return format(value, self.spec) if self.spec and number else str(value)

    def cell(self, text: str) -> str:
        return f"{text:{self.align}{self.width}}"


class Table:
    """A fixed-width table printed line by line (see the module docstring)."""

    def __init__(self, columns: Sequence[Column], separator: str = " ") -> None:
        self.columns = list(columns)
        self.separator = separator

    @classmethod
    def of_keys(cls, keys: Sequence[str], min_width: int, separator: str = "  ") -> Table:
        """Right-aligned columns titled by their keys, each at least ``min_width`` wide."""
        return cls([Column(key, width=max(len(key), min_width)) for key in keys], separator)

    def header(self) -> str:
        return self.separator.join(
            column.cell(column.key if column.title is None else column.title)
            for column in self.columns
        )

    def line(self, row: Mapping[str, Any]) -> str:
        return self.separator.join(
            column.cell(column.text(row.get(column.key, ""))) for column in self.columns
        )

    def print_header(self) -> None:
        print(self.header(), flush=True)

    def print_row(self, row: Mapping[str, Any]) -> None:
        print(self.line(row), flush=True)

    def print(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """The header, then every row."""
        self.print_header()
        for row in rows:
            self.print_row(row)


def write_json(path: Path, document: Any) -> None:
    """Write ``document`` as indented JSON with a final newline, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def write_results(
    path: Path, document: dict[str, Any], plot: Callable[[Path], bool] | None = None
) -> None:
    """Write ``document`` to ``path`` as JSON, with ``machine`` and ``load_average`` added where
    it has none; then ``plot(png)`` (the PNG beside it, an older one removed first; False when
    nothing was drawn) and lines saying the load and what was written."""
    document.setdefault("machine", machine())
    document.setdefault("load_average", load_average())
    write_json(path, document)
    png = path.with_suffix(".png")
    drawn = False
    if plot is not None:
        png.unlink(missing_ok=True)
        drawn = plot(png)
    print(f"load average (1, 5, 15 min): {' '.join(map(str, document['load_average']))}")
    print(f"wrote {path}" + (f" and {png}" if drawn else ""), flush=True)


def save_plot(
    path: Path,
    draw: Callable[[Any, Any], None],
    *,
    figsize: tuple[float, float] = (9, 4),
    columns: int = 1,
    rows: int = 1,
    dpi: int = 120,
) -> bool:
    """Call ``draw(figure, axes)`` on a new figure of ``rows`` x ``columns`` axes (one axis when
    both are 1, a row of them when ``rows`` is 1, else a grid; none when ``columns`` is 0:
    ``draw`` lays them out itself and gets None) and write it to ``path`` as a PNG; False, with a
    line saying so, when matplotlib is not installed."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        print("matplotlib is not installed: no plot")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if columns:
        figure, axes = plt.subplots(rows, columns, figsize=figsize)
    else:
        figure, axes = plt.figure(figsize=figsize), None
    try:
        draw(figure, axes)
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=dpi)
    finally:
        plt.close(figure)
    return True


def grouped_bars(
    axis: Any,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    fontsize: float = 8,
    colors: Sequence[str] | None = None,
) -> None:
    """One group of bars per label, one bar per series (named in the legend when there are
    several); ``colors`` colours a single series bar by bar."""
    width = 0.8 / len(series)
    for index, (name, values) in enumerate(series.items()):
        offset = (index - (len(series) - 1) / 2) * width
        axis.bar(
            [position + offset for position in range(len(labels))],
            list(values),
            width,
            label=name if len(series) > 1 else None,
            color=colors,
        )
    axis.set_xticks(list(range(len(labels))), list(labels), fontsize=fontsize)
