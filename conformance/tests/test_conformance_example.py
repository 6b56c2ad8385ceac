"""The example third-party WAL (conformance/examples/appendfile_wal.py) passes the whole WAL suite
with the capabilities it declares, including the SIGKILL crash harness and the power-loss
simulation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from walstream.wal import WriteAheadLog
from walstream_conformance import WalSuite
from walstream_conformance.backends import BackendSpec
from walstream_conformance.harness.power import SimulatedDisk


class TestAppendFileWal(WalSuite):
    @pytest.fixture
    def walstream_wal_spec(self, tmp_path: Path, example_wal_path: Path) -> BackendSpec:
        # Real os calls, for the crash harness's child processes.
        return BackendSpec(
            "wal",
            target=f"{example_wal_path}:AppendFileWal",
            kwargs={"path": str(tmp_path / "crash.wal")},
        )

    @pytest.fixture
    def walstream_wal_factory(
        self, tmp_path: Path, disk: SimulatedDisk, appendfile_wal_class: type
    ) -> Callable[[], WriteAheadLog]:
        return lambda: appendfile_wal_class(tmp_path / "wal.log", io=disk)

    @pytest.fixture
    def walstream_wal_power_loss(self, disk: SimulatedDisk) -> Callable[[], None]:
        return disk.lose_power

    @pytest.fixture
    def walstream_wal_medium_fault(self, disk: SimulatedDisk) -> Callable[[bool], None]:
        return disk.fail


def test_example_is_small(example_wal_path: Path) -> None:
    lines = example_wal_path.read_text().splitlines()
    assert len(lines) <= 100, f"the example WAL grew to {len(lines)} lines; keep it under 100"
