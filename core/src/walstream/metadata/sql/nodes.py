"""The node calls of the SQL metadata store: registration, node state, leases, failover.

Leases run on the store's clock, :attr:`Dialect.now_ms_sql
<walstream.metadata.sql.dialect.Dialect.now_ms_sql>`: the server's clock on PostgreSQL, so nodes
on several machines compare one expiry against one clock (a node whose own clock drifts cannot
take over a live node or keep a dead one alive); the store's :class:`~walstream.clock.Clock` on
SQLite, whose processes share one machine. :meth:`SqlNodes.renew_lease`,
:meth:`SqlNodes.claim_failover` and :meth:`SqlNodes.renew_failover` are each one conditional
``UPDATE``, the rule of :func:`~walstream.metadata.rules.failover_claimable` written as its
``WHERE``: on PostgreSQL (READ COMMITTED) a second claim that waited for the first one's row lock
re-checks its ``WHERE`` against the row the first one wrote (its epoch moved on), so it updates
nothing; on SQLite the second claim waits for the file's write lock and then sees the first one's
row. Either way exactly one claim of an expiry wins.
"""

from __future__ import annotations

from typing import Any

from walstream.errors import FencedError, InvalidArgument
from walstream.metadata.contract import NodeInfo, NodeState
from walstream.metadata.rows import NODE_COLUMNS, node_of
from walstream.metadata.rules import (
    check_address,
    check_lease_ms,
    encode_wal_config,
    plan_failover_renewal,
    plan_renewal,
    require_node_epoch,
)
from walstream.metadata.sql.base import SqlStoreBase
from walstream.metadata.sql.dialect import Lock
from walstream.metadata.sql.tables import Tables

__all__ = ["SqlNodes"]


class SqlNodes(SqlStoreBase):
    """register/get/list nodes, node state, leases and failover."""

    async def register_node(
        self, node_id: int, wal_config: dict[str, Any], address: str | None = None
    ) -> NodeInfo:
        encoded = encode_wal_config(wal_config)
        address = check_address(address)
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> NodeInfo:
            row = await tables.db.fetchrow(
                f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES ($1, 1, 'running', $2, $3, $4, 0) "
                "ON CONFLICT (node_id) DO UPDATE SET node_epoch = nodes.node_epoch + 1, "
                "state = 'running', wal_config = excluded.wal_config, "
                "updated_ms = excluded.updated_ms, address = excluded.address, "
                f"lease_expires_ms = 0 RETURNING {NODE_COLUMNS}",
                node_id,
                encoded,
                now_ms,
                address,
            )
            assert row is not None
            return node_of(row)

        return await self._write(work)

    async def get_node(self, node_id: int) -> NodeInfo | None:
        async def work(tables: Tables) -> NodeInfo | None:
            return await tables.node(node_id)

        return await self._read(work)

    async def list_nodes(self) -> list[NodeInfo]:
        async def work(tables: Tables) -> list[NodeInfo]:
            rows = await tables.db.fetch(f"SELECT {NODE_COLUMNS} FROM nodes ORDER BY node_id")
            return [node_of(row) for row in rows]

        return await self._read(work)

    async def set_node_state(self, node_id: int, node_epoch: int, state: NodeState) -> None:
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> None:
            require_node_epoch(await tables.node(node_id, Lock.UPDATE), node_id, node_epoch)
            await tables.db.execute(
                "UPDATE nodes SET state = $1, updated_ms = $2 WHERE node_id = $3",
                state.value,
                now_ms,
                node_id,
            )

        await self._write(work)

    async def begin_failover(self, node_id: int) -> NodeInfo:
        now_ms = self._clock.now_ms()

        async def work(tables: Tables) -> NodeInfo:
            row = await tables.db.fetchrow(
                "UPDATE nodes SET node_epoch = node_epoch + 1, state = 'failing_over', "
                "lease_expires_ms = 0, "
                f"updated_ms = $2 WHERE node_id = $1 RETURNING {NODE_COLUMNS}",
                node_id,
                now_ms,
            )
            if row is None:
                raise InvalidArgument(f"begin_failover: node {node_id} was never registered")
            return node_of(row)

        return await self._write(work)

    async def renew_lease(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        check_lease_ms(lease_ms)

        async def work(tables: Tables) -> NodeInfo:
            now = tables.dialect.now_ms_sql
            row = await tables.db.fetchrow(
                f"UPDATE nodes SET lease_expires_ms = {now} + $3, updated_ms = {now} "
                "WHERE node_id = $1 AND node_epoch = $2 AND state = 'running' "
                f"RETURNING {NODE_COLUMNS}",
                node_id,
                node_epoch,
                lease_ms,
            )
            if row is not None:
                return node_of(row)
            # Nothing matched: the shared rule says why (not registered, stale epoch, or not
            # running), in the words every store uses.
            current = await tables.node(node_id)
            plan_renewal(current, node_id, node_epoch, lease_ms, 0)
            raise FencedError(f"node {node_id} epoch {node_epoch} lost its lease; restart it")

        return await self._write(work)

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        check_lease_ms(lease_ms, "claim_failover")

        async def work(tables: Tables) -> NodeInfo | None:
            # A RUNNING node whose lease expired, or a FAILING_OVER node whose claimer's
            # failover lease expired (that claimer stopped halfway): the rule of
            # failover_claimable, as one conditional UPDATE on the store's clock.
            now = tables.dialect.now_ms_sql
            row = await tables.db.fetchrow(
                "UPDATE nodes SET node_epoch = node_epoch + 1, state = 'failing_over', "
                f"lease_expires_ms = {now} + $3, updated_ms = {now} "
                "WHERE node_id = $1 AND node_epoch = $2 "
                "AND state IN ('running', 'failing_over') "
                f"AND lease_expires_ms > 0 AND lease_expires_ms < {now} "
                f"RETURNING {NODE_COLUMNS}",
                node_id,
                node_epoch,
                lease_ms,
            )
            return None if row is None else node_of(row)

        return await self._write(work)

    async def renew_failover(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        check_lease_ms(lease_ms, "renew_failover")

        async def work(tables: Tables) -> NodeInfo:
            now = tables.dialect.now_ms_sql
            row = await tables.db.fetchrow(
                f"UPDATE nodes SET lease_expires_ms = {now} + $3, updated_ms = {now} "
                "WHERE node_id = $1 AND node_epoch = $2 AND state = 'failing_over' "
                f"RETURNING {NODE_COLUMNS}",
                node_id,
                node_epoch,
                lease_ms,
            )
            if row is not None:
                return node_of(row)
            current = await tables.node(node_id)
            plan_failover_renewal(current, node_id, node_epoch, lease_ms, 0)
            raise FencedError(f"failover of node {node_id} epoch {node_epoch} was taken over")

        return await self._write(work)

    async def store_time_ms(self) -> int:
        async def work(tables: Tables) -> int:
            return int(await tables.db.fetchval(f"SELECT {tables.dialect.now_ms_sql}"))

        return await self._read(work)
