"""Per-process plumbing shared by the driver-side planner and the executor-side tasks.

Spark runs a data source's Python code in worker processes (one for planning on the driver,
several for tasks on executors) and reuses them between tasks. Each process keeps one event loop
thread and one object store + metadata store per deployment file, so a reused worker does not
reopen SQLite or re-read the YAML for every task.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from walstream.blocking import EventLoopThread
from walstream.config import EngineConfig
from walstream.errors import ConfigError
from walstream.metadata import MetadataStore
from walstream.objects import ObjectStore

__all__ = ["DeploymentBackends", "backends_for", "freeze_long_lived", "run"]

T = TypeVar("T")

_lock = threading.Lock()
_runner: EventLoopThread | None = None
_runner_pid: int | None = None
_backends: dict[str, DeploymentBackends] = {}
_FREEZE_ABOVE = 10_000
"""Objects in the collector's oldest generation above which :func:`freeze_long_lived` freezes."""


@dataclass(frozen=True)
class DeploymentBackends:
    """What a node-less reader or a writer task needs from a deployment: the shared stores
    (never its WAL, which belongs to the deployment's node)."""

    objects: ObjectStore
    metadata: MetadataStore
    engine_config: EngineConfig


def _loop() -> EventLoopThread:
    global _runner, _runner_pid
    with _lock:
        # A forked worker inherits a dead loop thread: start a fresh one in each process.
        if _runner is None or _runner_pid != os.getpid() or not _runner.running:
            _runner = EventLoopThread(name="walstream-spark")
            _runner_pid = os.getpid()
            _backends.clear()
        return _runner


def freeze_long_lived() -> None:
    """At a task's start (every use of a deployment, :func:`backends_for`): when the cyclic
    collector's oldest generation holds more than ``_FREEZE_ABOVE`` objects, collect, then move
    what the process holds to the collector's permanent generation (``gc.freeze``).

    PySpark's worker runs a full ``gc.collect()`` after every task it runs (``pyspark/daemon.py``),
    which walks every object the collector tracks: some 60,000 to 90,000 once walstream, pyarrow,
    the object store client and PySpark's own serializers (pandas, numpy) are loaded, 20-90 ms per
    task on a 2-core machine, as long as the read of a 30,000-record slice itself; the planning
    workers on the driver pay it too. Frozen objects are no longer walked. The collection first
    frees what is garbage now, so nothing collectable is frozen; what a task allocates and drops
    is freed as before. A task's own imports (PySpark's serializers import pandas during the first
    task) are in the oldest generation at the next task's start, after PySpark's collection, and
    are frozen then. Costs a look at the oldest generation per call (well under a millisecond).

    The price: an object frozen while alive that later becomes unreachable inside a reference
    cycle is never freed (reference counting still frees the others). Only what survived a full
    collection is frozen, which in a worker is what it keeps: modules, the deployment's stores."""
    if len(gc.get_objects(generation=2)) <= _FREEZE_ABOVE:
        return
    gc.collect()
    gc.freeze()


def run(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` on this process's walstream event loop and return its result."""
    return _loop().run(awaitable)


def backends_for(config: str) -> DeploymentBackends:
    """The object store and metadata store of the deployment at ``config`` (cached per process)."""
    _loop()
    freeze_long_lived()  # a task starts: see freeze_long_lived
    with _lock:
        cached = _backends.get(config)
        if cached is not None:
            return cached
    try:
        from walstream_plugins import load_deployment
    except ImportError as exc:  # pragma: no cover - a dependency of this dist
        raise ConfigError(
            "walstream-spark needs walstream-plugins: pip install walstream-plugins"
        ) from exc
    path = Path(config)
    if not path.is_file():
        # A relative path is read from the Python worker's working directory (an executor's on
        # a cluster), which the user may not expect.
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise ConfigError(
            f"option 'config': deployment file {config!r} not found{where}: give the path of "
            "the deployment's YAML file, the one `walstream -c` reads"
        )
    deployment = load_deployment(config)
    for section in ("object_store", "metadata"):
        if deployment.sections[section]["type"] == "memory":
            raise ConfigError(
                f"{config}: {section}.type is 'memory', which Spark workers (other processes) "
                "cannot see; use a shared backend (object_store: local or s3, metadata: sqlite)"
            )
    built = deployment.build_backends()
    backends = DeploymentBackends(built.objects, built.metadata, deployment.engine_config)
    with _lock:
        return _backends.setdefault(config, backends)
