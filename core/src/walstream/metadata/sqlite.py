"""SQLite :class:`MetadataStore`: the embedded default, safe for several processes on one machine.

* ``journal_mode=WAL`` so readers never block the writer, ``synchronous=FULL`` so a returned
  commit is fsynced, and ``BEGIN IMMEDIATE`` for every write transaction so two processes never
  both read-then-write the same rows (the second waits up to ``busy_timeout``).
* One connection, used only by a dedicated single-thread executor: the event loop never blocks
  on SQLite.
* The schema carries a ``schema_version`` row; a file written by a newer walstream is refused.
* The meaning of every change (continuity, epochs, compaction cover …) comes from the shared
  rules in :mod:`walstream.metadata.rules`; this module loads the rows a call touches, asks the
  rule, and writes the result in the same transaction.
* The schema, the row codecs and the per-transaction table access are in
  :mod:`walstream.metadata.sqlite_tables`; the basin methods in
  :mod:`walstream.metadata.sqlite_basins`.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from walstream.clock import Clock, SystemClock
from walstream.config.factory import BackendFactory, BuildContext
from walstream.config.options import Option
from walstream.errors import (
    BackendUnavailable,
    InvalidArgument,
    StreamExists,
)
from walstream.metadata.contract import (
    DataLossGap,
    MetadataStore,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamInfo,
    StreamState,
)
from walstream.metadata.rules import (
    check_claim,
    check_data_loss_range,
    check_object_limit,
    check_prepare_args,
    check_release,
    check_stream_name,
    plan_commit,
    plan_data_loss,
    plan_replace,
    require_node_epoch,
    require_stream_epoch,
    stream_not_found,
)
from walstream.metadata.sqlite_basins import SqliteBasins
from walstream.metadata.sqlite_nodes import SqliteNodes
from walstream.metadata.sqlite_tables import (
    GAP_COLUMNS,
    MAX_OFFSET,
    SCHEMA_VERSION,
    STREAM_COLUMNS,
    Tables,
    gap_of,
    id_chunks,
    open_connection,
    placeholders,
    range_of,
    stream_of,
    transaction,
    translate_error,
)
from walstream.records import DEPLOYMENT_ID_BYTES

__all__ = ["SCHEMA_VERSION", "SQLITE_METADATA", "SqliteMetadataStore"]

T = TypeVar("T")


class SqliteMetadataStore(SqliteNodes, SqliteBasins, MetadataStore):
    """Metadata in one SQLite file, shared safely by the processes of one machine."""

    def __init__(
        self, path: str | Path, busy_timeout_s: float = 30.0, clock: Clock | None = None
    ) -> None:
        self._path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._clock: Clock = clock or SystemClock()
        self._deployment_id: bytes | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walstream-sqlite")
        self._connection: sqlite3.Connection | None = None  # touched only on the executor thread
        self._closed = False

    @property
    def path(self) -> Path:
        return self._path

    # -- plumbing ---------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # Runs on the executor thread only; the first call opens the file and checks the schema.
        if self._connection is None:
            self._connection = open_connection(self._path, self._busy_timeout_s)
        return self._connection

    def _run(self, write: bool, work: Callable[[Tables], T]) -> T:
        try:
            return transaction(self._connect(), write, work)
        except sqlite3.Error as error:
            raise translate_error(error, self._path, self._busy_timeout_s) from error

    async def _call(self, write: bool, work: Callable[[Tables], T]) -> T:
        if self._closed:
            raise BackendUnavailable(
                f"sqlite metadata {str(self._path)!r} is closed; open a new store"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, write, work)

    async def _write(self, work: Callable[[Tables], T]) -> T:
        return await self._call(True, work)

    async def _read(self, work: Callable[[Tables], T]) -> T:
        return await self._call(False, work)

    # -- identity ---------------------------------------------------------------------------------

    async def deployment_id(self) -> bytes:
        def work(tables: Tables) -> bytes:
            row = tables.db.execute(
                "SELECT deployment_id FROM deployment WHERE singleton = 0"
            ).fetchone()
            if row is not None:
                return bytes(row[0])
            created = os.urandom(DEPLOYMENT_ID_BYTES)
            tables.db.execute(
                "INSERT INTO deployment (singleton, deployment_id) VALUES (0, ?)", (created,)
            )
            return created

        if self._deployment_id is None:
            self._deployment_id = await self._write(work)
        return self._deployment_id

    # -- streams ----------------------------------------------------------------------------------

    async def create_stream(self, name: str | None) -> StreamInfo:
        check_stream_name(name)
        created_ms = self._clock.now_ms()

        def work(tables: Tables) -> StreamInfo:
            if name is not None:
                existing = tables.active_stream_named(name)
                if existing is not None:
                    raise StreamExists(
                        f"stream {name!r} already exists (id {existing.stream_id}); open it "
                        "instead, or delete it first"
                    )
            stream_id = (tables.meta("last_stream_id") or 0) + 1
            tables.set_meta("last_stream_id", stream_id)
            stream = StreamInfo(
                stream_id, name, 0, 0, 0, StreamState.ACTIVE, None, None, created_ms
            )
            tables.db.execute(
                f"INSERT INTO streams ({STREAM_COLUMNS}) VALUES (?, ?, 0, 0, 0, 'active', "
                "NULL, NULL, ?)",
                (stream_id, name, created_ms),
            )
            return stream

        return await self._write(work)

    async def get_stream(self, name_or_id: str | int) -> StreamInfo:
        def work(tables: Tables) -> StreamInfo:
            if isinstance(name_or_id, int):
                return tables.active_stream(name_or_id)
            stream = tables.active_stream_named(name_or_id)
            if stream is None:
                raise stream_not_found(name_or_id)
            return stream

        return await self._read(work)

    async def get_streams(self, stream_ids: Sequence[int]) -> dict[int, StreamInfo]:
        ids = list(stream_ids)
        found = await self._read(lambda tables: tables.streams(ids))
        return {stream_id: found[stream_id] for stream_id in ids if stream_id in found}

    async def list_streams(self, prefix: str = "") -> list[StreamInfo]:
        def work(tables: Tables) -> list[StreamInfo]:
            if prefix:
                rows = tables.db.execute(
                    f"SELECT {STREAM_COLUMNS} FROM streams WHERE state = 'active' "
                    "AND substr(name, 1, ?) = ? ORDER BY stream_id",
                    (len(prefix), prefix),
                )
            else:
                rows = tables.db.execute(
                    f"SELECT {STREAM_COLUMNS} FROM streams WHERE state = 'active' "
                    "ORDER BY stream_id"
                )
            return [stream_of(row) for row in rows]

        return await self._read(work)

    async def delete_stream(self, stream_id: int) -> None:
        def work(tables: Tables) -> None:
            stream = tables.stream(stream_id)
            if stream is None:
                raise stream_not_found(stream_id)
            if stream.state is StreamState.DELETED:
                return
            tables.db.execute(
                "UPDATE streams SET state = 'deleted' WHERE stream_id = ?", (stream_id,)
            )
            candidates = [
                row[0]
                for row in tables.db.execute(
                    "SELECT DISTINCT object_id FROM ranges WHERE stream_id = ?", (stream_id,)
                )
            ]
            tables.destroy_dead(candidates)

        await self._write(work)

    async def claim_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        def work(tables: Tables) -> StreamInfo:
            stream = tables.active_stream(stream_id)
            owner_id = stream.owner_node_id
            owner = tables.node(owner_id) if owner_id is not None else None
            claimed = check_claim(stream, tables.node(node_id), owner, node_id, node_epoch)
            tables.put_stream(claimed)
            return claimed

        return await self._write(work)

    async def release_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        def work(tables: Tables) -> StreamInfo:
            stream = tables.active_stream(stream_id)
            released = check_release(stream, tables.node(node_id), node_id, node_epoch)
            tables.put_stream(released)
            return released

        return await self._write(work)

    async def release_streams(self, node_id: int, node_epoch: int) -> None:
        def work(tables: Tables) -> None:
            require_node_epoch(tables.node(node_id), node_id, node_epoch)
            tables.db.execute(
                "UPDATE streams SET owner_node_id = NULL WHERE owner_node_id = ?", (node_id,)
            )

        await self._write(work)

    async def trim_stream(self, stream_id: int, epoch: int, new_start: int) -> StreamInfo:
        def work(tables: Tables) -> StreamInfo:
            stream = tables.active_stream(stream_id)
            require_stream_epoch(stream, epoch, "trim")
            if new_start < 0:
                raise InvalidArgument(f"trim_stream: new start {new_start} is negative")
            if new_start <= stream.start_offset:
                return stream
            trimmed = StreamInfo(
                stream.stream_id,
                stream.name,
                stream.epoch,
                new_start,
                stream.committed_end,
                stream.state,
                stream.owner_node_id,
                stream.fencing_token,
                stream.created_ms,
            )
            tables.put_stream(trimmed)
            # Only ranges that just died can leave an object with no live range.
            candidates = [
                row[0]
                for row in tables.db.execute(
                    "SELECT DISTINCT object_id FROM ranges WHERE stream_id = ? "
                    "AND end_offset > ? AND end_offset <= ?",
                    (stream_id, stream.start_offset, new_start),
                )
            ]
            tables.destroy_dead(candidates)
            return trimmed

        return await self._write(work)

    async def set_fencing_token(self, stream_id: int, epoch: int, token: str | None) -> None:
        def work(tables: Tables) -> None:
            stream = tables.active_stream(stream_id)
            require_stream_epoch(stream, epoch, "set the fencing token of")
            tables.db.execute(
                "UPDATE streams SET fencing_token = ? WHERE stream_id = ?", (token, stream_id)
            )

        await self._write(work)

    # -- objects ----------------------------------------------------------------------------------

    async def prepare_objects(self, count: int, ttl_ms: int) -> list[int]:
        check_prepare_args(count, ttl_ms)
        expires_ms = self._clock.now_ms() + ttl_ms

        def work(tables: Tables) -> list[int]:
            last = tables.meta("last_object_id") or 0
            object_ids = list(range(last + 1, last + count + 1))
            tables.set_meta("last_object_id", last + count)
            tables.db.executemany(
                "INSERT INTO objects (object_id, state, expires_ms) VALUES (?, 'prepared', ?)",
                [(object_id, expires_ms) for object_id in object_ids],
            )
            return object_ids

        return await self._write(work)

    async def commit_objects(
        self, node_id: int, node_epoch: int, objects: Sequence[ObjectCommit]
    ) -> None:
        commits = list(objects)
        now_ms = self._clock.now_ms()

        def work(tables: Tables) -> None:
            streams = tables.streams(r.stream_id for c in commits for r in c.ranges)
            records = tables.records(c.object_id for c in commits)
            plan = plan_commit(
                tables.node(node_id), node_id, node_epoch, commits, streams, records, now_ms
            )
            if plan is None:
                return
            tables.db.executemany(
                "UPDATE streams SET committed_end = ? WHERE stream_id = ?",
                [(end, stream_id) for stream_id, end in plan.stream_ends.items()],
            )
            for info in plan.objects:
                tables.put_object(info)

        await self._write(work)

    async def replace_objects(
        self, source_ids: Sequence[int], new_objects: Sequence[ObjectCommit]
    ) -> None:
        sources = list(source_ids)
        commits = list(new_objects)
        now_ms = self._clock.now_ms()

        def work(tables: Tables) -> None:
            records = tables.records([*sources, *(c.object_id for c in commits)])
            stream_ids = [r.stream_id for c in commits for r in c.ranges]
            for source_id in sources:
                if source_id in records:
                    stream_ids.extend(r.stream_id for r in records[source_id].info.ranges)
            final = plan_replace(sources, commits, tables.streams(stream_ids), records, now_ms)
            tables.set_object_state(sources, ObjectState.MARK_DESTROYED)
            for info in final:
                tables.put_object(info)

        await self._write(work)

    async def get_objects(
        self, stream_id: int, start_offset: int, end_offset: int | None = None, limit: int = 100
    ) -> list[ObjectInfo]:
        check_object_limit(limit)
        end = MAX_OFFSET if end_offset is None else end_offset

        def work(tables: Tables) -> list[ObjectInfo]:
            # COMMITTED ranges of one stream never overlap (continuity; compaction swaps whole
            # ranges), so end order is start order and the (stream_id, end_offset) index serves
            # both the filter and the order: the scan stops after ``limit`` rows.
            rows = tables.db.execute(
                "SELECT o.object_id, o.key, o.kind, o.size, o.index_size, o.committed_ms, "
                "r.stream_id, r.start_offset, r.end_offset, r.epoch, r.min_timestamp_ms, "
                "r.max_timestamp_ms "
                "FROM ranges AS r JOIN objects AS o ON o.object_id = r.object_id "
                "WHERE r.stream_id = ? AND r.end_offset > ? AND r.start_offset < ? "
                "AND o.state = 'committed' ORDER BY r.end_offset LIMIT ?",
                (stream_id, start_offset, end, limit),
            )
            return [
                ObjectInfo(
                    object_id=row[0],
                    key=row[1],
                    kind=ObjectKind(row[2]),
                    state=ObjectState.COMMITTED,
                    size=row[3],
                    index_size=row[4],
                    ranges=(range_of(row[6:]),),
                    committed_ms=row[5],
                )
                for row in rows
            ]

        return await self._read(work)

    async def list_objects(
        self, state: ObjectState | None = None, kind: ObjectKind | None = None
    ) -> list[ObjectInfo]:
        filters: list[str] = []
        values: list[str] = []
        if state is not None:
            filters.append("state = ?")
            values.append(state.value)
        if kind is not None:
            filters.append("kind = ?")
            values.append(kind.value)
        where = f"WHERE {' AND '.join(filters)}" if filters else ""

        def work(tables: Tables) -> list[ObjectInfo]:
            rows = tables.db.execute(f"SELECT object_id FROM objects {where}", values)
            ids = [row[0] for row in rows]
            records = tables.records(ids)
            return [records[object_id].info for object_id in sorted(records)]

        return await self._read(work)

    async def expired_prepared(self, now_ms: int) -> list[int]:
        def work(tables: Tables) -> list[int]:
            ids = [
                row[0]
                for row in tables.db.execute(
                    "SELECT object_id FROM objects WHERE state = 'prepared' AND expires_ms <= ? "
                    "ORDER BY object_id",
                    (now_ms,),
                )
            ]
            tables.db.executemany(
                "UPDATE objects SET expired = 1 WHERE object_id = ?", [(i,) for i in ids]
            )
            return ids

        return await self._write(work)

    async def forget_objects(self, object_ids: Sequence[int]) -> None:
        """Ids in other states (or unknown) are left alone."""
        ids = list(object_ids)

        def work(tables: Tables) -> None:
            for chunk in id_chunks(ids):
                marks = placeholders(len(chunk))
                doomed = [
                    row[0]
                    for row in tables.db.execute(
                        f"SELECT object_id FROM objects WHERE object_id IN ({marks}) "
                        "AND (state = 'mark_destroyed' OR (state = 'prepared' AND expired = 1))",
                        chunk,
                    )
                ]
                if doomed:
                    doomed_marks = placeholders(len(doomed))
                    tables.db.execute(
                        f"DELETE FROM ranges WHERE object_id IN ({doomed_marks})", doomed
                    )
                    tables.db.execute(
                        f"DELETE FROM objects WHERE object_id IN ({doomed_marks})", doomed
                    )

        await self._write(work)

    # -- data loss --------------------------------------------------------------------------------

    async def record_data_loss(self, node_id: int, node_epoch: int, gap: DataLossGap) -> StreamInfo:
        now_ms = self._clock.now_ms()

        def work(tables: Tables) -> StreamInfo:
            stream = tables.stream(gap.stream_id)
            row = tables.db.execute(
                f"SELECT {GAP_COLUMNS} FROM data_loss WHERE stream_id = ? AND start_offset = ?",
                (gap.stream_id, gap.start_offset),
            ).fetchone()
            changed = plan_data_loss(
                tables.node(node_id),
                node_id,
                node_epoch,
                stream,
                gap,
                None if row is None else gap_of(row),
            )
            if changed is None:
                assert stream is not None
                return stream
            tables.db.execute(
                "UPDATE streams SET committed_end = ? WHERE stream_id = ?",
                (changed.committed_end, changed.stream_id),
            )
            tables.db.execute(
                f"INSERT INTO data_loss ({GAP_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                (gap.stream_id, gap.start_offset, gap.end_offset, gap.reason, now_ms),
            )
            return changed

        return await self._write(work)

    async def get_data_loss(
        self, stream_id: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[DataLossGap]:
        check_data_loss_range(stream_id, start_offset, end_offset)
        end = MAX_OFFSET if end_offset is None else end_offset

        def work(tables: Tables) -> list[DataLossGap]:
            rows = tables.db.execute(
                f"SELECT {GAP_COLUMNS} FROM data_loss WHERE stream_id = ? AND end_offset > ? "
                "AND start_offset < ? ORDER BY start_offset",
                (stream_id, start_offset, end),
            )
            return [gap_of(row) for row in rows]

        return await self._read(work)

    # -- lifecycle --------------------------------------------------------------------------------

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._close_connection)
        finally:
            self._executor.shutdown(wait=False)

    def describe(self) -> dict[str, Any]:
        return {"type": "sqlite", "path": str(self._path)}


def _make_sqlite_metadata(options: dict[str, Any], context: BuildContext) -> SqliteMetadataStore:
    return SqliteMetadataStore(options["path"], busy_timeout_s=options["busy_timeout"])


SQLITE_METADATA: BackendFactory[SqliteMetadataStore] = BackendFactory(
    kind="metadata",
    name="sqlite",
    description="metadata in one SQLite file (embedded default; several processes of one machine)",
    options=(
        Option("path", "path", "the database file (its folder is created)", required=True),
        Option(
            "busy_timeout",
            "duration",
            "how long a write waits for another process's transaction",
            default="30s",
        ),
    ),
    create=_make_sqlite_metadata,
)
