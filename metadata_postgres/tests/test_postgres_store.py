"""The PostgreSQL store's own rules: schema versions, options, the error taxonomy, a commit whose
connection fails while ``COMMIT`` is in flight, reconnecting after a restart."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from walstream.config import BuildContext
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    SchemaTooNew,
    StreamExists,
)
from walstream.metadata import ObjectCommit, ObjectKind, ObjectState, StreamRange
from walstream.metadata.sql import migrations
from walstream.metadata.sql.migrations import MIGRATIONS, Migration
from walstream_metadata_postgres import (
    POSTGRES_METADATA,
    SCHEMA_VERSION,
    PostgresMetadataStore,
)
from walstream_metadata_postgres.errors import translate
from walstream_metadata_postgres.testing import PostgresServer


async def _writer(store: PostgresMetadataStore, name: str) -> tuple[int, int, int]:
    node = await store.register_node(7, {"type": "test"})
    stream = await store.create_stream(name)
    claimed = await store.claim_stream(stream.stream_id, 7, node.node_epoch)
    return node.node_epoch, stream.stream_id, claimed.epoch


def _commit(object_id: int, stream_id: int, start: int, end: int, epoch: int) -> ObjectCommit:
    return ObjectCommit(
        object_id,
        f"objects/{object_id}",
        ObjectKind.STREAM,
        100,
        10,
        (StreamRange(stream_id, start, end, epoch),),
    )


# -- schema ---------------------------------------------------------------------------------------


async def test_schema_is_versioned_and_created_once(
    make_store: Any, postgres_server: PostgresServer, postgres_schema: str
) -> None:
    first = make_store()
    await first.create_stream("a")
    second = make_store()  # a second node starting on the same schema migrates nothing
    assert [s.name for s in await second.list_streams()] == ["a"]
    rows = postgres_server.sql(f'SELECT version FROM "{postgres_schema}".schema_version')
    assert rows.split() == [str(v) for v in range(1, SCHEMA_VERSION + 1)]


async def test_newer_schema_is_refused(
    make_store: Any, postgres_server: PostgresServer, postgres_schema: str
) -> None:
    await make_store().create_stream("a")
    newer = SCHEMA_VERSION + 1
    postgres_server.sql(
        f"INSERT INTO \"{postgres_schema}\".schema_version VALUES ({newer}, 'from a newer one', 0)"
    )
    before = postgres_server.sql(
        f'SELECT version FROM "{postgres_schema}".schema_version ORDER BY version'
    )
    with pytest.raises(SchemaTooNew) as caught:
        await make_store().get_streams([1])
    assert (caught.value.found_version, caught.value.known_version) == (newer, SCHEMA_VERSION)
    message = str(caught.value)
    assert f"schema version {newer}" in message
    assert f"({SCHEMA_VERSION})" in message and "upgrade walstream" in message
    assert postgres_schema in message
    after = postgres_server.sql(
        f'SELECT version FROM "{postgres_schema}".schema_version ORDER BY version'
    )
    assert after == before


async def test_foreign_schema_is_refused(
    make_store: Any, postgres_server: PostgresServer, postgres_schema: str
) -> None:
    postgres_server.sql(
        f'CREATE SCHEMA "{postgres_schema}"; CREATE TABLE "{postgres_schema}".accounts (id int)'
    )
    with pytest.raises(ConfigError, match="no walstream schema_version"):
        await make_store().list_streams()


async def test_migrations_run_once_when_nodes_start_together(
    make_store: Any, postgres_server: PostgresServer, postgres_schema: str
) -> None:
    stores = [make_store() for _ in range(6)]
    await asyncio.gather(*(store.list_streams() for store in stores))
    rows = postgres_server.sql(f'SELECT count(*) FROM "{postgres_schema}".schema_version')
    assert int(rows) == SCHEMA_VERSION


# -- options --------------------------------------------------------------------------------------


def test_unknown_option_suggests_the_right_one(tmp_path: Path) -> None:
    section = {"dsn": "postgresql://u@127.0.0.1/db", "pool_mx": 3}
    with pytest.raises(ConfigError, match="did you mean 'pool_max'"):
        POSTGRES_METADATA.build(section, BuildContext(base_dir=tmp_path), "metadata")


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({}, "metadata.dsn: required"),
        ({"dsn": "host=db user=u"}, "expected a URL like postgresql://"),
        ({"dsn": "postgresql://u@db:99999/x"}, "bad port"),
        ({"dsn": "postgresql://u@db/x", "schema": "pg_catalog"}, "not a usable schema"),
        ({"dsn": "postgresql://u@db/x", "schema": "a b"}, "not a usable schema"),
        ({"dsn": "postgresql://u@db/x", "pool_max": 0}, "at least 1"),
        ({"dsn": "postgresql://u@db/x", "pool_min": 5, "pool_max": 2}, "pool_min <= pool_max"),
        ({"dsn": "postgresql://u@db/x", "retry_for": "soon"}, "expected a duration"),
    ],
)
def test_bad_options_are_config_errors(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        POSTGRES_METADATA.build(section, BuildContext(base_dir=tmp_path), "metadata")


def test_describe_hides_the_password() -> None:
    store = PostgresMetadataStore("postgresql://u:secret@db:5432/x", schema="s")
    assert store.describe() == {
        "type": "postgres",
        "dsn": "postgresql://u:***@db:5432/x",
        "schema": "s",
    }


# -- errors ---------------------------------------------------------------------------------------


async def test_missing_database_is_a_config_error(make_store: Any, postgres_server: Any) -> None:
    dsn = postgres_server.dsn.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(ConfigError, match="check the user, password, database name"):
        await make_store(dsn=dsn).list_streams()


async def test_unreachable_server_is_backend_unavailable_after_retry_for(make_store: Any) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = make_store(dsn=f"postgresql://u@127.0.0.1:{port}/x", retry_for_s=0.5)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="unreachable") as caught:
        await store.list_streams()
    assert caught.value.definitely_not_applied
    assert time.monotonic() - started < 5


async def test_concurrent_creates_of_one_name_make_one_stream(make_store: Any) -> None:
    stores = [make_store() for _ in range(4)]
    results = await asyncio.gather(
        *(store.create_stream("same") for store in stores), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    assert len(created) == 1
    assert all(isinstance(r, StreamExists) for r in results if isinstance(r, BaseException))


# -- a commit whose connection fails while COMMIT is in flight ----------------------------------


@pytest.mark.parametrize("applied", [True, False], ids=["reply-lost", "request-lost"])
async def test_commit_lost_in_flight_is_ambiguous_and_retry_is_safe(
    make_store: Any, monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    store = make_store()
    node_epoch, stream_id, epoch = await _writer(store, "s")
    ids = await store.prepare_objects(2, 600_000)
    first = _commit(ids[0], stream_id, 0, 10, epoch)

    original = asyncpg.connection.Connection.execute
    armed = [True]

    async def flaky_execute(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if query == "COMMIT" and armed[0]:
            armed[0] = False
            if applied:
                await original(self, query, *args, **kwargs)
            self.terminate()
            raise asyncpg.ConnectionDoesNotExistError("connection lost while committing")
        return await original(self, query, *args, **kwargs)

    monkeypatch.setattr(asyncpg.connection.Connection, "execute", flaky_execute)
    with pytest.raises(AmbiguousError, match="COMMIT was in flight") as caught:
        await store.commit_objects(7, node_epoch, [first])
    assert not caught.value.definitely_not_applied
    stream = (await store.get_streams([stream_id]))[stream_id]
    assert stream.committed_end == (10 if applied else 0)

    # The engine's retry: the same commit again. Applied once, whatever happened before.
    await store.commit_objects(7, node_epoch, [first])
    await store.commit_objects(7, node_epoch, [first])
    await store.commit_objects(7, node_epoch, [_commit(ids[1], stream_id, 10, 25, epoch)])
    stream = (await store.get_streams([stream_id]))[stream_id]
    assert stream.committed_end == 25
    objects = await store.get_objects(stream_id, 0)
    assert [(o.object_id, o.ranges[0].start_offset, o.ranges[0].end_offset) for o in objects] == [
        (ids[0], 0, 10),
        (ids[1], 10, 25),
    ]
    committed = await store.list_objects(ObjectState.COMMITTED)
    assert [o.object_id for o in committed] == ids


@pytest.mark.slow
async def test_calls_resume_after_a_server_restart(
    make_store: Any, postgres_server: PostgresServer
) -> None:
    store = make_store(retry_for_s=20.0)
    node_epoch, stream_id, epoch = await _writer(store, "s")
    (object_id,) = await store.prepare_objects(1, 600_000)
    postgres_server.kill()  # every pooled connection is now dead

    async def restart_later() -> None:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(postgres_server.start)

    restarting = asyncio.create_task(restart_later())
    await store.commit_objects(7, node_epoch, [_commit(object_id, stream_id, 0, 5, epoch)])
    await restarting
    assert (await store.get_streams([stream_id]))[stream_id].committed_end == 5


async def test_a_new_migration_upgrades_an_existing_schema_in_place(
    make_store: Any,
    postgres_server: PostgresServer,
    postgres_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Adding a column and a table is one Migration appended to core's MIGRATIONS, written once
    for every dialect: a schema of the previous version is upgraded at the next start and keeps
    its data; old rows read the column's default."""
    old = make_store()
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
    upgraded = make_store()
    assert (await upgraded.get_stream("kept")).stream_id == stream.stream_id
    versions = postgres_server.sql(f'SELECT version FROM "{postgres_schema}".schema_version')
    assert versions.split() == [str(v) for v in range(1, added.version + 1)]
    assert postgres_server.sql(f'SELECT count(*) FROM "{postgres_schema}".extra').strip() == "0"
    retention = postgres_server.sql(f'SELECT retention_ms FROM "{postgres_schema}".streams')
    assert retention.split() == ["0"]


async def test_a_migration_that_fails_leaves_the_previous_version(
    make_store: Any,
    postgres_server: PostgresServer,
    postgres_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await make_store().create_stream("kept")
    broken = Migration(
        SCHEMA_VERSION + 1,
        "test: fails halfway",
        ("CREATE TABLE half (x bigint)", "ALTER TABLE no_such_table ADD COLUMN y bigint"),
    )
    monkeypatch.setattr(migrations, "MIGRATIONS", (*MIGRATIONS, broken))
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", broken.version)
    with pytest.raises(BackendUnavailable, match="no_such_table"):
        await make_store().list_streams()
    tables = postgres_server.sql(
        f"SELECT tablename FROM pg_tables WHERE schemaname = '{postgres_schema}'"
    )
    assert "half" not in tables.split()
    versions = postgres_server.sql(f'SELECT max(version) FROM "{postgres_schema}".schema_version')
    assert versions.strip() == str(SCHEMA_VERSION)
    monkeypatch.undo()
    assert [s.name for s in await make_store().list_streams()] == ["kept"]


_OPENER = textwrap.dedent(
    """
    import asyncio, sys
    from walstream_metadata_postgres import PostgresMetadataStore

    async def open_one(dsn: str, schema: str) -> None:
        store = PostgresMetadataStore(dsn, schema=schema)
        try:
            await store.list_streams()
        finally:
            await store.close()

    for line in sys.stdin:  # one schema per line, opened as soon as the line arrives
        try:
            asyncio.run(open_one(sys.argv[1], line.strip()))
            print("ok", flush=True)
        except BaseException as error:
            print(f"failed {type(error).__name__}: {error}", flush=True)
    """
)


@pytest.mark.slow
def test_processes_opening_one_new_schema_at_once_all_open_it(
    postgres_server: PostgresServer, postgres_dsn: str, postgres_schema: str
) -> None:
    """Each round, four processes get the name of a new schema at the same moment and open it:
    every open succeeds and every migration is recorded once (the advisory lock, then the
    version read again)."""
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, postgres_dsn],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    schemas = [f"{postgres_schema}_{round_}" for round_ in range(6)]
    try:
        for schema_name in schemas:
            for opener in openers:
                assert opener.stdin is not None
                opener.stdin.write(f"{schema_name}\n")
            for opener in openers:
                assert opener.stdin is not None
                opener.stdin.flush()
            answers = []
            for opener in openers:
                assert opener.stdout is not None
                answers.append(opener.stdout.readline().strip())
            assert answers == ["ok"] * 4, (schema_name, answers)
            versions = postgres_server.sql(
                f'SELECT version FROM "{schema_name}".schema_version ORDER BY version'
            )
            assert versions.split() == [str(m.version) for m in MIGRATIONS]
    finally:
        for opener in openers:
            assert opener.stdin is not None
            opener.stdin.close()
        for opener in openers:
            opener.wait(timeout=60)
        for schema_name in schemas:
            postgres_server.sql(f'DROP SCHEMA IF EXISTS "{schema_name}" CASCADE')


async def test_a_current_schema_opens_without_the_create_privilege(
    make_store: Any, postgres_server: PostgresServer, postgres_dsn: str, postgres_schema: str
) -> None:
    """Once migrated (by a role that may create), a schema is used by a role that may only read
    and write its tables: an open that finds the schema current takes no lock and creates
    nothing."""
    await make_store().create_stream("kept")
    role = f"{postgres_schema}_user"
    quoted = f'"{postgres_schema}"'
    postgres_server.sql(
        f'CREATE ROLE "{role}" LOGIN; '
        f'GRANT USAGE ON SCHEMA {quoted} TO "{role}"; '
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {quoted} TO "{role}"; '
        f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA {quoted} TO "{role}"'
    )
    try:
        dsn = postgres_dsn.replace("//walstream@", f"//{role}@")
        store = make_store(dsn=dsn)
        assert [s.name for s in await store.list_streams()] == ["kept"]
        await store.create_stream("by-the-user")
        await store.close()
        with pytest.raises(ConfigError, match="refused this client"):
            await make_store(dsn=dsn, schema=f"{postgres_schema}_new").list_streams()
    finally:
        postgres_server.sql(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (asyncpg.exceptions.DiskFullError("no space"), CapacityError),
        (asyncpg.exceptions.DataCorruptedError("bad page"), CorruptionError),
        (asyncpg.exceptions.IndexCorruptedError("bad index"), CorruptionError),
        (asyncpg.exceptions.InvalidPasswordError("password"), ConfigError),
        (asyncpg.exceptions.InvalidCatalogNameError("no db"), ConfigError),
        (asyncpg.exceptions.InsufficientPrivilegeError("denied"), ConfigError),
        (asyncpg.exceptions.AdminShutdownError("shutdown"), BackendUnavailable),
        (asyncpg.exceptions.DeadlockDetectedError("deadlock"), BackendUnavailable),
        (asyncpg.exceptions.ConnectionDoesNotExistError("gone"), BackendUnavailable),
        (ConnectionRefusedError("refused"), BackendUnavailable),
        (asyncpg.exceptions.UniqueViolationError("dup"), BackendUnavailable),
    ],
)
def test_every_driver_error_becomes_a_walstream_error(
    error: BaseException, expected: type[Exception]
) -> None:
    translated = translate(error, "u@db:5432/x schema 's'")
    assert type(translated) is expected
    assert "u@db:5432/x" in str(translated)


def test_a_dsn_may_name_several_hosts() -> None:
    store = PostgresMetadataStore(
        "postgresql://u@db1:5432,db2:5432/x?target_session_attrs=read-write"
    )
    assert store.describe()["dsn"].startswith("postgresql://u@db1:5432,db2:5432/x")


@pytest.mark.slow
async def test_a_frozen_server_cannot_hang_a_call(
    make_store: Any, postgres_server: PostgresServer
) -> None:
    """SIGSTOPped PostgreSQL: a read fails with BackendUnavailable within command_timeout and
    retry_for, a commit with AmbiguousError or BackendUnavailable; both work again after."""
    store = make_store(command_timeout_s=0.5, retry_for_s=1.0, connect_timeout_s=0.5)
    node_epoch, stream_id, epoch = await _writer(store, "s")
    (object_id,) = await store.prepare_objects(1, 600_000)
    postgres_server.freeze()
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await store.get_streams([stream_id])
        with pytest.raises((BackendUnavailable, AmbiguousError)):
            await store.commit_objects(7, node_epoch, [_commit(object_id, stream_id, 0, 5, epoch)])
        assert time.monotonic() - started < 10
    finally:
        postgres_server.thaw()
    store = make_store(retry_for_s=10.0)
    await store.commit_objects(7, node_epoch, [_commit(object_id, stream_id, 0, 5, epoch)])
    assert (await store.get_streams([stream_id]))[stream_id].committed_end == 5
