"""Metadata databases written by older walstream open in place and read back what they held.

``tests/fixtures/metadata`` holds a SQLite file and a PostgreSQL dump made by the code of commit
b30fa10 (``make_metadata_fixtures.py``), the last before versioned migrations, with what that code
read back from each. Today's code opens a copy of each (the SQLite file as it is, the dump loaded
into a fresh schema), adopts and upgrades it, and must read back exactly the same catalogue, then
keep writing it: new ids follow the old ones, a node restarts with a newer epoch, a stream's next
commit starts at its committed end. The upgraded database has the same tables, columns and indexes
as a new one, and every migration recorded once. SQLite files of the versions before (1 to 3) are
made from the fixture by removing what the later versions added.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from walstream.metadata import MetadataStore, ObjectCommit, ObjectKind, StreamRange
from walstream.metadata.sql.migrations import MIGRATIONS
from walstream.metadata.sqlite import SqliteMetadataStore

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "metadata"


def _scenario() -> ModuleType:
    path = FIXTURES / "make_metadata_fixtures.py"
    spec = importlib.util.spec_from_file_location("metadata_fixture_scenario", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SCENARIO = _scenario()


#: Fields that mark a dict of the snapshot as one record (a stream, object, range, node, gap or
#: basin) rather than a map by id or a JSON value.
_RECORD_FIELDS = {"stream_id", "object_id", "node_id", "created_ms"}


def _reads_back(found: Any, expected: Any, where: str = "catalogue") -> None:
    """``found`` is ``expected``, except that a record may hold a field added since the fixture
    was made (a new column): what an old row reads for it (its default) is for that column's own
    test to check. Maps by id, lists and JSON values must match exactly."""
    if isinstance(expected, dict):
        assert isinstance(found, dict), f"{where}: {found!r}"
        if _RECORD_FIELDS.isdisjoint(expected):
            assert found.keys() == expected.keys(), (
                f"{where}: {sorted(found)} != {sorted(expected)}"
            )
        for key, value in expected.items():
            assert key in found, f"{where}: {key!r} is missing"
            _reads_back(found[key], value, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(found, list) and len(found) == len(expected), (
            f"{where}: {found!r} != {expected!r}"
        )
        for index, (item, value) in enumerate(zip(found, expected, strict=True)):
            _reads_back(item, value, f"{where}[{index}]")
    else:
        assert found == expected, f"{where}: {found!r} != {expected!r}"


def _expected(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return loaded


async def _keeps_working(store: MetadataStore, expected: dict[str, Any]) -> None:
    """The upgraded catalogue takes new writes where the old one stopped."""
    last_stream = max(int(stream_id) for stream_id in expected["streams"])
    last_object = max(o["object_id"] for o in expected["objects"])
    assert (await store.create_stream("after-upgrade")).stream_id == last_stream + 1
    (object_id,) = await store.prepare_objects(1, 600_000)
    assert object_id > last_object
    node = await store.register_node(1, {"type": "ebs"})
    assert node.node_epoch == expected["nodes"][0]["node_epoch"] + 1
    orders = await store.claim_stream(1, 1, node.node_epoch)
    assert orders.committed_end == 30
    await store.commit_objects(
        1,
        node.node_epoch,
        [
            ObjectCommit(
                object_id,
                "objects/after",
                ObjectKind.STREAM,
                100,
                10,
                (StreamRange(1, 30, 40, orders.epoch),),
            )
        ],
    )
    assert [
        (o.ranges[0].start_offset, o.ranges[0].end_offset) for o in await store.get_objects(1, 12)
    ] == [
        (10, 25),
        (25, 30),
        (30, 40),
    ]


def _sqlite_shape(path: Path) -> dict[str, Any]:
    """Every table's columns and every index's columns, as SQLite reports them."""
    with sqlite3.connect(path) as connection:
        tables = [
            str(row[0])
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        shape: dict[str, Any] = {}
        for table in tables:
            shape[table] = {
                "columns": connection.execute(f"PRAGMA table_info({table})").fetchall(),
                "indexes": {
                    str(index[1]): (
                        index[2],
                        index[4],
                        connection.execute(f"PRAGMA index_info({index[1]})").fetchall(),
                    )
                    for index in connection.execute(f"PRAGMA index_list({table})")
                },
            }
        return shape


def _recorded_versions(path: Path) -> list[int]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT version FROM schema_version ORDER BY version")
        return [int(row[0]) for row in rows]


async def test_a_sqlite_file_of_schema_version_4_opens_in_place(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    shutil.copyfile(SCENARIO.SQLITE_FIXTURE, path)
    expected = _expected("sqlite_v4.json")
    store = SqliteMetadataStore(path)
    try:
        _reads_back(await SCENARIO.snapshot(store), expected)
        await _keeps_working(store, expected)
    finally:
        await store.close()
    assert _recorded_versions(path) == [m.version for m in MIGRATIONS]
    fresh = SqliteMetadataStore(tmp_path / "fresh.db")
    await fresh.list_streams()
    await fresh.close()
    assert _sqlite_shape(path) == _sqlite_shape(tmp_path / "fresh.db")


#: What a SQLite file of each version before 4 lacked, removed from the version 4 fixture.
_REMOVED_AFTER = {
    3: ["ALTER TABLE nodes DROP COLUMN address", "ALTER TABLE nodes DROP COLUMN lease_expires_ms"],
    2: ["DROP TABLE basins"],
    1: ["DROP TABLE deployment", "DROP TABLE data_loss"],
}


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_a_sqlite_file_of_an_older_schema_version_opens_in_place(
    tmp_path: Path, version: int
) -> None:
    path = tmp_path / "meta.db"
    shutil.copyfile(SCENARIO.SQLITE_FIXTURE, path)
    with sqlite3.connect(path) as connection:
        for older in range(3, version - 1, -1):
            for statement in _REMOVED_AFTER[older]:
                connection.execute(statement)
        connection.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
    expected = _expected("sqlite_v4.json")
    if version < 4:  # nodes had no address and no lease
        for node in expected["nodes"]:
            node["address"], node["lease_expires_ms"] = None, 0
    if version < 3:
        expected["basins"] = []
    if version < 2:  # no gaps; a new deployment id
        expected["data_loss"] = {stream_id: [] for stream_id in expected["data_loss"]}
    store = SqliteMetadataStore(path)
    try:
        found = await SCENARIO.snapshot(store)
        if version < 2:
            assert found.pop("deployment_id") != expected.pop("deployment_id")
        _reads_back(found, expected)
        await _keeps_working(store, _expected("sqlite_v4.json"))
    finally:
        await store.close()
    assert _recorded_versions(path) == [m.version for m in MIGRATIONS]
    fresh = SqliteMetadataStore(tmp_path / "fresh.db")
    await fresh.list_streams()
    await fresh.close()
    assert _sqlite_shape(path) == _sqlite_shape(tmp_path / "fresh.db")


async def _load_dump(dsn: str, schema: str) -> None:
    import asyncpg

    dump = SCENARIO.POSTGRES_FIXTURE.read_text().replace(SCENARIO.POSTGRES_FIXTURE_SCHEMA, schema)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(dump)
    finally:
        await connection.close()


@pytest.fixture
def postgres_dsn_and_schema(request: pytest.FixtureRequest) -> tuple[str, str]:
    pytest.importorskip("walstream_metadata_postgres")
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema: str = request.getfixturevalue("postgres_schema")
    return dsn, schema


try:  # the PostgreSQL rig's fixtures, when walstream-metadata-postgres is installed
    from walstream_metadata_postgres.testing.fixtures import (  # noqa: F401
        postgres_dsn,
        postgres_schema,
        postgres_server,
    )
except ImportError:  # pragma: no cover - core alone
    pass


async def test_a_postgres_schema_of_version_3_opens_in_place(
    postgres_dsn_and_schema: tuple[str, str],
) -> None:
    from walstream_metadata_postgres import PostgresMetadataStore

    dsn, schema = postgres_dsn_and_schema
    await _load_dump(dsn, schema)
    expected = _expected("postgres_v3.json")
    store = PostgresMetadataStore(dsn, schema=schema)
    try:
        _reads_back(await SCENARIO.snapshot(store), expected)
        await _keeps_working(store, expected)
    finally:
        await store.close()
    fresh_schema = f"{schema}_fresh"
    fresh = PostgresMetadataStore(dsn, schema=fresh_schema)
    try:
        await fresh.list_streams()
    finally:
        await fresh.close()
    try:
        upgraded = await _postgres_shape(dsn, schema)
        assert upgraded.pop("versions") == [
            (m.version, m.name, m.version <= 4) for m in MIGRATIONS
        ], "every migration recorded once; the legacy ones keep when they were applied"
        new = await _postgres_shape(dsn, fresh_schema)
        new.pop("versions")
        assert upgraded == new
    finally:
        await _drop_schema(dsn, fresh_schema)


async def _postgres_shape(dsn: str, schema: str) -> dict[str, Any]:
    """Columns, indexes, constraints and sequences of ``schema``, and its recorded versions
    (with whether each kept the fixture's applied_ms)."""
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        columns = await connection.fetch(
            "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
            "column_default, collation_name FROM information_schema.columns "
            "WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
            schema,
        )
        indexes = await connection.fetch(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = $1 "
            "ORDER BY indexname",
            schema,
        )
        constraints = await connection.fetch(
            "SELECT c.conrelid::regclass::text, pg_get_constraintdef(c.oid) FROM pg_constraint c "
            "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = $1 ORDER BY 1, 2",
            schema,
        )
        sequences = await connection.fetch(
            "SELECT sequencename, data_type FROM pg_sequences WHERE schemaname = $1 ORDER BY 1",
            schema,
        )
        versions = await connection.fetch(
            f'SELECT version, name, applied_ms = {SCENARIO.START_MS} FROM "{schema}".schema_version '
            "ORDER BY version"
        )
    finally:
        await connection.close()

    def plain(rows: list[Any]) -> list[tuple[Any, ...]]:
        return [tuple(str(v).replace(schema, "<schema>") for v in row) for row in rows]

    return {
        "columns": plain(columns),
        "indexes": plain(indexes),
        "constraints": plain(constraints),
        "sequences": plain(sequences),
        "versions": [tuple(row) for row in versions],
    }


async def _drop_schema(dsn: str, schema: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await connection.close()
