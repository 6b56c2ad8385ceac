"""A stream's configuration through the engine: kept with the stream, changed in part, taken from
the deployment's ``streams:`` defaults; timestamping modes applied by the engine; timestamps that
never go backwards, across restarts too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import walstream
from walstream import Client, EngineConfig, Record, StreamConfig, Timestamping
from walstream.clock import ManualClock
from walstream.config import CompactionConfig, UploadConfig
from walstream.errors import ConfigError, InvalidArgument
from walstream.metadata import ObjectState
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream.stream_config import format_age, parse_age
from walstream.wal.memory import MemoryWal

QUICK = EngineConfig(
    upload=UploadConfig(max_interval_s=0.05), compaction=CompactionConfig(enabled=False)
)


class Disks:
    """A WAL, an object folder and a SQLite file that outlive each client (a process)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.wal_name = f"wal-{os.urandom(4).hex()}"
        self.clock = ManualClock(1_800_000_000_000)

    def client(self, config: EngineConfig = QUICK) -> Client:
        return Client(
            wal=MemoryWal(name=self.wal_name),
            objects=LocalObjectStore(self.root / "objects"),
            metadata=SqliteMetadataStore(self.root / "meta.db", clock=self.clock),
            config=config,
            clock=self.clock,
        )


@pytest.fixture
def disks(tmp_path: Path) -> Disks:
    return Disks(tmp_path)


async def test_config_given_at_create_is_kept_across_a_restart(disks: Disks) -> None:
    config = StreamConfig(
        retention_age_s=7 * 86_400,
        timestamping=Timestamping.CLIENT_REQUIRE,
        uncapped=True,
        delete_on_empty_min_age_s=3600,
        storage_class="standard",
    )
    client = await disks.client().start()
    stream = await client.create_stream("orders", config=config)
    plain = await client.create_stream("plain")
    assert stream.config == config
    assert plain.config == StreamConfig(), "walstream's default is infinite retention"
    await client.close()

    again = await disks.client().start()
    assert (await again.open_stream("orders")).config == config
    listed = {info.name: info.config for info in await again.list_streams()}
    assert listed == {"orders": config, "plain": StreamConfig()}
    await again.close()


async def test_reconfigure_changes_only_the_named_settings(disks: Disks) -> None:
    client = await disks.client().start()
    stream = await client.create_stream("s", config=StreamConfig(storage_class="express"))
    changed = await stream.reconfigure(retention_age_s=3600, timestamping="arrival")
    assert changed == StreamConfig(
        retention_age_s=3600, timestamping=Timestamping.ARRIVAL, storage_class="express"
    )
    assert stream.config == changed
    assert (await client.metadata.get_stream("s")).config == changed
    back = await stream.reconfigure(retention_age_s=None)
    assert back.retention_age_s is None and back.timestamping is Timestamping.ARRIVAL

    for bad in ({"retention_age_s": 0}, {"timestamping": "later"}, {"colour": "blue"}):
        with pytest.raises(InvalidArgument):
            await stream.reconfigure(**bad)
    with pytest.raises(InvalidArgument, match="cipher is fixed"):
        await stream.reconfigure(cipher="aegis-256")
    assert (await client.metadata.get_stream("s")).config == back, "a refused change wrote"
    await client.close()


async def test_client_prefer_caps_future_timestamps_at_arrival(disks: Disks) -> None:
    client = await disks.client().start()
    now = disks.clock.now_ms()
    capped = await client.create_stream("capped")
    ack = await capped.append([Record(b"a", timestamp_ms=now + 3_600_000), Record(b"b")])
    assert (ack.first_timestamp_ms, ack.last_timestamp_ms) == (now, now)
    past = await capped.append([Record(b"c", timestamp_ms=now - 10)])
    assert past.first_timestamp_ms == now, "a timestamp went backwards"

    uncapped = await client.create_stream("uncapped", config=StreamConfig(uncapped=True))
    kept = await uncapped.append([Record(b"a", timestamp_ms=now + 3_600_000)])
    assert kept.first_timestamp_ms == now + 3_600_000
    read = await uncapped.read(0)
    assert read.records[0].timestamp_ms == now + 3_600_000
    await client.close()


async def test_client_require_refuses_an_append_without_timestamps(disks: Disks) -> None:
    client = await disks.client().start()
    stream = await client.create_stream(
        "strict", config=StreamConfig(timestamping=Timestamping.CLIENT_REQUIRE)
    )
    with pytest.raises(InvalidArgument, match="requires one"):
        await stream.append([Record(b"stamped", timestamp_ms=5), Record(b"not")])
    assert await stream.check_tail() == 0, "a refused append wrote records"
    ack = await stream.append([Record(b"stamped", timestamp_ms=5)])
    assert (ack.start, ack.first_timestamp_ms) == (0, 5)
    await client.close()


async def test_arrival_ignores_client_timestamps(disks: Disks) -> None:
    client = await disks.client().start()
    stream = await client.create_stream(
        "arrival", config=StreamConfig(timestamping=Timestamping.ARRIVAL)
    )
    now = disks.clock.now_ms()
    ack = await stream.append([Record(b"x", timestamp_ms=1), Record(b"y", timestamp_ms=now * 2)])
    assert (ack.first_timestamp_ms, ack.last_timestamp_ms) == (now, now)
    await client.close()


async def test_timestamps_do_not_go_backwards_across_a_restart(disks: Disks) -> None:
    """Everything uploaded before the restart: the new process starts from the newest committed
    timestamp, not from 0 (a client timestamp older than it is raised to it)."""
    client = await disks.client().start()
    stream = await client.create_stream("ts")
    first = await stream.append(
        [Record(b"a", timestamp_ms=5_000), Record(b"b", timestamp_ms=9_000)]
    )
    assert first.last_timestamp_ms == 9_000
    await client.close()
    restarted = await disks.client().start()
    assert restarted.recovery is None or restarted.recovery.records == 0, "not all uploaded"
    assert await restarted.metadata.list_objects(state=ObjectState.COMMITTED)
    stream = await restarted.open_stream("ts")
    after = await stream.append([Record(b"c", timestamp_ms=100)])
    assert after.first_timestamp_ms == 9_000, (
        f"after a restart the timestamp went back to {after.first_timestamp_ms}"
    )
    timestamps = [r.timestamp_ms for r in (await stream.read(0)).records]
    assert timestamps == sorted(timestamps) == [5_000, 9_000, 9_000]
    await restarted.close()


async def test_deployment_streams_section_gives_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    deployment = tmp_path / "d.yaml"
    deployment.write_text(
        "wal: {type: ebs, path: wal.img, capacity: 16MiB}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "streams: {retention: 7d, timestamping: arrival, delete_on_empty: 1h,"
        " storage_class: standard}\n"
    )
    async with walstream.open(str(deployment)) as client:
        stream = await client.create_stream("defaulted")
        assert stream.config == StreamConfig(
            retention_age_s=7 * 86_400,
            timestamping=Timestamping.ARRIVAL,
            delete_on_empty_min_age_s=3600,
            storage_class="standard",
        )
        given = await client.create_stream("given", config=StreamConfig())
        assert given.config == StreamConfig()
    deployment.write_text(deployment.read_text().replace("7d", "seven days"))
    with pytest.raises(ConfigError, match=r"streams\.retention"):
        await walstream.open(str(deployment))


def test_ages_parse_and_print() -> None:
    assert parse_age("7d") == 604_800 and parse_age("infinite") is None
    assert parse_age("90") == 90 and parse_age("2w") == 1_209_600
    assert [format_age(s) for s in (604_800, 86_400, 7200, 90, 61)] == [
        "7d",
        "1d",
        "2h",
        "90s",
        "61s",
    ]
    with pytest.raises(InvalidArgument):
        parse_age("7 years")


def test_the_blocking_facade_creates_and_reconfigures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from walstream import blocking

    monkeypatch.chdir(tmp_path)
    with blocking.open(None) as client:
        stream = client.create_stream("sync", config=StreamConfig(retention_age_s=60))
        assert stream.config.retention_age_s == 60
        changed = stream.reconfigure(storage_class="express")
        assert changed == StreamConfig(retention_age_s=60, storage_class="express")
        assert stream.config == changed
