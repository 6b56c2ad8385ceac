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
    IdentityMismatch,
    InvalidArgument,
)
from walstream.wal import WalMode, WalRecord
from walstream.wal.quorum import (
    Chunk,
    ChunkInfo,
    LogIdentity,
    LogListing,
    MemoryReplica,
    QuorumWal,
    Seal,
    chunk_crc,
    decode_chunk,
    encode_chunk,
    offset_seq,
    parse_chunk,
    resolve,
)
from walstream_conformance.corruption import Outcome, classify_recovery
from walstream_conformance.waiting import eventually

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
    await eventually(lambda: not wal.lagging_replicas(), "the lagging replicas to catch up")
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


# -- identity (WAL invariant 12) and damage reports (invariant 11) -------------------------------

DEPLOYMENT = bytes(range(16))
OTHER_DEPLOYMENT = bytes(range(100, 116))


async def open_bound(
    replicas: list[MemoryReplica],
    epoch: int,
    deployment: bytes = DEPLOYMENT,
    mode: WalMode = WalMode.READ_WRITE,
    **options: object,
) -> tuple[QuorumWal, list[WalRecord]]:
    wal = make_wal(replicas, **options)
    wal.bind_deployment(deployment)
    await wal.start(1, epoch, mode)
    return wal, [record async for record in wal.recover()]


async def write_rounds(
    replicas: list[MemoryReplica], rounds: int, per_round: int = 3
) -> list[tuple[int, bytes]]:
    """Acknowledged records written in rounds (one chunk per round); the writer is abandoned."""
    wal, _ = await open_bound(replicas, epoch=1)
    acked: list[tuple[int, bytes]] = []
    for round_index in range(rounds):
        payloads = [f"round {round_index} record {i}".encode() for i in range(per_round)]
        offsets = await asyncio.gather(*(wal.append(payload) for payload in payloads))
        acked.extend(zip(offsets, payloads, strict=True))
    await wal.close()
    return acked


def flip(replica: MemoryReplica, seq: int, position: int = -7) -> None:
    epoch, data = replica.logs[LOG].chunks[seq]
    damaged = bytearray(data)
    damaged[position] ^= 0x10
    replica.logs[LOG].chunks[seq] = (epoch, bytes(damaged))


def chunk_seqs(acked: list[tuple[int, bytes]]) -> list[int]:
    return sorted({offset_seq(offset) for offset, _ in acked})


def test_chunk_format_2_carries_identity_and_watermark_and_format_1_still_decodes() -> None:
    identity = LogIdentity(DEPLOYMENT, 7)
    chunk = parse_chunk(encode_chunk([b"a", b"bc"], identity=identity, acked_through=41))
    assert chunk == Chunk([b"a", b"bc"], identity, 41)
    old = parse_chunk(encode_chunk([b"a", b"bc"], version=1))
    assert old == Chunk([b"a", b"bc"], None, 0)
    assert parse_chunk(encode_chunk([b"x"])).identity is None


async def test_foreign_replica_refused_at_start_without_being_changed() -> None:
    replicas = make_replicas()
    await write_rounds(replicas, rounds=2)
    foreign = replicas[1]
    claimed_before = foreign.logs[LOG].claimed_epoch
    foreign.logs[LOG].identity = LogIdentity(OTHER_DEPLOYMENT, 1)
    wal = make_wal(replicas)
    wal.bind_deployment(DEPLOYMENT)
    with pytest.raises(IdentityMismatch) as caught:
        await wal.start(1, 5, WalMode.READ_WRITE)
    message = str(caught.value)
    assert "r1" in message and OTHER_DEPLOYMENT.hex() in message and DEPLOYMENT.hex() in message
    assert foreign.logs[LOG].claimed_epoch == claimed_before
    await wal.close()
    # A read-only open checks the listings' identity too.
    reader = make_wal(replicas)
    reader.bind_deployment(DEPLOYMENT)
    with pytest.raises(IdentityMismatch):
        await reader.start(1, 5, WalMode.READ_ONLY)
    await reader.close()


async def test_a_replica_that_missed_the_owners_claim_is_not_taken_by_another_deployment() -> None:
    # The owner's claim reached two of three replicas (the third was down and records no
    # identity); a foreign open must refuse before it claims anything, the third one included.
    replicas = make_replicas()
    await write_rounds(replicas, rounds=2)
    lagging = replicas[2]
    lagging.logs[LOG].identity = None
    before = [replica.logs[LOG].claimed_epoch for replica in replicas]
    wal = make_wal(replicas)
    wal.bind_deployment(OTHER_DEPLOYMENT)
    with pytest.raises(IdentityMismatch):
        await wal.start(1, 9, WalMode.READ_WRITE)
    await wal.close()
    assert [replica.logs[LOG].claimed_epoch for replica in replicas] == before
    assert lagging.logs[LOG].identity is None
    again, recovered = await open_bound(replicas, epoch=10)
    assert recovered, "the owner still recovers its records"
    await again.close()


async def test_other_node_of_the_same_deployment_is_refused() -> None:
    replicas = make_replicas()
    await write_rounds(replicas, rounds=1)
    wal = make_wal(replicas)
    wal.bind_deployment(DEPLOYMENT)
    with pytest.raises(IdentityMismatch, match="node 1"):
        await wal.start(2, 5, WalMode.READ_WRITE)
    await wal.close()


async def test_foreign_chunk_on_one_replica_is_never_yielded_and_repaired() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=3)
    seq = chunk_seqs(acked)[1]
    foreign = encode_chunk(
        [b"another deployment's record"], identity=LogIdentity(OTHER_DEPLOYMENT, 1)
    )
    replicas[0].logs[LOG].chunks[seq] = (1, foreign)
    wal, recovered = await open_bound(replicas, epoch=2)
    assert [(record.offset, record.data) for record in recovered] == acked
    assert all(record.damage_before is None for record in recovered)
    await eventually(lambda: not wal.lagging_replicas(), "the lagging replicas to catch up")
    assert decode_chunk(replicas[0].logs[LOG].chunks[seq][1]) != [b"another deployment's record"]
    await wal.close()


async def test_foreign_chunk_on_every_replica_is_reported_not_yielded() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=3)
    seq = chunk_seqs(acked)[1]
    foreign = encode_chunk(
        [b"another deployment's record"], identity=LogIdentity(OTHER_DEPLOYMENT, 1)
    )
    for replica in replicas:
        replica.logs[LOG].chunks[seq] = (1, foreign)
    wal, recovered = await open_bound(replicas, epoch=2)
    assert b"another deployment's record" not in [record.data for record in recovered]
    first_after = next(record for record in recovered if offset_seq(record.offset) > seq)
    assert first_after.damage_before is not None
    assert "deployment" in first_after.damage_before.reason
    await wal.close()


async def test_corrupt_copies_are_repaired_from_a_valid_one() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=3)
    seq = chunk_seqs(acked)[0]
    flip(replicas[0], seq)
    flip(replicas[1], seq, position=3)
    wal, recovered = await open_bound(replicas, epoch=2)
    assert [(record.offset, record.data) for record in recovered] == acked
    assert all(record.damage_before is None for record in recovered)
    await eventually(lambda: not wal.lagging_replicas(), "the lagging replicas to catch up")
    for replica in replicas:
        decode_chunk(replica.logs[LOG].chunks[seq][1])  # every copy verifies again
    await wal.close()


async def test_no_valid_copy_mid_log_is_reported_and_later_records_recovered() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=4)
    seq = chunk_seqs(acked)[1]
    flip(replicas[0], seq)
    flip(replicas[1], seq)
    del replicas[2].logs[LOG].chunks[seq]
    wal, recovered = await open_bound(replicas, epoch=2)
    lost = [item for item in acked if offset_seq(item[0]) == seq]
    assert [(record.offset, record.data) for record in recovered] == [
        item for item in acked if item not in lost
    ]
    damaged = [record for record in recovered if record.damage_before is not None]
    assert len(damaged) == 1 and offset_seq(damaged[0].offset) == seq + 1
    damage = damaged[0].damage_before
    assert damage is not None
    assert damage.start == lost[0][0] and damage.end == damaged[0].offset
    assert f"chunk {seq}" in damage.reason
    assert "r0" in damage.reason and "r1" in damage.reason and "absent on r2" in damage.reason
    assert "checksum" in damage.reason
    assert classify_recovery(acked, recovered, torn_tail_allowance=3) is Outcome.DETECTED
    # The writer continues; the damage stays reported by every later recovery.
    later = await wal.append(b"after the damage")
    await wal.close()
    _, again = await open_bound(replicas, epoch=3)
    assert [record.data for record in again][-1] == b"after the damage"
    reported = [record for record in again if record.damage_before is not None]
    assert [record.offset for record in reported] == [damaged[0].offset]
    assert again[-1].offset == later


async def test_damage_at_the_end_with_quorum_evidence_is_a_damage_report() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=3)
    last = chunk_seqs(acked)[-1]
    for replica in replicas:
        flip(replica, last)
    _, recovered = await open_bound(replicas, epoch=2)
    assert [(record.offset, record.data) for record in recovered[:-1]] == acked[:-3]
    report = recovered[-1]
    assert report.is_damage_report and report.damage_before is not None
    assert (
        report.offset == report.damage_before.end and f"chunk {last}" in report.damage_before.reason
    )
    assert classify_recovery(acked, recovered, torn_tail_allowance=3) is Outcome.DETECTED


async def test_uncertain_tail_without_evidence_is_dropped_as_torn() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=2)
    # A write in flight at the crash reached one replica only, and that copy is damaged.
    in_flight = chunk_seqs(acked)[-1] + 1
    data = encode_chunk([b"in flight"], identity=LogIdentity(DEPLOYMENT, 1), acked_through=0)
    await replicas[0].write_chunk(LOG, 1, in_flight, data)
    flip(replicas[0], in_flight)
    wal, recovered = await open_bound(replicas, epoch=2)
    assert [(record.offset, record.data) for record in recovered] == acked
    assert all(record.damage_before is None for record in recovered)
    assert await wal.append(b"next") > acked[-1][0]
    await wal.close()


async def test_unreachable_copy_is_not_taken_for_damage() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=3)
    seq = chunk_seqs(acked)[1]
    flip(replicas[0], seq)
    flip(replicas[1], seq)

    async def unreachable(log_id: str, seq: int) -> tuple[int, bytes]:
        raise BackendUnavailable("r2 is unreachable")

    replicas[2].read_chunk = unreachable  # type: ignore[method-assign]
    wal = make_wal(replicas)
    wal.bind_deployment(DEPLOYMENT)
    with pytest.raises(BackendUnavailable, match="cannot tell damage"):
        await wal.start(1, 2, WalMode.READ_WRITE)
    await wal.close()


async def test_format_1_chunks_and_unidentified_logs_are_still_read() -> None:
    replicas = make_replicas()
    for replica in replicas:
        await replica.claim(LOG, 1)
        for seq in (1, 2):
            await replica.write_chunk(LOG, 1, seq, encode_chunk([f"old {seq}".encode()], version=1))
    wal, recovered = await open_bound(replicas, epoch=2)
    assert [record.data for record in recovered] == [b"old 1", b"old 2"]
    await wal.append(b"new")
    await wal.close()
    assert all(replica.logs[LOG].identity == LogIdentity(DEPLOYMENT, 1) for replica in replicas)
    _, recovered = await open_bound(replicas, epoch=3)
    assert [record.data for record in recovered] == [b"old 1", b"old 2", b"new"]


async def test_unbound_wal_checks_no_identity() -> None:
    replicas = make_replicas()
    await write_rounds(replicas, rounds=1)
    wal, recovered = await open_wal(replicas, epoch=2)  # no deployment bound, another node id
    assert len(recovered) == 3
    await wal.close()


async def test_too_few_intact_replicas_make_the_end_a_durable_damage_report() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=3)
    last = chunk_seqs(acked)[-1]
    for replica in replicas:
        del replica.logs[LOG].chunks[last]  # the end is gone everywhere ...
    replicas[0].logs[LOG].incomplete = True  # ... and two replicas know they lost data
    replicas[1].logs[LOG].incomplete = True
    wal, recovered = await open_bound(replicas, epoch=2)
    assert [(r.offset, r.data) for r in recovered[:-1]] == acked[:-3]
    report = recovered[-1]
    assert report.is_damage_report and report.damage_before is not None
    assert "r0, r1 lost data" in report.damage_before.reason
    assert classify_recovery(acked, recovered, torn_tail_allowance=0) is Outcome.DETECTED
    after = await wal.append(b"after")
    await wal.close()
    assert not replicas[0].logs[LOG].incomplete  # the seal cleared the flag ...
    _, again = await open_bound(replicas, epoch=3)
    # ... and the marker chunk keeps the report: now on the first record after it.
    assert [r.damage_before for r in again if r.damage_before] == [report.damage_before]
    assert again[-1].offset == after


async def test_one_replica_that_lost_data_is_no_reason_for_alarm() -> None:
    replicas = make_replicas()
    acked = await write_rounds(replicas, rounds=3)
    replicas[0].logs[LOG].chunks.clear()
    replicas[0].logs[LOG].incomplete = True
    _, recovered = await open_bound(replicas, epoch=2)
    assert [(r.offset, r.data) for r in recovered] == acked
    assert all(record.damage_before is None for record in recovered)
