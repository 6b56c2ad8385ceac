"""The node methods of the PostgreSQL metadata store: registration, leases, failover.

:class:`PostgresNodes` is a base of :class:`walstream_metadata_postgres.store.PostgresMetadataStore`,
which supplies the transactions (``_read``/``_write``) and the clock.

Leases run on the **server's** clock (:data:`SERVER_NOW_MS`): nodes on several machines compare
one expiry against one clock, so a node whose own clock drifts cannot take over a live node or
keep a dead one alive. :meth:`renew_lease`, :meth:`claim_failover` and :meth:`renew_failover`
are each one conditional ``UPDATE``: at READ COMMITTED, a second claim that waited for the first one's row lock re-checks
its ``WHERE`` against the row the first one wrote (its epoch moved on), so it updates nothing and
exactly one claim of an expiry wins.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from walstream.clock import Clock
from walstream.errors import FencedError, InvalidArgument
from walstream.metadata.contract import NodeInfo, NodeState
from walstream.metadata.rules import (
    check_address,
    check_lease_ms,
    encode_wal_config,
    plan_failover_renewal,
    plan_renewal,
    require_node_epoch,
)

from .tables import NODE_COLUMNS, Tables, node_of

__all__ = ["SERVER_NOW_MS", "PostgresNodes"]

T = TypeVar("T")

#: The server's wall clock in Unix milliseconds (``clock_timestamp()``: the time of the statement,
#: not of the transaction's start, so a transaction that waited for a lock reads a fresh clock).
SERVER_NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"


class PostgresNodes:
    """register/get/list nodes, node state, leases and failover over the store's transactions."""

    _clock: Clock

    async def _write(self, work: Callable[[Tables], Awaitable[T]]) -> T:
        raise NotImplementedError  # supplied by PostgresMetadataStore

    async def _read(self, work: Callable[[Tables], Awaitable[T]], snapshot: bool = False) -> T:
        raise NotImplementedError  # supplied by PostgresMetadataStore

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
            require_node_epoch(await tables.node(node_id, "FOR UPDATE"), node_id, node_epoch)
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
            row = await tables.db.fetchrow(
                f"UPDATE nodes SET lease_expires_ms = {SERVER_NOW_MS} + $3, "
                f"updated_ms = {SERVER_NOW_MS} "
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
            # failover_claimable, as one conditional UPDATE on the server's clock.
            row = await tables.db.fetchrow(
                "UPDATE nodes SET node_epoch = node_epoch + 1, state = 'failing_over', "
                f"lease_expires_ms = {SERVER_NOW_MS} + $3, updated_ms = {SERVER_NOW_MS} "
                "WHERE node_id = $1 AND node_epoch = $2 "
                "AND state IN ('running', 'failing_over') "
                f"AND lease_expires_ms > 0 AND lease_expires_ms < {SERVER_NOW_MS} "
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
            row = await tables.db.fetchrow(
                f"UPDATE nodes SET lease_expires_ms = {SERVER_NOW_MS} + $3, "
                f"updated_ms = {SERVER_NOW_MS} "
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
            return int(await tables.db.fetchval(f"SELECT {SERVER_NOW_MS}"))

        return await self._read(work)
