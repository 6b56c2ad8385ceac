"""The in-process engine against Redis Streams, in the same run, on the same disk.

Two measurements, each against its peer:

- **appends**: ``--clients`` (64) concurrent clients, each appending single 1 KiB records to its
  own stream, closed loop, for ``--seconds``. walstream: one in-process node (ebs WAL file with
  O_DIRECT + O_DSYNC, local object store, SQLite metadata; uploads run as usual) on uvloop
  when it is installed (``--asyncio``: the standard loop), with ``walstream.tune_gc()`` applied
  once the node is open — the set-up docs/guides/python.md recommends for a process that runs a
  node; the latency of an append is from the call to its acknowledgement. Redis: ``redis-server`` with
  ``appendonly yes`` + ``appendfsync always`` (every write fsynced before the reply) in a temp
  folder on the same disk, driven by ``redis-benchmark`` (C) with the same number of
  connections, XADD of a 1 KiB value to one of 64 streams.
- **tail visibility**: one writer appends a 1 KiB record every ``--tail-interval`` (1 ms); a
  reader long-polls the stream (``read(start, wait=5)``); the latency is from the writer's
  acknowledgement to the reader holding the record (0 when the reader had it first: a read
  waiting at the tail is woken by the acknowledgement itself, ahead of the appender, so walstream's
  row reads 0). Beside it, ``from call``: from the append call to the reader holding the record,
  the whole path a tailing reader waits for (the write made durable, then delivered). Redis: the
  same over ``XADD`` and ``XREAD BLOCK`` from redis-py.

Each measurement runs ``--runs`` times; the table shows medians and the ratios to Redis. JSON
goes to ``bench/results/engine_local.json`` and a plot to ``bench/results/engine_local.png``.

    .venv/bin/python bench/engine_local.py --quick            # 3 runs of 2 s
    .venv/bin/python bench/engine_local.py                    # 5 runs of 5 s
    .venv/bin/python bench/engine_local.py --quick --asyncio  # the same on asyncio's own loop
    .venv/bin/python bench/engine_local.py --quick --profile  # + cProfile of one engine run
    .venv/bin/python bench/engine_local.py --tail-only        # only walstream's tail visibility

``--tail-only`` runs walstream's tail measurement alone (no appends, no Redis, so neither
``redis-server`` nor ``redis-benchmark`` is needed), with ``walstream.tune_gc()`` applied once
before the first run as the appends measurement would have; for comparing engine changes. Its
JSON goes to ``bench/results/engine_local_tail.json`` (no plot), so it never replaces a full run's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import csv
import errno
import io
import json
import os
import platform
import pstats
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import _profile
from walstream import Client, Record, tune_gc
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream_wal_ebs import EbsWal
from walstream_wal_ebs.layout import RECORD_AREA_START

RESULTS = Path(__file__).resolve().parent / "results"
VALUE_BYTES = 1024
WAL_BYTES = 256 << 20


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def summary(latencies: list[float], count: int, elapsed: float) -> dict[str, float]:
    latencies.sort()
    return {
        "records_per_s": count / elapsed if elapsed else 0.0,
        "p50_ms": percentile(latencies, 0.50) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "p999_ms": percentile(latencies, 0.999) * 1e3,
    }


def tail_summary(
    sent: dict[Any, float], acked: dict[Any, float], seen: dict[Any, float]
) -> dict[str, float]:
    """Ack → visible (0 when the reader had the record first) and, beside it, the whole path a
    tailing reader waits for: from the append call (made durable, then delivered) to the reader."""
    latencies = [max(0.0, seen[key] - acked[key]) for key in acked]
    from_call = summary([seen[key] - sent[key] for key in sent], len(sent), 0.0)
    return {
        **summary(latencies, len(latencies), 0.0),
        "from_call_p50_ms": from_call["p50_ms"],
        "from_call_p99_ms": from_call["p99_ms"],
    }


def run_loop(main: Callable[[], Coroutine[Any, Any, Any]], use_uvloop: bool) -> Any:
    if use_uvloop:
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


# -- walstream ------------------------------------------------------------------------------------


def new_client(folder: Path) -> Client:
    return Client(
        wal=EbsWal(folder / "wal.img", capacity_bytes=WAL_BYTES),
        objects=LocalObjectStore(folder / "objects"),
        metadata=SqliteMetadataStore(folder / "metadata.db"),
    )


def pretouch(folder: Path) -> None:
    """Write the WAL's record area once, so no run pays for first-touch extents (as in
    ``bench/wal_ebs.py``)."""

    async def format_wal() -> None:
        client = new_client(folder)
        await client.start()
        await client.close()
        await client.objects.close()
        await client.metadata.close()

    asyncio.run(format_wal())
    subprocess.run(
        [
            "fio",
            "--name=pretouch",
            f"--filename={folder / 'wal.img'}",
            "--direct=1",
            f"--offset={RECORD_AREA_START}",
            f"--size={WAL_BYTES - RECORD_AREA_START}",
            "--rw=write",
            "--bs=1m",
            "--iodepth=8",
            "--ioengine=libaio",
        ],
        capture_output=True,
        check=True,
    )


async def engine_appends(folder: Path, clients: int, seconds: float) -> dict[str, float]:
    client = new_client(folder)
    await client.start()
    tune_gc()  # as docs/guides/python.md recommends for a process that runs a node
    try:
        run = time.monotonic_ns()
        streams = [await client.create_stream(f"a-{run}-{index}") for index in range(clients)]
        value = os.urandom(VALUE_BYTES)
        latencies: list[float] = []
        stop_at = time.perf_counter() + seconds

        async def appender(stream: Any) -> None:
            while time.perf_counter() < stop_at:
                started = time.perf_counter()
                await stream.append([Record(value)])
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(appender(stream) for stream in streams))
        elapsed = time.perf_counter() - started
    finally:
        await client.close()
        await client.objects.close()
        await client.metadata.close()
    return summary(latencies, len(latencies), elapsed)


async def engine_tail(folder: Path, records: int, interval: float) -> dict[str, float]:
    client = new_client(folder)
    await client.start()
    try:
        stream = await client.create_stream(f"t-{time.monotonic_ns()}")
        value = os.urandom(VALUE_BYTES)
        sent: dict[int, float] = {}
        acked: dict[int, float] = {}
        seen: dict[int, float] = {}

        async def reader() -> None:
            position = await stream.check_tail()
            while len(seen) < records:
                result = await stream.read(start=position, wait=5.0)
                now = time.perf_counter()
                for record in result.records:
                    seen[record.offset] = now
                if result.records:
                    position = result.records[-1].offset + 1

        async def writer() -> None:
            for _ in range(records):
                called = time.perf_counter()
                ack = await stream.append([Record(value)])
                acked[ack.start] = time.perf_counter()
                sent[ack.start] = called
                await asyncio.sleep(interval)

        await asyncio.gather(reader(), writer())
    finally:
        await client.close()
        await client.objects.close()
        await client.metadata.close()
    return tail_summary(sent, acked, seen)


# -- Redis ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[int]:
    """``redis-server`` with every write fsynced before its reply, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(folder / "redis.log"),
        ],
    )
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
                break
            time.sleep(0.02)
        else:
            raise SystemExit(f"redis-server did not listen on {port}; see {folder}/redis.log")
        yield port
    finally:
        server.terminate()
        server.wait(10)


def redis_appends(port: int, clients: int, requests: int) -> dict[str, float]:
    value = "v" * VALUE_BYTES
    output = subprocess.run(
        [
            "redis-benchmark",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-c",
            str(clients),
            "-n",
            str(requests),
            "-r",
            "64",
            "--csv",
            "XADD",
            "s:__rand_int__",
            "*",
            "v",
            value,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row = next(csv.DictReader(io.StringIO(output)))
    return {
        "records_per_s": float(row["rps"]),
        "p50_ms": float(row["p50_latency_ms"]),
        "p99_ms": float(row["p99_latency_ms"]),
        "p999_ms": float("nan"),  # redis-benchmark reports no p99.9
    }


async def redis_tail(port: int, records: int, interval: float) -> dict[str, float]:
    import redis.asyncio as redis

    writer_conn = redis.Redis(host="127.0.0.1", port=port)
    reader_conn = redis.Redis(host="127.0.0.1", port=port)
    key = f"t-{time.monotonic_ns()}"
    value = os.urandom(VALUE_BYTES)
    sent: dict[bytes, float] = {}
    acked: dict[bytes, float] = {}
    seen: dict[bytes, float] = {}

    async def reader() -> None:
        last = b"0-0"
        while len(seen) < records:
            answer = await reader_conn.xread({key: last}, block=5000)
            now = time.perf_counter()
            for _, entries in answer:
                for entry_id, _fields in entries:
                    seen[entry_id] = now
                    last = entry_id

    async def writer() -> None:
        for _ in range(records):
            called = time.perf_counter()
            entry_id = await writer_conn.xadd(key, {"v": value})
            acked[entry_id] = time.perf_counter()
            sent[entry_id] = called
            await asyncio.sleep(interval)

    try:
        await asyncio.gather(reader(), writer())
    finally:
        await writer_conn.aclose()
        await reader_conn.aclose()
    return tail_summary(sent, acked, seen)


# -- report ---------------------------------------------------------------------------------------


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def plot(path: Path, results: dict[str, dict[str, float]], ratios: dict[str, float]) -> bool:
    """Write the PNG; False (and no file) when matplotlib is not installed."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(12, 4))
    names = ("walstream", "redis")
    colors = ("tab:blue", "tab:red")
    axes[0].bar(names, [results[f"{n}_appends"]["records_per_s"] for n in names], color=colors)
    axes[0].set_title("64 clients x 1 KiB appends (rec/s)")
    for offset, (metric, label) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"))):
        values = [results[f"{n}_appends"][metric] for n in names]
        axes[1].bar([x + offset * 0.4 for x in range(2)], values, 0.4, label=label)
    axes[1].set_xticks([0.2, 1.2], names)
    axes[1].set_title("append latency (ms)")
    axes[1].legend()
    for offset, (metric, label) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"))):
        values = [results[f"{n}_tail"][metric] for n in names]
        axes[2].bar([x + offset * 0.4 for x in range(2)], values, 0.4, label=label)
    axes[2].set_xticks([0.2, 1.2], names)
    axes[2].set_title("ack -> visible to a tailing reader (ms)")
    axes[2].legend()
    figure.suptitle(
        f"throughput {ratios['throughput_over_redis']:.2f}x Redis, "
        f"p99 {ratios['p99_over_redis_p99']:.2f}x Redis p99"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs of 2 s")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="folder for data files")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--tail-records", type=int)
    parser.add_argument("--tail-interval", type=float, default=0.001)
    parser.add_argument(
        "--asyncio",
        dest="uvloop",
        action="store_false",
        help="run walstream on asyncio's own event loop (default: uvloop when installed)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one engine run")
    parser.add_argument(
        "--tail-only",
        action="store_true",
        help="only walstream's tail visibility (no appends, no Redis)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        help="default: bench/results/engine_local.json (--tail-only: engine_local_tail.json)",
    )
    args = parser.parse_args()
    if args.json is None:
        args.json = RESULTS / ("engine_local_tail.json" if args.tail_only else "engine_local.json")
    if args.uvloop:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            args.uvloop = False
    runs = args.runs or (3 if args.quick else 5)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    tail_records = args.tail_records or (500 if args.quick else 2000)
    tools = ("fio",) if args.tail_only else ("fio", "redis-server", "redis-benchmark")
    for tool in tools:
        if shutil.which(tool) is None:
            # Reported by bench/run_all.py as skipped (Debian packages fio, redis-server).
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), tool)

    workdir = Path(tempfile.mkdtemp(prefix="walstream-engine-bench-", dir=args.dir))
    raw: dict[str, list[dict[str, float]]] = {}
    profile_text = ""
    try:
        node = workdir / "node"
        node.mkdir()
        pretouch(node)
        if args.tail_only:
            tune_gc()  # as engine_appends does before the tail runs of a full run
            for run in range(runs):
                raw.setdefault("walstream_tail", []).append(
                    run_loop(
                        lambda: engine_tail(node, tail_records, args.tail_interval), args.uvloop
                    )
                )
                print(f"run {run + 1}/{runs} done", flush=True)
        else:
            with redis_server(workdir / "redis") as port:
                for run in range(runs):
                    with _profile.measured("engine_appends"):
                        appends = run_loop(
                            lambda: engine_appends(node, args.clients, seconds), args.uvloop
                        )
                    raw.setdefault("walstream_appends", []).append(appends)
                    # As many requests as walstream managed in the same time, at least 20k.
                    requests = max(
                        20_000, int(raw["walstream_appends"][-1]["records_per_s"] * seconds)
                    )
                    raw.setdefault("redis_appends", []).append(
                        redis_appends(port, args.clients, requests)
                    )
                    raw.setdefault("walstream_tail", []).append(
                        run_loop(
                            lambda: engine_tail(node, tail_records, args.tail_interval),
                            args.uvloop,
                        )
                    )
                    raw.setdefault("redis_tail", []).append(
                        asyncio.run(redis_tail(port, tail_records, args.tail_interval))
                    )
                    print(f"run {run + 1}/{runs} done", flush=True)
        if args.profile and not args.tail_only:
            profiler = cProfile.Profile()
            profiler.enable()
            run_loop(lambda: engine_appends(node, args.clients, seconds), args.uvloop)
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            profile_text = text.getvalue()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    results = {name: median_of(values) for name, values in raw.items()}
    ratios = (
        {"tail_p99_ms": results["walstream_tail"]["p99_ms"]}
        if args.tail_only
        else {
            "throughput_over_redis": results["walstream_appends"]["records_per_s"]
            / results["redis_appends"]["records_per_s"],
            "p99_over_redis_p99": results["walstream_appends"]["p99_ms"]
            / results["redis_appends"]["p99_ms"],
            "tail_p99_ms": results["walstream_tail"]["p99_ms"],
            "tail_p99_over_redis_tail_p99": results["walstream_tail"]["p99_ms"]
            / max(results["redis_tail"]["p99_ms"], 1e-6),
            "tail_from_call_p99_over_redis": results["walstream_tail"]["from_call_p99_ms"]
            / max(results["redis_tail"]["from_call_p99_ms"], 1e-6),
        }
    )
    loop_name = "uvloop" if args.uvloop else "asyncio"
    if args.tail_only:
        print(
            f"\nin-process engine, tail visibility only, on {args.dir} ({runs} runs x "
            f"{tail_records} records every {args.tail_interval * 1e3:g} ms, medians; "
            f"walstream on {loop_name})"
        )
    else:
        print(
            f"\nin-process engine vs Redis on {args.dir} ({'quick' if args.quick else 'full'}: "
            f"{runs} runs x {seconds:g} s, medians; {args.clients} clients x {VALUE_BYTES} B; "
            f"walstream on {loop_name})"
        )
    print(f"{'case':<22}{'rec/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'p999 ms':>10}")
    for name, row in results.items():
        rate = f"{row['records_per_s']:>12.0f}" if "appends" in name else f"{'-':>12}"
        print(
            f"{name:<22}{rate}{row['p50_ms']:>10.3f}{row['p99_ms']:>10.3f}{row['p999_ms']:>10.3f}"
        )
    for name, row in results.items():
        if "from_call_p99_ms" in row:
            print(
                f"{name.replace('_tail', '_from_call'):<22}{'-':>12}{row['from_call_p50_ms']:>10.3f}"
                f"{row['from_call_p99_ms']:>10.3f}{'-':>10}"
            )
    print("\nratios (targets: throughput >= 1.0x Redis, p99 <= 2x Redis p99, tail p99 <= 1 ms)")
    for name, value in ratios.items():
        print(f"  {name:<32}{value:>10.2f}")
    if profile_text:
        print("\ncProfile of one engine append run (top by own time):")
        print(profile_text)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "benchmark": "engine_local",
                "quick": args.quick,
                "tail_only": args.tail_only,
                "runs": runs,
                "seconds_per_measurement": seconds,
                "clients": args.clients,
                "value_bytes": VALUE_BYTES,
                "loop": loop_name,
                "host": {
                    "machine": platform.machine(),
                    "kernel": platform.release(),
                    "cpus": os.cpu_count(),
                    "folder": args.dir,
                },
                "results": results,
                "ratios": ratios,
                "raw": raw,
            },
            indent=2,
        )
    )
    png = args.json.with_suffix(".png")
    if args.tail_only:
        print(f"\nwrote {args.json}")
        return
    drawn = plot(png, results, ratios)
    print(f"\nwrote {args.json}" + (f" and {png}" if drawn else " (no PNG: matplotlib missing)"))


if __name__ == "__main__":
    main()
