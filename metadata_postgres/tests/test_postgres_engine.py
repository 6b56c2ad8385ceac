"""The engine scenario with metadata on a real PostgreSQL server and the WAL and objects on a
real (moto) S3 server: 3 streams x 20,000 records appended concurrently, read back, reopened,
trimmed."""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path

import pytest
import walstream
from walstream import OutOfRangeError, Record

s3_testing = pytest.importorskip("walstream_wal_s3.testing", reason="needs walstream-wal-s3")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "s3.yaml"
NAMES = ["orders", "payments", "clicks"]
PER_STREAM, BATCH = 20_000, 200


def value_for(stream: str, offset: int) -> bytes:
    return hashlib.blake2b(f"{stream}:{offset}".encode(), digest_size=16).digest() * 8


def postgres_deployment(tmp_path: Path, dsn: str, schema: str) -> Path:
    """examples/s3.yaml with its metadata section on PostgreSQL."""
    text = EXAMPLE.read_text()
    text, count = re.subn(
        r"^metadata: .*$",
        f"metadata: {{type: postgres, dsn: '{dsn}', schema: {schema}}}",
        text,
        flags=re.M,
    )
    assert count == 1
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(text)
    return deploy


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
def test_engine_scenario_on_postgres_metadata_and_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str, postgres_schema: str
) -> None:
    deploy = postgres_deployment(tmp_path, postgres_dsn, postgres_schema)
    with s3_testing.MotoServer() as server:
        monkeypatch.setenv("WALSTREAM_S3_ENDPOINT", server.endpoint_url)
        asyncio.run(_scenario(deploy))


async def _scenario(deploy: Path) -> None:
    async with walstream.open(deploy) as client:
        assert type(client.metadata).__name__ == "PostgresMetadataStore"
        streams = [await client.create_stream(name) for name in NAMES]

        async def produce(stream: walstream.Stream, name: str) -> None:
            for base in range(0, PER_STREAM, BATCH):
                records = [Record(value_for(name, o)) for o in range(base, base + BATCH)]
                ack = await stream.append(records, match_tail=base)
                assert ack.start == base

        await asyncio.gather(*(produce(s, n) for s, n in zip(streams, NAMES, strict=True)))
        for stream, name in zip(streams, NAMES, strict=True):
            records = await read_all(stream)
            assert [r.value for r in records] == [value_for(name, o) for o in range(PER_STREAM)]
    async with walstream.open(deploy) as client:
        committed = {
            info.stream_id: info.committed_end for info in await client.metadata.list_streams()
        }
        assert sorted(committed.values()) == [PER_STREAM] * 3, "a clean close commits everything"
        for name in NAMES:
            stream = await client.open_stream(name)
            assert await stream.check_tail() == PER_STREAM
            records = await read_all(stream)
            assert [r.offset for r in records] == list(range(PER_STREAM))
            assert all(r.value == value_for(name, r.offset) for r in records)
        stream = await client.open_stream("orders")
        await stream.trim(15_000)
        with pytest.raises(OutOfRangeError):
            await stream.read(start=14_999)
        first = (await stream.read(start=15_000, limit_records=1)).records[0]
        assert first.value == value_for("orders", 15_000)
