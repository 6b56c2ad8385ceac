"""Fixtures: real walstream-chunkd processes on 127.0.0.1 (free ports, temp data folders)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from walstream.config import BuildContext
from walstream.wal import WalMode, WalRecord
from walstream_wal_nvme_quorum import NVME_QUORUM_WAL, NvmeQuorumWal
from walstream_wal_nvme_quorum.testing import ChunkServerProcess
from walstream_wal_nvme_quorum.testing import chunk_servers as start_chunk_servers


@pytest.fixture
def chunk_servers(tmp_path: Path) -> Iterator[list[ChunkServerProcess]]:
    """Three running chunk servers; a test may kill and restart them."""
    with start_chunk_servers(tmp_path / "servers") as servers:
        yield servers


@pytest.fixture
def wal_options(chunk_servers: list[ChunkServerProcess]) -> dict[str, Any]:
    # Generous for a loaded 2-core machine with xdist workers beside it: with 1 s / 3 s two
    # healthy chunk servers missed a write ("write chunk 20 reached 1 of the 2 replicas it needs
    # within 3s") in a parallel run. A killed server refuses at once; a test of a quorum lost
    # waits out write_timeout (or sets its own).
    return {
        "servers": [server.address for server in chunk_servers],
        "request_timeout": "3s",
        "write_timeout": "10s",
    }


WalOpener = Callable[..., Any]


@pytest.fixture
async def open_wal(wal_options: dict[str, Any]) -> AsyncIterator[WalOpener]:
    """``await open_wal(epoch, mode=..., recover=True, **options)`` → (wal, recovered records).

    Every WAL opened here is closed at the end of the test."""
    opened: list[NvmeQuorumWal] = []

    async def opener(
        epoch: int,
        mode: WalMode = WalMode.READ_WRITE,
        recover: bool = True,
        **options: Any,
    ) -> tuple[NvmeQuorumWal, list[WalRecord]]:
        wal = NVME_QUORUM_WAL.build({**wal_options, **options}, BuildContext(node_id=1), "wal")
        opened.append(wal)
        await wal.start(1, epoch, mode)
        records = [record async for record in wal.recover()] if recover else []
        return wal, records

    yield opener
    for wal in opened:
        try:
            await wal.close()
        except Exception:
            pass


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """``await wait_for(predicate, timeout_s)``: poll until true or fail the test."""
    return eventually
