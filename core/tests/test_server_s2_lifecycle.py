"""Stream configurations through the S2 API, with S2's official SDK against ``walstream serve``:
what S2's own SDK suite checks of stream and basin configs (create, get, reconfigure, ensure,
basin defaults, timestamping on append), plus idempotent creates that survive a restart and
auto-creates racing on two nodes. docs/guides/lifecycle.md maps S2's names onto walstream's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from walstream import Client, EngineConfig, StreamConfig, Timestamping
from walstream.config import CompactionConfig
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream.server.s2.context import S2Context
from walstream.wal.memory import MemoryWal
from walstream_conformance.harness.serve import WalstreamServe

s2_sdk = pytest.importorskip("s2_sdk")
from s2_sdk import (  # noqa: E402
    S2,
    AppendInput,
    BasinConfig,
    Endpoints,
    EnsureStatus,
    Record,
    S2ServerError,
    TimestampingMode,
)
from s2_sdk import StreamConfig as S2StreamConfig  # noqa: E402
from s2_sdk import Timestamping as S2Timestamping  # noqa: E402

TOKEN = "lifecycle-token"
WEEK = 7 * 86_400


def _deployment(folder: Path) -> Path:
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        "wal: {type: ebs, path: data/wal.img, capacity: 16MiB}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
    )
    return deployment


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WalstreamServe]:
    serve = WalstreamServe(_deployment(tmp_path_factory.mktemp("s2-lifecycle")), token=TOKEN)
    serve.start()
    try:
        yield serve
    finally:
        serve.stop_cleanly()


@pytest.fixture
async def s2(server: WalstreamServe) -> AsyncIterator[S2]:
    client = S2(TOKEN, endpoints=Endpoints(account=server.url, basin=server.url))
    try:
        yield client
    finally:
        await client.close()


_basins = iter(range(10_000))


async def new_basin(s2: S2, config: BasinConfig | None = None) -> str:
    name = f"lifecycle-{os.getpid() % 10_000}-{next(_basins)}"
    await s2.create_basin(name, config=config)
    return name


async def test_a_stream_config_given_at_create_is_read_back(s2: S2) -> None:
    """S2: every field of a create's config is kept; a stream created without one reports
    S2's defaults (storage class express, 7 days of retention, client-prefer, capped)."""
    basin = s2.basin(await new_basin(s2))
    full = S2StreamConfig(
        storage_class="standard",
        retention_policy=3 * 86_400,
        timestamping=S2Timestamping(mode=TimestampingMode.ARRIVAL, uncapped=False),
        delete_on_empty_min_age=7200,
    )
    await basin.create_stream("full", config=full)
    got = await basin.get_stream_config("full")
    assert (got.storage_class, got.retention_policy, got.delete_on_empty_min_age) == (
        "standard",
        3 * 86_400,
        7200,
    )
    assert got.timestamping is not None
    assert (got.timestamping.mode, got.timestamping.uncapped) == (TimestampingMode.ARRIVAL, False)

    await basin.create_stream("plain")
    plain = await basin.get_stream_config("plain")
    assert (plain.storage_class, plain.retention_policy) == ("express", WEEK)
    assert plain.timestamping is not None
    assert plain.timestamping.mode is TimestampingMode.CLIENT_PREFER
    assert plain.timestamping.uncapped is False

    for name, config, check in (
        ("express", S2StreamConfig(storage_class="express"), ("storage_class", "express")),
        ("forever", S2StreamConfig(retention_policy="infinite"), ("retention_policy", "infinite")),
        ("empty", S2StreamConfig(delete_on_empty_min_age=3600), ("delete_on_empty_min_age", 3600)),
    ):
        await basin.create_stream(name, config=config)
        assert getattr(await basin.get_stream_config(name), check[0]) == check[1]
    await basin.create_stream(
        "strict",
        config=S2StreamConfig(
            timestamping=S2Timestamping(mode=TimestampingMode.CLIENT_REQUIRE, uncapped=True)
        ),
    )
    strict = (await basin.get_stream_config("strict")).timestamping
    assert strict is not None
    assert (strict.mode, strict.uncapped) == (TimestampingMode.CLIENT_REQUIRE, True)

    with pytest.raises(S2ServerError) as refused:
        await basin.create_stream("bad", config=S2StreamConfig(retention_policy=0))
    assert (refused.value.status_code, refused.value.code) == (422, "invalid")


async def test_a_stream_reconfigure_changes_the_fields_given(s2: S2) -> None:
    """S2: a reconfigure changes the fields it names and keeps the others."""
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s", config=S2StreamConfig(delete_on_empty_min_age=60))
    changed = await basin.reconfigure_stream("s", config=S2StreamConfig(storage_class="standard"))
    assert (changed.storage_class, changed.delete_on_empty_min_age) == ("standard", 60)
    changed = await basin.reconfigure_stream(
        "s", config=S2StreamConfig(retention_policy="infinite")
    )
    assert (changed.retention_policy, changed.storage_class) == ("infinite", "standard")
    changed = await basin.reconfigure_stream(
        "s",
        config=S2StreamConfig(timestamping=S2Timestamping(mode=TimestampingMode.CLIENT_REQUIRE)),
    )
    assert changed.timestamping is not None
    assert changed.timestamping.mode is TimestampingMode.CLIENT_REQUIRE
    changed = await basin.reconfigure_stream(
        "s", config=S2StreamConfig(delete_on_empty_min_age=7200)
    )
    assert changed.delete_on_empty_min_age == 7200
    again = await basin.get_stream_config("s")
    assert (again.retention_policy, again.storage_class, again.delete_on_empty_min_age) == (
        "infinite",
        "standard",
        7200,
    )
    assert again.timestamping is not None
    assert again.timestamping.mode is TimestampingMode.CLIENT_REQUIRE


async def test_ensure_creates_updates_or_leaves_a_stream_config(s2: S2) -> None:
    """S2's ``ensure``: ``created`` with the config; ``updated`` when the config given differs;
    ``noop`` when it is what the stream has (as read back, storage class express included)."""
    basin = s2.basin(await new_basin(s2))
    made = await basin.ensure_stream(
        "s",
        config=S2StreamConfig(
            timestamping=S2Timestamping(mode=TimestampingMode.CLIENT_REQUIRE),
            delete_on_empty_min_age=86_400,
        ),
    )
    assert made.status is EnsureStatus.CREATED
    assert (await basin.get_stream_config("s")).delete_on_empty_min_age == 86_400
    changed = await basin.ensure_stream(
        "s", config=S2StreamConfig(timestamping=S2Timestamping(mode=TimestampingMode.ARRIVAL))
    )
    assert changed.status is EnsureStatus.CONFIG_UPDATED
    config = await basin.get_stream_config("s")
    assert config.timestamping is not None
    assert config.timestamping.mode is TimestampingMode.ARRIVAL
    same = await basin.ensure_stream("s", config=config)
    assert same.status is EnsureStatus.CONFIG_UNCHANGED
    assert await basin.get_stream_config("s") == config
    await basin.ensure_stream("fresh")
    fresh = await basin.get_stream_config("fresh")
    assert (await basin.ensure_stream("fresh", config=fresh)).status is (
        EnsureStatus.CONFIG_UNCHANGED
    )


async def test_a_basin_default_stream_config_is_kept_and_applied(s2: S2) -> None:
    """S2: a basin's ``default_stream_config`` reads back as given, is reconfigured in part,
    and a stream created in the basin (by create, or by an append with
    ``create_stream_on_append``) takes it where its own config is silent."""
    defaults = S2StreamConfig(
        storage_class="standard",
        retention_policy=WEEK,
        timestamping=S2Timestamping(mode=TimestampingMode.CLIENT_REQUIRE, uncapped=True),
        delete_on_empty_min_age=3600,
    )
    name = await new_basin(
        s2, BasinConfig(default_stream_config=defaults, create_stream_on_append=True)
    )
    config = await s2.get_basin_config(name)
    assert config.default_stream_config == defaults
    assert (await s2.ensure_basin(name, config=config)).status is EnsureStatus.CONFIG_UNCHANGED

    basin = s2.basin(name)
    await basin.create_stream("own", config=S2StreamConfig(retention_policy=3600))
    own = await basin.get_stream_config("own")
    assert (own.retention_policy, own.storage_class, own.delete_on_empty_min_age) == (
        3600,
        "standard",
        3600,
    )
    # Made by an append (client-require: the record carries a timestamp).
    ack = await basin.stream("auto").append(
        AppendInput(records=[Record(body=b"x", timestamp=1234)])
    )
    assert ack.start.timestamp == 1234
    auto = await basin.get_stream_config("auto")
    assert auto.timestamping is not None and auto.timestamping.mode is (
        TimestampingMode.CLIENT_REQUIRE
    )

    changed = await s2.reconfigure_basin(
        name,
        config=BasinConfig(
            default_stream_config=S2StreamConfig(storage_class="express", retention_policy=3600)
        ),
    )
    assert changed.default_stream_config is not None
    assert (
        changed.default_stream_config.storage_class,
        changed.default_stream_config.retention_policy,
        changed.default_stream_config.delete_on_empty_min_age,
    ) == ("express", 3600, 3600)


async def test_appends_follow_the_stream_timestamping_mode(s2: S2) -> None:
    """S2: client-require refuses a record without a timestamp (422 ``invalid``); a future
    timestamp is capped at arrival unless ``uncapped``; arrival ignores client timestamps."""
    basin = s2.basin(await new_basin(s2))
    modes = {
        "strict": S2Timestamping(mode=TimestampingMode.CLIENT_REQUIRE),
        "capped": S2Timestamping(uncapped=False),
        "uncapped": S2Timestamping(uncapped=True),
        "arrival": S2Timestamping(mode=TimestampingMode.ARRIVAL),
    }
    for name, timestamping in modes.items():
        await basin.create_stream(name, config=S2StreamConfig(timestamping=timestamping))
    with pytest.raises(S2ServerError) as refused:
        await basin.stream("strict").append(AppendInput(records=[Record(body=b"no time")]))
    assert refused.value.code == "invalid"
    assert (await basin.stream("strict").check_tail()).seq_num == 0

    future = int(time.time() * 1000) + 3_600_000
    capped = await basin.stream("capped").append(
        AppendInput(records=[Record(body=b"f", timestamp=future)])
    )
    assert capped.start.timestamp < future
    kept = await basin.stream("uncapped").append(
        AppendInput(records=[Record(body=b"f", timestamp=future)])
    )
    assert kept.start.timestamp == future
    arrival = await basin.stream("arrival").append(
        AppendInput(records=[Record(body=b"old", timestamp=5)])
    )
    assert arrival.start.timestamp > 5


@pytest.mark.slow
async def test_an_idempotent_stream_create_is_recognised_after_a_restart(tmp_path: Path) -> None:
    """The ``s2-request-token`` digest is kept with the stream in the metadata store: a retry
    after the server restarted answers 201 with the stream, not 409."""
    deployment = _deployment(tmp_path)
    headers = {"authorization": f"Bearer {TOKEN}", "s2-request-token": "create-once"}
    body = {"stream": "s", "config": {"retention_policy": {"age": 3600}}}
    serve = WalstreamServe(deployment, token=TOKEN)
    serve.start()
    async with aiohttp.ClientSession(serve.url) as http:
        async with http.post("/v1/basins", json={"basin": "token-basin"}, headers=headers) as made:
            assert made.status == 201
        with_basin = {**headers, "s2-basin": "token-basin"}
        async with http.post("/v1/streams", json=body, headers=with_basin) as answer:
            assert answer.status == 201
            created = await answer.json()
    serve.stop_cleanly()
    serve = WalstreamServe(deployment, token=TOKEN)
    serve.start()
    try:
        async with aiohttp.ClientSession(serve.url) as http:
            async with http.post("/v1/streams", json=body, headers=with_basin) as answer:
                assert answer.status == 201, await answer.text()
                assert await answer.json() == created
            other = {**with_basin, "s2-request-token": "another"}
            async with http.post("/v1/streams", json=body, headers=other) as answer:
                assert answer.status == 409
    finally:
        serve.stop_cleanly()


async def test_auto_creates_racing_on_two_nodes_create_the_stream_once(tmp_path: Path) -> None:
    """Two nodes (one metadata store) take an append for a missing stream of a basin with
    ``create_stream_on_append`` at the same time: one stream is made, with the basin's
    defaults, and both nodes open it."""
    config = EngineConfig(compaction=CompactionConfig(enabled=False))
    clients = [
        Client(
            wal=MemoryWal(name=f"race-{node}-{os.urandom(4).hex()}"),
            objects=LocalObjectStore(tmp_path / "objects"),
            metadata=SqliteMetadataStore(tmp_path / "meta.db"),
            config=EngineConfig(node_id=node, compaction=config.compaction),
        )
        for node in (1, 2)
    ]
    for client in clients:
        await client.start()
    try:
        await clients[0].metadata.create_basin(
            "race-basin",
            {
                "create_stream_on_append": True,
                "default_stream_config": {"retention_policy": {"age": 600}},
            },
        )
        contexts = [S2Context(client) for client in clients]
        for _ in range(5):
            name = f"race-basin.s{os.urandom(3).hex()}"
            opened = await asyncio.gather(
                *(c.open_for("race-basin", name, "create_stream_on_append") for c in contexts)
            )
            assert opened[0].stream_id == opened[1].stream_id
            same_name = [s for s in await clients[0].list_streams("race-basin.") if s.name == name]
            assert len(same_name) == 1, f"{len(same_name)} streams made for one name"
            assert same_name[0].config == StreamConfig(
                retention_age_s=600, timestamping=Timestamping.CLIENT_PREFER
            )
    finally:
        for client in clients:
            await client.close()
