"""The WAL suite: one test per numbered invariant of :class:`walstream.wal.WriteAheadLog`, plus the
crash harness and the power-loss simulation.

A backend provides ``walstream_wal_factory`` (a callable making a new instance on the same
medium, so a test can restart and recover) and, optionally:

- ``walstream_wal_spec``: a :class:`~walstream_conformance.backends.BackendSpec` that builds the
  WAL in another process (enables the SIGKILL crash harness);
- ``walstream_wal_power_loss``: a callable that drops every write not yet synced to stable media
  (enables the power-loss test; see :mod:`walstream_conformance.harness.power`);
- ``walstream_wal_medium_fault``: a callable ``fault(broken: bool)`` that makes the medium fail
  or heals it (enables the medium-error translation test).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from walstream.errors import CapacityError, FencedError, IdentityMismatch, WalstreamError
from walstream.wal import WalMode, WalOffset, WalRecord, WriteAheadLog

from ..backends import BackendSpec
from ..requirements import (
    LARGEST_TEST_ALLOCATION_BYTES,
    WalRequirements,
    check_version,
    skip_unchecked,
)

__all__ = ["WalKit", "WalSuite", "append_now", "payload"]

WalFactory = Callable[[], WriteAheadLog]


def payload(seed: int, index: int, size: int) -> bytes:
    """Deterministic, distinct bytes for record ``index`` (distinct even at size 0..7 via size)."""
    head = index.to_bytes(8, "big")
    if size <= 8:
        return head[8 - size :] if size else b""
    return head + random.Random(seed * 1_000_003 + index).randbytes(size - 8)


async def append_now(wal: WriteAheadLog, data: bytes) -> WalOffset:
    """``await wal.append(data)`` whether the WAL raises at call time or through the awaitable."""
    return await wal.append(data)


@dataclass
class WalKit:
    """Everything a WAL test needs; built by the ``walstream_wal_kit`` fixture."""

    factory: WalFactory
    spec: BackendSpec | None = None
    power_loss: Callable[[], None] | None = None
    medium_fault: Callable[[bool], None] | None = None
    crash_cycles: int = 3
    seed: int = 0
    node_id: int = 1
    epoch_base: int = 1
    _epoch: int = 0
    _opened: list[WriteAheadLog] = field(default_factory=list)
    _requirements: WalRequirements | None = None

    def next_epoch(self) -> int:
        self._epoch += 1
        return self.epoch_base + self._epoch

    @property
    def requirements(self) -> WalRequirements:
        if self._requirements is None:
            self._requirements = WalRequirements(self.factory().capabilities)
        return self._requirements

    def new(self) -> WriteAheadLog:
        wal = self.factory()
        self._opened.append(wal)
        return wal

    async def open(
        self, mode: WalMode = WalMode.READ_WRITE, *, reset: bool = False, epoch: int | None = None
    ) -> tuple[WriteAheadLog, list[WalRecord]]:
        """Start a new instance on the medium and recover it to the end (then ``reset``)."""
        wal = self.new()
        await wal.start(self.node_id, epoch if epoch is not None else self.next_epoch(), mode)
        recovered = [record async for record in wal.recover()]
        if reset:
            await wal.reset()
        return wal, recovered

    async def fresh(self) -> WriteAheadLog:
        """A writable WAL with nothing to recover (leftovers of a shared medium are reset)."""
        wal, _ = await self.open(reset=True)
        return wal

    async def restart(self, wal: WriteAheadLog) -> tuple[WriteAheadLog, list[WalRecord]]:
        await wal.close()
        return await self.open()

    async def aclose(self) -> None:
        for wal in reversed(self._opened):
            with contextlib.suppress(Exception):
                await wal.close()
        self._opened.clear()


def _assert_same_records(
    recovered: Sequence[WalRecord], expected: Sequence[tuple[WalOffset, bytes]], what: str
) -> None:
    got = [(record.offset, bytes(record.data)) for record in recovered]
    if got == list(expected):
        return
    got_offsets = [offset for offset, _ in got]
    want_offsets = [offset for offset, _ in expected]
    missing = sorted(set(want_offsets) - set(got_offsets))
    extra = sorted(set(got_offsets) - set(want_offsets))
    wrong = [o for (o, d), (o2, d2) in zip(got, expected, strict=False) if o == o2 and d != d2]
    raise AssertionError(
        f"{what}: recovered {len(got)} records, expected {len(expected)}; missing offsets "
        f"{missing[:10]}, unexpected offsets {extra[:10]}, offsets with other bytes {wrong[:10]}, "
        f"recovered order {got_offsets[:20]}"
    )


async def _typed(call: Callable[[], Awaitable[Any]], what: str) -> BaseException | None:
    """Run ``call``; any exception must be a walstream error. Returns it (or None)."""
    try:
        await call()
    except WalstreamError as exc:
        return exc
    except Exception as exc:
        raise AssertionError(
            f"{what} raised {type(exc).__name__}: {exc} — not a walstream.errors type"
        ) from exc
    return None


def _note_completion(completions: list[int], index: int, _future: object) -> None:
    completions.append(index)


class WalSuite:
    """Subclass with one line (``class TestMyWal(WalSuite): pass``) next to a
    ``walstream_wal_factory`` fixture."""

    pytestmark = pytest.mark.asyncio  # also under pytest-asyncio's strict mode

    @pytest.fixture(autouse=True)
    def _walstream_contract_version(self) -> None:
        check_version()

    # 1 ------------------------------------------------------------------------------------------
    async def test_ack_order(self, walstream_wal_kit: WalKit) -> None:
        """Futures complete in call order; offsets follow call order."""
        wal = await walstream_wal_kit.fresh()
        completions: list[int] = []
        futures = []
        for index in range(200):
            future = asyncio.ensure_future(wal.append(payload(1, index, 16 + index % 50)))
            future.add_done_callback(functools.partial(_note_completion, completions, index))
            futures.append(future)
            if index % 17 == 0:
                await asyncio.sleep(0)
        offsets = await asyncio.gather(*futures)
        assert completions == sorted(completions), (
            f"acknowledgements completed out of call order: {completions[:40]}"
        )
        assert all(a < b for a, b in itertools.pairwise(offsets)), (
            f"offsets do not increase in call order: {offsets[:40]}"
        )

    # 2 ------------------------------------------------------------------------------------------
    async def test_acked_recovered(self, walstream_wal_kit: WalKit) -> None:
        """Every acknowledged, untrimmed record is recovered after a restart."""
        kit = walstream_wal_kit
        wal = await kit.fresh()
        written = []
        for index in range(120):
            data = payload(2, index, 1 + (index * 37) % 3000)
            written.append((await wal.append(data), data))
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, written, "after a clean restart")
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, written, "after a second restart without appends")

    # 3 ------------------------------------------------------------------------------------------
    async def test_recover_order_exactly_once(self, walstream_wal_kit: WalKit) -> None:
        """Recovery yields append order, each record once, with its offset and exact bytes."""
        kit = walstream_wal_kit
        wal = await kit.fresh()
        datas = [payload(3, index, 100) for index in range(64)]
        offsets = await asyncio.gather(*[wal.append(data) for data in datas])
        wal, recovered = await kit.restart(wal)
        seen = [record.offset for record in recovered]
        assert len(seen) == len(set(seen)), f"a record was recovered twice: {seen}"
        assert seen == sorted(seen), f"recovery is out of append order: {seen}"
        _assert_same_records(recovered, list(zip(offsets, datas, strict=True)), "recovery")

    # 4 ------------------------------------------------------------------------------------------
    async def test_offsets_increase(self, walstream_wal_kit: WalKit) -> None:
        """Offsets strictly increase in append order, across restarts and resets."""
        kit = walstream_wal_kit
        wal = await kit.fresh()
        first = [await wal.append(payload(4, i, 10)) for i in range(5)]
        wal, _ = await kit.restart(wal)
        second = [await wal.append(payload(4, 10 + i, 10)) for i in range(5)]
        await wal.reset()
        third = [await wal.append(payload(4, 20 + i, 10)) for i in range(5)]
        wal, _ = await kit.restart(wal)
        fourth = [await wal.append(payload(4, 30 + i, 10)) for i in range(5)]
        offsets = first + second + third + fourth
        assert all(a < b for a, b in itertools.pairwise(offsets)), (
            f"offsets did not strictly increase across restarts/reset: {offsets}"
        )

    # 5 ------------------------------------------------------------------------------------------
    async def test_trim_inclusive(self, walstream_wal_kit: WalKit) -> None:
        """After ``trim(o)`` no record ``<= o`` is recovered; idempotent; never backwards."""
        kit = walstream_wal_kit
        wal = await kit.fresh()
        written = [(await wal.append(payload(5, i, 50)), payload(5, i, 50)) for i in range(12)]
        await wal.trim(written[4][0])
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, written[5:], f"after trim({written[4][0]})")
        await wal.trim(written[4][0])  # idempotent
        await wal.trim(written[1][0])  # backwards: no effect
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, written[5:], "after a repeated and a backwards trim")
        await wal.trim(written[-1][0])
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, [], "after trimming the last record")

    # 6 ------------------------------------------------------------------------------------------
    async def test_reset(self, walstream_wal_kit: WalKit) -> None:
        """After ``reset`` nothing is recovered and new offsets exceed every earlier one."""
        kit = walstream_wal_kit
        wal = await kit.fresh()
        before = [await wal.append(payload(6, i, 200)) for i in range(10)]
        wal, recovered = await kit.restart(wal)
        assert len(recovered) == 10
        await wal.reset()
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, [], "after reset()")
        after = [
            (await wal.append(payload(6, 100 + i, 20)), payload(6, 100 + i, 20)) for i in range(3)
        ]
        assert after[0][0] > before[-1], f"offset {after[0][0]} after reset <= {before[-1]}"
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, after, "records appended after reset()")

    # 7 ------------------------------------------------------------------------------------------
    async def test_capacity_record_too_large(self, walstream_wal_kit: WalKit) -> None:
        """A record above ``max_record_bytes`` fails with CapacityError and writes nothing."""
        kit = walstream_wal_kit
        maximum = kit.requirements.capabilities.max_record_bytes
        if maximum + 1 > LARGEST_TEST_ALLOCATION_BYTES:
            skip_unchecked(
                f"max_record_bytes below {LARGEST_TEST_ALLOCATION_BYTES >> 20} MiB",
                f"the declared {maximum} is too large to allocate a record above it; configure "
                "a smaller max_record_bytes",
            )
        wal = await kit.fresh()
        kept = await wal.append(b"kept")
        with pytest.raises(CapacityError):
            await asyncio.wait_for(append_now(wal, b"x" * (maximum + 1)), 10)
        after = await wal.append(b"after")
        wal, recovered = await kit.restart(wal)
        _assert_same_records(
            recovered, [(kept, b"kept"), (after, b"after")], "around an oversized append"
        )

    @pytest.mark.slow  # seconds on every backend measured
    async def test_capacity_backpressure(self, walstream_wal_kit: WalKit) -> None:
        """When untrimmed records fill the WAL, appends wait for a trim, else fail with
        CapacityError; the WAL stays usable."""
        kit = walstream_wal_kit
        capacity = kit.requirements.require_bounded_capacity()
        record_bytes = max(1, min(kit.requirements.capabilities.max_record_bytes, capacity // 8))
        wal = await kit.fresh()
        count = capacity // record_bytes + 4
        futures = [
            asyncio.ensure_future(wal.append(payload(7, i, record_bytes))) for i in range(count)
        ]
        acked = await _wait_until_stalled(futures)
        assert acked < count, (
            f"{count} records of {record_bytes} bytes ({count * record_bytes} bytes) were all "
            f"acknowledged untrimmed in a WAL of capacity {capacity} bytes"
        )
        if acked:
            await wal.trim(futures[acked - 1].result())
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 120)
        for result in results[acked:]:
            if isinstance(result, BaseException) and not isinstance(result, CapacityError):
                raise AssertionError(
                    f"a waiting append failed with {type(result).__name__}: {result}"
                )
        done = [r for r in results if not isinstance(r, BaseException)]
        if done:
            await wal.trim(max(done))
        # Without a trim the waiting append must eventually fail with CapacityError.
        filler = [
            asyncio.ensure_future(wal.append(payload(8, i, record_bytes))) for i in range(count)
        ]
        filled = await asyncio.wait_for(asyncio.gather(*filler, return_exceptions=True), 120)
        errors = [r for r in filled if isinstance(r, BaseException)]
        assert errors, "appends beyond capacity never failed"
        assert all(isinstance(e, CapacityError) for e in errors), (
            f"appends beyond capacity failed with {sorted({type(e).__name__ for e in errors})}, "
            "expected CapacityError"
        )
        ok = [r for r in filled if not isinstance(r, BaseException)]
        if ok:
            await wal.trim(max(ok))
        last = await asyncio.wait_for(append_now(wal, b"usable again"), 30)
        wal, recovered = await kit.restart(wal)
        assert [record.offset for record in recovered][-1:] == [last]

    # records from empty to the maximum ------------------------------------------------------------
    async def test_record_sizes(self, walstream_wal_kit: WalKit) -> None:
        """Records of every size from 0 bytes to ``max_record_bytes`` round-trip exactly."""
        kit = walstream_wal_kit
        caps = kit.requirements.capabilities
        top = min(caps.max_record_bytes, LARGEST_TEST_ALLOCATION_BYTES)
        budget = (caps.capacity_bytes or 1 << 62) // 3
        if top > budget:
            top = budget
        sizes = sorted(
            {
                size
                for size in (
                    0,
                    1,
                    2,
                    3,
                    7,
                    8,
                    9,
                    100,
                    511,
                    512,
                    513,
                    4095,
                    4096,
                    4097,
                    65535,
                    65536,
                    65537,
                    1 << 20,
                    top - 1,
                    top,
                )
                if 0 <= size <= top
            }
        )
        wal = await kit.fresh()
        round_written: list[tuple[WalOffset, bytes]] = []
        round_bytes = 0
        for index, size in enumerate(sizes):
            data = payload(9, index, size)
            if round_bytes + size > budget and round_written:
                wal, recovered = await kit.restart(wal)
                _assert_same_records(recovered, round_written, "records of many sizes")
                await wal.trim(round_written[-1][0])
                round_written, round_bytes = [], 0
            round_written.append((await wal.append(data), data))
            round_bytes += size
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, round_written, f"records of sizes {sizes}")

    # concurrent appenders -------------------------------------------------------------------------
    async def test_concurrent_appenders(self, walstream_wal_kit: WalKit) -> None:
        """Many tasks appending at once: every record acked once, in each task's order."""
        kit = walstream_wal_kit
        wal = await kit.fresh()

        async def appender(task: int) -> list[tuple[WalOffset, bytes]]:
            written = []
            for index in range(40):
                data = payload(10, task * 1000 + index, 1 + (task * 131 + index * 17) % 700)
                written.append((await wal.append(data), data))
            return written

        per_task = await asyncio.gather(*[appender(task) for task in range(8)])
        for written in per_task:
            offsets = [offset for offset, _ in written]
            assert offsets == sorted(offsets), "one task's appends got offsets out of its order"
        everything = sorted(item for written in per_task for item in written)
        assert len({offset for offset, _ in everything}) == len(everything), "an offset was reused"
        wal, recovered = await kit.restart(wal)
        _assert_same_records(recovered, everything, "after concurrent appenders")

    # 10 -----------------------------------------------------------------------------------------
    async def test_close(self, walstream_wal_kit: WalKit) -> None:
        """``close`` waits for in-flight appends; afterwards ``append`` raises; reopen recovers."""
        kit = walstream_wal_kit
        wal = await kit.fresh()
        datas = [payload(11, i, 300) for i in range(50)]
        futures = [asyncio.ensure_future(wal.append(data)) for data in datas]
        await wal.close()
        assert all(future.done() for future in futures), "close() returned with appends in flight"
        offsets = [future.result() for future in futures]
        error = await _typed(lambda: append_now(wal, b"after close"), "append() after close()")
        assert error is not None, "append() after close() was accepted"
        _, recovered = await kit.open()
        _assert_same_records(
            recovered, list(zip(offsets, datas, strict=True)), "after close/reopen"
        )

    # 8 ------------------------------------------------------------------------------------------
    async def test_fencing(self, walstream_wal_kit: WalKit) -> None:
        """After another instance starts the WAL in FAILOVER mode with a higher epoch, the old
        writer (a zombie) gets no further acknowledgement."""
        kit = walstream_wal_kit
        kit.requirements.require("supports_failover")
        zombie = await kit.fresh()
        acked: list[tuple[WalOffset, bytes]] = []
        for index in range(20):
            data = payload(12, index, 64)
            acked.append((await zombie.append(data), data))
        fence_started = asyncio.Event()
        fence_done = asyncio.Event()
        late: list[tuple[bool, BaseException | WalOffset]] = []
        failures: list[WalstreamError] = []

        async def keep_appending() -> None:
            index = 100
            while len(late) < 30:
                issued_after_fence = fence_done.is_set()
                data = payload(12, index, 64)
                index += 1
                try:
                    offset = await append_now(zombie, data)
                except WalstreamError as exc:
                    failures.append(exc)
                    if issued_after_fence:
                        late.append((True, exc))
                    if fence_done.is_set():
                        await asyncio.sleep(0)
                    else:
                        await asyncio.sleep(0.001)
                    continue
                if issued_after_fence:
                    late.append((True, offset))
                else:
                    acked.append((offset, data))
                fence_started.set()

        zombie_task = asyncio.create_task(keep_appending())
        await asyncio.wait_for(fence_started.wait(), 10)
        successor = kit.new()
        await successor.start(kit.node_id, kit.next_epoch() + 100, WalMode.FAILOVER)
        fence_done.set()
        recovered = [record async for record in successor.recover()]
        await asyncio.wait_for(zombie_task, 30)
        acknowledged_late = [result for _, result in late if not isinstance(result, BaseException)]
        assert not acknowledged_late, (
            "the fenced writer acknowledged appends issued after FAILOVER start: "
            f"{acknowledged_late[:5]}"
        )
        first_error = failures[0]
        assert isinstance(first_error, FencedError), (
            f"the zombie's first failure after the fence is {type(first_error).__name__}: "
            f"{first_error}, expected FencedError"
        )
        got = {record.offset: bytes(record.data) for record in recovered}
        missing = [offset for offset, data in acked if got.get(offset) != data]
        assert not missing, (
            f"FAILOVER recovery lost records the zombie acknowledged: {missing[:10]}"
        )
        if recovered:
            await successor.trim(recovered[-1].offset)

    # 9 ------------------------------------------------------------------------------------------
    async def test_errors_typed(self, walstream_wal_kit: WalKit) -> None:
        """Misuse and medium failures surface as walstream.errors types; nothing is written by a
        READ_ONLY instance."""
        kit = walstream_wal_kit
        unstarted = kit.new()
        assert await _typed(lambda: append_now(unstarted, b"x"), "append() before start()")
        wal = await kit.fresh()
        kept = await wal.append(b"kept")
        await wal.close()
        reader, recovered = await kit.open(WalMode.READ_ONLY)
        _assert_same_records(recovered, [(kept, b"kept")], "READ_ONLY recovery")
        assert await _typed(lambda: append_now(reader, b"nope"), "append() on a READ_ONLY WAL"), (
            "append() on a READ_ONLY WAL was accepted"
        )
        await reader.close()
        wal, recovered = await kit.open()
        _assert_same_records(recovered, [(kept, b"kept")], "after a READ_ONLY instance")
        # Trimming past the end may be refused or may trim everything; either way, typed.
        await _typed(lambda: wal.trim(kept + 1_000_000), "trim() beyond the last offset")

    async def test_errors_typed_medium_failure(self, walstream_wal_kit: WalKit) -> None:
        """A failing medium surfaces as a walstream error and, after a failed write, the WAL
        refuses further appends (no acknowledged record after a hole)."""
        kit = walstream_wal_kit
        if kit.medium_fault is None:
            skip_unchecked(
                "fixture walstream_wal_medium_fault",
                "a way to make the medium fail and heal, defined in the backend's own tests",
            )
        wal = await kit.fresh()
        kept = [(await wal.append(payload(13, i, 100)), payload(13, i, 100)) for i in range(5)]
        kit.medium_fault(True)
        try:
            failure = await _typed(
                lambda: append_now(wal, payload(13, 99, 100)), "append() on a failed medium"
            )
            assert failure is not None, "append() on a failing medium was acknowledged"
        finally:
            kit.medium_fault(False)
        refused = await _typed(
            lambda: append_now(wal, payload(13, 100, 100)), "append() after a failure"
        )
        assert refused is not None, "the WAL acknowledged an append after a failed write"
        with contextlib.suppress(WalstreamError):
            await wal.close()
        _, recovered = await kit.open()
        got = {record.offset: bytes(record.data) for record in recovered}
        assert all(got.get(offset) == data for offset, data in kept), (
            "records acked before the failure were lost"
        )
        assert payload(13, 100, 100) not in got.values(), "a refused append was recovered"

    # 2, under SIGKILL -----------------------------------------------------------------------------
    @pytest.mark.slow  # seconds on every backend measured
    async def test_acked_recovered_after_process_kill(
        self, walstream_wal_kit: WalKit, tmp_path: Any
    ) -> None:
        """The crash harness: a writer in a child process is SIGKILLed at seeded random points;
        a fresh process recovers every acknowledged record exactly once."""
        from ..harness.crash import run_crash_cycles

        kit = walstream_wal_kit
        kit.requirements.require("survives_process_kill")
        kit.requirements.require("shared_between_processes")
        if kit.spec is None:
            skip_unchecked(
                "fixture walstream_wal_spec",
                "how to build the WAL in a child process (the crash harness SIGKILLs it), "
                "defined in the backend's own tests",
            )
        report = await asyncio.to_thread(
            run_crash_cycles, kit.spec, cycles=kit.crash_cycles, seed=kit.seed, workdir=tmp_path
        )
        assert report.acknowledged > 0, "the crash harness saw no acknowledged record"

    # 2, under power loss --------------------------------------------------------------------------
    async def test_acked_recovered_after_power_loss(self, walstream_wal_kit: WalKit) -> None:
        """Acknowledged records were synced: dropping every unsynced write loses none of them."""
        kit = walstream_wal_kit
        kit.requirements.require("survives_power_loss")
        if kit.power_loss is None:
            skip_unchecked(
                "fixture walstream_wal_power_loss",
                "a medium that can lose every unsynced write, defined in the backend's own "
                "tests",
            )
        wal = await kit.fresh()
        acked: list[tuple[WalOffset, bytes]] = []
        for round_index in range(4):
            datas = [payload(14, round_index * 100 + i, 10 + i * 7) for i in range(25)]
            offsets = await asyncio.gather(*[wal.append(data) for data in datas])
            acked.extend(zip(offsets, datas, strict=True))
        kit.power_loss()
        with contextlib.suppress(Exception):
            await wal.close()
        _, recovered = await kit.open()
        got = {record.offset: bytes(record.data) for record in recovered}
        lost = [offset for offset, data in acked if got.get(offset) != data]
        assert not lost, (
            f"{len(lost)} acknowledged records lost in a power loss: offsets {lost[:10]}"
        )

    # 12 -----------------------------------------------------------------------------------------
    async def test_identity(self, walstream_wal_kit: WalKit) -> None:
        """A WAL bound to one deployment refuses to be opened for another, and never yields the
        other deployment's records; its own deployment still recovers everything."""
        kit = walstream_wal_kit
        kit.requirements.require("checks_identity")
        ours, theirs = bytes(range(16)), bytes(range(100, 116))
        wal = kit.new()
        wal.bind_deployment(ours)
        await wal.start(kit.node_id, kit.next_epoch(), WalMode.READ_WRITE)
        _ = [record async for record in wal.recover()]
        await wal.reset()
        written = []
        for index in range(20):
            data = payload(15, index, 200)
            written.append((await wal.append(data), data))
        await wal.close()

        foreign = kit.new()
        foreign.bind_deployment(theirs)
        leaked: list[WalRecord] = []
        with pytest.raises(IdentityMismatch):
            await foreign.start(kit.node_id, kit.next_epoch(), WalMode.READ_WRITE)
            leaked.extend([record async for record in foreign.recover()])
        assert not leaked, f"a foreign deployment recovered {len(leaked)} of our records"
        with contextlib.suppress(Exception):
            await foreign.close()

        again = kit.new()
        again.bind_deployment(ours)
        await again.start(kit.node_id, kit.next_epoch(), WalMode.READ_WRITE)
        recovered = [record async for record in again.recover()]
        _assert_same_records(recovered, written, "our deployment after a foreign open")
        await again.reset()


async def _wait_until_stalled(futures: Sequence[asyncio.Future[Any]], quiet_s: float = 0.4) -> int:
    """Wait until no more of ``futures`` complete for ``quiet_s``; return how many succeeded as a
    prefix (acks come in order)."""
    previous = -1
    while True:
        done_prefix = 0
        for future in futures:
            if not future.done() or future.exception() is not None:
                break
            done_prefix += 1
        if done_prefix == previous or done_prefix == len(futures):
            return done_prefix
        previous = done_prefix
        await asyncio.sleep(quiet_s)
