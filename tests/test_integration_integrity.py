"""Integrity on the embedded default (ebs WAL file + local objects + SQLite), end to end.

What an adversarial user does to a deployment, and what must happen:

1. acknowledged records live only in the WAL (uploads delayed), the writer is killed with SIGKILL
   and one bit of a record in the middle of the WAL is flipped: the restart refuses with a
   corruption error naming the damage; after ``walstream recover --accept-loss`` the lost range
   reads as a data-loss gap, every other acknowledged record is intact, and a new append gets an
   offset above every offset ever acknowledged;
2. a truncated WAL file is refused;
3. another deployment's WAL file is refused;
4. two deployments sharing one object-store folder never read each other's bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import walstream
from walstream import Record
from walstream.errors import CorruptionError, DataLossError, IdentityMismatch

pytest.importorskip("walstream_wal_ebs", reason="needs the ebs WAL plugin (walstream-wal-ebs)")

STREAMS = ("a", "b", "c")
RECORDS_PER_STREAM = 3000
BATCH = 10

DEPLOYMENT = """
node: {id: 1}
wal: {type: ebs, path: wal.img, capacity: 64MiB}
object_store: {type: local, root: OBJECTS}
metadata: {type: sqlite, path: meta.db}
upload: {max_bytes: 1GiB, max_interval: 1h}
"""

# Appends every stream's records in batches, streams interleaved, then waits to be killed: the
# acknowledged records live only in the WAL.
WRITER = textwrap.dedent(
    f"""
    import asyncio, hashlib, sys
    import walstream
    from walstream import Record

    def value_for(stream, offset):
        return hashlib.blake2b(f"{{stream}}:{{offset}}".encode(), digest_size=32).digest() * 4

    async def produce(client, name):
        stream = await client.create_stream(name)
        for base in range(0, {RECORDS_PER_STREAM}, {BATCH}):
            ack = await stream.append([Record(value_for(name, o)) for o in range(base, base + {BATCH})])
            assert ack.start == base

    async def main():
        client = await walstream.open(sys.argv[1])
        await asyncio.gather(*(produce(client, name) for name in {STREAMS!r}))
        print("acknowledged", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def value_for(stream: str, offset: int) -> bytes:
    return hashlib.blake2b(f"{stream}:{offset}".encode(), digest_size=32).digest() * 4


def make_deployment(folder: Path, objects: Path | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    deploy = folder / "deploy.yaml"
    deploy.write_text(DEPLOYMENT.replace("OBJECTS", str(objects or folder / "objects")))
    return deploy


def write_then_kill(deploy: Path) -> None:
    """Run the writer until every record is acknowledged, then SIGKILL it."""
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(deploy)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == "acknowledged", process.stderr.read() if process.stderr else ""
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL


def walstream_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "walstream"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def read_with_gaps(
    client: walstream.Client, name: str
) -> tuple[list[walstream.SequencedRecord], list[tuple[int, int]]]:
    """Every readable record of ``name`` and the data-loss gaps met on the way."""
    stream = await client.open_stream(name)
    records: list[walstream.SequencedRecord] = []
    gaps: list[tuple[int, int]] = []
    position = 0
    tail = await stream.check_tail()
    while position < tail:
        try:
            result = await stream.read(start=position, limit_records=5000)
        except DataLossError as exc:
            assert exc.stream_id == stream.stream_id
            assert exc.start_offset <= position < exc.end_offset
            gaps.append((exc.start_offset, exc.end_offset))
            position = exc.end_offset
            continue
        assert result.records, f"empty read at {position} below the tail {tail}"
        records.extend(result.records)
        position = result.records[-1].offset + 1
    return records, gaps


@pytest.mark.slow
def test_flipped_bit_in_the_wal_is_refused_then_accepted_as_an_explicit_gap(
    tmp_path: Path,
) -> None:
    deploy = make_deployment(tmp_path)
    write_then_kill(deploy)
    wal_file = tmp_path / "wal.img"
    image = bytearray(wal_file.read_bytes())
    victim = value_for("b", 1500)
    position = image.find(victim)
    assert position > 0 and image.find(victim, position + 1) == -1
    image[position + 7] ^= 0x10
    wal_file.write_bytes(bytes(image))

    async def restart_refuses() -> None:
        with pytest.raises(CorruptionError) as refused:
            async with walstream.open(deploy):
                pass
        message = str(refused.value)
        assert "wal.img" in message and "--accept-loss" in message, message

    asyncio.run(restart_refuses())
    # Refusing twice changes nothing: the damage is still there and still named.
    asyncio.run(restart_refuses())

    accepted = walstream_cli("-c", str(deploy), "recover", "--accept-loss")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr

    async def after_accepting() -> None:
        async with walstream.open(deploy) as client:
            lost_total = 0
            for name in STREAMS:
                records, gaps = await read_with_gaps(client, name)
                for record in records:
                    assert record.value == value_for(name, record.offset), (name, record.offset)
                lost = {offset for start, end in gaps for offset in range(start, end)}
                readable = {record.offset for record in records}
                assert not lost & readable
                # Every acknowledged offset is either intact or inside an explicit gap.
                assert set(range(RECORDS_PER_STREAM)) <= readable | lost, name
                if name == "b":
                    assert 1500 in lost
                lost_total += len(lost & set(range(RECORDS_PER_STREAM)))
            # One damaged WAL record holds one batch: nothing else may be written off.
            assert lost_total == BATCH, lost_total
            stream = await client.open_stream("b")
            ack = await stream.append([Record(b"after the loss")])
            assert ack.start >= RECORDS_PER_STREAM
            assert (await stream.read(start=ack.start)).records[0].value == b"after the loss"
            with pytest.raises(DataLossError):
                await stream.read(start=1500)

    asyncio.run(after_accepting())


@pytest.mark.parametrize("size", [4096, 8192, 1 << 20])
@pytest.mark.slow
def test_truncated_wal_file_is_refused(tmp_path: Path, size: int) -> None:
    deploy = make_deployment(tmp_path)
    write_then_kill(deploy)
    with (tmp_path / "wal.img").open("r+b") as wal_file:
        wal_file.truncate(size)

    async def restart() -> None:
        with pytest.raises(CorruptionError) as refused:
            async with walstream.open(deploy):
                pass
        assert "wal.img" in str(refused.value)

    asyncio.run(restart())


@pytest.mark.slow
def test_another_deployments_wal_is_refused(tmp_path: Path) -> None:
    ours = make_deployment(tmp_path / "ours")
    theirs = make_deployment(tmp_path / "theirs")

    async def create(deploy: Path) -> None:
        async with walstream.open(deploy) as client:
            stream = await client.create_stream("a")
            await stream.append([Record(b"x")])

    asyncio.run(create(ours))
    write_then_kill(theirs)
    shutil.copyfile(tmp_path / "theirs" / "wal.img", tmp_path / "ours" / "wal.img")

    async def restart() -> None:
        with pytest.raises(IdentityMismatch):
            async with walstream.open(ours):
                pass

    asyncio.run(restart())


def test_deployments_sharing_an_object_folder_never_read_each_other(tmp_path: Path) -> None:
    shared = tmp_path / "shared-objects"
    first = make_deployment(tmp_path / "first", shared)
    second = make_deployment(tmp_path / "second", shared)

    async def write(deploy: Path, value: bytes) -> None:
        async with walstream.open(deploy) as client:
            stream = await client.create_stream("s")
            await stream.append([Record(value) for _ in range(100)])
            await client.flush()

    async def read(deploy: Path) -> list[bytes]:
        async with walstream.open(deploy) as client:
            stream = await client.open_stream("s")
            return [record.value for record in (await stream.read(start=0)).records]

    asyncio.run(write(first, b"first"))
    asyncio.run(write(second, b"second"))
    assert asyncio.run(read(first)) == [b"first"] * 100
    assert asyncio.run(read(second)) == [b"second"] * 100
    objects = sorted(path for path in shared.rglob("*") if path.is_file())
    assert len(objects) == 2, objects
    # Copy one deployment's object over the other's: a read refuses instead of serving it.
    shutil.copyfile(objects[0], objects[1])

    outcomes: list[object] = []
    for deploy in (first, second):
        try:
            outcomes.append(asyncio.run(read(deploy)))
        except IdentityMismatch as exc:
            outcomes.append(exc)
    assert sum(isinstance(outcome, IdentityMismatch) for outcome in outcomes) == 1, outcomes
    assert [b"first"] * 100 in outcomes or [b"second"] * 100 in outcomes
