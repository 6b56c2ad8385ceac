"""Versioned migrations of the SQL metadata stores, on SQLite (PostgreSQL: metadata_postgres's
tests; databases written before versioned migrations: tests/test_metadata_fixtures.py).

A new database is brought to the current version when a store opens it, once however many
processes open it at the same moment; a new migration appended to the list is applied in place
and keeps every row; a migration that fails leaves the previous version; a database newer than
the code is refused and left as it was."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from walstream.errors import BackendUnavailable, ConfigError, SchemaTooNew
from walstream.metadata.sql import migrations
from walstream.metadata.sql.migrations import MIGRATIONS, SCHEMA_VERSION, Migration, PerDialect
from walstream.metadata.sqlite import SqliteMetadataStore


def _versions(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT version, name FROM schema_version ORDER BY version")
        return [(int(version), str(name)) for version, name in rows]


def _schema(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT name, sql FROM sqlite_master ORDER BY name")
        return [(str(name), str(sql)) for name, sql in rows]


def test_migrations_are_numbered_from_one_and_run_on_every_dialect() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert SCHEMA_VERSION == MIGRATIONS[-1].version
    names = [m.name for m in MIGRATIONS]
    assert all(names) and len(set(names)) == len(names)
    for migration in MIGRATIONS:
        for dialect in ("sqlite", "postgres"):
            statements = migration.statements(dialect)
            assert statements and all(s.strip() for s in statements), (migration, dialect)
    with pytest.raises(ConfigError, match="no SQL for the 'oracle' dialect"):
        PerDialect(sqlite="SELECT 1", postgres="SELECT 1").text("oracle")


async def test_a_new_file_gets_every_migration_once(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    store = SqliteMetadataStore(path)
    await store.create_stream("a")
    await store.close()
    assert _versions(path) == [(m.version, m.name) for m in MIGRATIONS]
    with sqlite3.connect(
        path
    ) as connection:  # what a walstream from before versioned migrations reads
        marker = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        assert marker.fetchone() == (SCHEMA_VERSION,)
    reopened = SqliteMetadataStore(path)
    assert [s.name for s in await reopened.list_streams()] == ["a"]
    await reopened.close()
    assert len(_versions(path)) == len(MIGRATIONS)


_OPENER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from walstream.metadata.sqlite import open_connection

    for line in sys.stdin:  # one file per line, opened as soon as the line arrives
        try:
            open_connection(Path(line.strip()), 30.0).close()
            print("ok", flush=True)
        except BaseException as error:
            print(f"failed {type(error).__name__}: {error}", flush=True)
    """
)


@pytest.mark.slow
def test_processes_opening_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """Each round, four processes get the name of a new file at the same moment and open it:
    every open succeeds and every migration is recorded once (the WAL switch and each migration
    step retry or wait for the other openers' locks)."""
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for round_ in range(12):
            path = tmp_path / f"round-{round_}" / "meta.db"
            for opener in openers:
                assert opener.stdin is not None
                opener.stdin.write(f"{path}\n")
            for opener in openers:
                assert opener.stdin is not None
                opener.stdin.flush()
            answers = []
            for opener in openers:
                assert opener.stdout is not None
                answers.append(opener.stdout.readline().strip())
            assert answers == ["ok"] * 4, (round_, answers)
            assert _versions(path) == [(m.version, m.name) for m in MIGRATIONS]
    finally:
        for opener in openers:
            assert opener.stdin is not None
            opener.stdin.close()
        for opener in openers:
            opener.wait(timeout=60)


async def test_a_file_newer_than_this_code_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    store = SqliteMetadataStore(path)
    await store.create_stream("kept")
    await store.close()
    newer = SCHEMA_VERSION + 1
    with sqlite3.connect(path) as connection:
        connection.execute(
            "INSERT INTO schema_version VALUES (?, 'from a newer walstream', 0)", (newer,)
        )
    before = (_schema(path), _versions(path))
    refused = SqliteMetadataStore(path)
    with pytest.raises(SchemaTooNew) as caught:
        await refused.list_streams()
    await refused.close()
    assert (caught.value.found_version, caught.value.known_version) == (newer, SCHEMA_VERSION)
    message = str(caught.value)
    assert f"schema version {newer}" in message and f"({SCHEMA_VERSION})" in message
    assert "upgrade walstream" in message and str(path) in message
    assert isinstance(caught.value, ConfigError)
    assert (_schema(path), _versions(path)) == before


async def test_a_new_migration_is_applied_in_place_and_keeps_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding a column and a table is one Migration appended to MIGRATIONS, written once for
    every dialect: a file of the previous version is upgraded at its next open, old rows read
    the column's default, and the marker older walstreams read moves on too."""
    path = tmp_path / "meta.db"
    old = SqliteMetadataStore(path)
    stream = await old.create_stream("kept")
    await old.close()
    added = Migration(
        SCHEMA_VERSION + 1,
        "test: a column and a table",
        (
            "ALTER TABLE streams ADD COLUMN retention_ms bigint NOT NULL DEFAULT 0",
            "CREATE TABLE extra (extra_id bigint PRIMARY KEY)",
        ),
    )
    monkeypatch.setattr(migrations, "MIGRATIONS", (*MIGRATIONS, added))
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", added.version)
    upgraded = SqliteMetadataStore(path)
    assert (await upgraded.get_stream("kept")).stream_id == stream.stream_id
    await upgraded.close()
    assert _versions(path)[-1] == (added.version, added.name)
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT retention_ms FROM streams").fetchall() == [(0,)]
        assert connection.execute("SELECT count(*) FROM extra").fetchone() == (0,)
        marker = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        assert marker.fetchone() == (added.version,)


async def test_a_migration_that_fails_leaves_the_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "meta.db"
    old = SqliteMetadataStore(path)
    await old.create_stream("kept")
    await old.close()
    before = (_schema(path), _versions(path))
    broken = Migration(
        SCHEMA_VERSION + 1,
        "test: fails halfway",
        ("CREATE TABLE half (x bigint)", "ALTER TABLE no_such_table ADD COLUMN y bigint"),
    )
    monkeypatch.setattr(migrations, "MIGRATIONS", (*MIGRATIONS, broken))
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", broken.version)
    failing = SqliteMetadataStore(path)
    with pytest.raises(BackendUnavailable, match="no_such_table"):
        await failing.list_streams()
    await failing.close()
    assert (_schema(path), _versions(path)) == before
    monkeypatch.undo()
    store = SqliteMetadataStore(path)
    assert [s.name for s in await store.list_streams()] == ["kept"]
    await store.close()


async def test_a_file_of_something_else_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY)")
    store = SqliteMetadataStore(path)
    with pytest.raises(
        ConfigError, match=r"1 tables but no walstream schema_version.*metadata\.path"
    ):
        await store.list_streams()
    await store.close()
    assert [name for name, _ in _schema(path)] == ["accounts"]
