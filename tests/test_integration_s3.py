"""The engine with BOTH the WAL and the objects on S3 (a real moto S3 server over HTTP), from the
shipped examples/s3.yaml: 3 streams x 20,000 records appended concurrently, read back, reopened,
trimmed."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

import pytest
import walstream
from walstream import OutOfRangeError, Record

testing = pytest.importorskip("walstream_wal_s3.testing", reason="needs walstream-wal-s3")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "s3.yaml"


def value_for(stream: str, offset: int) -> bytes:
    return hashlib.blake2b(f"{stream}:{offset}".encode(), digest_size=16).digest() * 8


async def read_all(stream: walstream.Stream) -> list[walstream.SequencedRecord]:
    records: list[walstream.SequencedRecord] = []
    position = await stream.start_offset()
    while True:
        result = await stream.read(start=position, limit_records=10_000, limit_bytes=8 << 20)
        if not result.records:
            return records
        records.extend(result.records)
        position = result.records[-1].offset + 1


@pytest.mark.slow
def test_engine_scenario_on_s3_wal_and_s3_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy = tmp_path / "s3.yaml"
    shutil.copy(EXAMPLE, deploy)
    with testing.MotoServer() as server:
        monkeypatch.setenv("WALSTREAM_S3_ENDPOINT", server.endpoint_url)
        asyncio.run(_scenario(deploy))


async def _scenario(deploy: Path) -> None:
    names = ["orders", "payments", "clicks"]
    per_stream, batch = 20_000, 200
    async with walstream.open(deploy) as client:
        assert type(client.wal).__name__ == "S3Wal"
        streams = [await client.create_stream(name) for name in names]

        async def produce(stream: walstream.Stream, name: str) -> None:
            for base in range(0, per_stream, batch):
                records = [Record(value_for(name, o)) for o in range(base, base + batch)]
                ack = await stream.append(records, match_tail=base)
                assert ack.start == base

        await asyncio.gather(*(produce(s, n) for s, n in zip(streams, names, strict=True)))
        for stream, name in zip(streams, names, strict=True):
            records = await read_all(stream)
            assert [r.value for r in records] == [value_for(name, o) for o in range(per_stream)]
    async with walstream.open(deploy) as client:
        keys = [meta.key async for meta in client.objects.list()]
        assert keys, "stream data must be in S3 objects"
        for name in names:
            stream = await client.open_stream(name)
            assert await stream.check_tail() == per_stream
            records = await read_all(stream)
            assert [r.offset for r in records] == list(range(per_stream))
            assert all(r.value == value_for(name, r.offset) for r in records)
        stream = await client.open_stream("orders")
        await stream.trim(15_000)
        with pytest.raises(OutOfRangeError):
            await stream.read(start=14_999)
        assert (await stream.read(start=15_000, limit_records=1)).records[0].value == value_for(
            "orders", 15_000
        )


@pytest.mark.slow
def test_cli_commands_on_s3_close_their_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every S3-backed command exits without asyncio's 'Unclosed client session' error."""
    import subprocess
    import sys

    deploy = tmp_path / "s3.yaml"
    shutil.copy(EXAMPLE, deploy)
    walstream_cli = str(Path(sys.executable).parent / "walstream")
    with testing.MotoServer() as server:
        monkeypatch.setenv("WALSTREAM_S3_ENDPOINT", server.endpoint_url)
        commands = [
            (["streams", "create", "orders"], ""),
            (["append", "orders"], "one\ntwo\n"),
            (["read", "orders"], ""),
            (["streams", "list"], ""),
        ]
        for args, stdin in commands:
            done = subprocess.run(
                [walstream_cli, "-c", str(deploy), *args],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=120,
                cwd=tmp_path,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert "Unclosed" not in done.stderr, (args, done.stderr)


@pytest.mark.slow
def test_a_missing_object_bucket_fails_the_start_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object store is checked at start like the WAL bucket: a clear error, exit 2, no
    acknowledged append that could never be uploaded, and no hang."""
    import subprocess
    import sys

    deploy = tmp_path / "s3.yaml"
    text = EXAMPLE.read_text().replace(
        "bucket: ${WALSTREAM_S3_BUCKET:-walstream-data}", "bucket: no-such-bucket"
    )
    text = text.replace("create_bucket: true\n  multipart", "create_bucket: false\n  multipart")
    assert "no-such-bucket" in text and "create_bucket: false" in text
    deploy.write_text(text)
    walstream_cli = str(Path(sys.executable).parent / "walstream")
    with testing.MotoServer() as server:
        monkeypatch.setenv("WALSTREAM_S3_ENDPOINT", server.endpoint_url)
        done = subprocess.run(
            [walstream_cli, "-c", str(deploy), "append", "orders"],
            input="one\n",
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no-such-bucket" in done.stderr and "does not exist" in done.stderr, done.stderr
    assert "offsets" not in done.stdout
