"""The engine's own configuration: cache, upload, compaction and recovery sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "CacheConfig",
    "CompactionConfig",
    "EngineConfig",
    "RecoveryConfig",
    "UploadConfig",
]



@dataclass(frozen=True)
class CacheConfig:
    log_cache_bytes: int = 256 << 20
    """Bound of the LogCache (hot tail); appends wait (back-pressure) when un-uploaded data
    reaches it."""
    block_cache_bytes: int = 128 << 20
    """Bound of the BlockCache (LRU of object data blocks) for cold reads."""
    readahead_min_bytes: int = 512 << 10
    readahead_max_bytes: int = 32 << 20


@dataclass(frozen=True)
class UploadConfig:
    max_bytes: int = 32 << 20
    """Seal the active LogCache block and upload it at this size …"""
    max_interval_s: float = 0.25
    """… or at this age."""
    split_bytes: int = 8 << 20
    """A stream with at least this much data in a block gets its own stream object."""
    max_concurrency: int = 4
    """Objects uploaded at once (commits stay in FIFO order)."""
    prepare_ttl_s: float = 600.0


@dataclass(frozen=True)
class CompactionConfig:
    enabled: bool = True
    interval_s: float = 30.0
    min_objects: int = 4
    """Compact when at least this many small objects wait."""
    small_object_bytes: int = 8 << 20
    """Stream-set objects and stream objects below this size are compaction candidates."""
    max_object_bytes: int = 256 << 20


@dataclass(frozen=True)
class RecoveryConfig:
    accept_loss: bool = False
    """Start even though the WAL lost acknowledged records (DESIGN §8): record each lost range
    as a data-loss gap in metadata (reads of it raise ``DataLossError``; its offsets are never
    reused), commit everything valid and reset the WAL. Off by default: without it a node whose
    WAL shows damage refuses to start with :class:`~walstream.errors.CorruptionError`. An
    operator's one-off action (``walstream recover --accept-loss``), deliberately not a key of
    the deployment YAML, where it would silently accept every future loss."""


@dataclass(frozen=True)
class EngineConfig:
    node_id: int = 1
    cache: CacheConfig = field(default_factory=CacheConfig)
    upload: UploadConfig = field(default_factory=UploadConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    append_timeout_s: float = 30.0
    """How long an append waits under back-pressure before failing with CapacityError."""
