"""The ``walstream`` command line.

Every command takes ``--config FILE`` (a deployment YAML; default: the embedded deployment in
``./walstream-data``) and ``-v`` (debug logging of walstream, tracebacks on errors; ``-vv`` also
debug logging of third-party libraries such as botocore). Failures print one line,
``walstream: error: <ErrorClass>: <message>``, and exit with 1 (2 for configuration and usage
errors).

This module builds the parser and runs a command. The commands live in :mod:`.streams`
(streams, append, read, tail, trim), :mod:`.inspect` (plugins, inspect) and :mod:`.node`
(recover, demo, serve, bench); other distributions add commands through the ``walstream.cli``
entry-point group (:mod:`.extensions`; ``conformance`` comes from walstream-conformance).
:mod:`.runner` bounds a command by its deadline and Ctrl-C, :mod:`.deployments` reaches the
deployment through the plugin host, :mod:`.remote` forwards to a live ``walstream serve``, and
:mod:`.output` draws progress bars, tables and records.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from walstream.cli import cluster, inspect, node, streams
from walstream.cli.arguments import Parser, chosen_parser, common_options, refuse_unknown
from walstream.cli.deployments import set_command_name
from walstream.cli.extensions import add_extra_commands, run_extra_command
from walstream.cli.output import PROG, ProgressBar, progress_bar
from walstream.cli.runner import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    Stopped,
    command_deadline,
    configure_logging,
    print_error,
    report_stop,
    run_command,
    silence_stdout,
)
from walstream.errors import ConfigError, WalstreamError

__all__ = ["ProgressBar", "build_parser", "main", "progress_bar"]

BUILTIN_COMMANDS = (
    "streams",
    "append",
    "read",
    "tail",
    "trim",
    "recover",
    "plugins",
    "inspect",
    "demo",
    "serve",
    "bench",
)
"""walstream's own commands; an extra command (:mod:`walstream.cli.extensions`) never replaces
one."""

EPILOG = """\
examples:
  walstream streams create orders
  seq 1 1000 | walstream append orders
  walstream append orders --file events.txt --key user-42 --batch 500
  walstream read orders --start 0 --limit 10 --format json
  walstream tail orders -n 100 -f
  walstream trim orders 500
  walstream --config deploy.yaml streams list --prefix ord
  walstream inspect metadata          # lists every object with its KEY
  walstream inspect object KEY        # or the object's file under ./walstream-data/objects/
  walstream recover -c deploy.yaml    # recover the WAL, or say what was lost
  walstream plugins
  walstream demo --streams 3 --records 20000
  walstream serve -c deploy.yaml --listen 127.0.0.1:7400
  walstream bench --streams 4 --records 50000 --json bench.json

Without --config every command uses the embedded deployment in ./walstream-data
(an ebs or memory WAL, a local object store and SQLite metadata).
Exit status: 0 ok, 1 error (one line on stderr), 2 bad configuration or usage.
While `walstream serve` runs the node (it holds <metadata file>.node-N.lock),
append, trim and streams create/delete go through its HTTP API, and read and
tail get the records not yet uploaded from it; nothing takes the node over.
When it cannot be reached,
read/tail show committed records only (and say so), and writes, recover, demo,
bench and a second serve refuse with NodeBusy naming it (exit 2).
Short options mean the same in every command: -c config, -v verbose, -f follow,
-n count, -i input file, -k key (conformance: -k EXPR selects tests, as in pytest),
-b batch. --json and --format json write JSON lines (one object per line).
"""


def build_parser() -> argparse.ArgumentParser:
    common = common_options(suppress_defaults=True)
    parser = Parser(
        prog=PROG,
        description="walstream: append-only streams, durable in a write-ahead log, stored in "
        "object storage.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_options(suppress_defaults=False)],
    )
    from walstream import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    streams.add_commands(commands, common)  # streams, append, read, tail, trim
    node.add_recover(commands, common)
    inspect.add_commands(commands, common)  # plugins, inspect
    cluster.add_commands(commands, common)  # cluster status
    add_extra_commands(commands, BUILTIN_COMMANDS)  # conformance, and what others install
    node.add_commands(commands, common)  # demo, serve, bench
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the process exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    extra_command: str | None = getattr(args, "extra_command", None)
    if extra and extra_command is None:
        # The command's own usage, not walstream's: the mistake is in the command's options.
        refuse_unknown(chosen_parser(parser, args), extra)
    configure_logging(args.verbose)
    set_command_name(
        " ".join(
            str(part)
            for part in (args.command, getattr(args, "streams_command", None))
            if part is not None
        )
    )
    handler: Callable[..., Any] = args.handler
    try:
        if extra_command is not None:
            return run_extra_command(extra_command, args, extra)
        outcome = handler(args)
        if isinstance(outcome, Awaitable):
            outcome = run_command(outcome, args.command, command_deadline(args))
        return int(outcome)
    except Stopped as stop:
        return report_stop(stop, args.command)
    except KeyboardInterrupt:
        return report_stop(Stopped(interrupted=True), args.command)
    except BrokenPipeError:
        # The reader went away (`walstream read s | head`): not an error.
        silence_stdout()
        return EXIT_OK
    except ConfigError as exc:
        print_error(exc, args.verbose)
        return EXIT_USAGE
    except WalstreamError as exc:
        print_error(exc, args.verbose)
        return EXIT_ERROR
    except OSError as exc:
        print_error(exc, args.verbose)
        return EXIT_ERROR
