"""The shared WAL conformance suite against the ebs WAL on a preallocated file."""

from __future__ import annotations

from pathlib import Path

import pytest
from walstream_conformance import WalSuite
from walstream_conformance.backends import BackendSpec


@pytest.fixture
def walstream_wal_spec(tmp_path: Path) -> BackendSpec:
    return BackendSpec(
        kind="wal",
        name="ebs",
        section={"path": str(tmp_path / "wal.img"), "capacity": "8MiB"},
    )


class TestEbsWal(WalSuite):
    pass
