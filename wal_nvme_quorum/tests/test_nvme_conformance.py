"""The shared WAL conformance suite against three real chunk servers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from walstream.config import BuildContext
from walstream.wal import WriteAheadLog
from walstream_conformance import WalSuite
from walstream_conformance.backends import BackendSpec
from walstream_wal_nvme_quorum import NVME_QUORUM_WAL
from walstream_wal_nvme_quorum.testing import ChunkServerProcess


@pytest.fixture
def walstream_wal_factory(wal_options: dict[str, Any]) -> Callable[[], WriteAheadLog]:
    return lambda: NVME_QUORUM_WAL.build(wal_options, BuildContext(node_id=1), "wal")


@pytest.fixture
def walstream_wal_spec(wal_options: dict[str, Any]) -> BackendSpec:
    return BackendSpec(kind="wal", name="nvme-quorum", section=dict(wal_options))


@pytest.fixture
def walstream_wal_medium_fault(
    chunk_servers: list[ChunkServerProcess],
) -> Callable[[bool], None]:
    """Breaking the medium = losing the quorum: two of the three servers die (and return)."""

    def fault(broken: bool) -> None:
        for server in chunk_servers[:2]:
            server.kill() if broken else server.start()

    return fault


@pytest.mark.slow
class TestNvmeQuorumWal(WalSuite):
    pass
