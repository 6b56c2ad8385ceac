"""Lifecycle events the engine reports (metrics, tests, audit).

Each event is one frozen dataclass below; the engine hands it to :meth:`EngineHooks.emit`. The
plugin host forwards an event to the pluggy hook ``walstream_<event.name>`` with the event's
fields as keyword arguments (``walstream_wal_appended(node_id=…, stream_id=…, …)``), so the
fields of a dataclass are exactly the arguments of its hook.

``emit`` is called synchronously on the event loop and must be cheap; an exception raised while
handling an event is logged and ignored by the host (the engine never sees it). Events are plain
(not frozen) slotted dataclasses: one ``wal_appended`` is made per acknowledged batch, and a
frozen dataclass costs five times as much to make. Nobody changes an event once it is emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

__all__ = [
    "EVENT_TYPES",
    "Compacted",
    "EngineEvent",
    "EngineHooks",
    "NullHooks",
    "ObjectCommitted",
    "ObjectUploaded",
    "ReadServed",
    "Recovered",
    "WalAppended",
]


@dataclass(slots=True)
class EngineEvent:
    """Base of every engine event; ``name`` is the event's hook name without ``walstream_``."""

    name: ClassVar[str]


@dataclass(slots=True)
class WalAppended(EngineEvent):
    """A batch became durable in the WAL and was acknowledged after ``latency_s``."""

    name: ClassVar[str] = "wal_appended"
    node_id: int
    stream_id: int
    records: int
    size_bytes: int
    latency_s: float


@dataclass(slots=True)
class ObjectUploaded(EngineEvent):
    """An object was written to the object store (not yet committed); ``kind`` is ``stream`` or
    ``stream_set``."""

    name: ClassVar[str] = "object_uploaded"
    node_id: int
    object_id: int
    key: str
    size_bytes: int
    kind: str


@dataclass(slots=True)
class ObjectCommitted(EngineEvent):
    """Objects were committed to metadata and the WAL trimmed up to ``wal_offset``."""

    name: ClassVar[str] = "object_committed"
    node_id: int
    object_ids: Sequence[int]
    size_bytes: int
    wal_offset: int


@dataclass(slots=True)
class Recovered(EngineEvent):
    """Restart (``failover`` false) or failover recovery of ``node_id``'s WAL finished."""

    name: ClassVar[str] = "recovered"
    node_id: int
    records: int
    batches: int
    dropped_batches: int
    failover: bool


@dataclass(slots=True)
class Compacted(EngineEvent):
    """Compaction replaced ``source_object_ids`` with ``new_object_ids``."""

    name: ClassVar[str] = "compacted"
    source_object_ids: Sequence[int]
    new_object_ids: Sequence[int]
    size_bytes: int


@dataclass(slots=True)
class ReadServed(EngineEvent):
    """A read returned records; ``source`` is ``log_cache``, ``block_cache`` or ``object``."""

    name: ClassVar[str] = "read_served"
    stream_id: int
    records: int
    size_bytes: int
    source: str


#: Every event the engine emits (the plugin host checks its hook specifications against it).
EVENT_TYPES: tuple[type[EngineEvent], ...] = (
    WalAppended,
    ObjectUploaded,
    ObjectCommitted,
    Recovered,
    Compacted,
    ReadServed,
)


class EngineHooks(Protocol):
    """What the engine reports its events to."""

    def emit(self, event: EngineEvent) -> None:
        """Handle one event; must be cheap and must not raise into the engine."""


class NullHooks:
    """Hooks that ignore every event (the default when nobody listens)."""

    def emit(self, event: EngineEvent) -> None:
        return None
