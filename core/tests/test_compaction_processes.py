"""Compaction in real processes: a pass SIGKILLed at random points loses, duplicates and reorders
nothing and leaves no object behind once garbage is collected; a SIGTERM drain of ``walstream
serve`` cancels a running pass instead of waiting for it."""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from walstream import Client, EngineConfig, Record
from walstream.clock import ManualClock
from walstream.config import CompactionConfig, UploadConfig
from walstream.metadata import ObjectState
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.local import LocalObjectStore
from walstream.wal.memory import MemoryWal
from walstream_conformance.harness.serve import WalstreamServe, walstream_command

NAMES = [f"s{i}" for i in range(40)]
ROUNDS = 30
PER_ROUND = 3
LIMIT = 128 << 10

CONFIG = EngineConfig(
    upload=UploadConfig(max_bytes=8 << 20, max_interval_s=3600),
    compaction=CompactionConfig(
        enabled=False,
        min_objects=2,
        max_object_bytes=LIMIT,
        small_object_bytes=64 << 10,
        stream_split_bytes=8 << 10,
    ),
)

#: Runs one pass (reads slowed down so the SIGKILL lands inside it) and reports each step.
COMPACTOR = textwrap.dedent(
    """
    import asyncio, sys
    from walstream import Client, EngineConfig
    from walstream.config import CompactionConfig, UploadConfig
    from walstream.metadata.sqlite import SqliteMetadataStore
    from walstream.objects import local
    from walstream.wal.memory import MemoryWal

    _get = local.LocalObjectStore.get

    async def slow_get(self, key, start=0, end=None):
        await asyncio.sleep(0.01)
        return await _get(self, key, start, end)

    local.LocalObjectStore.get = slow_get

    class Steps:
        def emit(self, event):
            if event.name == "compacted":
                print("step", flush=True)

    async def main():
        root = sys.argv[1]
        config = EngineConfig(
            upload=UploadConfig(max_bytes=8 << 20, max_interval_s=3600),
            compaction=CompactionConfig(enabled=False, min_objects=2, max_object_bytes=LIMIT,
                                        small_object_bytes=64 << 10, stream_split_bytes=8 << 10),
        )
        client = Client(wal=MemoryWal(), objects=local.LocalObjectStore(root + "/objects"),
                        metadata=SqliteMetadataStore(root + "/meta.db"), config=config,
                        hooks=Steps())
        await client.start()
        print("ready", flush=True)
        await client.compact()
        print("done", flush=True)
        await client.close()

    asyncio.run(main())
    """
).replace("LIMIT", str(LIMIT))


def value_for(name: str, offset: int) -> bytes:
    return hashlib.blake2b(f"{name}:{offset}".encode(), digest_size=16).digest() * 6


def client(root: Path, clock: ManualClock | None = None, config: EngineConfig = CONFIG) -> Client:
    return Client(
        wal=MemoryWal(),
        objects=LocalObjectStore(root / "objects", fsync=False),
        metadata=SqliteMetadataStore(root / "meta.db"),
        config=config,
        clock=clock,
    )


async def fill(root: Path) -> int:
    """Many small stream-set objects; returns how many."""
    async with client(root) as writer:
        streams = [await writer.create_stream(name) for name in NAMES]
        for round_ in range(ROUNDS):
            for stream, name in zip(streams, NAMES, strict=True):
                base = round_ * PER_ROUND
                await stream.append([Record(value_for(name, base + i)) for i in range(PER_ROUND)])
            await writer.flush()
        return len(await writer.metadata.list_objects(state=ObjectState.COMMITTED))


async def check_records(reader: Client) -> None:
    for name in NAMES:
        stream = await reader.open_stream(name)
        values = []
        position = 0
        while True:
            result = await stream.read(start=position, limit_records=10_000)
            if not result.records:
                break
            assert result.records[0].offset == position
            values.extend(record.value for record in result.records)
            position = result.records[-1].offset + 1
        assert values == [value_for(name, o) for o in range(ROUNDS * PER_ROUND)], name


def run_compactor_until_killed(root: Path, rng: random.Random) -> bool:
    """Start a pass in a child and SIGKILL it after a random number of steps plus a random
    delay; True if the pass finished first."""
    process = subprocess.Popen(
        [sys.executable, "-c", COMPACTOR, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline().strip() == "ready", process.stderr
        for _ in range(rng.randint(0, 3)):
            line = process.stdout.readline().strip()
            if line != "step":
                process.wait(timeout=120)
                return True
        time.sleep(rng.uniform(0, 0.05))  # somewhere inside the next step
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=120)
        return process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
async def test_a_pass_killed_at_random_points_loses_and_leaves_nothing(tmp_path: Path) -> None:
    before = await fill(tmp_path)
    rng = random.Random(7)
    killed = 0
    for _ in range(5):
        killed += not run_compactor_until_killed(tmp_path, rng)
        async with client(tmp_path) as reader:
            await check_records(reader)
            objects = await reader.metadata.list_objects(state=ObjectState.COMMITTED)
            assert len(objects) <= before
    assert killed, "no pass was killed before it finished"
    # Later passes finish the work; once the killed passes' prepared ids expire, garbage
    # collection removes every object no metadata names.
    clock = ManualClock(int(time.time() * 1000) + 3_600_000)
    async with client(tmp_path, clock) as final:
        while await final.compact():
            pass
        await check_records(final)
        objects = await final.metadata.list_objects(state=ObjectState.COMMITTED)
        keys = {meta.key async for meta in final.objects.list()}
        assert keys == {info.key for info in objects}
        assert len(objects) < before


SERVE = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from walstream.objects import local

    _get = local.LocalObjectStore.get
    marker = Path(os.environ["COMPACTION_MARKER"])

    async def stuck_get(self, key, start=0, end=None):
        # Every GET of the pass hangs for ten minutes: only a cancellation ends it early.
        marker.touch()
        await asyncio.sleep(600)
        return await _get(self, key, start, end)

    local.LocalObjectStore.get = stuck_get
    from walstream.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


class ServeWithStuckReads(WalstreamServe):
    stop_timeout_s = 60.0

    def command(self) -> list[str]:
        arguments = super().command()[len(walstream_command()) :]
        return [sys.executable, "-c", SERVE, *arguments]


async def test_a_sigterm_drain_cancels_a_running_pass(tmp_path: Path) -> None:
    await fill(tmp_path)
    marker = tmp_path / "compaction-started"
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        "node: {id: 1}\n"
        "wal: {type: memory}\n"
        "object_store: {type: local, root: objects, fsync: false}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "compaction: {enabled: true, interval: 10ms, min_objects: 2}\n"
    )
    server = ServeWithStuckReads(deploy, environ={"COMPACTION_MARKER": str(marker)})
    server.start()
    try:
        for _ in range(1200):  # the pass starts at once: its first GET touches the marker
            if marker.exists():
                break
            await asyncio.sleep(0.05)
        assert marker.exists(), "the compaction pass never started"
        # Without cancellation the drain waits for GETs that end in ten minutes: the stop
        # times out after a minute, kills the server and reports its exit code.
        code, log = server.stop_and_read_log()
    finally:
        server.kill()
    assert code == 0, log
    assert "Traceback" not in log, log
    async with client(tmp_path) as reader:
        await check_records(reader)
