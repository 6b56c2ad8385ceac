"""The basin calls of the SQL metadata store: create, get, list (paged by name), update the
config, delete.

The checks are the shared rules of :mod:`walstream.metadata.rules`, as in every store. Names
sort by their bytes in every dialect (SQLite's BINARY collation; PostgreSQL's ``COLLATE "C"``
column), so ``list_basins`` pages the same way everywhere.
"""

from __future__ import annotations

from typing import Any

from walstream.errors import BasinExists
from walstream.metadata.contract import BasinInfo
from walstream.metadata.rows import BASIN_COLUMNS, basin_of
from walstream.metadata.rules import (
    basin_not_found,
    check_basin_list_args,
    check_basin_name,
    encode_basin_config,
)
from walstream.metadata.sql.base import SqlStoreBase
from walstream.metadata.sql.tables import Tables

__all__ = ["SqlBasins"]


class SqlBasins(SqlStoreBase):
    """create/get/list/update/delete basin."""

    async def create_basin(self, name: str, config: dict[str, Any] | None = None) -> BasinInfo:
        check_basin_name(name)
        text = encode_basin_config(config)
        created_ms = self._clock.now_ms()

        async def work(tables: Tables) -> BasinInfo:
            row = await tables.db.fetchrow(
                f"INSERT INTO basins ({BASIN_COLUMNS}) VALUES ($1, $2, $3) "
                f"ON CONFLICT (name) DO NOTHING RETURNING {BASIN_COLUMNS}",
                name,
                text,
                created_ms,
            )
            if row is None:
                raise BasinExists(f"basin {name!r} already exists; use it, or delete it first")
            return basin_of(row)

        return await self._write(work)

    async def get_basin(self, name: str) -> BasinInfo:
        async def work(tables: Tables) -> BasinInfo:
            row = await tables.db.fetchrow(
                f"SELECT {BASIN_COLUMNS} FROM basins WHERE name = $1", name
            )
            if row is None:
                raise basin_not_found(name)
            return basin_of(row)

        return await self._read(work)

    async def list_basins(
        self, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[BasinInfo]:
        check_basin_list_args(prefix, start_after, limit)

        async def work(tables: Tables) -> list[BasinInfo]:
            # substr() rather than LIKE: a prefix's '%' and '_' are characters, not patterns.
            # The primary key's byte order bounds the scan by the page asked for.
            rows = await tables.db.fetch(
                f"SELECT {BASIN_COLUMNS} FROM basins WHERE name > $1 "
                "AND ($2 = '' OR substr(name, 1, length($2)) = $2) ORDER BY name LIMIT $3",
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
                f"UPDATE basins SET config = $2 WHERE name = $1 RETURNING {BASIN_COLUMNS}",
                name,
                text,
            )
            if row is None:
                raise basin_not_found(name)
            return basin_of(row)

        return await self._write(work)

    async def delete_basin(self, name: str) -> None:
        async def work(tables: Tables) -> None:
            if await tables.db.execute("DELETE FROM basins WHERE name = $1", name) == 0:
                raise basin_not_found(name)

        await self._write(work)
