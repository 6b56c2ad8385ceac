"""Lifecycle events the engine reports (metrics, tests, audit).

The engine calls an :class:`EngineHooks`; the plugin host adapts it to pluggy hook
implementations (``walstream_wal_appended`` …) discovered from the ``walstream.hooks`` group.
Hooks are called synchronously on the event loop and must be cheap; an exception in a hook is
logged and ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["EngineHooks", "NullHooks"]


class EngineHooks(Protocol):
    def wal_appended(
        self, node_id: int, stream_id: int, records: int, size_bytes: int, latency_s: float
    ) -> None:
        """A batch became durable in the WAL (acknowledged)."""

    def object_uploaded(
        self, node_id: int, object_id: int, key: str, size_bytes: int, kind: str
    ) -> None:
        """An object was written to the object store (not yet committed)."""

    def object_committed(
        self, node_id: int, object_ids: Sequence[int], size_bytes: int, wal_offset: int
    ) -> None:
        """Objects were committed to metadata and the WAL trimmed up to ``wal_offset``."""

    def recovered(
        self, node_id: int, records: int, batches: int, dropped_batches: int, failover: bool
    ) -> None:
        """Restart or failover recovery finished."""

    def compacted(
        self, source_object_ids: Sequence[int], new_object_ids: Sequence[int], size_bytes: int
    ) -> None:
        """Compaction replaced objects."""

    def read_served(self, stream_id: int, records: int, size_bytes: int, source: str) -> None:
        """A read returned records; ``source`` is ``log_cache``, ``block_cache`` or ``object``."""


class NullHooks:
    def wal_appended(
        self, node_id: int, stream_id: int, records: int, size_bytes: int, latency_s: float
    ) -> None:
        return None

    def object_uploaded(
        self, node_id: int, object_id: int, key: str, size_bytes: int, kind: str
    ) -> None:
        return None

    def object_committed(
        self, node_id: int, object_ids: Sequence[int], size_bytes: int, wal_offset: int
    ) -> None:
        return None

    def recovered(
        self, node_id: int, records: int, batches: int, dropped_batches: int, failover: bool
    ) -> None:
        return None

    def compacted(
        self, source_object_ids: Sequence[int], new_object_ids: Sequence[int], size_bytes: int
    ) -> None:
        return None

    def read_served(self, stream_id: int, records: int, size_bytes: int, source: str) -> None:
        return None
