"""GroupCommitWal's two ways of telling an append's outcome: the contract's future
(``append``) and the engine's callback (``append_then``), which settle in one order, exactly
once, success or failure."""

from __future__ import annotations

import asyncio
import logging

import pytest
from walstream.errors import AmbiguousError, BackendUnavailable
from walstream.wal.contract import WalMode
from walstream.wal.group_commit import PreparedGroup
from walstream.wal.memory import MemoryWal


class BreakingWal(MemoryWal):
    """A memory WAL whose group writes fail once ``broken`` is set (a device gone)."""

    broken = False

    async def _write_group(self, group: PreparedGroup) -> None:
        if self.broken:
            raise OSError("the device went away")
        await super()._write_group(group)


async def started(wal: MemoryWal) -> MemoryWal:
    await wal.start(1, 1, WalMode.READ_WRITE)
    await wal.reset()
    return wal


async def test_callbacks_and_futures_settle_in_append_order_exactly_once() -> None:
    wal = await started(MemoryWal(write_delay_s=0.002, max_inflight=2))
    told: list[tuple[str, int, BaseException | None]] = []
    futures: list[tuple[str, asyncio.Future[int]]] = []
    for index in range(40):
        name = f"r{index}"
        if index % 3 == 0:
            futures.append((name, wal.append(name.encode())))
        else:
            wal.append_then(
                name.encode(), lambda offset, error, name=name: told.append((name, offset, error))
            )
        if index % 7 == 0:
            await asyncio.sleep(0)  # several groups, several writes in flight
    await asyncio.gather(*(future for _, future in futures))
    await asyncio.sleep(0)
    settled = sorted(
        [(offset, name) for name, offset, _ in told]
        + [(future.result(), name) for name, future in futures]
    )
    assert [name for _, name in settled] == [f"r{index}" for index in range(40)]
    assert len(told) == len({name for name, _, _ in told}) == 26  # each once
    assert all(error is None for _, _, error in told)
    # The order they were told in is the append order.
    assert [name for name, _, _ in told] == [
        f"r{index}" for index in range(40) if index % 3 != 0
    ]
    await wal.close()


async def test_a_failed_write_tells_every_waiting_callback_once_and_refuses_later_appends() -> (
    None
):
    wal = await started(BreakingWal(write_delay_s=0.001))
    told: list[tuple[int, BaseException | None]] = []
    wal.append_then(b"kept", lambda offset, error: told.append((offset, error)))
    await asyncio.sleep(0.02)
    assert told == [(0, None)]
    wal.broken = True
    for index in range(5):
        wal.append_then(b"lost %d" % index, lambda offset, error: told.append((offset, error)))
    await asyncio.sleep(0.05)
    assert len(told) == 6
    assert all(offset == -1 and isinstance(error, AmbiguousError) for offset, error in told[1:])
    with pytest.raises(BackendUnavailable, match="earlier failure"):
        wal.append_then(b"after", lambda offset, error: told.append((offset, error)))
    assert len(told) == 6  # refused on the spot: never told
    await wal.close()


async def test_a_callback_that_raises_does_not_keep_the_others_from_being_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wal = await started(MemoryWal())
    told: list[int] = []

    def broken(offset: int, error: BaseException | None) -> None:
        raise RuntimeError("a bug in the caller")

    wal.append_then(b"a", lambda offset, error: told.append(offset))
    wal.append_then(b"b", broken)
    wal.append_then(b"c", lambda offset, error: told.append(offset))
    with caplog.at_level(logging.ERROR, logger="walstream.wal.group_commit"):
        await asyncio.sleep(0.02)
    assert told == [0, 2]
    assert "callback raised" in caplog.text
    future = wal.append(b"d")
    assert await future == 3  # the WAL goes on
    await wal.close()
