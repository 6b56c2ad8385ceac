"""Commands that run this node in the process: ``recover``, ``demo``, ``serve``, ``bench``.
Each refuses (NodeBusy, exit 2) while another live process runs the node."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from walstream.cli.arguments import add_command, at_least
from walstream.cli.deployments import holding_node
from walstream.cli.output import out, plural
from walstream.cli.runner import EXIT_ERROR, EXIT_OK, EXIT_USAGE, print_error
from walstream.errors import ConfigError

__all__ = [
    "add_commands",
    "add_recover",
    "cmd_bench",
    "cmd_demo",
    "cmd_recover",
    "cmd_serve",
]


# -- commands: recover ----------------------------------------------------------------------------


async def cmd_recover(args: argparse.Namespace) -> int:
    """Recover the node's WAL and stop; with --accept-loss, record what the WAL lost. Refuses
    (NodeBusy, exit 2) while a live process runs the node: recovering would take it over."""
    async with holding_node(args.config):
        return await _recover(args)


async def _recover(args: argparse.Namespace) -> int:
    import walstream
    from walstream.engine.recovery import RecoveryRefused

    try:
        client = await walstream.open(args.config, accept_loss=args.accept_loss)
    except RecoveryRefused as refused:
        print_error(refused, args.verbose)
        return EXIT_USAGE
    try:
        stats = client.recovery
        wal = client.wal.describe()
    finally:
        await client.close()
    assert stats is not None
    out(
        f"node {client.node_id}: recovered {plural(stats.records, 'record')} in "
        f"{plural(stats.batches, 'batch')} from its {wal_summary(wal)} "
        f"({plural(stats.dropped_batches, 'batch')} already committed or stale)"
    )
    for line in wal_details(wal):
        out(line)
    if not stats.loss_detected:
        out("the WAL showed no damage: nothing was lost")
        if args.accept_loss:
            out("nothing to accept: no data-loss gap was recorded")
            return EXIT_USAGE
        out("the WAL was reset and the node stopped")
        return EXIT_OK
    out("damage accepted:")
    for line in stats.loss_lines():
        out(line)
    count = len(stats.recorded_gaps)
    out(
        f"recorded as lost ({count} gap{'' if count == 1 else 's'}; reads raise DataLossError, "
        "the offsets are never reused):"
    )
    for gap in stats.recorded_gaps:
        out(f"  stream {gap.stream_id}: [{gap.start_offset}, {gap.end_offset})")
    out("everything else was committed; the WAL was reset and the node stopped")
    return EXIT_OK


_WAL_LOCATION_KEYS = ("path", "device", "bucket", "prefix", "log_id", "name", "servers", "zones")


def wal_summary(described: Mapping[str, Any]) -> str:
    """``ebs WAL /data/wal.img``: a WAL's type and where it is, from its ``describe()``."""
    kind = described.get("type", "unknown")
    where = [
        _text(described[key])
        for key in _WAL_LOCATION_KEYS
        if described.get(key) not in (None, "", [], {})
    ]
    return f"{kind} WAL" + (f" {' '.join(where)}" if where else "")


def wal_details(described: Mapping[str, Any]) -> list[str]:
    """The rest of a WAL's ``describe()`` as indented ``key  value`` lines."""
    rows = [
        (key, _text(value))
        for key, value in described.items()
        if key != "type" and value not in (None, "", [], {})
    ]
    if not rows:
        return []
    width = max(len(key) for key, _ in rows)
    return ["WAL:", *(f"  {key.ljust(width)}  {value}" for key, value in rows)]


def _text(value: Any) -> str:
    """A describe() value as text: scalars as they are, lists and mappings as compact JSON."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (str, int, float)):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str)


# -- commands: demo / serve / bench --------------------------------------------------------------


async def cmd_demo(args: argparse.Namespace) -> int:
    from walstream.cli import demo

    async with holding_node(args.config):
        return await demo.run_demo(
            config=args.config,
            streams=args.streams,
            records=args.records,
            value_bytes=args.value_bytes,
            batch_records=args.batch,
            progress=not args.no_progress,
        )


async def cmd_serve(args: argparse.Namespace) -> int:
    # The HTTP server stays out of the import path of every other command.
    try:
        from walstream.server import serve as server
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] not in ("h2", "hpack", "httptools", "uvloop"):
            raise
        raise ConfigError(
            f"walstream serve needs {missing.name}; run: pip install 'walstream[server]'"
        ) from None

    def announce(running: Any) -> None:
        auth = "token required" if running.token else "no token"
        out(
            f"walstream serve: node {running.client.node_id} (epoch "
            f"{running.client.node_epoch}) listening on {running.url} ({auth})"
        )
        for name, extra in running.extra_listeners.items():
            out(f"walstream serve: {name} listening on {extra.address}")
        sys.stdout.flush()

    await server.run_until_signalled(
        args.config,
        listen=args.listen,
        token=args.token,
        max_body_bytes=args.max_body_bytes,
        max_wait_s=args.max_wait,
        announce=announce,
    )
    return EXIT_OK


async def cmd_bench(args: argparse.Namespace) -> int:
    from walstream.cli import bench

    async with holding_node(args.config):
        report = await bench.run_bench(
            args.config,
            streams=args.streams,
            records=args.records,
            value_bytes=args.value_bytes,
            batch_records=args.batch,
            concurrency=args.concurrency,
            json_path=args.json,
            keep=args.keep,
            progress=not args.no_progress,
        )
    return EXIT_OK if report.ok else EXIT_ERROR


def _size(text: str) -> int:
    """An argparse type for sizes such as 16MiB."""
    from walstream.config.options import parse_size

    try:
        value = parse_size(text.strip())
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


# -- parser ---------------------------------------------------------------------------------------


def add_recover(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``recover`` to ``commands``."""
    # recover
    recover = add_command(
        commands,
        "recover",
        "recover the node's WAL, commit it and stop; refuses (exit 2) when acknowledged records "
        "were lost, unless --accept-loss",
        cmd_recover,
        common,
        "examples:\n  walstream recover -c deploy.yaml\n"
        "  walstream recover -c deploy.yaml --accept-loss\n\n"
        "Starts the node configured by --config, which recovers its WAL exactly as a normal\n"
        "start does, then stops it. When the WAL shows damage (a damaged region, a record that\n"
        "is not a batch, a gap in a stream's offsets), acknowledged records may be lost: the\n"
        "node refuses, prints the WAL positions and the streams and offsets affected, and\n"
        "changes nothing that matters (records before the damage may be committed).\n"
        "--accept-loss then records each lost range in metadata (reads of it raise\n"
        "DataLossError; its offsets are never reused), commits everything valid and resets\n"
        "the WAL.\n\n"
        "Exit status: 0 recovered (and with --accept-loss: the loss recorded); 2 refused\n"
        "(damage found, no --accept-loss), or --accept-loss found nothing to accept;\n"
        "1 another error.",
    )
    recover.add_argument(
        "--accept-loss",
        action="store_true",
        help="record the lost ranges as data-loss gaps and start anyway (an operator's "
        "decision: the records are gone)",
    )


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``demo``, ``serve`` and ``bench`` to ``commands``."""
    # demo
    demo = add_command(
        commands,
        "demo",
        "append a generated workload to a few streams, read it back, restart, verify again "
        "and print a summary (what `make run` runs)",
        cmd_demo,
        common,
        "examples:\n  walstream demo\n  walstream demo --streams 3 --records 20000 "
        "--value-bytes 256\n  walstream demo --config deploy.yaml",
    )
    demo.add_argument(
        "--streams",
        type=at_least(1),
        default=3,
        metavar="N",
        help="streams written concurrently (default 3)",
    )
    demo.add_argument(
        "--records",
        type=at_least(1),
        default=20_000,
        metavar="N",
        help="records per stream (default 20000)",
    )
    demo.add_argument(
        "--value-bytes",
        type=at_least(1),
        default=256,
        metavar="N",
        help="bytes per record value (default 256)",
    )
    demo.add_argument(
        "--batch",
        type=at_least(1),
        default=100,
        metavar="N",
        help="records per append (default 100)",
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")

    serve = add_command(
        commands,
        "serve",
        "serve this node over HTTP with S2's REST API v1 (basins, streams, append, read, "
        "long polls, SSE and S2S sessions; health, Prometheus metrics) until SIGTERM or Ctrl-C",
        cmd_serve,
        common,
        "examples:\n  walstream serve -c deploy.yaml\n"
        "  WALSTREAM_TOKEN=s3cret walstream serve -c deploy.yaml --listen 0.0.0.0:7400\n\n"
        "  curl -s localhost:7400/health\n"
        "  curl -s -H 'Authorization: Bearer s3cret' -H 's2-basin: walstream' "
        '-d \'{"stream": "orders"}\' localhost:7400/v1/streams\n'
        "  curl -s -H 'Authorization: Bearer s3cret' -H 's2-basin: walstream' \\\n"
        '       -d \'{"records": [{"body": "hello"}]}\' '
        "localhost:7400/v1/streams/orders/records\n"
        "  curl -s -H 'Authorization: Bearer s3cret' -H 's2-basin: walstream' "
        "'localhost:7400/v1/streams/orders/records?seq_num=0&wait=30'\n\n"
        "S2's SDKs work against it (HTTP/1.1 and cleartext HTTP/2 on one port): point their\n"
        "account and basin endpoints at http://host:7400. The basin 'walstream' holds every\n"
        "stream under its own name; other basins are made with POST /v1/basins.\n"
        "Listens on server.listen of the deployment (default 127.0.0.1:7400). The token is\n"
        "--token, else $WALSTREAM_TOKEN, else server.token; without one there is no\n"
        "authentication. SIGTERM or SIGINT stops accepting, answers long polls, then closes\n"
        "the node (uploading everything acknowledged) and exits 0. The routes are listed in\n"
        "docs/reference/http-api.md, in /openapi.json and in the walstream.server.s2 package. Timeouts and bounds of slow or greedy\n"
        "clients come from the server section (header_timeout, body_timeout, send_timeout,\n"
        "max_connections and max_connections_per_address, max_long_polls, max_output,\n"
        "the HTTP/2 reset and control-frame budgets); server.tls serves HTTPS (HTTP/1.1\n"
        "and HTTP/2 by ALPN). $WALSTREAM_CLUSTER_SECRET signs the requests between nodes.\n\n"
        "While it runs, the server holds the node lock <metadata file>.node-N.lock with its\n"
        "URL in it: other walstream commands on this deployment go through its HTTP API\n"
        "instead of taking the node over, and a second serve of the same node exits 2\n"
        "(NodeBusy, naming this one).",
    )
    serve.add_argument(
        "--listen", metavar="HOST:PORT", help="overrides server.listen (port 0 picks a free port)"
    )
    serve.add_argument(
        "--token",
        metavar="TOKEN",
        help="bearer token clients must send (default: $WALSTREAM_TOKEN, then server.token)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=_size,
        default=16 << 20,
        metavar="SIZE",
        help="largest request body; larger ones get 413 (default 16MiB)",
    )
    serve.add_argument(
        "--max-wait",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="bound of a long-poll read's wait= (default 60)",
    )

    bench = add_command(
        commands,
        "bench",
        "benchmark appends (records/s, MiB/s, p50/p99/p999 batch latency), then a cold read "
        "back after a client restart; prints a table, optionally writes JSON",
        cmd_bench,
        common,
        "examples:\n  walstream bench\n"
        "  walstream bench --streams 8 --records 200000 --value-bytes 512 --batch 200 "
        "--concurrency 16\n"
        "  walstream -c deploy.yaml bench --json bench.json\n\n"
        "Streams are named bench-<run>-<n> and deleted afterwards unless --keep. Values carry\n"
        "(appender, sequence) so the read back is verified; exit status 1 if it is not intact.",
    )
    bench.add_argument(
        "--streams",
        type=at_least(1),
        default=4,
        metavar="N",
        help="streams to append to (default 4)",
    )
    bench.add_argument(
        "--records",
        type=at_least(1),
        default=50_000,
        metavar="N",
        help="records in total, over all streams (default 50000)",
    )
    bench.add_argument(
        "--value-bytes",
        type=at_least(8),
        default=1024,
        metavar="N",
        help="bytes per record value (default 1024)",
    )
    bench.add_argument(
        "--batch",
        type=at_least(1),
        default=100,
        metavar="N",
        help="records per append (default 100)",
    )
    bench.add_argument(
        "--concurrency",
        type=at_least(1),
        default=8,
        metavar="N",
        help="appenders running at once; appender i writes stream i %% streams (default 8)",
    )
    bench.add_argument("--json", metavar="PATH", help="also write the numbers as JSON here")
    bench.add_argument("--keep", action="store_true", help="keep the bench streams")
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")
