"""The basin methods of the SQLite metadata store (the ``basins`` table of schema version 3).

:class:`SqliteBasins` is a base of :class:`walstream.metadata.sqlite.SqliteMetadataStore`, which
supplies the transactions (``_read``/``_write``) and the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

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
from walstream.metadata.sqlite_tables import Tables

__all__ = ["SqliteBasins"]

T = TypeVar("T")

_COLUMNS = BASIN_COLUMNS


class SqliteBasins:
    """create/get/list/update/delete basin over the store's transactions."""

    _clock: Clock

    async def _write(self, work: Callable[[Tables], T]) -> T:
        raise NotImplementedError  # supplied by SqliteMetadataStore

    async def _read(self, work: Callable[[Tables], T]) -> T:
        raise NotImplementedError  # supplied by SqliteMetadataStore

    async def create_basin(self, name: str, config: dict[str, Any] | None = None) -> BasinInfo:
        check_basin_name(name)
        text = encode_basin_config(config)
        created_ms = self._clock.now_ms()

        def work(tables: Tables) -> BasinInfo:
            taken = tables.db.execute("SELECT 1 FROM basins WHERE name = ?", (name,)).fetchone()
            if taken is not None:
                raise BasinExists(f"basin {name!r} already exists; use it, or delete it first")
            tables.db.execute(
                f"INSERT INTO basins ({_COLUMNS}) VALUES (?, ?, ?)", (name, text, created_ms)
            )
            return basin_of((name, text, created_ms))

        return await self._write(work)

    async def get_basin(self, name: str) -> BasinInfo:
        def work(tables: Tables) -> BasinInfo:
            row = tables.db.execute(
                f"SELECT {_COLUMNS} FROM basins WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                raise basin_not_found(name)
            return basin_of(row)

        return await self._read(work)

    async def list_basins(
        self, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[BasinInfo]:
        check_basin_list_args(prefix, start_after, limit)

        def work(tables: Tables) -> list[BasinInfo]:
            # The prefix is compared in Python: LIKE would read '%' and '_' as patterns.
            rows = tables.db.execute(
                f"SELECT {_COLUMNS} FROM basins WHERE name > ? ORDER BY name", (start_after,)
            )
            found: list[BasinInfo] = []
            for row in rows:
                if str(row[0]).startswith(prefix):
                    found.append(basin_of(row))
                    if len(found) == limit:
                        break
            return found

        return await self._read(work)

    async def update_basin_config(self, name: str, config: dict[str, Any]) -> BasinInfo:
        text = encode_basin_config(config)

        def work(tables: Tables) -> BasinInfo:
            row = tables.db.execute(
                f"UPDATE basins SET config = ? WHERE name = ? RETURNING {_COLUMNS}", (text, name)
            ).fetchone()
            if row is None:
                raise basin_not_found(name)
            return basin_of(row)

        return await self._write(work)

    async def delete_basin(self, name: str) -> None:
        def work(tables: Tables) -> None:
            if tables.db.execute("DELETE FROM basins WHERE name = ?", (name,)).rowcount == 0:
                raise basin_not_found(name)

        await self._write(work)
