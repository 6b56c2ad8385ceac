"""What every part of the SQL metadata store shares: its dialect, its clock, its transactions.

:class:`SqlStoreBase` is the base of the store's parts (:mod:`.store`, :mod:`.nodes`,
:mod:`.basins`); each part writes its operations as ``work`` functions over the
:class:`~walstream.metadata.sql.tables.Tables` of one transaction and runs them with
:meth:`SqlStoreBase._write` or :meth:`SqlStoreBase._read`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from walstream.clock import Clock
from walstream.metadata.sql.dialect import Connection, Dialect
from walstream.metadata.sql.tables import Tables

__all__ = ["SqlStoreBase"]

T = TypeVar("T")


class SqlStoreBase:
    """The store's dialect, clock and transactions."""

    def __init__(self, dialect: Dialect, clock: Clock) -> None:
        self._dialect = dialect
        self._clock = clock

    async def _write(self, work: Callable[[Tables], Awaitable[T]]) -> T:
        """Run ``work`` in one write transaction (its rows are the newest, and locked)."""
        return await self._dialect.run(True, self._on_tables(work))

    async def _read(self, work: Callable[[Tables], Awaitable[T]], snapshot: bool = False) -> T:
        """A read; ``snapshot=True`` when ``work`` runs several statements that must agree."""
        return await self._dialect.run(False, self._on_tables(work), snapshot)

    def _on_tables(
        self, work: Callable[[Tables], Awaitable[T]]
    ) -> Callable[[Connection], Awaitable[T]]:
        dialect = self._dialect
        return lambda db: work(Tables(db, dialect))

    async def close(self) -> None:
        await self._dialect.close()

    def describe(self) -> dict[str, Any]:
        return {"type": self._dialect.name}
