"""Row access inside one transaction of a SQL metadata store, the same on every dialect.

Lock order (PostgreSQL; every write transaction follows it, so two transactions never wait on
each other in a cycle): stream rows in id order, then object rows in id order. Node rows are
locked ``FOR SHARE`` by the transactions that check a node epoch (a commit holds its node's epoch
steady; a failover waits for it); the transactions that update a node row lock nothing else, so
a node lock can never close a cycle. Should PostgreSQL still report a deadlock, its dialect
retries. Write transactions run at READ COMMITTED: a row read ``FOR UPDATE``/``FOR SHARE`` is the
newest committed version, and it cannot change until this transaction ends, so the pure rules of
:mod:`walstream.metadata.rules` judge exactly the rows that will be written. On SQLite a write
transaction holds the whole file (``BEGIN IMMEDIATE``), which is the same guarantee, and the lock
clauses render as nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from walstream.metadata.contract import (
    NodeInfo,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamInfo,
    StreamState,
)
from walstream.metadata.rows import (
    NODE_COLUMNS,
    OBJECT_COLUMNS,
    RANGE_COLUMNS,
    STREAM_COLUMNS,
    node_of,
    range_of,
    stream_of,
)
from walstream.metadata.rules import ObjectRecord, all_ranges_dead, stream_not_found
from walstream.metadata.sql.dialect import Connection, Dialect, Lock

__all__ = ["Tables"]

_OBJECT_COLUMNS_OF_O = ", ".join(f"o.{c.strip()}" for c in OBJECT_COLUMNS.split(","))
_RANGE_COLUMNS_OF_R = ", ".join(f"r.{c.strip()}" for c in RANGE_COLUMNS.split(","))


def _ids(values: Iterable[int]) -> list[int]:
    return sorted(set(values))


class Tables:
    """The rows one transaction touches: ``db`` is the transaction's connection."""

    def __init__(self, db: Connection, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect

    # -- streams ------------------------------------------------------------------------------------

    async def stream(self, stream_id: int, lock: Lock | None = None) -> StreamInfo | None:
        row = await self.db.fetchrow(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE stream_id = $1 {self.dialect.lock(lock)}",
            stream_id,
        )
        return None if row is None else stream_of(row)

    async def active_stream(self, stream_id: int, lock: Lock | None = None) -> StreamInfo:
        stream = await self.stream(stream_id, lock)
        if stream is None or stream.state is not StreamState.ACTIVE:
            raise stream_not_found(stream_id, deleted=stream is not None)
        return stream

    async def active_stream_named(self, name: str) -> StreamInfo | None:
        row = await self.db.fetchrow(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE name = $1 AND state = 'active'", name
        )
        return None if row is None else stream_of(row)

    async def active_streams_named(self, names: Sequence[str]) -> dict[str, int]:
        """The ids of the ACTIVE streams among ``names``, by name (the index of active names,
        one look-up per name)."""
        found: dict[str, int] = {}
        for name in names:
            stream_id = await self.db.fetchval(
                "SELECT stream_id FROM streams WHERE name = $1 AND state = 'active'", name
            )
            if stream_id is not None:
                found[name] = int(stream_id)
        return found

    async def claim(self, claimed: Iterable[StreamInfo], node_id: int) -> None:
        """Write the claims of ``claimed`` (read locked in this transaction, each one epoch
        above its row): one statement."""
        ids = _ids(stream.stream_id for stream in claimed)
        if ids:
            await self.db.execute(
                "UPDATE streams SET epoch = epoch + 1, owner_node_id = $1 "
                f"WHERE stream_id {self.dialect.any_id('$2')}",
                node_id,
                self.dialect.id_list(ids),
            )

    async def streams(
        self, stream_ids: Iterable[int], lock: Lock | None = None
    ) -> dict[int, StreamInfo]:
        """Streams by id; ``lock`` locks them in id order."""
        ids = _ids(stream_ids)
        if not ids:
            return {}
        rows = await self.db.fetch(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE stream_id {self.dialect.any_id('$1')} "
            f"ORDER BY stream_id {self.dialect.lock(lock)}",
            self.dialect.id_list(ids),
        )
        return {row[0]: stream_of(row) for row in rows}

    async def put_stream(self, stream: StreamInfo) -> None:
        await self.db.execute(
            "UPDATE streams SET epoch = $1, start_offset = $2, committed_end = $3, state = $4, "
            "owner_node_id = $5, fencing_token = $6 WHERE stream_id = $7",
            stream.epoch,
            stream.start_offset,
            stream.committed_end,
            stream.state.value,
            stream.owner_node_id,
            stream.fencing_token,
            stream.stream_id,
        )

    # -- objects ------------------------------------------------------------------------------------

    async def records(
        self, object_ids: Iterable[int], lock: Lock | None = None
    ) -> dict[int, ObjectRecord]:
        """Object rows with their ranges (one query); ``lock`` locks the object rows in id
        order."""
        ids = _ids(object_ids)
        if not ids:
            return {}
        rows = await self.db.fetch(
            f"SELECT {_OBJECT_COLUMNS_OF_O}, {_RANGE_COLUMNS_OF_R} FROM objects AS o "
            "LEFT JOIN ranges AS r ON r.object_id = o.object_id "
            f"WHERE o.object_id {self.dialect.any_id('$1')} "
            f"ORDER BY o.object_id, r.stream_id, r.start_offset {self.dialect.lock(lock, 'o')}",
            self.dialect.id_list(ids),
        )
        grouped: dict[int, list[Sequence[Any]]] = {}
        for row in rows:
            grouped.setdefault(row[0], []).append(row)
        found: dict[int, ObjectRecord] = {}
        for object_id, members in grouped.items():
            row = members[0]
            ranges = tuple(range_of(m[9:]) for m in members if m[9] is not None)
            info = ObjectInfo(
                object_id=object_id,
                key=row[4],
                kind=ObjectKind(row[5]),
                state=ObjectState(row[1]),
                size=row[6],
                index_size=row[7],
                ranges=ranges,
                committed_ms=row[8],
            )
            found[object_id] = ObjectRecord(info, expires_ms=row[2], expired=bool(row[3]))
        return found

    async def write(
        self,
        stream_ends: Mapping[int, int] | None = None,
        destroyed: Sequence[int] = (),
        infos: Sequence[ObjectInfo] = (),
    ) -> None:
        """Set streams' ``committed_end``, mark ``destroyed`` objects MARK_DESTROYED and write
        PREPARED objects' final state and ranges (:meth:`Dialect.write_objects`)."""
        await self.dialect.write_objects(self.db, stream_ends or {}, destroyed, infos)

    async def set_object_state(self, object_ids: Iterable[int], state: ObjectState) -> None:
        ids = _ids(object_ids)
        if ids:
            await self.db.execute(
                f"UPDATE objects SET state = $1 WHERE object_id {self.dialect.any_id('$2')}",
                state.value,
                self.dialect.id_list(ids),
            )

    async def destroy_dead(self, object_ids: Iterable[int]) -> None:
        """Mark MARK_DESTROYED the COMMITTED objects among ``object_ids`` with only dead ranges.

        The object rows are locked first: two transactions trimming different streams of one
        multi-stream object then run this one after the other, and the second sees the first's
        trim, so the object is destroyed once both ranges are dead."""
        records = await self.records(object_ids, Lock.UPDATE)
        streams = await self.streams(
            r.stream_id for record in records.values() for r in record.info.ranges
        )
        await self.set_object_state(
            (
                object_id
                for object_id, record in records.items()
                if record.info.state is ObjectState.COMMITTED
                and all_ranges_dead(record.info.ranges, streams)
            ),
            ObjectState.MARK_DESTROYED,
        )

    # -- nodes --------------------------------------------------------------------------------------

    async def node(self, node_id: int | None, lock: Lock | None = None) -> NodeInfo | None:
        if node_id is None:
            return None
        row = await self.db.fetchrow(
            f"SELECT {NODE_COLUMNS} FROM nodes WHERE node_id = $1 {self.dialect.lock(lock)}",
            node_id,
        )
        return None if row is None else node_of(row)
