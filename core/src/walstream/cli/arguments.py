"""Shared pieces of the command-line parser: the options every command accepts, argparse types,
and how a command is added."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from walstream.cli.runner import DEFAULT_TIMEOUT_S, EXIT_DEADLINE

__all__ = ["add_command", "add_format", "at_least", "common_options"]


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (a bad one is a usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def common_options(suppress_defaults: bool) -> argparse.ArgumentParser:
    """--config and -v, accepted before or after the command."""
    parser = argparse.ArgumentParser(add_help=False)
    default: Any = argparse.SUPPRESS if suppress_defaults else None
    parser.add_argument(
        "--config",
        "-c",
        metavar="FILE",
        default=default,
        help="deployment YAML (sections node, wal, object_store, metadata, cache, upload, "
        "compaction, server, hooks, cluster, and the key append_timeout); default: the embedded "
        "deployment in ./walstream-data",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS if suppress_defaults else 0,
        help="debug logging of walstream on stderr, and full tracebacks on errors; -vv also "
        "debug logging of other libraries (botocore, aiohttp, ...)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_deadline_seconds,
        default=argparse.SUPPRESS if suppress_defaults else None,
        help=f"stop the command if it has not finished after this long (exit {EXIT_DEADLINE}); "
        f"0: no deadline; default {DEFAULT_TIMEOUT_S:g} s, none for serve, bench, demo, append and "
        "tail --follow",
    )
    return parser


def _deadline_seconds(text: str) -> float:
    """An argparse type for ``--timeout``: seconds, 0 for no deadline."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 (no deadline) or positive, got {text!r}")
    return value


def add_command(
    subparsers: Any,
    name: str,
    help_text: str,
    handler: Callable[..., Any],
    common: argparse.ArgumentParser,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help_text,
        description=help_text,
        parents=[common],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=handler)
    return parser


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("text", "json", "hex"),
        default="text",
        help="text: OFFSET<TAB>VALUE (UTF-8, undecodable bytes escaped); json: JSON lines, one "
        "object per line with offset, timestamp_ms, key, value, headers (bytes that are not UTF-8 "
        'appear as {"base64": ...}); hex: OFFSET<TAB>KEY<TAB>VALUE in hex',
    )
