"""Shared pieces of the command-line parser: the options every command accepts, argparse types,
and how a command is added."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from walstream.cli.runner import DEFAULT_TIMEOUT_S, EXIT_DEADLINE

__all__ = [
    "Parser",
    "add_command",
    "add_format",
    "at_least",
    "chosen_parser",
    "common_options",
    "refuse_unknown",
]


def _suggest(word: str, candidates: Sequence[str]) -> str:
    """``did you mean 'recover'?`` for the candidates closest to ``word`` ('' when none is
    close)."""
    close = difflib.get_close_matches(word, list(candidates), n=3, cutoff=0.6)
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(match) for match in close) + "?"


class Parser(argparse.ArgumentParser):
    """argparse that suggests: a mistyped command or choice names the closest ones ("did you
    mean"). Its subcommand parsers are Parsers too."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(choice) for choice in choices]
        what = "command" if isinstance(action, argparse._SubParsersAction) else "choice"
        where = "" if what == "command" else f"{'/'.join(action.option_strings)}: "
        suggestion = _suggest(str(value), names)
        raise argparse.ArgumentError(
            None,
            f"{where}unknown {what} {value!r}{'; ' + suggestion if suggestion else ''} "
            f"(choose from {', '.join(names)})",
        )


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The parser of the (sub)command ``args`` selected: ``walstream streams create`` gives
    the parser of ``streams create``."""
    current = parser
    while True:
        subparsers = next(
            (
                action
                for action in current._actions
                if isinstance(action, argparse._SubParsersAction)
            ),
            None,
        )
        if subparsers is None:
            return current
        name = getattr(args, subparsers.dest, None)
        if name is None or name not in subparsers.choices:
            return current
        current = subparsers.choices[name]


def refuse_unknown(parser: argparse.ArgumentParser, extra: Sequence[str]) -> NoReturn:
    """Exit 2 with ``parser``'s own usage for the arguments it does not know, naming the
    closest option of each mistyped one."""
    options = [name for name in parser._option_string_actions if name.startswith("--")]
    hints = []
    for argument in extra:
        if argument.startswith("--"):
            suggestion = _suggest(argument.partition("=")[0], options)
            if suggestion:
                hints.append(f"{argument}: {suggestion}")
    detail = f" ({'; '.join(hints)})" if hints else ""
    parser.error(f"unrecognized arguments: {' '.join(extra)}{detail}")


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
