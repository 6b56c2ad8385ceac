"""What the ebs WAL does with its medium: wrap-around, damage, torn writes, stale laps, inspect."""

from __future__ import annotations

import asyncio
import itertools
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from walstream.config import BuildContext
from walstream.errors import ConfigError, CorruptionError
from walstream.wal import WalMode
from walstream_wal_ebs import EBS_WAL, EbsWal, inspect_wal
from walstream_wal_ebs.layout import BLOCK_BYTES, RECORD_AREA_START, HeaderSlot

RING_FILE_BYTES = RECORD_AREA_START + (64 << 10)


def newest_slot_index(path: Path) -> int:
    raw = path.read_bytes()[:RECORD_AREA_START]
    sequences = []
    for index in range(2):
        sequences.append(HeaderSlot.decode(raw[index * BLOCK_BYTES : (index + 1) * BLOCK_BYTES]))
    return max(range(2), key=lambda index: sequences[index].sequence)


async def test_wrap_around_with_padding(wal_path: Path, open_wal, place) -> None:
    wal, _ = await open_wal(wal_path, capacity_bytes=RING_FILE_BYTES)
    capacity = wal.capabilities.capacity_bytes
    live: list[tuple[int, bytes]] = []
    positions = []
    for index in range(60):  # about six laps of the 64 KiB ring
        data = bytes([index % 251]) * (5000 + index * 37)
        offset = await wal.append(data)
        positions.append(place(wal, offset))
        live.append((offset, data))
        if len(live) > 6:
            await wal.trim(live[-7][0])
            live = live[-6:]
    await wal.close()
    assert max(offset for offset, _ in live) > 5 * capacity
    wrapped = sum(1 for a, b in itertools.pairwise(positions) if b < a)
    assert wrapped >= 5
    reopened, records = await open_wal(wal_path, epoch=2, capacity_bytes=RING_FILE_BYTES)
    assert [(r.offset, r.data) for r in records] == live
    await reopened.close()
    lines = list(inspect_wal(wal_path))
    assert any(line.startswith("padding") for line in lines)


async def test_corrupt_header_slot_uses_the_other(wal_path: Path, open_wal, damage) -> None:
    wal, _ = await open_wal(wal_path)
    offsets = await asyncio.gather(*(wal.append(bytes([i]) * 100) for i in range(10)))
    await wal.close()
    newest = newest_slot_index(wal_path)
    damage(wal_path, newest * BLOCK_BYTES + 40, b"\xff\x00\xff")
    reader, records = await open_wal(wal_path, epoch=2, mode=WalMode.READ_ONLY)
    assert [r.offset for r in records] == offsets
    await reader.close()
    assert any("INVALID" in line for line in inspect_wal(wal_path))
    # Both slots damaged: the records cannot be located, and the WAL says so.
    damage(wal_path, (1 - newest) * BLOCK_BYTES + 40, b"\xff\x00\xff")
    with pytest.raises(CorruptionError):
        await open_wal(wal_path, epoch=3)
    with pytest.raises(CorruptionError):
        list(inspect_wal(wal_path))


async def test_stale_lap_is_never_returned(wal_path: Path, open_wal, place, damage) -> None:
    wal, _ = await open_wal(wal_path, capacity_bytes=RING_FILE_BYTES)
    offsets = []
    for index in range(40):  # several laps: the whole ring holds old, valid-looking records
        offsets.append(await wal.append(bytes([index]) * 6000))
        await wal.trim(offsets[-1] - 1) if len(offsets) > 1 else None
    live_offsets = offsets[-1:]
    await wal.close()
    wal, records = await open_wal(wal_path, epoch=2, capacity_bytes=RING_FILE_BYTES)
    assert [r.offset for r in records] == live_offsets
    assert "earlier lap" in list(inspect_wal(wal_path))[-2]
    await wal.close()


async def test_reset_makes_stale_bytes_unparseable(wal_path: Path, open_wal) -> None:
    wal, _ = await open_wal(wal_path)
    for index in range(30):
        await wal.append(bytes([index]) * 2000)
    await wal.reset()
    after = await wal.append(b"after")
    await wal.close()
    wal, records = await open_wal(wal_path, epoch=2)
    assert [(r.offset, r.data) for r in records] == [(after, b"after")]
    await wal.close()


async def test_buffered_mode_without_direct_io(wal_path: Path, open_wal) -> None:
    wal, _ = await open_wal(wal_path, direct=False)
    offsets = await asyncio.gather(*(wal.append(bytes([i]) * 500) for i in range(50)))
    await wal.close()
    wal, records = await open_wal(wal_path, epoch=2)
    assert [r.offset for r in records] == offsets
    await wal.close()


async def test_block_device(loop_device: Path, open_wal) -> None:
    wal, records = await open_wal(loop_device)
    assert records == []
    assert wal.describe()["block_device"] is True
    offsets = await asyncio.gather(*(wal.append(bytes([i]) * 3000) for i in range(100)))
    await wal.close()
    wal, records = await open_wal(loop_device, epoch=2)
    assert [r.offset for r in records] == offsets
    await wal.close()


def test_factory_options(tmp_path: Path) -> None:
    (found,) = [ep for ep in entry_points(group="walstream.wal") if ep.name == "ebs"]
    assert found.load() is EBS_WAL
    context = BuildContext(base_dir=tmp_path)
    wal = EBS_WAL.build({"type": "ebs", "path": "wal.img", "capacity": "2MiB"}, context, "wal")
    assert isinstance(wal, EbsWal)
    assert wal.path == tmp_path / "wal.img"
    assert wal.capabilities.capacity_bytes == (2 << 20) - RECORD_AREA_START
    with pytest.raises(ConfigError, match=r"wal\.path"):
        EBS_WAL.build({"capacity": "2MiB"}, context, "wal")
    with pytest.raises(ConfigError, match=r"wal\.capacity"):
        EBS_WAL.build({"path": "x", "capacity": "lots"}, context, "wal")
    with pytest.raises(ConfigError, match=r"wal\.direkt"):
        EBS_WAL.build({"path": "x", "direkt": False}, context, "wal")
