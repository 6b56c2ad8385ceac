"""Commands that other distributions add to ``walstream``, through the entry-point group
:data:`COMMANDS_GROUP` that core owns::

    [project.entry-points."walstream.cli"]
    conformance = "<the command module>:COMMAND"   # as walstream-conformance does

The entry point's name is the command's name; the object it names has the shape of
:class:`ExtraCommand`. ``walstream NAME ARGS...`` hands ARGS to a parser the command fills in.

Rules kept here:

1. Listing commands (``walstream --help``) imports no extension: their distributions may be heavy
   (the conformance suite imports pytest), and a broken one must not break other commands.
2. A command walstream documents (:data:`KNOWN_COMMANDS`) stays listed when its distribution is
   missing, and running it says what to install (exit 2).
3. An extension that fails to import is reported with its distribution and the import error
   (exit 2), never skipped silently.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from walstream.cli.arguments import Parser
from walstream.cli.output import PROG
from walstream.cli.runner import EXIT_USAGE
from walstream.config.host import entry_points_in

__all__ = [
    "COMMANDS_GROUP",
    "KNOWN_COMMANDS",
    "ExtraCommand",
    "KnownCommand",
    "add_extra_commands",
    "run_extra_command",
]

COMMANDS_GROUP = "walstream.cli"
"""The entry-point group of extra ``walstream`` commands."""


class ExtraCommand(Protocol):
    """What an entry point of :data:`COMMANDS_GROUP` names."""

    @property
    def description(self) -> str:
        """The description of ``walstream NAME --help``."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the command's options. ``--config``/``-c`` and ``-v`` given before the command
        name fill in the attributes ``config`` and ``verbose`` when these options leave them
        absent (``default=argparse.SUPPRESS``)."""

    def run(self, args: argparse.Namespace) -> int:
        """Run the command; the process exit status."""


@dataclass(frozen=True)
class KnownCommand:
    """An extra command walstream documents, listed whether or not its distribution is
    installed."""

    dist: str
    """The distribution that provides it (the install hint)."""
    what: str
    """What it is, for "<what> is not installed"."""
    help: str
    """Its line in ``walstream --help``."""


KNOWN_COMMANDS: dict[str, KnownCommand] = {
    "conformance": KnownCommand(
        dist="walstream-conformance",
        what="the conformance suite",
        help="run the conformance suite (needs walstream-conformance); "
        "'walstream conformance --help' lists its options",
    ),
    "local-cluster": KnownCommand(
        dist="'walstream-metadata-postgres[testing]'",
        what="the local cluster (PostgreSQL, moto S3 and N nodes on this machine)",
        help="run a cluster of nodes on this machine to try failover (needs "
        "walstream-metadata-postgres[testing]); 'walstream local-cluster --help' lists its "
        "options",
    ),
}


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    """The entry points of :data:`COMMANDS_GROUP` (nothing is imported)."""
    return entry_points_in(COMMANDS_GROUP)


def _dist_label(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = entry_point.dist
    return "an unknown distribution" if dist is None else f"{dist.metadata['Name']} {dist.version}"


def add_extra_commands(commands: Any, taken: Sequence[str]) -> None:
    """Add every known and every installed extra command to the subparsers ``commands``
    (known ones first, in their documented order; then the others by name). Names in ``taken``
    are walstream's own commands and are never replaced."""
    installed = {entry_point.name: entry_point for entry_point in _entry_points()}
    names = [*KNOWN_COMMANDS, *sorted(set(installed) - set(KNOWN_COMMANDS))]
    for name in names:
        if name in taken:
            continue
        known = KNOWN_COMMANDS.get(name)
        if known is not None:
            help_text = known.help
        else:
            help_text = (
                f"from {_dist_label(installed[name])}; '{PROG} {name} --help' lists its options"
            )
        commands.add_parser(name, add_help=False, help=help_text).set_defaults(
            handler=None, extra_command=name
        )


def run_extra_command(name: str, args: argparse.Namespace, extra: list[str]) -> int:
    """Run the extra command ``name`` with the arguments after its name (``extra``)."""
    matches = [entry_point for entry_point in _entry_points() if entry_point.name == name]
    known = KNOWN_COMMANDS.get(name)
    if not matches:
        what = known.what if known is not None else f"the command {name!r}"
        install = f"pip install {known.dist}" if known is not None else "install it again"
        print(f"{PROG}: error: {what} is not installed; run: {install}", file=sys.stderr)
        return EXIT_USAGE
    if len({entry_point.value for entry_point in matches}) > 1:
        sources = "; ".join(f"{_dist_label(match)} ({match.value})" for match in matches)
        print(
            f"{PROG}: error: the command {name!r} is provided by several packages: {sources}. "
            "Uninstall all but one.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    entry_point = matches[0]
    try:
        command: ExtraCommand = entry_point.load()
    except Exception as error:
        dist = known.dist if known is not None else "the package that provides it"
        print(
            f"{PROG}: error: the command {name!r} from {_dist_label(entry_point)} failed to "
            f"load ({entry_point.value}): {type(error).__name__}: {error}; reinstall or "
            f"upgrade {dist}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    parser = Parser(prog=f"{PROG} {name}", description=command.description)
    command.add_arguments(parser)
    command_args = parser.parse_args(extra)
    if not hasattr(command_args, "config"):
        command_args.config = args.config
    if not hasattr(command_args, "verbose"):
        command_args.verbose = args.verbose
    return int(command.run(command_args) or 0)
