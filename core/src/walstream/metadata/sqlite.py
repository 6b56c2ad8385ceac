"""SQLite :class:`MetadataStore`: the embedded default, safe for several processes on one machine.

The operations are the shared SQL store's (:mod:`walstream.metadata.sql`); this module is the
SQLite dialect under it:

* ``journal_mode=WAL`` so readers never block the writer, ``synchronous=FULL`` so a returned
  commit is fsynced, and ``BEGIN IMMEDIATE`` for every write transaction so two processes never
  both read-then-write the same rows (the second waits up to ``busy_timeout``). That write lock is
  what PostgreSQL's row locks give there, so the lock clauses render as nothing here.
* One connection, used only by a dedicated single-thread executor: the event loop never blocks
  on SQLite. A whole transaction runs on that thread in one hop: the shared logic is written as
  coroutines, and on this connection they never suspend (every ``await`` reaches a synchronous
  sqlite3 call), so the thread drives each one to its end (:func:`run_to_end`).
* The shared SQL's ``$1`` placeholders are bound as SQLite's ``?1``; an id list, one argument
  of the shared SQL, becomes one parameter per id (``IN (?3, ?4, …)``); ids come from counter
  rows of the ``meta`` table, advanced inside the write transaction (which holds the file); the
  store's clock is the SQL function ``walstream_now_ms()``, the store's
  :class:`~walstream.clock.Clock` (the processes sharing one file share one machine, hence one
  clock).
* SQLite's result codes become walstream's typed errors (:func:`translate_error`).
* The schema is versioned (:mod:`walstream.metadata.sql.migrations`): the first connection
  applies the missing migrations, each under ``BEGIN IMMEDIATE`` after reading the version again,
  so processes opening one new file at once all succeed. The version is also kept in ``meta``,
  where a walstream from before versioned migrations (which refuses a file newer than it knows)
  reads it; such a file (``meta`` version 1 to 4) is adopted in place.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
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
    WalstreamError,
)
from walstream.metadata.contract import StreamInfo, StreamState
from walstream.metadata.rows import STREAM_COLUMNS
from walstream.metadata.sql.dialect import Connection, Dialect, Row
from walstream.metadata.sql.migrations import SCHEMA_VERSION, is_current, migrate_step
from walstream.metadata.sql.store import SqlMetadataStore
from walstream.stream_config import StreamConfig

__all__ = [
    "SCHEMA_VERSION",
    "SQLITE_METADATA",
    "SqliteDialect",
    "SqliteMetadataStore",
    "open_connection",
    "run_to_end",
    "translate_error",
]

T = TypeVar("T")

# Primary result codes (https://sqlite.org/rescode.html).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 10, 11, 13, 14, 26

#: The ``meta`` rows that serve as sequences (:meth:`SqliteDialect.new_id`).
_COUNTERS = {
    "stream_ids": "last_stream_id",
    "object_ids": "last_object_id",
    "kv_versions": "last_kv_version",
}
#: The last version a SQLite file recorded in ``meta`` alone, before versioned migrations.
_LEGACY_VERSION = 4


def run_to_end(awaitable: Awaitable[T]) -> T:
    """Run an awaitable that never suspends to its end, on this thread, and return its result.

    The shared SQL logic is written as coroutines for asyncpg's sake; over a
    :class:`_SqliteConnection` every ``await`` reaches a synchronous sqlite3 call, so the
    coroutine finishes at its first step. Suspending would mean it awaited something else (an
    event-loop future), which the store's thread cannot serve: that is a bug, and raises."""
    steps = awaitable.__await__()
    try:
        suspended_on = steps.send(None)
    except StopIteration as finished:
        result: T = finished.value
        return result
    steps.close()
    raise RuntimeError(
        f"a SQLite metadata transaction awaited {suspended_on!r}: the shared SQL logic may "
        "await only its connection"
    )


class _Ids(tuple[int, ...]):
    """An id list bound as one parameter (:meth:`SqliteDialect.id_list`): the connection expands
    its ``IN ($n)`` into one numbered parameter per id (an empty list is ``IN ()``, false), or,
    past :data:`_MOST_PARAMETERS` ids, reads it as one JSON array with ``json_each``."""

    __slots__ = ()


#: Longest id list bound as one parameter per id: SQLite parses a statement per list length,
#: which for a long list costs more than reading one JSON array (and may pass its limit on
#: parameters, 32,766 by default).
_MOST_PARAMETERS = 64


@functools.lru_cache(maxsize=1024)
def _sqlite_sql(sql: str) -> tuple[str, tuple[int, ...]]:
    """The shared text as SQLite binds it (``$1`` → ``?1``: SQLite's numbered parameters bind
    the same argument list), and the positions of the ``IN ($k)`` that may take an id list."""
    lists = tuple(int(k) for k in re.findall(r"IN \(\$(\d+)\)", sql))
    return re.sub(r"\$(\d+)", r"?\1", sql), lists


@functools.lru_cache(maxsize=1024)
def _expanded(sql: str, id_lists: tuple[tuple[int, int], ...]) -> str:
    """``sql`` with the id list at position ``k`` (``count`` ids, per ``id_lists``) as ``IN (?a,
    …)``, numbered after the call's own arguments (the ids are appended in that order); a
    ``count`` of -1 reads the argument at ``k`` as a JSON array instead."""
    next_index = 1 + max((int(n) for n in re.findall(r"\$(\d+)", sql)), default=0)
    for position, count in id_lists:
        if count < 0:
            listed = f"SELECT value FROM json_each(${position})"
        else:
            listed = ", ".join(f"?{next_index + i}" for i in range(count))
            next_index += count
        sql = sql.replace(f"IN (${position})", f"IN ({listed})")
    return re.sub(r"\$(\d+)", r"?\1", sql)


def _bind_id_lists(
    sql: str, lists: tuple[int, ...], args: tuple[Any, ...]
) -> tuple[str, Sequence[Any]]:
    """The SQLite text and arguments of a statement whose ``IN ($k)`` at ``lists`` may hold id
    lists: each one given as an id list becomes one parameter per id, or one JSON array."""
    shape: list[tuple[int, int]] = []
    flat = list(args)
    for position in lists:
        ids = args[position - 1]
        if type(ids) is not _Ids:
            continue
        if len(ids) <= _MOST_PARAMETERS:
            shape.append((position, len(ids)))
            flat[position - 1] = None
            flat.extend(ids)
        else:
            shape.append((position, -1))
            flat[position - 1] = json.dumps(ids)
    if not shape:
        return _sqlite_sql(sql)[0], args
    return _expanded(sql, tuple(shape)), flat


class _SqliteConnection:
    """:class:`~walstream.metadata.sql.dialect.Connection` over a sqlite3 connection (runs on the
    store's thread; its coroutines never suspend)."""

    __slots__ = ("_db",)

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection

    def _run(self, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        text, lists = _sqlite_sql(sql)
        if lists:
            return self._db.execute(*_bind_id_lists(sql, lists, args))
        return self._db.execute(text, args)

    # Each method runs its statement itself (no await inside): one coroutine per statement.

    async def execute(self, sql: str, *args: Any) -> int:
        return self._run(sql, args).rowcount

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._db.executemany(_sqlite_sql(sql)[0], rows)

    async def fetch(self, sql: str, *args: Any) -> Sequence[Row]:
        # fetchall() also runs a RETURNING statement to its end before the next one.
        rows: list[Row] = self._run(sql, args).fetchall()
        return rows

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        rows = self._run(sql, args).fetchall()
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        rows = self._run(sql, args).fetchall()
        return rows[0][0] if rows else None


class SqliteDialect(Dialect):
    """SQLite under the shared SQL store (see the module docstring)."""

    name = "sqlite"
    now_ms_sql = "walstream_now_ms()"
    config_key = "metadata.path"
    version_table_sql = """CREATE TABLE schema_version (
        version INTEGER PRIMARY KEY CHECK (version > 0),
        name TEXT NOT NULL,
        applied_ms INTEGER NOT NULL
    )"""

    def __init__(self, path: Path, busy_timeout_s: float, clock: Clock) -> None:
        self._path = path
        self._busy_timeout_s = busy_timeout_s
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walstream-sqlite")
        self._connection: sqlite3.Connection | None = None  # touched only on the executor thread
        self._closed = False

    @property
    def where(self) -> str:
        return f"sqlite metadata {str(self._path)!r}"

    # -- SQL text -----------------------------------------------------------------------------------

    def any_id(self, placeholder: str) -> str:
        return f"IN ({placeholder})"

    def id_list(self, ids: Sequence[int]) -> _Ids:
        return _Ids(ids)

    async def _advance(self, db: Connection, sequence: str, count: int) -> int:
        """Move the counter of ``sequence`` on by ``count``; its new value. Two statements rather
        than UPDATE … RETURNING, which costs SQLite several times more."""
        key = _COUNTERS[sequence]
        await db.execute("UPDATE meta SET value = value + $1 WHERE key = $2", count, key)
        return int(await db.fetchval("SELECT value FROM meta WHERE key = $1", key))

    async def new_id(self, db: Connection, sequence: str) -> str:
        await self._advance(db, sequence, 1)
        return f"(SELECT value FROM meta WHERE key = '{_COUNTERS[sequence]}')"

    async def insert_streams(
        self,
        db: Connection,
        names: Sequence[str],
        created_ms: int,
        config: StreamConfig,
        due_ms: int | None,
    ) -> list[StreamInfo]:
        """The ids in one counter step, the rows in one executemany."""
        last = await self._advance(db, "stream_ids", len(names))
        first = last - len(names) + 1
        encoded = config.encode()
        await db.executemany(
            f"INSERT INTO streams ({STREAM_COLUMNS}) VALUES ($1, $2, 0, 0, 0, 'active', NULL, "
            "NULL, $3, $4, NULL, $5)",
            [
                (first + index, name, created_ms, encoded, due_ms)
                for index, name in enumerate(names)
            ],
        )
        return [
            StreamInfo(
                stream_id=first + index,
                name=name,
                epoch=0,
                start_offset=0,
                committed_end=0,
                state=StreamState.ACTIVE,
                owner_node_id=None,
                created_ms=created_ms,
                config=config,
                lifecycle_due_ms=due_ms,
            )
            for index, name in enumerate(names)
        ]

    async def insert_prepared(self, db: Connection, count: int, expires_ms: int) -> list[int]:
        last = await self._advance(db, "object_ids", count)
        object_ids = list(range(last - count + 1, last + 1))
        await db.executemany(
            "INSERT INTO objects (object_id, state, expires_ms) VALUES ($1, 'prepared', $2)",
            [(object_id, expires_ms) for object_id in object_ids],
        )
        return object_ids

    # -- transactions -------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # Runs on the executor thread only; the first call opens the file and migrates it.
        if self._connection is None:
            self._connection = self.open_connection()
        return self._connection

    def open_connection(self) -> sqlite3.Connection:
        """Open the metadata file (creating its folder), turn on WAL journaling and
        ``synchronous=FULL``, register the store's clock as ``walstream_now_ms()``, and bring
        the schema to :data:`SCHEMA_VERSION` (:mod:`walstream.metadata.sql.migrations`). The
        connection is in autocommit mode: :func:`transaction` opens every transaction
        explicitly."""
        path, busy_timeout_s = self._path, self._busy_timeout_s
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
            connection.create_function("walstream_now_ms", 0, self._clock.now_ms)
            mode = _journal_mode_wal(connection, busy_timeout_s)
            if str(mode).lower() != "wal":
                raise ConfigError(
                    f"metadata.path: {str(path)!r} cannot use SQLite WAL journaling "
                    f"(got {mode!r}); put it on a local file system"
                )
            connection.execute("PRAGMA synchronous = FULL")
            self._migrate(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    def _migrate(self, connection: sqlite3.Connection) -> None:
        """Read the version without a lock; when it is not current, apply migration steps, each
        under the write lock (``BEGIN IMMEDIATE``) after reading the version again."""
        if transaction(connection, None, lambda db: is_current(db, self)):
            return
        while not transaction(
            connection, "BEGIN IMMEDIATE", lambda db: migrate_step(db, self, self._clock.now_ms())
        ):
            pass

    # -- migrations ---------------------------------------------------------------------------------

    async def table_names(self, db: Connection) -> set[str]:
        rows = await db.fetch(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
        return {str(row[0]) for row in rows}

    async def legacy_version(self, db: Connection, tables: set[str]) -> int | None:
        """A file of versions 1 to 4 recorded its version in ``meta`` only."""
        if "schema_version" in tables or "meta" not in tables:
            return None
        found = await db.fetchval("SELECT value FROM meta WHERE key = 'schema_version'")
        if found is None:
            return None
        if int(found) > _LEGACY_VERSION:
            raise CorruptionError(
                f"{self.where} records schema version {found} in its meta table but has no "
                "schema_version table: it is damaged; restore it from a backup"
            )
        return int(found)

    async def after_migration(self, db: Connection, version: int) -> None:
        """Keep ``meta``'s schema_version too: a walstream from before versioned migrations
        reads only that, and refuses a file newer than it knows."""
        await db.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', $1) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            version,
        )

    def _run_on_thread(self, begin: str | None, work: Callable[[Connection], Awaitable[T]]) -> T:
        try:
            return transaction(self._connect(), begin, work)
        except sqlite3.Error as error:
            raise translate_error(error, self._path, self._busy_timeout_s) from error

    async def run(
        self, write: bool, work: Callable[[Connection], Awaitable[T]], snapshot: bool = True
    ) -> T:
        if self._closed:
            raise BackendUnavailable(f"{self.where} is closed; open a new store")
        # Writes take the write lock up front: two processes never both read-then-write.
        begin = "BEGIN IMMEDIATE" if write else ("BEGIN" if snapshot else None)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run_on_thread, begin, work)

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


def transaction(
    connection: sqlite3.Connection, begin: str | None, work: Callable[[Connection], Awaitable[T]]
) -> T:
    """Run ``work`` in one transaction opened with ``begin`` (none: a single statement in
    autocommit): committed when it returns, rolled back when it raises."""
    db = _SqliteConnection(connection)
    if begin is None:
        return run_to_end(work(db))
    connection.execute(begin)
    try:
        result = run_to_end(work(db))
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return result


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


def open_connection(
    path: Path, busy_timeout_s: float, clock: Clock | None = None
) -> sqlite3.Connection:
    """A connection to the metadata file at ``path``, opened and migrated as a store opens it
    (:meth:`SqliteDialect.open_connection`)."""
    return SqliteDialect(path, busy_timeout_s, clock or SystemClock()).open_connection()


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


class SqliteMetadataStore(SqlMetadataStore):
    """Metadata in one SQLite file, shared safely by the processes of one machine."""

    def __init__(
        self, path: str | Path, busy_timeout_s: float = 30.0, clock: Clock | None = None
    ) -> None:
        self._path = Path(path)
        store_clock: Clock = clock or SystemClock()
        super().__init__(SqliteDialect(self._path, busy_timeout_s, store_clock), store_clock)

    @property
    def path(self) -> Path:
        return self._path

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
