"""``upload.object_format``: a node told to write format 2 (a rolling upgrade whose older nodes
read only 1 and 2) uploads and compacts into version-2 objects, which every node reads; the
default writes 3; a version no node writes is refused at configuration."""

from __future__ import annotations

import os

import pytest
from walstream import Client, EngineConfig, Record
from walstream.config import CompactionConfig, UploadConfig
from walstream.config.host import find_host
from walstream.errors import ConfigError
from walstream.format import object as object_format
from walstream.metadata.contract import ObjectState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal


def config(object_format: int | None) -> EngineConfig:
    upload = {} if object_format is None else {"object_format": object_format}
    return EngineConfig(
        upload=UploadConfig(max_interval_s=3600, **upload),  # type: ignore[arg-type]
        compaction=CompactionConfig(enabled=False, min_objects=2),
    )


async def versions(client: Client, objects: MemoryObjectStore) -> list[int]:
    infos = await client.metadata.list_objects(state=ObjectState.COMMITTED)
    found = []
    for info in infos:
        data = await objects.get(info.key)
        found.append(object_format.parse_footer(data, len(data)).version)
    return found


@pytest.mark.parametrize("written", [2, 3, None])
async def test_uploads_and_compaction_write_the_configured_format(written: int | None) -> None:
    name = f"format-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)

    def client() -> Client:
        return Client(
            wal=MemoryWal(name=name),
            objects=objects,
            metadata=MemoryMetadataStore(name=name),
            config=config(written),
        )

    expected = 3 if written is None else written
    async with client() as node:
        streams = [await node.create_stream(f"s{i}") for i in range(5)]
        for round_ in range(3):
            for stream in streams:
                await stream.append([Record(b"%d-%d" % (stream.stream_id, round_))])
            await node.flush()
        assert await versions(node, objects) == [expected] * 3
        assert await node.compact()
        after = await versions(node, objects)
        assert after and set(after) == {expected}
    async with client() as fresh:  # read back from the objects alone
        for stream in streams:
            handle = await fresh.open_stream(stream.stream_id)
            result = await handle.read(start=0, limit_records=10)
            assert [r.value for r in result.records] == [
                b"%d-%d" % (stream.stream_id, n) for n in range(3)
            ]


async def test_a_large_upload_built_off_the_loop_writes_the_configured_format() -> None:
    objects = MemoryObjectStore()
    async with Client(
        wal=MemoryWal(), objects=objects, metadata=MemoryMetadataStore(), config=config(2)
    ) as node:
        stream = await node.create_stream("large")
        for _ in range(3):  # 3 MiB in one upload: built in a worker thread
            await stream.append([Record(b"x" * 1024) for _ in range(1024)])
        await node.flush()
        assert set(await versions(node, objects)) == {2}


def test_a_format_no_node_writes_is_refused() -> None:
    for bad in (1, 4):
        with pytest.raises(ConfigError, match=r"upload\.object_format"):
            UploadConfig(object_format=bad)


def test_the_deployment_sets_it() -> None:
    host = find_host("the test loads deployments")

    def document(upload: dict[str, object]) -> dict[str, object]:
        return {
            "wal": {"type": "memory"},
            "object_store": {"type": "memory"},
            "metadata": {"type": "memory"},
            "upload": upload,
        }

    assert host.load_deployment(document({})).engine_config.upload.object_format == 3
    older = host.load_deployment(document({"object_format": 2}))
    assert older.engine_config.upload.object_format == 2
    with pytest.raises(ConfigError, match="object_format"):
        host.load_deployment(document({"object_format": 4}))
