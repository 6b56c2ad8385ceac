"""The suites against the built-in backends: memory WAL, memory/local object stores, memory/SQLite
metadata stores. Each class is the one-liner a backend author writes, plus its fixture."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from walstream.metadata import MetadataStore
from walstream.objects import ObjectStore
from walstream.objects.memory import MemoryObjectStore
from walstream.wal import WriteAheadLog
from walstream.wal.memory import MemoryWal
from walstream_conformance import MetadataSuite, ObjectStoreSuite, WalSuite

_volumes = itertools.count()


class TestMemoryWal(WalSuite):
    @pytest.fixture
    def walstream_wal_factory(self) -> Callable[[], WriteAheadLog]:
        volume = f"conformance-memory-wal-{next(_volumes)}"
        return lambda: MemoryWal(
            volume, capacity_bytes=1 << 20, max_record_bytes=256 << 10, capacity_wait_s=1.0
        )


class TestMemoryObjectStore(ObjectStoreSuite):
    @pytest.fixture
    def walstream_object_store(self) -> ObjectStore:
        return MemoryObjectStore()


class TestLocalObjectStore(ObjectStoreSuite):
    @pytest.fixture
    async def walstream_object_store(self, tmp_path: Path) -> AsyncIterator[ObjectStore]:
        local = pytest.importorskip("walstream.objects.local")
        store = local.LocalObjectStore(tmp_path / "objects")
        yield store
        await store.close()


class TestMemoryMetadata(MetadataSuite):
    @pytest.fixture
    def walstream_metadata_factory(self) -> Callable[[], MetadataStore]:
        memory_metadata = pytest.importorskip("walstream.metadata.memory")
        volume = f"conformance-memory-metadata-{next(_volumes)}"
        return lambda: memory_metadata.MemoryMetadataStore(volume)


class TestSqliteMetadata(MetadataSuite):
    @pytest.fixture
    def walstream_metadata_factory(self, tmp_path: Path) -> Callable[[], MetadataStore]:
        sqlite = pytest.importorskip("walstream.metadata.sqlite")
        return lambda: sqlite.SqliteMetadataStore(tmp_path / "meta.db")
