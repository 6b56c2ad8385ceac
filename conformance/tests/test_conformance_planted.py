"""Every planted bug is caught by the suite test meant to catch it — and the same test passes on
the correct backend, so neither side of the check is vacuous."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from types import ModuleType

import pytest
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal
from walstream_conformance import MetadataSuite, ObjectStoreSuite, WalKit, WalSuite
from walstream_conformance.backends import BackendSpec
from walstream_conformance.harness.crash import CrashCheckFailed
from walstream_conformance.harness.power import SimulatedDisk
from walstream_conformance.suites.metadata import MetadataKit

_volumes = itertools.count()
CAUGHT = (AssertionError, pytest.fail.Exception)


def _volume() -> str:
    return f"conformance-planted-{next(_volumes)}"


@pytest.mark.slow
async def test_acking_from_process_memory_is_caught_by_the_crash_harness(
    planted: ModuleType, tmp_path: Path
) -> None:
    spec = BackendSpec(
        "wal",
        target=f"{planted.__file__}:make_memory_ack_wal",
        kwargs={"path": str(tmp_path / "planted.wal")},
    )
    kit = WalKit(
        factory=lambda: planted.make_memory_ack_wal(str(tmp_path / "in-process.wal")),
        spec=spec,
        crash_cycles=4,
        seed=11,
    )
    try:
        # In one process, with clean closes, nothing is lost: only a kill shows the bug.
        await WalSuite().test_acked_recovered(kit)
        with pytest.raises(CrashCheckFailed, match="acknowledged records were not recovered"):
            await WalSuite().test_acked_recovered_after_process_kill(kit, tmp_path)
    finally:
        await kit.aclose()


async def test_acking_before_sync_is_caught_by_the_power_loss_simulation(
    planted: ModuleType, appendfile_wal_class: type, tmp_path: Path
) -> None:
    broken_disk = SimulatedDisk(random.Random(3))
    broken = WalKit(
        factory=lambda: planted.UnsyncedFileWal(tmp_path / "unsynced.wal", io=broken_disk),
        power_loss=broken_disk.lose_power,
    )
    sound_disk = SimulatedDisk(random.Random(3))
    sound = WalKit(
        factory=lambda: appendfile_wal_class(tmp_path / "synced.wal", io=sound_disk),
        power_loss=sound_disk.lose_power,
    )
    try:
        with pytest.raises(CAUGHT, match="lost in a power loss"):
            await WalSuite().test_acked_recovered_after_power_loss(broken)
        assert broken_disk.lost_writes > 0
        await WalSuite().test_acked_recovered_after_power_loss(sound)
    finally:
        await broken.aclose()
        await sound.aclose()


@pytest.mark.slow
async def test_acking_before_sync_survives_a_process_kill(
    planted: ModuleType, tmp_path: Path
) -> None:
    """The page cache survives SIGKILL: only the power-loss simulation can catch this bug."""
    spec = BackendSpec(
        "wal",
        target=f"{planted.__file__}:make_unsynced_wal",
        kwargs={"path": str(tmp_path / "unsynced.wal")},
    )
    kit = WalKit(factory=lambda: spec.build(), spec=spec, crash_cycles=2, seed=5)
    try:
        await WalSuite().test_acked_recovered_after_process_kill(kit, tmp_path)
    finally:
        await kit.aclose()


async def test_reordered_acknowledgements_are_caught(planted: ModuleType) -> None:
    volume = _volume()
    kit = WalKit(factory=lambda: planted.ReorderingWal(volume, seed=1))
    try:
        with pytest.raises(CAUGHT, match="out of call order"):
            await WalSuite().test_ack_order(kit)
    finally:
        await kit.aclose()


async def test_returning_trimmed_records_is_caught(planted: ModuleType) -> None:
    volume = _volume()
    kit = WalKit(factory=lambda: planted.ExclusiveTrimWal(volume))
    sound_volume = _volume()
    sound = WalKit(factory=lambda: MemoryWal(sound_volume))
    try:
        with pytest.raises(CAUGHT, match="after trim"):
            await WalSuite().test_trim_inclusive(kit)
        await WalSuite().test_trim_inclusive(sound)
    finally:
        await kit.aclose()
        await sound.aclose()


async def test_wal_serving_another_deployment_is_caught(planted: ModuleType) -> None:
    volume = _volume()
    kit = WalKit(factory=lambda: planted.IdentityBlindWal(volume))
    sound_volume = _volume()
    sound = WalKit(factory=lambda: MemoryWal(sound_volume))
    try:
        with pytest.raises(CAUGHT, match="IdentityMismatch"):
            await WalSuite().test_identity(kit)
        await WalSuite().test_identity(sound)
    finally:
        await kit.aclose()
        await sound.aclose()


async def test_metadata_accepting_a_stale_epoch_is_caught(planted: ModuleType) -> None:
    volume = _volume()
    kit = MetadataKit(lambda: planted.StaleEpochMetadata(volume))
    sound_volume = _volume()
    sound = MetadataKit(lambda: MemoryMetadataStore(sound_volume))
    try:
        with pytest.raises(CAUGHT, match="FencedError"):
            await MetadataSuite().test_epochs_fence(kit)
        await MetadataSuite().test_epochs_fence(sound)
    finally:
        await kit.aclose()
        await sound.aclose()


@pytest.mark.parametrize(
    ("planted_class", "test_name", "message"),
    [
        ("RacyFailoverClaim", "test_lease_claim_expired", "2 of 2 concurrent failover claims"),
        ("LeaseBlindClaim", "test_lease_claim_of_live_node", "was claimed"),
        ("NoFailoverReclaim", "test_lease_failover_reclaim_expired", "0 of 2 concurrent claims"),
        ("FailoverLeaseBlindClaim", "test_lease_failover_lease_holds", "was claimed again"),
    ],
)
async def test_metadata_failover_claims_that_break_the_lease_are_caught(
    planted: ModuleType, planted_class: str, test_name: str, message: str
) -> None:
    volume = _volume()
    kit = MetadataKit(lambda: getattr(planted, planted_class)(volume))
    sound_volume = _volume()
    sound = MetadataKit(lambda: MemoryMetadataStore(sound_volume))
    try:
        with pytest.raises(CAUGHT, match=message):
            await getattr(MetadataSuite(), test_name)(kit)
        await getattr(MetadataSuite(), test_name)(sound)
    finally:
        await kit.aclose()
        await sound.aclose()


@pytest.mark.parametrize(
    ("planted_class", "test_name", "message"),
    [
        ("VersionBlindKv", "test_kv_compare_and_set", "DID NOT RAISE.*VersionMismatchError"),
        ("RacyKv", "test_kv_concurrent_writers", "5 of 5 concurrent creates of one key won"),
    ],
)
async def test_metadata_kv_writes_that_ignore_the_version_are_caught(
    planted: ModuleType, planted_class: str, test_name: str, message: str
) -> None:
    volume = _volume()
    kit = MetadataKit(lambda: getattr(planted, planted_class)(volume))
    sound_volume = _volume()
    sound = MetadataKit(lambda: MemoryMetadataStore(sound_volume))
    try:
        with pytest.raises(CAUGHT, match=message):
            await getattr(MetadataSuite(), test_name)(kit)
        await getattr(MetadataSuite(), test_name)(sound)
    finally:
        await kit.aclose()
        await sound.aclose()


@pytest.mark.parametrize(
    ("planted_class", "message"),
    [
        ("ReconfigureResets", "a reconfigure of one field changed others"),
        ("RacyReconfigure", "a concurrent reconfigure of another field was lost"),
    ],
)
async def test_metadata_reconfigures_that_lose_fields_are_caught(
    planted: ModuleType, planted_class: str, message: str
) -> None:
    volume = _volume()
    kit = MetadataKit(lambda: getattr(planted, planted_class)(volume))
    sound_volume = _volume()
    sound = MetadataKit(lambda: MemoryMetadataStore(sound_volume))
    try:
        with pytest.raises(CAUGHT, match=message):
            await MetadataSuite().test_stream_config_kept(kit)
        await MetadataSuite().test_stream_config_kept(sound)
    finally:
        await kit.aclose()
        await sound.aclose()


async def test_object_store_with_unconditional_put_if_absent_is_caught(planted: ModuleType) -> None:
    with pytest.raises(CAUGHT, match="concurrent put_if_absent"):
        await ObjectStoreSuite().test_put_if_absent(planted.RacyConditionalStore())
    await ObjectStoreSuite().test_put_if_absent(MemoryObjectStore())
