"""The ebs WAL's medium layer: its reusable AIO control blocks and how completions are collected."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from walstream.errors import BackendUnavailable
from walstream_wal_ebs import device as device_module
from walstream_wal_ebs.device import WalDevice, aligned_buffer, create_preallocated_file
from walstream_wal_ebs.layout import BLOCK_BYTES

SLOTS = device_module._AIO_MAX_EVENTS
BATCH = device_module._REAP_BATCH


@pytest.fixture
async def device(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "medium.img"
    create_preallocated_file(path, (SLOTS + 8) * BLOCK_BYTES)
    opened = WalDevice(path, direct=True, writable=True)
    opened.attach(asyncio.get_running_loop())
    yield opened
    opened.close()


def free_slots(opened: WalDevice) -> int:
    assert opened._aio is not None
    return len(opened._aio._free)


async def test_more_completions_than_one_collection_are_all_collected(device: WalDevice) -> None:
    """Three collections' worth of writes complete before the loop looks: one eventfd wake-up
    must collect them all (the eventfd is not signalled again for them)."""
    count = 3 * BATCH
    buffer = aligned_buffer(count * BLOCK_BYTES)
    for index in range(count):
        buffer[index * BLOCK_BYTES : (index + 1) * BLOCK_BYTES] = bytes([index % 251 + 1]) * (
            BLOCK_BYTES
        )
    views = [memoryview(buffer)[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] for i in range(count)]
    issued = device._issue(
        [(view, index * BLOCK_BYTES) for index, view in enumerate(views)], write=True
    )
    time.sleep(0.5)  # the loop cannot collect anything meanwhile: completions pile up
    results = await asyncio.wait_for(device._complete(issued, write=True), 10)
    assert results == [BLOCK_BYTES] * count
    assert free_slots(device) == SLOTS
    assert await device.read(0, count * BLOCK_BYTES) == bytes(buffer)
    for view in views:
        view.release()


async def test_a_refused_submission_gives_its_control_blocks_back(device: WalDevice) -> None:
    """More requests than control blocks: refused before anything reaches the device, and every
    block taken for them is free again."""
    buffer = aligned_buffer(BLOCK_BYTES)
    buffer[:] = b"x" * BLOCK_BYTES
    too_many = [(buffer, index * BLOCK_BYTES) for index in range(SLOTS + 1)]
    with pytest.raises(BackendUnavailable, match="no free AIO control block"):
        await device.write_all(too_many)
    assert free_slots(device) == SLOTS
    assert await device.read(0, 2 * BLOCK_BYTES) == bytes(2 * BLOCK_BYTES)
    await device.write_all([(buffer, BLOCK_BYTES)])
    assert await device.read(0, 2 * BLOCK_BYTES) == bytes(BLOCK_BYTES) + b"x" * BLOCK_BYTES
    assert free_slots(device) == SLOTS


@pytest.mark.slow
async def test_reads_and_writes_reuse_the_control_blocks(device: WalDevice) -> None:
    """Many more requests over time than control blocks: each completed one frees its block."""
    buffer = aligned_buffer(BLOCK_BYTES)
    for index in range(3 * SLOTS):
        buffer[:8] = index.to_bytes(8, "big")
        position = (index % 8) * BLOCK_BYTES
        await device.write_all([(buffer, position)])
        assert (await device.read(position, BLOCK_BYTES))[:8] == index.to_bytes(8, "big")
    assert free_slots(device) == SLOTS
