"""Fixtures for the PostgreSQL metadata tests: one throwaway server per session, a fresh schema
per test, and ``make_store`` building stores on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from walstream_metadata_postgres import PostgresMetadataStore
from walstream_metadata_postgres.testing.fixtures import (  # noqa: F401 - fixtures
    postgres_dsn,
    postgres_schema,
    postgres_server,
)


@pytest_asyncio.fixture
async def make_store(postgres_dsn: str, postgres_schema: str) -> AsyncIterator[Any]:  # noqa: F811
    """``make_store(**options)`` → a store on this test's schema (closed at the end)."""
    stores: list[PostgresMetadataStore] = []

    def make(**options: Any) -> PostgresMetadataStore:
        options.setdefault("schema", postgres_schema)
        options.setdefault("retry_for_s", 5.0)
        store = PostgresMetadataStore(options.pop("dsn", postgres_dsn), **options)
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()
