"""The medium-independent quorum WAL over in-memory replicas (the reference Replica)."""

from __future__ import annotations

import asyncio
import time

import pytest
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CorruptionError,
    FencedError,
    InvalidArgument,
)
from walstream.quorum import (
    ChunkInfo,
    LogListing,
    MemoryReplica,
    QuorumWal,
    Seal,
    chunk_crc,
    decode_chunk,
    encode_chunk,
    offset_seq,
    resolve,
)
from walstream.wal import WalMode

LOG = "node-1"


def make_replicas(count: int = 3) -> list[MemoryReplica]:
    return [MemoryReplica(f"r{index}") for index in range(count)]


def make_wal(replicas: list[MemoryReplica], **options: object) -> QuorumWal:
    settings: dict[str, object] = {"request_timeout_s": 0.3, "write_timeout_s": 1.0}
    settings.update(options)
    return QuorumWal(replicas, log_id=LOG, **settings)  # type: ignore[arg-type]


async def open_wal(
    replicas: list[MemoryReplica], epoch: int, mode: WalMode = WalMode.READ_WRITE, **options: object
) -> tuple[QuorumWal, list[tuple[int, bytes]]]:
    wal = make_wal(replicas, **options)
    await wal.start(1, epoch, mode)
    recovered = [(record.offset, record.data) async for record in wal.recover()]
    return wal, recovered


async def wait_until(predicate: object, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def test_chunk_codec_round_trip_and_corruption() -> None:
    payloads = [b"", b"a", b"x" * 1000]
    data = encode_chunk(payloads)
    assert decode_chunk(data) == payloads
    for position in (0, 3, len(data) // 2, len(data) - 1):
        damaged = bytearray(data)
        damaged[position] ^= 0x40
        with pytest.raises(CorruptionError):
            decode_chunk(bytes(damaged))
    with pytest.raises(CorruptionError):
        decode_chunk(data[:-5])


async def test_appends_recovered_in_order_with_increasing_offsets() -> None:
    replicas = make_replicas()
    wal, recovered = await open_wal(replicas, epoch=1)
    assert recovered == []
    futures = [wal.append(f"record-{index}".encode()) for index in range(200)]
    offsets = await asyncio.gather(*futures)
    assert offsets == sorted(offsets) and len(set(offsets)) == 200
    await wal.close()

    wal2, recovered = await open_wal(replicas, epoch=2)
    assert recovered == [(offset, f"record-{i}".encode()) for i, offset in enumerate(offsets)]
    later = await wal2.append(b"after restart")
    assert later > offsets[-1]
    await wal2.close()


async def test_one_replica_down_does_not_stop_acks_and_it_catches_up() -> None:
    replicas = make_replicas()
    wal, _ = await open_wal(replicas, epoch=1)
    replicas[2].available = False
    offsets = [await wal.append(f"v{index}".encode()) for index in range(20)]
    assert LOG not in replicas[2].logs or not replicas[2].logs[LOG].chunks
    replicas[2].available = True
    await wait_until(lambda: not wal.lagging_replicas())
    expected = {offset_seq(offset) for offset in offsets}
    assert expected <= set(replicas[2].logs[LOG].chunks)
    await wal.close()


async def test_slow_replica_does_not_slow_acks() -> None:
    replicas = make_replicas()
    wal, _ = await open_wal(replicas, epoch=1, request_timeout_s=5.0)
    replicas[1].delay_s = 0.5
    started = time.monotonic()
    for index in range(10):
        await wal.append(f"v{index}".encode())
    assert time.monotonic() - started < 0.5 * 10 / 4
    await wal.close()


async def test_no_quorum_fails_typed_and_refuses_further_appends() -> None:
    replicas = make_replicas()
    wal, _ = await open_wal(replicas, epoch=1, write_timeout_s=0.3)
    replicas[0].available = False
    replicas[1].available = False
    with pytest.raises((AmbiguousError, BackendUnavailable)):
        await wal.append(b"lost")
    with pytest.raises(BackendUnavailable):
        wal.append(b"after failure")
    await wal.close()


async def test_failover_fences_old_writer() -> None:
    replicas = make_replicas()
    old, _ = await open_wal(replicas, epoch=1)
    acked = await old.append(b"acked before takeover")
    new, recovered = await open_wal(replicas, epoch=2, mode=WalMode.FAILOVER)
    assert recovered == [(acked, b"acked before takeover")]
    with pytest.raises(FencedError):
        await old.append(b"zombie")
    await new.close()
    await old.close()


async def test_uncertain_tail_is_decided_once_and_never_reverses() -> None:
    """A chunk on a single replica is kept by the recovery that sees it, repaired, and then
    every later recovery keeps it, whichever quorum it reads."""
    replicas = make_replicas()
    wal, _ = await open_wal(replicas, epoch=1)
    await wal.append(b"acked")
    await wal.close()
    # The writer of epoch 2 crashed after chunk 2 reached only r0 (never acknowledged).
    uncertain = encode_chunk([b"uncertain"])
    await replicas[0].write_chunk(LOG, 2, 2, uncertain)

    replicas[2].available = False
    first, recovered_first = await open_wal(replicas, epoch=3, mode=WalMode.FAILOVER)
    assert [data for _, data in recovered_first] == [b"acked", b"uncertain"]
    await first.close()
    replicas[2].available = True
    replicas[0].available = False
    second, recovered_second = await open_wal(replicas, epoch=4, mode=WalMode.FAILOVER)
    assert recovered_second == recovered_first
    await second.close()


async def test_discarded_tail_never_comes_back() -> None:
    replicas = make_replicas()
    wal, _ = await open_wal(replicas, epoch=1)
    await wal.append(b"acked")
    await wal.close()
    zombie = encode_chunk([b"zombie, never acknowledged"])
    await replicas[2].write_chunk(LOG, 1, 2, zombie)

    replicas[2].available = False
    first, recovered_first = await open_wal(replicas, epoch=2)
    assert [data for _, data in recovered_first] == [b"acked"]
    new_offset = await first.append(b"new owner")
    await first.close()
    replicas[2].available = True
    replicas[0].available = False
    _, recovered_second = await open_wal(replicas, epoch=3, mode=WalMode.FAILOVER)
    assert [data for _, data in recovered_second] == [b"acked", b"new owner"]
    assert recovered_second[-1][0] == new_offset


def test_resolve_stops_at_first_hole_and_applies_seals() -> None:
    def info(seq: int, epoch: int, tag: bytes) -> ChunkInfo:
        return ChunkInfo(seq, epoch, 1, chunk_crc(tag))

    listings = {
        "a": LogListing(chunks={1: info(1, 1, b"1"), 2: info(2, 1, b"2"), 4: info(4, 1, b"4")}),
        "b": LogListing(seals=(Seal(2, 1),), chunks={1: info(1, 1, b"1"), 3: info(3, 2, b"3")}),
    }
    resolution = resolve(listings)
    # seq 2 of epoch 1 lies beyond the seal of epoch 2 at seq 1: invalid, so the walk stops.
    assert [link.seq for link in resolution.chain] == [1]
    assert resolution.chain[0].holders == ("a", "b")
    listings["b"] = LogListing(seals=(Seal(2, 2),), chunks={3: info(3, 2, b"3")})
    # chunk 4 of epoch 1 lies beyond that seal too: the chain ends at the new writer's chunk 3.
    assert [link.seq for link in resolve(listings).chain] == [1, 2, 3]


async def test_trim_and_reset_survive_restart() -> None:
    replicas = make_replicas()
    wal, _ = await open_wal(replicas, epoch=1, max_chunk_delay_s=0.0)
    offsets = [await wal.append(f"v{index}".encode()) for index in range(10)]
    await wal.trim(offsets[4])
    await wal.trim(offsets[2])  # never goes backwards
    with pytest.raises(InvalidArgument):
        await wal.trim(offsets[-1] + 1)
    await wal.close()
    wal2, recovered = await open_wal(replicas, epoch=2)
    assert [offset for offset, _ in recovered] == offsets[5:]
    await wal2.reset()
    after_reset = await wal2.append(b"after reset")
    assert after_reset > offsets[-1]
    await wal2.close()
    _, recovered = await open_wal(replicas, epoch=3)
    assert recovered == [(after_reset, b"after reset")]
