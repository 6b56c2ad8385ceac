"""S3Wal integrity against a moto S3 server: deployment identity (invariant 12) and damage told
apart from a torn tail (invariant 11), one test per rule of the module doc."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio
from walstream.errors import IdentityMismatch
from walstream.objects import ObjectMeta
from walstream.wal import WalMode, WalRecord
from walstream_wal_s3 import S3ObjectStore, S3Settings
from walstream_wal_s3.client import RetryPolicy
from walstream_wal_s3.layout import WalKeys, encode_wal_object
from walstream_wal_s3.wal import S3Wal

NODE = 7
OURS = bytes(range(16))
THEIRS = bytes(range(100, 116))
KEYS = WalKeys.for_node(NODE)


@pytest_asyncio.fixture
async def store(s3_bucket: Any) -> AsyncIterator[S3ObjectStore]:
    """One store (one client) shared by the WALs of a test: building a client is the slow part."""
    shared = S3ObjectStore(
        S3Settings(**s3_bucket.options(), retry=RetryPolicy(max_attempts=5, base_delay_s=0.005))
    )
    yield shared
    await shared.close()


def wal_on(store: S3ObjectStore, deployment: bytes | None = OURS, **options: Any) -> S3Wal:
    options.setdefault("max_batch_interval_s", 0.005)
    wal = S3Wal(store, owns_store=False, **options)
    if deployment is not None:
        wal.bind_deployment(deployment)
    return wal


async def start(wal: S3Wal, epoch: int, mode: WalMode = WalMode.READ_WRITE) -> list[WalRecord]:
    await wal.start(NODE, epoch, mode)
    return [record async for record in wal.recover()]


async def write_objects(store: S3ObjectStore, count: int, epoch: int = 1) -> list[bytes]:
    """``count`` one-record objects written one after the other (each attests the previous)."""
    wal = wal_on(store)
    await start(wal, epoch)
    payloads = [f"record-{index}".encode() for index in range(count)]
    for payload in payloads:
        await wal.append(payload)
    await wal.close()
    return payloads


async def put_object(
    store: S3ObjectStore,
    first: int,
    payloads: Sequence[bytes],
    *,
    epoch: int = 1,
    deployment: bytes = OURS,
    durable_before: int = 0,
    version: int = 2,
) -> str:
    """A hand-made WAL object (``durable_before=0`` attests nothing, like a group sealed while
    every earlier one was still in flight)."""
    name = KEYS.data_object(first, first + len(payloads) - 1, epoch)
    body = encode_wal_object(
        NODE,
        epoch,
        first,
        payloads,
        deployment_id=deployment,
        durable_before=durable_before,
        version=version,
    )
    await store.put(name.key, body)
    return name.key


async def data_keys(store: S3ObjectStore) -> list[str]:
    return [meta.key async for meta in store.list(KEYS.data)]


def pairs(records: Sequence[WalRecord]) -> list[tuple[int, bytes]]:
    return [(record.offset, record.data) for record in records]


# -- identity (invariant 12) ---------------------------------------------------------------------


async def test_foreign_deployment_prefix_is_refused(store: S3ObjectStore) -> None:
    theirs = wal_on(store, THEIRS)
    await start(theirs, 1)
    await theirs.append(b"their record")
    await theirs.close()

    for mode in (WalMode.READ_WRITE, WalMode.FAILOVER, WalMode.READ_ONLY):
        ours = wal_on(store, OURS)
        with pytest.raises(IdentityMismatch) as refused:
            await ours.start(NODE, 2, mode)
        message = str(refused.value)
        assert store.settings.bucket in message and "wal/7/" in message
        assert THEIRS.hex() in message and OURS.hex() in message
        assert "prefix" in message and "check" in message
        await ours.close()
    # Refusing claimed nothing: the owner restarts at the next epoch and finds its record.
    owner = wal_on(store, THEIRS)
    assert [record.data for record in await start(owner, 2)] == [b"their record"]
    await owner.close()


async def test_marker_of_another_node_is_refused(store: S3ObjectStore) -> None:
    # Node 8's WAL copied under node 7's prefix (a mixed-up configuration).
    await store.put(KEYS.epoch(1), b"node=8 epoch=1 mode=read_write")
    wal = wal_on(store)
    with pytest.raises(IdentityMismatch, match="claimed by node 8"):
        await wal.start(NODE, 2, WalMode.READ_WRITE)
    await wal.close()


async def test_unbound_wal_keeps_working_without_identity_checks(store: S3ObjectStore) -> None:
    await write_objects(store, 2)
    unbound = wal_on(store, deployment=None)
    assert [record.data for record in await start(unbound, 2)] == [b"record-0", b"record-1"]
    await unbound.close()


async def test_foreign_wal_object_is_never_yielded(store: S3ObjectStore) -> None:
    payloads = await write_objects(store, 5)
    # Another deployment's object, well formed and with the same offsets, swapped in.
    swapped = await put_object(store, 2, [b"foreign bytes"], deployment=THEIRS, durable_before=2)
    tail = await put_object(store, 4, [b"foreign tail"], deployment=THEIRS, durable_before=4)
    wal = wal_on(store)
    recovered = await start(wal, 2)
    assert b"foreign bytes" not in [record.data for record in recovered]
    assert pairs(recovered[:3]) == [(0, payloads[0]), (1, payloads[1]), (3, payloads[3])]
    damage = recovered[2].damage_before
    assert damage is not None and (damage.start, damage.end) == (2, 3)
    assert swapped in damage.reason and THEIRS.hex() in damage.reason
    # At the end it is a complete object of someone else: reported, never a torn write.
    report = recovered[3]
    assert report.is_damage_report and report.offset == 5
    assert report.damage_before is not None and tail in report.damage_before.reason
    assert len(recovered) == 4
    assert await wal.append(b"next") == 5  # the damaged offsets are never reused
    await wal.close()


async def test_object_without_deployment_id_under_a_bound_epoch_is_damage(
    store: S3ObjectStore,
) -> None:
    payloads = await write_objects(store, 3)
    legacy = await put_object(store, 1, [b"unbound bytes"], deployment=b"", durable_before=1)
    wal = wal_on(store)
    recovered = await start(wal, 2)
    assert pairs(recovered) == [(0, payloads[0]), (2, payloads[2])]
    damage = recovered[1].damage_before
    assert damage is not None and legacy in damage.reason and "no deployment id" in damage.reason
    await wal.close()


# -- old format ---------------------------------------------------------------------------------


async def test_format_1_objects_and_markers_are_still_read(store: S3ObjectStore) -> None:
    # What the previous version wrote: a plain-text marker, version 1 objects.
    await store.put(KEYS.epoch(1), f"node={NODE} epoch=1 mode=read_write".encode())
    await store.put(KEYS.base(1), b"0")
    await put_object(store, 0, [b"old-0", b"old-1"], version=1)
    await put_object(store, 2, [b"old-2"], version=1)
    wal = wal_on(store)
    assert pairs(await start(wal, 2)) == [(0, b"old-0"), (1, b"old-1"), (2, b"old-2")]
    assert await wal.append(b"new-3") == 3
    await wal.close()
    again = wal_on(store)
    records = await start(again, 3)
    assert pairs(records) == [(0, b"old-0"), (1, b"old-1"), (2, b"old-2"), (3, b"new-3")]
    assert all(record.damage_before is None for record in records)
    await again.close()


# -- damage vs torn tail (invariant 11) ---------------------------------------------------------


async def test_checksum_failure_in_the_middle_is_reported_and_recovery_goes_on(
    store: S3ObjectStore,
) -> None:
    payloads = await write_objects(store, 6)
    keys = await data_keys(store)
    stored = bytearray(await store.get(keys[2]))
    stored[-1] ^= 0x10
    await store.put(keys[2], bytes(stored))
    wal = wal_on(store)
    recovered = await start(wal, 2)
    assert pairs(recovered) == [(i, payloads[i]) for i in (0, 1, 3, 4, 5)]
    damage = recovered[2].damage_before
    assert damage is not None
    assert (damage.start, damage.end, damage.damaged_bytes) == (2, 3, len(stored))
    assert keys[2] in damage.reason and "checksum" in damage.reason
    assert all(record.damage_before is None for record in recovered if record is not recovered[2])
    await wal.close()


async def test_checksum_failure_at_the_end_is_a_damage_report_not_a_torn_tail(
    store: S3ObjectStore,
) -> None:
    payloads = await write_objects(store, 3)
    keys = await data_keys(store)
    stored = bytearray(await store.get(keys[-1]))
    stored[10] ^= 0x01  # inside the header
    await store.put(keys[-1], bytes(stored))
    wal = wal_on(store)
    recovered = await start(wal, 2)
    assert pairs(recovered[:2]) == [(0, payloads[0]), (1, payloads[1])]
    report = recovered[2]
    assert report.is_damage_report and report.offset == 3
    assert report.damage_before is not None
    assert (report.damage_before.start, report.damage_before.end) == (2, 3)
    assert keys[-1] in report.damage_before.reason
    assert await wal.append(b"after") == 3
    await wal.close()


async def test_gap_beyond_the_in_flight_window_is_damage(store: S3ObjectStore) -> None:
    owner = wal_on(store, max_inflight=3)
    await start(owner, 1)  # its marker records max_inflight 3
    await owner.close()
    # No object attests another: only the window rule can tell.
    for first in (0, 1, 3, 4, 5):
        await put_object(store, first, [f"r{first}".encode()])
    wal = wal_on(store)  # its own max_inflight (8) does not matter: the writer's does
    recovered = await start(wal, 2)
    assert pairs(recovered) == [(i, f"r{i}".encode()) for i in (0, 1, 3, 4, 5)]
    damage = recovered[2].damage_before
    assert damage is not None and (damage.start, damage.end) == (2, 3)
    assert "max_inflight 3" in damage.reason and "offsets 2..2" in damage.reason
    await wal.close()


async def test_gap_within_the_in_flight_window_at_the_end_is_a_torn_tail(
    store: S3ObjectStore,
) -> None:
    owner = wal_on(store, max_inflight=3)
    await start(owner, 1)
    await owner.close()
    for first in (0, 1, 3, 4):  # 2 was in flight when 3 and 4 were written: 3 PUTs at once
        await put_object(store, first, [f"r{first}".encode()], durable_before=min(first, 2))
    wal = wal_on(store)
    recovered = await start(wal, 2)
    assert pairs(recovered) == [(0, b"r0"), (1, b"r1")]
    assert all(record.damage_before is None for record in recovered)
    assert wal.torn_objects == 2
    assert await wal.append(b"replaces the torn tail") == 2
    await wal.close()
    again = wal_on(store)
    assert pairs(await start(again, 3)) == [(0, b"r0"), (1, b"r1"), (2, b"replaces the torn tail")]
    await again.close()


@pytest.mark.slow
async def test_gap_attested_by_a_later_object_is_damage(store: S3ObjectStore) -> None:
    payloads = await write_objects(store, 4)
    keys = await data_keys(store)
    await store.delete([keys[2]])  # one object after it: inside the window, but attested
    wal = wal_on(store)
    recovered = await start(wal, 2)
    assert pairs(recovered) == [(0, payloads[0]), (1, payloads[1]), (3, payloads[3])]
    damage = recovered[2].damage_before
    # The lost object's size is unknown: the bound is the largest record it could have held.
    assert damage is not None and (damage.start, damage.end) == (2, 3)
    assert damage.damaged_bytes == wal.capabilities.max_record_bytes
    assert keys[3] in damage.reason and "attests" in damage.reason
    await wal.close()


@pytest.mark.slow
async def test_gap_below_a_recovered_base_is_damage(store: S3ObjectStore) -> None:
    for first in (0, 1, 2):
        await put_object(store, first, [f"r{first}".encode()])
    first_owner = wal_on(store)
    assert len(await start(first_owner, 1)) == 3  # epoch 1 recovers past offset 1: base 3
    await first_owner.close()
    await store.delete([KEYS.data_object(1, 1, 1).key])
    wal = wal_on(store)
    recovered = await start(wal, 2)
    assert pairs(recovered) == [(0, b"r0"), (2, b"r2")]
    damage = recovered[1].damage_before
    assert damage is not None and "epoch 1" in damage.reason and "base 3" in damage.reason
    await wal.close()


async def test_gap_followed_by_objects_of_two_epochs_is_damage(store: S3ObjectStore) -> None:
    owner = wal_on(store)
    await start(owner, 1)
    await owner.close()
    await put_object(store, 0, [b"r0"])
    await put_object(store, 2, [b"r2"])
    await put_object(store, 3, [b"r3"], epoch=2)  # no base of epoch 2 excludes anything
    await store.put(KEYS.epoch(2), f"node={NODE} epoch=2 mode=read_write".encode())
    wal = wal_on(store)
    recovered = await start(wal, 3)
    assert pairs(recovered) == [(0, b"r0"), (2, b"r2"), (3, b"r3")]
    damage = recovered[1].damage_before
    assert damage is not None and "epochs [1, 2]" in damage.reason
    await wal.close()


async def test_damage_is_reported_again_until_trimmed(store: S3ObjectStore) -> None:
    payloads = await write_objects(store, 5)
    keys = await data_keys(store)
    await store.delete([keys[1]])
    wal = wal_on(store)
    recovered = await start(wal, 2)
    assert [record.offset for record in recovered if record.damage_before] == [2]
    await wal.close()
    again = wal_on(store)
    recovered = await start(again, 3)  # epoch 2's base is above the gap now: still damage
    assert [record.offset for record in recovered if record.damage_before] == [2]
    await again.trim(2)
    await again.close()
    trimmed = wal_on(store)
    recovered = await start(trimmed, 4)
    assert pairs(recovered) == [(3, payloads[3]), (4, payloads[4])]
    assert all(record.damage_before is None for record in recovered)
    await trimmed.close()


async def test_concurrent_writes_recover_intact(store: S3ObjectStore) -> None:
    wal = wal_on(store, max_batch_bytes=64, max_inflight=4)
    await start(wal, 1)
    acked: list[tuple[int, bytes]] = []
    for round_number in range(4):
        data = [f"round{round_number}-{index}".encode() * 3 for index in range(12)]
        offsets = await asyncio.gather(*(wal.append(item) for item in data))
        acked.extend(zip(offsets, data, strict=True))
    assert wal.objects_written > 4
    await wal.close()
    again = wal_on(store)
    recovered = await start(again, 2)
    assert pairs(recovered) == acked
    assert all(record.damage_before is None for record in recovered)
    await again.close()


async def test_object_missed_by_a_racing_listing_is_listed_again(s3_bucket: Any) -> None:
    class RacyListing(S3ObjectStore):
        """Hides one data key from the first full listing, as a LIST racing its PUT can."""

        hidden: str | None = None

        async def list(  # type: ignore[override]
            self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None
        ) -> AsyncIterator[ObjectMeta]:
            hide, self.hidden = (self.hidden, None) if prefix == KEYS.root else (None, self.hidden)
            async for meta in super().list(prefix, start_after=start_after, limit=limit):
                if meta.key != hide:
                    yield meta

    store = RacyListing(S3Settings(**s3_bucket.options()))
    payloads = await write_objects(store, 12)
    store.hidden = (await data_keys(store))[2]
    reader = wal_on(store)
    records = await start(reader, 0, WalMode.READ_ONLY)
    assert store.hidden is None  # the racing listing happened
    assert pairs(records) == list(enumerate(payloads))
    assert all(record.damage_before is None for record in records)
    await reader.close()
    await store.close()
