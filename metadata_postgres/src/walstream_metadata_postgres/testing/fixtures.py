"""pytest fixtures over the PostgreSQL test server — import them into a ``conftest.py``::

    from walstream_metadata_postgres.testing.fixtures import (  # noqa: F401
        postgres_dsn, postgres_schema, postgres_server)

``postgres_server`` lives for the session; ``postgres_schema`` is a fresh schema name per test
(dropped afterwards), so tests never see each other's catalogue.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import pytest

from .server import PostgresServer

__all__ = ["postgres_dsn", "postgres_schema", "postgres_server"]

_SCHEMAS = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server (fsync on) for the whole session."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """The DSN of the session's server; restarts it first if a test left it stopped."""
    if not postgres_server.running:
        postgres_server.start()
    return postgres_server.dsn


@pytest.fixture
def postgres_schema(postgres_server: PostgresServer, postgres_dsn: str) -> Iterator[str]:
    """A schema name no other test uses; dropped when the test ends."""
    schema = f"test_{next(_SCHEMAS)}"
    yield schema
    if not postgres_server.running:
        postgres_server.start()
    with contextlib.suppress(Exception):
        postgres_server.sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
