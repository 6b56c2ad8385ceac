"""The SQL :class:`MetadataStore`: every operation's logic and SQL, once for SQLite and PostgreSQL.

Every call is one transaction (:meth:`SqlStoreBase._write` / ``_read``) run by the store's
:class:`~walstream.metadata.sql.dialect.Dialect`. A write loads the rows it touches, locking them
in the order :mod:`.tables` states, asks the shared rules of :mod:`walstream.metadata.rules` what
changes (continuity, epochs, compaction cover …; the memory store runs the same rules), and writes
the result in the same transaction. The node, lease and failover calls are in :mod:`.nodes`, the
basin calls in :mod:`.basins`, the key/value calls in :mod:`.kv`.

A backend is a dialect and a small subclass that builds it: :mod:`walstream.metadata.sqlite`
(the embedded default) and ``walstream_metadata_postgres``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from walstream.errors import FencedError, InvalidArgument, StreamExists
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
from walstream.metadata.rows import (
    GAP_COLUMNS,
    MAX_OFFSET,
    STREAM_COLUMNS,
    gap_of,
    range_of,
    stream_of,
)
from walstream.metadata.rules import (
    check_claim,
    check_claim_count,
    check_config_changes,
    check_create_streams_args,
    check_creation_token,
    check_data_loss_range,
    check_due_limit,
    check_list_streams_args,
    check_object_limit,
    check_prepare_args,
    check_release,
    check_stream_config,
    check_stream_name,
    has_lifecycle,
    lifecycle_due_on_change,
    plan_commit,
    plan_data_loss,
    plan_replace,
    prefix_end,
    require_node_epoch,
    require_stream_epoch,
    stream_exists,
    stream_not_found,
)
from walstream.metadata.sql.basins import SqlBasins
from walstream.metadata.sql.dialect import Lock
from walstream.metadata.sql.kv import SqlKv
from walstream.metadata.sql.nodes import SqlNodes
from walstream.metadata.sql.tables import Tables
from walstream.records import DEPLOYMENT_ID_BYTES
from walstream.stream_config import StreamConfig

__all__ = ["GET_OBJECTS_SQL", "UNNAMED_PAGE_SQL", "SqlMetadataStore", "named_page_sql"]

#: The read path of :meth:`SqlMetadataStore.get_objects` (each dialect checks its plan in tests).
#: COMMITTED ranges of one stream never overlap (continuity; compaction swaps whole ranges), so
#: end order is start order and the ``(stream_id, end_offset)`` index serves both the filter and
#: the order: the scan starts at the start offset and stops after ``limit`` rows, however many
#: objects lie before it.
GET_OBJECTS_SQL = (
    "SELECT o.object_id, o.key, o.kind, o.size, o.index_size, o.committed_ms, "
    "r.stream_id, r.start_offset, r.end_offset, r.epoch, r.min_timestamp_ms, r.max_timestamp_ms "
    "FROM ranges AS r JOIN objects AS o ON o.object_id = r.object_id "
    "WHERE r.stream_id = $1 AND r.end_offset > $2 AND r.start_offset < $3 "
    "AND o.state = 'committed' ORDER BY r.end_offset LIMIT $4"
)


def named_page_sql(name: str, bounded: bool, limited: bool) -> str:
    """The read of one page of named streams (:meth:`SqlMetadataStore.list_streams`): names above
    ``$1`` and from the prefix ``$2``, below ``$3`` when ``bounded`` (the prefix's end), at most
    the last argument's count when ``limited``; ``name`` is the dialect's
    :attr:`~walstream.metadata.sql.dialect.Dialect.name_bytes` (each dialect checks its plan in
    tests: an index range scan)."""
    sql = (
        f"SELECT {STREAM_COLUMNS} FROM streams WHERE state = 'active' "
        f"AND {name} > $1 AND {name} >= $2"
    )
    last = 2
    if bounded:
        last += 1
        sql += f" AND {name} < ${last}"
    sql += f" ORDER BY {name}"
    if limited:
        sql += f" LIMIT ${last + 1}"
    return sql


#: The read of one page of streams without a name, by id (``$1``: after this id; ``$2``: limit).
UNNAMED_PAGE_SQL = (
    f"SELECT {STREAM_COLUMNS} FROM streams WHERE state = 'active' "
    "AND name IS NULL AND stream_id > $1 ORDER BY stream_id"
)


class SqlMetadataStore(SqlNodes, SqlBasins, SqlKv, MetadataStore):
    """A :class:`MetadataStore` over a SQL database reached through a dialect."""

    _deployment_id: bytes | None = None

    # -- identity -----------------------------------------------------------------------------------

    async def deployment_id(self) -> bytes:
        async def work(tables: Tables) -> bytes:
            await tables.db.execute(
                "INSERT INTO deployment (singleton, deployment_id) VALUES (0, $1) "
                "ON CONFLICT (singleton) DO NOTHING",
                os.urandom(DEPLOYMENT_ID_BYTES),
            )
            return bytes(await tables.db.fetchval("SELECT deployment_id FROM deployment"))

        if self._deployment_id is None:
            self._deployment_id = await self._write(work)
        return self._deployment_id

    # -- streams ------------------------------------------------------------------------------------

    async def create_stream(
        self,
        name: str | None,
        config: StreamConfig | None = None,
        *,
        creation_token: str | None = None,
    ) -> StreamInfo:
        check_stream_name(name)
        config = check_stream_config(config)
        token = check_creation_token(creation_token)
        created_ms = self._clock.now_ms()
        due_ms = created_ms if has_lifecycle(config) else None

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
            new_id = await tables.dialect.new_id(tables.db, "stream_ids")
            # ON CONFLICT: another transaction created the name since the check above (the
            # unique index of active names); never the case while SQLite holds the file.
            row = await tables.db.fetchrow(
                f"INSERT INTO streams ({STREAM_COLUMNS}) VALUES ({new_id}, $1, 0, 0, 0, 'active', "
                f"NULL, NULL, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING {STREAM_COLUMNS}",
                name,
                created_ms,
                config.encode(),
                token,
                due_ms,
            )
            if row is None:
                raise exists("created concurrently")
            return stream_of(row)

        return await self._write(work)

    async def reconfigure_stream(self, stream_id: int, changes: dict[str, Any]) -> StreamInfo:
        check_config_changes(changes)
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> StreamInfo:
            stream = await tables.active_stream(stream_id, Lock.UPDATE)
            config = stream.config.with_changes(changes)
            due_ms = stream.lifecycle_due_ms
            if lifecycle_due_on_change(stream.config, config):
                due_ms = now_ms
            await tables.db.execute(
                "UPDATE streams SET config = $1, lifecycle_due_ms = $2 WHERE stream_id = $3",
                config.encode(),
                due_ms,
                stream_id,
            )
            return dataclasses.replace(stream, config=config, lifecycle_due_ms=due_ms)

        return await self._write(work)

    async def due_streams(
        self, now_ms: int, limit: int = 100, start_after: tuple[int, int] | None = None
    ) -> list[StreamInfo]:
        check_due_limit(limit)
        after_due, after_id = start_after if start_after is not None else (-(1 << 62), -1)

        async def work(tables: Tables) -> list[StreamInfo]:
            rows = await tables.db.fetch(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE lifecycle_due_ms IS NOT NULL "
                "AND lifecycle_due_ms <= $1 AND state = 'active' "
                "AND (lifecycle_due_ms > $3 OR (lifecycle_due_ms = $3 AND stream_id > $4)) "
                "ORDER BY lifecycle_due_ms, stream_id LIMIT $2",
                now_ms,
                limit,
                after_due,
                after_id,
            )
            return [stream_of(row) for row in rows]

        return await self._read(work)

    async def set_lifecycle_due(
        self, stream_id: int, due_ms: int | None, *, if_due_ms: int | None = None
    ) -> bool:
        async def work(tables: Tables) -> bool:
            stream = await tables.stream(stream_id, Lock.UPDATE)
            if (
                stream is None
                or stream.state is not StreamState.ACTIVE
                or stream.lifecycle_due_ms != if_due_ms
            ):
                return False
            await tables.db.execute(
                "UPDATE streams SET lifecycle_due_ms = $1 WHERE stream_id = $2", due_ms, stream_id
            )
            return True

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

    async def list_streams(
        self, prefix: str = "", start_after: str | int | None = None, limit: int | None = None
    ) -> list[StreamInfo]:
        check_list_streams_args(prefix, start_after, limit)
        unnamed = prefix == "" and not isinstance(start_after, str)
        after_name = start_after if isinstance(start_after, str) else ""
        # Named streams: the prefix as a name range, so the index of active names bounds the
        # scan at both ends (in byte order: the dialect's name_bytes), and LIMIT ends it.
        end = prefix_end(prefix)
        name = self._dialect.name_bytes

        async def work(tables: Tables) -> list[StreamInfo]:
            found: list[StreamInfo] = []
            if unnamed:
                # Streams without a name, by id, through their own partial index.
                args: list[object] = [0 if start_after is None else start_after]
                sql = UNNAMED_PAGE_SQL
                if limit is not None:
                    args.append(limit)
                    sql += " LIMIT $2"
                found = [stream_of(row) for row in await tables.db.fetch(sql, *args)]
            left = None if limit is None else limit - len(found)
            if left is None or left > 0:
                args = [after_name, prefix]
                if end is not None:
                    args.append(end)
                if left is not None:
                    args.append(left)
                sql = named_page_sql(name, end is not None, left is not None)
                found += [stream_of(row) for row in await tables.db.fetch(sql, *args)]
            return found

        return await self._read(work, snapshot=unnamed)

    async def create_streams(
        self, names: Sequence[str], config: StreamConfig | None = None
    ) -> list[StreamInfo]:
        wanted = check_create_streams_args(names)
        config = check_stream_config(config)
        created_ms = self._clock.now_ms()
        due_ms = created_ms if has_lifecycle(config) else None

        async def work(tables: Tables) -> list[StreamInfo]:
            taken = await tables.active_streams_named(wanted)
            for name in wanted:
                if name in taken:
                    raise stream_exists(name, taken[name])
            return await tables.dialect.insert_streams(
                tables.db, wanted, created_ms, config, due_ms
            )

        return await self._write(work)

    async def claim_streams(
        self, stream_ids: Sequence[int], node_id: int, node_epoch: int
    ) -> dict[int, StreamInfo]:
        ids = list(stream_ids)
        check_claim_count("claim_streams", len(ids))

        async def work(tables: Tables) -> dict[int, StreamInfo]:
            node = await tables.node(node_id, Lock.SHARE)
            require_node_epoch(node, node_id, node_epoch)
            streams = await tables.streams(ids, Lock.UPDATE)
            owner_ids = {
                s.owner_node_id
                for s in streams.values()
                if s.owner_node_id is not None and s.owner_node_id != node_id
            }
            owners = {
                owner_id: await tables.node(owner_id, Lock.SHARE) for owner_id in sorted(owner_ids)
            }
            claimed: dict[int, StreamInfo] = {}
            for stream_id, stream in streams.items():
                if stream.state is not StreamState.ACTIVE:
                    continue
                owner_id = stream.owner_node_id
                owner = node if owner_id == node_id else owners.get(owner_id or 0)
                try:
                    claimed[stream_id] = check_claim(stream, node, owner, node_id, node_epoch)
                except FencedError:
                    continue  # owned by a node still running: claim_stream says so
            await tables.claim(claimed.values(), node_id)
            return claimed

        return await self._write(work)

    async def adopt_streams(
        self, node_id: int, node_epoch: int, start_after: int = 0, limit: int = 10_000
    ) -> list[StreamInfo]:
        check_claim_count("adopt_streams", limit)

        async def work(tables: Tables) -> list[StreamInfo]:
            node = await tables.node(node_id, Lock.SHARE)
            require_node_epoch(node, node_id, node_epoch)
            rows = await tables.db.fetch(
                f"SELECT {STREAM_COLUMNS} FROM streams WHERE owner_node_id = $1 "
                "AND state = 'active' AND stream_id > $2 ORDER BY stream_id LIMIT $3 "
                f"{tables.dialect.lock(Lock.UPDATE)}",
                node_id,
                start_after,
                limit,
            )
            adopted = [check_claim(stream_of(row), node, node, node_id, node_epoch) for row in rows]
            await tables.claim(adopted, node_id)
            return adopted

        return await self._write(work)

    async def delete_stream(self, stream_id: int) -> None:
        async def work(tables: Tables) -> None:
            stream = await tables.stream(stream_id, Lock.UPDATE)
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
            node = await tables.node(node_id, Lock.SHARE)
            stream = await tables.active_stream(stream_id, Lock.UPDATE)
            owner_id = stream.owner_node_id
            owner = node if owner_id == node_id else await tables.node(owner_id, Lock.SHARE)
            claimed = check_claim(stream, node, owner, node_id, node_epoch)
            await tables.put_stream(claimed)
            return claimed

        return await self._write(work)

    async def release_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        async def work(tables: Tables) -> StreamInfo:
            node = await tables.node(node_id, Lock.SHARE)
            stream = await tables.active_stream(stream_id, Lock.UPDATE)
            released = check_release(stream, node, node_id, node_epoch)
            await tables.put_stream(released)
            return released

        return await self._write(work)

    async def release_streams(self, node_id: int, node_epoch: int) -> None:
        async def work(tables: Tables) -> None:
            require_node_epoch(await tables.node(node_id, Lock.SHARE), node_id, node_epoch)
            await tables.db.execute(
                "UPDATE streams SET owner_node_id = NULL WHERE stream_id IN (SELECT stream_id "
                "FROM streams WHERE owner_node_id = $1 ORDER BY stream_id "
                f"{tables.dialect.lock(Lock.UPDATE)})",
                node_id,
            )

        await self._write(work)

    async def trim_stream(self, stream_id: int, epoch: int, new_start: int) -> StreamInfo:
        async def work(tables: Tables) -> StreamInfo:
            stream = await tables.active_stream(stream_id, Lock.UPDATE)
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
            return dataclasses.replace(stream, start_offset=new_start)

        return await self._write(work)

    async def set_fencing_token(self, stream_id: int, epoch: int, token: str | None) -> None:
        async def work(tables: Tables) -> None:
            stream = await tables.active_stream(stream_id, Lock.UPDATE)
            require_stream_epoch(stream, epoch, "set the fencing token of")
            await tables.db.execute(
                "UPDATE streams SET fencing_token = $1 WHERE stream_id = $2", token, stream_id
            )

        await self._write(work)

    # -- objects ------------------------------------------------------------------------------------

    async def prepare_objects(self, count: int, ttl_ms: int) -> list[int]:
        check_prepare_args(count, ttl_ms)
        expires_ms = self._clock.now_ms() + ttl_ms

        async def work(tables: Tables) -> list[int]:
            return await tables.dialect.insert_prepared(tables.db, count, expires_ms)

        return await self._write(work)

    async def commit_objects(
        self, node_id: int, node_epoch: int, objects: Sequence[ObjectCommit]
    ) -> None:
        commits = list(objects)
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> None:
            node = await tables.node(node_id, Lock.SHARE)
            streams = await tables.streams(
                (r.stream_id for c in commits for r in c.ranges), Lock.UPDATE
            )
            records = await tables.records((c.object_id for c in commits), Lock.UPDATE)
            plan = plan_commit(node, node_id, node_epoch, commits, streams, records, now_ms)
            if plan is None:
                return
            await tables.write(stream_ends=plan.stream_ends, infos=plan.objects)
            for stream_id, due_ms in sorted(plan.lifecycle_due.items()):
                await tables.db.execute(
                    "UPDATE streams SET lifecycle_due_ms = $1 WHERE stream_id = $2",
                    due_ms,
                    stream_id,
                )

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
                "SELECT DISTINCT stream_id FROM ranges "
                f"WHERE object_id {tables.dialect.any_id('$1')}",
                tables.dialect.id_list(sorted(set(sources))),
            )
            stream_ids = [row[0] for row in named] + [
                r.stream_id for c in commits for r in c.ranges
            ]
            streams = await tables.streams(stream_ids, Lock.SHARE)
            records = await tables.records([*sources, *(c.object_id for c in commits)], Lock.UPDATE)
            final = plan_replace(sources, commits, streams, records, now_ms)
            await tables.write(destroyed=sources, infos=final)

        await self._write(work)

    async def get_objects(
        self, stream_id: int, start_offset: int, end_offset: int | None = None, limit: int = 100
    ) -> list[ObjectInfo]:
        check_object_limit(limit)
        end = MAX_OFFSET if end_offset is None else end_offset

        async def work(tables: Tables) -> list[ObjectInfo]:
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
                "SELECT object_id FROM objects WHERE (CAST($1 AS TEXT) IS NULL OR state = $1) "
                "AND (CAST($2 AS TEXT) IS NULL OR kind = $2)",
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
                "UPDATE objects SET expired = TRUE WHERE object_id IN (SELECT object_id FROM "
                "objects WHERE state = 'prepared' AND expires_ms <= $1 ORDER BY object_id "
                f"{tables.dialect.lock(Lock.UPDATE)}) RETURNING object_id",
                now_ms,
            )
            return sorted(row[0] for row in rows)

        return await self._write(work)

    async def forget_objects(self, object_ids: Sequence[int]) -> None:
        """Ids in other states (or unknown) are left alone."""
        ids = sorted(set(object_ids))

        async def work(tables: Tables) -> None:
            any_id = tables.dialect.any_id("$1")
            rows = await tables.db.fetch(
                f"SELECT object_id FROM objects WHERE object_id {any_id} "
                "AND (state = 'mark_destroyed' OR (state = 'prepared' AND expired)) "
                f"ORDER BY object_id {tables.dialect.lock(Lock.UPDATE)}",
                tables.dialect.id_list(ids),
            )
            doomed = tables.dialect.id_list([row[0] for row in rows])
            if rows:
                await tables.db.execute(f"DELETE FROM ranges WHERE object_id {any_id}", doomed)
                await tables.db.execute(f"DELETE FROM objects WHERE object_id {any_id}", doomed)

        if ids:
            await self._write(work)

    # -- data loss ----------------------------------------------------------------------------------

    async def record_data_loss(self, node_id: int, node_epoch: int, gap: DataLossGap) -> StreamInfo:
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> StreamInfo:
            node = await tables.node(node_id, Lock.SHARE)
            stream = await tables.stream(gap.stream_id, Lock.UPDATE)
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
