"""Shared fixtures: one local SparkSession for the whole run (Spark starts slowly) and embedded
deployments (WAL: ebs file when its plugin is installed, else memory; local objects; SQLite)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def write_deployment(folder: Path, upload_max_bytes: str = "256KiB") -> Path:
    """A deployment YAML in ``folder``; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("walstream_wal_ebs") is not None:
        wal = "{type: ebs, path: wal.img, capacity: 64MiB, direct: false}"
    else:
        wal = "{type: memory}"
    config = folder / "deploy.yaml"
    config.write_text(
        "node: {id: 1}\n"
        f"wal: {wal}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        f"upload: {{max_bytes: {upload_max_bytes}, max_interval: 100ms}}\n"
        "compaction: {enabled: false, min_objects: 2}\n"
    )
    return config


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from walstream_spark import local_session

    # local[2,2]: two cores, and a failed task is retried once (local mode defaults to none).
    session = local_session("local[2,2]", "walstream-spark-tests")
    yield session
    session.stop()


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    return write_deployment(tmp_path / "deployment")


@pytest.fixture(scope="module")
def module_deployment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_deployment(tmp_path_factory.mktemp("deployment"))
