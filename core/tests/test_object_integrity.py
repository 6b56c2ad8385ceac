"""Object integrity through the engine: identity in every object, uploads that never overwrite,
bad blocks that fail only the reads needing them, and a compaction schedule that survives
restarts."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from walstream import Client, CorruptionError, EngineConfig, Record
from walstream.cli import main as cli_main
from walstream.clock import ManualClock
from walstream.config import CacheConfig, CompactionConfig, UploadConfig
from walstream.engine.compaction import Compactor
from walstream.engine.events import NullHooks
from walstream.engine.object_reader import ObjectReader
from walstream.engine.upload import publish_object
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    IdentityMismatch,
    PreconditionFailed,
)
from walstream.format.batch import encode_batch
from walstream.format.object import FORMAT_VERSION, ObjectIdentity, parse_footer, parse_index
from walstream.format.object_builder import ObjectBuilder
from walstream.format.object_keys import is_identity_key, legacy_object_key, object_key
from walstream.metadata import (
    MetadataStore,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamRange,
)
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal

ONE_OBJECT = EngineConfig(
    upload=UploadConfig(max_bytes=64 << 20, max_interval_s=60.0),
    compaction=CompactionConfig(enabled=False),
)
SMALL_UPLOADS = EngineConfig(
    upload=UploadConfig(max_bytes=128 << 10, max_interval_s=0.05, split_bytes=64 << 10),
    compaction=CompactionConfig(enabled=False),
)


def value_for(tag: str, offset: int, size: int = 64) -> bytes:
    seed = f"{tag}:{offset}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


class Deployment:
    """One deployment's WAL and metadata over a given object store (shared or not)."""

    def __init__(self, name: str, objects: LocalObjectStore | MemoryObjectStore) -> None:
        self.name = f"{name}-{os.urandom(4).hex()}"
        self.objects = objects

    def metadata(self) -> MemoryMetadataStore:
        return MemoryMetadataStore(name=self.name)

    def client(self, config: EngineConfig = SMALL_UPLOADS) -> Client:
        return Client(
            wal=MemoryWal(name=self.name),
            objects=self.objects,
            metadata=self.metadata(),
            config=config,
        )


async def committed(metadata: MetadataStore) -> list[ObjectInfo]:
    return await metadata.list_objects(state=ObjectState.COMMITTED)


async def read_values(client: Client, stream: str, start: int = 0) -> list[bytes]:
    handle = await client.open_stream(stream)
    values: list[bytes] = []
    position = start
    while True:
        result = await handle.read(start=position, limit_records=1000, limit_bytes=8 << 20)
        if not result.records:
            return values
        values.extend(record.value for record in result.records)
        position = result.records[-1].offset + 1


# ---------------------------------------------------------------- identity


async def test_two_deployments_sharing_one_object_folder_each_read_their_own(
    tmp_path: Path,
) -> None:
    shared = LocalObjectStore(tmp_path / "objects", fsync=False)
    first, second = Deployment("first", shared), Deployment("second", shared)
    for deployment in (first, second):
        async with deployment.client() as client:
            stream = await client.create_stream("s")
            for offset in range(40):
                await stream.append([Record(value_for(deployment.name, offset))])
            await client.flush()
    first_keys = {info.key for info in await committed(first.metadata())}
    second_keys = {info.key for info in await committed(second.metadata())}
    assert first_keys and second_keys and not first_keys & second_keys
    # Both deployments hand out the same object ids; the keys still differ.
    first_ids = {info.object_id for info in await committed(first.metadata())}
    second_ids = {info.object_id for info in await committed(second.metadata())}
    assert first_ids & second_ids
    assert all(is_identity_key(key) for key in first_keys | second_keys)
    for deployment in (first, second):
        async with deployment.client() as client:
            assert await read_values(client, "s") == [
                value_for(deployment.name, offset) for offset in range(40)
            ]


async def test_another_deployments_object_copied_over_ours_is_an_identity_mismatch(
    tmp_path: Path,
) -> None:
    shared = LocalObjectStore(tmp_path / "objects", fsync=False)
    ours, theirs = Deployment("ours", shared), Deployment("theirs", shared)
    for deployment in (ours, theirs):
        async with deployment.client(ONE_OBJECT) as client:
            stream = await client.create_stream("s")
            await stream.append([Record(value_for(deployment.name, n)) for n in range(30)])
            await client.flush()
    (our_object,) = await committed(ours.metadata())
    (their_object,) = await committed(theirs.metadata())
    assert our_object.object_id == their_object.object_id
    assert our_object.size == their_object.size  # same layout: only the identity tells them apart
    no_block_cache = EngineConfig(
        upload=ONE_OBJECT.upload,
        compaction=ONE_OBJECT.compaction,
        cache=CacheConfig(block_cache_bytes=0),
    )
    async with ours.client(no_block_cache) as client:
        assert len(await read_values(client, "s")) == 30  # the index is cached now
        original = shared.path_of(our_object.key).read_bytes()
        shared.path_of(our_object.key).write_bytes(shared.path_of(their_object.key).read_bytes())
        # Blocks come from the replaced file while the index is cached: their CRCs are seeded
        # with the identity, so they fail, and the reader names the identity.
        with pytest.raises(IdentityMismatch) as caught:
            await read_values(client, "s")
        message = str(caught.value)
        assert our_object.key in message
        assert f"expected deployment {(await ours.metadata().deployment_id()).hex()}" in message
        assert f"found deployment {(await theirs.metadata().deployment_id()).hex()}" in message
    async with ours.client() as client:  # a fresh client: the footer check fails first
        with pytest.raises(IdentityMismatch, match=our_object.key):
            await read_values(client, "s")
        shared.path_of(our_object.key).write_bytes(original)
        assert len(await read_values(client, "s")) == 30


async def test_another_object_ids_file_of_the_same_deployment_is_an_identity_mismatch() -> None:
    deployment = Deployment("one", MemoryObjectStore())
    async with deployment.client(ONE_OBJECT) as client:
        stream = await client.create_stream("s")
        for round_number in range(2):
            await stream.append([Record(value_for("v", 10 * round_number + n)) for n in range(10)])
            await client.flush()
    first, second = await committed(deployment.metadata())
    store = deployment.objects
    assert isinstance(store, MemoryObjectStore)
    await store.put(first.key, await store.get(second.key))
    async with deployment.client() as client:
        with pytest.raises(
            IdentityMismatch, match=f"expected deployment .* object {first.object_id}"
        ):
            await read_values(client, "s")


async def test_uploads_write_the_identity_into_every_object() -> None:
    deployment = Deployment("id", MemoryObjectStore())
    async with deployment.client() as client:
        stream = await client.create_stream("s")
        for offset in range(200):
            await stream.append([Record(value_for("x", offset, 2000))])
        await client.flush()
        assert await client.compact()
    deployment_id = await deployment.metadata().deployment_id()
    infos = await committed(deployment.metadata())
    assert any(info.kind is ObjectKind.STREAM for info in infos)
    for info in infos:
        data = await deployment.objects.get(info.key)
        footer = parse_footer(data, len(data))
        assert footer.version == FORMAT_VERSION
        assert footer.identity == ObjectIdentity(deployment_id, info.object_id)
        assert info.key == object_key(info.object_id, deployment_id)


def test_inspect_object_shows_the_identity_of_new_and_old_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deployment_id = bytes(range(16))
    for name, identity in (("new.wso", ObjectIdentity(deployment_id, 77)), ("old.wso", None)):
        builder = ObjectBuilder(identity=identity)
        for offset in range(5):
            builder.add_batch(encode_batch(1, 1, offset, [Record(b"v%d" % offset)], [offset]))
        (tmp_path / name).write_bytes(builder.finish().data)
    assert cli_main(["inspect", "object", str(tmp_path / "new.wso")]) == 0
    out = capsys.readouterr().out
    assert f"format version {FORMAT_VERSION}" in out
    assert f"identity: deployment {deployment_id.hex()}, object id 77" in out
    assert "verified" in out
    assert cli_main(["inspect", "object", str(tmp_path / "old.wso")]) == 0
    out = capsys.readouterr().out
    assert "format version 1" in out and "carries no identity" in out and "verified" in out


# ---------------------------------------------------------------- no overwrites


def _built(identity: ObjectIdentity, tag: bytes = b"v") -> bytes:
    builder = ObjectBuilder(identity=identity)
    builder.add_batch(encode_batch(1, 1, 0, [Record(tag)], [0]))
    return builder.finish().data


async def _publish(
    store: MemoryObjectStore, key: str, data: bytes, identity: ObjectIdentity
) -> None:
    await publish_object(
        store, key, data, identity, clock=ManualClock(), rng=random.Random(0), give_up=lambda: False
    )


class AmbiguousOnceStore(MemoryObjectStore):
    """Creates the object on the first conditional put but reports the outcome as unknown (a
    lost response); refuses plain puts, which would overwrite."""

    def __init__(self) -> None:
        super().__init__()
        self.conditional_puts = 0

    async def put(self, key: str, data: bytes) -> None:
        raise AssertionError(f"plain put of {key!r}: objects must be created conditionally")

    async def put_if_absent(self, key: str, data: bytes) -> None:
        self.conditional_puts += 1
        await super().put_if_absent(key, data)
        if self.conditional_puts == 1:
            raise AmbiguousError(f"put of {key!r}: connection reset after the request was sent")


async def test_publish_resolves_an_existing_key_by_content_and_never_overwrites() -> None:
    deployment_id = bytes(range(16))
    identity = ObjectIdentity(deployment_id, 5)
    key = object_key(5, deployment_id)
    data = _built(identity)

    retried = AmbiguousOnceStore()
    await _publish(retried, key, data, identity)  # the retry finds our own bytes: success
    assert retried.conditional_puts == 2 and await retried.get(key) == data

    foreign = MemoryObjectStore()
    theirs = _built(ObjectIdentity(bytes(16), 5))
    await foreign.put(key, theirs)
    with pytest.raises(IdentityMismatch) as caught:
        await _publish(foreign, key, data, identity)
    assert key in str(caught.value) and "not overwritten" in str(caught.value)
    assert f"expected deployment {deployment_id.hex()} object 5" in str(caught.value)
    assert await foreign.get(key) == theirs

    reused = MemoryObjectStore()
    earlier = _built(identity, b"an earlier object with the same id")
    await reused.put(key, earlier)
    with pytest.raises(PreconditionFailed, match="handed out twice"):
        await _publish(reused, key, data, identity)
    assert await reused.get(key) == earlier

    junk = MemoryObjectStore()
    await junk.put(key, b"not an object")
    with pytest.raises(PreconditionFailed, match="not overwritten"):
        await _publish(junk, key, data, identity)
    assert await junk.get(key) == b"not an object"


async def test_engine_uploads_and_compaction_only_create_objects() -> None:
    store = AmbiguousOnceStore()
    deployment = Deployment("create-only", store)
    async with deployment.client() as client:
        stream = await client.create_stream("s")
        for offset in range(120):
            await stream.append([Record(value_for("c", offset, 2000))])
            if offset % 10 == 9:
                await client.flush()
        assert len(await committed(client.metadata)) >= 4
        assert await client.compact()
        assert await read_values(client, "s") == [value_for("c", n, 2000) for n in range(120)]
    assert store.conditional_puts > 2


async def test_an_upload_onto_a_foreign_object_fails_and_leaves_it() -> None:
    store = MemoryObjectStore()
    deployment = Deployment("victim", store)
    deployment_id = await deployment.metadata().deployment_id()
    # Plant another deployment's file under every key the next uploads could use.
    planted = {
        object_key(object_id, deployment_id): _built(ObjectIdentity(bytes(16), object_id))
        for object_id in range(0, 8)
    }
    for key, data in planted.items():
        await store.put(key, data)
    client = await deployment.client().start()
    try:
        stream = await client.create_stream("s")
        await stream.append([Record(b"ours")])
        with pytest.raises((IdentityMismatch, BackendUnavailable)) as caught:
            await client.flush()
        assert "not overwritten" in str(caught.value)
    finally:
        await client.close()
    for key, data in planted.items():
        assert await store.get(key) == data


# ---------------------------------------------------------------- failure isolation


async def _one_object_of_blocks(tmp_path: Path) -> tuple[Deployment, ObjectInfo, bytes]:
    """A deployment whose stream ``s`` is one object of 6 blocks of 8 records (100 KB each)."""
    deployment = Deployment("blocks", LocalObjectStore(tmp_path / "objects", fsync=False))
    async with deployment.client(ONE_OBJECT) as client:
        stream = await client.create_stream("s")
        for first in range(0, 48, 4):
            await stream.append([Record(value_for("b", first + n, 100_000)) for n in range(4)])
        await client.flush()
    (info,) = await committed(deployment.metadata())
    assert isinstance(deployment.objects, LocalObjectStore)
    data = deployment.objects.path_of(info.key).read_bytes()
    return deployment, info, data


READ_AHEAD_EVERYTHING = EngineConfig(
    upload=ONE_OBJECT.upload,
    compaction=ONE_OBJECT.compaction,
    cache=CacheConfig(readahead_min_bytes=64 << 20, readahead_max_bytes=64 << 20),
)


async def test_a_bad_block_fails_only_the_reads_that_need_it(tmp_path: Path) -> None:
    deployment, info, data = await _one_object_of_blocks(tmp_path)
    index = parse_index(data, len(data))
    assert [entry.start_offset for entry in index.entries] == [0, 8, 16, 24, 32, 40]
    bad = index.entries[2]
    damaged = bytearray(data)
    damaged[bad.position + 1000] ^= 0x04
    assert isinstance(deployment.objects, LocalObjectStore)
    path = deployment.objects.path_of(info.key)
    path.write_bytes(bytes(damaged))

    async with deployment.client(READ_AHEAD_EVERYTHING) as client:
        stream = await client.open_stream("s")

        async def values(start: int, count: int) -> list[bytes]:
            result = await stream.read(start=start, limit_records=count, limit_bytes=64 << 20)
            return [record.value for record in result.records]

        def expected(start: int, count: int) -> list[bytes]:
            return [value_for("b", n, 100_000) for n in range(start, start + count)]

        # The first GET reads ahead over every block, the bad one included.
        assert await values(0, 4) == expected(0, 4)
        for _ in range(2):
            with pytest.raises(CorruptionError, match="checksum mismatch"):
                await values(16, 1)
            with pytest.raises(CorruptionError):
                await values(0, 48)  # needs the bad block's offsets
            assert await values(0, 16) == expected(0, 16)
            assert await values(24, 24) == expected(24, 24)
            assert await values(12, 4) == expected(12, 4)
        # Nothing was remembered as failed: once the bytes are good again, so is the read.
        path.write_bytes(data)
        assert await values(0, 48) == expected(0, 48)

    # The object reader on its own: the same, and only the bad block stays out of its cache.
    path.write_bytes(bytes(damaged))
    reader = ObjectReader(deployment.objects, deployment.metadata(), readahead_min_bytes=64 << 20)
    records = await reader.read(1, 0, None, 16, 1 << 30)
    assert [record.offset for record in records] == list(range(16))
    for start in (0, 16):
        with pytest.raises(CorruptionError):
            await reader.read(1, start, None, 1000, 1 << 30)
    after = await reader.read(1, 24, None, 1000, 1 << 30)
    assert [record.offset for record in after] == list(range(24, 48))
    assert (info.object_id, bad.position) not in reader.blocks
    assert (info.object_id, index.entries[1].position) in reader.blocks


# ---------------------------------------------------------------- compaction schedule


INTERVAL_S = 30.0
SCHEDULED = CompactionConfig(enabled=True, interval_s=INTERVAL_S, min_objects=4)


async def _small_objects(clock: ManualClock, count: int) -> tuple[MemoryObjectStore, str]:
    """``count`` small committed stream objects of one stream, committed at ``clock``'s time."""
    name = f"schedule-{os.urandom(4).hex()}"
    store = MemoryObjectStore()
    client = Client(
        wal=MemoryWal(name=name),
        objects=store,
        metadata=MemoryMetadataStore(name=name, clock=clock),
        config=SMALL_UPLOADS,
    )
    async with client:
        stream = await client.create_stream("s")
        for offset in range(count):
            await stream.append([Record(value_for("k", offset))])
            await client.flush()
    return store, name


def _compactor(store: MemoryObjectStore, name: str, clock: ManualClock) -> Compactor:
    return Compactor(
        objects=store,
        metadata=MemoryMetadataStore(name=name, clock=clock),
        config=SCHEDULED,
        hooks=NullHooks(),
        clock=clock,
    )


async def _wait_for_compaction(name: str, clock: ManualClock, seconds: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        infos = await committed(MemoryMetadataStore(name=name, clock=clock))
        if len(infos) == 1:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_compaction_is_due_from_the_commit_times_of_its_candidates() -> None:
    clock = ManualClock()
    store, name = await _small_objects(clock, 6)
    compactor = _compactor(store, name, clock)
    assert await compactor.seconds_until_due() == pytest.approx(INTERVAL_S)
    clock.advance(10)
    assert await compactor.seconds_until_due() == pytest.approx(INTERVAL_S - 10)
    clock.advance(25)
    assert await compactor.seconds_until_due() == 0
    # Within one process, passes stay an interval apart.
    assert await compactor.seconds_until_due(last_pass_ms=clock.now_ms() - 5000) == (
        pytest.approx(INTERVAL_S - 5)
    )


@pytest.mark.slow
async def test_a_node_restarted_more_often_than_the_interval_still_compacts() -> None:
    clock = ManualClock()
    store, name = await _small_objects(clock, 6)
    compacted_at: float | None = None
    restarts = 0
    while compacted_at is None and restarts < 20:
        restarts += 1
        clock.advance(5)  # the node lives 5 s (of the injected clock) between restarts
        compactor = _compactor(store, name, clock)
        compactor.start()
        if await _wait_for_compaction(name, clock, 0.3):
            compacted_at = restarts * 5
        await compactor.close()
    assert compacted_at is not None, "compaction never ran across restarts"
    assert compacted_at == pytest.approx(INTERVAL_S, abs=5)
    (info,) = await committed(MemoryMetadataStore(name=name, clock=clock))
    assert info.kind is ObjectKind.STREAM


async def test_a_started_compactor_waits_while_its_candidates_are_young() -> None:
    clock = ManualClock()
    store, name = await _small_objects(clock, 6)
    compactor = _compactor(store, name, clock)
    compactor.start()
    try:
        assert not await _wait_for_compaction(name, clock, 0.3)
    finally:
        await compactor.close()


async def test_garbage_collection_deletes_expired_uploads_under_this_deployments_keys() -> None:
    clock = ManualClock()
    name = f"gc-{os.urandom(4).hex()}"
    metadata = MemoryMetadataStore(name=name, clock=clock)
    deployment_id = await metadata.deployment_id()
    (object_id,) = await metadata.prepare_objects(1, 1000)
    store = MemoryObjectStore()
    ours = object_key(object_id, deployment_id)
    await store.put(ours, _built(ObjectIdentity(deployment_id, object_id)))
    # Another deployment sharing the store may own the same id under a legacy key: left alone.
    legacy = legacy_object_key(object_id)
    await store.put(legacy, b"someone else's")
    compactor = Compactor(
        objects=store, metadata=metadata, config=SCHEDULED, hooks=NullHooks(), clock=clock
    )
    assert await compactor.collect_garbage() == 0  # not expired yet
    clock.advance(2)
    assert await compactor.collect_garbage() == 1
    assert [meta.key async for meta in store.list()] == [legacy]


async def test_objects_written_before_identity_are_still_read_through_the_engine() -> None:
    """A deployment upgraded in place: its committed objects are version 1 under legacy keys."""
    name = f"legacy-{os.urandom(4).hex()}"
    metadata = MemoryMetadataStore(name=name)
    node = await metadata.register_node(1, {})
    info = await metadata.create_stream("old")
    claimed = await metadata.claim_stream(info.stream_id, 1, node.node_epoch)
    (object_id,) = await metadata.prepare_objects(1, 600_000)
    builder = ObjectBuilder(block_target_bytes=64)  # no identity: the version-1 format
    for offset in range(20):
        builder.add_batch(
            encode_batch(
                info.stream_id, claimed.epoch, offset, [Record(value_for("o", offset))], [offset]
            )
        )
    built = builder.finish()
    key = legacy_object_key(object_id)
    store = MemoryObjectStore()
    await store.put(key, built.data)
    ranges = (StreamRange(info.stream_id, 0, 20, claimed.epoch, 0, 19),)
    await metadata.commit_objects(
        1,
        node.node_epoch,
        [
            ObjectCommit(
                object_id, key, ObjectKind.STREAM, len(built.data), built.index_size, ranges
            )
        ],
    )
    await metadata.release_streams(1, node.node_epoch)
    client = Client(
        wal=MemoryWal(name=name),
        objects=store,
        metadata=MemoryMetadataStore(name=name),
        config=EngineConfig(node_id=2, compaction=CompactionConfig(enabled=False)),
    )
    async with client:
        assert await read_values(client, "old") == [value_for("o", n) for n in range(20)]
        # New data of the same stream lands in version-2 objects next to the old one.
        stream = await client.open_stream("old")
        await stream.append([Record(b"new")])
        await client.flush()
        assert (await read_values(client, "old"))[-1] == b"new"
