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

The clients are lean asyncio protocols (``bench/_loadgen.py``) with the requests pre-encoded:
HTTP/1.1 keep-alive (``--http 2``: h2c with prior knowledge, for a server that speaks it), RESP2
for Redis (redis-py without hiredis spends more CPU on a 100-command ``MULTI``/``EXEC`` than
Redis does) and the core NATS protocol for JetStream publishes (nats-py's ``js.publish`` makes
an inbox, a future and a JSON decode per message). Streams and the JetStream stream are created
with the server's own API (HTTP, nats-py).

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

Writes ``bench/results/peers.json`` and ``bench/results/peers.png`` (latency CDFs and
throughput bars).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _loadgen import (
    H2cConnection,
    Http1Connection,
    HttpError,
    NatsPublisher,
    RespConnection,
    ServerProcess,
    closed_loop,
    free_port,
    noop_http_server_command,
    resp_command,
    use_uvloop,
)

RESULTS = Path(__file__).resolve().parent / "results"
RECORD_BYTES = 1024
BATCH = 100
CLIENTS = (1, 64)
WORKLOADS = [(clients, batch) for batch in (1, BATCH) for clients in CLIENTS]
#: The dists whose ``src`` folders a ``--before`` checkout serves from.
DIST_SOURCES = (
    "core/src",
    "plugins/src",
    "wal_ebs/src",
    "wal_s3/src",
    "wal_s3express/src",
    "wal_nvme_quorum/src",
    "metadata_postgres/src",
    "conformance/src",
)
PEERS = [
    "walstream-http",
    "walstream-http-before",
    "walstream-inproc",
    "redis",
    "nats",
    "http-noop",
    "redis-nofsync",
]
BASIN = "walstream-bench"
STREAM = "bench"

# Printable ASCII so the same bytes are valid for every peer, S2's raw (UTF-8) format included.
PAYLOAD = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=RECORD_BYTES))

Factory = Callable[[int], Awaitable[Callable[[int], Awaitable[int]]]]
"""Given the number of clients, set up connections and return the operation of client i."""


def workload_name(clients: int, batch: int) -> str:
    return f"{clients}c x {'1' if batch == 1 else batch} rec"


# -- walstream over HTTP ------------------------------------------------------------------------


def walstream_serve_command() -> list[str]:
    """``walstream serve`` on the embedded default deployment (rooted in the working folder)."""
    return [sys.executable, "-m", "walstream.cli", "serve", "--listen", "127.0.0.1:0"]


def checkout_environment(checkout: Path | None) -> dict[str, str] | None:
    """``PYTHONPATH`` that serves walstream from ``checkout`` (None: this one)."""
    if checkout is None:
        return None
    folders = [str(checkout / source) for source in DIST_SOURCES if (checkout / source).is_dir()]
    if not (checkout / "core/src/walstream").is_dir():
        raise SystemExit(f"--before {checkout}: not a walstream checkout (no core/src/walstream)")
    return {"PYTHONPATH": os.pathsep.join(folders)}


async def detect_api(port: int) -> str:
    """``s2`` when ``GET /v1/basins`` answers 2xx, else ``walstream`` (the previous API)."""
    connection = await Http1Connection.open("127.0.0.1", port)
    try:
        await connection.request("GET", "/v1/basins")
        return "s2"
    except HttpError:
        return "walstream"
    finally:
        connection.close()


async def create_stream_http(port: int, api: str) -> None:
    connection = await Http1Connection.open("127.0.0.1", port)
    json_type = {"content-type": "application/json"}
    try:
        if api == "s2":
            for path, body, headers in (
                ("/v1/basins", {"basin": BASIN}, json_type),
                ("/v1/streams", {"stream": STREAM}, {**json_type, "s2-basin": BASIN}),
            ):
                with contextlib.suppress(HttpError):  # 409: it exists already
                    await connection.request("POST", path, json.dumps(body).encode(), headers)
        else:
            await connection.request(
                "POST", "/v1/streams", json.dumps({"name": STREAM}).encode(), json_type
            )
    finally:
        connection.close()


def append_body(api: str, batch: int) -> bytes:
    field = "body" if api == "s2" else "value_text"
    return json.dumps({"records": [{field: PAYLOAD}] * batch}).encode()


def http_factory(port: int, api: str, connections: list[Any], http_version: str = "1.1") -> Factory:
    headers = {"content-type": "application/json"}
    if api == "s2":
        headers["s2-basin"] = BASIN
    path = f"/v1/streams/{STREAM}/records"

    async def make(clients: int, batch: int) -> Callable[[int], Awaitable[int]]:
        body = append_body(api, batch)
        kind = H2cConnection if http_version == "2" else Http1Connection
        while len(connections) < clients:
            connections.append(await kind.open("127.0.0.1", port))

        async def append(index: int) -> int:
            await connections[index].request("POST", path, body, headers)
            return batch

        return append

    return make  # type: ignore[return-value]


# -- peers: each an async context that yields a factory ------------------------------------------


def with_server_pid(make: Factory, server: ServerProcess) -> Factory:
    """``make``, marked with the process id of the server it drives (its CPU is measured)."""
    make.server_pid = server.process.pid  # type: ignore[attr-defined]
    return make


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measured_run(operation: Any, clients: int, seconds: float, pid: int | None) -> Any:
    """One closed-loop run; with a server process, also the CPU it used per request
    (``server_cpu_us``: its user + system time during the run over the requests answered)."""
    before = process_cpu_s(pid) if pid else 0.0
    sample = await closed_loop(operation, clients, seconds)
    if pid and sample["requests"]:
        sample["server_cpu_us"] = (process_cpu_s(pid) - before) / sample["requests"] * 1e6
    return sample


@contextlib.asynccontextmanager
async def walstream_http(
    workdir: Path,
    api_choice: str,
    info: dict[str, Any],
    http_version: str = "1.1",
    checkout: Path | None = None,
) -> AsyncIterator[Any]:
    server = ServerProcess(
        walstream_serve_command(),
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
        yield with_server_pid(http_factory(server.port, api, connections, http_version), server)
    finally:
        for connection in connections:
            connection.close()
        server.stop()


@contextlib.asynccontextmanager
async def http_noop(workdir: Path, api_choice: str, info: dict[str, Any]) -> AsyncIterator[Any]:
    server = ServerProcess(noop_http_server_command(), r"PORT (\d+)", cwd=workdir)
    connections: list[Http1Connection] = []
    try:
        yield with_server_pid(http_factory(server.port, "s2", connections), server)
    finally:
        for connection in connections:
            connection.close()
        server.stop()


def embedded_deployment(root: Path) -> dict[str, Any]:
    """The embedded default of ``walstream.open(None)``, rooted in ``root``."""
    return {
        "node": {"id": 1},
        "wal": {"type": "ebs", "path": str(root / "wal.img"), "capacity": "512MiB"},
        "object_store": {"type": "local", "root": str(root / "objects")},
        "metadata": {"type": "sqlite", "path": str(root / "meta.db")},
    }


@contextlib.asynccontextmanager
async def walstream_inproc(
    workdir: Path, api_choice: str, info: dict[str, Any]
) -> AsyncIterator[Any]:
    import walstream

    async with walstream.open(embedded_deployment(workdir / "walstream-data")) as client:
        stream = await client.create_stream(STREAM)
        walstream.tune_gc()
        info["walstream_inproc_gc"] = "walstream.tune_gc()"

        async def make(clients: int, batch: int) -> Callable[[int], Awaitable[int]]:
            records = [walstream.Record(value=PAYLOAD.encode())] * batch

            async def append(index: int) -> int:
                await stream.append(records)
                return batch

            return append

        yield make


@contextlib.asynccontextmanager
async def redis_peer(
    workdir: Path, api_choice: str, info: dict[str, Any], *, fsync: str = "always"
) -> AsyncIterator[Any]:
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
    command += ["--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--protected-mode"]
    command += ["no", "--daemonize", "no"]
    server = ServerProcess(command, "Ready to accept connections", cwd=workdir, port=port)
    info["redis_version"] = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True
    ).stdout.strip()
    connections: list[RespConnection] = []
    xadd = resp_command(b"XADD", STREAM.encode(), b"*", b"v", PAYLOAD.encode())
    try:

        async def make(clients: int, batch: int) -> Callable[[int], Awaitable[int]]:
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

        yield with_server_pid(make, server)
    finally:
        for connection in connections:
            connection.close()
        server.stop()


@contextlib.asynccontextmanager
async def nats_peer(workdir: Path, api_choice: str, info: dict[str, Any]) -> AsyncIterator[Any]:
    import nats
    from nats.js.api import StorageType

    port = free_port()
    config = workdir / "nats.conf"
    config.write_text(
        f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: {json.dumps(str(workdir / 'js'))} }}\n"
    )
    server = ServerProcess(
        ["nats-server", "-c", str(config)], "Server is ready", cwd=workdir, port=port
    )
    info["nats_version"] = subprocess.run(
        ["nats-server", "--version"], capture_output=True, text=True
    ).stdout.strip()
    publishers: list[NatsPublisher] = []
    payload = PAYLOAD.encode()
    try:
        setup = await nats.connect(f"nats://127.0.0.1:{port}")
        await setup.jetstream().add_stream(
            name=STREAM.upper(), subjects=[STREAM], storage=StorageType.FILE
        )
        await setup.close()

        async def make(clients: int, batch: int) -> Callable[[int], Awaitable[int]]:
            while len(publishers) < clients:
                inbox = f"_INBOX.bench{len(publishers)}"
                publishers.append(await NatsPublisher.open("127.0.0.1", port, inbox))
            frames = [publisher.frames(STREAM, payload, batch) for publisher in publishers]

            async def append(index: int) -> int:
                await publishers[index].publish(frames[index], batch)
                return batch

            return append

        yield with_server_pid(make, server)
    finally:
        for publisher in publishers:
            publisher.close()
        server.stop()


def peer_context(name: str, http_version: str, before: Path | None) -> Callable[..., Any]:
    if name == "walstream-http":
        return lambda *args: walstream_http(*args, http_version=http_version)
    if name == "walstream-http-before":
        return lambda *args: walstream_http(*args, http_version=http_version, checkout=before)
    if name == "redis-nofsync":
        return lambda *args: redis_peer(*args, fsync="no")
    return {
        "walstream-http": walstream_http,
        "walstream-inproc": walstream_inproc,
        "redis": redis_peer,
        "nats": nats_peer,
        "http-noop": http_noop,
    }[name]


# -- running and reporting ---------------------------------------------------------------------


async def measure_peer(
    name: str, args: argparse.Namespace, info: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """Every workload against one peer (one server for all of them, a fresh temp folder)."""
    cells: dict[str, list[dict[str, Any]]] = {}
    workdir = Path(tempfile.mkdtemp(prefix=f"peers-{name}-"))
    try:
        seconds, runs = args.seconds, args.runs
        async with peer_context(name, args.http, args.before)(workdir, args.api, info) as make:
            pid = getattr(make, "server_pid", None)
            for clients, batch in WORKLOADS:
                operation = await make(clients, batch)
                await closed_loop(operation, clients, min(0.2, seconds))  # warm up
                cells[workload_name(clients, batch)] = [
                    await measured_run(operation, clients, seconds, pid) for _ in range(runs)
                ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return cells


def summarize(samples: list[dict[str, Any]]) -> dict[str, float]:
    keys = ["records_per_s", "requests_per_s", "p50_ms", "p99_ms", "client_cpu"]
    if all("server_cpu_us" in sample for sample in samples):
        keys.append("server_cpu_us")
    return {key: statistics.median(sample[key] for sample in samples) for key in keys}


def table(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    rows = [
        (
            "WORKLOAD",
            "PEER",
            "RECORDS/S",
            "REQ/S",
            "P50 MS",
            "P99 MS",
            "CPU",
            "SERVER US/REQ",
            "VS REDIS",
        )
    ]
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
            rows.append(
                (
                    workload,
                    peer,
                    f"{cell['records_per_s']:,.0f}",
                    f"{cell['requests_per_s']:,.0f}",
                    f"{cell['p50_ms']:.3f}",
                    f"{cell['p99_ms']:.3f}",
                    f"{cell['client_cpu']:.2f}",
                    f"{cell['server_cpu_us']:,.0f}" if "server_cpu_us" in cell else "-",
                    ratio,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


def ratios(summary: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
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


def after_vs_before(summary: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
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


def plot(raw: dict[str, dict[str, list[dict[str, Any]]]], path: Path, title: str) -> None:
    try:
        import matplotlib
    except ModuleNotFoundError:
        print(f"no {path.name}: matplotlib is not installed (pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(16, 8.5))
    grid = figure.add_gridspec(2, len(WORKLOADS))
    colors = {peer: f"C{i}" for i, peer in enumerate(PEERS)}
    for column, (clients, batch) in enumerate(WORKLOADS):
        workload = workload_name(clients, batch)
        axis = figure.add_subplot(grid[0, column])
        for peer, cells in raw.items():
            if workload not in cells:
                continue
            values = sorted(cells[workload][-1]["latencies_ms"])
            step = max(1, len(values) // 2000)
            shown = values[::step]
            axis.plot(
                shown,
                [(i * step + 1) / len(values) for i in range(len(shown))],
                label=peer,
                color=colors[peer],
            )
        axis.set_xscale("log")
        axis.set_title(f"append latency CDF, {workload}")
        axis.set_xlabel("ms (log)")
        axis.grid(True, alpha=0.3)
        if column == 0:
            axis.set_ylabel("fraction of appends")
            axis.legend(fontsize=8)
    bars = figure.add_subplot(grid[1, :])
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
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


async def run(args: argparse.Namespace) -> int:
    info: dict[str, Any] = {}
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {}
    skipped: dict[str, str] = {}
    peers = list(args.only or PEERS)
    if args.before is None and "walstream-http-before" in peers:
        peers.remove("walstream-http-before")
        skipped["walstream-http-before"] = "no --before checkout given"
    for round_number in range(args.rounds):
        order = peers if round_number % 2 == 0 else peers[::-1]
        for peer in order:
            tool = {"redis": "redis-server", "redis-nofsync": "redis-server", "nats": "nats-server"}
            if peer in tool and shutil.which(tool[peer]) is None:
                skipped[peer] = f"{tool[peer]} is not installed (apt-get install {tool[peer]})"
                print(f"{peer}: skipped, {skipped[peer]}", flush=True)
                continue
            print(f"{peer} (round {round_number + 1} of {args.rounds}) ...", flush=True)
            cells = await measure_peer(peer, args, info)
            for workload, samples in cells.items():
                raw.setdefault(peer, {}).setdefault(workload, []).extend(samples)
    summary = {peer: {w: summarize(s) for w, s in cells.items()} for peer, cells in raw.items()}
    print()
    print(table(summary))
    compared = after_vs_before(summary)
    if compared:
        print()
        print("walstream-http / walstream-http-before (medians):")
        for workload, ratio in compared.items():
            print(
                f"  {workload:<16} records/s {ratio['records_per_s']:.2f}x  "
                f"p50 {ratio['p50_ms']:.2f}x  p99 {ratio['p99_ms']:.2f}x  "
                f"server CPU/req {ratio.get('server_cpu_us', float('nan')):.2f}x"
            )
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    document = {
        "benchmark": "peers",
        "mode": "quick" if args.quick else "full",
        "seconds_per_run": args.seconds,
        "runs": args.runs,
        "rounds": args.rounds,
        "load_average": list(os.getloadavg()),
        "record_bytes": RECORD_BYTES,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
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
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.json or RESULTS / "peers.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    png = out.with_suffix(".png")
    png.unlink(missing_ok=True)
    api = info.get("walstream_api", "-")
    plot(raw, png, f"appends of 1 KiB records, closed loop (walstream HTTP API: {api})")
    if png.exists():
        print(f"wrote {png}")
    print(f"\nwrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 run of 0.7 s per cell")
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
    parser.add_argument("--json", type=Path, default=None, help="default bench/results/peers.json")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (0.7 if args.quick else 3.0)
    args.runs = args.runs or (1 if args.quick else 3)
    args.loop = use_uvloop()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
