"""The PostgreSQL dialect of the shared SQL metadata store (:mod:`walstream.metadata.sql`).

* Driver: asyncpg with its connection pool (measured faster than psycopg 3 on the commit path:
  ``bench/_pg_drivers.py``); the shared SQL's ``$1`` placeholders are PostgreSQL's own.
* Every call is one transaction. Writes run at READ COMMITTED and lock the rows they read
  (``SELECT … FOR UPDATE`` / ``FOR SHARE``, in the order :mod:`walstream.metadata.sql.tables`
  states). Reads of several statements run as one ``REPEATABLE READ READ ONLY`` transaction, so
  they see one snapshot; a read of one statement runs without BEGIN/COMMIT (two round trips
  saved).
* Failures: a lost connection, a server that is down, restarting or refusing connections, a
  deadlock or serialization failure are retried (reconnecting, exponential backoff with jitter,
  capped at 1 s) until ``retry_for`` runs out, then :class:`BackendUnavailable`. A connection lost
  while ``COMMIT`` was in flight raises :class:`AmbiguousError` at once (the transaction may have
  been applied): ``commit_objects`` is idempotent, so the engine's retry of it is safe. Driver
  errors are sorted by :mod:`.errors`.
* ``statement_timeout`` bounds each statement on the server, ``command_timeout`` on the client
  (a frozen server cannot hang a call), and ``idle_in_transaction_session_timeout`` makes the
  server drop the row locks of a client that vanished mid-transaction.
* Ids come from sequences; the store's clock is the server's (:data:`SERVER_NOW_MS`), so nodes
  on several machines compare lease expiries against one clock; a commit's writes are one
  statement over arrays (:meth:`PostgresDialect.write_objects`): one round trip whatever the
  counts.
* The schema is versioned and migrated when the pool is first opened, each migration in its own
  transaction under an advisory lock of the schema (:mod:`.schema`,
  :mod:`walstream.metadata.sql.migrations`); a node whose schema is already current takes no
  lock and needs no CREATE privilege.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg
from walstream.clock import Clock, make_rng
from walstream.errors import AmbiguousError, BackendUnavailable, WalstreamError
from walstream.metadata.contract import ObjectInfo, StreamInfo
from walstream.metadata.rows import RANGE_COLUMNS, STREAM_COLUMNS, stream_of
from walstream.metadata.sql.dialect import Connection, Dialect, Lock, Row
from walstream.metadata.sql.migrations import is_current, migrate_step
from walstream.stream_config import StreamConfig

from .errors import classify, translate
from .schema import LEGACY_VERSION_OFFSET, migration_lock_key, quote_identifier

__all__ = ["SERVER_NOW_MS", "PostgresDialect"]

T = TypeVar("T")

#: The server's wall clock in Unix milliseconds (``clock_timestamp()``: the time of the statement,
#: not of the transaction's start, so a transaction that waited for a lock reads a fresh clock).
SERVER_NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"

#: Errors that end a transaction before it could commit, even when raised by ``COMMIT`` itself.
_NOT_APPLIED_CODES = frozenset({"40001", "40P01", "55P03", "53300", "57P03"})
_BACKOFF_FIRST_S = 0.02
_BACKOFF_CAP_S = 1.0
_SEQUENCES = frozenset({"stream_ids", "kv_versions"})


class _PgConnection:
    """:class:`~walstream.metadata.sql.dialect.Connection` over an asyncpg connection."""

    __slots__ = ("_db",)

    def __init__(self, connection: Any) -> None:
        self._db = connection

    async def execute(self, sql: str, *args: Any) -> int:
        status: str = await self._db.execute(sql, *args)
        count = status.rpartition(" ")[2]  # "UPDATE 3", "DELETE 0", "INSERT 0 1"
        return int(count) if count.isdigit() else 0

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self._db.executemany(sql, rows)

    async def fetch(self, sql: str, *args: Any) -> Sequence[Row]:
        rows: Sequence[Row] = await self._db.fetch(sql, *args)
        return rows

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        row: Row | None = await self._db.fetchrow(sql, *args)
        return row

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self._db.fetchval(sql, *args)


class PostgresDialect(Dialect):
    """PostgreSQL under the shared SQL store (see the module docstring)."""

    name = "postgres"
    now_ms_sql = SERVER_NOW_MS
    name_bytes = 'name COLLATE "C"'
    config_key = "metadata.schema"
    version_table_sql = """CREATE TABLE schema_version (
        version integer PRIMARY KEY CHECK (version > 0),
        name text NOT NULL,
        applied_ms bigint NOT NULL
    )"""

    def __init__(
        self,
        dsn: str,
        schema: str,
        where: str,
        *,
        pool_min: int,
        pool_max: int,
        connect_timeout_s: float,
        command_timeout_s: float,
        retry_for_s: float,
        clock: Clock,
    ) -> None:
        self._dsn = dsn
        self._schema = schema
        self._where = where
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._retry_for_s = retry_for_s
        self._clock = clock
        self._rng = make_rng(None)
        self._pool: Any = None
        self._pool_lock = asyncio.Lock()
        self._closed = False

    @property
    def where(self) -> str:
        return f"PostgreSQL at {self._where}"

    # -- SQL text -----------------------------------------------------------------------------------

    def lock(self, lock: Lock | None, of: str | None = None) -> str:
        if lock is None:
            return ""
        return lock.value if of is None else f"{lock.value} OF {of}"

    def any_id(self, placeholder: str) -> str:
        return f"= ANY({placeholder}::bigint[])"

    def id_list(self, ids: Sequence[int]) -> list[int]:
        return list(ids)

    async def new_id(self, db: Connection, sequence: str) -> str:
        if sequence not in _SEQUENCES:
            raise ValueError(f"no sequence {sequence!r}")
        return f"nextval('{sequence}')"

    async def insert_streams(
        self,
        db: Connection,
        names: Sequence[str],
        created_ms: int,
        config: StreamConfig,
        due_ms: int | None,
    ) -> list[StreamInfo]:
        """One statement: ids from the sequence in the names' order."""
        rows = await db.fetch(
            f"INSERT INTO streams ({STREAM_COLUMNS}) "
            "SELECT nextval('stream_ids'), t.name, 0, 0, 0, 'active', NULL, NULL, $2, $3, NULL, "
            "$4::bigint FROM unnest($1::text[]) WITH ORDINALITY AS t(name, position) "
            f"ORDER BY t.position RETURNING {STREAM_COLUMNS}",
            list(names),
            created_ms,
            config.encode(),
            due_ms,
        )
        order = {name: index for index, name in enumerate(names)}
        return sorted((stream_of(row) for row in rows), key=lambda s: order[s.name or ""])

    async def insert_prepared(self, db: Connection, count: int, expires_ms: int) -> list[int]:
        """One statement: the ids come from the sequence inside the INSERT."""
        rows = await db.fetch(
            "INSERT INTO objects (object_id, state, expires_ms) "
            "SELECT nextval('object_ids'), 'prepared', $2 FROM generate_series(1, $1) "
            "RETURNING object_id",
            count,
            expires_ms,
        )
        return sorted(int(row[0]) for row in rows)

    async def write_objects(
        self,
        db: Connection,
        stream_ends: Mapping[int, int],
        destroyed: Sequence[int],
        infos: Sequence[ObjectInfo],
    ) -> None:
        """One statement whatever the counts (data-modifying CTEs over arrays): one round trip."""
        ranges = [(info.object_id, r) for info in infos for r in info.ranges]
        await db.execute(
            "WITH ends AS ("
            " UPDATE streams AS s SET committed_end = e.committed_end"
            " FROM unnest($1::bigint[], $2::bigint[]) AS e (stream_id, committed_end)"
            " WHERE s.stream_id = e.stream_id RETURNING 1),"
            " destroyed AS ("
            " UPDATE objects SET state = 'mark_destroyed' WHERE object_id = ANY($3::bigint[])"
            " RETURNING 1),"
            " final AS ("
            " UPDATE objects AS o SET state = n.state, key = n.key, kind = n.kind,"
            " size = n.size, index_size = n.index_size, committed_ms = n.committed_ms"
            " FROM unnest($4::bigint[], $5::text[], $6::text[], $7::text[], $8::bigint[],"
            " $9::bigint[], $10::bigint[])"
            " AS n (object_id, state, key, kind, size, index_size, committed_ms)"
            " WHERE o.object_id = n.object_id RETURNING 1)"
            f" INSERT INTO ranges (object_id, {RANGE_COLUMNS})"
            " SELECT * FROM unnest($11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[],"
            " $15::bigint[], $16::bigint[], $17::bigint[])",
            list(stream_ends),
            list(stream_ends.values()),
            sorted(destroyed),
            [info.object_id for info in infos],
            [info.state.value for info in infos],
            [info.key for info in infos],
            [info.kind.value for info in infos],
            [info.size for info in infos],
            [info.index_size for info in infos],
            [info.committed_ms for info in infos],
            [object_id for object_id, _ in ranges],
            [r.stream_id for _, r in ranges],
            [r.start_offset for _, r in ranges],
            [r.end_offset for _, r in ranges],
            [r.epoch for _, r in ranges],
            [r.min_timestamp_ms for _, r in ranges],
            [r.max_timestamp_ms for _, r in ranges],
        )

    # -- transactions -------------------------------------------------------------------------------

    async def _open_pool(self) -> Any:
        """The pool, created (and the schema migrated) on first use."""
        async with self._pool_lock:
            if self._pool is not None:
                return self._pool
            statement_ms = int(self._command_timeout_s * 1000)
            connection = await asyncpg.connect(
                self._dsn,
                timeout=self._connect_timeout_s,
                command_timeout=self._command_timeout_s,
                server_settings={
                    "application_name": "walstream",
                    "search_path": quote_identifier(self._schema),
                },
            )
            try:
                await self._migrate(connection)
            finally:
                await connection.close(timeout=self._connect_timeout_s)
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._pool_min,
                max_size=self._pool_max,
                timeout=self._connect_timeout_s,
                command_timeout=self._command_timeout_s,
                server_settings={
                    "application_name": "walstream",
                    "search_path": quote_identifier(self._schema),
                    "statement_timeout": str(statement_ms),
                    "idle_in_transaction_session_timeout": str(2 * statement_ms),
                },
            )
            return self._pool

    async def _migrate(self, connection: Any) -> None:
        """Read the version without a lock; when it is not current, apply migration steps, each
        in a transaction holding the schema's advisory lock, after reading the version again."""
        db = _PgConnection(connection)
        if await is_current(db, self):
            return
        quoted = quote_identifier(self._schema)
        while True:
            async with connection.transaction():
                await connection.execute(
                    "SELECT pg_advisory_xact_lock($1)", migration_lock_key(self._schema)
                )
                exists = await connection.fetchval(
                    "SELECT count(*) FROM pg_namespace WHERE nspname = $1", self._schema
                )
                if not exists:
                    await connection.execute(f"CREATE SCHEMA {quoted}")
                await connection.execute(f"SET LOCAL search_path TO {quoted}")
                done = await migrate_step(db, self, self._clock.now_ms())
            if done:
                return

    # -- migrations ---------------------------------------------------------------------------------

    async def table_names(self, db: Connection) -> set[str]:
        rows = await db.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", self._schema)
        return {str(row[0]) for row in rows}

    async def legacy_version(self, db: Connection, tables: set[str]) -> int | None:
        """A schema from before the shared migrations: ``schema_version`` without ``name``."""
        if "schema_version" not in tables:
            return None
        named = await db.fetchval(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) "
            "AND attname = 'name' AND NOT attisdropped",
            f"{quote_identifier(self._schema)}.schema_version",
        )
        if named:
            return None
        found = int(await db.fetchval("SELECT coalesce(max(version), 0) FROM schema_version"))
        return found + LEGACY_VERSION_OFFSET if found else 0

    async def adopt_legacy(self, db: Connection, version: int) -> dict[int, int]:
        """Replace the legacy version table, keeping when each version was applied (its
        version 1 held migrations 1 and 2)."""
        rows = await db.fetch("SELECT version, applied_ms FROM schema_version")
        await db.execute("DROP TABLE schema_version")
        await db.execute(self.version_table_sql)
        applied: dict[int, int] = {}
        for legacy, applied_ms in rows:
            applied[int(legacy) + LEGACY_VERSION_OFFSET] = int(applied_ms)
            if legacy == 1:
                applied[1] = int(applied_ms)
        return applied

    def _backoff(self, attempt: int) -> float:
        delay = min(_BACKOFF_CAP_S, _BACKOFF_FIRST_S * (2**attempt))
        return float(delay * (0.5 + self._rng.random() / 2))

    async def run(
        self, write: bool, work: Callable[[Connection], Awaitable[T]], snapshot: bool = True
    ) -> T:
        """Run ``work`` in one transaction, retrying what surely did not apply (module doc)."""
        if self._closed:
            raise BackendUnavailable(f"postgres metadata {self._where} is closed; open a new store")
        deadline = self._clock.monotonic() + self._retry_for_s
        attempt = 0
        while True:
            committing = False
            try:
                pool = self._pool if self._pool is not None else await self._open_pool()
                async with pool.acquire(timeout=self._connect_timeout_s) as connection:
                    db = _PgConnection(connection)
                    try:
                        if not (write or snapshot):
                            return await work(db)
                        await connection.execute(
                            "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                        )
                        result = await work(db)
                        committing = True
                        await connection.execute("COMMIT")
                        return result
                    except BaseException:
                        if (
                            not committing
                            and connection.is_in_transaction()
                            and not connection.is_closed()
                        ):
                            try:
                                await connection.execute("ROLLBACK")
                            except Exception:
                                connection.terminate()
                        raise
            except WalstreamError:
                raise  # a rule's verdict, or a mapped error: the transaction was rolled back
            except Exception as error:
                kind = classify(error)
                code = str(getattr(error, "sqlstate", "") or "")
                if committing and write and kind == "transient" and code not in _NOT_APPLIED_CODES:
                    await self._expire_connections()
                    raise AmbiguousError(
                        f"PostgreSQL at {self._where}: the connection failed while COMMIT was in "
                        f"flight ({type(error).__name__}: {error}); the change may or may not "
                        "have been applied: read back before repeating a non-idempotent call "
                        "(commit_objects may simply be repeated)"
                    ) from error
                if kind != "transient" or self._clock.monotonic() >= deadline:
                    raise translate(error, self._where) from error
                if code[:2] not in ("40", "55"):
                    # Not a lost race but a lost server: replace every pooled connection.
                    await self._expire_connections()
                await self._clock.sleep(self._backoff(attempt))
                attempt += 1

    async def _expire_connections(self) -> None:
        if self._pool is not None:
            await self._pool.expire_connections()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await self._clock.wait_for(pool.close(), self._connect_timeout_s)
            except Exception:
                pool.terminate()  # a connection still busy: drop it rather than hang
