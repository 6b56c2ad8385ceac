"""What each stream costs as their number grows: the embedded node (ebs WAL file, local object
store, SQLite or PostgreSQL metadata) with N streams, N from 1 to 1,000,000.

For each N and metadata store, in a fresh folder:

- **create/s**: N streams created by ``create_streams`` in transactions of 1,000 names, 4 at a
  time (``common.loadgen.for_each``);
- **claim/s**: the first append to each stream (it claims the stream, then appends one 16-byte
  record), 64 at a time;
- **RSS per stream**: the process's resident memory after the claims (each appended one
  16-byte record, so the LogCache holds little) and after the node parked the idle streams, less
  before the creates, over N (the node, its caches, the metadata client and this script's
  handles together; the allocator rarely gives memory back, so this is an upper bound for idle
  streams);
- **random ÷ single**: ``--clients`` closed loops (the shared ``common.loadgen.closed_loop``) of 1 KiB
  appends, either all to ONE stream or each to a stream drawn at random from the N; ``--runs``
  runs of each, alternating, ``--seconds`` each; the ratio of the medians;
- **compaction**: random appends (the closed loop, until the pass is over) go on while one
  compaction pass (default options) runs: the pass time, committed objects before and after,
  and the lowest 5 s window of appends during the pass over the median window before it (the
  issue asks ≥ 0.6); then a second pass is started and ``client.close()`` timed while it runs
  (the issue asks ≤ 5 s);
- **list**: every stream listed in keyset pages of 1,000 (``list_streams(prefix, start_after,
  limit)``): the whole listing's time and the median page's; ``--create-only`` stops there (the
  1,000,000 point);
- **bytes read per cold 100 KiB**: 100 KiB appended to one stream amid the random appends (so it
  lands in shared stream-set objects), then read by a fresh reader from object storage; the
  bytes fetched over the bytes of records, before compaction.

A table is printed as each N finishes; JSON goes to ``bench/results/streams_scale.json`` (merged
with what is there: ``--resume`` skips the points it holds) and a plot of every cost against N
on log axes to ``bench/results/streams_scale.png``. The load average is recorded with each
point: the machine is shared.

    .venv/bin/python bench/streams_scale.py --quick      # N = 1, 10, 100, 1000, 10000
    .venv/bin/python bench/streams_scale.py --n 100000 --resume --metadata sqlite
    WALSTREAM_BENCH_PROFILE=/tmp/scale.raw .venv/bin/python bench/streams_scale.py --n 10000 --quick --profile
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import cli, profile
from common.loadgen import closed_loop, for_each
from common.processes import rss_bytes
from common.report import Column, Table, load_average, machine, save_plot, write_json
from walstream import Client, Record, Stream, tune_gc
from walstream.engine.object_reader import ObjectReader
from walstream.metadata import ObjectState
from walstream.metadata.contract import MetadataStore
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream_wal_ebs import EbsWal

VALUE = os.urandom(1024)
WAL_BYTES = 512 << 20
PARALLEL = 64


@dataclass
class Options:
    clients: int
    seconds: float
    runs: int
    pre_windows: int
    inline_compaction: bool = False
    window_s: float = 5.0
    """The windows appends are counted in while a pass runs (5 s; short in a smoke run)."""
    create_only: bool = False
    """Only create and list (``--create-only``)."""


class CountingStore(LocalObjectStore):
    """A local object store that counts the bytes its GETs return."""

    bytes_read = 0

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = await super().get(key, start, end)
        self.bytes_read += len(data)
        return data


def load_1min() -> float:
    return os.getloadavg()[0]


@asynccontextmanager
async def node(folder: Path, metadata: Callable[[], MetadataStore]) -> AsyncIterator[Client]:
    client = Client(
        wal=EbsWal(folder / "wal.img", capacity_bytes=WAL_BYTES),
        objects=LocalObjectStore(folder / "objects"),
        metadata=metadata(),
    )
    await client.start()
    try:
        yield client
    finally:
        await client.close()
        await client.objects.close()
        await client.metadata.close()


async def throughput(
    streams: list[Stream], options: Options, rng: random.Random
) -> tuple[float, float, list[float]]:
    """Median records/s of ``options.runs`` alternating runs: all to one stream, each to a random
    stream; and the random runs' values."""
    single: list[float] = []
    spread: list[float] = []
    record = [Record(VALUE)]
    for _ in range(options.runs):
        for kind, sink in (("single", single), ("random", spread)):

            async def append(index: int, kind: str = kind) -> int:
                stream = streams[0] if kind == "single" else streams[rng.randrange(len(streams))]
                await stream.append(record)
                return 1

            result = await closed_loop(append, options.clients, options.seconds)
            sink.append(result.records_per_s)
    return statistics.median(single), statistics.median(spread), spread


class Windows:
    """Appends counted in windows of ``window_s`` while :meth:`run` runs."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.count = 0
        self.windows: list[tuple[float, float, int]] = []
        """(start, end, appends) of every window, in ``time.perf_counter`` seconds."""

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            begin = self.count
            await asyncio.sleep(self.window_s)
            self.windows.append((started, time.perf_counter(), self.count - begin))

    async def wait_for(self, count: int) -> None:
        while len(self.windows) < count:
            await asyncio.sleep(0.2)

    def min_ratio(self, pass_started: float, pass_ended: float) -> tuple[float, list[float]]:
        """The lowest window during the pass over the median before it; every window's rate."""
        rates = [(start, end, n / (end - start)) for start, end, n in self.windows]
        pre = [rate for start, end, rate in rates if end <= pass_started]
        during = [rate for start, end, rate in rates if end > pass_started and start < pass_ended]
        ratio = min(during) / statistics.median(pre) if during and pre else float("nan")
        return ratio, [rate for _start, _end, rate in rates]


async def compaction_under_load(
    client: Client, streams: list[Stream], options: Options, rng: random.Random
) -> dict[str, Any]:
    """Random appends counted in windows; a pass starts after ``pre_windows`` windows; the
    lowest window during the pass over the median before it."""
    windows = Windows(options.window_s)
    stop = asyncio.Event()
    record = [Record(VALUE)]

    async def append(_: int) -> int:
        await streams[rng.randrange(len(streams))].append(record)
        windows.count += 1
        return 1

    tasks = [
        asyncio.ensure_future(closed_loop(append, options.clients, stop=stop)),
        asyncio.ensure_future(windows.run(stop)),
    ]
    await windows.wait_for(options.pre_windows)
    await client.flush()
    before = len(await client.metadata.list_objects(state=ObjectState.COMMITTED))
    pass_started = time.perf_counter()
    changed = await client.compact()
    pass_ended = time.perf_counter()
    report = client._runtime.compactor.last_pass if client._runtime.compactor else None
    await windows.wait_for(len(windows.windows) + 1)
    stop.set()
    await asyncio.gather(*tasks)
    after = len(await client.metadata.list_objects(state=ObjectState.COMMITTED))
    ratio, rates = windows.min_ratio(pass_started, pass_ended)
    return {
        "compaction_pass_s": pass_ended - pass_started,
        "compaction_changed": changed,
        "objects_before": before,
        "objects_after_pass": after,
        "pass_sources": report.sources if report else 0,
        "pass_outputs": report.outputs if report else 0,
        "pass_steps": report.steps if report else 0,
        "pass_bytes_read": report.bytes_read if report else 0,
        "window_min_ratio": ratio,
        "windows_records_per_s": [round(rate) for rate in rates],
    }


async def close_during_pass(client: Client, streams: list[Stream]) -> dict[str, Any]:
    """Make fresh small objects, start a pass and time ``close()`` while it runs."""
    rng = random.Random(5)
    for _ in range(8):
        await asyncio.gather(
            *(streams[rng.randrange(len(streams))].append([Record(VALUE)]) for _ in range(64))
        )
        await client.flush()
    pass_ = asyncio.create_task(client.compact())
    await asyncio.sleep(0.05)
    running = not pass_.done()
    started = time.perf_counter()
    await client.close()
    close_s = time.perf_counter() - started
    await asyncio.gather(pass_, return_exceptions=True)
    return {"close_s": close_s, "pass_running_at_close": running}


async def cold_read_cost(
    client: Client, folder: Path, streams: list[Stream], rng: random.Random
) -> dict[str, float]:
    """Append 100 KiB to one stream amid other streams' appends, then read it cold."""
    target = streams[rng.randrange(len(streams))]
    start = await target.check_tail()
    others = [stream for stream in streams if stream is not target] or streams
    for _ in range(100):
        await asyncio.gather(
            target.append([Record(VALUE)]),
            *(others[rng.randrange(len(others))].append([Record(VALUE)]) for _ in range(8)),
        )
    await client.flush()
    store = CountingStore(folder / "objects")
    reader = ObjectReader(store, client.metadata)
    records = await reader.read(target.stream_id, start, start + 100, 1000, 1 << 30)
    assert len(records) == 100, len(records)
    return {"cold_read_bytes_per_100KiB": store.bytes_read * 100 / len(records)}


CREATE_CHUNK = 1_000
"""Streams per ``create_streams`` call (one metadata transaction each)."""
LIST_PAGE = 1_000


async def create_and_list(client: Client, n: int, point: dict[str, Any]) -> list[Stream]:
    """N streams created in transactions of :data:`CREATE_CHUNK` (``create_streams``, 4 calls
    at a time), then listed page by page; create/s, the whole listing's time and the median
    time of a page of :data:`LIST_PAGE` names go into ``point``."""
    chunks = (n + CREATE_CHUNK - 1) // CREATE_CHUNK
    created: dict[int, list[Stream]] = {}

    async def create(chunk: int) -> None:
        names = [
            f"scale-{index:07d}"
            for index in range(chunk * CREATE_CHUNK, min(n, (chunk + 1) * CREATE_CHUNK))
        ]
        created[chunk] = await client.create_streams(names)  # fmt: skip

    point["create_per_s"] = n / (await for_each(chunks, create, 4)).elapsed_s
    streams = [stream for chunk in range(chunks) for stream in created[chunk]]
    created.clear()
    page_times: list[float] = []
    listed = 0
    after: str | None = None
    started = time.perf_counter()
    while True:
        page_started = time.perf_counter()
        page = await client.list_streams("", after, LIST_PAGE)
        page_times.append(time.perf_counter() - page_started)
        listed += len(page)
        if len(page) < LIST_PAGE:
            break
        after = page[-1].name
    point["list_s"] = time.perf_counter() - started
    point["list_page_s"] = statistics.median(page_times)
    assert listed == n, (listed, n)
    return streams


async def populate(client: Client, n: int, point: dict[str, Any]) -> list[Stream]:
    """N streams created, then claimed by a first append, then parked; create/s, claim/s, RSS
    per stream and the list times go into ``point``."""
    gc.collect()
    rss_before = rss_bytes()
    streams = await create_and_list(client, n, point)

    async def claim(index: int) -> None:
        await streams[index].append([Record(b"c" * 16)])

    point["claim_per_s"] = n / (await for_each(n, claim, PARALLEL)).elapsed_s
    await client.flush()
    point["parked"] = client._streams.park_idle(all_idle=True)
    gc.collect()
    point["rss_per_stream"] = max(0, rss_bytes() - rss_before) / n
    return streams


async def measure_point(
    n: int, metadata: Callable[[], MetadataStore], folder: Path, options: Options
) -> dict[str, Any]:
    rng = random.Random(n)
    point: dict[str, Any] = {"n": n, "load_before": load_1min()}
    async with node(folder, metadata) as client:
        if options.create_only:
            await create_and_list(client, n, point)
            point["load_after"] = load_1min()
            return point
        if options.inline_compaction and client._runtime.compactor is not None:
            client._runtime.compactor.in_thread = False
        tune_gc()
        streams = await populate(client, n, point)
        with profile.measured(f"appends n={n}"):
            single, spread, _runs = await throughput(streams, options, rng)
        point.update(single_per_s=single, random_per_s=spread, random_over_single=spread / single)
        point.update(await cold_read_cost(client, folder, streams, rng))
        with profile.measured(f"compaction n={n}"):
            point.update(await compaction_under_load(client, streams, options, rng))
        point.update(await close_during_pass(client, streams))
    point["load_after"] = load_1min()
    return point


METRICS = [
    ("create_per_s", "creates/s"),
    ("claim_per_s", "claims/s"),
    ("rss_per_stream", "RSS bytes per stream"),
    ("random_over_single", "random ÷ single appends"),
    ("compaction_pass_s", "compaction pass (s)"),
    ("list_s", "list every stream, paged (s)"),
    ("list_page_s", "a page of 1,000 names (s)"),
    ("cold_read_bytes_per_100KiB", "bytes read per cold 100 KiB"),
    ("close_s", "close() during a pass (s)"),
]


def plot(points: dict[str, list[dict[str, Any]]], path: Path) -> bool:
    """Every cost against N on log axes, one line per metadata store."""

    def paint(figure: Any, axes: Any) -> None:
        for axis, (key, title) in zip(axes.flat, METRICS, strict=True):
            plotted = False
            for backend, rows in points.items():
                # Points that lack the metric (--create-only) or measured it as 0 are left out.
                rows = sorted((row for row in rows if row.get(key, 0) > 0), key=lambda r: r["n"])
                if rows:
                    axis.plot([row["n"] for row in rows], [row[key] for row in rows], marker="o",
                              label=backend)  # fmt: skip
                    plotted = True
            if plotted:
                axis.set_xscale("log")
                axis.set_yscale("log")
            axis.set_title(title, fontsize=9)
            axis.set_xlabel("streams", fontsize=8)
            axis.legend(fontsize=7)

    return save_plot(path, paint, figsize=(16, 10), columns=3, rows=3)


COLUMNS = [
    Column("backend", width=8, align="<"),
    Column("n", width=8),
    Column("create_per_s", "create/s", 9, ".0f"),
    Column("claim_per_s", "claim/s", 8, ".0f"),
    Column("rss_per_stream", "RSS/str", 8, ".0f"),
    Column("single_per_s", "single/s", 9, ".0f"),
    Column("random_per_s", "random/s", 9, ".0f"),
    Column("random_over_single", "rnd÷one", 7, ".2f"),
    Column("compaction_pass_s", "pass s", 7, ".1f"),
    Column("objects_before", "objects", 7),
    Column("pass_sources", "replaced", 8),
    Column("pass_outputs", "written", 7),
    Column("window_min_ratio", "min win", 7, ".2f"),
    Column("close_s", "close s", 7, ".2f"),
    Column("list_s", "list s", 7, ".3f"),
    Column("list_page_s", "page s", 7, ".4f"),
    Column("cold_read_bytes_per_100KiB", "cold B/100K", 11, ".0f"),
    Column("load_before", "load", 5, ".1f"),
]


def backends(choice: str) -> list[str]:
    return ["sqlite", "postgres"] if choice == "both" else [choice]


@contextlib.contextmanager
def metadata_stores(backend: str) -> Iterator[Callable[[int, Path], Callable[[], MetadataStore]]]:
    """For ``backend``, a function of (N, the point's folder) to a factory of its store: SQLite
    in the folder, or a schema of its own on one throwaway PostgreSQL server."""
    if backend == "sqlite":
        yield lambda n, folder: lambda: SqliteMetadataStore(folder / "meta.db")
        return
    from walstream_metadata_postgres import PostgresMetadataStore
    from walstream_metadata_postgres.testing import PostgresServer

    with PostgresServer() as server:
        yield (
            lambda n, folder: (
                lambda: PostgresMetadataStore(
                    server.dsn, schema=f"scale{n}_{os.getpid()}", pool_max=16
                )
            )
        )


async def run_backend(
    backend: str, ns: list[int], options: Options, done: dict[str, Any], save: Callable[[], None]
) -> None:
    """Every N on ``backend`` not in ``done``; each point saved as it is measured."""
    table = Table(COLUMNS)
    with metadata_stores(backend) as store_for:
        for n in ns:
            key = f"{backend}:{n}"
            if key in done:
                table.print_row(done[key])
                continue
            with tempfile.TemporaryDirectory(prefix="streams-scale-") as folder_name:
                folder = Path(folder_name)
                point = await measure_point(n, store_for(n, folder), folder, options)
            point["backend"] = backend
            done[key] = point
            save()
            table.print_row(point)


class Results:
    """The JSON document (``points`` by ``backend:N``), merged with what the file holds."""

    def __init__(self, path: Path, options: Options, resume: bool) -> None:
        self.path = path
        self.options = options
        self.document: dict[str, Any] = {"points": {}}
        if path.exists():
            self.document = json.loads(path.read_text())
            self.document.setdefault("points", {})
        self.resume = resume

    def points_to_keep(self, names: list[str], ns: list[int]) -> dict[str, Any]:
        """The points a run skips: with ``--resume`` every point held; else none of this run's
        (the others stay in the document)."""
        points: dict[str, Any] = self.document["points"]
        if not self.resume:
            for backend in names:
                for n in ns:
                    points.pop(f"{backend}:{n}", None)
        return points

    def save(self) -> None:
        self.document.update(
            machine=machine(), load_average=load_average(), options=asdict(self.options)
        )
        write_json(self.path, self.document)
        by_backend: dict[str, list[dict[str, Any]]] = {}
        for point in self.document["points"].values():
            by_backend.setdefault(point["backend"], []).append(point)
        plot(by_backend, self.path.with_suffix(".png"))


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Options]:
    parser = cli.parser(
        __doc__, "streams_scale", quick="2 runs of 3 s, 2 windows before", json_aliases=("--out",)
    )
    parser.add_argument("--n", default=None, help="stream counts, comma-separated "
                        "(default 1,10,100,1000,10000; smoke 10)")  # fmt: skip
    parser.add_argument("--metadata", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=None, help="default 5 (quick 3)")
    parser.add_argument("--runs", type=int, default=None, help="default 3 (quick 2)")
    parser.add_argument("--pre-windows", type=int, default=None, help="default 3 (quick 2)")
    parser.add_argument(
        "--inline-compaction",
        action="store_true",
        help="run compaction's CPU work on the event loop (what the worker thread buys)",
    )
    parser.add_argument(
        "--create-only",
        action="store_true",
        help="only create and list the N streams (the 1,000,000 point)",
    )
    parser.add_argument("--resume", action="store_true", help="skip points already in the JSON")
    parser.add_argument("--profile", action="store_true", help="py-spy (WALSTREAM_BENCH_PROFILE)")
    args = parser.parse_args(argv)
    args.n = cli.sized(args, args.n, full="1,10,100,1000,10000", quick="1,10,100,1000,10000",
                       smoke="10")  # fmt: skip
    options = Options(
        clients=args.clients,
        seconds=cli.sized(args, args.seconds, full=5.0, quick=3.0, smoke=0.2),
        runs=cli.sized(args, args.runs, full=3, quick=2, smoke=1),
        pre_windows=cli.sized(args, args.pre_windows, full=3, quick=2, smoke=1),
        inline_compaction=args.inline_compaction,
        create_only=args.create_only,
        window_s=0.3 if args.smoke else 5.0,
    )
    return args, options


def main(argv: list[str] | None = None) -> int:
    args, options = parse_args(argv)
    if not args.profile:
        os.environ.pop(profile.ENV, None)
    ns = [int(part) for part in args.n.split(",")]
    results = Results(args.json, options, args.resume)
    done = results.points_to_keep(backends(args.metadata), ns)
    Table(COLUMNS).print_header()
    for backend in backends(args.metadata):
        asyncio.run(run_backend(backend, ns, options, done, results.save))
    print(f"load average (1, 5, 15 min): {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"wrote {args.json} and {args.json.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
