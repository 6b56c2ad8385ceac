"""The basin methods of the PostgreSQL metadata store (the ``basins`` table of schema version 2).

:class:`PostgresBasins` is a base of :class:`walstream_metadata_postgres.store.PostgresMetadataStore`,
which supplies the transactions (``_read``/``_write``) and the clock. The checks are the shared
rules of :mod:`walstream.metadata.rules`, as in every store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
from walstream.clock import Clock
from walstream.errors import BasinExists
from walstream.metadata.contract import BasinInfo
from walstream.metadata.rows import BASIN_COLUMNS, basin_of
from walstream.metadata.rules import (
    basin_not_found,
    check_basin_list_args,
    check_basin_name,
    encode_basin_config,
)

from .tables import Tables

__all__ = ["PostgresBasins"]

T = TypeVar("T")

_COLUMNS = BASIN_COLUMNS


def _exists(name: str) -> BasinExists:
    return BasinExists(f"basin {name!r} already exists; use it, or delete it first")


class PostgresBasins:
    """create/get/list/delete basin over the store's transactions."""

    _clock: Clock

    async def _write(self, work: Callable[[Tables], Awaitable[T]]) -> T:
        raise NotImplementedError  # supplied by PostgresMetadataStore

    async def _read(self, work: Callable[[Tables], Awaitable[T]], snapshot: bool = False) -> T:
        raise NotImplementedError  # supplied by PostgresMetadataStore

    async def create_basin(self, name: str, config: dict[str, Any] | None = None) -> BasinInfo:
        check_basin_name(name)
        text = encode_basin_config(config)
        created_ms = self._clock.now_ms()

        async def work(tables: Tables) -> BasinInfo:
            try:
                row = await tables.db.fetchrow(
                    f"INSERT INTO basins ({_COLUMNS}) VALUES ($1, $2, $3) "
                    f"ON CONFLICT (name) DO NOTHING RETURNING {_COLUMNS}",
                    name,
                    text,
                    created_ms,
                )
            except asyncpg.UniqueViolationError:
                raise _exists(name) from None
            if row is None:
                raise _exists(name)
            return basin_of(row)

        return await self._write(work)

    async def get_basin(self, name: str) -> BasinInfo:
        async def work(tables: Tables) -> BasinInfo:
            row = await tables.db.fetchrow(f"SELECT {_COLUMNS} FROM basins WHERE name = $1", name)
            if row is None:
                raise basin_not_found(name)
            return basin_of(row)

        return await self._read(work)

    async def list_basins(
        self, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[BasinInfo]:
        check_basin_list_args(prefix, start_after, limit)

        async def work(tables: Tables) -> list[BasinInfo]:
            # left() rather than LIKE: a prefix's '%' and '_' are characters, not patterns. The
            # primary key's order (COLLATE "C": byte order, as the other stores sort) bounds the
            # scan by the page asked for.
            rows = await tables.db.fetch(
                f"SELECT {_COLUMNS} FROM basins WHERE name > $1 "
                "AND ($2 = '' OR left(name, length($2)) = $2) ORDER BY name LIMIT $3",
                start_after,
                prefix,
                limit,
            )
            return [basin_of(row) for row in rows]

        return await self._read(work)

    async def update_basin_config(self, name: str, config: dict[str, Any]) -> BasinInfo:
        text = encode_basin_config(config)

        async def work(tables: Tables) -> BasinInfo:
            row = await tables.db.fetchrow(
                f"UPDATE basins SET config = $2 WHERE name = $1 RETURNING {_COLUMNS}", name, text
            )
            if row is None:
                raise basin_not_found(name)
            return basin_of(row)

        return await self._write(work)

    async def delete_basin(self, name: str) -> None:
        async def work(tables: Tables) -> None:
            status = await tables.db.execute("DELETE FROM basins WHERE name = $1", name)
            if status == "DELETE 0":
                raise basin_not_found(name)

        await self._write(work)
