"""Stream commands: ``streams create|list|delete``, ``append``, ``read``, ``tail``, ``trim``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from walstream.cli.arguments import add_command, add_format, at_least
from walstream.cli.moves import add_move_command
from walstream.cli.output import PROG, NoProgress, format_record, out, plural, progress_bar, table
from walstream.cli.remote import READ_PAGE_RECORDS, open_client, open_follower
from walstream.cli.runner import EXIT_OK, EXIT_USAGE
from walstream.encryption import EncryptionKey
from walstream.engine.client import Client
from walstream.errors import InvalidArgument, OutOfRangeError
from walstream.metadata.contract import page_key
from walstream.records import ReadResult, Record, parse_stream_ref
from walstream.stream_config import (
    STORAGE_CLASSES,
    Timestamping,
    format_age,
    parse_age,
)

if TYPE_CHECKING:
    from walstream.engine.client import Stream

__all__ = [
    "add_commands",
    "cmd_append",
    "cmd_read",
    "cmd_streams_config",
    "cmd_streams_create",
    "cmd_streams_delete",
    "cmd_streams_list",
    "cmd_tail",
    "cmd_trim",
]

DEFAULT_APPEND_BATCH = 100
DEFAULT_TAIL_LINES = 10


# -- commands: streams ----------------------------------------------------------------------------


#: Streams ``streams create`` creates per metadata transaction, and ``streams list`` reads per page.
CREATE_CHUNK = 10_000
LIST_PAGE = 1_000


def _names_to_create(args: argparse.Namespace) -> list[str]:
    names = list(args.name)
    if args.from_file is not None:
        if args.from_file == "-":
            lines = sys.stdin.read().splitlines()
        else:
            lines = Path(args.from_file).read_text(encoding="utf-8").splitlines()
        names += [line.strip() for line in lines if line.strip()]
    if not names:
        raise InvalidArgument("streams create: name at least one stream (NAME ... or --from-file)")
    return names


async def cmd_streams_create(args: argparse.Namespace) -> int:
    names = _names_to_create(args)
    changes = config_changes(args)
    async with open_client(args.config) as client:
        local = isinstance(client, Client)
        config = None
        if changes:  # the settings given, over the deployment's `streams:` defaults
            defaults = client.config.streams.config if local else client.stream_defaults
            config = defaults.with_changes(changes)
        if len(names) == 1 and args.from_file is None:
            if not changes:
                stream = await client.create_stream(names[0])
            elif local:
                stream = await client.create_stream(names[0], config=config)
            else:  # through a running server, which applies its defaults
                stream = await client.create_stream(names[0], changes=changes)
            out(f"created stream {stream.name!r} (id {stream.stream_id})")
            return EXIT_OK
        done = 0
        for start in range(0, len(names), CREATE_CHUNK):
            chunk = names[start : start + CREATE_CHUNK]
            await client.create_streams(chunk, config=config)
            done += len(chunk)
            if len(names) > CREATE_CHUNK:
                print(f"{PROG}: created {done:,} of {len(names):,}", file=sys.stderr, flush=True)
        out(f"created {plural(done, 'stream')}")
    return EXIT_OK


async def cmd_streams_config(args: argparse.Namespace) -> int:
    changes = config_changes(args)
    async with open_client(args.config, writes=bool(changes)) as client:
        stream = await client.open_stream(_name_or_id(args.name))
        if changes:
            config = await stream.reconfigure(**changes)
        else:
            config = (await client.metadata.get_stream(stream.stream_id)).config
    if args.json:
        out(json.dumps({"stream_id": stream.stream_id, "name": stream.name, **config.to_json()}))
        return EXIT_OK
    retention = config.retention_age_s
    empty = config.delete_on_empty_min_age_s
    rows = [
        ("retention", "infinite" if retention is None else format_age(retention)),
        ("timestamping", config.timestamping.value),
        ("uncapped", "yes" if config.uncapped else "no"),
        ("delete_on_empty", format_age(empty) if empty else "never"),
        ("storage_class", config.storage_class or "-"),
        ("cipher", config.cipher or "-"),
    ]
    out(f"stream {stream.name!r} (id {stream.stream_id})" + (": changed" if changes else ""))
    out(table(rows, ("SETTING", "VALUE")))
    return EXIT_OK


def config_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The stream config changes that ``--retention`` & co. name (nothing for those left out)."""
    changes: dict[str, Any] = {}
    if args.retention is not None:
        changes["retention_age_s"] = None if args.retention == _INFINITE else args.retention
    if args.timestamping is not None:
        changes["timestamping"] = args.timestamping
    if args.uncapped is not None:
        changes["uncapped"] = args.uncapped
    if args.delete_on_empty is not None:
        changes["delete_on_empty_min_age_s"] = args.delete_on_empty
    if args.storage_class is not None:
        changes["storage_class"] = args.storage_class
    return changes


_INFINITE = "infinite"


def _age_or_infinite(text: str) -> int | str:
    try:
        age = parse_age(text, "age")
    except InvalidArgument as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return _INFINITE if age is None else age


def _age_or_never(text: str) -> int:
    if text.strip().lower() in ("never", "0", "off"):
        return 0
    age = _age_or_infinite(text)
    if not isinstance(age, int):
        raise argparse.ArgumentTypeError("an age like 1h or 7d, or never")
    return age


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retention",
        type=_age_or_infinite,
        metavar="AGE",
        help="keep records this long by their timestamp: 30s, 15m, 12h, 7d, 2w, or infinite",
    )
    parser.add_argument(
        "--timestamping",
        choices=[mode.value for mode in Timestamping],
        help="client-prefer (the client's timestamp, else arrival), client-require (refuse "
        "records without one), arrival (ignore the client's)",
    )
    capped = parser.add_mutually_exclusive_group()
    capped.add_argument(
        "--uncapped",
        dest="uncapped",
        action="store_const",
        const=True,
        help="keep client timestamps that lie in the future",
    )
    capped.add_argument(
        "--capped",
        dest="uncapped",
        action="store_const",
        const=False,
        help="cap client timestamps at the arrival time (the default)",
    )
    parser.add_argument(
        "--delete-on-empty",
        type=_age_or_never,
        metavar="AGE",
        help="delete the stream once it has been empty this long (or never)",
    )
    parser.add_argument(
        "--storage-class",
        choices=list(STORAGE_CLASSES),
        help="the storage class the stream reports (kept as given)",
    )


def _start_after(text: str | None) -> str | int | None:
    """``--start-after``: a name, or ``#ID`` for a stream without a name."""
    return None if text is None else parse_stream_ref(text)


def _key_text(info: Any) -> str:
    key = page_key(info)
    return f"#{key}" if isinstance(key, int) else key


async def cmd_streams_list(args: argparse.Namespace) -> int:
    start_after = _start_after(args.start_after)
    left = args.limit
    rows: list[tuple[Any, ...]] = []
    last: Any = None
    more = False
    async with open_client(args.config, writes=False) as client:
        while left is None or left > 0:
            page = LIST_PAGE if left is None else min(LIST_PAGE, left)
            infos = await client.list_streams(args.prefix, start_after, page + 1)
            more = len(infos) > page
            infos = infos[:page]
            for info in infos:
                if args.json:
                    out(
                        json.dumps(
                            {
                                "stream_id": info.stream_id,
                                "name": info.name,
                                "start_offset": info.start_offset,
                                "committed_end": info.committed_end,
                                "epoch": info.epoch,
                                "owner_node_id": info.owner_node_id,
                                "config": info.config.to_json(),
                            }
                        )
                    )
                else:
                    rows.append(
                        (
                            info.stream_id,
                            info.name or "-",
                            info.start_offset,
                            info.committed_end,
                            info.epoch,
                            "-" if info.owner_node_id is None else info.owner_node_id,
                            info.config.describe(),
                        )
                    )
            if infos:
                last = infos[-1]
                start_after = page_key(last)
            if left is not None:
                left -= len(infos)
            if not more:
                break
    if not args.json:
        out(table(rows, ("ID", "NAME", "START", "COMMITTED_END", "EPOCH", "OWNER", "CONFIG")))
    if more and last is not None:
        print(
            f"{PROG}: more streams follow: --start-after {shlex.quote(_key_text(last))} lists the next ones",
            file=sys.stderr,
        )
    return EXIT_OK


async def cmd_streams_delete(args: argparse.Namespace) -> int:
    async with open_client(args.config) as client:
        await client.delete_stream(_name_or_id(args.name))
        out(f"deleted stream {args.name!r}")
    return EXIT_OK


def _name_or_id(text: str) -> str | int:
    """``#7`` or a bare ``7`` selects the stream with id 7, anything else is a name (stream names
    never start with ``#`` and are never all digits); ``#x`` is refused with InvalidArgument."""
    return parse_stream_ref(text)


# -- commands: append -----------------------------------------------------------------------------


def _lines(source: IO[bytes]) -> Iterator[bytes]:
    for line in source:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def _batches(values: Iterable[bytes], batch_size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for value in values:
        batch.append(value)
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


async def cmd_append(args: argparse.Namespace) -> int:
    key = None if args.key is None else os.fsencode(args.key)
    headers = tuple(args.header)
    source: IO[bytes]
    if args.file is not None:
        path = Path(args.file)
        try:
            source = path.open("rb")
        except FileNotFoundError:
            print(f"{PROG}: error: append --file {args.file}: no such file", file=sys.stderr)
            return EXIT_USAGE
        except IsADirectoryError:
            print(f"{PROG}: error: append --file {args.file}: is a folder", file=sys.stderr)
            return EXIT_USAGE
        progress = progress_bar(
            path.stat().st_size, f"append {args.stream}", enabled=not args.no_progress
        )
    else:
        source = sys.stdin.buffer
        progress = NoProgress()
    appended = 0
    batches = 0
    tail = None
    try:
        async with open_client(args.config) as client:
            stream = await client.open_stream(_name_or_id(args.stream))
            for values in _batches(_lines(source), args.batch):
                records = [Record(value, key=key, headers=headers) for value in values]
                ack = await stream.append(records, encryption=key_of(args))
                appended += len(records)
                batches += 1
                tail = ack.tail
                out(f"offsets {ack.start}..{ack.end - 1}")
                progress.update(sum(len(value) + 1 for value in values))
    finally:
        progress.close()
        if source is not sys.stdin.buffer:
            source.close()
    if appended:
        print(
            f"appended {plural(appended, 'record')} in {plural(batches, 'batch')} to "
            f"{args.stream!r} (tail {tail})",
            file=sys.stderr,
        )
    else:
        print("nothing to append (no input lines)", file=sys.stderr)
    return EXIT_OK


def _header(text: str) -> tuple[str, bytes]:
    """An argparse type for ``--header NAME=VALUE``."""
    name, separator, value = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, os.fsencode(value)


# -- commands: read / tail / trim -----------------------------------------------------------------


async def _first_read(stream: Stream, args: argparse.Namespace, page: int) -> ReadResult:
    """The first page of ``read``: at --start, --from-timestamp or --tail-offset; without any of
    them at the stream's first readable offset."""
    key = key_of(args)
    if args.from_timestamp is not None:
        return await stream.read(
            from_timestamp=args.from_timestamp, limit_records=page, encryption=key
        )
    if args.tail_offset is not None:
        return await stream.read(tail_offset=args.tail_offset, limit_records=page, encryption=key)
    if args.start is not None:
        return await stream.read(start=args.start, limit_records=page, encryption=key)
    try:
        return await stream.read(start=0, limit_records=page, encryption=key)
    except OutOfRangeError as trimmed:
        # Trimmed: begin where the stream begins now.
        return await stream.read(start=trimmed.start_offset, limit_records=page, encryption=key)


async def cmd_read(args: argparse.Namespace) -> int:
    remaining = args.limit
    async with open_client(args.config, writes=False) as client:
        stream = await client.open_stream(_name_or_id(args.stream))
        page = READ_PAGE_RECORDS if remaining is None else min(READ_PAGE_RECORDS, remaining)
        if page == 0:
            return EXIT_OK
        result = await _first_read(stream, args, page)
        await _print_pages(stream, result, remaining, args.format, key_of(args))
    return EXIT_OK


async def _print_pages(
    stream: Stream,
    result: ReadResult,
    remaining: int | None,
    output_format: str,
    key: EncryptionKey | None = None,
) -> int:
    """Print ``result`` and the pages after it, up to the tail the first read saw (records
    appended since are not waited for) and at most ``remaining`` records. One read returns at
    most a page of records and of bytes (1 MiB by default), so a large count always takes
    several reads. Returns the offset after the last record printed (the tail when none)."""
    end = result.tail  # the records present when the read began
    position = end
    while True:
        records = result.records if remaining is None else result.records[:remaining]
        for record in records:
            out(format_record(record, output_format))
        if remaining is not None:
            remaining -= len(records)
        if not records:
            return position
        position = records[-1].offset + 1
        if remaining == 0 or position >= end:
            return position
        page = READ_PAGE_RECORDS if remaining is None else min(READ_PAGE_RECORDS, remaining)
        result = await stream.read(start=position, limit_records=page, encryption=key)


async def cmd_tail(args: argparse.Namespace) -> int:
    key = key_of(args)
    # Following runs until Ctrl-C: it never takes the node, so writers keep running beside it.
    opened = open_follower(args.config) if args.follow else open_client(args.config, writes=False)
    async with opened as client:
        stream = await client.open_stream(_name_or_id(args.stream))
        if args.start is not None:
            position = args.start
        else:
            position = await _print_last(stream, args.lines, args.format, key)
        if args.start is not None and not args.follow:
            tail = await stream.check_tail()
            while position < tail:
                result = await stream.read(
                    start=position,
                    limit_records=min(READ_PAGE_RECORDS, tail - position),
                    encryption=key,
                )
                if not result.records:
                    break
                for record in result.records:
                    out(format_record(record, args.format))
                position = result.records[-1].offset + 1
        if args.follow:
            async for record in stream.tail(start=position, encryption=key):
                out(format_record(record, args.format))
                sys.stdout.flush()
    return EXIT_OK


async def _print_last(
    stream: Stream, lines: int, output_format: str, key: EncryptionKey | None
) -> int:
    """Print the last ``lines`` records (every readable one when the stream holds fewer);
    return the offset after them."""
    if lines <= 0:
        return await stream.check_tail()
    result = await stream.read(
        tail_offset=lines, limit_records=min(lines, READ_PAGE_RECORDS), encryption=key
    )
    return await _print_pages(stream, result, lines, output_format, key)


ENCRYPTION_KEY_ENV = "WALSTREAM_ENCRYPTION_KEY"


def key_of(args: argparse.Namespace) -> EncryptionKey | None:
    """The key of ``--encryption-key``, else of ``$WALSTREAM_ENCRYPTION_KEY`` (CIPHER:BASE64)."""
    text = getattr(args, "encryption_key", None) or os.environ.get(ENCRYPTION_KEY_ENV)
    return None if not text else EncryptionKey.parse(text)


def _add_encryption_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--encryption-key",
        metavar="CIPHER:BASE64",
        help="key of an encrypted stream: aegis-256 or aes-256-gcm, a colon, and the base64 "
        f"of 32 bytes (default: ${ENCRYPTION_KEY_ENV}, which keeps the key out of the "
        "process list); appends are encrypted with it, reads decrypted",
    )


async def cmd_trim(args: argparse.Namespace) -> int:
    async with open_client(args.config) as client:
        stream = await client.open_stream(_name_or_id(args.stream))
        start = await stream.start_offset()
        if args.offset <= start:
            # Trimming never moves the start back: the records before it are already gone.
            out(
                f"nothing trimmed: {args.stream!r} already starts at offset {start} "
                f"(trim only moves the first readable offset forward)"
            )
            return EXIT_OK
        await stream.trim(args.offset)
        out(f"trimmed {args.stream!r}: offsets before {args.offset} are gone")
    return EXIT_OK


# -- parser ---------------------------------------------------------------------------------------


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``streams``, ``append``, ``read``, ``tail`` and ``trim`` to ``commands``."""
    # streams
    streams = commands.add_parser(
        "streams",
        help="create, list, delete and move streams",
        parents=[common],
        description="Create, list, delete and move streams.",
        epilog="examples:\n  walstream streams create orders --retention 7d\n"
        "  walstream streams config orders --timestamping arrival\n  walstream streams list "
        "--prefix ord\n  walstream streams delete orders\n"
        "  walstream streams move orders --to 2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    streams_commands = streams.add_subparsers(
        dest="streams_command", metavar="ACTION", required=True
    )
    create = add_command(
        streams_commands,
        "create",
        "create a stream",
        cmd_streams_create,
        common,
        "examples:\n  walstream streams create orders\n"
        "  walstream streams create orders-1 orders-2 orders-3\n"
        "  walstream streams create --from-file names.txt",
    )
    create.add_argument(
        "name",
        nargs="*",
        help="the new streams' names (unique among active streams); several are created in "
        "one transaction: all or none",
    )
    create.add_argument(
        "--from-file",
        metavar="FILE",
        help="also create the names in FILE, one per line ('-': stdin), in transactions of "
        f"{CREATE_CHUNK:,} (each all or none; progress on stderr)",
    )
    _add_config_options(create)
    configure = add_command(
        streams_commands,
        "config",
        "show or change a stream's configuration (retention, timestamping, …)",
        cmd_streams_config,
        common,
        "examples:\n  walstream streams config orders\n"
        "  walstream streams config orders --retention 7d --timestamping arrival\n"
        "  walstream streams config orders --retention infinite",
    )
    configure.add_argument("name", help="stream name (or #ID)")
    _add_config_options(configure)
    configure.add_argument("--json", action="store_true", help="one JSON object")
    listing = add_command(
        streams_commands,
        "list",
        "list active streams",
        cmd_streams_list,
        common,
        "examples:\n  walstream streams list --prefix orders-\n"
        "  walstream streams list --limit 100 --start-after orders-099",
    )
    listing.add_argument("--prefix", default="", help="only streams whose name starts with it")
    listing.add_argument(
        "--start-after",
        metavar="NAME",
        help="start after this name (or #ID for a stream without a name): the value a "
        "listing cut by --limit prints on stderr. Order: streams without a name by id, then "
        "names in byte order",
    )
    listing.add_argument(
        "--limit",
        type=at_least(1),
        help=f"list at most this many (default: all, read {LIST_PAGE:,} per page)",
    )
    listing.add_argument(
        "--json",
        action="store_true",
        help="JSON lines: one JSON object per stream per line (not one JSON array)",
    )
    delete = add_command(
        streams_commands,
        "delete",
        "delete a stream and its data",
        cmd_streams_delete,
        common,
        "example:\n  walstream streams delete orders",
    )
    delete.add_argument("name", help="stream name (or #ID)")
    add_move_command(streams_commands, common)

    # append
    append = add_command(
        commands,
        "append",
        "append one record per input line (stdin or --file); prints the offsets of each batch",
        cmd_append,
        common,
        "examples:\n  echo hello | walstream append orders\n"
        "  walstream append orders --file events.txt --batch 1000 --key k1\n"
        "  walstream append orders -i events.txt -b 1000 -k k1\n\n"
        "Each line (without its newline) becomes one record's value. Batches are appended\n"
        "atomically and printed as 'offsets FIRST..LAST'. Reading a file shows a progress bar\n"
        "on stderr.",
    )
    append.add_argument("stream", help="stream name (or #ID)")
    append.add_argument(
        "--file", "-i", metavar="F", help="read lines from this file, not stdin (-i: input)"
    )
    # The former short spelling: -f means --follow elsewhere, so it is kept but not advertised.
    append.add_argument("-f", dest="file", metavar="F", help=argparse.SUPPRESS)
    append.add_argument("--key", "-k", metavar="K", help="key of every appended record")
    append.add_argument(
        "--header",
        action="append",
        type=_header,
        default=[],
        metavar="NAME=VALUE",
        help="a header on every record (repeatable)",
    )
    append.add_argument(
        "--batch",
        "-b",
        type=at_least(1),
        default=DEFAULT_APPEND_BATCH,
        metavar="N",
        help=f"records per atomic batch (default {DEFAULT_APPEND_BATCH})",
    )
    append.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_encryption_key(append)

    # read
    read = add_command(
        commands,
        "read",
        "print records of a stream up to its current tail",
        cmd_read,
        common,
        "examples:\n  walstream read orders                 # from the first readable offset\n"
        "  walstream read orders --start 100 --limit 10\n"
        "  walstream read orders --tail-offset 5 --format json   # the last 5 records\n"
        "  walstream read orders --from-timestamp 1700000000000",
    )
    read.add_argument("stream", help="stream name (or #ID)")
    position = read.add_mutually_exclusive_group()
    position.add_argument(
        "--start",
        type=at_least(0),
        metavar="N",
        help="first offset to read (default: the first readable offset)",
    )
    position.add_argument(
        "--from-timestamp",
        type=int,
        metavar="MS",
        help="start at the first record with timestamp_ms >= MS",
    )
    position.add_argument(
        "--tail-offset",
        type=at_least(0),
        metavar="N",
        help="start N records before the tail: the last N records (all of them when fewer "
        "are readable)",
    )
    read.add_argument(
        "--limit", "-n", type=at_least(0), metavar="N", help="print at most N records"
    )
    add_format(read)
    _add_encryption_key(read)

    # tail
    tail = add_command(
        commands,
        "tail",
        "print the last records of a stream; with -f keep following",
        cmd_tail,
        common,
        "examples:\n  walstream tail orders            # the last 10 records\n"
        "  walstream tail orders -f         # then follow new records until Ctrl-C\n"
        "  walstream tail orders -f --start 0\n\n"
        "With -f the node is never taken over, so appends from other processes keep working:\n"
        "while `walstream serve` runs the node, tail follows every acknowledged record through\n"
        "its HTTP API; otherwise it follows committed records read-only, which show up once\n"
        "the writing node uploads them (within upload.max_interval, 250ms by default, while it\n"
        "runs; at the latest when it closes) and says so on stderr.",
    )
    tail.add_argument("stream", help="stream name (or #ID)")
    tail.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new records as they are appended, until Ctrl-C (exits 0); never "
        "takes the node, so writers keep running",
    )
    tail.add_argument(
        "--start",
        type=at_least(0),
        metavar="N",
        help="begin at offset N instead of the last --lines records",
    )
    tail.add_argument(
        "-n",
        "--lines",
        type=at_least(0),
        default=DEFAULT_TAIL_LINES,
        metavar="N",
        help=f"print the last N records first, paging through as many reads as that takes; "
        f"all of them when the stream holds fewer (default {DEFAULT_TAIL_LINES})",
    )
    add_format(tail)
    _add_encryption_key(tail)

    # trim
    trim = add_command(
        commands,
        "trim",
        "make every offset before OFFSET unreadable",
        cmd_trim,
        common,
        "example:\n  walstream trim orders 1000\n\n"
        "Trimming only moves the first readable offset forward: an OFFSET at or before it\n"
        "trims nothing, says so ('nothing trimmed: ... already starts at offset N') and\n"
        "exits 0. An OFFSET beyond the tail is an error (exit 1).",
    )
    trim.add_argument("stream", help="stream name (or #ID)")
    trim.add_argument("offset", type=at_least(0), help="the new first readable offset")
