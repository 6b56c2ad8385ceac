"""The node methods of the SQLite metadata store: registration, leases, failover.

:class:`SqliteNodes` is a base of :class:`walstream.metadata.sqlite.SqliteMetadataStore`, which
supplies the transactions (``_read``/``_write``) and the clock. Every write takes SQLite's write
lock up front (``BEGIN IMMEDIATE``), so a read-check-write here is one conditional write: of two
processes claiming one failover, the second sees the first's epoch and gets None. The store's
clock is the :class:`~walstream.clock.Clock` of the store; the processes sharing one file share
one machine, hence one clock.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, TypeVar

from walstream.clock import Clock
from walstream.errors import InvalidArgument
from walstream.metadata.contract import NodeInfo, NodeState
from walstream.metadata.rules import (
    check_address,
    check_lease_ms,
    encode_wal_config,
    plan_failover_claim,
    plan_failover_renewal,
    plan_renewal,
    require_node_epoch,
)
from walstream.metadata.sqlite_tables import NODE_COLUMNS, Tables, node_of

__all__ = ["SqliteNodes"]

T = TypeVar("T")


class SqliteNodes:
    """register/get/list nodes, node state, leases and failover over the store's transactions."""

    _clock: Clock

    async def _write(self, work: Callable[[Tables], T]) -> T:
        raise NotImplementedError  # supplied by SqliteMetadataStore

    async def _read(self, work: Callable[[Tables], T]) -> T:
        raise NotImplementedError  # supplied by SqliteMetadataStore

    async def register_node(
        self, node_id: int, wal_config: dict[str, Any], address: str | None = None
    ) -> NodeInfo:
        config = json.loads(encode_wal_config(wal_config))
        address = check_address(address)
        now_ms = self._clock.now_ms()

        def work(tables: Tables) -> NodeInfo:
            previous = tables.node(node_id)
            epoch = (previous.node_epoch if previous else 0) + 1
            node = NodeInfo(node_id, epoch, NodeState.RUNNING, config, now_ms, address, 0)
            tables.put_node(node)
            return node

        return await self._write(work)

    async def get_node(self, node_id: int) -> NodeInfo | None:
        return await self._read(lambda tables: tables.node(node_id))

    async def list_nodes(self) -> list[NodeInfo]:
        def work(tables: Tables) -> list[NodeInfo]:
            rows = tables.db.execute(f"SELECT {NODE_COLUMNS} FROM nodes ORDER BY node_id")
            return [node_of(row) for row in rows]

        return await self._read(work)

    async def set_node_state(self, node_id: int, node_epoch: int, state: NodeState) -> None:
        now_ms = self._clock.now_ms()

        def work(tables: Tables) -> None:
            node = require_node_epoch(tables.node(node_id), node_id, node_epoch)
            tables.put_node(dataclasses.replace(node, state=state, updated_ms=now_ms))

        await self._write(work)

    async def begin_failover(self, node_id: int) -> NodeInfo:
        now_ms = self._clock.now_ms()

        def work(tables: Tables) -> NodeInfo:
            node = tables.node(node_id)
            if node is None:
                raise InvalidArgument(f"begin_failover: node {node_id} was never registered")
            failing = dataclasses.replace(
                node,
                node_epoch=node.node_epoch + 1,
                state=NodeState.FAILING_OVER,
                updated_ms=now_ms,
                lease_expires_ms=0,
            )
            tables.put_node(failing)
            return failing

        return await self._write(work)

    async def renew_lease(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        check_lease_ms(lease_ms)

        def work(tables: Tables) -> NodeInfo:
            # The clock is read inside the write lock: expiries never go backwards between
            # processes that renew one after the other.
            renewed = plan_renewal(
                tables.node(node_id), node_id, node_epoch, lease_ms, self._clock.now_ms()
            )
            tables.put_node(renewed)
            return renewed

        return await self._write(work)

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        check_lease_ms(lease_ms, "claim_failover")

        def work(tables: Tables) -> NodeInfo | None:
            claimed = plan_failover_claim(
                tables.node(node_id), node_epoch, lease_ms, self._clock.now_ms()
            )
            if claimed is not None:
                tables.put_node(claimed)
            return claimed

        return await self._write(work)

    async def renew_failover(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        check_lease_ms(lease_ms, "renew_failover")

        def work(tables: Tables) -> NodeInfo:
            renewed = plan_failover_renewal(
                tables.node(node_id), node_id, node_epoch, lease_ms, self._clock.now_ms()
            )
            tables.put_node(renewed)
            return renewed

        return await self._write(work)

    async def store_time_ms(self) -> int:
        return self._clock.now_ms()
