"""Engine metrics, collected through the lifecycle hooks and exposed with prometheus-client.

:class:`Metrics` counts what the hooks report and is a prometheus-client collector: each instance
has its own :attr:`Metrics.registry`, and :meth:`Metrics.render_prometheus` is that registry's
text exposition (what ``GET /metrics`` serves).

The ``walstream.hooks`` entry point ``metrics`` loads the module-level :data:`plugin`, so every
engine in the process that uses the default plugin manager reports into it; tests and embedders
that want their own numbers register a fresh :class:`Metrics`.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pluggy
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from .hooks import hookimpl

__all__ = ["LATENCY_BUCKETS_S", "Metrics", "get_metrics", "plugin"]

#: Upper bounds (seconds) of the append-latency histogram buckets; +Inf is implied.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

_PREFIX = "walstream_"


def _format_bound(value: float) -> str:
    """A bucket bound as Prometheus users see it in ``le`` (``1``, ``0.0005``, ``+Inf``)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _quantile(sorted_values: Sequence[float], fraction: float) -> float:
    """Exact quantile (nearest rank) of a sorted sample; NaN when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class Metrics:
    """Counts what the engine reports through the ``walstream_*`` hooks.

    Append latency is kept twice: a fixed-bucket histogram over the whole life of the process
    (what Prometheus aggregates) and the exact latencies of the most recent
    ``latency_window`` appends, from which :meth:`summary` and the ``quantile`` gauges compute
    exact p50/p99 of current behaviour in bounded memory.
    """

    def __init__(
        self,
        latency_buckets_s: Sequence[float] = LATENCY_BUCKETS_S,
        latency_window: int = 4096,
    ) -> None:
        if list(latency_buckets_s) != sorted(set(latency_buckets_s)):
            raise ValueError("latency buckets must be strictly increasing")
        if latency_window < 1:
            raise ValueError("latency_window must be at least 1")
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        """This instance's prometheus-client registry (it holds this collector only)."""
        self._bucket_bounds = tuple(float(bound) for bound in latency_buckets_s)
        self._bucket_counts = [0] * (len(self._bucket_bounds) + 1)  # the last is +Inf
        self._recent_latencies: deque[float] = deque(maxlen=latency_window)
        self.appends = 0
        self.appended_records = 0
        self.appended_bytes = 0
        self.append_latency_sum_s = 0.0
        self.uploaded_objects: dict[str, int] = {}
        self.uploaded_bytes: dict[str, int] = {}
        self.commits = 0
        self.committed_objects = 0
        self.committed_bytes = 0
        self.committed_wal_offset: dict[int, int] = {}
        self.recoveries: dict[bool, int] = {}
        self.recovered_records = 0
        self.recovered_batches = 0
        self.recovery_dropped_batches = 0
        self.compactions = 0
        self.compaction_source_objects = 0
        self.compaction_new_objects = 0
        self.compacted_bytes = 0
        self.reads: dict[str, int] = {}
        self.read_records: dict[str, int] = {}
        self.read_bytes: dict[str, int] = {}
        self.registry.register(self)

    # -- hook implementations -------------------------------------------------------------

    @hookimpl
    def walstream_wal_appended(self, records: int, size_bytes: int, latency_s: float) -> None:
        with self._lock:
            self.appends += 1
            self.appended_records += records
            self.appended_bytes += size_bytes
            self.append_latency_sum_s += latency_s
            self._bucket_counts[bisect.bisect_left(self._bucket_bounds, latency_s)] += 1
            self._recent_latencies.append(latency_s)

    @hookimpl
    def walstream_object_uploaded(self, size_bytes: int, kind: str) -> None:
        with self._lock:
            self.uploaded_objects[kind] = self.uploaded_objects.get(kind, 0) + 1
            self.uploaded_bytes[kind] = self.uploaded_bytes.get(kind, 0) + size_bytes

    @hookimpl
    def walstream_object_committed(
        self, node_id: int, object_ids: Sequence[int], size_bytes: int, wal_offset: int
    ) -> None:
        with self._lock:
            self.commits += 1
            self.committed_objects += len(object_ids)
            self.committed_bytes += size_bytes
            self.committed_wal_offset[node_id] = wal_offset

    @hookimpl
    def walstream_recovered(
        self, records: int, batches: int, dropped_batches: int, failover: bool
    ) -> None:
        with self._lock:
            self.recoveries[failover] = self.recoveries.get(failover, 0) + 1
            self.recovered_records += records
            self.recovered_batches += batches
            self.recovery_dropped_batches += dropped_batches

    @hookimpl
    def walstream_compacted(
        self, source_object_ids: Sequence[int], new_object_ids: Sequence[int], size_bytes: int
    ) -> None:
        with self._lock:
            self.compactions += 1
            self.compaction_source_objects += len(source_object_ids)
            self.compaction_new_objects += len(new_object_ids)
            self.compacted_bytes += size_bytes

    @hookimpl
    def walstream_read_served(self, records: int, size_bytes: int, source: str) -> None:
        with self._lock:
            self.reads[source] = self.reads.get(source, 0) + 1
            self.read_records[source] = self.read_records.get(source, 0) + records
            self.read_bytes[source] = self.read_bytes.get(source, 0) + size_bytes

    # -- views ----------------------------------------------------------------------------

    def latency_quantiles(self) -> dict[float, float]:
        """Exact p50 and p99 (seconds) of the most recent appends; NaN before the first."""
        with self._lock:
            recent = sorted(self._recent_latencies)
        return {0.5: _quantile(recent, 0.5), 0.99: _quantile(recent, 0.99)}

    def summary(self) -> dict[str, Any]:
        """The numbers as a JSON-friendly dict (``walstream bench``, the HTTP status page)."""
        quantiles = self.latency_quantiles()
        with self._lock:
            cumulative = 0
            buckets: dict[str, int] = {}
            for bound, count in zip(
                (*self._bucket_bounds, math.inf), self._bucket_counts, strict=True
            ):
                cumulative += count
                buckets[_format_bound(bound)] = cumulative
            return {
                "wal": {
                    "appends": self.appends,
                    "records": self.appended_records,
                    "bytes": self.appended_bytes,
                    "latency_sum_s": self.append_latency_sum_s,
                    "latency_p50_s": None if math.isnan(quantiles[0.5]) else quantiles[0.5],
                    "latency_p99_s": None if math.isnan(quantiles[0.99]) else quantiles[0.99],
                    "latency_buckets": buckets,
                },
                "objects": {
                    "uploaded": dict(self.uploaded_objects),
                    "uploaded_bytes": dict(self.uploaded_bytes),
                    "commits": self.commits,
                    "committed": self.committed_objects,
                    "committed_bytes": self.committed_bytes,
                    "committed_wal_offset": dict(self.committed_wal_offset),
                },
                "recoveries": {
                    "restart": self.recoveries.get(False, 0),
                    "failover": self.recoveries.get(True, 0),
                    "records": self.recovered_records,
                    "batches": self.recovered_batches,
                    "dropped_batches": self.recovery_dropped_batches,
                },
                "compactions": {
                    "runs": self.compactions,
                    "source_objects": self.compaction_source_objects,
                    "new_objects": self.compaction_new_objects,
                    "bytes": self.compacted_bytes,
                },
                "reads": {
                    source: {
                        "reads": self.reads[source],
                        "records": self.read_records.get(source, 0),
                        "bytes": self.read_bytes.get(source, 0),
                    }
                    for source in sorted(self.reads)
                },
            }

    def render_prometheus(self) -> str:
        """All metrics in the Prometheus text exposition format 0.0.4 (from :attr:`registry`)."""
        return generate_latest(self.registry).decode("utf-8")

    def collect(self) -> Iterator[Metric]:
        """The metric families, read consistently under the lock (a prometheus-client
        collector: :attr:`registry` calls it on every scrape)."""
        quantiles = self.latency_quantiles()
        with self._lock:
            yield _counter("wal_appends_total", "Batches acknowledged by the WAL.", self.appends)
            yield _counter(
                "wal_appended_records_total",
                "Records acknowledged by the WAL.",
                self.appended_records,
            )
            yield _counter(
                "wal_appended_bytes_total",
                "Batch bytes acknowledged by the WAL.",
                self.appended_bytes,
            )
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip(
                (*self._bucket_bounds, math.inf), self._bucket_counts, strict=True
            ):
                cumulative += count
                buckets.append((_format_bound(bound), cumulative))
            yield HistogramMetricFamily(
                _PREFIX + "wal_append_latency_seconds",
                "Time from append to WAL acknowledgement.",
                buckets=buckets,
                sum_value=self.append_latency_sum_s,
            )
            yield _labelled(
                GaugeMetricFamily,
                "wal_append_latency_recent_seconds",
                "Exact quantiles of the most recent appends' latency.",
                "quantile",
                [(_format_bound(q), v) for q, v in quantiles.items() if not math.isnan(v)],
            )
            yield _labelled(
                CounterMetricFamily,
                "objects_uploaded_total",
                "Objects written to the object store.",
                "kind",
                sorted(self.uploaded_objects.items()),
            )
            yield _labelled(
                CounterMetricFamily,
                "objects_uploaded_bytes_total",
                "Bytes of objects written to the object store.",
                "kind",
                sorted(self.uploaded_bytes.items()),
            )
            yield _counter("object_commits_total", "Metadata commits of objects.", self.commits)
            yield _counter(
                "objects_committed_total", "Objects committed to metadata.", self.committed_objects
            )
            yield _counter(
                "objects_committed_bytes_total",
                "Bytes of objects committed to metadata.",
                self.committed_bytes,
            )
            yield _labelled(
                GaugeMetricFamily,
                "wal_committed_offset",
                "WAL offset trimmed after the last commit, per node.",
                "node",
                [(str(node), offset) for node, offset in sorted(self.committed_wal_offset.items())],
            )
            yield _labelled(
                CounterMetricFamily,
                "recoveries_total",
                "Recoveries finished (restart or failover).",
                "failover",
                [
                    ("true" if failover else "false", n)
                    for failover, n in sorted(self.recoveries.items())
                ],
            )
            yield _counter(
                "recovered_records_total", "Records recovered from WALs.", self.recovered_records
            )
            yield _counter(
                "recovered_batches_total", "Batches recovered from WALs.", self.recovered_batches
            )
            yield _counter(
                "recovery_dropped_batches_total",
                "WAL batches recovery dropped (already committed or of deleted streams).",
                self.recovery_dropped_batches,
            )
            yield _counter(
                "compactions_total", "Compaction runs that replaced objects.", self.compactions
            )
            yield _counter(
                "compaction_source_objects_total",
                "Objects replaced by compaction.",
                self.compaction_source_objects,
            )
            yield _counter(
                "compaction_new_objects_total",
                "Objects written by compaction.",
                self.compaction_new_objects,
            )
            yield _counter(
                "compacted_bytes_total", "Bytes written by compaction.", self.compacted_bytes
            )
            yield _labelled(
                CounterMetricFamily,
                "reads_total",
                "Reads that returned records, by source.",
                "source",
                sorted(self.reads.items()),
            )
            yield _labelled(
                CounterMetricFamily,
                "read_records_total",
                "Records returned by reads, by source.",
                "source",
                sorted(self.read_records.items()),
            )
            yield _labelled(
                CounterMetricFamily,
                "read_bytes_total",
                "Bytes returned by reads, by source.",
                "source",
                sorted(self.read_bytes.items()),
            )


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(_PREFIX + name, help_text, value=value)


def _labelled(
    family: type[CounterMetricFamily] | type[GaugeMetricFamily],
    name: str,
    help_text: str,
    label: str,
    samples: Iterable[tuple[str, float]],
) -> Metric:
    """A family with one sample per ``(label value, value)``, in the order given."""
    metric = family(_PREFIX + name, help_text, labels=[label])
    for label_value, value in samples:
        metric.add_metric([label_value], value)
    return metric


#: The instance the ``walstream.hooks`` entry point ``metrics`` registers.
plugin = Metrics()


def get_metrics(plugin_manager: pluggy.PluginManager) -> Metrics | None:
    """The :class:`Metrics` registered in ``plugin_manager`` (the ``metrics`` extension first),
    or None when metrics are disabled."""
    named = plugin_manager.get_plugin("metrics")
    if isinstance(named, Metrics):
        return named
    for registered in plugin_manager.get_plugins():
        if isinstance(registered, Metrics):
            return registered
    return None
