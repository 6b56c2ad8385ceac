"""The fault-injection wrappers: faults replay by seed, gates stage races, and the wrappers keep
the contracts they wrap (they pass the suites when only slowed down)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable

import pytest
from walstream.clock import ManualClock
from walstream.errors import AmbiguousError, BackendUnavailable, PreconditionFailed, Throttled
from walstream.objects import ObjectStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal import WalMode, WriteAheadLog
from walstream.wal.memory import MemoryWal
from walstream_conformance import ObjectStoreSuite, WalSuite
from walstream_conformance.faults import (
    FaultyObjectStore,
    FaultyWal,
    ObjectFaultPlan,
    WalFaultPlan,
    exponential,
    long_tail,
    uniform,
)

_volumes = itertools.count()


async def _faulty_run(seed: int) -> list[tuple[str, str, str]]:
    store = FaultyObjectStore(
        MemoryObjectStore(),
        ObjectFaultPlan(
            error_rate=0.2, throttle_rate=0.1, ambiguous_rate=0.2, latency=exponential(0.5)
        ),
        random.Random(seed),
        ManualClock(),
    )
    outcomes = []
    for index in range(60):
        key = f"k{index % 7}"
        try:
            await store.put(key, b"x")
            outcomes.append(("put", key, "ok"))
        except (BackendUnavailable, AmbiguousError) as exc:
            outcomes.append(("put", key, type(exc).__name__))
    assert store.injected, "no fault was injected"
    return outcomes


async def test_a_seed_replays_the_same_faults() -> None:
    assert await _faulty_run(3) == await _faulty_run(3)
    assert await _faulty_run(3) != await _faulty_run(4)


async def test_written_but_reported_failure_is_applied() -> None:
    inner = MemoryObjectStore()
    store = FaultyObjectStore(inner, ObjectFaultPlan(ambiguous_rate=1.0), random.Random(1))
    with pytest.raises(BackendUnavailable):
        await store.put("k", b"landed")
    assert await inner.get("k") == b"landed"
    errors = FaultyObjectStore(inner, ObjectFaultPlan(error_rate=1.0), random.Random(1))
    with pytest.raises(BackendUnavailable):
        await errors.put("k2", b"never")
    assert [meta.key async for meta in inner.list()] == ["k"]
    throttled = FaultyObjectStore(inner, ObjectFaultPlan(throttle_rate=1.0), random.Random(1))
    with pytest.raises(Throttled):
        await throttled.get("k")


async def test_gate_stages_a_race() -> None:
    """Hold one creator after its check, let the other win, then release: the held one loses."""
    store = FaultyObjectStore(MemoryObjectStore(), rng=random.Random(0))
    gate = store.gate("put_if_absent", key_prefix="race/", count=1)
    held = asyncio.create_task(store.put_if_absent("race/x", b"held"))
    await asyncio.wait_for(gate.arrived.wait(), 5)
    assert gate.waiting == 1
    await store.put_if_absent("race/x", b"winner")
    gate.release()
    with pytest.raises(PreconditionFailed):
        await held
    assert await store.get("race/x") == b"winner"


async def test_latency_uses_the_injected_clock() -> None:
    clock = ManualClock()
    store = FaultyObjectStore(
        MemoryObjectStore(),
        ObjectFaultPlan(latency=long_tail(1.0, 30.0, 0.5)),
        random.Random(2),
        clock,
    )
    for index in range(10):
        await store.put(f"k{index}", b"")
    assert 10.0 <= clock.monotonic() <= 300.0  # simulated seconds, no real waiting


async def test_faulty_wal_refuses_after_a_failure_and_keeps_ack_order() -> None:
    wal = FaultyWal(MemoryWal(), WalFaultPlan(ack_delay=uniform(0, 0.003)), random.Random(5))
    await wal.start(1, 1, WalMode.READ_WRITE)
    _ = [record async for record in wal.recover()]
    order: list[int] = []
    futures = []
    for index in range(50):
        future = asyncio.ensure_future(wal.append(b"%d" % index))
        future.add_done_callback(lambda _f, i=index: order.append(i))
        futures.append(future)
    await asyncio.gather(*futures)
    assert order == list(range(50))
    wal.plan = WalFaultPlan(ambiguous_rate=1.0)
    failing = wal.append(b"ambiguous")
    with pytest.raises(AmbiguousError):
        await failing
    with pytest.raises(BackendUnavailable):
        await wal.append(b"refused")
    await wal.close()


class TestSlowWalKeepsTheContract(WalSuite):
    @pytest.fixture
    def walstream_wal_factory(self) -> Callable[[], WriteAheadLog]:
        volume = f"conformance-faulty-wal-{next(_volumes)}"
        rng = random.Random(9)
        return lambda: FaultyWal(
            MemoryWal(
                volume, capacity_bytes=1 << 20, max_record_bytes=256 << 10, capacity_wait_s=1.0
            ),
            WalFaultPlan(ack_delay=uniform(0, 0.002)),
            rng,
        )


class TestSlowObjectStoreKeepsTheContract(ObjectStoreSuite):
    @pytest.fixture
    def walstream_object_store(self) -> ObjectStore:
        return FaultyObjectStore(
            MemoryObjectStore(), ObjectFaultPlan(latency=uniform(0, 0.0005)), random.Random(4)
        )
