"""Fault injection: wrappers that make an object store or a WAL slow, failing, throttled,
"written but reported failed", or paused at a gate to stage a race.

Every random choice comes from the ``random.Random`` passed in and every delay goes through the
injected clock, so a failing seed replays the same faults (a :class:`~walstream.clock.ManualClock`
makes delays instant). ``injected`` logs each fault for the failure message.

Example::

    store = FaultyObjectStore(MemoryObjectStore(), ObjectFaultPlan(error_rate=0.1,
                              ambiguous_rate=0.05, latency=exponential(0.002)), random.Random(seed))
    gate = store.gate("put", key_prefix="objects/")     # the next put under objects/ waits
    ...; await gate.arrived.wait(); ...; gate.release()
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from walstream.clock import Clock, SystemClock
from walstream.errors import AmbiguousError, BackendUnavailable, Throttled, WalstreamError
from walstream.objects import BufferedObjectWriter, ObjectMeta, ObjectStore, ObjectWriter
from walstream.wal import WalMode, WalOffset, WalRecord, WriteAheadLog

__all__ = [
    "FaultyObjectStore",
    "FaultyWal",
    "Gate",
    "InjectedFault",
    "Latency",
    "ObjectFaultPlan",
    "WalFaultPlan",
    "exponential",
    "fixed",
    "long_tail",
    "uniform",
]

#: A latency distribution: seconds drawn from the given RNG.
Latency = Callable[[random.Random], float]


def fixed(seconds: float) -> Latency:
    return lambda rng: seconds


def uniform(low_s: float, high_s: float) -> Latency:
    return lambda rng: rng.uniform(low_s, high_s)


def exponential(mean_s: float, cap_s: float | None = None) -> Latency:
    cap = cap_s if cap_s is not None else mean_s * 20
    return lambda rng: min(cap, rng.expovariate(1.0 / mean_s)) if mean_s > 0 else 0.0


def long_tail(fast_s: float, slow_s: float, slow_fraction: float) -> Latency:
    """Mostly ``fast_s``; ``slow_fraction`` of the calls take ``slow_s`` (a straggler)."""
    return lambda rng: slow_s if rng.random() < slow_fraction else fast_s


@dataclass(frozen=True)
class InjectedFault:
    operation: str
    key: str
    kind: str
    """``error``, ``throttle``, ``ambiguous`` (applied, reported failed), ``fail``, ``delay``."""


class Gate:
    """A pause point: matching operations wait here until :meth:`release`.

    ``arrived`` is set when the first operation reaches the gate; ``waiting`` counts them.
    A gate closes for ``count`` operations (``None``: all until released).
    """

    def __init__(self, operation: str, key_prefix: str = "", count: int | None = None) -> None:
        self.operation = operation
        self.key_prefix = key_prefix
        self.remaining = count
        self.arrived = asyncio.Event()
        self._released = asyncio.Event()
        self.waiting = 0

    def matches(self, operation: str, key: str) -> bool:
        if self._released.is_set() or operation != self.operation:
            return False
        if not key.startswith(self.key_prefix):
            return False
        return self.remaining is None or self.remaining > 0

    async def pass_through(self) -> None:
        if self.remaining is not None:
            self.remaining -= 1
        self.waiting += 1
        self.arrived.set()
        try:
            await self._released.wait()
        finally:
            self.waiting -= 1

    def release(self) -> None:
        self._released.set()


_OBJECT_OPERATIONS = frozenset({"put", "put_if_absent", "get", "head", "delete", "list"})
_MUTATIONS = frozenset({"put", "put_if_absent", "delete"})


@dataclass
class ObjectFaultPlan:
    error_rate: float = 0.0
    """Fail with BackendUnavailable before the operation reaches the store (not applied)."""
    throttle_rate: float = 0.0
    """Fail with Throttled before the operation reaches the store."""
    ambiguous_rate: float = 0.0
    """Mutations: apply, then report failure ("written but reported failure")."""
    ambiguous_error: type[WalstreamError] = BackendUnavailable
    """What that failure looks like. An object-store client cannot tell a request that was
    applied before the connection dropped from one that was not, so BackendUnavailable (what the
    object-store contract allows) is the realistic and nasty default."""
    latency: Latency | None = None
    operations: frozenset[str] = _OBJECT_OPERATIONS
    """Which operations the plan applies to."""


class FaultyObjectStore(ObjectStore):
    """Wraps an object store; injects the faults of ``plan`` (which may be replaced any time)."""

    def __init__(
        self,
        inner: ObjectStore,
        plan: ObjectFaultPlan | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.inner = inner
        self.plan = plan or ObjectFaultPlan()
        self.capabilities = inner.capabilities
        self._rng = rng or random.Random(0)
        self._clock: Clock = clock or SystemClock()
        self._gates: list[Gate] = []
        self.injected: list[InjectedFault] = []
        self.calls = 0

    def gate(self, operation: str, key_prefix: str = "", count: int | None = 1) -> Gate:
        """Hold the next ``count`` ``operation`` calls on keys under ``key_prefix``."""
        if operation not in _OBJECT_OPERATIONS:
            raise ValueError(f"unknown object-store operation {operation!r}")
        gate = Gate(operation, key_prefix, count)
        self._gates.append(gate)
        return gate

    async def _before(self, operation: str, key: str) -> bool:
        """Delay, gate and maybe fail; returns True when the call must report an ambiguous
        failure after it is applied."""
        self.calls += 1
        plan = self.plan
        for gate in list(self._gates):
            if gate.matches(operation, key):
                await gate.pass_through()
        if operation not in plan.operations:
            return False
        if plan.latency is not None:
            delay = plan.latency(self._rng)
            if delay > 0:
                await self._clock.sleep(delay)
        roll = self._rng.random()
        if roll < plan.error_rate:
            self._note(operation, key, "error")
            raise BackendUnavailable(f"injected fault: {operation} {key!r} failed; retry")
        roll -= plan.error_rate
        if roll < plan.throttle_rate:
            self._note(operation, key, "throttle")
            raise Throttled(f"injected fault: {operation} {key!r} throttled; slow down and retry")
        roll -= plan.throttle_rate
        if operation in _MUTATIONS and roll < plan.ambiguous_rate:
            self._note(operation, key, "ambiguous")
            return True
        return False

    def _note(self, operation: str, key: str, kind: str) -> None:
        self.injected.append(InjectedFault(operation, key, kind))

    def _ambiguous(self, operation: str, key: str) -> WalstreamError:
        return self.plan.ambiguous_error(
            f"injected fault: {operation} {key!r} was applied but reported failure; read back "
            "before retrying"
        )

    async def put(self, key: str, data: bytes) -> None:
        ambiguous = await self._before("put", key)
        await self.inner.put(key, data)
        if ambiguous:
            raise self._ambiguous("put", key)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        ambiguous = await self._before("put_if_absent", key)
        await self.inner.put_if_absent(key, data)
        if ambiguous:
            raise self._ambiguous("put_if_absent", key)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        await self._before("get", key)
        return await self.inner.get(key, start, end)

    async def head(self, key: str) -> ObjectMeta:
        await self._before("head", key)
        return await self.inner.head(key)

    async def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        ambiguous = await self._before("delete", keys[0] if keys else "")
        await self.inner.delete(keys)
        if ambiguous:
            raise self._ambiguous("delete", ",".join(keys[:3]))

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectMeta]:
        await self._before("list", prefix)
        async for meta in self.inner.list(prefix):
            yield meta

    def writer(self, key: str) -> ObjectWriter:
        # Parts are buffered and published by one faulty put.
        return BufferedObjectWriter(self, key)

    async def close(self) -> None:
        await self.inner.close()

    def describe(self) -> dict[str, Any]:
        return {"type": "faulty", "inner": self.inner.describe(), "injected": len(self.injected)}


@dataclass
class WalFaultPlan:
    ack_delay: Latency | None = None
    """Extra time before an append is acknowledged (order is kept)."""
    fail_rate: float = 0.0
    """An append fails before reaching the WAL (BackendUnavailable); later appends are refused."""
    ambiguous_rate: float = 0.0
    """An append reaches the WAL, then fails (AmbiguousError); so do the ones behind it, and
    later appends are refused."""
    trim_delay: Latency | None = None


class FaultyWal(WriteAheadLog):
    """Wraps a WAL; keeps its promises (ordered acks, no ack after a failure) while adding
    delays and failures."""

    def __init__(
        self,
        inner: WriteAheadLog,
        plan: WalFaultPlan | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.inner = inner
        self.plan = plan or WalFaultPlan()
        self.capabilities = inner.capabilities
        self._rng = rng or random.Random(0)
        self._clock: Clock = clock or SystemClock()
        self._previous_ack: asyncio.Future[WalOffset] | None = None
        self._failure: WalstreamError | None = None
        self.injected: list[InjectedFault] = []

    def bind_deployment(self, deployment_id: bytes) -> None:
        super().bind_deployment(deployment_id)
        self.inner.bind_deployment(deployment_id)

    async def start(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        await self.inner.start(node_id, node_epoch, mode)

    def append(self, data: bytes) -> asyncio.Future[WalOffset]:
        if self._failure is not None:
            raise BackendUnavailable(
                f"the WAL refused appends after an earlier failure ({self._failure}); restart"
            )
        plan = self.plan
        roll = self._rng.random()
        if roll < plan.fail_rate:
            self.injected.append(InjectedFault("append", "", "fail"))
            self._failure = BackendUnavailable("injected fault: WAL append failed before writing")
            raise self._failure
        ambiguous = plan.ambiguous_rate > 0 and roll - plan.fail_rate < plan.ambiguous_rate
        durable = self.inner.append(data)
        if ambiguous:
            self.injected.append(InjectedFault("append", "", "ambiguous"))
            self._failure = AmbiguousError(
                "injected fault: WAL append was written but reported failure; restart to recover"
            )
        delay = plan.ack_delay(self._rng) if plan.ack_delay is not None else 0.0
        previous = self._previous_ack
        failure = self._failure

        async def acknowledge() -> WalOffset:
            try:
                offset = await durable
            finally:
                if delay > 0:
                    await self._clock.sleep(delay)
                if previous is not None:
                    await asyncio.wait([previous])
            if previous is not None and isinstance(previous.exception(), AmbiguousError):
                # Behind an injected ambiguous failure: never acknowledge after a possible hole.
                raise AmbiguousError(
                    "an earlier WAL append failed; this one was written after it and is not "
                    "acknowledged"
                )
            if failure is not None and ambiguous:
                raise failure
            return offset

        acknowledgement = asyncio.ensure_future(acknowledge())
        self._previous_ack = acknowledgement
        return acknowledgement

    def recover(self) -> AsyncIterator[WalRecord]:
        return self.inner.recover()

    async def trim(self, offset: WalOffset) -> None:
        if self.plan.trim_delay is not None:
            await self._clock.sleep(self.plan.trim_delay(self._rng))
        await self.inner.trim(offset)

    async def reset(self) -> None:
        await self.inner.reset()

    async def close(self) -> None:
        await self.inner.close()
        if self._previous_ack is not None:
            await asyncio.wait([self._previous_ack])

    def describe(self) -> dict[str, Any]:
        return {"type": "faulty", "inner": self.inner.describe(), "injected": len(self.injected)}
