"""The in-process engine against Redis Streams, in the same run, on the same disk.

Two measurements, each against its peer:

- **appends**: ``--clients`` (64) concurrent clients, each appending single 1 KiB records to its
  own stream, closed loop (``bench/common/loadgen.py``), for ``--seconds``. walstream: one
  in-process node (ebs WAL file with O_DIRECT + O_DSYNC, local object store, SQLite metadata;
  uploads run as usual) on uvloop when it is installed (``--asyncio``: the standard loop), with
  ``walstream.tune_gc()`` applied once the node is open — the set-up docs/guides/python.md
  recommends for a process that runs a node; the latency of an append is from the call to its
  acknowledgement. Redis: ``redis-server`` with ``appendonly yes`` + ``appendfsync always``
  (every write fsynced before the reply) in a temp folder on the same disk, driven by
  ``redis-benchmark`` (C) with the same number of connections, XADD of a 1 KiB value to one of
  64 streams.
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
import cProfile
import csv
import io
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import cli, profile
from common.loadgen import closed_loop
from common.processes import ServerProcess, free_port, require_tools, run, uvloop_installed
from common.report import median_of, percentile, save_plot, write_results
from walstream import Client, Record, Stream, tune_gc
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream_wal_ebs import EbsWal
from walstream_wal_ebs.layout import RECORD_AREA_START

VALUE_BYTES = 1024
WAL_BYTES = 256 << 20
SMOKE_WAL_BYTES = 32 << 20


@dataclass
class Options:
    runs: int
    seconds: float
    clients: int
    tail_records: int
    tail_interval: float
    uvloop: bool
    wal_bytes: int = WAL_BYTES
    redis_min_requests: int = 20_000
    """redis-benchmark sends as many requests as walstream managed in the same time, at least
    this many."""


@dataclass
class Runs:
    """Every run's figures by case (``walstream_appends``, ``redis_appends``, ``walstream_tail``,
    ``redis_tail``)."""

    raw: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def add(self, case: str, figures: dict[str, float]) -> None:
        self.raw.setdefault(case, []).append(figures)


def summary(latencies: list[float], count: int, elapsed: float) -> dict[str, float]:
    latencies.sort()
    return {
        "records_per_s": count / elapsed if elapsed else 0.0,
        "p50_ms": percentile(latencies, 0.50, presorted=True) * 1e3,
        "p99_ms": percentile(latencies, 0.99, presorted=True) * 1e3,
        "p999_ms": percentile(latencies, 0.999, presorted=True) * 1e3,
    }


def tail_summary(
    sent: dict[Hashable, float], acked: dict[Hashable, float], seen: dict[Hashable, float]
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


# -- walstream ------------------------------------------------------------------------------------


def new_client(folder: Path, wal_bytes: int) -> Client:
    return Client(
        wal=EbsWal(folder / "wal.img", capacity_bytes=wal_bytes),
        objects=LocalObjectStore(folder / "objects"),
        metadata=SqliteMetadataStore(folder / "metadata.db"),
    )


async def close_client(client: Client) -> None:
    await client.close()
    await client.objects.close()
    await client.metadata.close()


def pretouch(folder: Path, wal_bytes: int) -> None:
    """Write the WAL's record area once, so no run pays for first-touch extents (as in
    ``bench/wal_ebs.py``)."""

    async def format_wal() -> None:
        client = new_client(folder, wal_bytes)
        await client.start()
        await close_client(client)

    asyncio.run(format_wal())
    command = ["fio", "--name=pretouch", f"--filename={folder / 'wal.img'}", "--direct=1"]
    command += [f"--offset={RECORD_AREA_START}", f"--size={wal_bytes - RECORD_AREA_START}"]
    command += ["--rw=write", "--bs=1m", "--iodepth=8", "--ioengine=libaio"]
    subprocess.run(command, capture_output=True, check=True)


async def engine_appends(folder: Path, options: Options) -> dict[str, float]:
    client = new_client(folder, options.wal_bytes)
    await client.start()
    tune_gc()  # as docs/guides/python.md recommends for a process that runs a node
    try:
        run_id = time.monotonic_ns()
        streams = [
            await client.create_stream(f"a-{run_id}-{index}") for index in range(options.clients)
        ]
        record = [Record(os.urandom(VALUE_BYTES))]

        async def append(index: int) -> int:
            await streams[index].append(record)
            return 1

        result = await closed_loop(append, options.clients, options.seconds)
    finally:
        await close_client(client)
    return summary(result.latencies_s, result.operations, result.elapsed_s)


async def engine_tail(folder: Path, options: Options) -> dict[str, float]:
    client = new_client(folder, options.wal_bytes)
    await client.start()
    try:
        stream = await client.create_stream(f"t-{time.monotonic_ns()}")
        return await tail_run(stream, options)
    finally:
        await close_client(client)


async def tail_run(stream: Stream, options: Options) -> dict[str, float]:
    """One writer pacing its appends by ``tail_interval``, one reader long-polling the tail."""
    value = os.urandom(VALUE_BYTES)
    sent: dict[Hashable, float] = {}
    acked: dict[Hashable, float] = {}
    seen: dict[Hashable, float] = {}

    async def reader() -> None:
        position = await stream.check_tail()
        while len(seen) < options.tail_records:
            result = await stream.read(start=position, wait=5.0)
            now = time.perf_counter()
            for record in result.records:
                seen[record.offset] = now
            if result.records:
                position = result.records[-1].offset + 1

    async def writer() -> None:
        for _ in range(options.tail_records):
            called = time.perf_counter()
            ack = await stream.append([Record(value)])
            acked[ack.start] = time.perf_counter()
            sent[ack.start] = called
            await asyncio.sleep(options.tail_interval)

    await asyncio.gather(reader(), writer())
    return tail_summary(sent, acked, seen)


# -- Redis ----------------------------------------------------------------------------------------


@contextmanager
def redis_server(folder: Path) -> Iterator[int]:
    """``redis-server`` with every write fsynced before its reply, in ``folder``; its port."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder)]
    command += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    command += ["--daemonize", "no"]
    with ServerProcess(command, "Ready to accept connections", cwd=folder, port=port):
        yield port


def redis_appends(port: int, clients: int, requests: int) -> dict[str, float]:
    command = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients)]
    command += ["-n", str(requests), "-r", "64", "--csv"]
    command += ["XADD", "s:__rand_int__", "*", "v", "v" * VALUE_BYTES]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    row = next(csv.DictReader(io.StringIO(output)))
    return {
        "records_per_s": float(row["rps"]),
        "p50_ms": float(row["p50_latency_ms"]),
        "p99_ms": float(row["p99_latency_ms"]),
        "p999_ms": float("nan"),  # redis-benchmark reports no p99.9
    }


async def redis_tail(port: int, options: Options) -> dict[str, float]:
    import redis.asyncio as redis

    writer_conn = redis.Redis(host="127.0.0.1", port=port)
    reader_conn = redis.Redis(host="127.0.0.1", port=port)
    key = f"t-{time.monotonic_ns()}"
    value = os.urandom(VALUE_BYTES)
    sent: dict[Hashable, float] = {}
    acked: dict[Hashable, float] = {}
    seen: dict[Hashable, float] = {}

    async def reader() -> None:
        last: Any = b"0-0"
        while len(seen) < options.tail_records:
            answer: Any = await reader_conn.xread({key: last}, block=5000)
            now = time.perf_counter()
            for _, entries in answer:
                for entry_id, _fields in entries:
                    seen[entry_id] = now
                    last = entry_id

    async def writer() -> None:
        for _ in range(options.tail_records):
            called = time.perf_counter()
            entry_id = await writer_conn.xadd(key, {"v": value})
            acked[entry_id] = time.perf_counter()
            sent[entry_id] = called
            await asyncio.sleep(options.tail_interval)

    try:
        await asyncio.gather(reader(), writer())
    finally:
        await writer_conn.aclose()
        await reader_conn.aclose()
    return tail_summary(sent, acked, seen)


# -- the runs -------------------------------------------------------------------------------------


def measure_tail_only(node: Path, options: Options) -> Runs:
    runs = Runs()
    tune_gc()  # as engine_appends does before the tail runs of a full run
    for number in range(options.runs):
        runs.add("walstream_tail", run(engine_tail(node, options), uvloop=options.uvloop))
        print(f"run {number + 1}/{options.runs} done", flush=True)
    return runs


def measure_against_redis(node: Path, redis_folder: Path, options: Options) -> Runs:
    """Each run: walstream's appends, Redis's (as many requests as walstream managed in the same
    time), walstream's tail, Redis's tail."""
    runs = Runs()
    with redis_server(redis_folder) as port:
        for number in range(options.runs):
            with profile.measured("engine_appends"):
                appends = run(engine_appends(node, options), uvloop=options.uvloop)
            runs.add("walstream_appends", appends)
            done = int(appends["records_per_s"] * options.seconds)
            requests = max(options.redis_min_requests, done)
            runs.add("redis_appends", redis_appends(port, options.clients, requests))
            runs.add("walstream_tail", run(engine_tail(node, options), uvloop=options.uvloop))
            runs.add("redis_tail", asyncio.run(redis_tail(port, options)))
            print(f"run {number + 1}/{options.runs} done", flush=True)
    return runs


def cprofile_appends(node: Path, options: Options) -> str:
    """cProfile of one engine append run: the top 25 functions by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    run(engine_appends(node, options), uvloop=options.uvloop)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def measure(args: argparse.Namespace, options: Options) -> tuple[Runs, str]:
    """The runs (and a cProfile text with ``--profile``), in a throwaway folder."""
    workdir = Path(tempfile.mkdtemp(prefix="walstream-engine-bench-", dir=args.dir))
    try:
        node = workdir / "node"
        node.mkdir()
        pretouch(node, options.wal_bytes)
        if args.tail_only:
            return measure_tail_only(node, options), ""
        runs = measure_against_redis(node, workdir / "redis", options)
        return runs, cprofile_appends(node, options) if args.profile else ""
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- the report -----------------------------------------------------------------------------------


def ratios_of(results: dict[str, dict[str, float]], tail_only: bool) -> dict[str, float]:
    ours_tail = results["walstream_tail"]
    if tail_only:
        return {"tail_p99_ms": ours_tail["p99_ms"]}
    ours, redis, redis_tail = (
        results["walstream_appends"],
        results["redis_appends"],
        results["redis_tail"],
    )
    return {
        "throughput_over_redis": ours["records_per_s"] / redis["records_per_s"],
        "p99_over_redis_p99": ours["p99_ms"] / redis["p99_ms"],
        "tail_p99_ms": ours_tail["p99_ms"],
        "tail_p99_over_redis_tail_p99": ours_tail["p99_ms"] / max(redis_tail["p99_ms"], 1e-6),
        "tail_from_call_p99_over_redis": ours_tail["from_call_p99_ms"]
        / max(redis_tail["from_call_p99_ms"], 1e-6),
    }


def print_table(
    args: argparse.Namespace,
    options: Options,
    results: dict[str, dict[str, float]],
    ratios: dict[str, float],
) -> None:
    loop = "uvloop" if options.uvloop else "asyncio"
    if args.tail_only:
        print(
            f"\nin-process engine, tail visibility only, on {args.dir} ({options.runs} runs x "
            f"{options.tail_records} records every {options.tail_interval * 1e3:g} ms, medians; "
            f"walstream on {loop})"
        )
    else:
        print(
            f"\nin-process engine vs Redis on {args.dir} ({cli.mode(args)}: {options.runs} runs "
            f"x {options.seconds:g} s, medians; {options.clients} clients x {VALUE_BYTES} B; "
            f"walstream on {loop})"
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


def plot(path: Path, results: dict[str, dict[str, float]], ratios: dict[str, float]) -> bool:
    names = ("walstream", "redis")

    def draw(figure: Any, axes: Any) -> None:
        axes[0].bar(
            names,
            [results[f"{n}_appends"]["records_per_s"] for n in names],
            color=("tab:blue", "tab:red"),
        )
        axes[0].set_title("64 clients x 1 KiB appends (rec/s)")
        for axis, case, title in (
            (axes[1], "appends", "append latency (ms)"),
            (axes[2], "tail", "ack -> visible to a tailing reader (ms)"),
        ):
            for offset, metric in enumerate(("p50_ms", "p99_ms")):
                values = [results[f"{n}_{case}"][metric] for n in names]
                axis.bar([x + offset * 0.4 for x in range(2)], values, 0.4, label=metric[:3])
            axis.set_xticks([0.2, 1.2], names)
            axis.set_title(title)
            axis.legend()
        figure.suptitle(
            f"throughput {ratios['throughput_over_redis']:.2f}x Redis, "
            f"p99 {ratios['p99_over_redis_p99']:.2f}x Redis p99"
        )

    return save_plot(path, draw, figsize=(12, 4), columns=3, dpi=100)


def document(
    args: argparse.Namespace,
    options: Options,
    runs: Runs,
    results: dict[str, dict[str, float]],
    ratios: dict[str, float],
) -> dict[str, Any]:
    return {
        "benchmark": "engine_local",
        "mode": cli.mode(args),
        "quick": args.quick,
        "tail_only": args.tail_only,
        "runs": options.runs,
        "seconds_per_measurement": options.seconds,
        "clients": options.clients,
        "value_bytes": VALUE_BYTES,
        "loop": "uvloop" if options.uvloop else "asyncio",
        "folder": args.dir,
        "results": results,
        "ratios": ratios,
        "raw": runs.raw,
    }


# -- the command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Options]:
    parser = cli.parser(
        __doc__,
        "engine_local",
        quick="3 runs of 2 s",
        json_help="default: bench/results/engine_local.json (--tail-only: engine_local_tail.json)",
    )
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="folder for data files")
    parser.add_argument("--runs", type=int, help="default 5 (quick 3)")
    parser.add_argument("--seconds", type=float, help="default 5 (quick 2)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--tail-records", type=int, help="default 2000 (quick 500)")
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
    args = parser.parse_args(argv)
    if args.tail_only and args.json == parser.get_default("json"):
        args.json = cli.RESULTS / "engine_local_tail.json"
    smoke = args.smoke
    options = Options(
        runs=cli.sized(args, args.runs, full=5, quick=3, smoke=1),
        seconds=cli.sized(args, args.seconds, full=5.0, quick=2.0, smoke=0.2),
        clients=args.clients,
        tail_records=cli.sized(args, args.tail_records, full=2000, quick=500, smoke=20),
        tail_interval=args.tail_interval,
        uvloop=args.uvloop and uvloop_installed(),
        wal_bytes=SMOKE_WAL_BYTES if smoke else WAL_BYTES,
        redis_min_requests=500 if smoke else 20_000,
    )
    return args, options


def main(argv: list[str] | None = None) -> int:
    args, options = parse_args(argv)
    # Reported by bench/run_all.py as skipped (Debian packages fio, redis-server).
    require_tools(*(("fio",) if args.tail_only else ("fio", "redis-server", "redis-benchmark")))
    runs, profile_text = measure(args, options)
    results = {name: median_of(values) for name, values in runs.raw.items()}
    ratios = ratios_of(results, args.tail_only)
    print_table(args, options, results, ratios)
    if profile_text:
        print("\ncProfile of one engine append run (top by own time):")
        print(profile_text)
    write_results(
        args.json,
        document(args, options, runs, results, ratios),
        None if args.tail_only else lambda png: plot(png, results, ratios),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
