"""Benchmark: the CPU one single-record append costs ``walstream serve`` over HTTP/1.1, split into
its layers, measured in one process so neither the kernel nor a load generator is in it.

The same request bytes (``POST /v1/streams/bench/records``, one 1 KiB record in JSON, as
``bench/peers.py`` sends them) are fed to connections of the native HTTP stack of a
``walstream.server.serve`` running on the embedded default (ebs WAL file, local objects, SQLite;
uvloop, ``walstream.tune_gc()``), 64 connections with one request each in flight, as the peers
run's 64 clients; their answers go to a transport that only counts them. Rows:

- ``bare``: an ``asyncio.Protocol`` with the same parser (httptools) answering a fixed response:
  the least an HTTP request costs in Python on this machine.
- ``no append``: the full HTTP stack and S2 route with the append answered at once with fixed
  positions (``append_positions`` replaced): HTTP parsing, the ASGI exchange, the S2 route, JSON.
- ``append``: the real thing, the records durable in the WAL before each answer.

The requests go in lockstep rounds (one on every connection, then wait for every answer), not
through the shared closed loop: its per-request bookkeeping would be counted in the CPU this
measures. CPU per request is the event loop thread's CPU time (``time.thread_time``) over the
requests;
``process`` adds the node's other threads (SQLite, object writes). Medians of the runs, the
cases alternating within each run. The kernel's share over a real socket (``recv``/``send``,
about 20–35 µs per request here) and the load generator's are not in these numbers — that is
the point: ``bench/peers.py`` measures them together. Table on stdout, JSON in
``bench/results/serve_cpu.json``, plot in ``bench/results/serve_cpu.png``.

    .venv/bin/python bench/serve_cpu.py            # 5 runs of 100 rounds of 64 requests
    .venv/bin/python bench/serve_cpu.py --quick    # 3 runs of 40 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httptools
import walstream
from common import cli
from common.processes import run, uvloop_installed
from common.report import Column, Table, grouped_bars, save_plot, write_results
from common.serve import BASIN, PAYLOAD, STREAM, create_stream_http, embedded_deployment
from walstream.server.http.http1 import Connection
from walstream.server.s2 import fast_append
from walstream.server.serve import serve

CONNECTIONS = 64
CASES = ("bare", "no append", "append")

_BODY = json.dumps({"records": [{"body": PAYLOAD}]}).encode()
REQUEST = (
    f"POST /v1/streams/{STREAM}/records HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    f"content-type: application/json\r\ns2-basin: {BASIN}\r\n"
    f"content-length: {len(_BODY)}\r\n\r\n"
).encode() + _BODY
_BARE_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class CountingTransport:
    """The part of a transport the connections use; an answer wakes the request's waiter."""

    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 40000)) -> None:
        self.answers = 0
        self.waiter: asyncio.Future[None] | None = None
        self.peer = peer

    def write(self, data: bytes) -> None:
        self.answers += 1
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def writelines(self, pieces: list[bytes]) -> None:
        self.write(b"".join(pieces))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class BareProtocol(asyncio.Protocol):
    """httptools and a fixed answer: the floor of an HTTP request in Python."""

    def __init__(self, transport: CountingTransport) -> None:
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.transport.write(_BARE_ANSWER)


Feed = Callable[[bytes], None]


async def measure(feeds: Sequence[tuple[Feed, CountingTransport]], rounds: int) -> dict[str, float]:
    """CPU per request over ``rounds`` rounds of one request on every connection."""
    loop = asyncio.get_running_loop()

    async def one(feed: Feed, transport: CountingTransport) -> None:
        transport.waiter = loop.create_future()
        feed(REQUEST)
        await transport.waiter

    async def run(count: int) -> None:
        for _ in range(count):
            await asyncio.gather(*(one(feed, transport) for feed, transport in feeds))

    await run(max(5, rounds // 5))  # warm up
    requests = rounds * len(feeds)
    thread, process = time.thread_time(), time.process_time()
    await run(rounds)
    return {
        "thread_us": (time.thread_time() - thread) / requests * 1e6,
        "process_us": (time.process_time() - process) / requests * 1e6,
    }


@asynccontextmanager
async def answered_at_once() -> AsyncIterator[None]:
    """The S2 append route with the append itself replaced by fixed positions."""

    Position = tuple[int, int]

    async def constant(*_: Any) -> tuple[Position, Position, Position]:
        return (1, 1), (2, 1), (2, 1)

    # fast_append imports append_positions from walstream.server.s2.appends: its own name is
    # the one the route calls.
    original = fast_append.append_positions  # type: ignore[attr-defined]
    fast_append.append_positions = constant  # type: ignore[attr-defined, assignment]
    try:
        yield
    finally:
        fast_append.append_positions = original  # type: ignore[attr-defined]


async def serve_case(workdir: Path, rounds: int) -> dict[str, float]:
    deployment = dict(embedded_deployment(workdir / "walstream-data"))
    async with serve(deployment, listen="127.0.0.1:0") as running:
        await create_stream_http(running.port, "s2")
        walstream.tune_gc()
        connections: list[tuple[Connection, CountingTransport]] = []
        for number in range(CONNECTIONS):
            connection = Connection(running.listener)  # type: ignore[arg-type]
            # One loopback address per client, as 64 clients would be (the server bounds the
            # connections of one address; nothing is sent anywhere: the transport only counts).
            transport = CountingTransport((f"127.0.1.{number + 1}", 40000))
            connection.connection_made(transport)  # type: ignore[arg-type]
            connections.append((connection, transport))
        try:
            return await measure(
                [(connection.data_received, transport) for connection, transport in connections],
                rounds,
            )
        finally:
            for connection, _ in connections:
                connection.connection_lost(None)


async def bare_case(rounds: int) -> dict[str, float]:
    feeds: list[tuple[Feed, CountingTransport]] = []
    for _ in range(CONNECTIONS):
        transport = CountingTransport()
        feeds.append((BareProtocol(transport).data_received, transport))
    return await measure(feeds, rounds)


async def one_run(rounds: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="walstream-serve-cpu-") as folder:
        workdir = Path(folder)
        bare = await bare_case(rounds)
        async with answered_at_once():
            stubbed = await serve_case(workdir / "stubbed", rounds)
        real = await serve_case(workdir / "real", rounds)
    return {"bare": bare, "no append": stubbed, "append": real}


TABLE = Table(
    [
        Column("case", width=10, align="<"),
        Column("thread_us", "loop thread µs/request", 23, ".1f"),
        Column("process_us", "process µs/request", 19, ".1f"),
        Column("runs", "runs (loop thread)", 30, align="<"),
    ]
)


def measure_runs(runs: int, rounds: int) -> list[dict[str, dict[str, float]]]:
    """``runs`` runs, each of the three cases in turn, on uvloop when it is installed."""
    results = []
    for index in range(runs):
        results.append(run(one_run(rounds)))
        print(f"run {index + 1}/{runs} done", flush=True)
    return results


def rows_of(results: list[dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """Per case, the medians of the runs and the loop thread's figure of every run."""
    rows = []
    for case in CASES:
        threads = [result[case]["thread_us"] for result in results]
        rows.append(
            {
                "case": case,
                "thread_us": statistics.median(threads),
                "process_us": statistics.median(result[case]["process_us"] for result in results),
                "runs": " ".join(f"{value:.0f}" for value in threads),
            }
        )
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    def draw(_: Any, axis: Any) -> None:
        grouped_bars(
            axis,
            [row["case"] for row in rows],
            {
                "loop thread": [row["thread_us"] for row in rows],
                "process": [row["process_us"] for row in rows],
            },
        )
        axis.set_ylabel("CPU µs per request")
        axis.set_title("walstream serve: CPU per HTTP/1.1 append, in process")
        axis.legend()

    return save_plot(path, draw, figsize=(7, 4), dpi=100)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "serve_cpu", quick="3 runs of 40 rounds")
    parser.add_argument("--runs", type=int, default=None, help="runs (default 5, quick 3)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of 64 requests per run")
    args = parser.parse_args(argv)
    args.runs = cli.sized(args, args.runs, full=5, quick=3, smoke=1)
    args.rounds = cli.sized(args, args.rounds, full=100, quick=40, smoke=3)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = measure_runs(args.runs, args.rounds)
    rows = rows_of(results)
    print(f"\nCPU per single-record append over HTTP/1.1, in process ({args.runs} runs, medians)")
    TABLE.print(rows)
    by_case = {row["case"]: row for row in rows}
    layers = by_case["no append"]["thread_us"] - by_case["bare"]["thread_us"]
    engine = by_case["append"]["thread_us"] - by_case["no append"]["thread_us"]
    print(
        f"\nHTTP exchange + S2 route above the bare floor: {layers:.1f} µs; the append: {engine:.1f} µs"
    )
    document = {
        "benchmark": "serve_cpu",
        "mode": cli.mode(args),
        "event_loop": "uvloop" if uvloop_installed() else "asyncio",
        "connections": CONNECTIONS,
        "rounds": args.rounds,
        "rows": rows,
        "runs": results,
        "layers_us": layers,
        "append_us": engine,
    }
    write_results(args.json, document, lambda png: plot(rows, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
