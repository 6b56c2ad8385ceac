"""The per-backend part of the SQL metadata stores: a :class:`Dialect` and its :class:`Connection`.

The shape is SQLAlchemy's: the store (:mod:`walstream.metadata.sql.store`) holds the logic and
the SQL of every operation once; a dialect says how that SQL runs on one database. The SQL is
written in the dialect both databases speak (``RETURNING``, ``ON CONFLICT``, ``CAST``,
``substr``), with PostgreSQL's numbered placeholders (``$1``, ``$2`` …). What differs lives here:

- **connections and transactions** (:meth:`Dialect.run`): how a transaction is opened (SQLite:
  one connection on a thread of its own, ``BEGIN IMMEDIATE`` for writes; PostgreSQL: an asyncpg
  pool, ``BEGIN`` at READ COMMITTED, ``REPEATABLE READ READ ONLY`` for multi-statement reads),
  retried (PostgreSQL retries what surely did not apply) and how driver errors become
  :mod:`walstream.errors` types;
- **placeholders**: a :class:`Connection` takes the shared ``$n`` text and binds it its own way;
- **row locks** (:meth:`Dialect.lock`): ``FOR UPDATE`` / ``FOR SHARE`` on PostgreSQL, nothing
  on SQLite, whose write transaction already holds the whole file;
- **id lists** (:meth:`Dialect.any_id`): one array parameter either way;
- **the store's clock** (:attr:`Dialect.now_ms_sql`): the server's clock on PostgreSQL, the
  store's :class:`~walstream.clock.Clock` on SQLite;
- **id allocation** (:meth:`Dialect.new_id`, :meth:`Dialect.insert_prepared`): sequences or
  counter rows;
- **bulk writes** (:meth:`Dialect.write_objects`): portable ``executemany`` by default, one
  statement over arrays where a round trip costs (PostgreSQL);
- **migrations** (:mod:`walstream.metadata.sql.migrations`): which statements of a migration run
  (:attr:`Dialect.name`), the migration lock and transaction (the dialect's own), the version
  table's DDL, and how a database made before versioned migrations is recognised
  (:meth:`Dialect.legacy_version`, :meth:`Dialect.adopt_legacy`).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from walstream.metadata.contract import ObjectInfo, StreamInfo
from walstream.metadata.rows import RANGE_COLUMNS, STREAM_COLUMNS, stream_of
from walstream.stream_config import StreamConfig

__all__ = ["Connection", "Dialect", "Lock", "Row"]

T = TypeVar("T")

#: A result row: indexable by column position.
Row = Sequence[Any]


class Connection(Protocol):
    """One connection inside one transaction, as the shared SQL sees it.

    Statements use ``$1``, ``$2`` … placeholders (a number may repeat); each call binds
    ``args`` in that order. A dialect's connection is awaited like any other, but SQLite's never
    suspends: its calls run to the end on the store's own thread (see
    :mod:`walstream.metadata.sqlite`)."""

    async def execute(self, sql: str, *args: Any) -> int:
        """Run one statement; the number of rows it changed."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per row of arguments."""
        ...

    async def fetch(self, sql: str, *args: Any) -> Sequence[Row]:
        """Every row of a query."""
        ...

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        """The first row of a query, or None."""
        ...

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row, or None."""
        ...


class Lock(enum.Enum):
    """A row lock a statement asks for (PostgreSQL); SQLite's write transaction locks the file."""

    UPDATE = "FOR UPDATE"
    SHARE = "FOR SHARE"


class Dialect(ABC):
    """How the shared SQL runs on one database (see the module docstring).

    A dialect instance belongs to one store: it holds the store's connections."""

    #: The backend's name ("sqlite", "postgres").
    name: ClassVar[str]
    #: An SQL expression for the store's clock in Unix milliseconds (lease expiries).
    now_ms_sql: ClassVar[str]
    #: The configuration key naming the database, for messages ("metadata.path").
    config_key: ClassVar[str]
    #: DDL of the version table: ``version`` (primary key), ``name``, ``applied_ms``.
    version_table_sql: ClassVar[str]

    @property
    @abstractmethod
    def where(self) -> str:
        """The database, for messages (``sqlite metadata '/data/meta.db'``)."""

    # -- transactions -------------------------------------------------------------------------------

    @abstractmethod
    async def run(
        self, write: bool, work: Callable[[Connection], Awaitable[T]], snapshot: bool = True
    ) -> T:
        """Run ``work`` in one transaction: committed when it returns, rolled back when it
        raises. A write (``write``) sees and locks the newest rows; a read with ``snapshot``
        sees one snapshot across its statements; a read without runs its single statement
        outside an explicit transaction. Driver errors become :mod:`walstream.errors` types; a
        :class:`~walstream.errors.WalstreamError` raised by ``work`` passes through unchanged."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections; idempotent. Later calls raise BackendUnavailable."""

    # -- SQL text -----------------------------------------------------------------------------------

    def lock(self, lock: Lock | None, of: str | None = None) -> str:
        """The clause locking the rows a SELECT reads (of table alias ``of``), or ``""``."""
        return ""

    @abstractmethod
    def any_id(self, placeholder: str) -> str:
        """A condition matching a column against the id list bound at ``placeholder``:
        ``stream_id {any_id('$1')}`` with :meth:`id_list` as the argument."""

    @abstractmethod
    def id_list(self, ids: Sequence[int]) -> Any:
        """The argument :meth:`any_id`'s placeholder takes."""

    #: The stream name as an expression that sorts by its bytes (of UTF-8), as the index of
    #: active names does: the name itself on SQLite (BINARY); ``name COLLATE "C"`` on PostgreSQL.
    name_bytes: ClassVar[str] = "name"

    # -- ids ----------------------------------------------------------------------------------------

    async def insert_streams(
        self,
        db: Connection,
        names: Sequence[str],
        created_ms: int,
        config: StreamConfig,
        due_ms: int | None,
    ) -> list[StreamInfo]:
        """Insert ACTIVE streams named ``names`` (none of them taken) with ``config`` and
        ``lifecycle_due_ms`` ``due_ms``, in order; their rows. This one runs a statement per
        name; a dialect may do better."""
        created: list[StreamInfo] = []
        for name in names:
            new_id = await self.new_id(db, "stream_ids")
            row = await db.fetchrow(
                f"INSERT INTO streams ({STREAM_COLUMNS}) VALUES ({new_id}, $1, 0, 0, 0, "
                f"'active', NULL, NULL, $2, $3, NULL, $4) RETURNING {STREAM_COLUMNS}",
                name,
                created_ms,
                config.encode(),
                due_ms,
            )
            assert row is not None
            created.append(stream_of(row))
        return created

    @abstractmethod
    async def new_id(self, db: Connection, sequence: str) -> str:
        """An SQL expression giving one new value of ``sequence`` (``stream_ids``,
        ``kv_versions``) to the next statement: never given before, larger than every value given
        before. Values are not consecutive (a rolled-back transaction may burn one)."""

    @abstractmethod
    async def insert_prepared(self, db: Connection, count: int, expires_ms: int) -> list[int]:
        """Insert ``count`` PREPARED objects expiring at ``expires_ms`` under new ids of
        ``object_ids`` (as :meth:`new_id`), and return the ids in increasing order."""

    # -- bulk writes --------------------------------------------------------------------------------

    async def write_objects(
        self,
        db: Connection,
        stream_ends: Mapping[int, int],
        destroyed: Sequence[int],
        infos: Sequence[ObjectInfo],
    ) -> None:
        """Set streams' ``committed_end``, mark ``destroyed`` objects MARK_DESTROYED, and write
        PREPARED objects' final state and ranges (``infos``), in the open transaction.
        ``destroyed`` and ``infos`` never name the same object."""
        await _each(
            db,
            "UPDATE streams SET committed_end = $1 WHERE stream_id = $2",
            [(end, stream_id) for stream_id, end in stream_ends.items()],
        )
        if destroyed:
            await db.execute(
                f"UPDATE objects SET state = 'mark_destroyed' WHERE object_id {self.any_id('$1')}",
                self.id_list(sorted(destroyed)),
            )
        await _each(
            db,
            "UPDATE objects SET state = $1, key = $2, kind = $3, size = $4, index_size = $5, "
            "committed_ms = $6 WHERE object_id = $7",
            [
                (
                    info.state.value,
                    info.key,
                    info.kind.value,
                    info.size,
                    info.index_size,
                    info.committed_ms,
                    info.object_id,
                )
                for info in infos
            ],
        )
        await _each(
            db,
            f"INSERT INTO ranges (object_id, {RANGE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)",
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
                for info in infos
                for r in info.ranges
            ],
        )

    # -- migrations ---------------------------------------------------------------------------------

    @abstractmethod
    async def table_names(self, db: Connection) -> set[str]:
        """The tables of this store's database (its PostgreSQL schema), internal ones excluded."""

    async def legacy_version(self, db: Connection, tables: set[str]) -> int | None:
        """The version of a database written before versioned migrations, in
        :data:`~walstream.metadata.sql.migrations.MIGRATIONS` numbering; None when it is not
        one (new, versioned already, or foreign)."""
        return None

    async def adopt_legacy(self, db: Connection, version: int) -> dict[int, int]:
        """Give a legacy database (:meth:`legacy_version`) the version table of
        :attr:`version_table_sql`, empty; the caller then records versions 1 to ``version``.
        Returns when each was applied (Unix ms) where the legacy database recorded it."""
        await db.execute(self.version_table_sql)
        return {}

    async def after_migration(self, db: Connection, version: int) -> None:
        """Called in the migration's transaction once ``version`` is recorded."""


async def _each(db: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """``sql`` once per row: ``execute`` for one row (the common commit: one object, one range,
    one stream), which costs sqlite3 less than ``executemany``."""
    if len(rows) == 1:
        await db.execute(sql, *rows[0])
    elif rows:
        await db.executemany(sql, rows)
