"""A history checker: is what concurrent clients saw of one stream linearizable?

Record every client operation — ``append``, ``read``, ``trim``, ``check_tail`` — with its
invocation and completion (:class:`History`), including operations whose outcome is unknown
(:class:`~walstream.errors.AmbiguousError`, a timeout, a crash): those may have taken effect at
any point after their invocation, or never. :func:`check_linearizable` then searches for a
sequential order of the operations that respects real time (an operation that completed before
another was invoked comes first) and that a single, correct stream (:class:`StreamModel`) would
produce. The search is Wing & Gong's, with Lowe's memoization of (linearized set, model state);
it is meant for short histories (hundreds of operations).

Appended values must be unique within a history, which keeps the model exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from walstream.errors import (
    AmbiguousError,
    OutOfRangeError,
    TailMismatchError,
    WalstreamError,
)

__all__ = [
    "CheckResult",
    "History",
    "Operation",
    "StreamModel",
    "StreamUnderTest",
    "check_linearizable",
    "run_engine_workload",
    "run_stream_workload",
]

log = logging.getLogger(__name__)

OpKind = Literal["append", "read", "trim", "check_tail"]
Outcome = Literal["ok", "fail", "ambiguous", "pending"]
_NEVER = float("inf")


@dataclass
class Operation:
    op_id: int
    client: int
    kind: OpKind
    args: dict[str, Any]
    invoked: int
    completed: float = _NEVER
    outcome: Outcome = "pending"
    result: Any = None
    """append: ``(start, end)`` or ``("tail_mismatch", actual_tail)``; read: ``(values, tail)``
    or ``("out_of_range", start_offset, tail)``; trim: ``None`` or ``("out_of_range", …)``;
    check_tail: the tail."""

    def describe(self) -> str:
        args = ", ".join(f"{k}={_short(v)}" for k, v in self.args.items())
        return (
            f"#{self.op_id} client {self.client} {self.kind}({args}) -> {self.outcome} "
            f"{_short(self.result)} [{self.invoked}, {self.completed}]"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class History:
    """Invocations and completions in the order they happened (one event loop: exact order)."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []
        self.notes: dict[str, Any] = {}
        """What else happened during the workload (e.g. faults injected), for reports."""
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def invoke(self, client: int, kind: OpKind, **args: Any) -> Operation:
        operation = Operation(len(self.operations), client, kind, args, self._tick())
        self.operations.append(operation)
        return operation

    def ok(self, operation: Operation, result: Any) -> None:
        operation.completed = self._tick()
        operation.outcome = "ok"
        operation.result = result

    def failed(self, operation: Operation, error: BaseException) -> None:
        """Classify an error: informative failures keep a result, definite ones had no effect,
        everything else may or may not have happened."""
        if isinstance(error, TailMismatchError):
            operation.completed = self._tick()
            operation.outcome = "ok"
            operation.result = ("tail_mismatch", error.actual_tail)
        elif isinstance(error, OutOfRangeError):
            operation.completed = self._tick()
            operation.outcome = "ok"
            operation.result = ("out_of_range", error.start_offset, error.tail)
        elif (
            isinstance(error, WalstreamError)
            and error.definitely_not_applied
            and not isinstance(error, AmbiguousError)
        ):
            operation.completed = self._tick()
            operation.outcome = "fail"
            operation.result = type(error).__name__
        else:
            operation.outcome = "ambiguous"  # completion stays unknown: any time after invoke
            operation.result = type(error).__name__

    async def record(
        self, client: int, kind: OpKind, call: Callable[[], Awaitable[Any]], **args: Any
    ) -> Any:
        """Invoke ``call`` as operation ``kind`` and record its outcome; never raises walstream
        errors (returns them)."""
        operation = self.invoke(client, kind, **args)
        try:
            result = await call()
        except (WalstreamError, TimeoutError) as exc:
            self.failed(operation, exc)
            return exc
        except asyncio.CancelledError:
            operation.outcome = "ambiguous"
            raise
        self.ok(operation, result)
        return result


# -- the sequential model -------------------------------------------------------------------------

#: (start_offset, values): the stream's whole state.
ModelState = tuple[int, tuple[bytes, ...]]


class StreamModel:
    """A correct single stream, step by step. ``step`` returns the state after ``operation`` or
    ``None`` when the operation could not have returned what it did from ``state``."""

    initial: ModelState = (0, ())

    def step(self, state: ModelState, operation: Operation) -> ModelState | None:
        start_offset, values = state
        tail = len(values)
        result = operation.result
        ambiguous = operation.outcome == "ambiguous"
        args = operation.args
        if operation.kind == "append":
            batch: tuple[bytes, ...] = args["values"]
            match_tail = args.get("match_tail")
            if not ambiguous and isinstance(result, tuple) and result[:1] == ("tail_mismatch",):
                return state if match_tail is not None and match_tail != tail == result[1] else None
            if match_tail is not None and match_tail != tail:
                return None
            if not ambiguous and tuple(result) != (tail, tail + len(batch)):
                return None
            return (start_offset, values + batch)
        if operation.kind == "trim":
            new_start = args["new_start"]
            if not ambiguous and isinstance(result, tuple):
                return state if new_start > tail and result[1:] == (start_offset, tail) else None
            if new_start > tail:
                return None
            return (max(start_offset, new_start), values)
        if ambiguous:
            return state  # a read-only operation with an unknown result constrains nothing
        if operation.kind == "check_tail":
            return state if result == tail else None
        start, limit = args["start"], args["limit"]
        if isinstance(result, tuple) and result[:1] == ("out_of_range",):
            outside = start < start_offset or start > tail
            return state if outside and result[1:] == (start_offset, tail) else None
        seen, seen_tail = result
        if start < start_offset or start > tail or seen_tail != tail:
            return None
        if len(seen) > limit or (not seen and start < tail):
            return None
        return state if tuple(seen) == values[start : start + len(seen)] else None


@dataclass
class CheckResult:
    linearizable: bool
    operations: int
    explored_states: int
    message: str = ""
    longest_prefix: list[Operation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.linearizable


class HistoryTooLarge(Exception):
    pass


def check_linearizable(
    history: History | Sequence[Operation],
    model: StreamModel | None = None,
    max_states: int = 2_000_000,
) -> CheckResult:
    """Search for a linearization of ``history``; definite failures are left out (they had no
    effect), ambiguous operations may be placed anywhere after their invocation or left out."""
    model = model or StreamModel()
    operations = [
        op
        for op in (history.operations if isinstance(history, History) else history)
        if op.outcome in ("ok", "ambiguous", "pending")
    ]
    for op in operations:
        if op.outcome == "pending":
            op.outcome = "ambiguous"
    operations.sort(key=lambda op: op.invoked)
    count = len(operations)
    required_mask = 0
    for index, op in enumerate(operations):
        if op.outcome == "ok":
            required_mask |= 1 << index
    seen: set[tuple[int, ModelState]] = set()
    best: list[int] = []
    # Depth-first search; each frame: (linearized mask, state, path, candidate iterator).
    stack: list[tuple[int, ModelState, list[int], list[int]]] = []

    def candidates(mask: int) -> list[int]:
        horizon = _NEVER
        for index, op in enumerate(operations):
            if not mask >> index & 1 and op.outcome == "ok":
                horizon = min(horizon, op.completed)
        return [
            index
            for index, op in enumerate(operations)
            if not mask >> index & 1 and op.invoked < horizon
        ]

    stack.append((0, model.initial, [], candidates(0)))
    explored = 0
    while stack:
        mask, state, path, pending = stack[-1]
        if mask & required_mask == required_mask:
            return CheckResult(True, count, explored)
        if not pending:
            stack.pop()
            continue
        index = pending.pop()
        new_state = model.step(state, operations[index])
        if new_state is None:
            continue
        new_mask = mask | 1 << index
        key = (new_mask, new_state)
        if key in seen:
            continue
        seen.add(key)
        explored += 1
        if explored > max_states:
            raise HistoryTooLarge(f"gave up after {max_states} states; check a shorter history")
        new_path = [*path, index]
        if len(new_path) > len(best):
            best = new_path
        stack.append((new_mask, new_state, new_path, candidates(new_mask)))
    prefix = [operations[index] for index in best]
    stuck = [
        operations[index]
        for index in range(count)
        if index not in set(best) and operations[index].outcome == "ok"
    ]
    lines = "\n  ".join(op.describe() for op in stuck[:8])
    return CheckResult(
        False,
        count,
        explored,
        f"not linearizable: the longest valid order covers {len(prefix)} of {count} operations; "
        f"none of these can come next:\n  {lines}",
        prefix,
    )


# -- workloads ------------------------------------------------------------------------------------


class StreamUnderTest(Protocol):
    """The four operations of a stream, in plain values (adapters map them to real APIs)."""

    async def append(self, values: Sequence[bytes], match_tail: int | None) -> tuple[int, int]: ...

    async def read(self, start: int, limit: int) -> tuple[tuple[bytes, ...], int]: ...

    async def trim(self, new_start: int) -> None: ...

    async def check_tail(self) -> int: ...


async def run_stream_workload(
    stream: StreamUnderTest,
    rng: random.Random,
    *,
    clients: int = 4,
    operations_per_client: int = 25,
    trim_weight: float = 0.05,
    match_tail_fraction: float = 0.2,
    history: History | None = None,
) -> History:
    """Concurrent clients issue seeded random operations; returns the recorded history."""
    history = history or History()
    counter = iter(range(1 << 30))
    known_tail = 0

    async def client(client_id: int) -> None:
        nonlocal known_tail
        client_rng = random.Random(rng.random())
        for _ in range(operations_per_client):
            roll = client_rng.random()
            if roll < 0.45:
                batch = tuple(f"v{next(counter)}".encode() for _ in range(client_rng.randint(1, 3)))
                match_tail = known_tail if client_rng.random() < match_tail_fraction else None
                result = await history.record(
                    client_id,
                    "append",
                    functools.partial(stream.append, batch, match_tail),
                    values=batch,
                    match_tail=match_tail,
                )
                if isinstance(result, tuple):
                    known_tail = max(known_tail, result[1])
            elif roll < 0.8:
                if client_rng.random() < 0.7:  # near the tail, where appends race reads
                    start = client_rng.randint(max(0, known_tail - 6), known_tail + 1)
                else:  # anywhere, also below the trim point
                    start = client_rng.randint(0, known_tail + 1)
                limit = client_rng.randint(1, 8)
                await history.record(
                    client_id,
                    "read",
                    functools.partial(stream.read, start, limit),
                    start=start,
                    limit=limit,
                )
            elif roll < 0.8 + trim_weight:
                new_start = client_rng.randint(0, max(0, known_tail - 2))
                await history.record(
                    client_id,
                    "trim",
                    functools.partial(stream.trim, new_start),
                    new_start=new_start,
                )
            else:
                result = await history.record(client_id, "check_tail", stream.check_tail)
                if isinstance(result, int):
                    known_tail = max(known_tail, result)
            await asyncio.sleep(client_rng.choice((0, 0, 0.0005, 0.002)))

    await asyncio.gather(*[client(index) for index in range(clients)])
    return history


class _EngineStream:
    """:class:`StreamUnderTest` over a ``walstream.engine.client.Stream``."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def append(self, values: Sequence[bytes], match_tail: int | None) -> tuple[int, int]:
        from walstream.records import Record

        ack = await self._stream.append([Record(value) for value in values], match_tail=match_tail)
        return ack.start, ack.end

    async def read(self, start: int, limit: int) -> tuple[tuple[bytes, ...], int]:
        result = await self._stream.read(start=start, limit_records=limit)
        return tuple(bytes(record.value) for record in result.records), result.tail

    async def trim(self, new_start: int) -> None:
        await self._stream.trim(new_start)

    async def check_tail(self) -> int:
        return int(await self._stream.check_tail())


async def run_engine_workload(
    seed: int,
    *,
    clients: int = 4,
    operations_per_client: int = 30,
    object_error_rate: float = 0.05,
    object_ambiguous_rate: float = 0.05,
    wal_ack_delay_s: float = 0.001,
    match_tail_fraction: float = 0.2,
) -> tuple[History, CheckResult]:
    """The real engine (``walstream.engine.client.Client``) on a MemoryWal and a MemoryObjectStore wrapped
    in fault injectors, with the memory metadata store; a concurrent seeded workload on one
    stream, uploading often so reads cross the cache/object boundary; checked for
    linearizability. Raises ``ImportError`` when the engine is not installed."""
    from walstream.config import EngineConfig, UploadConfig
    from walstream.engine.client import Client
    from walstream.metadata.memory import MemoryMetadataStore
    from walstream.objects.memory import MemoryObjectStore
    from walstream.wal.memory import MemoryWal

    from .faults import FaultyObjectStore, FaultyWal, ObjectFaultPlan, WalFaultPlan, uniform

    rng = random.Random(seed)
    objects = FaultyObjectStore(
        MemoryObjectStore(),
        ObjectFaultPlan(
            error_rate=object_error_rate,
            ambiguous_rate=object_ambiguous_rate,
            latency=uniform(0, 0.002),
        ),
        random.Random(rng.random()),
    )
    wal = FaultyWal(
        MemoryWal(),
        WalFaultPlan(ack_delay=uniform(0, wal_ack_delay_s)),
        random.Random(rng.random()),
    )
    config = EngineConfig(node_id=1, upload=UploadConfig(max_bytes=2048, max_interval_s=0.01))
    client = Client(
        wal=wal,
        objects=objects,
        metadata=MemoryMetadataStore(),
        config=config,
        rng=random.Random(rng.random()),
    )
    await client.start()
    try:
        stream = await client.create_stream(f"linearizability-{seed}")
        history = await run_stream_workload(
            _EngineStream(stream),
            rng,
            clients=clients,
            operations_per_client=operations_per_client,
            match_tail_fraction=match_tail_fraction,
        )
        # Reads after a full upload come from object storage: check them too.
        try:
            await client.flush()
        except WalstreamError as exc:
            log.warning("flush failed under injected faults (%s); checking what was recorded", exc)
        tail = await stream.check_tail()
        final = History()
        final.operations = list(history.operations)
        final._clock = history._clock
        await final.record(0, "check_tail", stream.check_tail)
        start = await stream.start_offset()
        while start < tail:
            before = len(final.operations)
            result = await final.record(
                0,
                "read",
                functools.partial(_EngineStream(stream).read, start, 50),
                start=start,
                limit=50,
            )
            if not isinstance(result, tuple) or not result[0]:
                assert len(final.operations) > before
                break
            start += len(result[0])
    finally:
        with contextlib.suppress(WalstreamError):
            await client.close()
    final.notes["object_faults"] = len(objects.injected)
    final.notes["object_calls"] = objects.calls
    return final, check_linearizable(final)
