"""Batch and streaming writes: ``df.write.format("walstream").option("stream", "out")``.

Rows need a ``value`` column (binary or string); ``key`` (binary/string), ``headers``
(map<string, binary or string>) and ``timestamp`` (timestamp) are optional. Other columns are
ignored.

How a task writes
-----------------
Each task with rows runs a short-lived walstream node of its own: node id derived from the write
and the partition (``WRITER_NODE_BASE`` + a hash), an in-memory WAL, the deployment's object store
and metadata. It appends its rows in batches (``batchRecords``, ``batchBytes``), then flushes
them to object storage and closes the node (state STOPPED, stream released) before it reports
success. A task therefore succeeds only once its records are committed — the in-memory WAL is
never the only copy of a successful task's data.

A stream has one writer at a time (its owner node). Tasks writing the same stream take turns:
a task waits (up to ``ownershipTimeout``, default 300 s) while another *running* node owns the
stream. Do not keep a long-running walstream node writing the same stream as a Spark job.

Writer nodes hold a lease (the deployment's ``cluster:`` section, or its defaults: 3 s, renewed
every 500 ms), so a killed executor does not hold its stream for ``ownershipTimeout``: once the
lease of the owner has expired, a waiting task claims the owner's failover (one conditional
write in the metadata store), marks it FAILED_OVER and releases its streams. A writer's WAL is
in memory: a dead writer has nothing to replay, and nothing it wrote was reported as success
(a task succeeds only once its records are committed), so releasing its streams loses no row.

Retries do not duplicate
------------------------
The last record of every appended batch carries two headers: ``walstream.spark.writer``
(``<write id>/<partition>``) and ``walstream.spark.rows`` (rows of the task written up to and
including that batch). Batches are atomic, so the newest marker of a writer says exactly how many
of its rows are in the stream. A retried task first registers the same node id, which bumps the
node epoch and fences every older attempt (their late uploads can no longer commit), then finds
its newest marker and skips that many rows.

* Batch writes: the write id is chosen per job on the driver; only retries (attempt > 0) look
  for markers, from the stream's tail at job start. Guarantee: a task retry never duplicates
  or loses rows (given the usual Spark requirement that a retried task sees the same rows in
  the same order). A failed job leaves the rows of its finished tasks (an append-only stream
  has no rollback); running the job again appends them again.
* Streaming writes: the write id is ``<query id>:<batch id>`` (Spark keeps both in the
  checkpoint), so a micro-batch re-run after a restart finds the markers of its earlier run:
  exactly-once output for a deterministic query. Every streaming task scans back from the tail
  until it meets its own marker or one of an earlier batch of the same query.
* ``foreachBatch``: pass ``.option("queryId", ...)`` and ``.option("batchId", batch_id)`` to a
  batch write and it behaves like the streaming writer (a re-run batch skips what it wrote).

Markers trimmed away before a retry cannot be found; the retry then writes its rows again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType
from walstream.config.engine import ClusterConfig
from walstream.engine.client import Client, Stream
from walstream.engine.read import read_committed
from walstream.errors import ConfigError, FencedError, InvalidArgument, StreamExists
from walstream.metadata import NodeState
from walstream.metadata.rules import failover_claimable
from walstream.records import Record, SequencedRecord
from walstream.wal.memory import MemoryWal

from .options import optional_int, required
from .runtime import DeploymentBackends, backends_for, run
from .user_errors import user_errors

__all__ = [
    "MARKER_ROWS",
    "MARKER_WRITER",
    "WRITER_NODE_BASE",
    "WalstreamStreamWriter",
    "WalstreamWriter",
    "WriteCommit",
]

MARKER_WRITER = "walstream.spark.writer"
MARKER_ROWS = "walstream.spark.rows"
#: Writer tasks use node ids from here up (a 48-bit hash is added), far above hand-picked ids.
WRITER_NODE_BASE = 1 << 52

_SCAN_WINDOW_RECORDS = 10_000
_SCAN_WINDOW_MAX_RECORDS = 1_000_000


@dataclass
class WriteCommit(WriterCommitMessage):
    """What one task did: rows appended now, rows a previous attempt had already appended."""

    partition: int
    rows_written: int
    rows_skipped: int
    first_offset: int | None
    end_offset: int | None


@dataclass(frozen=True)
class _Identity:
    write_id: str
    partition: int
    node_key: str
    query_id: str | None = None
    batch_id: int | None = None

    @property
    def writer(self) -> str:
        return f"{self.write_id}/{self.partition}"

    @property
    def node_id(self) -> int:
        digest = hashlib.blake2b(self.node_key.encode(), digest_size=6).digest()
        return WRITER_NODE_BASE + int.from_bytes(digest, "big")

    def is_older_batch(self, writer: str) -> bool:
        """True if ``writer`` is a marker of an earlier micro-batch of the same query."""
        if self.query_id is None or self.batch_id is None:
            return False
        write_id = writer.rsplit("/", 1)[0]
        query_id, _, batch = write_id.rpartition(":")
        return query_id == self.query_id and batch.isdigit() and int(batch) < self.batch_id


class _WriteOptions:
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("walstream streams are append-only: use mode('append')")
        self.config = required(options, "config", "deploy.yaml")
        self.stream = required(options, "stream", "clicks_per_minute")
        self.batch_records = optional_int(options, "batchRecords", 1000, 1) or 1000
        self.batch_bytes = optional_int(options, "batchBytes", 1 << 20, 1) or (1 << 20)
        self.ownership_timeout_s = float(optional_int(options, "ownershipTimeout", 300, 0) or 0)
        create = str(options.get("createStream", "true")).strip().lower()
        self.create_stream = create in ("true", "1", "yes")
        columns = {field.name.lower(): field.name for field in schema.fields}
        if "value" not in columns:
            raise ConfigError(
                f"writing to walstream needs a 'value' column (binary or string); got columns "
                f"{list(schema.fieldNames())}"
            )
        self.columns: dict[str, str] = {
            name: columns[name]
            for name in ("key", "value", "headers", "timestamp")
            if name in columns
        }

    def prepare_stream(self) -> int:
        """Create the target stream if asked to; return its committed tail (driver side)."""
        metadata = backends_for(self.config).metadata
        if self.create_stream:
            try:
                run(metadata.create_stream(self.stream))
            except StreamExists:
                pass
        return run(metadata.get_stream(self.stream)).committed_end


class WalstreamWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.target = _WriteOptions(options, schema, overwrite)
        self.scan_floor = self.target.prepare_stream()
        self.write_id = uuid.uuid4().hex
        # foreachBatch: queryId + batchId make a re-run micro-batch find its earlier writes.
        self.query_id = options.get("queryId")
        self.batch_id = optional_int(options, "batchId", None)
        if (self.query_id is None) != (self.batch_id is None):
            raise ConfigError("options 'queryId' and 'batchId' go together (foreachBatch writes)")

    @user_errors
    def write(self, iterator: Iterator[Row]) -> WriteCommit:
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        if self.query_id is not None and self.batch_id is not None:
            identity = _Identity(
                f"{self.query_id}:{self.batch_id}",
                partition,
                node_key=f"{self.query_id}/{partition}",
                query_id=self.query_id,
                batch_id=self.batch_id,
            )
            return _write_partition(self.target, identity, iterator, True, 0)
        identity = _Identity(self.write_id, partition, node_key=f"{self.write_id}/{partition}")
        return _write_partition(self.target, identity, iterator, attempt > 0, self.scan_floor)

    @user_errors
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: each task's records were committed before the task succeeded."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Records of the tasks that finished stay in the stream (append-only, no rollback)."""


class WalstreamStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.target = _WriteOptions(options, schema, overwrite=False)
        self.target.prepare_stream()

    @user_errors
    def write(self, iterator: Iterator[Row]) -> WriteCommit:
        context = TaskContext.get()
        if context is None:
            raise InvalidArgument("WalstreamStreamWriter.write runs inside a Spark task")
        query_id = context.getLocalProperty("sql.streaming.queryId")
        batch = context.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch is None:
            raise InvalidArgument(
                "the streaming query id or batch id is missing from the task context; this "
                "Spark version does not pass them to Python writers"
            )
        partition = context.partitionId()
        identity = _Identity(
            f"{query_id}:{batch}",
            partition,
            node_key=f"{query_id}/{partition}",
            query_id=query_id,
            batch_id=int(batch),
        )
        return _write_partition(self.target, identity, iterator, True, 0)

    @user_errors
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's records were committed before the task succeeded."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """A re-run of this batch skips what its tasks already wrote (see the module doc)."""


def _to_bytes(value: Any, column: str) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise InvalidArgument(
        f"column {column!r}: expected binary or string, got {type(value).__name__}"
    )


def _record(row: Row, columns: Mapping[str, str]) -> Record:
    value = row[columns["value"]]
    if value is None:
        raise InvalidArgument("column 'value' is null; every record needs a value")
    key = row[columns["key"]] if "key" in columns else None
    headers = row[columns["headers"]] if "headers" in columns else None
    timestamp = row[columns["timestamp"]] if "timestamp" in columns else None
    return Record(
        _to_bytes(value, "value"),
        key=None if key is None else _to_bytes(key, "key"),
        headers=tuple(
            (str(name), _to_bytes(item, "headers")) for name, item in (headers or {}).items()
        ),
        timestamp_ms=None if timestamp is None else _timestamp_ms(timestamp),
    )


def _timestamp_ms(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, int):
        return value
    raise InvalidArgument(f"column 'timestamp': expected a timestamp, got {type(value).__name__}")


def _with_marker(record: Record, identity: _Identity, rows_through: int) -> Record:
    headers = tuple(item for item in record.headers if item[0] not in (MARKER_WRITER, MARKER_ROWS))
    headers += (
        (MARKER_WRITER, identity.writer.encode()),
        (MARKER_ROWS, str(rows_through).encode()),
    )
    return dataclasses.replace(record, headers=headers)


def _write_partition(
    target: _WriteOptions,
    identity: _Identity,
    rows: Iterator[Row],
    check_previous: bool,
    scan_floor: int,
) -> WriteCommit:
    first_row = next(rows, None)
    if first_row is None:
        return WriteCommit(identity.partition, 0, 0, None, None)
    backends = backends_for(target.config)
    client = run(_open_client(backends, identity.node_id))
    try:
        stream = run(client.open_stream(target.stream))
        skip = 0
        if check_previous:
            skip = run(_rows_already_written(backends, stream.stream_id, identity, scan_floor))
        result = _append_rows(client, stream, target, identity, _chain(first_row, rows), skip)
        run(client.flush())  # raises if an upload failed: the task must not report success
    finally:
        run(client.close())
    return result


def _chain(first: Row, rest: Iterator[Row]) -> Iterator[Row]:
    yield first
    yield from rest


def _append_rows(
    client: Client,
    stream: Stream,
    target: _WriteOptions,
    identity: _Identity,
    rows: Iterator[Row],
    skip: int,
) -> WriteCommit:
    deadline = time.monotonic() + target.ownership_timeout_s
    batch: list[Record] = []
    batch_bytes = 0
    through = 0
    first_offset: int | None = None
    end_offset: int | None = None

    def send() -> None:
        nonlocal batch, batch_bytes, first_offset, end_offset
        batch[-1] = _with_marker(batch[-1], identity, through)
        ack = run(_append_owned(client, stream, batch, deadline))
        first_offset = ack.start if first_offset is None else first_offset
        end_offset = ack.end
        batch, batch_bytes = [], 0

    for row in rows:
        through += 1
        if through <= skip:
            continue
        record = _record(row, target.columns)
        batch.append(record)
        batch_bytes += len(record.value) + len(record.key or b"") + 64
        if len(batch) >= target.batch_records or batch_bytes >= target.batch_bytes:
            send()
    if batch:
        send()
    return WriteCommit(
        identity.partition, max(0, through - skip), min(skip, through), first_offset, end_offset
    )


_WRITER_WAL_PREFIX = "spark-writer-"


async def _open_client(backends: DeploymentBackends, node_id: int) -> Client:
    base = backends.engine_config
    config = dataclasses.replace(
        base,
        node_id=node_id,
        compaction=dataclasses.replace(base.compaction, enabled=False),
        cluster=base.cluster or ClusterConfig(),
        advertise=None,
    )
    client = Client(
        wal=MemoryWal(), objects=backends.objects, metadata=backends.metadata, config=config
    )
    # What any node failing this writer over rebuilds: a memory WAL of a name no process has,
    # so it replays nothing (the writer's records live only in its own, dead, process).
    client.wal_section = {"type": "memory", "name": f"{_WRITER_WAL_PREFIX}{uuid.uuid4().hex}"}
    return await client.start()


async def _append_owned(
    client: Client, stream: Stream, records: list[Record], deadline: float
) -> Any:
    """Append, waiting while another running node owns the stream."""
    delay = 0.02
    while True:
        try:
            return await stream.append(records)
        except FencedError:
            owner = await _running_owner(client, stream.stream_id)
            if owner is None or owner == client.node_id:
                raise
            if await _release_if_lease_expired(client, owner):
                continue  # the dead owner's streams are released: claim the stream now
            if time.monotonic() > deadline:
                raise FencedError(
                    f"stream {stream.name!r} stayed owned by node {owner} (running, or failing "
                    "over); stop that writer or raise the ownershipTimeout option"
                ) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


async def _release_if_lease_expired(client: Client, owner: int) -> bool:
    """Claim the failover of ``owner`` if its lease expired and release its streams; True when
    they are released (by this task, or already by the node that won the claim)."""
    node = await client.metadata.get_node(owner)
    if node is None or node.lease_expires_ms == 0:
        return node is not None and node.state is NodeState.FAILED_OVER
    if node.state not in (NodeState.RUNNING, NodeState.FAILING_OVER):
        return node.state is NodeState.FAILED_OVER
    if not _is_writer_wal(node.wal_config):
        return False  # a node with a real WAL is failed over by a walstream node that replays it
    if not failover_claimable(node, await client.metadata.store_time_ms()):
        return False  # it renewed, or another writer's claim (its failover lease) still runs
    # A writer's WAL holds nothing to replay, so the failover lease only has to outlast the two
    # writes below; a writer killed between them leaves it to expire and be claimed again.
    lease_ms = int((client.config.cluster or ClusterConfig()).lease_duration_s * 1000)
    claimed = await client.metadata.claim_failover(owner, node.node_epoch, client.node_id, lease_ms)
    if claimed is None:
        return False  # another writer claimed it first (it releases the streams), or it renewed
    await client.metadata.set_node_state(owner, claimed.node_epoch, NodeState.FAILED_OVER)
    await client.metadata.release_streams(owner, claimed.node_epoch)
    return True


def _is_writer_wal(wal_config: Mapping[str, Any]) -> bool:
    name = wal_config.get("name")
    return (
        wal_config.get("type") == "memory"
        and isinstance(name, str)
        and name.startswith(_WRITER_WAL_PREFIX)
    )


async def _running_owner(client: Client, stream_id: int) -> int | None:
    info = (await client.metadata.get_streams([stream_id])).get(stream_id)
    if info is None or info.owner_node_id is None:
        return None
    node = await client.metadata.get_node(info.owner_node_id)
    # A FAILING_OVER owner is waited for too: its failover finishes, or is claimed again here
    # once the failover lease of the writer that claimed it expires.
    if node is None or node.state not in (NodeState.RUNNING, NodeState.FAILING_OVER):
        return None
    return info.owner_node_id


async def _rows_already_written(
    backends: DeploymentBackends, stream_id: int, identity: _Identity, floor: int
) -> int:
    """Rows of this task that earlier attempts committed, from the newest marker of its writer.

    Scans backwards from the committed tail in growing windows; stops at ``floor``, at the
    stream's start, or (streaming) at a marker of an earlier micro-batch of the same query.
    """
    info = (await backends.metadata.get_streams([stream_id]))[stream_id]
    high = info.committed_end
    low_bound = max(info.start_offset, floor)
    window = _SCAN_WINDOW_RECORDS
    while high > low_bound:
        low = max(low_bound, high - window)
        records: list[SequencedRecord] = [
            record
            async for record in read_committed(
                backends.objects, backends.metadata, stream_id, low, high
            )
        ]
        for record in reversed(records):
            headers = dict(record.headers)
            writer = headers.get(MARKER_WRITER)
            if writer is None:
                continue
            if writer.decode() == identity.writer:
                return int(headers[MARKER_ROWS])
            if identity.is_older_batch(writer.decode()):
                return 0
        high = low
        window = min(window * 2, _SCAN_WINDOW_MAX_RECORDS)
    return 0
