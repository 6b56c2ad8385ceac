"""Which HTTP server stack should serve walstream: hypercorn, granian (embedded), walstream's own
(``native``: :mod:`walstream.server.hosting_native`, asyncio protocols and httptools) and aiohttp, each
on uvloop in one process that also holds the node (``walstream.open`` on a temp embedded
deployment), serving the same minimal app, over HTTP/1.1 keep-alive and h2c (HTTP/2 with prior
knowledge, no TLS), at 1 and 64 clients.

The app has two routes: ``POST /append`` appends the request body as one record (durable in
the WAL before the answer) and answers ``{"seq_num": N}``; ``POST /noop`` answers the same JSON
without appending (the stack's own cost). hypercorn and granian serve the same ASGI callable;
aiohttp (HTTP/1.1 only) serves the same two routes as handlers. Each server runs in its own
child process (``http_stack.py serve``) so it has a core of its own; the clients are the lean
asyncio protocols of ``bench/_loadgen.py`` (their ceiling: ``bench/peers.py``'s ``http-noop``).

granian runs embedded with ``granian.server.embed.Server`` (granian >= 2.x, "experimental"):
its Rust runtime serves the sockets and calls the ASGI app on the event loop of our process, so
the app reaches the node's client in memory — the requirement for ``walstream serve``.
``native`` serves the same ASGI callable with walstream's listener (h2c on walstream's own
HTTP/2 connection over h2's state machine, as in ``walstream serve``).

    .venv/bin/python bench/http_stack.py            # 3 runs of 3 s per cell
    .venv/bin/python bench/http_stack.py --quick    # 1 run of 0.7 s per cell
    .venv/bin/python bench/http_stack.py --only hypercorn granian

Writes ``bench/results/http_stack.json`` and ``bench/results/http_stack.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _loadgen import (
    H2cConnection,
    Http1Connection,
    ServerProcess,
    closed_loop,
    free_port,
    use_uvloop,
)

RESULTS = Path(__file__).resolve().parent / "results"
STACKS = ["hypercorn", "granian", "native", "aiohttp"]
PROTOCOLS = {
    "hypercorn": ["http1", "h2c"],
    "granian": ["http1", "h2c"],
    "native": ["http1", "h2c"],
    "aiohttp": ["http1"],
}
CLIENTS = (1, 64)
ROUTES = ("append", "noop")
RECORD = os.urandom(1024)


# -- the server side (a child process) ---------------------------------------------------------


def embedded_deployment(root: Path) -> dict[str, Any]:
    return {
        "node": {"id": 1},
        "wal": {"type": "ebs", "path": str(root / "wal.img"), "capacity": "512MiB"},
        "object_store": {"type": "local", "root": str(root / "objects")},
        "metadata": {"type": "sqlite", "path": str(root / "meta.db")},
    }


def make_asgi_app(stream: Any) -> Callable[..., Awaitable[None]]:
    """The minimal ASGI app over an open stream (lifespan events are acknowledged, nothing
    more: the node is opened before the server starts, as ``walstream serve`` would)."""
    import walstream

    noop_body = b'{"seq_num":0}'

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["path"] == "/append":
            ack = await stream.append([walstream.Record(value=body)])
            answer = b'{"seq_num":%d}' % ack.start
        else:
            answer = noop_body
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(answer)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


async def serve(stack: str, root: Path) -> None:
    import walstream

    async with walstream.open(embedded_deployment(root)) as client:
        stream = await client.create_stream("bench")
        app = make_asgi_app(stream)
        port = free_port()
        if stack == "hypercorn":
            from hypercorn.asyncio import serve as hypercorn_serve
            from hypercorn.config import Config

            config = Config()
            config.bind = [f"127.0.0.1:{port}"]
            config.accesslog = None
            config.errorlog = None
            # hypercorn closes a keep-alive connection after 1000 requests by default.
            config.keep_alive_max_requests = 1 << 62
            # ... and after 5 s idle: the 63 connections idle while the 1-client cells run.
            config.keep_alive_timeout = 3600
            task = asyncio.ensure_future(hypercorn_serve(app, config))  # type: ignore[arg-type]
        elif stack == "granian":
            from granian.constants import HTTPModes, Interfaces
            from granian.server.embed import Server

            server = Server(
                app,
                address="127.0.0.1",
                port=port,
                interface=Interfaces.ASGI,
                http=HTTPModes.auto,
                websockets=False,
                log_enabled=False,
            )
            task = asyncio.ensure_future(server.serve())
        elif stack == "native":
            from walstream.server.hosting_native import open_listener
            from walstream.server.limits import ServerLimits

            # The 63 connections idle while the 1-client cells run must stay open.
            limits = ServerLimits(header_timeout_s=3600)
            native = await open_listener(app, "127.0.0.1", port, limits)
            task = asyncio.ensure_future(asyncio.Event().wait())
        elif stack == "aiohttp":
            from aiohttp import web

            async def append(request: web.Request) -> web.Response:
                ack = await stream.append([walstream.Record(value=await request.read())])
                return web.Response(
                    body=b'{"seq_num":%d}' % ack.start, content_type="application/json"
                )

            async def noop(request: web.Request) -> web.Response:
                await request.read()
                return web.Response(body=b'{"seq_num":0}', content_type="application/json")

            web_app = web.Application()
            web_app.add_routes([web.post("/append", append), web.post("/noop", noop)])
            runner = web.AppRunner(web_app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            task = asyncio.ensure_future(asyncio.Event().wait())
        else:
            raise SystemExit(f"unknown stack {stack}")
        for _ in range(200):  # wait until it accepts connections
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.05)
        print(f"PORT {port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal

        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        if stack == "granian":
            server.stop()
        elif stack == "native":
            await native.close(1.0)
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 5)


# -- the client side ---------------------------------------------------------------------------


async def measure_stack(stack: str, seconds: float, runs: int) -> dict[str, list[dict[str, Any]]]:
    cells: dict[str, list[dict[str, Any]]] = {}
    workdir = Path(tempfile.mkdtemp(prefix=f"http-stack-{stack}-"))
    command = [sys.executable, str(Path(__file__).resolve()), "serve", stack, str(workdir / "data")]
    server = ServerProcess(command, r"PORT (\d+)", cwd=workdir)
    try:
        for protocol in PROTOCOLS[stack]:
            kind = H2cConnection if protocol == "h2c" else Http1Connection
            connections = [await kind.open("127.0.0.1", server.port) for _ in range(max(CLIENTS))]
            try:
                for route in ROUTES:
                    path = f"/{route}"

                    async def operation(
                        index: int, path: str = path, pool: list[Any] = connections
                    ) -> int:
                        await pool[index].request(
                            "POST", path, RECORD, {"content-type": "application/octet-stream"}
                        )
                        return 1

                    for clients in CLIENTS:
                        await closed_loop(operation, clients, min(0.2, seconds))
                        cells[f"{protocol} {route} {clients}c"] = [
                            await closed_loop(operation, clients, seconds) for _ in range(runs)
                        ]
            finally:
                for connection in connections:
                    connection.close()
    except BaseException:
        server.stop()
        print(f"{stack} server's log:\n{server.log.read_text()[-3000:]}", file=sys.stderr)
        raise
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return cells


def summarize(samples: list[dict[str, Any]]) -> dict[str, float]:
    return {
        key: statistics.median(sample[key] for sample in samples)
        for key in ("requests_per_s", "p50_ms", "p99_ms", "client_cpu")
    }


def table(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    rows = [("CELL", "STACK", "REQ/S", "P50 MS", "P99 MS", "CLIENT CPU", "VS HYPERCORN")]
    cells = sorted({cell for stack in summary.values() for cell in stack})
    for cell in cells:
        base = summary.get("hypercorn", {}).get(cell)
        for stack, results in summary.items():
            if cell not in results:
                continue
            value = results[cell]
            ratio = "-"
            if base and stack != "hypercorn":
                ratio = (
                    f"{value['requests_per_s'] / base['requests_per_s']:.2f}x tput, "
                    f"{value['p99_ms'] / base['p99_ms']:.2f}x p99"
                )
            rows.append(
                (
                    cell,
                    stack,
                    f"{value['requests_per_s']:,.0f}",
                    f"{value['p50_ms']:.3f}",
                    f"{value['p99_ms']:.3f}",
                    f"{value['client_cpu']:.2f}",
                    ratio,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


def plot(summary: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    try:
        import matplotlib
    except ModuleNotFoundError:
        print(f"no {path.name}: matplotlib is not installed (pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({cell for stack in summary.values() for cell in stack})
    figure, axes = plt.subplots(2, 1, figsize=(14, 8))
    width = 0.8 / max(1, len(summary))
    for index, (stack, results) in enumerate(summary.items()):
        positions = [c + index * width for c in range(len(cells))]
        for axis, key in zip(axes, ("requests_per_s", "p99_ms"), strict=True):
            axis.bar(
                positions,
                [results[cell][key] if cell in results else 0 for cell in cells],
                width,
                label=stack,
                color=f"C{index}",
            )
    for axis, label in zip(axes, ("requests/s (median)", "p99 ms (median)"), strict=True):
        axis.set_xticks([c + 0.4 - width / 2 for c in range(len(cells))])
        axis.set_xticklabels(cells, fontsize=8)
        axis.set_ylabel(label)
        axis.grid(True, axis="y", alpha=0.3)
        axis.legend(fontsize=8)
    axes[1].set_yscale("log")
    figure.suptitle("HTTP stacks on uvloop, one process holding the node; 1 KiB POST")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


async def run(args: argparse.Namespace) -> int:
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for stack in args.only or STACKS:
        print(f"{stack} ...", flush=True)
        raw[stack] = await measure_stack(stack, args.seconds, args.runs)
    summary = {stack: {c: summarize(s) for c, s in cells.items()} for stack, cells in raw.items()}
    print()
    print(table(summary))
    from importlib.metadata import version

    import granian
    import hypercorn  # noqa: F401  (its version is in importlib.metadata)

    document = {
        "benchmark": "http_stack",
        "mode": "quick" if args.quick else "full",
        "seconds_per_run": args.seconds,
        "runs": args.runs,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": {
            "granian": granian.__version__,
            "hypercorn": version("hypercorn"),
            "aiohttp": version("aiohttp"),
            "uvloop": version("uvloop"),
        },
        "results": summary,
        "runs_detail": {
            stack: {
                cell: [{k: v for k, v in s.items() if k != "latencies_ms"} for s in samples]
                for cell, samples in cells.items()
            }
            for stack, cells in raw.items()
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.json or RESULTS / "http_stack.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    png = out.with_suffix(".png")
    png.unlink(missing_ok=True)
    plot(summary, png)
    print(f"\nwrote {out}" + (f" and {png}" if png.exists() else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["serve"]:
        use_uvloop()
        asyncio.run(serve(arguments[1], Path(arguments[2])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 run of 0.7 s per cell")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per run (default 3)")
    parser.add_argument("--runs", type=int, default=None, help="runs per cell (default 3)")
    parser.add_argument(
        "--only", nargs="+", choices=STACKS, metavar="STACK", help=", ".join(STACKS)
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="default bench/results/http_stack.json"
    )
    args = parser.parse_args(arguments)
    args.seconds = args.seconds or (0.7 if args.quick else 3.0)
    args.runs = args.runs or (1 if args.quick else 3)
    use_uvloop()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
