"""Every WriteAheadLog invariant (walstream.wal) against real chunk-server processes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    ConfigError,
    FencedError,
    InvalidArgument,
)
from walstream.wal import WalMode
from walstream_wal_nvme_quorum import NVME_QUORUM_WAL
from walstream_wal_nvme_quorum.testing import ChunkServerProcess


@pytest.mark.slow
async def test_ack_order_and_offsets_increase(open_wal: Any) -> None:
    wal, recovered = await open_wal(1)
    assert recovered == []
    futures = [wal.append(f"r{index}".encode()) for index in range(300)]
    completed: list[int] = []
    for index, future in enumerate(futures):
        future.add_done_callback(lambda _, index=index: completed.append(index))
    offsets = await asyncio.gather(*futures)
    assert completed == sorted(completed)
    assert offsets == sorted(set(offsets))


@pytest.mark.slow
async def test_acked_recovered_exactly_once_in_order(open_wal: Any) -> None:
    wal, _ = await open_wal(1)
    payloads = [bytes([index % 251]) * (index * 37 % 5000) for index in range(400)]
    offsets = await asyncio.gather(*(wal.append(payload) for payload in payloads))
    await wal.close()
    _, recovered = await open_wal(2)
    assert [(record.offset, record.data) for record in recovered] == list(
        zip(offsets, payloads, strict=True)
    )


@pytest.mark.slow
async def test_offsets_increase_across_restarts(open_wal: Any) -> None:
    last = -1
    for epoch in range(1, 5):
        wal, _ = await open_wal(epoch)
        offset = await wal.append(f"epoch {epoch}".encode())
        assert offset > last
        last = offset
        await wal.close()


async def test_trim_inclusive_idempotent_and_survives_restart(open_wal: Any) -> None:
    wal, _ = await open_wal(1, max_chunk_delay="0ms")
    offsets = [await wal.append(f"r{index}".encode()) for index in range(30)]
    await wal.trim(offsets[9])
    await wal.trim(offsets[9])
    await wal.trim(offsets[3])
    with pytest.raises(InvalidArgument):
        await wal.trim(offsets[-1] + 1)
    await wal.close()
    wal, recovered = await open_wal(2)
    assert [record.offset for record in recovered] == offsets[10:]
    # a trim in the middle of a chunk keeps the rest of that chunk
    grouped = await asyncio.gather(*(wal.append(f"g{index}".encode()) for index in range(50)))
    await wal.trim(grouped[24])
    await wal.close()
    _, recovered = await open_wal(3)
    assert [record.offset for record in recovered] == grouped[25:]


async def test_reset_forgets_and_offsets_keep_growing(open_wal: Any) -> None:
    wal, _ = await open_wal(1)
    offsets = await asyncio.gather(*(wal.append(b"x") for _ in range(20)))
    await wal.close()
    wal, recovered = await open_wal(2)
    assert len(recovered) == 20
    await wal.reset()
    fresh = await wal.append(b"after reset")
    assert fresh > max(offsets)
    await wal.close()
    _, recovered = await open_wal(3)
    assert [(record.offset, record.data) for record in recovered] == [(fresh, b"after reset")]


async def test_capacity_oversized_record_refused_at_once(open_wal: Any) -> None:
    wal, _ = await open_wal(1, max_record_bytes="64KiB")
    with pytest.raises(CapacityError):
        wal.append(b"x" * (64 * 1024 + 1))
    assert await wal.append(b"x" * (64 * 1024)) >= 0
    await wal.close()
    _, recovered = await open_wal(2)
    assert [len(record.data) for record in recovered] == [64 * 1024]


@pytest.mark.slow
async def test_fencing_failover_stops_old_writer(open_wal: Any) -> None:
    old, _ = await open_wal(1)
    acked = [await old.append(f"a{index}".encode()) for index in range(5)]
    new, recovered = await open_wal(2, mode=WalMode.FAILOVER)
    assert [record.offset for record in recovered] == acked
    with pytest.raises(FencedError):
        await old.append(b"zombie")
    with pytest.raises((FencedError, BackendUnavailable)):
        await old.append(b"zombie again")
    with pytest.raises(InvalidArgument):
        new.append(b"failover WALs do not append")


@pytest.mark.slow
async def test_zombie_with_one_server_down_gets_no_ack(
    open_wal: Any, chunk_servers: list[ChunkServerProcess]
) -> None:
    old, _ = await open_wal(1)
    await old.append(b"before")
    chunk_servers[2].kill()
    new, recovered = await open_wal(2, mode=WalMode.FAILOVER)
    assert [record.data for record in recovered] == [b"before"]
    chunk_servers[2].start()
    # The old writer can still reach the server that missed the claim, but never a quorum.
    with pytest.raises(FencedError):
        await old.append(b"zombie")
    await new.close()
    _, recovered = await open_wal(3)
    assert [record.data for record in recovered] == [b"before"]


@pytest.mark.slow
async def test_errors_typed_without_quorum_and_refuses_after(
    open_wal: Any, chunk_servers: list[ChunkServerProcess]
) -> None:
    wal, _ = await open_wal(1, write_timeout="500ms")
    await wal.append(b"ok")
    chunk_servers[0].kill()
    chunk_servers[1].kill()
    with pytest.raises((AmbiguousError, BackendUnavailable)):
        await wal.append(b"no quorum")
    with pytest.raises(BackendUnavailable):
        wal.append(b"after a failure")
    chunk_servers[0].start()
    chunk_servers[1].start()
    await wal.close()
    _, recovered = await open_wal(2)
    assert recovered[0].data == b"ok"
    assert [record.data for record in recovered][1:] in ([], [b"no quorum"])


async def test_close_waits_for_inflight_then_refuses(open_wal: Any) -> None:
    wal, _ = await open_wal(1)
    futures = [wal.append(f"r{index}".encode()) for index in range(100)]
    await wal.close()
    assert all(future.done() and not future.exception() for future in futures)
    with pytest.raises(InvalidArgument):
        wal.append(b"closed")


async def test_read_only_recovery_does_not_fence(open_wal: Any) -> None:
    writer, _ = await open_wal(1)
    offset = await writer.append(b"visible")
    _, recovered = await open_wal(5, mode=WalMode.READ_ONLY)
    assert [(record.offset, record.data) for record in recovered] == [(offset, b"visible")]
    assert await writer.append(b"still the owner") > offset


def test_factory_validates_options() -> None:
    from walstream.config import BuildContext

    context = BuildContext(node_id=3)
    with pytest.raises(ConfigError, match=r"wal\.servers"):
        NVME_QUORUM_WAL.build({}, context, "wal")
    with pytest.raises(ConfigError, match=r"wal\.write_quorum"):
        NVME_QUORUM_WAL.build({"servers": ["a:1", "b:2"], "write_quorum": 3}, context, "wal")
    with pytest.raises(ConfigError, match=r"wal\.replication"):
        NVME_QUORUM_WAL.build({"servers": "a:1,b:2", "replication": 3}, context, "wal")
    wal = NVME_QUORUM_WAL.build({"servers": "a:1,b:2,c:3,d:4", "replication": 3}, context, "wal")
    assert wal.log_id == "node-3"
    assert (wal.replica_count, wal.write_quorum) == (3, 2)
