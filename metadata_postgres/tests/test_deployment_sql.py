"""The SQL of ``docs/operations/deployment.md``, run as written by a superuser on a fresh
PostgreSQL: the ``walstream`` role it creates is enough for a node (which creates and migrates its
schema at the first start) and is no superuser; the read-only role can ``pg_dump`` the catalogue
(what a backup runs) and cannot change it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from walstream_metadata_postgres.testing.server import PostgresServer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations" / "deployment.md"
WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"


def _sql_blocks() -> list[str]:
    return re.findall(r"^```sql\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def _psql(
    server: PostgresServer, user: str, database: str, sql: str
) -> subprocess.CompletedProcess[str]:
    """``sql`` through psql's standard input, as pasted into a psql session (each statement
    on its own: CREATE DATABASE cannot run inside a transaction block)."""
    return subprocess.run(
        [
            str(server.bin / "psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(server.port),
            "-U",
            user,
            "-d",
            database,
            "-f",
            "-",
        ],
        input=sql,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _run(server: PostgresServer, database: str, sql: str) -> None:
    """A block of the page, run by the superuser (the DBA) in ``database``."""
    done = _psql(server, server.superuser, database, sql)
    assert done.returncode == 0, f"{sql}\n{done.stderr}"


def _node_creates_a_stream(tmp_path: Path, dsn: str, schema: str) -> None:
    """A node of a deployment on ``dsn`` starts (creating its tables) and creates a stream."""
    deployment = tmp_path / f"deploy-{schema}.yaml"
    deployment.write_text(
        yaml.safe_dump(
            {
                "node": {"id": 1},
                "wal": {"type": "memory", "name": f"sql-{schema}"},
                "object_store": {"type": "local", "root": str(tmp_path / "objects")},
                "metadata": {"type": "postgres", "dsn": dsn, "schema": schema},
            }
        )
    )
    done = subprocess.run(
        [WALSTREAM, "--config", str(deployment), "streams", "create", "orders"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    with PostgresServer(superuser="postgres", create_database=False) as started:
        yield started


@pytest.mark.slow
def test_the_documented_roles_run_a_node_and_a_backup(
    tmp_path: Path, server: PostgresServer
) -> None:
    owner_sql, _schema_sql, reader_sql = _sql_blocks()
    assert "CREATE DATABASE walstream OWNER walstream" in owner_sql
    _run(server, "postgres", owner_sql)
    assert (
        server.sql(
            "SELECT rolsuper OR rolcreatedb OR rolcreaterole FROM pg_roles WHERE rolname = 'walstream'",
            database="postgres",
        ).strip()
        == "f"
    )
    dsn = f"postgresql://walstream:change-me@127.0.0.1:{server.port}/walstream"
    _node_creates_a_stream(tmp_path, dsn, "walstream")

    _run(server, "walstream", reader_sql)
    dump = tmp_path / "walstream.dump"
    dumped = subprocess.run(
        [
            str(server.bin / "pg_dump"),
            "--format=custom",
            "--no-owner",
            "--no-privileges",
            f"--file={dump}",
            f"postgresql://walstream_reader@127.0.0.1:{server.port}/walstream",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dumped.returncode == 0, dumped.stderr
    tables = _psql(
        server,
        "walstream_reader",
        "walstream",
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'walstream'",
    ).stdout.split()
    assert tables, "the reader sees no table of the catalogue"
    refused = _psql(server, "walstream_reader", "walstream", f"DELETE FROM walstream.{tables[0]}")
    assert refused.returncode != 0 and "permission denied" in refused.stderr


@pytest.mark.slow
def test_the_documented_schema_in_an_existing_database_runs_a_node(
    tmp_path: Path, server: PostgresServer
) -> None:
    server.sql("CREATE DATABASE appdb", database="postgres")
    _owner_sql, schema_sql, _reader_sql = _sql_blocks()
    _run(server, "appdb", schema_sql)
    dsn = f"postgresql://walstream:change-me@127.0.0.1:{server.port}/appdb"
    _node_creates_a_stream(tmp_path, dsn, "walstream")
