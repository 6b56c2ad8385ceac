"""The ``walstream`` Spark data source: batch and streaming reads, batch and streaming writes.

Reads (``spark.read`` / ``spark.readStream``)::

    spark.read.format("walstream")
        .option("config", "deploy.yaml")          # the deployment (its objects + metadata)
        .option("streams", "clicks,orders")
        .option("startingOffsets", "earliest")    # or "latest" or '{"clicks": 42}'
        .option("endingOffsets", "latest")        # batch only
        .option("fromTimestamp", 1700000000000)   # optional, ms since the epoch
        .option("encryptionKey", "aegis-256:...") # encrypted streams: CIPHER:BASE64 of the key
        .load()

Schema: ``stream string, offset long, timestamp timestamp, key binary, value binary,
headers map<string,binary>``.

**What Spark sees**: data committed to object storage. The driver plans partitions from
metadata and executors read objects directly, without a walstream node. A record acknowledged
by a node becomes visible to Spark once its node uploads it (``upload.max_interval``, 250 ms by
default, or ``client.flush()``). Trimmed records are never returned; compaction rewriting the
objects changes nothing in the results.

**Streaming**: the Spark offset is ``{"stream": next_offset, ...}``; ``latestOffset`` is each
stream's committed tail. ``startingOffsets`` (default ``latest``) applies to a new query only;
a restarted query resumes from its checkpoint. ``maxRecordsPerTrigger`` bounds a micro-batch
(shared across the streams); ``trigger(availableNow=True)`` processes what is committed when the
query starts, in micro-batches that honour that bound. Records trimmed while a query was
stopped are skipped.

Options for partitioning: ``partitionBytes`` (default 64 MiB) and ``partitionRecords``
(default 1,000,000) bound each read task.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType
from walstream.encryption import EncryptionKey
from walstream.errors import ConfigError, StreamNotFound
from walstream.metadata import StreamInfo

from .options import (
    EARLIEST,
    LATEST,
    optional_bool,
    optional_int,
    parse_offsets,
    parse_streams,
    required,
)
from .planning import ReadSlice, StreamRequest, plan_slices, resolve_requests
from .reading import SCHEMA, read_slice_batches
from .runtime import backends_for, run
from .user_errors import shortened, user_errors

__all__ = ["WalstreamDataSource", "WalstreamReader", "WalstreamStreamReader"]

_DEFAULT_PARTITION_BYTES = 64 << 20
_DEFAULT_PARTITION_RECORDS = 1_000_000


class SlicePartition(InputPartition):
    def __init__(self, piece: ReadSlice) -> None:
        super().__init__(piece)
        self.piece = piece


class WalstreamDataSource(DataSource):
    """``format("walstream")``; register with :func:`walstream_spark.register`."""

    @classmethod
    def name(cls) -> str:
        return "walstream"

    @user_errors
    def schema(self) -> str:
        """The fixed schema. Spark asks for it in ``load()`` of a read or a readStream (never
        for a write), so this is where a read's mistakes are found: the options, the deployment
        file and every stream are checked here, and the first one wrong fails ``load()`` with
        one line that names it and the fix, before any query runs."""
        options = _ReadOptions(self.options)
        # Validity only; a stream reader re-parses them with its own defaults.
        parse_offsets(self.options, "startingOffsets", EARLIEST)
        parse_offsets(self.options, "endingOffsets", LATEST)
        optional_int(self.options, "fromTimestamp", None)
        optional_int(self.options, "maxRecordsPerTrigger", None, 1)
        options.stream_infos()
        return SCHEMA

    @user_errors
    def reader(self, schema: StructType) -> DataSourceReader:
        return WalstreamReader(self.options)

    @user_errors
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return WalstreamStreamReader(self.options)

    @user_errors
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .writing import WalstreamWriter

        return WalstreamWriter(self.options, schema, overwrite)

    @user_errors
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .writing import WalstreamStreamWriter

        return WalstreamStreamWriter(self.options, schema, overwrite)


class _ReadOptions:
    def __init__(self, options: Mapping[str, str]) -> None:
        self.config = required(options, "config", "deploy.yaml")
        self.streams = parse_streams(options)
        self.partition_bytes = optional_int(options, "partitionBytes", _DEFAULT_PARTITION_BYTES, 1)
        self.partition_records = optional_int(
            options, "partitionRecords", _DEFAULT_PARTITION_RECORDS, 1
        )
        self.fail_on_data_loss = optional_bool(options, "failOnDataLoss", True)
        self.encryption_key = options.get("encryptionKey") or None
        """``CIPHER:BASE64`` of encrypted streams (checked here, parsed again in each task)."""
        if self.encryption_key is not None:
            EncryptionKey.parse(self.encryption_key)

    def plan(self, requests: list[StreamRequest]) -> list[SlicePartition]:
        backends = backends_for(self.config)
        assert self.partition_bytes is not None and self.partition_records is not None
        slices = run(
            plan_slices(
                backends.metadata,
                requests,
                self.partition_bytes,
                self.partition_records,
                self.fail_on_data_loss,
            )
        )
        return [SlicePartition(piece) for piece in slices]

    def stream_infos(self) -> dict[str, StreamInfo]:
        """Every stream's info; StreamNotFound names the deployment and the commands to see or
        create the stream."""
        metadata = backends_for(self.config).metadata
        infos = {}
        for name in self.streams:
            try:
                infos[name] = run(metadata.get_stream(name))
            except StreamNotFound as missing:
                raise StreamNotFound(
                    f"no stream {name!r} in the deployment {self.config}: list its streams with "
                    f"`walstream -c {self.config} streams list`, or create it with "
                    f"`walstream -c {self.config} streams create {name}`"
                ) from missing
        return infos


def _read(
    config: str, partition: InputPartition, encryption: str | None = None
) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, SlicePartition):
        return  # Spark's placeholder when the plan has no slice at all
    with shortened():
        key = None if not encryption else EncryptionKey.parse(encryption)
        yield from read_slice_batches(backends_for(config), partition.piece, key)


class WalstreamReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = _ReadOptions(options)
        self.starting = parse_offsets(options, "startingOffsets", EARLIEST)
        self.ending = parse_offsets(options, "endingOffsets", LATEST)
        self.from_timestamp_ms = optional_int(options, "fromTimestamp", None)

    @user_errors
    def partitions(self) -> Sequence[InputPartition]:
        metadata = backends_for(self.options.config).metadata
        requests = run(
            resolve_requests(
                metadata, self.options.streams, self.starting, self.ending, self.from_timestamp_ms
            )
        )
        return self.options.plan(requests)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options.config, partition, self.options.encryption_key)


class WalstreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets are ``{"stream name": next offset}``."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = _ReadOptions(options)
        self.starting = parse_offsets(options, "startingOffsets", LATEST)
        if "endingOffsets" in options:
            raise ConfigError("option 'endingOffsets' is for batch reads; a stream has no end")
        self.max_records = optional_int(options, "maxRecordsPerTrigger", None, 1)
        self._target: dict[str, int] | None = None

    @user_errors
    def initialOffset(self) -> dict[str, int]:
        return {
            name: self.starting.resolve(name, info)
            for name, info in self.options.stream_infos().items()
        }

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    @user_errors
    def prepareForTriggerAvailableNow(self) -> None:
        # availableNow: nothing committed after this moment is read by this run.
        self._target = self._committed_tails()

    @user_errors
    def reportLatestOffset(self) -> dict[str, int]:
        return self._committed_tails()

    @user_errors
    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        tails = self._committed_tails()
        if self._target is not None:
            tails = {name: min(tail, self._target.get(name, tail)) for name, tail in tails.items()}
        begin = self._positions(start)
        available = {name: max(0, tails[name] - begin[name]) for name in self.options.streams}
        if isinstance(limit, ReadMinRows) and sum(available.values()) < limit.min_rows:
            return begin
        if isinstance(limit, ReadMaxRows):
            available = _share(available, limit.max_rows, self.options.streams)
        return {name: begin[name] + available[name] for name in self.options.streams}

    @user_errors
    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        begin = self._positions(start)
        infos = self.options.stream_infos()
        requests = []
        for name in self.options.streams:
            info = infos[name]
            low = max(begin[name], info.start_offset)
            high = min(int(end.get(name, begin[name])), info.committed_end)
            if high > low:
                requests.append(StreamRequest(name, info.stream_id, low, high))
        return self.options.plan(requests)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options.config, partition, self.options.encryption_key)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: walstream keeps records until they are trimmed."""

    def _committed_tails(self) -> dict[str, int]:
        return {name: info.committed_end for name, info in self.options.stream_infos().items()}

    def _positions(self, start: dict[str, Any]) -> dict[str, int]:
        """Offsets per configured stream; a stream added to ``streams`` after the checkpoint was
        written starts at ``startingOffsets``."""
        positions = {
            name: int(value) for name, value in start.items() if name in self.options.streams
        }
        missing = [name for name in self.options.streams if name not in positions]
        if missing:
            infos = self.options.stream_infos()
            for name in missing:
                positions[name] = self.starting.resolve(name, infos[name])
        return positions


def _share(available: dict[str, int], budget: int, order: list[str]) -> dict[str, int]:
    """Split ``budget`` records fairly across streams (water filling, deterministic)."""
    granted = dict.fromkeys(order, 0)
    active = [name for name in order if available[name] > 0]
    while budget > 0 and active:
        share = max(1, budget // len(active))
        for name in list(active):
            take = min(share, available[name] - granted[name], budget)
            granted[name] += take
            budget -= take
            if granted[name] == available[name]:
                active.remove(name)
            if budget == 0:
                break
    return granted
