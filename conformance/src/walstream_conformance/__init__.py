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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .requirements import (
        SUITE_VERSION,
        ObjectStoreRequirements,
        WalRequirements,
        check_version,
    )
    from .suites.metadata import MetadataSuite
    from .suites.objects import ObjectStoreSuite
    from .suites.wal import WalKit, WalSuite

# The suites import pytest; they load on first use, so that the harness's child processes (crash
# writers, test servers) start without it.
_SUITES = {
    "SUITE_VERSION": ".requirements",
    "ObjectStoreRequirements": ".requirements",
    "WalRequirements": ".requirements",
    "check_version": ".requirements",
    "MetadataSuite": ".suites.metadata",
    "ObjectStoreSuite": ".suites.objects",
    "WalKit": ".suites.wal",
    "WalSuite": ".suites.wal",
}


def __getattr__(name: str) -> Any:
    if name in _SUITES:
        return getattr(importlib.import_module(_SUITES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
