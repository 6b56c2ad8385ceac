"""walstream against Redis Streams and NATS JetStream: the same closed-loop append workload, same
machine, same run.

Peers (each server is started by this script on 127.0.0.1 at a free port in a temp folder):

- ``walstream-http``: ``walstream serve`` on the embedded default deployment (ebs WAL file,
  O_DIRECT + O_DSYNC before the acknowledgement), driven over HTTP/1.1 keep-alive. It speaks
  S2's REST API v1 when the server answers it (``POST /v1/streams/{stream}/records`` with the
  ``s2-basin`` header, JSON ``{"records": [{"body": ...}]}``), else the previous walstream API
  (``{"records": [{"value_text": ...}]}``); ``--api`` forces one. The JSON says which ran.
- ``walstream-http-before``: the same, served by another checkout of walstream (``--before
  PATH``: its dists' ``src`` folders go first on the server's ``PYTHONPATH``; the clients and the
  deployment are the same), so a change is measured side by side with the code before it.
- ``walstream-inproc``: the same deployment through ``walstream.open`` in this process (no HTTP),
  which calls ``walstream.tune_gc()`` once the node is open, as docs/guides/python.md recommends
  for a process that runs a node (``walstream serve`` does the same).
- ``redis``: Redis Streams, ``XADD``; ``appendonly yes``, ``appendfsync always`` (the AOF is
  fsynced before a reply is sent: Redis fsyncs once per event-loop turn, so concurrent clients
  share an fsync). A batch is 100 ``XADD`` in one ``MULTI``/``EXEC`` (atomic).
- ``nats``: NATS JetStream, file storage, each publish waits for its PubAck. The installed
  nats-server 2.9 has no ``sync_interval`` (added in 2.10; 2.9 refuses the key) and no other
  fsync-per-message switch: a PubAck means the message is in the file store's write buffer,
  which is written to the OS page cache within milliseconds (coalesced) and fsynced every
  2 minutes (the file store's built-in sync interval) — it survives a crash of the server
  process once written, not a power loss or kernel crash. A batch is 100 publishes in flight at
  once (not atomic: JetStream 2.9 has no atomic batch).
- Controls that show the clients are not the bottleneck: ``http-noop`` (the HTTP client against
  a server that answers every request at once) and ``redis-nofsync`` (``appendfsync no``).

The clients are lean asyncio protocols (``bench/common/clients.py``) with the requests
pre-encoded, driven by the shared closed loop (``bench/common/loadgen.py``): HTTP/1.1 keep-alive
(``--http 2``: h2c with prior knowledge, for a server that speaks it), RESP2 for Redis (redis-py
without hiredis spends more CPU on a 100-command ``MULTI``/``EXEC`` than Redis does) and the core
NATS protocol for JetStream publishes (nats-py's ``js.publish`` makes an inbox, a future and a
JSON decode per message). Streams and the JetStream stream are created with the server's own API
(HTTP, nats-py).

``--rounds N`` measures every peer N times, the order reversed every other round, and reports
the medians over all rounds (before/after comparisons on a shared machine).

Workloads: 1 and 64 clients (each its own connection, all appending to one stream), one 1 KiB
record per append or a batch of 100 x 1 KiB. Each cell runs ``--seconds`` per run, ``--runs``
times; the table shows medians (records/s, p50/p99 of an append call, the CPU this process used
per second, and for a peer served by a child process the user + system CPU that server used
per request, read from ``/proc``) and walstream/Redis ratios.

    .venv/bin/python bench/peers.py            # 3 runs of 3 s per cell
    .venv/bin/python bench/peers.py --quick    # 1 run of 0.7 s per cell (well under a minute)
    .venv/bin/python bench/peers.py --only redis walstream-inproc
    .venv/bin/python bench/peers.py --before ../main --rounds 3 --only walstream-http walstream-http-before

Writes ``bench/results/peers.json`` and ``bench/results/peers.png`` (latency CDFs and
throughput bars).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import cli, noop_http
from common.clients import (
    H2cConnection,
    Http1Connection,
    NatsPublisher,
    RespConnection,
    resp_command,
)
from common.loadgen import Operation, closed_loop
from common.processes import ServerProcess, free_port, process_cpu_s, use_uvloop
from common.report import Column, Table, save_plot, write_results
from common.serve import (
    BASIN,
    PAYLOAD,
    RECORD_BYTES,
    STREAM,
    append_body,
    checkout_environment,
    create_stream_http,
    detect_api,
    embedded_deployment,
    serve_command,
)

BATCH = 100
CLIENTS = (1, 64)
WORKLOADS = [(clients, batch) for batch in (1, BATCH) for clients in CLIENTS]
PEERS = [
    "walstream-http",
    "walstream-http-before",
    "walstream-inproc",
    "redis",
    "nats",
    "http-noop",
    "redis-nofsync",
]
TOOLS = {"redis": "redis-server", "redis-nofsync": "redis-server", "nats": "nats-server"}
"""The server a peer needs installed (it is skipped without it)."""

Cells = dict[str, list[dict[str, Any]]]
"""Per workload, the samples of every run (:meth:`LoopResult.summary`)."""


@dataclass
class Peer:
    """A running peer: ``make(clients, batch)`` opens the connections and returns the operation
    of client i; ``server_pid`` is the server process whose CPU is measured, when there is one."""

    make: Callable[[int, int], Awaitable[Operation]]
    server_pid: int | None = None


PeerContext = Callable[[Path, str, dict[str, Any]], AbstractAsyncContextManager[Peer]]
"""Given the work folder, the ``--api`` choice and the run's info, the running peer."""


def workload_name(clients: int, batch: int) -> str:
    return f"{clients}c x {'1' if batch == 1 else batch} rec"


# -- the peers: each an async context that yields a Peer ------------------------------------------


def http_factory(
    port: int, api: str, connections: list[Any], http_version: str = "1.1"
) -> Callable[[int, int], Awaitable[Operation]]:
    headers = {"content-type": "application/json"}
    if api == "s2":
        headers["s2-basin"] = BASIN
    path = f"/v1/streams/{STREAM}/records"

    async def make(clients: int, batch: int) -> Operation:
        body = append_body(api, batch)
        kind = H2cConnection if http_version == "2" else Http1Connection
        while len(connections) < clients:
            connections.append(await kind.open("127.0.0.1", port))

        async def append(index: int) -> int:
            await connections[index].request("POST", path, body, headers)
            return batch

        return append

    return make


@contextlib.asynccontextmanager
async def walstream_http(
    workdir: Path,
    api_choice: str,
    info: dict[str, Any],
    http_version: str = "1.1",
    checkout: Path | None = None,
) -> AsyncIterator[Peer]:
    server = ServerProcess(
        serve_command(),
        r"listening on http://127\.0\.0\.1:(\d+)",
        cwd=workdir,
        env=checkout_environment(checkout),
    )
    if checkout is not None:
        info["walstream_before"] = str(checkout)
    connections: list[Any] = []
    try:
        api = await detect_api(server.port) if api_choice == "auto" else api_choice
        info["walstream_api"] = api
        await create_stream_http(server.port, api)
        info["walstream_http_version"] = http_version
        yield Peer(http_factory(server.port, api, connections, http_version), server.pid)
    finally:
        for connection in connections:
            connection.close()
        server.stop()


@contextlib.asynccontextmanager
async def http_noop(workdir: Path, api_choice: str, info: dict[str, Any]) -> AsyncIterator[Peer]:
    connections: list[Any] = []
    with ServerProcess(noop_http.command(), r"PORT (\d+)", cwd=workdir) as server:
        try:
            yield Peer(http_factory(server.port, "s2", connections), server.pid)
        finally:
            for connection in connections:
                connection.close()


@contextlib.asynccontextmanager
async def walstream_inproc(
    workdir: Path, api_choice: str, info: dict[str, Any]
) -> AsyncIterator[Peer]:
    import walstream

    async with walstream.open(embedded_deployment(workdir / "walstream-data")) as client:
        stream = await client.create_stream(STREAM)
        walstream.tune_gc()
        info["walstream_inproc_gc"] = "walstream.tune_gc()"

        async def make(clients: int, batch: int) -> Operation:
            records = [walstream.Record(value=PAYLOAD.encode())] * batch

            async def append(index: int) -> int:
                await stream.append(records)
                return batch

            return append

        yield Peer(make)


@contextlib.asynccontextmanager
async def redis_peer(
    workdir: Path, api_choice: str, info: dict[str, Any], *, fsync: str = "always"
) -> AsyncIterator[Peer]:
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
    command += ["--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--protected-mode"]
    command += ["no", "--daemonize", "no"]
    info["redis_version"] = version_of("redis-server")
    connections: list[RespConnection] = []
    xadd = resp_command(b"XADD", STREAM.encode(), b"*", b"v", PAYLOAD.encode())

    async def make(clients: int, batch: int) -> Operation:
        while len(connections) < clients:
            connections.append(await RespConnection.open("127.0.0.1", port))
        if batch == 1:
            commands, replies = xadd, 1
        else:
            # MULTI, the XADDs, EXEC: +OK, one +QUEUED each, then EXEC's array.
            commands = resp_command(b"MULTI") + xadd * batch + resp_command(b"EXEC")
            replies = batch + 2

        async def append(index: int) -> int:
            await connections[index].send(commands, replies)
            return batch

        return append

    with ServerProcess(command, "Ready to accept connections", cwd=workdir, port=port) as server:
        try:
            yield Peer(make, server.pid)
        finally:
            for connection in connections:
                connection.close()


@contextlib.asynccontextmanager
async def nats_peer(workdir: Path, api_choice: str, info: dict[str, Any]) -> AsyncIterator[Peer]:
    import nats
    from nats.js.api import StorageType

    port = free_port()
    config = workdir / "nats.conf"
    store = json.dumps(str(workdir / "js"))
    config.write_text(f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: {store} }}\n")
    info["nats_version"] = version_of("nats-server")
    publishers: list[NatsPublisher] = []
    payload = PAYLOAD.encode()

    async def make(clients: int, batch: int) -> Operation:
        while len(publishers) < clients:
            inbox = f"_INBOX.bench{len(publishers)}"
            publishers.append(await NatsPublisher.open("127.0.0.1", port, inbox))
        frames = [publisher.frames(STREAM, payload, batch) for publisher in publishers]

        async def append(index: int) -> int:
            await publishers[index].publish(frames[index], batch)
            return batch

        return append

    command = ["nats-server", "-c", str(config)]
    with ServerProcess(command, "Server is ready", cwd=workdir, port=port) as server:
        try:
            setup = await nats.connect(f"nats://127.0.0.1:{port}")
            await setup.jetstream().add_stream(
                name=STREAM.upper(), subjects=[STREAM], storage=StorageType.FILE
            )
            await setup.close()
            yield Peer(make, server.pid)
        finally:
            for publisher in publishers:
                publisher.close()


def version_of(server: str) -> str:
    return subprocess.run([server, "--version"], capture_output=True, text=True).stdout.strip()


def peer_context(name: str, http_version: str, before: Path | None) -> PeerContext:
    def http(workdir: Path, api: str, info: dict[str, Any]) -> AbstractAsyncContextManager[Peer]:
        checkout = before if name == "walstream-http-before" else None
        return walstream_http(workdir, api, info, http_version=http_version, checkout=checkout)

    def redis_nofsync(
        workdir: Path, api: str, info: dict[str, Any]
    ) -> AbstractAsyncContextManager[Peer]:
        return redis_peer(workdir, api, info, fsync="no")

    contexts: dict[str, PeerContext] = {
        "walstream-http": http,
        "walstream-http-before": http,
        "walstream-inproc": walstream_inproc,
        "redis": redis_peer,
        "redis-nofsync": redis_nofsync,
        "nats": nats_peer,
        "http-noop": http_noop,
    }
    return contexts[name]


# -- the measurement --------------------------------------------------------------------------------


async def measured_run(
    operation: Operation, clients: int, seconds: float, pid: int | None
) -> dict[str, Any]:
    """One closed-loop run; with a server process, also the CPU it used per request
    (``server_cpu_us``: its user + system time during the run over the requests answered)."""
    before = process_cpu_s(pid) if pid else 0.0
    sample = (await closed_loop(operation, clients, seconds)).summary()
    if pid and sample["requests"]:
        sample["server_cpu_us"] = (process_cpu_s(pid) - before) / sample["requests"] * 1e6
    return sample


async def measure_peer(name: str, args: argparse.Namespace, info: dict[str, Any]) -> Cells:
    """Every workload against one peer (one server for all of them, a fresh temp folder)."""
    cells: Cells = {}
    workdir = Path(tempfile.mkdtemp(prefix=f"peers-{name}-"))
    try:
        context = peer_context(name, args.http, args.before)
        async with context(workdir, args.api, info) as peer:
            for clients, batch in WORKLOADS:
                operation = await peer.make(clients, batch)
                await closed_loop(operation, clients, min(0.2, args.seconds))  # warm up
                cells[workload_name(clients, batch)] = [
                    await measured_run(operation, clients, args.seconds, peer.server_pid)
                    for _ in range(args.runs)
                ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return cells


async def measure(
    args: argparse.Namespace, info: dict[str, Any], skipped: dict[str, str]
) -> dict[str, Cells]:
    """Every peer, ``args.rounds`` times, the order reversed every other round."""
    raw: dict[str, Cells] = {}
    peers = list(args.only or PEERS)
    if args.before is None and "walstream-http-before" in peers:
        peers.remove("walstream-http-before")
        skipped["walstream-http-before"] = "no --before checkout given"
    for round_number in range(args.rounds):
        for peer in peers if round_number % 2 == 0 else peers[::-1]:
            tool = TOOLS.get(peer)
            if tool is not None and shutil.which(tool) is None:
                skipped[peer] = f"{tool} is not installed (apt-get install {tool})"
                print(f"{peer}: skipped, {skipped[peer]}", flush=True)
                continue
            print(f"{peer} (round {round_number + 1} of {args.rounds}) ...", flush=True)
            cells = await measure_peer(peer, args, info)
            for workload, samples in cells.items():
                raw.setdefault(peer, {}).setdefault(workload, []).extend(samples)
    return raw


# -- the report ----------------------------------------------------------------------------------------


Summary = dict[str, dict[str, dict[str, float]]]
"""Per peer and workload, the medians of the runs."""


def summarize(samples: list[dict[str, Any]]) -> dict[str, float]:
    keys = ["records_per_s", "requests_per_s", "p50_ms", "p99_ms", "client_cpu"]
    if all("server_cpu_us" in sample for sample in samples):
        keys.append("server_cpu_us")
    return {key: statistics.median(sample[key] for sample in samples) for key in keys}


TABLE = Table(
    [
        Column("workload", "WORKLOAD", 14, align="<"),
        Column("peer", "PEER", 21, align="<"),
        Column("records_per_s", "RECORDS/S", 11, ",.0f", "<"),
        Column("requests_per_s", "REQ/S", 9, ",.0f", "<"),
        Column("p50_ms", "P50 MS", 8, ".3f", "<"),
        Column("p99_ms", "P99 MS", 8, ".3f", "<"),
        Column("client_cpu", "CPU", 5, ".2f", "<"),
        Column("server_cpu_us", "SERVER US/REQ", 13, ",.0f", "<"),
        Column("vs_redis", "VS REDIS", 8, align="<"),
    ],
    separator="  ",
)


def table_rows(summary: Summary) -> list[dict[str, Any]]:
    """The table's rows: every peer per workload, with its ratios to Redis."""
    rows = []
    for clients, batch in WORKLOADS:
        workload = workload_name(clients, batch)
        redis = summary.get("redis", {}).get(workload)
        for peer, cells in summary.items():
            cell = cells.get(workload)
            if cell is None:
                continue
            ratio = "-"
            if redis and peer != "redis":
                ratio = (
                    f"{cell['records_per_s'] / redis['records_per_s']:.2f}x tput, "
                    f"{cell['p99_ms'] / redis['p99_ms']:.2f}x p99"
                )
            rows.append({"workload": workload, "peer": peer, "server_cpu_us": "-", **cell,
                         "vs_redis": ratio})  # fmt: skip
    return rows


def ratios(summary: Summary) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for peer in ("walstream-http", "walstream-http-before", "walstream-inproc"):
        for workload, cell in summary.get(peer, {}).items():
            redis = summary.get("redis", {}).get(workload)
            if redis:
                out.setdefault(peer, {})[workload] = {
                    "throughput_vs_redis": cell["records_per_s"] / redis["records_per_s"],
                    "p50_vs_redis": cell["p50_ms"] / redis["p50_ms"],
                    "p99_vs_redis": cell["p99_ms"] / redis["p99_ms"],
                }
    return out


def after_vs_before(summary: Summary) -> dict[str, dict[str, float]]:
    """walstream-http / walstream-http-before per workload (records/s, p50, p99, server CPU)."""
    out: dict[str, dict[str, float]] = {}
    before = summary.get("walstream-http-before", {})
    for workload, cell in summary.get("walstream-http", {}).items():
        old = before.get(workload)
        if not old:
            continue
        out[workload] = {
            "records_per_s": cell["records_per_s"] / old["records_per_s"],
            "p50_ms": cell["p50_ms"] / old["p50_ms"],
            "p99_ms": cell["p99_ms"] / old["p99_ms"],
        }
        if "server_cpu_us" in cell and "server_cpu_us" in old:
            out[workload]["server_cpu_us"] = cell["server_cpu_us"] / old["server_cpu_us"]
    return out


def print_report(summary: Summary) -> None:
    print()
    TABLE.print(table_rows(summary))
    compared = after_vs_before(summary)
    if compared:
        print("\nwalstream-http / walstream-http-before (medians):")
    for workload, ratio in compared.items():
        print(
            f"  {workload:<16} records/s {ratio['records_per_s']:.2f}x  "
            f"p50 {ratio['p50_ms']:.2f}x  p99 {ratio['p99_ms']:.2f}x  "
            f"server CPU/req {ratio.get('server_cpu_us', float('nan')):.2f}x"
        )


def draw_latency_cdfs(
    figure: Any, grid: Any, raw: dict[str, Cells], colors: dict[str, str]
) -> None:
    for column, (clients, batch) in enumerate(WORKLOADS):
        workload = workload_name(clients, batch)
        axis = figure.add_subplot(grid[0, column])
        for peer, cells in raw.items():
            if workload not in cells:
                continue
            values = sorted(cells[workload][-1]["latencies_ms"])
            step = max(1, len(values) // 2000)
            shown = values[::step]
            fractions = [(i * step + 1) / len(values) for i in range(len(shown))]
            axis.plot(shown, fractions, label=peer, color=colors[peer])
        axis.set_xscale("log")
        axis.set_title(f"append latency CDF, {workload}")
        axis.set_xlabel("ms (log)")
        axis.grid(True, alpha=0.3)
        if column == 0:
            axis.set_ylabel("fraction of appends")
            axis.legend(fontsize=8)


def draw_throughput(bars: Any, raw: dict[str, Cells], colors: dict[str, str]) -> None:
    peers = [peer for peer in PEERS if peer in raw]
    width = 0.8 / max(1, len(peers))
    for index, peer in enumerate(peers):
        heights = [
            summarize(raw[peer][workload_name(c, b)])["records_per_s"]
            if workload_name(c, b) in raw[peer]
            else 0
            for c, b in WORKLOADS
        ]
        positions = [w + index * width for w in range(len(WORKLOADS))]
        bars.bar(positions, heights, width, label=peer, color=colors[peer])
    bars.set_xticks([w + 0.4 - width / 2 for w in range(len(WORKLOADS))])
    bars.set_xticklabels([workload_name(c, b) for c, b in WORKLOADS])
    bars.set_yscale("log")
    bars.set_ylabel("records/s (log, median)")
    bars.legend(fontsize=8, ncol=len(peers))
    bars.grid(True, axis="y", alpha=0.3)


def plot(raw: dict[str, Cells], path: Path, title: str) -> bool:
    colors = {peer: f"C{i}" for i, peer in enumerate(PEERS)}

    def draw(figure: Any, _: Any) -> None:
        grid = figure.add_gridspec(2, len(WORKLOADS))
        draw_latency_cdfs(figure, grid, raw, colors)
        draw_throughput(figure.add_subplot(grid[1, :]), raw, colors)
        figure.suptitle(title)

    return save_plot(path, draw, figsize=(16, 8.5), columns=0, dpi=90)


def document(
    args: argparse.Namespace,
    raw: dict[str, Cells],
    summary: Summary,
    info: dict[str, Any],
    skipped: dict[str, str],
) -> dict[str, Any]:
    return {
        "benchmark": "peers",
        "mode": cli.mode(args),
        "seconds_per_run": args.seconds,
        "runs": args.runs,
        "rounds": args.rounds,
        "record_bytes": RECORD_BYTES,
        "loop": args.loop,
        "info": info,
        "skipped": skipped,
        "results": summary,
        "ratios_vs_redis": ratios(summary),
        "after_vs_before": after_vs_before(summary),
        "runs_detail": {
            peer: {
                workload: [{k: v for k, v in s.items() if k != "latencies_ms"} for s in samples]
                for workload, samples in cells.items()
            }
            for peer, cells in raw.items()
        },
    }


# -- the command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "peers", quick="1 run of 0.7 s per cell")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per run (default 3)")
    parser.add_argument("--runs", type=int, default=None, help="runs per cell (default 3)")
    parser.add_argument(
        "--api",
        choices=("auto", "s2", "walstream"),
        default="auto",
        help="walstream serve's HTTP API: S2's REST API v1, the previous one, or detect (default)",
    )
    parser.add_argument(
        "--http",
        choices=("1.1", "2"),
        default="1.1",
        help="HTTP version to walstream serve: 1.1 keep-alive (default) or 2 (h2c prior knowledge)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="a checkout of an earlier walstream (e.g. a worktree of main): adds the peer "
        "walstream-http-before, served from its sources",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every peer this many times, alternating the order (medians over all)",
    )
    parser.add_argument("--only", nargs="+", choices=PEERS, metavar="PEER", help=", ".join(PEERS))
    args = parser.parse_args(argv)
    args.seconds = cli.sized(args, args.seconds, full=3.0, quick=0.7, smoke=0.05)
    args.runs = cli.sized(args, args.runs, full=3, quick=1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.loop = use_uvloop()
    info: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    raw = asyncio.run(measure(args, info, skipped))
    summary = {peer: {w: summarize(s) for w, s in cells.items()} for peer, cells in raw.items()}
    print_report(summary)
    title = "appends of 1 KiB records, closed loop (walstream HTTP API: "
    title += f"{info.get('walstream_api', '-')})"
    write_results(
        args.json,
        document(args, raw, summary, info, skipped),
        lambda png: plot(raw, png, title),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
