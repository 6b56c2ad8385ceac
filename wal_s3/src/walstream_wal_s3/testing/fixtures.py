"""pytest fixtures over the S3 test rigs — import them into a ``conftest.py``::

    from walstream_wal_s3.testing.fixtures import fault_proxy, moto_server, s3_bucket  # noqa: F401

``moto_server`` lives for the session, ``s3_bucket`` is a fresh bucket per test (moto's state is
reset first) and ``fault_proxy`` a fault proxy in front of it with no faults configured.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .moto import FaultProxy, MotoServer, S3Bucket

__all__ = ["fault_proxy", "fault_proxy_server", "moto_server", "s3_bucket"]


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """moto's S3 server for the whole test session."""
    with MotoServer() as server:
        yield server


@pytest.fixture
def s3_bucket(moto_server: MotoServer) -> S3Bucket:
    """A fresh, empty bucket (moto's state is reset first)."""
    moto_server.reset()
    moto_server.create_bucket("walstream-test")
    return S3Bucket(moto_server.endpoint_url, "walstream-test")


@pytest.fixture(scope="session")
def fault_proxy_server(moto_server: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server.endpoint_url) as proxy:
        yield proxy


@pytest.fixture
def fault_proxy(fault_proxy_server: FaultProxy, s3_bucket: S3Bucket) -> Iterator[FaultProxy]:
    """A fault proxy in front of ``s3_bucket``'s endpoint, with no faults configured."""
    fault_proxy_server.clear()
    yield fault_proxy_server
    fault_proxy_server.clear()
