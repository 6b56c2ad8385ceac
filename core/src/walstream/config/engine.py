"""The engine's own configuration: the cache, upload, compaction and recovery sections, and
the option schemas of the deployment sections that configure them (``node``, ``cache``,
``upload``, ``compaction`` and the key ``append_timeout``).

The schemas live here, next to the dataclasses whose defaults they repeat, so that a deployment
loader (the plugin host's YAML loader) validates the engine's sections without restating them:
it checks each section against :data:`ENGINE_SECTIONS` and :data:`APPEND_TIMEOUT`, then builds
the :class:`EngineConfig` with :func:`engine_config_from_sections`.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walstream.config.options import Option
from walstream.errors import ConfigError, InvalidArgument
from walstream.stream_config import STORAGE_CLASSES, StreamConfig, Timestamping, parse_age

__all__ = [
    "APPEND_TIMEOUT",
    "CLUSTER_OPTIONS",
    "ENGINE_SECTIONS",
    "OBJECT_FORMATS",
    "CacheConfig",
    "ClusterConfig",
    "CompactionConfig",
    "EngineConfig",
    "RecoveryConfig",
    "StreamDefaults",
    "UploadConfig",
    "engine_config_from_sections",
]


@dataclass(frozen=True)
class CacheConfig:
    log_cache_bytes: int = 256 << 20
    """Bound of the LogCache (hot tail); appends wait (back-pressure) when un-uploaded data
    reaches it."""
    block_cache_bytes: int = 128 << 20
    """Bound of the BlockCache (LRU of object data blocks) for cold reads."""
    readahead_min_bytes: int = 512 << 10
    """First read-ahead window (ranged GET) of a sequential reader; it doubles with each GET …"""
    readahead_max_bytes: int = 8 << 20
    """… up to this. Ranged GETs of 8-16 MiB are what object stores serve fastest; depth, not
    size, keeps enough bytes in flight."""
    readahead_depth: int = 16
    """A sequential reader keeps up to ``readahead_depth x readahead_max_bytes`` beyond what it
    reads in flight (ranged GETs of its next windows, on into the following objects); read-ahead
    holds at most that much for all streams together (0: no read-ahead GETs)."""


OBJECT_FORMATS = (2, 3)
"""The object format versions a node can be told to write (``upload.object_format``)."""


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
    object_format: int = 3
    """The object format version uploads and compaction write: 3 (the paged index), or 2 while
    a rolling upgrade still runs nodes that read only versions 1 and 2
    (docs/operations/upgrades.md)."""

    def __post_init__(self) -> None:
        if self.object_format not in OBJECT_FORMATS:
            raise ConfigError(
                f"upload.object_format must be one of {', '.join(map(str, OBJECT_FORMATS))}, "
                f"got {self.object_format!r}: 3 is the current format, 2 the one releases "
                "before it read"
            )


@dataclass(frozen=True)
class CompactionConfig:
    """The ``compaction:`` section (docs/architecture/compaction.md explains the shape).

    Sizes must satisfy ``stream_split_bytes <= max_object_bytes`` and ``small_object_bytes <=
    max_object_bytes`` (:class:`~walstream.errors.ConfigError` otherwise)."""

    enabled: bool = True
    interval_s: float = 30.0
    min_objects: int = 4
    """Compact when at least this many candidate objects wait."""
    small_object_bytes: int = 8 << 20
    """Stream-set objects below this size merge into larger stream-set objects; stream objects
    from ``stream_split_bytes`` up to this size merge with their stream's neighbours (none with
    the defaults, where both are 8 MiB: raise it to merge a busy stream's objects into larger
    ones, at the price of rewriting them). Uploads at high throughput are already this large,
    so compaction rewrites what small uploads made, not the bulk of the data."""
    max_object_bytes: int = 64 << 20
    """Largest object compaction writes, and the most source bytes one step reads and holds in
    memory (sources plus outputs: at most twice this)."""
    stream_split_bytes: int = 8 << 20
    """A stream gets stream objects of its own once a step holds this many of its live bytes;
    below it, its data stays in stream-set objects with other small streams (AutoMQ's default
    split size). Stream objects smaller than this merge into stream-set objects."""

    max_bytes_per_s: int = 64 << 20
    """Average source bytes a pass reads (and so about as many it writes) per second: a pass
    pauses between steps to keep under it, so its disk and network bursts leave room for the
    WAL and uploads (0: no limit)."""

    def __post_init__(self) -> None:
        if self.max_bytes_per_s < 0:
            raise ConfigError("compaction.max_bytes_per_s must be 0 (no limit) or positive")
        for name in ("small_object_bytes", "stream_split_bytes"):
            if getattr(self, name) > self.max_object_bytes:
                raise ConfigError(
                    f"compaction.{name} ({getattr(self, name)} bytes) must not exceed "
                    f"compaction.max_object_bytes ({self.max_object_bytes} bytes): a step "
                    "reads at most max_object_bytes; raise max_object_bytes or lower it"
                )
        for name in ("small_object_bytes", "stream_split_bytes", "max_object_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"compaction.{name} must be at least 1 byte")


@dataclass(frozen=True)
class RecoveryConfig:
    accept_loss: bool = False
    """Start even though the WAL lost acknowledged records (docs/architecture/recovery.md): record each lost range
    as a data-loss gap in metadata (reads of it raise ``DataLossError``; its offsets are never
    reused), commit everything valid and reset the WAL. Off by default: without it a node whose
    WAL shows damage refuses to start with :class:`~walstream.errors.CorruptionError`. An
    operator's one-off action (``walstream recover --accept-loss``), deliberately not a key of
    the deployment YAML, where it would silently accept every future loss."""


@dataclass(frozen=True)
class ClusterConfig:
    """The ``cluster:`` section: this node holds a lease in the metadata store.

    Defaults from a measurement of ``renew_lease`` (``bench/lease_renew.py``,
    docs/guides/cluster.md): PostgreSQL p50 1.1 ms, p99 8.5 ms, max 13 ms; SQLite (fsync on) p50 0.6 ms,
    p99 4 ms, max 8 ms. A renewal every 500 ms is therefore cheap, and a 3 s lease leaves five
    renewals before the node fences itself at 2.7 s: only a store stall over 80 times the
    slowest renewal measured fences a healthy node. A dead node is detected within the lease
    plus one heartbeat of a watcher (3.5 s), inside the 5 s recovery target."""

    lease_duration_s: float = 3.0
    """How long a renewal keeps the node's lease; another node may fail it over after that."""
    heartbeat_interval_s: float = 0.5
    """Time between renewals (each one also checks the other nodes' leases)."""

    @property
    def fence_margin_s(self) -> float:
        """How long before its lease ends, by its own clock, the node stops acknowledging: a
        tenth of the lease, at least 100 ms, to absorb clock-rate drift and scheduling delay."""
        return max(0.1, self.lease_duration_s / 10)


@dataclass(frozen=True)
class StreamDefaults:
    """The ``streams:`` section: the configuration a stream gets when its creator gives none
    (docs/guides/lifecycle.md), and how often the node looks for lifecycle work."""

    config: StreamConfig = field(default_factory=StreamConfig)
    lifecycle_interval_s: float = 1.0
    """Time between two looks for streams whose retention or delete-on-empty work is due
    (one index range of the metadata store each)."""


@dataclass(frozen=True)
class EngineConfig:
    node_id: int = 1
    cache: CacheConfig = field(default_factory=CacheConfig)
    upload: UploadConfig = field(default_factory=UploadConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    append_timeout_s: float = 30.0
    """How long an append waits under back-pressure before failing with CapacityError."""
    advertise: str | None = None
    """``node.advertise``: the base URL other nodes and clients reach this node at (None: none)."""
    cluster: ClusterConfig | None = None
    """The ``cluster:`` section; None (no section): a single node without a lease, as before."""
    streams: StreamDefaults = field(default_factory=StreamDefaults)
    """The ``streams:`` section: new streams' default configuration."""


# -- option schemas of the deployment sections ------------------------------------------------

_NODE_OPTIONS = (
    Option(
        "id",
        "int",
        "this node's id; unique among the nodes sharing a metadata store",
        default=1,
        minimum=0,
    ),
    Option(
        "advertise",
        "str",
        "base URL other nodes and clients reach this node at, e.g. http://10.0.0.5:7400 "
        "(unset: not reachable by other nodes)",
    ),
)
_CACHE_OPTIONS = (
    Option(
        "log_cache_bytes",
        "size",
        "bound of the hot-tail LogCache (back-pressure above)",
        default=CacheConfig.log_cache_bytes,
        minimum=1,
    ),
    Option(
        "block_cache_bytes",
        "size",
        "bound of the BlockCache of object data blocks",
        default=CacheConfig.block_cache_bytes,
    ),
    Option(
        "readahead_min_bytes",
        "size",
        "first read-ahead of a sequential reader",
        default=CacheConfig.readahead_min_bytes,
    ),
    Option(
        "readahead_max_bytes",
        "size",
        "largest read-ahead of a sequential reader",
        default=CacheConfig.readahead_max_bytes,
    ),
    Option(
        "readahead_depth",
        "int",
        "a sequential reader keeps up to readahead_depth x readahead_max_bytes in flight ahead "
        "of what it reads, in ranged GETs of its next windows; also the most read-ahead held "
        "for all streams together (0: none)",
        default=CacheConfig.readahead_depth,
        minimum=0,
    ),
)
_UPLOAD_OPTIONS = (
    Option(
        "max_bytes",
        "size",
        "seal and upload the active block at this size",
        default=UploadConfig.max_bytes,
        minimum=1,
    ),
    Option(
        "max_interval",
        "duration",
        "… or at this age",
        default=UploadConfig.max_interval_s,
        minimum=0.001,
    ),
    Option(
        "split_bytes",
        "size",
        "a stream with this much data in a block gets its own object",
        default=UploadConfig.split_bytes,
        minimum=1,
    ),
    Option(
        "max_concurrency",
        "int",
        "objects uploaded at once",
        default=UploadConfig.max_concurrency,
        minimum=1,
    ),
    Option(
        "prepare_ttl",
        "duration",
        "how long a prepared object id stays reserved",
        default=UploadConfig.prepare_ttl_s,
        minimum=1,
    ),
    Option(
        "object_format",
        "int",
        "the object format version uploads and compaction write: 3, or 2 until every node of a "
        "rolling upgrade reads 3",
        default=UploadConfig.object_format,
        choices=OBJECT_FORMATS,
    ),
)
_COMPACTION_OPTIONS = (
    Option("enabled", "bool", "run compaction on this node", default=CompactionConfig.enabled),
    Option(
        "interval",
        "duration",
        "time between compaction passes",
        default=CompactionConfig.interval_s,
        minimum=0.001,
    ),
    Option(
        "min_objects",
        "int",
        "compact when at least this many small objects wait",
        default=CompactionConfig.min_objects,
        minimum=2,
    ),
    Option(
        "small_object_bytes",
        "size",
        "stream-set objects below this size merge into larger ones; stream objects from "
        "stream_split_bytes up to this size merge with their stream's neighbours",
        default=CompactionConfig.small_object_bytes,
        minimum=1,
    ),
    Option(
        "max_object_bytes",
        "size",
        "largest object compaction writes, and the most bytes one step reads (memory: twice this)",
        default=CompactionConfig.max_object_bytes,
        minimum=1,
    ),
    Option(
        "max_bytes_per_s",
        "size",
        "average bytes per second a compaction pass reads (it writes about as many); 0: no limit",
        default=CompactionConfig.max_bytes_per_s,
        minimum=0,
    ),
    Option(
        "stream_split_bytes",
        "size",
        "a stream gets stream objects of its own once a compaction step holds this many of its "
        "bytes; smaller streams stay together in stream-set objects",
        default=CompactionConfig.stream_split_bytes,
        minimum=1,
    ),
)

CLUSTER_OPTIONS = (
    Option(
        "lease_duration",
        "duration",
        "how long a renewal keeps this node's lease; after it another node fails it over",
        default=ClusterConfig.lease_duration_s,
        minimum=0.05,
    ),
    Option(
        "heartbeat_interval",
        "duration",
        "time between lease renewals (each also watches the other nodes' leases)",
        default=ClusterConfig.heartbeat_interval_s,
        minimum=0.01,
    ),
)
"""The options of the optional ``cluster:`` section (present: the node holds a lease; absent: a
lease at these defaults when ``node.advertise`` is set, else none; ``cluster: false``: none)."""


def cluster_config_of(section: Mapping[str, Any] | None) -> ClusterConfig | None:
    """The :class:`ClusterConfig` of a validated ``cluster`` section (None: no section), or
    :class:`~walstream.errors.ConfigError` when the heartbeat leaves less than two renewals
    before the node would fence itself."""
    if section is None:
        return None
    config = ClusterConfig(section["lease_duration"], section["heartbeat_interval"])
    usable = config.lease_duration_s - config.fence_margin_s
    if config.heartbeat_interval_s * 2 > usable:
        raise ConfigError(
            f"cluster.heartbeat_interval ({config.heartbeat_interval_s:g}s) must be at most half "
            f"of lease_duration minus its safety margin ({usable:g}s), so that one lost renewal "
            "does not fence a healthy node; shorten the heartbeat or lengthen the lease"
        )
    return config


_STREAMS_OPTIONS = (
    Option(
        "retention",
        "str",
        "how long a new stream keeps records, by record timestamp: an age like 7d, 12h, 30m "
        "or 90s (units s, m, h, d, w), or infinite",
        default="infinite",
    ),
    Option(
        "timestamping",
        "str",
        "where a new stream's record timestamps come from: client-prefer (the client's, else "
        "arrival), client-require (refuse records without one), arrival (ignore the client's)",
        default=Timestamping.CLIENT_PREFER.value,
        choices=[mode.value for mode in Timestamping],
    ),
    Option(
        "uncapped",
        "bool",
        "keep client timestamps that lie in the future (false: capped at the arrival time)",
        default=False,
    ),
    Option(
        "delete_on_empty",
        "str",
        "delete a stream once it has been empty for this age (like retention: 1h, 7d …); "
        "never (or 0) keeps empty streams",
        default="never",
    ),
    Option(
        "storage_class",
        "str",
        "the storage class new streams report (kept as given; walstream stores every stream alike)",
        choices=list(STORAGE_CLASSES),
    ),
    Option(
        "lifecycle_interval",
        "duration",
        "time between two looks for streams whose retention or delete-on-empty work is due",
        default=StreamDefaults.lifecycle_interval_s,
        minimum=0.01,
    ),
)

ENGINE_SECTIONS: Mapping[str, tuple[Option, ...]] = {
    "node": _NODE_OPTIONS,
    "cache": _CACHE_OPTIONS,
    "upload": _UPLOAD_OPTIONS,
    "compaction": _COMPACTION_OPTIONS,
    "streams": _STREAMS_OPTIONS,
}
"""The engine's deployment sections, in order, each with the options it accepts."""

APPEND_TIMEOUT = Option(
    "append_timeout",
    "duration",
    "how long an append waits under back-pressure",
    default=EngineConfig.append_timeout_s,
    minimum=0.001,
)
"""The top-level key ``append_timeout`` (a duration, in seconds once parsed)."""


def _check_advertise(address: str | None) -> str | None:
    if address is None:
        return None
    parts = urllib.parse.urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise ConfigError(
            f"node.advertise: {address!r} is not a base URL like http://10.0.0.5:7400 (the "
            "scheme http or https, the host other nodes reach this node at, the port)"
        )
    return address


def stream_defaults_of(section: Mapping[str, Any] | None) -> StreamDefaults:
    """The :class:`StreamDefaults` of a validated ``streams`` section (None: the defaults)."""
    if section is None:
        return StreamDefaults()
    try:
        retention = parse_age(section.get("retention", "infinite"), "streams.retention")
        empty = section.get("delete_on_empty", "never")
        min_age = 0 if empty in ("never", 0, "0") else parse_age(empty, "streams.delete_on_empty")
        if min_age is None:
            raise InvalidArgument("streams.delete_on_empty: an age like 1h, or never")
        config = StreamConfig(
            retention_age_s=retention,
            timestamping=Timestamping(section.get("timestamping", "client-prefer")),
            uncapped=bool(section.get("uncapped", False)),
            delete_on_empty_min_age_s=min_age,
            storage_class=section.get("storage_class"),
        )
    except InvalidArgument as error:
        raise ConfigError(f"streams: {error}") from None
    interval = section.get("lifecycle_interval")
    return StreamDefaults(
        config, StreamDefaults.lifecycle_interval_s if interval is None else float(interval)
    )


def engine_config_from_sections(sections: Mapping[str, Any]) -> EngineConfig:
    """The :class:`EngineConfig` of validated sections: each of :data:`ENGINE_SECTIONS` as a
    mapping with every option filled in (sizes in bytes, durations in seconds) and
    ``append_timeout`` in seconds. Recovery is never configured by a deployment (see
    :class:`RecoveryConfig`)."""
    upload = sections["upload"]
    compaction = sections["compaction"]
    return EngineConfig(
        node_id=sections["node"]["id"],
        cache=CacheConfig(**sections["cache"]),
        upload=UploadConfig(
            max_bytes=upload["max_bytes"],
            max_interval_s=upload["max_interval"],
            split_bytes=upload["split_bytes"],
            max_concurrency=upload["max_concurrency"],
            prepare_ttl_s=upload["prepare_ttl"],
            object_format=upload["object_format"],
        ),
        compaction=CompactionConfig(
            enabled=compaction["enabled"],
            interval_s=compaction["interval"],
            min_objects=compaction["min_objects"],
            small_object_bytes=compaction["small_object_bytes"],
            max_object_bytes=compaction["max_object_bytes"],
            stream_split_bytes=compaction["stream_split_bytes"],
            max_bytes_per_s=compaction["max_bytes_per_s"],
        ),
        append_timeout_s=sections["append_timeout"],
        advertise=_check_advertise(sections["node"].get("advertise")),
        cluster=cluster_config_of(sections.get("cluster")),
        streams=stream_defaults_of(sections.get("streams")),
    )
