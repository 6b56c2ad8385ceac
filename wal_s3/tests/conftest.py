"""Fixtures for the S3 tests: a moto S3 server, a fresh bucket per test, a fault proxy."""

from __future__ import annotations

from typing import Any

import pytest
from walstream_wal_s3 import S3ObjectStore, S3Settings, S3Wal
from walstream_wal_s3.client import RetryPolicy
from walstream_wal_s3.testing import S3Bucket
from walstream_wal_s3.testing.fixtures import (  # noqa: F401 - fixtures
    fault_proxy,
    fault_proxy_server,
    moto_server,
    s3_bucket,
)

FAST_RETRY = RetryPolicy(
    max_attempts=10, base_delay_s=0.005, max_delay_s=0.1, throttle_base_delay_s=0.01
)


def make_settings(endpoint_url: str, default_bucket: str, **overrides: Any) -> S3Settings:
    values: dict[str, Any] = {
        "bucket": default_bucket,
        "endpoint_url": endpoint_url,
        "region": "us-east-1",
        "access_key_id": "walstream-test",
        "secret_access_key": "walstream-test",
        "retry": FAST_RETRY,
        **overrides,
    }
    return S3Settings(**values)


@pytest.fixture
def make_store(s3_bucket: S3Bucket) -> Any:  # noqa: F811 - the imported fixture
    """``make_store(endpoint_url=None, **store_options)`` → an S3ObjectStore on the test bucket
    (through another endpoint, e.g. the fault proxy, when given)."""
    stores: list[S3ObjectStore] = []

    def make(
        endpoint_url: str | None = None, settings: dict[str, Any] | None = None, **options: Any
    ) -> S3ObjectStore:
        store = S3ObjectStore(
            make_settings(
                endpoint_url or s3_bucket.endpoint_url, s3_bucket.bucket, **(settings or {})
            ),
            **options,
        )
        stores.append(store)
        return store

    return make


@pytest.fixture
def make_wal(s3_bucket: S3Bucket) -> Any:  # noqa: F811 - the imported fixture
    """``make_wal(endpoint_url=None, **wal_options)`` → an unstarted S3Wal on the test bucket."""

    def make(
        endpoint_url: str | None = None, settings: dict[str, Any] | None = None, **options: Any
    ) -> S3Wal:
        store = S3ObjectStore(
            make_settings(
                endpoint_url or s3_bucket.endpoint_url, s3_bucket.bucket, **(settings or {})
            )
        )
        options.setdefault("max_batch_interval_s", 0.01)
        return S3Wal(store, **options)

    return make
