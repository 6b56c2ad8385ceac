"""The key/value calls of the SQL metadata store: versioned values with compare-and-set.

Each write is one conditional statement, the version check written as its ``WHERE`` (or its
``ON CONFLICT``), so it needs no lock of its own: on PostgreSQL a second writer of one key waits
for the first one's row lock and re-checks its condition against the row the first one wrote
(READ COMMITTED), and an insert racing another waits for it and then finds the key; on SQLite the
file's write lock orders them. When the statement changes nothing, the version found is read
again for the :class:`~walstream.errors.VersionMismatchError`.

Versions come from the ``kv_versions`` sequence (:meth:`Dialect.new_id
<walstream.metadata.sql.dialect.Dialect.new_id>`), drawn after the row is locked: positive,
larger than the key's previous one, and never given twice, to any key.
"""

from __future__ import annotations

from walstream.metadata.contract import KvEntry, KvValue
from walstream.metadata.rules import (
    check_kv_delete,
    check_kv_key,
    check_kv_list_args,
    check_kv_put,
    prefix_end,
    version_mismatch,
)
from walstream.metadata.sql.base import SqlStoreBase
from walstream.metadata.sql.tables import Tables

__all__ = ["SqlKv"]

_VERSION_OF = "SELECT version FROM kv WHERE namespace = $1 AND key = $2"


class SqlKv(SqlStoreBase):
    """kv_get / kv_put / kv_delete / kv_list."""

    async def kv_get(self, namespace: str, key: str) -> KvValue | None:
        check_kv_key(namespace, key)

        async def work(tables: Tables) -> KvValue | None:
            row = await tables.db.fetchrow(
                "SELECT value, version FROM kv WHERE namespace = $1 AND key = $2", namespace, key
            )
            return None if row is None else KvValue(bytes(row[0]), int(row[1]))

        return await self._read(work)

    async def kv_put(
        self, namespace: str, key: str, value: bytes, expected_version: int | None
    ) -> int:
        stored = check_kv_put(namespace, key, value, expected_version)

        async def work(tables: Tables) -> int:
            version = await tables.dialect.new_id(tables.db, "kv_versions")
            if expected_version is None:
                # The version is drawn again in DO UPDATE, after the conflicting row is locked.
                written = await tables.db.fetchval(
                    "INSERT INTO kv (namespace, key, value, version) "
                    f"VALUES ($1, $2, $3, {version}) ON CONFLICT (namespace, key) "
                    f"DO UPDATE SET value = excluded.value, version = {version} "
                    "RETURNING version",
                    namespace,
                    key,
                    stored,
                )
            elif expected_version == 0:
                written = await tables.db.fetchval(
                    "INSERT INTO kv (namespace, key, value, version) "
                    f"VALUES ($1, $2, $3, {version}) ON CONFLICT (namespace, key) DO NOTHING "
                    "RETURNING version",
                    namespace,
                    key,
                    stored,
                )
            else:
                written = await tables.db.fetchval(
                    f"UPDATE kv SET value = $3, version = {version} "
                    "WHERE namespace = $1 AND key = $2 AND version = $4 RETURNING version",
                    namespace,
                    key,
                    stored,
                    expected_version,
                )
            if written is None:
                assert expected_version is not None
                actual = await tables.db.fetchval(_VERSION_OF, namespace, key)
                raise version_mismatch("kv_put", namespace, key, expected_version, int(actual or 0))
            return int(written)

        return await self._write(work)

    async def kv_delete(self, namespace: str, key: str, expected_version: int | None) -> None:
        check_kv_delete(namespace, key, expected_version)

        async def work(tables: Tables) -> None:
            if expected_version is None:
                await tables.db.execute(
                    "DELETE FROM kv WHERE namespace = $1 AND key = $2", namespace, key
                )
                return
            if expected_version == 0:  # expects no value: nothing to remove, only a check
                actual = await tables.db.fetchval(_VERSION_OF, namespace, key)
                if actual is not None:
                    raise version_mismatch("kv_delete", namespace, key, 0, int(actual))
                return
            deleted = await tables.db.execute(
                "DELETE FROM kv WHERE namespace = $1 AND key = $2 AND version = $3",
                namespace,
                key,
                expected_version,
            )
            if deleted == 0:
                actual = await tables.db.fetchval(_VERSION_OF, namespace, key)
                raise version_mismatch(
                    "kv_delete", namespace, key, expected_version, int(actual or 0)
                )

        await self._write(work)

    async def kv_list(
        self, namespace: str, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[KvEntry]:
        check_kv_list_args(namespace, prefix, start_after, limit)
        # The prefix as a key range, so the primary key's index bounds the scan at both ends.
        end = prefix_end(prefix)
        below_end = "" if end is None else "AND key < $5 "
        arguments = [namespace, start_after, prefix, limit] + ([] if end is None else [end])

        async def work(tables: Tables) -> list[KvEntry]:
            rows = await tables.db.fetch(
                "SELECT key, value, version FROM kv WHERE namespace = $1 AND key > $2 "
                f"AND key >= $3 {below_end}ORDER BY key LIMIT $4",
                *arguments,
            )
            return [KvEntry(str(row[0]), bytes(row[1]), int(row[2])) for row in rows]

        return await self._read(work)
