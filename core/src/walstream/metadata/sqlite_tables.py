"""The SQLite metadata file: its schema, the row codecs and the table access one transaction uses.

:class:`walstream.metadata.sqlite.SqliteMetadataStore` runs every call as one transaction over a
:class:`Tables` (:func:`transaction`) on a connection from :func:`open_connection`, which turns on
WAL journaling and ``synchronous=FULL`` and creates or upgrades the schema. SQLite errors become
walstream's typed errors through :func:`translate_error`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from walstream.errors import (
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    WalstreamError,
)
from walstream.metadata.contract import (
    NodeInfo,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamInfo,
    StreamRange,
    StreamState,
)
from walstream.metadata.rows import (
    GAP_COLUMNS,
    MAX_OFFSET,
    NODE_COLUMNS,
    OBJECT_COLUMNS,
    RANGE_COLUMNS,
    STREAM_COLUMNS,
    gap_of,
    node_of,
    range_of,
    stream_of,
)
from walstream.metadata.rules import (
    ObjectRecord,
    all_ranges_dead,
    encode_wal_config,
    stream_not_found,
)

__all__ = [
    "GAP_COLUMNS",
    "MAX_OFFSET",
    "NODE_COLUMNS",
    "SCHEMA_VERSION",
    "STREAM_COLUMNS",
    "Tables",
    "gap_of",
    "id_chunks",
    "node_of",
    "open_connection",
    "placeholders",
    "range_of",
    "stream_of",
    "transaction",
    "translate_error",
]

T = TypeVar("T")

#: Version of the tables below; bump it (and add a migration) whenever they change.
SCHEMA_VERSION = 4

SCHEMA = (
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
    # -- version 3 --
    # Basins: named namespaces of streams (the S2 API). A file of version 2 gains the empty
    # table when it is opened; nothing else changes, so older files stay readable.
    """CREATE TABLE IF NOT EXISTS basins (
        name TEXT PRIMARY KEY,
        config TEXT NOT NULL,
        created_ms INTEGER NOT NULL
    )""",
)

#: Columns added to existing tables after version 1, as (table, column, declaration, version).
#: SQLite has no ``ADD COLUMN IF NOT EXISTS``: :func:`ensure_schema` adds the ones a file lacks,
#: so an older file is upgraded in place and keeps every row (the defaults describe old rows).
ADDED_COLUMNS = (
    # -- version 4 -- node leases: the advertised address and the lease expiry (store clock).
    ("nodes", "address", "TEXT", 4),
    ("nodes", "lease_expires_ms", "INTEGER NOT NULL DEFAULT 0", 4),
)

_IN_CHUNK = 500  # stays far below SQLite's bound on parameters per statement

# Primary result codes (https://sqlite.org/rescode.html).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 10, 11, 13, 14, 26


def id_chunks(ids: Iterable[int]) -> Iterator[list[int]]:
    unique = sorted(set(ids))
    for first in range(0, len(unique), _IN_CHUNK):
        yield unique[first : first + _IN_CHUNK]


def placeholders(count: int) -> str:
    return ", ".join("?" * count)


class Tables:
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
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE stream_id = ?", (stream_id,)
        ).fetchone()
        return None if row is None else stream_of(row)

    def active_stream(self, stream_id: int) -> StreamInfo:
        stream = self.stream(stream_id)
        if stream is None or stream.state is not StreamState.ACTIVE:
            raise stream_not_found(stream_id, deleted=stream is not None)
        return stream

    def active_stream_named(self, name: str) -> StreamInfo | None:
        row = self.db.execute(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE name = ? AND state = 'active'", (name,)
        ).fetchone()
        return None if row is None else stream_of(row)

    def streams(self, stream_ids: Iterable[int]) -> dict[int, StreamInfo]:
        found: dict[int, StreamInfo] = {}
        for chunk in id_chunks(stream_ids):
            rows = self.db.execute(
                f"SELECT {STREAM_COLUMNS} FROM streams "
                f"WHERE stream_id IN ({placeholders(len(chunk))})",
                chunk,
            )
            for row in rows:
                found[row[0]] = stream_of(row)
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
        for chunk in id_chunks(object_ids):
            marks = placeholders(len(chunk))
            rows.extend(
                self.db.execute(
                    f"SELECT {OBJECT_COLUMNS} FROM objects WHERE object_id IN ({marks})", chunk
                )
            )
            for row in self.db.execute(
                f"SELECT object_id, {RANGE_COLUMNS} FROM ranges WHERE object_id IN ({marks}) "
                "ORDER BY object_id, stream_id, start_offset",
                chunk,
            ):
                ranges.setdefault(row[0], []).append(range_of(row[1:]))
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
            f"INSERT INTO ranges (object_id, {RANGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
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
            f"SELECT {NODE_COLUMNS} FROM nodes WHERE node_id = ?", (node_id,)
        ).fetchone()
        return None if row is None else node_of(row)

    def put_node(self, node: NodeInfo) -> None:
        self.db.execute(
            f"INSERT OR REPLACE INTO nodes ({NODE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                node.node_id,
                node.node_epoch,
                node.state.value,
                encode_wal_config(node.wal_config),
                node.updated_ms,
                node.address,
                node.lease_expires_ms,
            ),
        )


def translate_error(error: sqlite3.Error, path: Path, busy_timeout_s: float) -> WalstreamError:
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


def open_connection(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """Open the metadata file (creating its folder), turn on WAL journaling and
    ``synchronous=FULL``, and create or upgrade the schema. The connection is in autocommit mode:
    :func:`transaction` opens every transaction explicitly."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BackendUnavailable(
            f"cannot create the folder of sqlite metadata {str(path)!r} ({error}); "
            "check metadata.path and permissions"
        ) from error
    connection = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    try:
        connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        mode = _journal_mode_wal(connection, busy_timeout_s)
        if str(mode).lower() != "wal":
            raise ConfigError(
                f"metadata.path: {str(path)!r} cannot use SQLite WAL journaling "
                f"(got {mode!r}); put it on a local file system"
            )
        connection.execute("PRAGMA synchronous = FULL")
        transaction(connection, True, lambda tables: ensure_schema(tables, path))
    except BaseException:
        connection.close()
        raise
    return connection


def _journal_mode_wal(connection: sqlite3.Connection, busy_timeout_s: float) -> object:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds the lock. Switching
    the journal mode of a new file takes an exclusive lock, and SQLite answers "database is
    locked" at once, without its busy handler, when connections opening the same new file at the
    same moment would otherwise wait for each other."""
    deadline = time.monotonic() + busy_timeout_s
    pause = 0.001
    while True:
        try:
            return connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as error:
            code = getattr(error, "sqlite_errorcode", None)
            locked = isinstance(code, int) and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
            if not locked or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def ensure_schema(tables: Tables, path: Path) -> None:
    """Create the tables of :data:`SCHEMA_VERSION` (or add the ones an older file lacks); refuse a
    file written by a newer walstream with :class:`ConfigError`."""
    tables.db.execute(SCHEMA[0])
    version = tables.meta("schema_version")
    if version is not None and version > SCHEMA_VERSION:
        raise ConfigError(
            f"metadata.path: {str(path)!r} has schema version {version}, newer than "
            f"this walstream understands ({SCHEMA_VERSION}); upgrade walstream"
        )
    if version == SCHEMA_VERSION:
        return
    for statement in SCHEMA[1:]:
        tables.db.execute(statement)
    for table, column, declaration, _version in ADDED_COLUMNS:
        present = {row[1] for row in tables.db.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            tables.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
    tables.set_meta("schema_version", SCHEMA_VERSION)
    if tables.meta("last_stream_id") is None:
        tables.set_meta("last_stream_id", 0)
        tables.set_meta("last_object_id", 0)


def transaction(connection: sqlite3.Connection, write: bool, work: Callable[[Tables], T]) -> T:
    """Run ``work`` in one transaction: committed when it returns, rolled back when it raises."""
    # Writes take the write lock up front: two processes never both read-then-write.
    connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        result = work(Tables(connection))
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return result
