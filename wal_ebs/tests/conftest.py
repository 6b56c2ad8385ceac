"""Shared fixtures for the ebs WAL tests: WAL files, a loop device, open-and-recover functions."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from walstream.wal import WalMode, WalRecord
from walstream_wal_ebs import EbsWal
from walstream_wal_ebs.layout import RECORD_AREA_START

OpenWal = Callable[..., Awaitable[tuple[EbsWal, list[WalRecord]]]]


@pytest.fixture
def wal_path(tmp_path: Path) -> Path:
    return tmp_path / "wal.img"


@pytest.fixture
def open_wal() -> OpenWal:
    """``await open_wal(path, epoch=1, mode=READ_WRITE, **options)`` → (started WAL, recovered)."""

    async def opener(
        path: Path,
        epoch: int = 1,
        mode: WalMode = WalMode.READ_WRITE,
        node_id: int = 1,
        **options: Any,
    ) -> tuple[EbsWal, list[WalRecord]]:
        options.setdefault("capacity_bytes", 1 << 20)
        wal = EbsWal(path, **options)
        await wal.start(node_id, epoch, mode)
        records = [record async for record in wal.recover()]
        return wal, records

    return opener


def physical_position(wal: EbsWal, offset: int) -> int:
    """Where the record with logical ``offset`` sits in the file."""
    capacity = wal.capabilities.capacity_bytes
    assert capacity is not None
    return RECORD_AREA_START + offset % capacity


@pytest.fixture
def place() -> Callable[[EbsWal, int], int]:
    return physical_position


def overwrite(path: Path, position: int, data: bytes) -> None:
    """Change bytes of the medium behind the WAL's back (damage, torn writes)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, position)
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.fixture
def damage() -> Callable[[Path, int, bytes], None]:
    return overwrite


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[Path]:
    """A loop block device over a 4 MiB file; skipped without root or losetup."""
    if shutil.which("losetup") is None:
        pytest.skip("needs the losetup capability (util-linux) for a loop block device")
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_SYS_ADMIN) to attach a loop block device")
    backing = tmp_path / "loop-backing.img"
    with open(backing, "wb") as file:
        file.truncate(4 << 20)
    attached = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], capture_output=True, text=True
    )
    if attached.returncode != 0:
        pytest.skip(f"needs a free loop device (losetup: {attached.stderr.strip()})")
    device = Path(attached.stdout.strip())
    try:
        yield device
    finally:
        subprocess.run(["losetup", "--detach", str(device)], check=False)
