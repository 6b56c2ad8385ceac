"""Metadata databases written by older walstream open in place and read back what they held.

``tests/fixtures/metadata`` holds a SQLite file and a PostgreSQL dump made by the code of commit
b30fa10 (``make_metadata_fixtures.py``), with what that code read back from each. Today's code
opens a copy of each (the SQLite file as it is, the dump loaded into a fresh schema), upgrades it,
and must read back exactly the same catalogue, then keep writing it: new ids follow the old ones,
a node restarts with a newer epoch, a stream's next commit starts at its committed end.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from walstream.metadata import MetadataStore, ObjectCommit, ObjectKind, StreamRange
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


async def test_a_sqlite_file_of_schema_version_4_opens_in_place(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    shutil.copyfile(SCENARIO.SQLITE_FIXTURE, path)
    expected = _expected("sqlite_v4.json")
    store = SqliteMetadataStore(path)
    try:
        assert await SCENARIO.snapshot(store) == expected
        await _keeps_working(store, expected)
    finally:
        await store.close()


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
        assert await SCENARIO.snapshot(store) == expected
        await _keeps_working(store, expected)
    finally:
        await store.close()
