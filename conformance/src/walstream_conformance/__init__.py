"""The walstream conformance suite: one set of tests every WAL, object-store and metadata backend
must pass, shipped as a pytest plugin.

A backend author writes one fixture and a one-line class::

    import pytest
    from walstream_conformance import WalSuite

    @pytest.fixture
    def walstream_wal_factory(tmp_path):
        return lambda: MyWal(tmp_path / "wal.log")      # a new instance on the same medium

    class TestMyWal(WalSuite):
        pass

or runs the suite against an installed backend: ``pytest --walstream-wal=NAME``.
"""

from __future__ import annotations

from .requirements import SUITE_VERSION, ObjectStoreRequirements, WalRequirements, check_version
from .suites.metadata import MetadataSuite
from .suites.objects import ObjectStoreSuite
from .suites.wal import WalKit, WalSuite

__all__ = [
    "SUITE_VERSION",
    "MetadataSuite",
    "ObjectStoreRequirements",
    "ObjectStoreSuite",
    "WalKit",
    "WalRequirements",
    "WalSuite",
    "check_version",
]
