"""Kafka clients against walstream's Kafka listener, next to Redis Streams and NATS JetStream
(the peers of ``bench/peers.py``, the same workload, same machine, same run).

Peers:

- ``walstream-kafka``: ``walstream serve`` on the embedded default deployment (ebs WAL file,
  O_DIRECT + O_DSYNC before the acknowledgement) with a ``kafka:`` section, driven by
  ``confluent-kafka`` (librdkafka) producers with their default settings (``acks=all``; an
  acknowledgement means the records are durable in the WAL). A topic of one partition (one
  stream), as the peers append to one stream. One Producer per client; an operation produces
  the records and waits for their delivery (``flush``).
- ``redis`` (``appendfsync always``, a batch is 100 ``XADD`` in one ``MULTI``/``EXEC``) and
  ``nats`` (JetStream file storage, 100 publishes in flight): ``bench/peers.py``'s peers as
  they are there.

Workloads: 1 and 64 producers, one 1 KiB record per operation or a batch of 100 x 1 KiB, each
cell ``--seconds`` per run and ``--runs`` runs; ``--rounds N`` measures every peer N times, the
order reversed every other round; the table shows medians (records/s, p50/p99 of an operation,
the server process's user + system CPU per operation) and the ratio to Redis. Then, for walstream only:

- **consume**: one confluent-kafka Consumer reads the whole topic from offset 0
  (records/s), and the end-to-end latency (p50/p99 from ``produce`` to the consumer's ``poll``,
  one producer sending one record at a time while a consumer tails the topic);
- **codec**: the listener's protocol library, kio, against aiokafka's protocol classes (the
  pure-Python structs of the kafka-python lineage) on the produce path (decode a Produce v7
  request carrying a 100-record batch) and the fetch path (encode a Fetch v11 answer carrying
  1 MiB of batches), microseconds per call, medians of alternating runs.

    .venv/bin/python bench/kafka.py            # 3 runs of 3 s per cell
    .venv/bin/python bench/kafka.py --quick    # 1 run of 1 s per cell
    .venv/bin/python bench/kafka.py --only walstream-kafka redis

Writes ``bench/results/kafka.json`` and ``bench/results/kafka.png`` (throughput bars).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import peers
import yaml
from common import cli
from common.loadgen import Operation, closed_loop
from common.processes import ServerProcess, free_port, run
from common.report import Column, Table, grouped_bars, percentile, save_plot, write_results
from common.serve import PAYLOAD, embedded_deployment, serve_command

PEERS = ["walstream-kafka", "redis", "nats"]
WORKLOADS = [(1, 1), (1, 100), (64, 1), (64, 100)]
TOPIC = "bench"
VALUE = PAYLOAD.encode()

Cells = dict[str, list[dict[str, Any]]]


# -- walstream's Kafka listener --------------------------------------------------------------------


@contextlib.asynccontextmanager
async def walstream_kafka(
    workdir: Path, api_choice: str, info: dict[str, Any]
) -> AsyncIterator[peers.Peer]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    kafka_port = free_port()
    deployment = embedded_deployment(workdir)
    # 64 producers from one address hold 128 connections (bootstrap + broker each).
    deployment["kafka"] = {"listen": f"127.0.0.1:{kafka_port}", "max_connections_per_address": 512}
    path = workdir / "deploy.yaml"
    path.write_text(yaml.safe_dump(deployment))
    command = [*serve_command(), "--config", str(path)]
    server = ServerProcess(command, r"listening on http://127\.0\.0\.1:(\d+)", cwd=workdir)
    bootstrap = f"127.0.0.1:{kafka_port}"
    info["kafka_bootstrap"] = bootstrap
    producers: list[Any] = []
    pool = ThreadPoolExecutor(max_workers=max(clients for clients, _ in WORKLOADS))
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, 1)]).values():
            future.result(60)

        def send(index: int, batch: int) -> int:
            producer = producers[index]
            failures: list[Any] = []
            for _ in range(batch):
                producer.produce(
                    TOPIC, VALUE, on_delivery=lambda e, _m: failures.append(e) if e else None
                )
            if producer.flush(60) or failures:
                raise RuntimeError(f"produce failed: {failures[:3]}")
            return batch

        async def make(clients: int, batch: int) -> Operation:
            while len(producers) < clients:
                producers.append(Producer({"bootstrap.servers": bootstrap}))
            loop = asyncio.get_running_loop()

            async def produce(index: int) -> int:
                return await loop.run_in_executor(pool, send, index, batch)

            return produce

        yield peers.Peer(make, server.pid)
    finally:
        for producer in producers:
            producer.flush(10)
        pool.shutdown(wait=False, cancel_futures=True)
        server.stop()


def peer_context(name: str) -> Callable[[Path, str, dict[str, Any]], Any]:
    if name == "walstream-kafka":
        return walstream_kafka
    return peers.peer_context(name, "1.1", None)


async def measure_peer(name: str, args: argparse.Namespace, info: dict[str, Any]) -> Cells:
    cells: Cells = {}
    workdir = Path(tempfile.mkdtemp(prefix=f"kafka-bench-{name}-"))
    try:
        async with peer_context(name)(workdir, "auto", info) as peer:
            for clients, batch in args.workloads:
                operation = await peer.make(clients, batch)
                await closed_loop(operation, clients, min(0.3, args.seconds))  # warm up
                cells[peers.workload_name(clients, batch)] = [
                    await peers.measured_run(operation, clients, args.seconds, peer.server_pid)
                    for _ in range(args.runs)
                ]
            if name == "walstream-kafka" and args.workloads == WORKLOADS:
                info["consume"] = await asyncio.to_thread(consume, info["kafka_bootstrap"], args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return cells


# -- consume ---------------------------------------------------------------------------------------


def consume(bootstrap: str, args: argparse.Namespace) -> dict[str, float]:
    """Records/s of one Consumer reading the topic from offset 0, and the end-to-end latency of
    records produced one at a time while a consumer tails another topic."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-reader"})
    try:
        _low, high = reader.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=60)
        reader.assign([TopicPartition(TOPIC, 0, 0)])
        started = time.perf_counter()
        read = 0
        while read < high:
            read += sum(1 for m in reader.consume(1000, 1.0) if m.error() is None)
        read_s = time.perf_counter() - started
    finally:
        reader.close()
    latencies: list[float] = []
    topic = "bench-latency"
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"warm-up")
    producer.flush(60)
    tail = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-tail"})
    tail.assign([TopicPartition(topic, 0, 1)])
    stop = threading.Event()

    def tailing() -> None:
        while not stop.is_set():
            message = tail.poll(0.1)
            if message is not None and message.error() is None:
                sent_at = struct.unpack(">d", message.value() or b"")[0]
                latencies.append(time.perf_counter() - sent_at)

    thread = threading.Thread(target=tailing, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)  # the consumer has fetched its position before the first record
        deadline = time.perf_counter() + args.seconds * max(1, args.runs)
        sent = 0
        while time.perf_counter() < deadline:
            producer.produce(topic, struct.pack(">d", time.perf_counter()))
            producer.flush(60)
            sent += 1
        wait_until = time.perf_counter() + 30
        while len(latencies) < sent and time.perf_counter() < wait_until:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(10)
        tail.close()
    latencies.sort()
    return {
        "records": float(high),
        "read_records_per_s": high / read_s if read_s else 0.0,
        "end_to_end_records": float(len(latencies)),
        "end_to_end_p50_ms": percentile(latencies, 0.5, presorted=True) * 1e3,
        "end_to_end_p99_ms": percentile(latencies, 0.99, presorted=True) * 1e3,
    }


# -- codec -----------------------------------------------------------------------------------------


def codec_cases() -> dict[str, dict[str, Callable[[], Any]]]:
    """Per path, per library, one call of that path's work on the same bytes."""
    from aiokafka.protocol.fetch import FetchResponse_v11
    from aiokafka.protocol.produce import ProduceRequest_v7
    from walstream_kafka.batches import encode_batch
    from walstream_kafka.mapping import KafkaRecord
    from walstream_kafka.wire import decode_request, encode_response

    def records(count: int, base: int) -> bytes:
        return encode_batch(
            [KafkaRecord(base + i, 1_700_000_000_000, b"key", VALUE, []) for i in range(count)]
        )

    batch = records(100, 0)
    body = ProduceRequest_v7(None, -1, 30_000, [(TOPIC, [(0, batch)])]).encode()
    header = struct.pack(">hhih", 0, 7, 1, 5) + b"bench"
    frame = header + body

    def aiokafka_decode() -> Any:
        stream = io.BytesIO(frame)
        stream.seek(len(header))
        return ProduceRequest_v7.SCHEMA.decode(stream)

    fetched = b"".join(records(100, offset) for offset in range(0, 1000, 100))
    tree = {
        "throttle_time": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": TOPIC,
                "partitions": [
                    {
                        "partition_index": 0,
                        "error_code": 0,
                        "high_watermark": 1000,
                        "last_stable_offset": 1000,
                        "log_start_offset": 0,
                        "aborted_transactions": [],
                        "preferred_read_replica": -1,
                        "records": fetched,
                    }
                ],
            }
        ],
    }
    fetch_answer = FetchResponse_v11(0, 0, 0, [(TOPIC, [(0, 0, 1000, 1000, 0, [], -1, fetched)])])
    return {
        "produce: decode a Produce v7 request (100 x 1 KiB)": {
            "kio": lambda: decode_request(frame),
            "aiokafka": aiokafka_decode,
        },
        f"fetch: encode a Fetch v11 answer ({len(fetched) >> 10} KiB)": {
            "kio": lambda: encode_response(1, 11, 1, tree),
            "aiokafka": fetch_answer.encode,
        },
    }


def measure_codec(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Microseconds per call, the median of ``rounds`` alternating runs of ``calls`` calls."""
    calls = cli.sized(args, None, full=2000, quick=500, smoke=20)
    rounds = cli.sized(args, None, full=7, quick=3, smoke=1)
    out: dict[str, dict[str, float]] = {}
    for path, libraries in codec_cases().items():
        samples: dict[str, list[float]] = {name: [] for name in libraries}
        for round_number in range(rounds):
            order = list(libraries) if round_number % 2 == 0 else list(libraries)[::-1]
            for name in order:
                call = libraries[name]
                call()
                started = time.perf_counter()
                for _ in range(calls):
                    call()
                samples[name].append((time.perf_counter() - started) / calls * 1e6)
        out[path] = {name: statistics.median(values) for name, values in samples.items()}
    return out


# -- the report ------------------------------------------------------------------------------------


TABLE = Table(
    [
        Column("workload", "WORKLOAD", 14, align="<"),
        Column("peer", "PEER", 16, align="<"),
        Column("records_per_s", "RECORDS/S", 11, ",.0f", "<"),
        Column("p50_ms", "P50 MS", 8, ".3f", "<"),
        Column("p99_ms", "P99 MS", 8, ".3f", "<"),
        Column("server_cpu_us", "SERVER US/OP", 12, ",.0f", "<"),
        Column("vs_redis", "VS REDIS", 26, align="<"),
    ],
    separator="  ",
)


def summarize(raw: dict[str, Cells]) -> dict[str, dict[str, dict[str, float]]]:
    """Per peer and workload, the medians of the runs (the server's CPU per operation when the
    peer is a child process)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for peer, cells in raw.items():
        for workload, samples in cells.items():
            keys = ["records_per_s", "p50_ms", "p99_ms"]
            if all("server_cpu_us" in sample for sample in samples):
                keys.append("server_cpu_us")
            out.setdefault(peer, {})[workload] = {
                key: statistics.median(sample[key] for sample in samples) for key in keys
            }
    return out


def ratios(summary: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """walstream-kafka / redis per workload."""
    out: dict[str, dict[str, float]] = {}
    redis = summary.get("redis", {})
    for workload, cell in summary.get("walstream-kafka", {}).items():
        peer = redis.get(workload)
        if peer:
            out[workload] = {
                "throughput_vs_redis": cell["records_per_s"] / peer["records_per_s"],
                "p99_vs_redis": cell["p99_ms"] / peer["p99_ms"],
            }
    return out


def print_report(summary: dict[str, dict[str, dict[str, float]]], document: dict[str, Any]) -> None:
    compared = document["vs_redis"]
    rows = []
    for clients, batch in WORKLOADS:
        workload = peers.workload_name(clients, batch)
        for peer, cells in summary.items():
            if workload not in cells:
                continue
            ratio = compared.get(workload) if peer == "walstream-kafka" else None
            text = (
                "-"
                if ratio is None
                else f"{ratio['throughput_vs_redis']:.2f}x tput, {ratio['p99_vs_redis']:.2f}x p99"
            )
            rows.append(
                {"workload": workload, "peer": peer, "server_cpu_us": "-", **cells[workload],
                 "vs_redis": text}
            )  # fmt: skip
    print()
    TABLE.print(rows)
    consume_figures = document.get("consume")
    if consume_figures:
        print(
            f"\nconsume (walstream-kafka): {consume_figures['read_records_per_s']:,.0f} records/s "
            f"reading {consume_figures['records']:,.0f} records from offset 0; end to end "
            f"p50 {consume_figures['end_to_end_p50_ms']:.2f} ms, "
            f"p99 {consume_figures['end_to_end_p99_ms']:.2f} ms"
        )
    if not document["codec"]:
        return
    print("\ncodec, microseconds per call (medians of alternating runs):")
    for path, libraries in document["codec"].items():
        figures = ", ".join(f"{name} {value:,.1f}" for name, value in libraries.items())
        print(f"  {path}: {figures}")


def plot(summary: dict[str, dict[str, dict[str, float]]], path: Path) -> bool:
    labels = [peers.workload_name(clients, batch) for clients, batch in WORKLOADS]

    def draw(_figure: Any, axis: Any) -> None:
        series = {
            peer: [cells.get(label, {}).get("records_per_s", 0.0) for label in labels]
            for peer, cells in summary.items()
        }
        grouped_bars(axis, labels, series)
        axis.set_ylabel("records/s (median)")
        axis.set_title("produce: walstream's Kafka listener (confluent-kafka) vs Redis, NATS")

    return save_plot(path, draw)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(__doc__, "kafka", quick="1 run of 1 s per cell")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per run")
    parser.add_argument("--runs", type=int, default=None, help="runs per cell")
    parser.add_argument("--rounds", type=int, default=None, help="times every peer is measured")
    parser.add_argument("--only", nargs="+", choices=PEERS, help="measure only these peers")
    parser.add_argument(
        "--workload",
        nargs="+",
        choices=[f"{clients}x{batch}" for clients, batch in WORKLOADS],
        help="measure only these produce workloads (CLIENTSxBATCH), and not consume or the "
        "codecs (to profile one workload: py-spy record the server meanwhile)",
    )
    args = parser.parse_args(argv)
    args.workloads = (
        WORKLOADS
        if not args.workload
        else [(int(c), int(b)) for c, b in (w.split("x") for w in args.workload)]
    )
    args.seconds = cli.sized(args, args.seconds, full=3.0, quick=1.0, smoke=0.2)
    args.runs = cli.sized(args, args.runs, full=3, quick=1, smoke=1)
    args.rounds = cli.sized(args, args.rounds, full=2, quick=1, smoke=1)
    return args


async def measure(args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Cells]:
    raw: dict[str, Cells] = {}
    chosen = list(args.only or PEERS)
    for round_number in range(args.rounds):
        for peer in chosen if round_number % 2 == 0 else chosen[::-1]:
            tool = peers.TOOLS.get(peer)
            if tool is not None and shutil.which(tool) is None:
                info.setdefault("skipped", {})[peer] = f"{tool} is not installed"
                print(f"{peer}: skipped, {tool} is not installed", flush=True)
                continue
            print(f"{peer} (round {round_number + 1} of {args.rounds}) ...", flush=True)
            for workload, samples in (await measure_peer(peer, args, info)).items():
                raw.setdefault(peer, {}).setdefault(workload, []).extend(samples)
    return raw


def without_latencies(cells: Cells) -> Cells:
    """The samples without every operation's latency (the JSON keeps the medians)."""
    return {
        workload: [{k: v for k, v in sample.items() if k != "latencies_ms"} for sample in samples]
        for workload, samples in cells.items()
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info: dict[str, Any] = {}
    raw = run(measure(args, info), uvloop=False)
    summary = summarize(raw)
    document: dict[str, Any] = {
        "benchmark": "kafka",
        "mode": cli.mode(args),
        "seconds": args.seconds,
        "runs": args.runs,
        "rounds": args.rounds,
        "info": {key: value for key, value in info.items() if key != "consume"},
        "summary": summary,
        "vs_redis": ratios(summary),
        "consume": info.get("consume"),
        "codec": measure_codec(args) if args.workloads == WORKLOADS else None,
        "raw": {peer: without_latencies(cells) for peer, cells in raw.items()},
    }
    print_report(summary, document)
    write_results(args.json, document, lambda png: plot(summary, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
