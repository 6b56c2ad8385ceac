"""Row access inside one PostgreSQL transaction, and the row codecs.

Lock order (every write transaction follows it, so two transactions never wait on each other in
a cycle): stream rows in id order, then object rows in id order. Node rows are locked
``FOR SHARE`` by the transactions that check a node epoch (a commit holds its node's epoch steady;
a failover waits for it); the transactions that update a node row lock nothing else, so a node
lock can never close a cycle. Should PostgreSQL still report a deadlock, the store retries. Transactions run at READ
COMMITTED: a row read ``FOR UPDATE``/``FOR SHARE`` is the newest committed version, and it cannot
change until this transaction ends, so the pure rules judge exactly the rows that will be written.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
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
from walstream.metadata.rules import ObjectRecord, all_ranges_dead, stream_not_found

__all__ = [
    "GAP_COLUMNS",
    "MAX_OFFSET",
    "NODE_COLUMNS",
    "STREAM_COLUMNS",
    "Tables",
    "gap_of",
    "node_of",
    "range_of",
    "stream_of",
]

_OBJECT_COLUMNS_OF_O = ", ".join(f"o.{c.strip()}" for c in OBJECT_COLUMNS.split(","))
_RANGE_COLUMNS_OF_R = ", ".join(f"r.{c.strip()}" for c in RANGE_COLUMNS.split(","))


def _ids(values: Iterable[int]) -> list[int]:
    return sorted(set(values))


class Tables:
    """The rows one transaction touches, on an asyncpg connection inside a transaction."""

    def __init__(self, connection: Any) -> None:
        self.db = connection

    # -- streams ----------------------------------------------------------------------------------

    async def stream(self, stream_id: int, lock: str = "") -> StreamInfo | None:
        row = await self.db.fetchrow(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE stream_id = $1 {lock}", stream_id
        )
        return None if row is None else stream_of(row)

    async def active_stream(self, stream_id: int, lock: str = "") -> StreamInfo:
        stream = await self.stream(stream_id, lock)
        if stream is None or stream.state is not StreamState.ACTIVE:
            raise stream_not_found(stream_id, deleted=stream is not None)
        return stream

    async def active_stream_named(self, name: str) -> StreamInfo | None:
        row = await self.db.fetchrow(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE name = $1 AND state = 'active'", name
        )
        return None if row is None else stream_of(row)

    async def streams(self, stream_ids: Iterable[int], lock: str = "") -> dict[int, StreamInfo]:
        """Streams by id; ``lock`` (``FOR UPDATE`` / ``FOR SHARE``) locks them in id order."""
        ids = _ids(stream_ids)
        if not ids:
            return {}
        rows = await self.db.fetch(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE stream_id = ANY($1::bigint[]) "
            f"ORDER BY stream_id {lock}",
            ids,
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

    # -- objects ----------------------------------------------------------------------------------

    async def records(self, object_ids: Iterable[int], lock: str = "") -> dict[int, ObjectRecord]:
        """Object rows with their ranges (one query); ``lock`` (``FOR UPDATE``) locks the object
        rows in id order."""
        ids = _ids(object_ids)
        if not ids:
            return {}
        rows = await self.db.fetch(
            f"SELECT {_OBJECT_COLUMNS_OF_O}, {_RANGE_COLUMNS_OF_R} FROM objects AS o "
            "LEFT JOIN ranges AS r ON r.object_id = o.object_id "
            "WHERE o.object_id = ANY($1::bigint[]) "
            f"ORDER BY o.object_id, r.stream_id, r.start_offset {f'{lock} OF o' if lock else ''}",
            ids,
        )
        found: dict[int, ObjectRecord] = {}
        for object_id, group in itertools.groupby(rows, key=lambda row: int(row[0])):
            members = list(group)
            row = members[0]
            ranges = tuple(range_of(tuple(m)[9:]) for m in members if m[9] is not None)
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
        stream_ends: dict[int, int] | None = None,
        destroyed: Sequence[int] = (),
        infos: Sequence[ObjectInfo] = (),
    ) -> None:
        """In one statement: set streams' ``committed_end``, mark ``destroyed`` objects
        MARK_DESTROYED, and write PREPARED objects' final state and ranges (``infos``).

        One round trip whatever the counts (data-modifying CTEs over arrays); ``destroyed`` and
        ``infos`` never name the same object (sources are committed, new objects prepared)."""
        ends = stream_ends or {}
        ranges = [(info.object_id, r) for info in infos for r in info.ranges]
        await self.db.execute(
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
            list(ends),
            list(ends.values()),
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

    async def set_object_state(self, object_ids: Iterable[int], state: ObjectState) -> None:
        ids = _ids(object_ids)
        if ids:
            await self.db.execute(
                "UPDATE objects SET state = $1 WHERE object_id = ANY($2::bigint[])",
                state.value,
                ids,
            )

    async def destroy_dead(self, object_ids: Iterable[int]) -> None:
        """Mark MARK_DESTROYED the COMMITTED objects among ``object_ids`` with only dead ranges.

        The object rows are locked first: two transactions trimming different streams of one
        multi-stream object then run this one after the other, and the second sees the first's
        trim, so the object is destroyed once both ranges are dead."""
        records = await self.records(object_ids, "FOR UPDATE")
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

    # -- nodes ------------------------------------------------------------------------------------

    async def node(self, node_id: int | None, lock: str = "") -> NodeInfo | None:
        if node_id is None:
            return None
        row = await self.db.fetchrow(
            f"SELECT {NODE_COLUMNS} FROM nodes WHERE node_id = $1 {lock}", node_id
        )
        return None if row is None else node_of(row)
