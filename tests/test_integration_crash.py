"""The embedded node (ebs WAL + local objects + SQLite) killed with SIGKILL mid-write, restarted,
and checked: every acknowledged record is readable exactly once, in order, with its bytes, and
nothing that was never appended appears."""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import walstream
from walstream import Record

pytest.importorskip("walstream_wal_ebs", reason="needs the ebs WAL plugin (walstream-wal-ebs)")

WRITER = textwrap.dedent(
    """
    import asyncio, hashlib, sys
    import walstream
    from walstream import Record

    def value_for(stream, offset):
        return hashlib.blake2b(f"{stream}:{offset}".encode(), digest_size=32).digest() * 4

    async def produce(client, name, out):
        try:
            stream = await client.open_stream(name)
        except walstream.StreamNotFound:
            stream = await client.create_stream(name)
        while True:
            base = await stream.check_tail()
            size = 1 + (base % 37)
            records = [Record(value_for(name, o)) for o in range(base, base + size)]
            ack = await stream.append(records, match_tail=base)
            out.write(f"{name} {ack.start} {ack.end}\\n")
            out.flush()

    async def main():
        client = await walstream.open(sys.argv[1])
        print("ready", flush=True)
        await asyncio.gather(*(produce(client, name, sys.stdout) for name in ("a", "b")))

    asyncio.run(main())
    """
)

DEPLOYMENT = """
node: {id: 1}
wal: {type: ebs, path: wal.img, capacity: 64MiB}
object_store: {type: local, root: objects}
metadata: {type: sqlite, path: meta.db}
upload: {max_bytes: 256KiB, max_interval: 50ms}
compaction: {enabled: true, interval: 200ms, min_objects: 3}
"""


def value_for(stream: str, offset: int) -> bytes:
    return hashlib.blake2b(f"{stream}:{offset}".encode(), digest_size=32).digest() * 4


async def read_stream(client: walstream.Client, name: str) -> list[walstream.SequencedRecord]:
    stream = await client.open_stream(name)
    records: list[walstream.SequencedRecord] = []
    position = 0
    while True:
        result = await stream.read(start=position, limit_records=10_000, limit_bytes=16 << 20)
        if not result.records:
            return records
        records.extend(result.records)
        position = result.records[-1].offset + 1


def run_writer(deploy: Path, seconds: float) -> dict[str, int]:
    """Start the writer, SIGKILL it after ``seconds`` of appending; return acked ends."""
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(deploy)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: dict[str, int] = {}
    assert process.stdout is not None
    try:
        first = process.stdout.readline()
        assert first.strip() == "ready", f"writer failed: {first}{process.stderr.read() if process.stderr else ''}"
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True)
        reader.start()
        time.sleep(seconds)
        process.send_signal(signal.SIGKILL)
        process.wait()
        reader.join(10)
        buffer = "".join(lines)
        for line in buffer.splitlines():
            name, _start, end = line.split()
            acked[name] = max(acked.get(name, 0), int(end))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read() if process.stderr else ""
    return acked


@pytest.mark.slow
def test_sigkill_during_appends_loses_no_acknowledged_record(tmp_path: Path, soak: bool) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(DEPLOYMENT)
    cycles = 50 if soak else 6
    rng = random.Random(1234)
    acked_total: dict[str, int] = {}
    for cycle in range(cycles):
        acked = run_writer(deploy, rng.uniform(0.3, 1.5))
        for name, end in acked.items():
            acked_total[name] = max(acked_total.get(name, 0), end)

        async def verify(cycle: int = cycle) -> None:
            async with walstream.open(deploy) as client:
                for name, acked_end in acked_total.items():
                    records = await read_stream(client, name)
                    offsets = [record.offset for record in records]
                    assert offsets == list(range(len(records))), f"cycle {cycle}: gap or duplicate"
                    assert len(records) >= acked_end, (
                        f"cycle {cycle}: stream {name} lost acknowledged records "
                        f"({len(records)} < {acked_end})"
                    )
                    for record in records:
                        assert record.value == value_for(name, record.offset)

        asyncio.run(verify())
    assert sum(acked_total.values()) > 0


def test_embedded_default_survives_close_and_reopen(tmp_path: Path) -> None:
    from walstream_plugins import default_deployment

    async def scenario() -> None:
        deployment = default_deployment(tmp_path / "walstream-data")
        async with walstream.open(deployment) as client:
            stream = await client.create_stream("x")
            await stream.append([Record(b"%d" % i) for i in range(1000)])
        async with walstream.open(default_deployment(tmp_path / "walstream-data")) as client:
            stream = await client.open_stream("x")
            assert [r.value for r in await read_stream(client, "x")] == [b"%d" % i for i in range(1000)]
            assert await stream.check_tail() == 1000

    asyncio.run(scenario())
