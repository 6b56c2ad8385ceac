"""Identity (WAL invariant 12) and damage reports (invariant 11) on real chunk-server folders."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import crc32c
import pytest
from walstream.errors import IdentityMismatch
from walstream.wal import WalMode, WalRecord
from walstream.wal.quorum import LogIdentity, encode_chunk, offset_seq
from walstream_wal_nvme_quorum import ChunkServerReplica
from walstream_wal_nvme_quorum.protocol import pack_str
from walstream_wal_nvme_quorum.store import KIND_CHECKPOINT, KIND_CHUNK, KIND_CLAIM
from walstream_wal_nvme_quorum.testing.inprocess import InProcessServers

DEPLOYMENT = bytes.fromhex("11111111111111111111111111111111")
OTHER = bytes.fromhex("22222222222222222222222222222222")
LOG = "node-1"


@pytest.fixture
async def servers(tmp_path: Path) -> InProcessServers:
    running = InProcessServers(tmp_path, segment_bytes=1 << 20)
    await running.start()
    yield running  # type: ignore[misc]
    await running.stop()


async def write_rounds(
    servers: InProcessServers, rounds: int, deployment: bytes = DEPLOYMENT
) -> list[tuple[int, bytes]]:
    wal = servers.wal(max_chunk_delay_s=0.0005)
    wal.bind_deployment(deployment)
    await wal.start(1, 1, WalMode.READ_WRITE)
    async for _ in wal.recover():
        pass
    acked: list[tuple[int, bytes]] = []
    for round_index in range(rounds):
        payloads = [f"round {round_index} record {i} ".encode() * 8 for i in range(3)]
        offsets = await asyncio.gather(*(wal.append(payload) for payload in payloads))
        acked.extend(zip(offsets, payloads, strict=True))
    await wal.close()
    return acked


async def recover(
    servers: InProcessServers, epoch: int, deployment: bytes = DEPLOYMENT
) -> list[WalRecord]:
    wal = servers.wal()
    wal.bind_deployment(deployment)
    try:
        await wal.start(1, epoch, WalMode.READ_WRITE)
        records = [record async for record in wal.recover()]
        await wal.append(b"after recovery")  # the WAL stays writable after a damage report
        return records
    finally:
        await wal.close()


def flip_payload(folder: Path, payload: bytes) -> None:
    """Flip one bit inside ``payload`` where it is stored in ``folder``'s segments."""
    for path in sorted(folder.glob("*.seg")):
        data = bytearray(path.read_bytes())
        found = data.find(payload)
        if found >= 0:
            data[found + len(payload) // 2] ^= 0x04
            path.write_bytes(bytes(data))
            return
    raise AssertionError("payload not found on disk")


async def test_foreign_server_folder_is_refused_and_left_unchanged(
    servers: InProcessServers,
) -> None:
    await write_rounds(servers, 2, deployment=OTHER)
    wal = servers.wal()
    wal.bind_deployment(DEPLOYMENT)
    with pytest.raises(IdentityMismatch) as caught:
        await wal.start(1, 7, WalMode.READ_WRITE)
    await wal.close()
    message = str(caught.value)
    assert OTHER.hex() in message and DEPLOYMENT.hex() in message and "node-1" in message
    for address in servers.addresses:
        replica = ChunkServerReplica(address)
        assert (await replica.list_chunks(LOG)).claimed_epoch == 1  # not fenced by us
        await replica.close()


async def test_foreign_chunk_is_never_yielded(servers: InProcessServers) -> None:
    acked = await write_rounds(servers, 3)
    foreign = encode_chunk([b"not ours"], identity=LogIdentity(OTHER, 1))
    seq = offset_seq(acked[-1][0]) + 1
    for address in servers.addresses:
        replica = ChunkServerReplica(address)
        await replica.write_chunk(LOG, 1, seq, foreign)
        await replica.close()
    recovered = await recover(servers, 2)
    assert b"not ours" not in [record.data for record in recovered]
    assert [(r.offset, r.data) for r in recovered if not r.is_damage_report] == acked
    # Listed by all three servers (more than W): reported, not taken for a torn write.
    report = recovered[-1]
    assert report.is_damage_report and report.damage_before is not None
    assert "belongs to deployment" in report.damage_before.reason


async def test_damaged_copy_on_one_server_is_repaired(servers: InProcessServers) -> None:
    acked = await write_rounds(servers, 3)
    await servers.stop()
    flip_payload(servers.folders[0], acked[4][1])
    await servers.start()
    wal = servers.wal()
    wal.bind_deployment(DEPLOYMENT)
    await wal.start(1, 2, WalMode.READ_WRITE)
    recovered = [record async for record in wal.recover()]
    assert [(r.offset, r.data) for r in recovered] == acked
    assert all(record.damage_before is None for record in recovered)
    for _ in range(200):
        if not wal.lagging_replicas():
            break
        await asyncio.sleep(0.02)
    await wal.close()
    replica = ChunkServerReplica(servers.addresses[0])
    _, data = await replica.read_chunk(LOG, offset_seq(acked[4][0]))
    assert acked[4][1] in data  # copied back from a peer
    await replica.close()


async def test_no_valid_copy_mid_log_is_reported_and_later_records_recovered(
    servers: InProcessServers,
) -> None:
    acked = await write_rounds(servers, 4)
    lost_seq = offset_seq(acked[4][0])
    await servers.stop()
    for folder in servers.folders:
        flip_payload(folder, acked[4][1])
    await servers.start()
    recovered = await recover(servers, 2)
    lost = [item for item in acked if offset_seq(item[0]) == lost_seq]
    records = [record for record in recovered if not record.is_damage_report]
    assert [(r.offset, r.data) for r in records] == [i for i in acked if i not in lost]
    damaged = [record for record in records if record.damage_before is not None]
    assert len(damaged) == 1 and offset_seq(damaged[0].offset) == lost_seq + 1
    damage = damaged[0].damage_before
    assert damage is not None and f"chunk {lost_seq}" in damage.reason
    assert all(address in damage.reason for address in servers.addresses)
    # Every server skipped a damaged record, so none can vouch for the end of the log either:
    # that is reported too (a damage marker), not assumed away.
    assert recovered[-1].is_damage_report and recovered[-1].damage_before is not None
    assert "may be lost" in recovered[-1].damage_before.reason
    # Both stay reported by the next recovery (the evidence stays on the servers).
    again = await recover(servers, 3)
    reported = [r.offset for r in again if r.damage_before is not None]
    assert damaged[0].offset in reported and len(reported) == 2


async def test_truncated_segments_on_two_servers_report_possible_loss(
    servers: InProcessServers,
) -> None:
    acked = await write_rounds(servers, 3)
    await servers.stop()
    for folder in servers.folders[:2]:
        segment = sorted(folder.glob("*.seg"))[0]
        with open(segment, "r+b") as file:
            file.truncate(segment.stat().st_size // 2)
    await servers.start()
    recovered = await recover(servers, 2)
    report = recovered[-1]
    assert report.is_damage_report and report.damage_before is not None
    assert "may be lost" in report.damage_before.reason
    assert [(r.offset, r.data) for r in recovered[:-1]] == acked[: len(recovered) - 1]
    # The marker is durable: a later recovery (servers sealed meanwhile) reports it again.
    again = await recover(servers, 3)
    assert [r.damage_before for r in again if r.damage_before] == [report.damage_before]


def _record(kind: int, body: bytes) -> bytes:
    head = struct.pack(">BI", kind, len(body))
    return head + body + struct.pack(">I", crc32c.crc32c(body, crc32c.crc32c(head)))


async def test_data_of_the_previous_format_is_still_read(tmp_path: Path) -> None:
    """Segments as the previous chunk server wrote them (CHECKPOINT, no identity) holding
    chunks of format 1 are recovered by a WAL bound to a deployment, which then adopts them."""
    chunks = {seq: encode_chunk([f"old record {seq}".encode()], version=1) for seq in (1, 2, 3)}
    servers = InProcessServers(tmp_path, segment_bytes=1 << 20)
    for folder in servers.folders:
        folder.mkdir(parents=True)
        parts = [_record(KIND_CHECKPOINT, struct.pack(">I", 0))]
        parts.append(_record(KIND_CLAIM, pack_str(LOG) + struct.pack(">Q", 1)))
        for seq, data in chunks.items():
            body = pack_str(LOG) + struct.pack(">QQI", 1, seq, crc32c.crc32c(data)) + data
            parts.append(_record(KIND_CHUNK, body))
        (folder / "0000000001.seg").write_bytes(b"".join(parts))
    await servers.start()
    try:
        recovered = await recover(servers, 2)
        assert [record.data for record in recovered] == [
            b"old record 1",
            b"old record 2",
            b"old record 3",
        ]
        replica = ChunkServerReplica(servers.addresses[0])
        assert (await replica.list_chunks(LOG)).identity == LogIdentity(DEPLOYMENT, 1)
        await replica.close()
        again = await recover(servers, 3)
        assert [record.data for record in again][-1] == b"after recovery"
    finally:
        await servers.stop()
