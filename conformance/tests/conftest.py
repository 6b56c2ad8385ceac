"""Shared fixtures of the conformance package's own tests: the example WAL and the planted-bug
backends (loaded by file path, the way the crash harness loads them in a child process)."""

from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType

import pytest
from walstream_conformance.backends import load_target
from walstream_conformance.harness.power import SimulatedDisk

EXAMPLE_WAL = Path(__file__).resolve().parents[1] / "examples" / "appendfile_wal.py"
PLANTED = Path(__file__).resolve().with_name("planted_backends.py")


@pytest.fixture
def example_wal_path() -> Path:
    return EXAMPLE_WAL


@pytest.fixture
def appendfile_wal_class() -> type:
    loaded: type = load_target(f"{EXAMPLE_WAL}:AppendFileWal")
    return loaded


@pytest.fixture
def planted() -> ModuleType:
    """The deliberately broken backends; each must be caught by the suite."""
    module: ModuleType = load_target(f"{PLANTED}:__loader_module__")
    return module


@pytest.fixture
def disk() -> SimulatedDisk:
    return SimulatedDisk(random.Random(7))
