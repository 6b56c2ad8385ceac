"""The options every benchmark script takes, besides its own:

- ``--quick``: the short run ``make bench`` makes (``bench/run_all.py``);
- ``--smoke``: the shortest run that goes through every step of the script — measurement,
  table, JSON and PNG — in seconds, for the test suite (``bench/tests``) and
  ``bench/run_all.py --smoke``. Its figures mean nothing, and a verdict it prints (a bound
  exceeded, a target missed) does not set the exit code; an error still does;
- ``--json PATH``: where the JSON goes (default ``bench/results/<script>.json``); the PNG goes
  beside it, with the suffix ``.png``.

A size a script takes from its mode goes through :func:`sized`: the option given on the command
line, else the smoke, quick or full default.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeVar

__all__ = ["BENCH", "RESULTS", "mode", "parser", "sized"]

BENCH = Path(__file__).resolve().parent.parent
RESULTS = BENCH / "results"
T = TypeVar("T")

SMOKE_HELP = (
    "the shortest run through every step (seconds; for the test suite): the figures mean "
    "nothing and verdicts do not set the exit code"
)


def parser(
    doc: str | None,
    name: str,
    *,
    quick: str,
    json_default: Path | None = None,
    json_help: str | None = None,
    json_aliases: tuple[str, ...] = (),
) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of ``doc`` with ``--quick`` (its
    help ``quick``), ``--smoke`` and ``--json`` (default ``bench/results/NAME.json`` unless
    ``json_default`` is given; ``json_aliases``: older names of the option)."""
    built = argparse.ArgumentParser(
        prog=f"bench/{name}.py", description=(doc or "").split("\n\n")[0]
    )
    sizes = built.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help=quick)
    sizes.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    default = json_default if json_default is not None else RESULTS / f"{name}.json"
    built.add_argument(
        "--json",
        *json_aliases,
        dest="json",
        type=Path,
        default=default,
        metavar="PATH",
        help=json_help or f"where the JSON goes (default {relative(default)}); the PNG beside it",
    )
    return built


def relative(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(path.relative_to(BENCH.parent))
    except ValueError:
        return str(path)


def mode(args: argparse.Namespace) -> str:
    """``smoke``, ``quick`` or ``full``."""
    if getattr(args, "smoke", False):
        return "smoke"
    return "quick" if getattr(args, "quick", False) else "full"


def sized(
    args: argparse.Namespace, given: T | None, *, full: T, quick: T, smoke: T | None = None
) -> T:
    """``given`` (an option of the command line) when it is not None, else the default of the
    run's mode (the smoke default is the quick one unless given)."""
    if given is not None:
        return given
    chosen = mode(args)
    if chosen == "smoke":
        return quick if smoke is None else smoke
    return quick if chosen == "quick" else full
