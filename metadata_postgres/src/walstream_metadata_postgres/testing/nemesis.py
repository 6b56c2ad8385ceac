"""A Jepsen-style nemesis run against a :class:`~.cluster.Cluster`.

Clients append (always with ``match_seq_num``) and read through random nodes while a seeded
nemesis, one fault at a time, SIGKILLs a node (and restarts it), pauses one (SIGSTOP, then
SIGCONT: a zombie owner that wakes up believing it still owns its streams), crashes and restarts
PostgreSQL, or restarts the S3 endpoint. Then every fault is healed and the run is judged:

- every stream's history (:class:`walstream_conformance.history.History`) — appends, reads,
  and one final read of the whole stream — must be linearizable
  (:func:`~walstream_conformance.history.check_linearizable`);
- no answer names a tail older than one an earlier answer named (:func:`stale_tails`: the
  commonest way to break linearizability, reported with the node that answered and when);
- every acknowledged record is in the final stream exactly once, at the seq num it was
  acknowledged at; nothing appears that no client sent; no value appears twice;
- every record a read returned is in the final stream at the same seq num (a record visible
  once and gone later — e.g. a zombie's write that was later replaced — is a violation);
- every node returns the same final stream.

The seed decides the faults, their targets and timing (the clients' interleaving still depends
on timing): ``NemesisPlan(seed=...)`` replays a schedule.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from walstream.errors import AmbiguousError, BackendUnavailable
from walstream_conformance.history import History, HistoryTooLarge, check_linearizable

from .cluster import Cluster
from .s2client import Answer, S2Http

__all__ = [
    "FAULT_KINDS",
    "NemesisPlan",
    "NemesisResult",
    "StreamUnderNemesis",
    "judge",
    "relevant",
    "run_nemesis",
    "stale_tails",
    "violation_kind",
]

FaultKind = Literal["kill", "pause", "postgres", "s3"]
FAULT_KINDS: tuple[FaultKind, ...] = ("kill", "pause", "postgres", "s3")
BASIN = "nemesis-basin"
#: The checker's search bound per stream history (a clean one needs about one per operation).
MAX_CHECK_STATES = 200_000


@dataclass
class NemesisPlan:
    """What the nemesis does; the seed fixes the schedule."""

    seed: int = 1
    faults: int = 6
    faults_per_batch: int = 10
    """Fresh streams every this many faults (keeps each history short for the checker)."""
    kinds: tuple[FaultKind, ...] = FAULT_KINDS
    streams: int = 3
    writers_per_stream: int = 2
    readers_per_stream: int = 1
    lease_s: float = 3.0
    """The cluster's lease duration: a long pause outlasts it (the node is failed over)."""
    route: Literal["random", "home"] = "random"
    """``random``: every request goes to a random node; ``home``: stream i only to node i (for a
    cluster without forwarding)."""
    request_timeout_s: float = 5.0
    gap_s: tuple[float, float] = (0.3, 1.0)
    """Quiet time between faults (uniform)."""
    settle_s: float = 60.0
    """How long the healed cluster has to agree on the final streams."""


@dataclass
class NemesisResult:
    """What happened and what the checks found (``violations`` empty: a clean run)."""

    faults: list[str] = field(default_factory=list)
    healed: list[str] = field(default_factory=list)
    """Nodes the heal step had to restart because they stayed unhealthy after the faults."""
    acknowledged: int = 0
    ambiguous: int = 0
    operations: int = 0
    final: dict[str, list[str]] = field(default_factory=dict)
    streams: list[StreamUnderNemesis] = field(default_factory=list, repr=False)
    """Every stream under test, with its history (to replay the check or report on it)."""
    violations: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "faults": len(self.faults),
            "healed_by_restart": len(self.healed),
            "acknowledged": self.acknowledged,
            "ambiguous": self.ambiguous,
            "operations": self.operations,
            "records": sum(len(values) for values in self.final.values()),
            "violations": len(self.violations),
            "by_kind": self.by_kind(),
        }

    def by_kind(self) -> dict[str, int]:
        """How many violations of each kind (:func:`violation_kind`) the run found."""
        counts = dict.fromkeys(VIOLATION_KINDS, 0)
        for violation in self.violations:
            kind = violation_kind(violation)
            counts[kind] = counts.get(kind, 0) + 1
        return counts


#: The kinds of violation :func:`violation_kind` tells apart (``zombie``: a record nobody
#: acknowledged at that seq num was visible — never sent, or read and later replaced).
VIOLATION_KINDS = ("linearizability", "stale_tail", "lost", "duplicated", "zombie", "disagree")


def violation_kind(violation: str) -> str:
    """The kind of one violation message of :func:`judge` or :func:`run_nemesis`."""
    if "stale tail" in violation:
        return "stale_tail"
    if "linearizab" in violation:
        return "linearizability"
    if "duplicated at" in violation:
        return "duplicated"
    if "never sent" in violation or "a read saw" in violation or "read as" in violation:
        return "zombie"
    if "acknowledged" in violation:
        return "lost"
    return "disagree"


class StreamUnderNemesis:
    """One stream under test: its history, what clients sent, what was acknowledged where, and
    every record a read returned."""

    def __init__(self, name: str, home: int) -> None:
        self.name = name
        self.home = home
        self.history = History()
        self.acknowledged: dict[str, int] = {}
        self.sent: set[str] = set()
        self.observed: dict[int, str] = {}
        self.conflicts: list[str] = []
        self.known_tail = 0
        self.started_at: dict[int, float] = {}
        """Operation id -> wall-clock time it was invoked (to find it in the nodes' logs)."""

    def invoke(self, client: int, kind: Any, url: str, **args: Any) -> Any:
        """Record the invocation of an operation sent to the node at ``url``."""
        operation = self.history.invoke(client, kind, **args, via=url.rsplit(":", 1)[-1])
        self.started_at[operation.op_id] = time.time()
        return operation

    def observe(self, start: int, bodies: tuple[str, ...], where: str) -> None:
        for offset, body in enumerate(bodies, start):
            seen = self.observed.setdefault(offset, body)
            if seen != body:
                self.conflicts.append(
                    f"{self.name}[{offset}] read as {seen!r} and later as {body!r} ({where})"
                )


def _record(history: History, operation: Any, answer: Answer, result: Any) -> None:
    if answer.status == "failed":
        history.failed(operation, BackendUnavailable(answer.detail))
    elif answer.status == "ambiguous":
        history.failed(operation, AmbiguousError(answer.detail))
    else:
        history.ok(operation, result)


async def _writer(
    client: S2Http,
    cluster: Cluster,
    stream: StreamUnderNemesis,
    index: int,
    rng: random.Random,
    stop: Any,
) -> None:
    serial = 0
    while not stop.is_set():
        url = _choose(cluster, stream, rng)
        serial += 1
        value = f"{stream.name}/w{index}/{serial}"
        stream.sent.add(value)
        match = stream.known_tail
        operation = stream.invoke(index, "append", url, values=(value.encode(),), match_tail=match)
        answer = await client.append(url, stream.name, [value], match)
        if answer.status == "ok":
            _record(stream.history, operation, answer, (answer.start, answer.end))
            stream.acknowledged[value] = answer.start
            stream.known_tail = max(stream.known_tail, answer.end)
        elif answer.status == "mismatch":
            assert answer.tail is not None
            _record(stream.history, operation, answer, ("tail_mismatch", answer.tail))
            stream.known_tail = answer.tail
        else:
            _record(stream.history, operation, answer, None)
            await asyncio.sleep(0.05)


async def _reader(
    client: S2Http,
    cluster: Cluster,
    stream: StreamUnderNemesis,
    index: int,
    rng: random.Random,
    stop: Any,
) -> None:
    while not stop.is_set():
        url = _choose(cluster, stream, rng)
        start = rng.randint(max(0, stream.known_tail - 5), stream.known_tail)
        limit = 10
        operation = stream.invoke(index, "read", url, start=start, limit=limit)
        answer = await client.read(url, stream.name, start, limit)
        if answer.status == "ok" and answer.tail is not None:
            bodies = answer.bodies
            stream.observe(start, bodies, f"read through {url}")
            if not bodies and start > answer.tail:
                result: Any = ("out_of_range", 0, answer.tail)
            else:
                result = (tuple(body.encode() for body in bodies), answer.tail)
            _record(stream.history, operation, answer, result)
        else:
            if answer.status == "ok":
                stream.observe(start, answer.bodies, f"read through {url}")
                answer = Answer("ambiguous", detail="a read without a tail constrains nothing")
            _record(stream.history, operation, answer, None)
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.02)


def _choose(cluster: Cluster, stream: StreamUnderNemesis, rng: random.Random) -> str:
    return cluster.url(stream.home or rng.choice(sorted(cluster.nodes)))


async def _nemesis(
    cluster: Cluster, plan: NemesisPlan, count: int, rng: random.Random, log: list[str]
) -> None:
    node_ids = sorted(cluster.nodes)
    for _ in range(count):
        number = len(log)
        kind = rng.choice(plan.kinds)
        target = rng.choice(node_ids)
        if kind == "kill":
            down = rng.uniform(0.2, plan.lease_s + 1.0)
            log.append(f"{number}: SIGKILL node {target}, restart after {down:.1f}s")
            await asyncio.to_thread(cluster.kill, target)
            await asyncio.sleep(down)
            await asyncio.to_thread(cluster.start_node, target)
        elif kind == "pause":
            # Half the pauses outlast the lease: the node is failed over and wakes as a zombie.
            pause = rng.choice((rng.uniform(0.2, 1.0), plan.lease_s + rng.uniform(1.0, 2.0)))
            log.append(f"{number}: SIGSTOP node {target} for {pause:.1f}s")
            await asyncio.to_thread(cluster.pause, target)
            await asyncio.sleep(pause)
            await asyncio.to_thread(cluster.resume, target)
        elif kind == "postgres":
            down = rng.uniform(0.0, 1.5)
            log.append(f"{number}: crash PostgreSQL, down {down:.1f}s")
            await asyncio.to_thread(cluster.restart_postgres, down)
        else:
            down = rng.uniform(0.0, 1.5)
            log.append(f"{number}: restart S3, down {down:.1f}s")
            await asyncio.to_thread(cluster.restart_s3, down)
        await asyncio.sleep(rng.uniform(*plan.gap_s))


async def _heal(cluster: Cluster, log: list[str]) -> None:
    """Resume every node and start the dead ones; a node that stays unhealthy for 20 s (e.g. one
    that stopped accepting writes after its WAL failed and wants a restart) is restarted, and
    that is logged: the run judges safety, not availability."""
    for node_id in sorted(cluster.nodes):
        cluster.resume(node_id)
        if not cluster.running(node_id):
            await asyncio.to_thread(cluster.start_node, node_id)
        try:
            await asyncio.to_thread(cluster.wait_healthy, node_id, 20.0)
        except BackendUnavailable as unhealthy:
            log.append(f"heal: node {node_id} unhealthy, restarted ({str(unhealthy)[-300:]})")
            await asyncio.to_thread(cluster.restart, node_id)


async def _final(
    client: S2Http, cluster: Cluster, stream: StreamUnderNemesis, settle_s: float
) -> tuple[list[str], list[str]]:
    """The stream as every node returns it once they agree (or the disagreement)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_s
    while True:
        seen: dict[int, list[str]] = {}
        problems: list[str] = []
        for node_id in sorted(cluster.nodes):
            try:
                seen[node_id] = await client.read_all(cluster.url(node_id), stream.name)
            except RuntimeError as error:
                problems.append(str(error))
        versions = {tuple(values) for values in seen.values()}
        if not problems and len(versions) == 1:
            return list(versions.pop()), []
        if loop.time() > deadline:
            lengths = {node_id: len(values) for node_id, values in seen.items()}
            return max(seen.values(), key=len, default=[]), [
                f"{stream.name}: nodes disagree after {settle_s:g}s (lengths {lengths}) "
                f"{'; '.join(problems)}"
            ]
        await asyncio.sleep(0.5)


def _observed_tail(operation: Any) -> int | None:
    """The tail an acknowledged operation's answer names (None: it names none)."""
    if operation.outcome != "ok" or not isinstance(operation.result, tuple):
        return None
    result = operation.result
    if operation.kind == "append":
        return int(result[1])  # ("tail_mismatch", tail) or (start, end): both name a tail
    if operation.kind == "read":
        return int(result[-1])  # (values, tail) or ("out_of_range", start_offset, tail)
    return None


def stale_tails(stream: StreamUnderNemesis) -> list[str]:
    """Answers that name a tail older than one an answer completed before they were invoked
    named: the tail of a stream never moves back, so such an answer is stale."""
    operations = sorted(stream.history.operations, key=lambda op: op.invoked)
    answers = sorted(
        (op for op in operations if _observed_tail(op) is not None), key=lambda op: op.completed
    )
    violations: list[str] = []
    newest: tuple[int, Any] | None = None  # (the highest tail named so far, its operation)
    position = 0
    for operation in operations:
        while position < len(answers) and answers[position].completed < operation.invoked:
            candidate = answers[position]
            named = _observed_tail(candidate)
            assert named is not None
            if newest is None or named > newest[0]:
                newest = (named, candidate)
            position += 1
        tail = _observed_tail(operation)
        if tail is None or newest is None or tail >= newest[0]:
            continue
        at = stream.started_at.get(operation.op_id)
        when = ""
        if at is not None:
            when = (
                time.strftime(" at %H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"
            )
        violations.append(
            f"{stream.name}: stale tail {tail}{when}: {operation.describe()}, invoked after "
            f"{newest[1].describe()} named tail {newest[0]}"
        )
    return violations


def relevant(stream: StreamUnderNemesis, final: list[str]) -> list[Any]:
    """The operations of ``stream``'s history that can constrain a linearization, once the
    final stream is known: a read whose answer is unknown constrains nothing, and an append
    whose answer is unknown and whose records are not in the final stream never took effect
    (an applied record stays). Leaving them out changes no verdict (the checker may leave any
    operation of unknown outcome out) but spares the search one branch per such operation at
    every step: hundreds of them (clients time out through every pause) make it give up."""
    present = {value.encode() for value in final}
    kept = []
    for operation in stream.history.operations:
        if operation.outcome in ("ambiguous", "pending"):
            if operation.kind != "append":
                continue
            if not any(value in present for value in operation.args["values"]):
                continue
        kept.append(operation)
    return kept


def judge(stream: StreamUnderNemesis, final: list[str]) -> list[str]:
    """Every violation of the run's rules (module docstring) by ``stream`` whose records, once
    the cluster is healed, are ``final``; adds the final read to the stream's history."""
    violations = list(stream.conflicts)
    violations.extend(stale_tails(stream))
    positions: dict[str, list[int]] = {}
    for offset, value in enumerate(final):
        positions.setdefault(value, []).append(offset)
    for value, offsets in positions.items():
        if len(offsets) > 1:
            violations.append(f"{stream.name}: {value!r} duplicated at seq nums {offsets}")
        if value not in stream.sent:
            violations.append(f"{stream.name}: {value!r} at {offsets} was never sent")
    for value, offset in sorted(stream.acknowledged.items(), key=lambda item: item[1]):
        if offset >= len(final) or final[offset] != value:
            found = positions.get(value, [])
            violations.append(
                f"{stream.name}: acknowledged {value!r} at seq num {offset} is "
                + (f"at {found} instead" if found else "lost")
            )
    for offset, value in sorted(stream.observed.items()):
        if offset >= len(final) or final[offset] != value:
            violations.append(
                f"{stream.name}: a read saw {value!r} at seq num {offset}; the final stream "
                f"has {final[offset] if offset < len(final) else 'nothing'!r} there"
            )
    operation = stream.history.invoke(-1, "read", start=0, limit=len(final) + 1)
    stream.history.ok(operation, (tuple(value.encode() for value in final), len(final)))
    try:
        check = check_linearizable(relevant(stream, final), max_states=MAX_CHECK_STATES)
    except HistoryTooLarge as too_large:
        # A linearizable history of this workload is found in about one state per operation;
        # a search this long means none exists near the order the clients saw.
        violations.append(f"{stream.name}: linearizability undecided, {too_large}")
        return violations
    if not check:
        violations.append(f"{stream.name}: {check.message}")
    return violations


async def run_nemesis(cluster: Cluster, plan: NemesisPlan) -> NemesisResult:
    """Run the workload and the nemesis on a started cluster; heal it; judge the histories.

    The faults come in batches of ``plan.faults_per_batch``, each on fresh streams, so every
    history stays short enough for the linearizability checker (streams are independent)."""
    rng = random.Random(plan.seed)
    node_ids = sorted(cluster.nodes)
    result = NemesisResult()
    streams: list[StreamUnderNemesis] = []
    nemesis_rng = random.Random(rng.random())
    async with S2Http(cluster.settings.token, BASIN, timeout_s=plan.request_timeout_s) as client:
        await client.ensure_basin(cluster.url(node_ids[0]))
        remaining, batch = plan.faults, 0
        while remaining > 0 or batch == 0:
            count = min(remaining, plan.faults_per_batch)
            remaining -= count
            batch_streams = [
                StreamUnderNemesis(
                    f"nemesis-{batch}-{index}",
                    node_ids[index % len(node_ids)] if plan.route == "home" else 0,
                )
                for index in range(plan.streams)
            ]
            batch += 1
            streams.extend(batch_streams)
            result.streams.extend(batch_streams)
            for stream in batch_streams:
                url = cluster.url(stream.home or rng.choice(node_ids))
                await _retry_setup(client.ensure_stream, url, stream.name)
            stop = asyncio.Event()
            clients: list[asyncio.Task[None]] = []
            for stream in batch_streams:
                for index in range(plan.writers_per_stream):
                    client_rng = random.Random(rng.random())
                    clients.append(
                        asyncio.create_task(
                            _writer(client, cluster, stream, index, client_rng, stop)
                        )
                    )
                for index in range(plan.readers_per_stream):
                    client_rng = random.Random(rng.random())
                    clients.append(
                        asyncio.create_task(
                            _reader(client, cluster, stream, 100 + index, client_rng, stop)
                        )
                    )
            try:
                await _nemesis(cluster, plan, count, nemesis_rng, result.faults)
            finally:
                stop.set()
                await asyncio.gather(*clients, return_exceptions=True)
                await _heal(cluster, result.healed)
        for stream in streams:
            final, problems = await _final(client, cluster, stream, plan.settle_s)
            result.final[stream.name] = final
            result.violations.extend(problems)
            result.violations.extend(judge(stream, final))
            result.acknowledged += len(stream.acknowledged)
            result.ambiguous += sum(
                1 for op in stream.history.operations if op.outcome == "ambiguous"
            )
            result.operations += len(stream.history.operations)
    return result


async def _retry_setup(call: Any, *args: Any) -> None:
    """Stream creation between batches: the cluster may still be settling after a fault."""
    for attempt in range(100):
        try:
            await call(*args)
            return
        except RuntimeError:
            if attempt == 99:
                raise
            await asyncio.sleep(0.2)
