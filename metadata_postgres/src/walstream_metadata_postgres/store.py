"""PostgreSQL :class:`MetadataStore`: one catalogue shared by the nodes of several machines.

* Driver: asyncpg with its connection pool (measured faster than psycopg 3 on the commit path:
  ``bench/_pg_drivers.py``).
* Every call is one transaction. Writes run at READ COMMITTED and lock the rows they read
  (``SELECT … FOR UPDATE`` / ``FOR SHARE``, in the order :mod:`.tables` states); the meaning of
  every change (continuity, epochs, compaction cover …) comes from the shared rules in
  :mod:`walstream.metadata.rules`, exactly as for the SQLite and memory stores. Reads run as one
  ``REPEATABLE READ READ ONLY`` transaction, so a call's several queries see one snapshot.
* Failures: a lost connection, a server that is down, restarting or refusing connections, a
  deadlock or serialization failure are retried (reconnecting, exponential backoff with jitter,
  capped at 1 s) until ``retry_for`` runs out, then :class:`BackendUnavailable`. A connection lost
  while ``COMMIT`` was in flight raises :class:`AmbiguousError` at once (the transaction may have
  been applied): ``commit_objects`` is idempotent, so the engine's retry of it is safe.
* ``statement_timeout`` bounds each statement on the server, ``command_timeout`` on the client
  (a frozen server cannot hang a call), and ``idle_in_transaction_session_timeout`` makes the
  server drop the row locks of a client that vanished mid-transaction.
* The schema is versioned and migrated at start (:mod:`.schema`).
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg
from walstream.clock import Clock, SystemClock, make_rng
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    ConfigError,
    InvalidArgument,
    StreamExists,
    WalstreamError,
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
from walstream.records import DEPLOYMENT_ID_BYTES

from .basins import PostgresBasins
from .errors import classify, translate
from .nodes import PostgresNodes
from .schema import check_schema_name, migrate, quote_identifier
from .tables import (
    GAP_COLUMNS,
    MAX_OFFSET,
    STREAM_COLUMNS,
    Tables,
    gap_of,
    range_of,
    stream_of,
)

__all__ = ["PostgresMetadataStore", "check_dsn"]

T = TypeVar("T")

#: Errors that end a transaction before it could commit, even when raised by ``COMMIT`` itself.
_NOT_APPLIED_CODES = frozenset({"40001", "40P01", "55P03", "53300", "57P03"})
_BACKOFF_FIRST_S = 0.02
_BACKOFF_CAP_S = 1.0


def check_dsn(dsn: str, key: str = "metadata.dsn") -> urllib.parse.SplitResult:
    """A ``postgresql://user[:password]@host[:port]/database[?options]`` URL, else ConfigError."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            f"{key}: expected a URL like postgresql://user@host:5432/database, got "
            f"{redact(dsn)!r} (the keyword=value form is not supported)"
        )
    if "," in parts.netloc:
        return parts  # several hosts (host1:5432,host2:5432): the driver tries each in turn
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as error:
        raise ConfigError(f"{key}: bad port in {redact(dsn)!r} ({error})") from None
    return parts


def redact(dsn: str) -> str:
    """``dsn`` without its password."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class PostgresMetadataStore(PostgresNodes, PostgresBasins, MetadataStore):
    """Metadata in a PostgreSQL schema, shared by every node of a deployment."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "walstream",
        pool_min: int = 1,
        pool_max: int = 10,
        connect_timeout_s: float = 5.0,
        command_timeout_s: float = 10.0,
        retry_for_s: float = 15.0,
        clock: Clock | None = None,
    ) -> None:
        parts = check_dsn(dsn)
        self._dsn = dsn
        self._schema = check_schema_name(schema)
        if pool_min < 0 or pool_max < 1 or pool_min > pool_max:
            raise ConfigError(
                f"metadata.pool_min/pool_max: need 0 <= pool_min <= pool_max and pool_max >= 1, "
                f"got {pool_min}/{pool_max}"
            )
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._retry_for_s = retry_for_s
        self._clock: Clock = clock or SystemClock()
        self._rng = make_rng(None)
        hosts = parts.netloc.rpartition("@")[2] or "localhost:5432"
        self._where = (
            f"{parts.username or '(default user)'}@{hosts}{parts.path or '/'} schema {schema!r}"
        )
        self._pool: Any = None
        self._pool_lock = asyncio.Lock()
        self._deployment_id: bytes | None = None
        self._closed = False

    @property
    def schema(self) -> str:
        return self._schema

    # -- plumbing ---------------------------------------------------------------------------------

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
                server_settings={"application_name": "walstream"},
            )
            try:
                await migrate(connection, self._schema, self._clock.now_ms(), self._where)
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

    def _backoff(self, attempt: int) -> float:
        delay = min(_BACKOFF_CAP_S, _BACKOFF_FIRST_S * (2**attempt))
        return float(delay * (0.5 + self._rng.random() / 2))

    async def _transaction(
        self, write: bool, work: Callable[[Tables], Awaitable[T]], snapshot: bool = True
    ) -> T:
        """Run ``work`` in one transaction, retrying what surely did not apply (module doc).

        A read of one statement (``snapshot=False``) runs without BEGIN/COMMIT: a single
        statement sees one snapshot anyway, and it saves two round trips."""
        if self._closed:
            raise BackendUnavailable(f"postgres metadata {self._where} is closed; open a new store")
        deadline = self._clock.monotonic() + self._retry_for_s
        attempt = 0
        while True:
            committing = False
            try:
                pool = self._pool if self._pool is not None else await self._open_pool()
                async with pool.acquire(timeout=self._connect_timeout_s) as connection:
                    try:
                        if not (write or snapshot):
                            return await work(Tables(connection))
                        await connection.execute(
                            "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                        )
                        result = await work(Tables(connection))
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

    async def _write(self, work: Callable[[Tables], Awaitable[T]]) -> T:
        return await self._transaction(True, work)

    async def _read(self, work: Callable[[Tables], Awaitable[T]], snapshot: bool = False) -> T:
        """A read; ``snapshot=True`` when ``work`` runs several statements that must agree."""
        return await self._transaction(False, work, snapshot)

    # -- identity ---------------------------------------------------------------------------------

    async def deployment_id(self) -> bytes:
        async def work(tables: Tables) -> bytes:
            await tables.db.execute(
                "INSERT INTO deployment (singleton, deployment_id) VALUES (0, $1) "
                "ON CONFLICT (singleton) DO NOTHING",
                os.urandom(DEPLOYMENT_ID_BYTES),
            )
            found = await tables.db.fetchval("SELECT deployment_id FROM deployment")
            return bytes(found)

        if self._deployment_id is None:
            self._deployment_id = await self._write(work)
        return self._deployment_id

    # -- streams ----------------------------------------------------------------------------------

    async def create_stream(self, name: str | None) -> StreamInfo:
        check_stream_name(name)
        created_ms = self._clock.now_ms()

        def exists(stream_id: int | str) -> StreamExists:
            return StreamExists(
                f"stream {name!r} already exists (id {stream_id}); open it instead, or delete "
                "it first"
            )

        async def work(tables: Tables) -> StreamInfo:
            if name is not None:
                existing = await tables.active_stream_named(name)
                if existing is not None:
                    raise exists(existing.stream_id)
            try:
                row = await tables.db.fetchrow(
                    f"INSERT INTO streams ({STREAM_COLUMNS}) VALUES (nextval('stream_ids'), $1, "
                    f"0, 0, 0, 'active', NULL, NULL, $2) RETURNING {STREAM_COLUMNS}",
                    name,
                    created_ms,
                )
            except asyncpg.UniqueViolationError:
                raise exists("created concurrently") from None
            return stream_of(row)

        return await self._write(work)

    async def get_stream(self, name_or_id: str | int) -> StreamInfo:
        async def work(tables: Tables) -> StreamInfo:
            if isinstance(name_or_id, int):
                return await tables.active_stream(name_or_id)
            stream = await tables.active_stream_named(name_or_id)
            if stream is None:
                raise stream_not_found(name_or_id)
            return stream

        return await self._read(work)

    async def get_streams(self, stream_ids: Sequence[int]) -> dict[int, StreamInfo]:
        ids = list(stream_ids)

        async def work(tables: Tables) -> dict[int, StreamInfo]:
            return await tables.streams(ids)

        found = await self._read(work)
        return {stream_id: found[stream_id] for stream_id in ids if stream_id in found}

    async def list_streams(self, prefix: str = "") -> list[StreamInfo]:
        async def work(tables: Tables) -> list[StreamInfo]:
            rows = await tables.db.fetch(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE state = 'active' "
                "AND ($1 = '' OR left(name, length($1)) = $1) ORDER BY stream_id",
                prefix,
            )
            return [stream_of(row) for row in rows]

        return await self._read(work)

    async def delete_stream(self, stream_id: int) -> None:
        async def work(tables: Tables) -> None:
            stream = await tables.stream(stream_id, "FOR UPDATE")
            if stream is None:
                raise stream_not_found(stream_id)
            if stream.state is StreamState.DELETED:
                return
            await tables.db.execute(
                "UPDATE streams SET state = 'deleted' WHERE stream_id = $1", stream_id
            )
            rows = await tables.db.fetch(
                "SELECT DISTINCT object_id FROM ranges WHERE stream_id = $1", stream_id
            )
            await tables.destroy_dead(row[0] for row in rows)

        await self._write(work)

    async def claim_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        async def work(tables: Tables) -> StreamInfo:
            node = await tables.node(node_id, "FOR SHARE")
            stream = await tables.active_stream(stream_id, "FOR UPDATE")
            owner_id = stream.owner_node_id
            owner = node if owner_id == node_id else await tables.node(owner_id, "FOR SHARE")
            claimed = check_claim(stream, node, owner, node_id, node_epoch)
            await tables.put_stream(claimed)
            return claimed

        return await self._write(work)

    async def release_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        async def work(tables: Tables) -> StreamInfo:
            node = await tables.node(node_id, "FOR SHARE")
            stream = await tables.active_stream(stream_id, "FOR UPDATE")
            released = check_release(stream, node, node_id, node_epoch)
            await tables.put_stream(released)
            return released

        return await self._write(work)

    async def release_streams(self, node_id: int, node_epoch: int) -> None:
        async def work(tables: Tables) -> None:
            require_node_epoch(await tables.node(node_id, "FOR SHARE"), node_id, node_epoch)
            await tables.db.execute(
                "UPDATE streams SET owner_node_id = NULL WHERE stream_id IN (SELECT stream_id "
                "FROM streams WHERE owner_node_id = $1 ORDER BY stream_id FOR UPDATE)",
                node_id,
            )

        await self._write(work)

    async def trim_stream(self, stream_id: int, epoch: int, new_start: int) -> StreamInfo:
        async def work(tables: Tables) -> StreamInfo:
            stream = await tables.active_stream(stream_id, "FOR UPDATE")
            require_stream_epoch(stream, epoch, "trim")
            if new_start < 0:
                raise InvalidArgument(f"trim_stream: new start {new_start} is negative")
            if new_start <= stream.start_offset:
                return stream
            await tables.db.execute(
                "UPDATE streams SET start_offset = $1 WHERE stream_id = $2", new_start, stream_id
            )
            # Only ranges that just died can leave an object with no live range.
            rows = await tables.db.fetch(
                "SELECT DISTINCT object_id FROM ranges WHERE stream_id = $1 "
                "AND end_offset > $2 AND end_offset <= $3",
                stream_id,
                stream.start_offset,
                new_start,
            )
            await tables.destroy_dead(row[0] for row in rows)
            return StreamInfo(
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

        return await self._write(work)

    async def set_fencing_token(self, stream_id: int, epoch: int, token: str | None) -> None:
        async def work(tables: Tables) -> None:
            stream = await tables.active_stream(stream_id, "FOR UPDATE")
            require_stream_epoch(stream, epoch, "set the fencing token of")
            await tables.db.execute(
                "UPDATE streams SET fencing_token = $1 WHERE stream_id = $2", token, stream_id
            )

        await self._write(work)

    # -- objects ----------------------------------------------------------------------------------

    async def prepare_objects(self, count: int, ttl_ms: int) -> list[int]:
        check_prepare_args(count, ttl_ms)
        expires_ms = self._clock.now_ms() + ttl_ms

        async def work(tables: Tables) -> list[int]:
            rows = await tables.db.fetch(
                "INSERT INTO objects (object_id, state, expires_ms) "
                "SELECT nextval('object_ids'), 'prepared', $2 FROM generate_series(1, $1) "
                "RETURNING object_id",
                count,
                expires_ms,
            )
            return sorted(row[0] for row in rows)

        return await self._write(work)

    async def commit_objects(
        self, node_id: int, node_epoch: int, objects: Sequence[ObjectCommit]
    ) -> None:
        commits = list(objects)
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> None:
            node = await tables.node(node_id, "FOR SHARE")
            streams = await tables.streams(
                (r.stream_id for c in commits for r in c.ranges), "FOR UPDATE"
            )
            records = await tables.records((c.object_id for c in commits), "FOR UPDATE")
            plan = plan_commit(node, node_id, node_epoch, commits, streams, records, now_ms)
            if plan is None:
                return
            await tables.write(stream_ends=plan.stream_ends, infos=plan.objects)

        await self._write(work)

    async def replace_objects(
        self, source_ids: Sequence[int], new_objects: Sequence[ObjectCommit]
    ) -> None:
        sources = list(source_ids)
        commits = list(new_objects)
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> None:
            # The streams a source names never change once it is committed, so they can be read
            # before locking: streams first, then objects (the lock order).
            named = await tables.db.fetch(
                "SELECT DISTINCT stream_id FROM ranges WHERE object_id = ANY($1::bigint[])",
                sorted(set(sources)),
            )
            stream_ids = [row[0] for row in named] + [
                r.stream_id for c in commits for r in c.ranges
            ]
            streams = await tables.streams(stream_ids, "FOR SHARE")
            records = await tables.records(
                [*sources, *(c.object_id for c in commits)], "FOR UPDATE"
            )
            final = plan_replace(sources, commits, streams, records, now_ms)
            await tables.write(destroyed=sources, infos=final)

        await self._write(work)

    async def get_objects(
        self, stream_id: int, start_offset: int, end_offset: int | None = None, limit: int = 100
    ) -> list[ObjectInfo]:
        check_object_limit(limit)
        end = MAX_OFFSET if end_offset is None else end_offset

        async def work(tables: Tables) -> list[ObjectInfo]:
            # COMMITTED ranges of one stream never overlap (continuity; compaction swaps whole
            # ranges), so end order is start order and the (stream_id, end_offset) index serves
            # both the filter and the order: the scan starts at start_offset and stops after
            # ``limit`` rows, however many objects lie before it.
            rows = await tables.db.fetch(GET_OBJECTS_SQL, stream_id, start_offset, end, limit)
            return [
                ObjectInfo(
                    object_id=row[0],
                    key=row[1],
                    kind=ObjectKind(row[2]),
                    state=ObjectState.COMMITTED,
                    size=row[3],
                    index_size=row[4],
                    ranges=(range_of(tuple(row)[6:]),),
                    committed_ms=row[5],
                )
                for row in rows
            ]

        return await self._read(work)

    async def list_objects(
        self, state: ObjectState | None = None, kind: ObjectKind | None = None
    ) -> list[ObjectInfo]:
        async def work(tables: Tables) -> list[ObjectInfo]:
            rows = await tables.db.fetch(
                "SELECT object_id FROM objects WHERE ($1::text IS NULL OR state = $1) "
                "AND ($2::text IS NULL OR kind = $2)",
                None if state is None else state.value,
                None if kind is None else kind.value,
            )
            records = await tables.records(row[0] for row in rows)
            return [records[object_id].info for object_id in sorted(records)]

        return await self._read(work, snapshot=True)

    async def expired_prepared(self, now_ms: int) -> list[int]:
        async def work(tables: Tables) -> list[int]:
            # Rows locked in id order, like every other writer of objects (no deadlock).
            rows = await tables.db.fetch(
                "UPDATE objects SET expired = true WHERE object_id IN (SELECT object_id FROM "
                "objects WHERE state = 'prepared' AND expires_ms <= $1 ORDER BY object_id "
                "FOR UPDATE) RETURNING object_id",
                now_ms,
            )
            return sorted(row[0] for row in rows)

        return await self._write(work)

    async def forget_objects(self, object_ids: Sequence[int]) -> None:
        """Ids in other states (or unknown) are left alone."""
        ids = sorted(set(object_ids))

        async def work(tables: Tables) -> None:
            rows = await tables.db.fetch(
                "SELECT object_id FROM objects WHERE object_id = ANY($1::bigint[]) "
                "AND (state = 'mark_destroyed' OR (state = 'prepared' AND expired)) "
                "ORDER BY object_id FOR UPDATE",
                ids,
            )
            doomed = [row[0] for row in rows]
            if doomed:
                await tables.db.execute(
                    "DELETE FROM ranges WHERE object_id = ANY($1::bigint[])", doomed
                )
                await tables.db.execute(
                    "DELETE FROM objects WHERE object_id = ANY($1::bigint[])", doomed
                )

        if ids:
            await self._write(work)

    # -- data loss --------------------------------------------------------------------------------

    async def record_data_loss(self, node_id: int, node_epoch: int, gap: DataLossGap) -> StreamInfo:
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> StreamInfo:
            node = await tables.node(node_id, "FOR SHARE")
            stream = await tables.stream(gap.stream_id, "FOR UPDATE")
            row = await tables.db.fetchrow(
                f"SELECT {GAP_COLUMNS} FROM data_loss WHERE stream_id = $1 AND start_offset = $2",
                gap.stream_id,
                gap.start_offset,
            )
            recorded = None if row is None else gap_of(row)
            changed = plan_data_loss(node, node_id, node_epoch, stream, gap, recorded)
            if changed is None:
                assert stream is not None
                return stream
            await tables.db.execute(
                "UPDATE streams SET committed_end = $1 WHERE stream_id = $2",
                changed.committed_end,
                changed.stream_id,
            )
            await tables.db.execute(
                f"INSERT INTO data_loss ({GAP_COLUMNS}) VALUES ($1, $2, $3, $4, $5)",
                gap.stream_id,
                gap.start_offset,
                gap.end_offset,
                gap.reason,
                now_ms,
            )
            return changed

        return await self._write(work)

    async def get_data_loss(
        self, stream_id: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[DataLossGap]:
        check_data_loss_range(stream_id, start_offset, end_offset)
        end = MAX_OFFSET if end_offset is None else end_offset

        async def work(tables: Tables) -> list[DataLossGap]:
            rows = await tables.db.fetch(
                f"SELECT {GAP_COLUMNS} FROM data_loss WHERE stream_id = $1 AND end_offset > $2 "
                "AND start_offset < $3 ORDER BY start_offset",
                stream_id,
                start_offset,
                end,
            )
            return [gap_of(row) for row in rows]

        return await self._read(work)

    # -- lifecycle --------------------------------------------------------------------------------

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

    def describe(self) -> dict[str, Any]:
        return {"type": "postgres", "dsn": redact(self._dsn), "schema": self._schema}


#: The read path of :meth:`PostgresMetadataStore.get_objects` (also checked with EXPLAIN).
GET_OBJECTS_SQL = (
    "SELECT o.object_id, o.key, o.kind, o.size, o.index_size, o.committed_ms, "
    "r.stream_id, r.start_offset, r.end_offset, r.epoch, r.min_timestamp_ms, r.max_timestamp_ms "
    "FROM ranges AS r JOIN objects AS o ON o.object_id = r.object_id "
    "WHERE r.stream_id = $1 AND r.end_offset > $2 AND r.start_offset < $3 "
    "AND o.state = 'committed' ORDER BY r.end_offset LIMIT $4"
)
