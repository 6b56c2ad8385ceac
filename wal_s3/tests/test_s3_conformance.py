"""The shared conformance suites against the s3 WAL and the s3 object store on moto."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from walstream.config import BuildContext
from walstream.objects import ObjectStore
from walstream.wal import WriteAheadLog
from walstream_conformance import ObjectStoreSuite, WalSuite
from walstream_conformance.backends import BackendSpec
from walstream_wal_s3.factories import S3_OBJECT_STORE, S3_WAL


@pytest.fixture
def walstream_wal_spec(s3_bucket: Any) -> BackendSpec:
    return BackendSpec(kind="wal", name="s3", section=s3_bucket.options(max_batch_interval="5ms"))


@pytest.fixture
def walstream_wal_factory(walstream_wal_spec: BackendSpec) -> Callable[[], WriteAheadLog]:
    def make() -> WriteAheadLog:
        return S3_WAL.build(walstream_wal_spec.section, BuildContext(), "wal")

    return make


@pytest_asyncio.fixture
async def walstream_object_store(s3_bucket: Any) -> AsyncIterator[ObjectStore]:
    store = S3_OBJECT_STORE.build(s3_bucket.options(), BuildContext(), "object_store")
    yield store
    await store.close()


@pytest.mark.slow
class TestS3Wal(WalSuite):
    pass


@pytest.mark.slow
class TestS3ObjectStore(ObjectStoreSuite):
    pass
