"""Failover recovery time of a three-node walstream cluster: kill -9 the owner, time until the
client's appends through another node are acknowledged again.

The cluster (``walstream_metadata_postgres.testing.cluster``): one PostgreSQL (metadata), one moto
S3 (objects and every node's s3 WAL, each node its own prefix), three ``walstream serve``
processes with ``node.advertise`` and the ``cluster:`` section at walstream's defaults unless
``--lease`` / ``--heartbeat`` say otherwise. ``--wal nvme-quorum`` gives every node an
nvme-quorum WAL instead, on three ``walstream-chunkd`` processes the nodes share (each node
its own log, ``node-<id>``).

Each round:

1. ``--streams`` fresh streams get their first append through node 1, which claims them
   (a stream without a live owner is claimed by the node that receives a write);
2. one client per stream (the shared closed loop, ``bench/common/loadgen.py``) appends one
   record at a time through node 2 with ``match_seq_num`` (S2's REST API,
   ``POST /v1/streams/{s}/records``), retrying idempotently: an ambiguous answer is retried at
   the same seq num, and a ``412`` whose record at that seq num is ours means an earlier attempt
   landed;
3. after ``--warmup`` seconds node 1 gets SIGKILL. A stream's **recovery time** is from the kill
   to the first append of that stream acknowledged after it (through node 2, served by a
   surviving node once node 1's lease expired and its streams were failed over);
4. once every stream recovered, the client stops, node 1 is restarted, and every stream is read
   through node 3: it must hold exactly the acknowledged records, once each, in order.

Side by side: the target of the issue (p99 at most 5 s), AutoMQ's session timeout (9 s of
detection alone) and the lease duration (the floor: nobody may take over before the lease
expires), each as a ratio.

    .venv/bin/python bench/failover.py            # 20 kills
    .venv/bin/python bench/failover.py --quick    # 3 kills
    .venv/bin/python bench/failover.py --kills 50 --lease 2s --heartbeat 300ms
    .venv/bin/python bench/failover.py --restart-owner   # baseline: restart instead of failover
    .venv/bin/python bench/failover.py --wal nvme-quorum  # the same on an nvme-quorum WAL

``--restart-owner`` is the baseline without failover: the client appends through node 1 itself
and node 1 is restarted at once after each kill (a supervisor's restart plus WAL replay).

Writes ``bench/results/failover.json`` (``failover-nvme-quorum.json`` with ``--wal
nvme-quorum``) and a PNG beside it (recovery time per kill and its CDF). Exits 1 when an
acknowledged record is lost or duplicated, or a stream did not recover within ``--give-up``
seconds (with ``--smoke`` too: these are checks of the records, not figures). ``--smoke``: one
kill of one stream's owner, a 2 s lease.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import cli
from common.loadgen import closed_loop
from common.report import Column, Table, percentile, save_plot, write_results
from walstream_metadata_postgres.testing.cluster import (
    Cluster,
    ClusterSettings,
    cluster_features_available,
)
from walstream_metadata_postgres.testing.s2client import S2Http

BASIN = "failover-bench"
TARGET_P99_S = 5.0
AUTOMQ_DETECTION_S = 9.0
OWNER, ENTRY, CHECKER = 1, 2, 3


@dataclass
class StreamRun:
    """One stream of one round: what the client had acknowledged and when."""

    name: str
    acknowledged: list[str] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    sent_times: list[float] = field(default_factory=list)
    """When the call that got each acknowledgement began (retries included)."""
    attempts: int = 0

    def acknowledge(self, body: str, sent: float) -> None:
        self.acknowledged.append(body)
        self.ack_times.append(time.monotonic())
        self.sent_times.append(sent)

    def recovered_after(self, killed_at: float) -> float | None:
        """When the first append begun after the kill (or acknowledged well after it) was
        acknowledged: an answer already on its way when node 1 died is not a recovery."""
        for acked, sent in zip(self.ack_times, self.sent_times, strict=True):
            if acked > killed_at and (sent >= killed_at or acked > killed_at + 0.2):
                return acked - killed_at
        return None


@dataclass
class Checked:
    """What reading every stream back found."""

    lost: int = 0
    duplicated: int = 0
    extra: int = 0
    errors: list[str] = field(default_factory=list)


def parse_duration(text: str) -> float:
    """``3s``, ``500ms`` or a plain number of seconds."""
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    return float(text.removesuffix("s"))


async def append_until(
    client: S2Http, url: str, streams: list[StreamRun], stop: asyncio.Event, give_up_s: float
) -> None:
    """A client per stream appends ``<stream>/<n>`` one at a time at the next seq num until
    ``stop``."""

    async def append(index: int) -> int:
        stream = streams[index]
        seq_num = len(stream.acknowledged)
        body = f"{stream.name}/{seq_num}"
        stream.attempts += 1
        sent = time.monotonic()
        answer = await client.append_retrying(url, stream.name, body, seq_num, give_up_s=give_up_s)
        if answer.status != "ok":
            raise RuntimeError(f"{stream.name}: append at {seq_num} never acknowledged: {answer}")
        stream.acknowledge(body, sent)
        return 1

    await closed_loop(append, len(streams), stop=stop)


async def first_appends(client: S2Http, url: str, streams: list[StreamRun]) -> None:
    """Each stream created and given its first append through ``url``, whose node claims it."""
    for stream in streams:
        await client.ensure_stream(url, stream.name)
        first = await client.append_retrying(url, stream.name, f"{stream.name}/0", 0)
        if first.status != "ok":
            raise RuntimeError(f"{stream.name}: first append through node {OWNER} failed: {first}")
        stream.acknowledge(f"{stream.name}/0", time.monotonic())


async def wait_for_recovery(
    streams: list[StreamRun], killed_at: float, appending: asyncio.Future[None], give_up_s: float
) -> dict[str, float | None]:
    """Each stream's recovery time (None: not within ``give_up_s``, or the appends failed)."""
    recovery: dict[str, float | None] = {}
    deadline = killed_at + give_up_s
    while time.monotonic() < deadline:
        for stream in streams:
            if stream.name not in recovery:
                recovered = stream.recovered_after(killed_at)
                if recovered is not None:
                    recovery[stream.name] = recovered
        if len(recovery) == len(streams) or appending.done():
            break
        await asyncio.sleep(0.01)
    for stream in streams:
        recovery.setdefault(stream.name, None)
    return recovery


async def check_streams(
    client: S2Http, url: str, streams: list[StreamRun], settle_s: float
) -> Checked:
    """Every stream read through ``url``: exactly the acknowledged records, once each, in order."""
    checked = Checked()
    for stream in streams:
        final = await settled_read(client, url, stream, settle_s)
        present = set(final)
        lost = sum(1 for body in stream.acknowledged if body not in present)
        duplicated = len(final) - len(present)
        extra = len(present - set(stream.acknowledged))
        checked.lost += lost
        checked.duplicated += duplicated
        checked.extra += extra
        if final != stream.acknowledged and not (lost or duplicated or extra):
            checked.errors.append(f"{stream.name}: records out of order")
    return checked


async def settled_read(client: S2Http, url: str, stream: StreamRun, settle_s: float) -> list[str]:
    """The stream as ``url`` reads it, once it holds as many records as were acknowledged (a
    node that does not own the stream reads what is committed to object storage, which trails
    the acknowledgements by up to an upload interval), or after ``settle_s``."""
    deadline = time.monotonic() + settle_s
    while True:
        final = await client.read_all(url, stream.name)
        if len(final) >= len(stream.acknowledged) or time.monotonic() > deadline:
            return final
        await asyncio.sleep(0.1)


async def one_round(
    cluster: Cluster, client: S2Http, number: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Streams claimed by node 1, appends through node 2 (node 1 itself with
    ``--restart-owner``), node 1 killed; the recovery times and the streams checked."""
    streams = [StreamRun(f"round-{number}-stream-{index}") for index in range(args.streams)]
    await first_appends(client, cluster.url(OWNER), streams)
    entry_url = cluster.url(OWNER if args.restart_owner else ENTRY)
    stop = asyncio.Event()
    appending = asyncio.ensure_future(append_until(client, entry_url, streams, stop, args.give_up))
    await asyncio.sleep(args.warmup)
    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.kill, OWNER)
    restarting = (
        asyncio.ensure_future(asyncio.to_thread(cluster.start_node, OWNER))
        if args.restart_owner
        else None
    )
    recovery = await wait_for_recovery(streams, killed_at, appending, args.give_up)
    await asyncio.sleep(0.3)  # a few appends after recovery
    stop.set()
    errors = []
    try:
        await appending
    except Exception as error:
        errors.append(str(error))
    if restarting is not None:
        await restarting
    await asyncio.to_thread(cluster.start_node, OWNER)  # no-op when already restarted
    checked = await check_streams(client, cluster.url(CHECKER), streams, args.give_up)
    return {
        "round": number,
        "recovery_s": recovery,
        "acknowledged": sum(len(stream.acknowledged) for stream in streams),
        "lost": checked.lost,
        "duplicated": checked.duplicated,
        "unacknowledged_extra": checked.extra,
        "errors": errors + checked.errors,
    }


RECOVERY_TABLE = Table(
    [
        Column("name", "", 28, align="<"),
        Column("seconds", width=10, spec=".2f"),
        Column("target", "/ target 5 s", 14, ".2f"),
        Column("automq", "/ AutoMQ 9 s", 14, ".2f"),
        Column("lease", "/ lease", 10, ".2f"),
    ],
    separator="",
)


def table(document: dict[str, Any]) -> str:
    summary = document["summary"]
    lease = document["settings"]["lease_s"]
    rows = [RECOVERY_TABLE.header()]
    for name in ("p50", "p99", "max"):
        value = summary[f"recovery_{name}_s"]
        rows.append(
            RECOVERY_TABLE.line(
                {
                    "name": "recovery " + name,
                    "seconds": value,
                    "target": value / TARGET_P99_S,
                    "automq": value / AUTOMQ_DETECTION_S,
                    "lease": value / lease if lease else float("nan"),
                }
            )
        )
    rows.append(
        f"kills {summary['kills']}, streams recovered {summary['recovered']}/{summary['samples']}, "
        f"acknowledged {summary['acknowledged']}, lost {summary['lost']}, duplicated "
        f"{summary['duplicated']}, unacknowledged extra {summary['unacknowledged_extra']}"
    )
    return "\n".join(rows)


def plot(document: dict[str, Any], path: Path) -> bool:
    samples = [
        (entry["round"], value)
        for entry in document["rounds"]
        for value in entry["recovery_s"].values()
        if value is not None
    ]
    settings = document["settings"]

    def draw(figure: Any, axes: Any) -> None:
        left, right = axes
        left.scatter([r for r, _ in samples], [v for _, v in samples], s=12)
        left.set_xlabel("kill")
        left.set_ylabel("recovery time (s)")
        left.set_title("recovery time of each stream, per kill")
        left.set_ylim(bottom=0)
        values = sorted(v for _, v in samples)
        right.plot(
            values, [(i + 1) / len(values) for i in range(len(values))], drawstyle="steps-post"
        )
        for x, label in (
            (TARGET_P99_S, "target p99 5 s"),
            (AUTOMQ_DETECTION_S, "AutoMQ detection 9 s"),
            (settings["lease_s"], "lease"),
        ):
            right.axvline(x, linestyle="--", linewidth=1)
            right.text(x, 0.05, label, rotation=90, fontsize=8)
        right.set_xlabel("recovery time (s)")
        right.set_ylabel("fraction of streams")
        right.set_title("CDF")
        figure.suptitle(
            f"walstream {settings['mode']}: kill -9 of the owner, 3 nodes, {settings['wal']} WAL"
        )

    return save_plot(path, draw, figsize=(11, 4), columns=2, dpi=110)


@contextlib.contextmanager
def shared_wal(kind: str) -> Iterator[dict[str, Any] | None]:
    """The ``wal`` section of every node: None (the rig's s3 WAL per node) for ``s3``; for
    ``nvme-quorum``, three chunk servers (stopped on exit) that every node reaches."""
    if kind == "s3":
        yield None
        return
    from walstream_wal_nvme_quorum.testing.processes import chunk_servers

    with tempfile.TemporaryDirectory(prefix="failover-chunkd-") as root:
        with chunk_servers(Path(root), 3) as servers:
            yield {"type": "nvme-quorum", "servers": [server.address for server in servers]}


def probe_lease(cluster: Cluster) -> float:
    """The default lease duration, as the node's engine config reports it (3 s if unknown)."""
    try:
        from walstream.config.host import find_host

        deployment = find_host("bench/failover.py reads the lease duration").load_deployment(
            str(cluster.nodes[OWNER].config_path)
        )
        cluster_section: Any = deployment.sections.get("cluster", {})
        value = cluster_section.get("lease_duration")
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            return parse_duration(value)
    except Exception:  # the value only labels the plot
        pass
    return 3.0


async def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], float]:
    """Every kill's round on one cluster; the rounds and the lease in seconds."""
    rounds: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        settings = ClusterSettings(
            nodes=3,
            lease_duration=args.lease,
            heartbeat_interval=args.heartbeat,
            extra={"upload": {"max_interval": "100ms"}},
            wal=stack.enter_context(shared_wal(args.wal)),
        )
        cluster = stack.enter_context(Cluster(settings))
        lease_s = parse_duration(args.lease) if args.lease else probe_lease(cluster)
        async with S2Http(settings.token, BASIN, timeout_s=args.request_timeout) as client:
            await client.ensure_basin(cluster.url(OWNER))
            for number in range(1, args.kills + 1):
                entry = await one_round(cluster, client, number, args)
                rounds.append(entry)
                times = [v for v in entry["recovery_s"].values() if v is not None]
                print(
                    f"kill {number:>3}: recovery {', '.join(f'{v:.2f}' for v in times)} s; "
                    f"lost {entry['lost']} duplicated {entry['duplicated']}"
                    + (f"; errors: {entry['errors']}" if entry["errors"] else ""),
                    flush=True,
                )
    return rounds, lease_s


def summarize(rounds: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    samples = [v for entry in rounds for v in entry["recovery_s"].values()]
    recovered = [v for v in samples if v is not None]
    return {
        "kills": len(rounds),
        "samples": len(samples),
        "recovered": len(recovered),
        "recovery_p50_s": statistics.median(recovered) if recovered else float("nan"),
        "recovery_p99_s": percentile(recovered, 0.99),
        "recovery_max_s": max(recovered, default=float("nan")),
        "acknowledged": sum(entry["acknowledged"] for entry in rounds),
        "lost": sum(entry["lost"] for entry in rounds),
        "duplicated": sum(entry["duplicated"] for entry in rounds),
        "unacknowledged_extra": sum(entry["unacknowledged_extra"] for entry in rounds),
        "wall_s": wall_s,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(
        __doc__,
        "failover",
        quick="3 kills, 2 streams",
        json_help="default bench/results/failover.json (failover-nvme-quorum.json with "
        "--wal nvme-quorum); the PNG beside it",
    )
    parser.add_argument("--kills", type=int, default=None, help="kills of node 1 (default 20)")
    parser.add_argument(
        "--streams", type=int, default=None, help="streams owned by node 1 per kill"
    )
    parser.add_argument(
        "--warmup", type=float, default=None, help="seconds of appends before a kill (default 1)"
    )
    parser.add_argument(
        "--lease", default=None, help="cluster.lease_duration (default: walstream's)"
    )
    parser.add_argument(
        "--heartbeat", default=None, help="cluster.heartbeat_interval (default: walstream's)"
    )
    parser.add_argument(
        "--restart-owner",
        action="store_true",
        help="the baseline without failover: the client appends through node 1, which is "
        "restarted at once after each kill (recovery by restart and WAL replay)",
    )
    parser.add_argument(
        "--wal",
        choices=("s3", "nvme-quorum"),
        default="s3",
        help="every node's WAL: s3 (its own prefix on the cluster's S3, default) or "
        "nvme-quorum (three chunk servers shared by the nodes)",
    )
    parser.add_argument("--request-timeout", type=float, default=5.0, help="seconds per request")
    parser.add_argument(
        "--give-up", type=float, default=60.0, help="seconds a stream may take to recover"
    )
    args = parser.parse_args(argv)
    args.kills = cli.sized(args, args.kills, full=20, quick=3, smoke=1)
    args.streams = cli.sized(args, args.streams, full=4, quick=2, smoke=1)
    args.warmup = cli.sized(args, args.warmup, full=1.0, quick=1.0, smoke=0.3)
    if args.smoke:
        args.lease = args.lease or "2s"
        args.heartbeat = args.heartbeat or "300ms"
    if args.wal != "s3" and args.json == parser.get_default("json"):
        args.json = cli.RESULTS / f"failover-{args.wal}.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.restart_owner and not cluster_features_available():
        print(
            "bench/failover.py: this walstream has no node leases (node.advertise, cluster:): "
            "nothing fails over",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    rounds, lease_s = asyncio.run(measure(args))
    document: dict[str, Any] = {
        "benchmark": "failover",
        "mode": cli.mode(args),
        "settings": {
            "nodes": 3,
            "wal": args.wal,
            "mode": "restart-owner" if args.restart_owner else "failover",
            "lease": args.lease or "default",
            "heartbeat": args.heartbeat or "default",
            "lease_s": lease_s,
            "streams_per_kill": args.streams,
            "warmup_s": args.warmup,
        },
        "summary": summarize(rounds, time.monotonic() - started),
        "rounds": rounds,
    }
    print(table(document))
    write_results(args.json, document, lambda png: plot(document, png))
    summary = document["summary"]
    broken = summary["lost"] or summary["duplicated"] or summary["recovered"] < summary["samples"]
    return 1 if broken or any(entry["errors"] for entry in rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
