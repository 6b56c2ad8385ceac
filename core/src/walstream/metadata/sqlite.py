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
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from walstream.clock import Clock, SystemClock
from walstream.config.factory import BackendFactory, BuildContext
from walstream.config.options import Option
from walstream.errors import (
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    InvalidArgument,
    StreamExists,
    WalstreamError,
)
from walstream.metadata.contract import (
    DataLossGap,
    MetadataStore,
    NodeInfo,
    NodeState,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamInfo,
    StreamRange,
    StreamState,
)
from walstream.metadata.rules import (
    ObjectRecord,
    all_ranges_dead,
    check_claim,
    check_data_loss_range,
    check_object_limit,
    check_prepare_args,
    check_stream_name,
    encode_wal_config,
    plan_commit,
    plan_data_loss,
    plan_replace,
    require_node_epoch,
    require_stream_epoch,
    stream_not_found,
)
from walstream.records import DEPLOYMENT_ID_BYTES

__all__ = ["SCHEMA_VERSION", "SQLITE_METADATA", "SqliteMetadataStore"]

T = TypeVar("T")

#: Version of the tables below; bump it (and add a migration) whenever they change.
SCHEMA_VERSION = 2

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS meta (
        key TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS streams (
        stream_id INTEGER PRIMARY KEY,
        name TEXT,
        epoch INTEGER NOT NULL,
        start_offset INTEGER NOT NULL,
        committed_end INTEGER NOT NULL,
        state TEXT NOT NULL,
        owner_node_id INTEGER,
        fencing_token TEXT,
        created_ms INTEGER NOT NULL
    )""",
    # At most one ACTIVE stream per name; deleted streams keep their name for history.
    """CREATE UNIQUE INDEX IF NOT EXISTS streams_active_name
        ON streams (name) WHERE state = 'active' AND name IS NOT NULL""",
    "CREATE INDEX IF NOT EXISTS streams_owner ON streams (owner_node_id)",
    """CREATE TABLE IF NOT EXISTS objects (
        object_id INTEGER PRIMARY KEY,
        state TEXT NOT NULL,
        expires_ms INTEGER NOT NULL DEFAULT 0,
        expired INTEGER NOT NULL DEFAULT 0,
        key TEXT NOT NULL DEFAULT '',
        kind TEXT NOT NULL DEFAULT 'stream',
        size INTEGER NOT NULL DEFAULT 0,
        index_size INTEGER NOT NULL DEFAULT 0,
        committed_ms INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX IF NOT EXISTS objects_state ON objects (state, expires_ms)",
    """CREATE TABLE IF NOT EXISTS ranges (
        object_id INTEGER NOT NULL,
        stream_id INTEGER NOT NULL,
        start_offset INTEGER NOT NULL,
        end_offset INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        min_timestamp_ms INTEGER NOT NULL,
        max_timestamp_ms INTEGER NOT NULL
    )""",
    # The read path: objects of one stream past an offset, in offset order.
    "CREATE INDEX IF NOT EXISTS ranges_stream_end ON ranges (stream_id, end_offset)",
    "CREATE INDEX IF NOT EXISTS ranges_object ON ranges (object_id)",
    """CREATE TABLE IF NOT EXISTS nodes (
        node_id INTEGER PRIMARY KEY,
        node_epoch INTEGER NOT NULL,
        state TEXT NOT NULL,
        wal_config TEXT NOT NULL,
        updated_ms INTEGER NOT NULL
    )""",
    # -- version 2 --
    # The deployment's identity, written once (the CHECK keeps it to one row).
    """CREATE TABLE IF NOT EXISTS deployment (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 0),
        deployment_id BLOB NOT NULL
    )""",
    # Offsets an operator recorded as lost (`walstream recover --accept-loss`).
    """CREATE TABLE IF NOT EXISTS data_loss (
        stream_id INTEGER NOT NULL,
        start_offset INTEGER NOT NULL,
        end_offset INTEGER NOT NULL,
        reason TEXT NOT NULL,
        recorded_ms INTEGER NOT NULL,
        PRIMARY KEY (stream_id, start_offset)
    )""",
)

_STREAM_COLUMNS = (
    "stream_id, name, epoch, start_offset, committed_end, state, owner_node_id, fencing_token, "
    "created_ms"
)
_OBJECT_COLUMNS = "object_id, state, expires_ms, expired, key, kind, size, index_size, committed_ms"
_RANGE_COLUMNS = "stream_id, start_offset, end_offset, epoch, min_timestamp_ms, max_timestamp_ms"
_NODE_COLUMNS = "node_id, node_epoch, state, wal_config, updated_ms"
_GAP_COLUMNS = "stream_id, start_offset, end_offset, reason, recorded_ms"
_MAX_OFFSET = (1 << 63) - 1
_IN_CHUNK = 500  # stays far below SQLite's bound on parameters per statement

# Primary result codes (https://sqlite.org/rescode.html).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 10, 11, 13, 14, 26


def _stream(row: Sequence[Any]) -> StreamInfo:
    return StreamInfo(
        stream_id=row[0],
        name=row[1],
        epoch=row[2],
        start_offset=row[3],
        committed_end=row[4],
        state=StreamState(row[5]),
        owner_node_id=row[6],
        fencing_token=row[7],
        created_ms=row[8],
    )


def _range(row: Sequence[Any]) -> StreamRange:
    return StreamRange(row[0], row[1], row[2], row[3], row[4], row[5])


def _node(row: Sequence[Any]) -> NodeInfo:
    return NodeInfo(row[0], row[1], NodeState(row[2]), json.loads(row[3]), row[4])


def _gap(row: Sequence[Any]) -> DataLossGap:
    return DataLossGap(row[0], row[1], row[2], row[3], row[4])


def _chunks(ids: Iterable[int]) -> Iterator[list[int]]:
    unique = sorted(set(ids))
    for first in range(0, len(unique), _IN_CHUNK):
        yield unique[first : first + _IN_CHUNK]


def _placeholders(count: int) -> str:
    return ", ".join("?" * count)


class _Tables:
    """Row access inside one open transaction (runs on the store's executor thread)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.db = connection

    def meta(self, key: str) -> int | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def set_meta(self, key: str, value: int) -> None:
        self.db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def stream(self, stream_id: int) -> StreamInfo | None:
        row = self.db.execute(
            f"SELECT {_STREAM_COLUMNS} FROM streams WHERE stream_id = ?", (stream_id,)
        ).fetchone()
        return None if row is None else _stream(row)

    def active_stream(self, stream_id: int) -> StreamInfo:
        stream = self.stream(stream_id)
        if stream is None or stream.state is not StreamState.ACTIVE:
            raise stream_not_found(stream_id, deleted=stream is not None)
        return stream

    def active_stream_named(self, name: str) -> StreamInfo | None:
        row = self.db.execute(
            f"SELECT {_STREAM_COLUMNS} FROM streams WHERE name = ? AND state = 'active'", (name,)
        ).fetchone()
        return None if row is None else _stream(row)

    def streams(self, stream_ids: Iterable[int]) -> dict[int, StreamInfo]:
        found: dict[int, StreamInfo] = {}
        for chunk in _chunks(stream_ids):
            rows = self.db.execute(
                f"SELECT {_STREAM_COLUMNS} FROM streams "
                f"WHERE stream_id IN ({_placeholders(len(chunk))})",
                chunk,
            )
            for row in rows:
                found[row[0]] = _stream(row)
        return found

    def put_stream(self, stream: StreamInfo) -> None:
        self.db.execute(
            "UPDATE streams SET epoch = ?, start_offset = ?, committed_end = ?, state = ?, "
            "owner_node_id = ?, fencing_token = ? WHERE stream_id = ?",
            (
                stream.epoch,
                stream.start_offset,
                stream.committed_end,
                stream.state.value,
                stream.owner_node_id,
                stream.fencing_token,
                stream.stream_id,
            ),
        )

    def records(self, object_ids: Iterable[int]) -> dict[int, ObjectRecord]:
        rows: list[Sequence[Any]] = []
        ranges: dict[int, list[StreamRange]] = {}
        for chunk in _chunks(object_ids):
            marks = _placeholders(len(chunk))
            rows.extend(
                self.db.execute(
                    f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE object_id IN ({marks})", chunk
                )
            )
            for row in self.db.execute(
                f"SELECT object_id, {_RANGE_COLUMNS} FROM ranges WHERE object_id IN ({marks}) "
                "ORDER BY object_id, stream_id, start_offset",
                chunk,
            ):
                ranges.setdefault(row[0], []).append(_range(row[1:]))
        found: dict[int, ObjectRecord] = {}
        for row in rows:
            object_id = row[0]
            info = ObjectInfo(
                object_id=object_id,
                key=row[4],
                kind=ObjectKind(row[5]),
                state=ObjectState(row[1]),
                size=row[6],
                index_size=row[7],
                ranges=tuple(ranges.get(object_id, ())),
                committed_ms=row[8],
            )
            found[object_id] = ObjectRecord(info, expires_ms=row[2], expired=bool(row[3]))
        return found

    def put_object(self, info: ObjectInfo) -> None:
        """Write a PREPARED object's final state and ranges."""
        self.db.execute(
            "UPDATE objects SET state = ?, key = ?, kind = ?, size = ?, index_size = ?, "
            "committed_ms = ? WHERE object_id = ?",
            (
                info.state.value,
                info.key,
                info.kind.value,
                info.size,
                info.index_size,
                info.committed_ms,
                info.object_id,
            ),
        )
        self.db.executemany(
            f"INSERT INTO ranges (object_id, {_RANGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    info.object_id,
                    r.stream_id,
                    r.start_offset,
                    r.end_offset,
                    r.epoch,
                    r.min_timestamp_ms,
                    r.max_timestamp_ms,
                )
                for r in info.ranges
            ],
        )

    def set_object_state(self, object_ids: Iterable[int], state: ObjectState) -> None:
        self.db.executemany(
            "UPDATE objects SET state = ? WHERE object_id = ?",
            [(state.value, object_id) for object_id in object_ids],
        )

    def destroy_dead(self, object_ids: Iterable[int]) -> None:
        """Mark MARK_DESTROYED the COMMITTED objects among ``object_ids`` with only dead ranges."""
        records = self.records(object_ids)
        streams = self.streams(
            r.stream_id for record in records.values() for r in record.info.ranges
        )
        self.set_object_state(
            (
                object_id
                for object_id, record in records.items()
                if record.info.state is ObjectState.COMMITTED
                and all_ranges_dead(record.info.ranges, streams)
            ),
            ObjectState.MARK_DESTROYED,
        )

    def node(self, node_id: int) -> NodeInfo | None:
        row = self.db.execute(
            f"SELECT {_NODE_COLUMNS} FROM nodes WHERE node_id = ?", (node_id,)
        ).fetchone()
        return None if row is None else _node(row)

    def put_node(self, node: NodeInfo) -> None:
        self.db.execute(
            f"INSERT OR REPLACE INTO nodes ({_NODE_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
            (
                node.node_id,
                node.node_epoch,
                node.state.value,
                encode_wal_config(node.wal_config),
                node.updated_ms,
            ),
        )


def _translate(error: sqlite3.Error, path: Path, busy_timeout_s: float) -> WalstreamError:
    code = getattr(error, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    where = f"sqlite metadata {str(path)!r}"
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return BackendUnavailable(
            f"{where} stayed locked by another process for {busy_timeout_s:g}s ({error}); "
            "retry, raise metadata.busy_timeout, or find the process holding a long transaction"
        )
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return CorruptionError(
            f"{where} is damaged or not a walstream metadata file ({error}); restore it from a "
            "backup or point metadata.path at the right file"
        )
    if primary == _SQLITE_FULL:
        return CapacityError(f"{where}: the disk is full ({error}); free space and retry")
    if primary in (_SQLITE_CANTOPEN, _SQLITE_PERM, _SQLITE_READONLY):
        return BackendUnavailable(
            f"{where} cannot be opened for writing ({error}); check that the folder exists "
            "and this user may write to it"
        )
    if primary == _SQLITE_IOERR:
        return BackendUnavailable(f"{where}: disk I/O error ({error}); check the disk and retry")
    return BackendUnavailable(f"{where} failed ({error}); retry, and check the file if it repeats")


class SqliteMetadataStore(MetadataStore):
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
        if self._connection is not None:
            return self._connection
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise BackendUnavailable(
                f"cannot create the folder of sqlite metadata {str(self._path)!r} ({error}); "
                "check metadata.path and permissions"
            ) from error
        connection = sqlite3.connect(self._path, timeout=self._busy_timeout_s, isolation_level=None)
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ConfigError(
                    f"metadata.path: {str(self._path)!r} cannot use SQLite WAL journaling "
                    f"(got {mode!r}); put it on a local file system"
                )
            connection.execute("PRAGMA synchronous = FULL")
            self._transaction(connection, True, self._ensure_schema)
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        return connection

    def _ensure_schema(self, tables: _Tables) -> None:
        tables.db.execute(_SCHEMA[0])
        version = tables.meta("schema_version")
        if version is not None and version > SCHEMA_VERSION:
            raise ConfigError(
                f"metadata.path: {str(self._path)!r} has schema version {version}, newer than "
                f"this walstream understands ({SCHEMA_VERSION}); upgrade walstream"
            )
        if version == SCHEMA_VERSION:
            return
        for statement in _SCHEMA[1:]:
            tables.db.execute(statement)
        tables.set_meta("schema_version", SCHEMA_VERSION)
        if tables.meta("last_stream_id") is None:
            tables.set_meta("last_stream_id", 0)
            tables.set_meta("last_object_id", 0)

    @staticmethod
    def _transaction(
        connection: sqlite3.Connection, write: bool, work: Callable[[_Tables], T]
    ) -> T:
        # Writes take the write lock up front: two processes never both read-then-write.
        connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = work(_Tables(connection))
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return result

    def _run(self, write: bool, work: Callable[[_Tables], T]) -> T:
        try:
            return self._transaction(self._connect(), write, work)
        except sqlite3.Error as error:
            raise _translate(error, self._path, self._busy_timeout_s) from error

    async def _call(self, write: bool, work: Callable[[_Tables], T]) -> T:
        if self._closed:
            raise BackendUnavailable(
                f"sqlite metadata {str(self._path)!r} is closed; open a new store"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, write, work)

    async def _write(self, work: Callable[[_Tables], T]) -> T:
        return await self._call(True, work)

    async def _read(self, work: Callable[[_Tables], T]) -> T:
        return await self._call(False, work)

    # -- identity ---------------------------------------------------------------------------------

    async def deployment_id(self) -> bytes:
        def work(tables: _Tables) -> bytes:
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

        def work(tables: _Tables) -> StreamInfo:
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
                f"INSERT INTO streams ({_STREAM_COLUMNS}) VALUES (?, ?, 0, 0, 0, 'active', "
                "NULL, NULL, ?)",
                (stream_id, name, created_ms),
            )
            return stream

        return await self._write(work)

    async def get_stream(self, name_or_id: str | int) -> StreamInfo:
        def work(tables: _Tables) -> StreamInfo:
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
        def work(tables: _Tables) -> list[StreamInfo]:
            if prefix:
                rows = tables.db.execute(
                    f"SELECT {_STREAM_COLUMNS} FROM streams WHERE state = 'active' "
                    "AND substr(name, 1, ?) = ? ORDER BY stream_id",
                    (len(prefix), prefix),
                )
            else:
                rows = tables.db.execute(
                    f"SELECT {_STREAM_COLUMNS} FROM streams WHERE state = 'active' "
                    "ORDER BY stream_id"
                )
            return [_stream(row) for row in rows]

        return await self._read(work)

    async def delete_stream(self, stream_id: int) -> None:
        def work(tables: _Tables) -> None:
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
        def work(tables: _Tables) -> StreamInfo:
            stream = tables.active_stream(stream_id)
            owner_id = stream.owner_node_id
            owner = tables.node(owner_id) if owner_id is not None else None
            claimed = check_claim(stream, tables.node(node_id), owner, node_id, node_epoch)
            tables.put_stream(claimed)
            return claimed

        return await self._write(work)

    async def release_streams(self, node_id: int, node_epoch: int) -> None:
        def work(tables: _Tables) -> None:
            require_node_epoch(tables.node(node_id), node_id, node_epoch)
            tables.db.execute(
                "UPDATE streams SET owner_node_id = NULL WHERE owner_node_id = ?", (node_id,)
            )

        await self._write(work)

    async def trim_stream(self, stream_id: int, epoch: int, new_start: int) -> StreamInfo:
        def work(tables: _Tables) -> StreamInfo:
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
        def work(tables: _Tables) -> None:
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

        def work(tables: _Tables) -> list[int]:
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

        def work(tables: _Tables) -> None:
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

        def work(tables: _Tables) -> None:
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
        end = _MAX_OFFSET if end_offset is None else end_offset

        def work(tables: _Tables) -> list[ObjectInfo]:
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
                    ranges=(_range(row[6:]),),
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

        def work(tables: _Tables) -> list[ObjectInfo]:
            rows = tables.db.execute(f"SELECT object_id FROM objects {where}", values)
            ids = [row[0] for row in rows]
            records = tables.records(ids)
            return [records[object_id].info for object_id in sorted(records)]

        return await self._read(work)

    async def expired_prepared(self, now_ms: int) -> list[int]:
        def work(tables: _Tables) -> list[int]:
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

        def work(tables: _Tables) -> None:
            for chunk in _chunks(ids):
                marks = _placeholders(len(chunk))
                doomed = [
                    row[0]
                    for row in tables.db.execute(
                        f"SELECT object_id FROM objects WHERE object_id IN ({marks}) "
                        "AND (state = 'mark_destroyed' OR (state = 'prepared' AND expired = 1))",
                        chunk,
                    )
                ]
                if doomed:
                    doomed_marks = _placeholders(len(doomed))
                    tables.db.execute(
                        f"DELETE FROM ranges WHERE object_id IN ({doomed_marks})", doomed
                    )
                    tables.db.execute(
                        f"DELETE FROM objects WHERE object_id IN ({doomed_marks})", doomed
                    )

        await self._write(work)

    # -- nodes ------------------------------------------------------------------------------------

    async def register_node(self, node_id: int, wal_config: dict[str, Any]) -> NodeInfo:
        config = json.loads(encode_wal_config(wal_config))
        now_ms = self._clock.now_ms()

        def work(tables: _Tables) -> NodeInfo:
            previous = tables.node(node_id)
            epoch = (previous.node_epoch if previous else 0) + 1
            node = NodeInfo(node_id, epoch, NodeState.RUNNING, config, now_ms)
            tables.put_node(node)
            return node

        return await self._write(work)

    async def get_node(self, node_id: int) -> NodeInfo | None:
        return await self._read(lambda tables: tables.node(node_id))

    async def list_nodes(self) -> list[NodeInfo]:
        def work(tables: _Tables) -> list[NodeInfo]:
            rows = tables.db.execute(f"SELECT {_NODE_COLUMNS} FROM nodes ORDER BY node_id")
            return [_node(row) for row in rows]

        return await self._read(work)

    async def set_node_state(self, node_id: int, node_epoch: int, state: NodeState) -> None:
        now_ms = self._clock.now_ms()

        def work(tables: _Tables) -> None:
            node = require_node_epoch(tables.node(node_id), node_id, node_epoch)
            tables.put_node(NodeInfo(node_id, node.node_epoch, state, node.wal_config, now_ms))

        await self._write(work)

    async def begin_failover(self, node_id: int) -> NodeInfo:
        now_ms = self._clock.now_ms()

        def work(tables: _Tables) -> NodeInfo:
            node = tables.node(node_id)
            if node is None:
                raise InvalidArgument(f"begin_failover: node {node_id} was never registered")
            failing = NodeInfo(
                node_id, node.node_epoch + 1, NodeState.FAILING_OVER, node.wal_config, now_ms
            )
            tables.put_node(failing)
            return failing

        return await self._write(work)

    # -- data loss --------------------------------------------------------------------------------

    async def record_data_loss(self, node_id: int, node_epoch: int, gap: DataLossGap) -> StreamInfo:
        now_ms = self._clock.now_ms()

        def work(tables: _Tables) -> StreamInfo:
            stream = tables.stream(gap.stream_id)
            row = tables.db.execute(
                f"SELECT {_GAP_COLUMNS} FROM data_loss WHERE stream_id = ? AND start_offset = ?",
                (gap.stream_id, gap.start_offset),
            ).fetchone()
            changed = plan_data_loss(
                tables.node(node_id),
                node_id,
                node_epoch,
                stream,
                gap,
                None if row is None else _gap(row),
            )
            if changed is None:
                assert stream is not None
                return stream
            tables.db.execute(
                "UPDATE streams SET committed_end = ? WHERE stream_id = ?",
                (changed.committed_end, changed.stream_id),
            )
            tables.db.execute(
                f"INSERT INTO data_loss ({_GAP_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                (gap.stream_id, gap.start_offset, gap.end_offset, gap.reason, now_ms),
            )
            return changed

        return await self._write(work)

    async def get_data_loss(
        self, stream_id: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[DataLossGap]:
        check_data_loss_range(stream_id, start_offset, end_offset)
        end = _MAX_OFFSET if end_offset is None else end_offset

        def work(tables: _Tables) -> list[DataLossGap]:
            rows = tables.db.execute(
                f"SELECT {_GAP_COLUMNS} FROM data_loss WHERE stream_id = ? AND end_offset > ? "
                "AND start_offset < ? ORDER BY start_offset",
                (stream_id, start_offset, end),
            )
            return [_gap(row) for row in rows]

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
