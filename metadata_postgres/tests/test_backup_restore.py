"""Backup and restore as ``docs/operations/backup.md`` describes it, on PostgreSQL and S3 (a
throwaway PostgreSQL per deployment, moto): a node writes streams (with uploads, compaction and
garbage collection running) and is drained; the backup is ``pg_dump`` of its database, then a
copy of its objects; the restore loads the dump into a fresh database, copies the objects into a
fresh bucket at the same keys, gives the node a new WAL, runs ``walstream recover`` and reads back
every record of every stream, once each, in order. The original deployment's WAL is never
touched by the restored one."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from walstream_conformance.harness.serve import WalstreamServe
from walstream_conformance.waiting import eventually
from walstream_metadata_postgres.testing.server import PostgresServer
from walstream_wal_s3.testing.moto import TEST_CREDENTIALS, MotoServer

pytestmark = pytest.mark.slow

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"
STREAMS = 4
BATCHES = 6
RECORDS_PER_BATCH = 50


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


def _s3(moto: MotoServer) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=moto.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=TEST_CREDENTIALS["access_key_id"],
        aws_secret_access_key=TEST_CREDENTIALS["secret_access_key"],
    )


def _keys(s3: Any, bucket: str, prefix: str) -> set[str]:
    keys: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys |= {item["Key"] for item in page.get("Contents", [])}
    return keys


def _deployment(dsn: str, moto: MotoServer, bucket: str, wal_prefix: str) -> dict[str, Any]:
    s3 = {"bucket": bucket, "endpoint_url": moto.endpoint_url, "region": "us-east-1"}
    s3.update(TEST_CREDENTIALS)
    return {
        "node": {"id": 1},
        "metadata": {"type": "postgres", "dsn": dsn, "schema": "walstream"},
        "object_store": {"type": "s3", "prefix": "objects/", **s3},
        "wal": {"type": "s3", "prefix": wal_prefix, **s3},
        # Small objects, compacted soon: the backup meets compacted and deleted objects.
        "upload": {"max_interval": "20ms"},
        "compaction": {"interval": "200ms", "min_objects": 2},
    }


def _post(url: str, path: str, body: object) -> dict[str, Any]:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"s2-basin": "walstream", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        result: dict[str, Any] = json.loads(answer.read() or b"{}")
        return result


def _compactions(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    (line,) = [
        line for line in text.splitlines() if line.startswith("walstream_compactions_total ")
    ]
    return float(line.split()[1])


def _walstream(config: Path, *args: str, input: str | None = None) -> str:
    done = subprocess.run(
        [WALSTREAM, "--config", str(config), *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=config.parent,
    )
    assert done.returncode == 0, f"walstream {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def test_a_backup_restores_into_a_fresh_deployment_with_every_record(
    tmp_path: Path, moto: MotoServer
) -> None:
    s3 = _s3(moto)
    moto.create_bucket("acme-walstream")
    written: dict[str, list[str]] = {}
    with PostgresServer() as original_db:
        original = tmp_path / "original.yaml"
        original.write_text(
            yaml.safe_dump(_deployment(original_db.dsn, moto, "acme-walstream", "wal/node-1/"))
        )
        server = WalstreamServe(original, name="original node")
        server.start()
        try:
            for index in range(STREAMS):
                name = f"orders-{index}"
                _post(server.url, "/v1/streams", {"stream": name})
                written[name] = []
                for batch in range(BATCHES):
                    values = [f"{name}/{batch}/{n}" for n in range(RECORDS_PER_BATCH)]
                    _post(
                        server.url,
                        f"/v1/streams/{name}/records",
                        {"records": [{"body": value} for value in values]},
                    )
                    written[name] += values
            # Compaction has replaced objects (and garbage collection deleted them) before the
            # backup, as it does in a deployment that has run a while.
            asyncio.run(
                eventually(lambda: _compactions(server.url) > 0, "a compaction pass", poll_s=0.1)
            )
        finally:
            server.stop_cleanly()  # the drain: everything acknowledged is committed

        # Back up: 1. the metadata (pg_dump), 2. the objects, after it.
        dump = tmp_path / "walstream.dump"
        subprocess.run(
            [
                str(original_db.bin / "pg_dump"),
                "--format=custom",
                "--no-owner",
                "--no-privileges",
                f"--file={dump}",
                original_db.dsn,
            ],
            check=True,
            timeout=300,
        )
        wal_before = _keys(s3, "acme-walstream", "wal/")
        objects = _keys(s3, "acme-walstream", "objects/")
        assert objects, "the original deployment wrote no objects"
        moto.create_bucket("acme-walstream-backup")
        for key in objects:
            s3.copy_object(
                Bucket="acme-walstream-backup",
                Key=f"2026-11-27/{key}",
                CopySource={"Bucket": "acme-walstream", "Key": key},
            )

    # Restore into a fresh database, a fresh bucket and a fresh WAL.
    with PostgresServer() as restored_db:
        subprocess.run(
            [
                str(restored_db.bin / "pg_restore"),
                "--no-owner",
                "--no-privileges",
                "--role=walstream",
                f"--dbname={restored_db.dsn}",
                str(dump),
            ],
            check=True,
            timeout=300,
        )
        moto.create_bucket("acme-walstream-restored")
        for key in _keys(s3, "acme-walstream-backup", "2026-11-27/"):
            s3.copy_object(
                Bucket="acme-walstream-restored",
                Key=key.removeprefix("2026-11-27/"),
                CopySource={"Bucket": "acme-walstream-backup", "Key": key},
            )
        restored = tmp_path / "restored.yaml"
        restored.write_text(
            yaml.safe_dump(
                _deployment(restored_db.dsn, moto, "acme-walstream-restored", "wal/node-1/")
            )
        )
        _walstream(restored, "recover")
        listed = [
            json.loads(line)
            for line in _walstream(restored, "streams", "list", "--json").splitlines()
        ]
        assert {stream["name"]: stream["committed_end"] for stream in listed} == {
            name: len(values) for name, values in written.items()
        }
        for name, values in written.items():
            lines = _walstream(restored, "read", name, "--format", "json").splitlines()
            records = [json.loads(line) for line in lines]
            assert [record["offset"] for record in records] == list(range(len(values)))
            assert [record["value"] for record in records] == values, f"{name} differs"
        # The restored deployment is a working one: it appends after what it restored.
        _walstream(restored, "append", "orders-0", input="after-restore\n")
        tail = _walstream(restored, "read", "orders-0", "--start", str(len(written["orders-0"])))
        assert tail.splitlines() == [f"{len(written['orders-0'])}\tafter-restore"]

    # Nothing of the restored deployment reached the original's WAL.
    assert _keys(s3, "acme-walstream", "wal/") == wal_before
