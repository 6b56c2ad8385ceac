"""The shared WAL conformance suite against three zonal moto servers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from walstream.config import BuildContext
from walstream.wal import WriteAheadLog
from walstream_conformance import WalSuite
from walstream_conformance.backends import BackendSpec
from walstream_wal_s3express import S3EXPRESS_WAL
from walstream_wal_s3express.testing.zones import ZoneServer


@pytest.fixture
def walstream_wal_spec(shared_wal_options: dict[str, Any]) -> BackendSpec:
    return BackendSpec(kind="wal", name="s3express", section=dict(shared_wal_options))


@pytest.fixture
def walstream_wal_factory(walstream_wal_spec: BackendSpec) -> Callable[[], WriteAheadLog]:
    return lambda: S3EXPRESS_WAL.build(walstream_wal_spec.section, BuildContext(), "wal")


@pytest.fixture
def walstream_wal_medium_fault(shared_zones: list[ZoneServer]) -> Callable[[bool], None]:
    """Breaking the medium = losing the quorum: two of the three zones hang (and return)."""

    def fault(broken: bool) -> None:
        for zone in shared_zones[:2]:
            zone.freeze() if broken else zone.thaw()

    return fault


@pytest.mark.slow
class TestS3ExpressWal(WalSuite):
    pass
