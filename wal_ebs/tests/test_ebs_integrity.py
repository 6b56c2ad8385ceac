"""Integrity of the ebs WAL: identity, truncation, damaged headers, damage versus a torn tail in
recovery (invariants 11 and 12), old formats, and ``walstream inspect wal`` exit codes."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from walstream.cli import main as cli_main
from walstream.errors import CorruptionError, IdentityMismatch
from walstream.wal import WalMode, WalRecord
from walstream_conformance.corruption import Outcome, classify_recovery, flip_bit, overwrite
from walstream_wal_ebs import EbsWal, inspect_wal
from walstream_wal_ebs.layout import (
    BLOCK_BYTES,
    FORMAT_VERSION,
    PADDING_MAGIC_V1,
    RECORD_AREA_START,
    RECORD_HEADER_BYTES,
    RECORD_MAGIC_V1,
    HeaderSlot,
    align_up,
    body_crc,
    pack_record_header_v1,
    salt_seed,
)

DEPLOYMENT_A = bytes.fromhex("a1" * 16)
DEPLOYMENT_B = bytes.fromhex("b2" * 16)


async def start(
    path: Path,
    *,
    epoch: int = 1,
    node_id: int = 1,
    deployment: bytes | None = DEPLOYMENT_A,
    mode: WalMode = WalMode.READ_WRITE,
    **options: Any,
) -> tuple[EbsWal, list[WalRecord]]:
    options.setdefault("capacity_bytes", 1 << 20)
    wal = EbsWal(path, **options)
    if deployment is not None:
        wal.bind_deployment(deployment)
    await wal.start(node_id, epoch, mode)
    return wal, [record async for record in wal.recover()]


async def abandon(wal: EbsWal) -> None:
    """Stop like a killed process: in-flight writes finish, but no clean close is recorded."""

    async def skip() -> None:
        return None

    wal._record_clean_close = skip  # type: ignore[method-assign]
    await wal.close()


def place(wal: EbsWal, offset: int) -> int:
    capacity = wal.capabilities.capacity_bytes
    assert capacity is not None
    return RECORD_AREA_START + offset % capacity


async def groups_one_by_one(wal: EbsWal, count: int, size: int = 3000) -> list[tuple[int, bytes]]:
    """Each record its own group, each awaited before the next: every later group attests the
    earlier ones."""
    written = []
    for index in range(count):
        data = bytes([index + 1]) * size
        written.append((await wal.append(data), data))
    return written


def pairs(records: list[WalRecord]) -> list[tuple[int, bytes]]:
    return [(record.offset, record.data) for record in records if not record.is_damage_report]


# -- identity ---------------------------------------------------------------------------------


async def test_foreign_deployment_is_refused(wal_path: Path) -> None:
    wal, _ = await start(wal_path, deployment=DEPLOYMENT_A)
    await wal.append(b"ours")
    await wal.close()
    for mode in (WalMode.READ_WRITE, WalMode.FAILOVER, WalMode.READ_ONLY):
        with pytest.raises(IdentityMismatch) as raised:
            await start(wal_path, epoch=5, deployment=DEPLOYMENT_B, mode=mode)
        message = str(raised.value)
        assert str(wal_path) in message
        assert DEPLOYMENT_A.hex() in message and DEPLOYMENT_B.hex() in message
        assert "check" in message
    # Refusing wrote nothing: the owner still reads its record.
    wal, records = await start(wal_path, epoch=6, deployment=DEPLOYMENT_A)
    assert [record.data for record in records] == [b"ours"]
    assert wal.describe()["deployment_id"] == DEPLOYMENT_A.hex()
    assert wal.describe()["home_node_id"] == 1
    await wal.close()


async def test_foreign_node_is_refused(wal_path: Path) -> None:
    wal, _ = await start(wal_path, node_id=1)
    await wal.append(b"node one")
    await wal.close()
    with pytest.raises(IdentityMismatch, match=r"node 1.*node 2"):
        await start(wal_path, epoch=2, node_id=2)
    # A failover of node 1's WAL by another process names node 1: accepted.
    wal, records = await start(wal_path, epoch=3, node_id=1, mode=WalMode.FAILOVER)
    assert [record.data for record in records] == [b"node one"]
    await wal.close()


async def test_unbound_open_keeps_working(wal_path: Path) -> None:
    wal, _ = await start(wal_path, deployment=DEPLOYMENT_A)
    offset = await wal.append(b"x")
    await wal.close()
    wal, records = await start(wal_path, epoch=2, deployment=None, node_id=9)
    assert pairs(records) == [(offset, b"x")]
    await wal.close()


# -- truncation and headers -----------------------------------------------------------------


@pytest.mark.parametrize("size", [4 << 10, 8 << 10, 1 << 20])
async def test_truncated_file_is_refused(wal_path: Path, size: int) -> None:
    wal, _ = await start(wal_path, capacity_bytes=64 << 20)
    for index in range(20):
        await wal.append(bytes([index]) * 3000)
    await wal.close()
    full = wal_path.stat().st_size
    os.truncate(wal_path, size)
    for mode in (WalMode.READ_WRITE, WalMode.READ_ONLY):
        with pytest.raises(CorruptionError) as raised:
            await start(wal_path, epoch=2, mode=mode, capacity_bytes=64 << 20)
        assert str(size) in str(raised.value) and str(full) in str(raised.value)
    assert wal_path.stat().st_size == size  # refused, never extended nor reformatted
    with pytest.raises(CorruptionError, match="truncated"):
        list(inspect_wal(wal_path))


async def test_both_header_slots_damaged_is_refused_not_reformatted(wal_path: Path) -> None:
    wal, _ = await start(wal_path)
    await wal.append(b"keep me")
    await wal.close()
    flip_bit(wal_path, 40, 3)
    flip_bit(wal_path, BLOCK_BYTES + 40, 3)
    before = wal_path.read_bytes()
    with pytest.raises(CorruptionError, match="no readable header slot"):
        await start(wal_path, epoch=2)
    assert wal_path.read_bytes() == before


async def test_a_damaged_header_slot_never_brings_trimmed_records_back(wal_path: Path) -> None:
    wal, _ = await start(wal_path)
    written = await groups_one_by_one(wal, 5)
    await wal.trim(written[2][0])
    await abandon(wal)
    for slot in range(2):  # whichever slot is damaged, the other holds the same tail
        damaged = wal_path.parent / f"slot-{slot}.img"
        damaged.write_bytes(wal_path.read_bytes())
        flip_bit(damaged, slot * BLOCK_BYTES + 50, 3)
        reader, records = await start(damaged, epoch=2, mode=WalMode.READ_ONLY)
        assert pairs(records) == written[3:]
        await reader.close()


async def test_non_empty_file_without_header_is_refused(wal_path: Path) -> None:
    with open(wal_path, "wb") as file:
        file.truncate(1 << 20)
    overwrite(wal_path, RECORD_AREA_START + 100, b"someone's data")
    before = wal_path.read_bytes()
    with pytest.raises(CorruptionError, match="not formatted over"):
        await start(wal_path)
    assert wal_path.read_bytes() == before


async def test_all_zero_file_is_formatted(wal_path: Path) -> None:
    with open(wal_path, "wb") as file:
        file.truncate(1 << 20)
    wal, records = await start(wal_path)
    assert records == []
    offset = await wal.append(b"first")
    await wal.close()
    wal, records = await start(wal_path, epoch=2)
    assert pairs(records) == [(offset, b"first")]
    await wal.close()


# -- damage versus a torn tail ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["record header", "record body", "garbage over a header"])
async def test_mid_log_bit_flip_is_reported_and_later_records_recovered(
    wal_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    wal, _ = await start(wal_path)
    written = await groups_one_by_one(wal, 6)
    await abandon(wal)  # no clean close: only the later groups' watermarks attest the damage
    damaged_offset = written[2][0]
    if where == "garbage over a header":
        # Not one bit away from a valid header: the walk must find the next group by itself.
        overwrite(wal_path, place(wal, damaged_offset) + 4, b"\x5a" * 24)
    else:
        inside = 9 if where == "record header" else RECORD_HEADER_BYTES + 1500
        flip_bit(wal_path, place(wal, damaged_offset) + inside, 3)
    caplog.set_level(logging.INFO)
    wal, records = await start(wal_path, epoch=2)
    assert pairs(records) == written[:2] + written[3:]
    after = records[2]
    assert after.offset == written[3][0]
    assert after.damage_before is not None
    assert after.damage_before.start == damaged_offset
    assert after.damage_before.end > damaged_offset
    if where == "garbage over a header":
        assert after.damage_before.end == written[3][0]
    assert all(record.damage_before is None for record in records if record is not after)
    assert classify_recovery(written, records) is Outcome.DETECTED
    assert "damaged region" in caplog.text
    # Appends continue; the damage is reported again until it is trimmed, then never.
    fresh = await wal.append(b"fresh")
    await wal.close()
    wal, again = await start(wal_path, epoch=3)
    assert pairs(again) == written[:2] + written[3:] + [(fresh, b"fresh")]
    assert again[2].damage_before is not None
    await wal.trim(written[3][0])
    await wal.close()
    wal, trimmed = await start(wal_path, epoch=4)
    assert pairs(trimmed) == [*written[4:], (fresh, b"fresh")]
    assert all(record.damage_before is None for record in trimmed)
    await wal.close()


async def test_attested_trailing_damage_is_a_damage_report(wal_path: Path) -> None:
    wal, _ = await start(wal_path)
    written = await groups_one_by_one(wal, 4)
    await wal.close()  # a clean close records that everything written was acknowledged
    last = written[-1][0]
    flip_bit(wal_path, place(wal, last) + RECORD_HEADER_BYTES + 10, 3)
    wal, records = await start(wal_path, epoch=2, mode=WalMode.READ_ONLY)
    assert pairs(records) == written[:-1]
    report = records[-1]
    assert report.is_damage_report
    assert report.damage_before is not None and report.damage_before.start == last
    assert report.offset == report.damage_before.end
    assert classify_recovery(written, records) is Outcome.DETECTED
    await wal.close()


async def test_torn_last_write_is_dropped_silently(wal_path: Path) -> None:
    wal, _ = await start(wal_path)
    first = await wal.append(b"a" * 1000)
    # One group of two records across two blocks; half of its second block never lands.
    torn = await asyncio.gather(wal.append(b"b" * 3000), wal.append(b"c" * 3000))
    await abandon(wal)
    overwrite(wal_path, place(wal, torn[0]) + BLOCK_BYTES, bytes(BLOCK_BYTES // 2))
    wal, records = await start(wal_path, epoch=2)
    assert [(r.offset, r.data, r.damage_before) for r in records] == [(first, b"a" * 1000, None)]
    lines = list(inspect_wal(wal_path))  # a torn tail is not damage: no exception
    assert any(line.startswith("torn tail") for line in lines)
    await wal.close()


def slow_writes(wal: EbsWal, seconds: float) -> None:
    """Every group write takes ``seconds`` longer: later groups are issued while it is in flight."""
    original = wal._write_group

    async def slowed(group: Any) -> None:
        await asyncio.sleep(seconds)
        await original(group)

    wal._write_group = slowed  # type: ignore[method-assign]


async def test_torn_group_with_a_later_in_flight_group_is_a_torn_tail(wal_path: Path) -> None:
    """A crash can leave group 3 written and group 2 torn: neither was acknowledged. Group 3's
    watermark shows it was issued while group 2 was in flight, so both are a torn tail, and the
    next writer never makes group 3 parse again."""
    wal, _ = await start(wal_path)
    first = await wal.append(b"1" * 100)
    slow_writes(wal, 0.05)
    second_future = wal.append(b"2" * 100)
    await asyncio.sleep(0)  # group 2 is sealed and in flight
    third_future = wal.append(b"3" * 100)
    second, third = await asyncio.gather(second_future, third_future)
    assert third - second == BLOCK_BYTES  # two groups
    await abandon(wal)
    flip_bit(wal_path, place(wal, second) + 12, 3)
    wal, records = await start(wal_path, epoch=2)
    assert [(r.offset, r.data, r.damage_before) for r in records] == [(first, b"1" * 100, None)]
    fresh = await wal.append(b"new" * 30)  # lands where the torn group was
    await abandon(wal)
    wal, records = await start(wal_path, epoch=3)
    assert pairs(records) == [(first, b"1" * 100), (fresh, b"new" * 30)]
    assert all(record.damage_before is None for record in records)
    await wal.close()


async def test_padding_bit_flip_is_not_damage(wal_path: Path) -> None:
    wal, _ = await start(wal_path)
    written = await groups_one_by_one(wal, 4, size=1000)  # each group ends with a padding
    await wal.close()
    padding = written[1][0] + RECORD_HEADER_BYTES + 1000
    flip_bit(wal_path, place(wal, padding) + 5, 3)
    flip_bit(wal_path, place(wal, padding) + 600, 3)  # padding bodies are never checked
    wal, records = await start(wal_path, epoch=2)
    assert pairs(records) == written
    assert all(record.damage_before is None for record in records)
    await wal.close()


@pytest.mark.parametrize("clean_close", [False, True])
async def test_stale_lap_bytes_are_never_resurrected(wal_path: Path, clean_close: bool) -> None:
    ring_file = RECORD_AREA_START + (64 << 10)
    wal, _ = await start(wal_path, capacity_bytes=ring_file)
    live: list[tuple[int, bytes]] = []
    for index in range(40):  # several laps: the ring is full of old, valid-looking records
        data = bytes([index]) * 6000
        live.append((await wal.append(data), data))
        await wal.trim(live[-2][0]) if len(live) > 1 else None
    live = live[-1:]
    await (wal.close() if clean_close else abandon(wal))
    end = place(wal, live[0][0]) + align_up(RECORD_HEADER_BYTES + 6000)
    capacity = wal.capabilities.capacity_bytes
    assert capacity is not None
    # Flip bits in the stale records right past the end and further along the ring.
    for distance in (0, 9, 40, BLOCK_BYTES, 2 * BLOCK_BYTES + 17, 5 * BLOCK_BYTES):
        position = RECORD_AREA_START + (end - RECORD_AREA_START + distance) % capacity
        flip_bit(wal_path, position, 3)
    wal, records = await start(wal_path, epoch=2, capacity_bytes=ring_file)
    assert [(r.offset, r.data, r.damage_before) for r in records] == [(*live[0], None)]
    await wal.close()


# -- an old file (format version 1) -------------------------------------------------------------


def write_version_1_file(path: Path, records: list[bytes], ring_bytes: int = 1 << 20) -> list[int]:
    """A WAL as the previous release wrote it: version-1 header, 24-byte record headers."""
    salt = 0x1234_5678_9ABC
    seed = salt_seed(salt)
    area = bytearray(ring_bytes)
    offsets = []
    position = 0
    for data in records:  # one group per record
        offsets.append(position)
        pack_record_header_v1(
            area, position, RECORD_MAGIC_V1, len(data), position, body_crc(data), seed
        )
        body = position + 24
        area[body : body + len(data)] = data
        end = body + len(data)
        span = align_up(end)
        if 0 < span - end < 24:
            span += BLOCK_BYTES
        if end < span:
            pack_record_header_v1(area, end, PADDING_MAGIC_V1, span - end - 24, end, 0, seed)
        position = span
    slots = []
    for sequence in (1, 2):
        slot = HeaderSlot(
            sequence=sequence,
            timestamp_ms=1,
            capacity_bytes=ring_bytes,
            area_start=RECORD_AREA_START,
            tail_offset=0,
            trim_offset=-1,
            head_floor=0,
            node_id=1,
            node_epoch=1,
            salt=salt,
            version=1,
        )
        slots.append(slot)
    header_area = bytearray(RECORD_AREA_START)
    for slot in slots:
        encoded = slot.encode()
        assert struct.unpack_from(">H", encoded, 4) == (1,)
        header_area[slot.slot_index * BLOCK_BYTES : (slot.slot_index + 1) * BLOCK_BYTES] = encoded
    path.write_bytes(bytes(header_area) + bytes(area))
    return offsets


async def test_old_version_file_is_opened_and_adopted(
    wal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = [bytes([index]) * (500 + index * 900) for index in range(5)]
    offsets = write_version_1_file(wal_path, old)
    caplog.set_level(logging.INFO)
    wal, records = await start(wal_path, epoch=2)
    assert pairs(records) == list(zip(offsets, old, strict=True))
    assert "adopting it for deployment" in caplog.text
    fresh = await wal.append(b"written by this release")
    await wal.close()
    header = HeaderSlot.decode(wal_path.read_bytes()[: 2 * BLOCK_BYTES][-BLOCK_BYTES:])
    other = HeaderSlot.decode(wal_path.read_bytes()[:BLOCK_BYTES])
    newest = max(header, other, key=lambda slot: slot.sequence)
    assert newest.version == FORMAT_VERSION and newest.deployment_id == DEPLOYMENT_A
    assert newest.home_node_id == 1
    wal, records = await start(wal_path, epoch=3)
    assert pairs(records) == [*zip(offsets, old, strict=True), (fresh, b"written by this release")]
    await wal.close()
    with pytest.raises(IdentityMismatch):
        await start(wal_path, epoch=4, deployment=DEPLOYMENT_B)


async def test_damage_in_an_old_file_is_reported(wal_path: Path) -> None:
    old = [bytes([index]) * 3000 for index in range(5)]
    offsets = write_version_1_file(wal_path, old)
    flip_bit(wal_path, RECORD_AREA_START + offsets[1] + 30, 3)
    wal, records = await start(wal_path, epoch=2, mode=WalMode.READ_ONLY)
    written = list(zip(offsets, old, strict=True))
    assert pairs(records) == written[:1] + written[2:]
    assert records[1].damage_before is not None
    await wal.close()


# -- walstream inspect wal ----------------------------------------------------------------------


async def test_inspect_wal_exit_codes(
    wal_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wal, _ = await start(wal_path)
    written = await groups_one_by_one(wal, 4)
    await abandon(wal)
    command = ["inspect", "wal", str(wal_path), "--type", "ebs"]

    def run(*extra: str) -> tuple[int, str]:
        code = cli_main([*command, *extra])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    code, output = run()
    assert code == 0, output
    assert f"identity: deployment {DEPLOYMENT_A.hex()} node 1" in output
    assert run("--deployment-id", DEPLOYMENT_A.hex(), "--node-id", "1")[0] == 0
    code, output = run("--deployment-id", DEPLOYMENT_B.hex())
    assert code == 2 and "IdentityMismatch" in output
    assert run("--node-id", "7")[0] == 2

    # A torn tail is reported but is not damage.
    torn_copy = tmp_path / "torn.img"
    torn_copy.write_bytes(wal_path.read_bytes())
    flip_bit(torn_copy, place(wal, written[-1][0]) + 40, 3)
    code, output = cli_main(["inspect", "wal", str(torn_copy)]), capsys.readouterr().out
    assert code == 0 and "torn tail at offset=" in output

    # Damage in the middle (a record header): its position, and exit 2.
    flip_bit(wal_path, place(wal, written[1][0]) + 12, 3)
    code, output = run()
    assert code == 2, output
    assert f"DAMAGED offset={written[1][0]}..{written[1][0] + RECORD_HEADER_BYTES + 3000}" in output
    assert f"file position={place(wal, written[1][0])}" in output
    assert "CorruptionError" in output

    # Truncated: exit 2.
    os.truncate(wal_path, 8 << 10)
    code, output = run()
    assert code == 2 and "TRUNCATED" in output


@pytest.mark.parametrize("first_group_acked_before_second", [False, True])
async def test_restarted_writers_lost_first_group(
    wal_path: Path, first_group_acked_before_second: bool
) -> None:
    """The first group of a restarted writer sits where the previous writer's log ended. If it
    never landed while its successor did, the successor's watermark decides: issued while the
    first was in flight, both are a torn tail; issued after the first was acknowledged, the
    first is damage."""
    wal, _ = await start(wal_path)
    earlier = await groups_one_by_one(wal, 3)
    await wal.close()
    wal, records = await start(wal_path, epoch=2)
    assert pairs(records) == earlier
    if first_group_acked_before_second:
        first = await wal.append(b"f" * 3000)
        second = await wal.append(b"s" * 3000)
    else:
        slow_writes(wal, 0.05)
        first_future = wal.append(b"f" * 3000)
        await asyncio.sleep(0)
        second_future = wal.append(b"s" * 3000)
        first, second = await asyncio.gather(first_future, second_future)
    assert second - first == BLOCK_BYTES
    await abandon(wal)
    overwrite(wal_path, place(wal, first), bytes(BLOCK_BYTES))  # the first group never landed
    wal, records = await start(wal_path, epoch=3, mode=WalMode.READ_ONLY)
    if first_group_acked_before_second:
        assert pairs(records) == [*earlier, (second, b"s" * 3000)]
        assert records[-1].damage_before is not None
        assert (
            classify_recovery([*earlier, (first, b"f" * 3000), (second, b"s" * 3000)], records)
            is Outcome.DETECTED
        )
    else:
        assert [(r.offset, r.data, r.damage_before) for r in records] == [
            (offset, data, None) for offset, data in earlier
        ]
    await wal.close()


# -- large groups landing in part -----------------------------------------------------------------


@pytest.mark.parametrize("lost_chunk", [None, "first", "second"])
async def test_large_group_landing_in_part_is_a_torn_tail(
    wal_path: Path, lost_chunk: str | None
) -> None:
    """A write of 1 MiB is not atomic: a crash may land some of its blocks only. Such a group
    was never acknowledged: recovery drops it as a torn tail, keeps what came before, and
    reports no damage."""
    wal, _ = await start(wal_path, capacity_bytes=8 << 20)
    small = await wal.append(b"acknowledged before")
    big_data = os.urandom(1 << 20)
    big = await wal.append(big_data)
    start_position = place(wal, big)
    await abandon(wal)
    image = bytearray(wal_path.read_bytes())
    chunk = 256 << 10
    lost = {"first": 0, "second": 1, None: None}[lost_chunk]
    if lost is not None:
        at = start_position + lost * chunk
        image[at : at + chunk] = bytes(chunk)
    wal_path.write_bytes(bytes(image))
    wal, records = await start(wal_path, epoch=2, capacity_bytes=8 << 20)
    expected = [(small, b"acknowledged before")]
    if lost_chunk is None:
        expected.append((big, big_data))
    assert pairs(records) == expected
    assert all(record.damage_before is None for record in records)
    await wal.close()
