"""The listener's durable key/value state (consumer groups' offsets, the brokers' addresses,
producer ids), through the metadata store's namespaced compare-and-set table.

The metadata contract gains ``kv_get`` / ``kv_put`` / ``kv_delete`` / ``kv_list`` (every store:
memory, SQLite, PostgreSQL). :func:`open_kv` uses the store's own when it has them. A store
without them gets :class:`MemoryKeyValueStore`, which keeps the state in this process only
(a WARNING says so at start): offsets then survive a consumer's restart but not the node's.

Rules every implementation keeps (the metadata contract's):

1. ``kv_put(ns, key, value, expected_version)`` writes only when the key's current version is
   ``expected_version`` (0: the key must not exist) and returns the new version; otherwise
   :class:`VersionConflict`.
2. ``kv_delete(ns, key, expected_version)`` likewise; deleting a missing key with version 0 is a
   no-op.
3. ``kv_list(ns, prefix, start_after, limit)`` returns ``(key, value, version)`` in key order.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from walstream.errors import PreconditionFailed

__all__ = ["KeyValueStore", "MemoryKeyValueStore", "VersionConflict", "open_kv"]

log = logging.getLogger(__name__)


class VersionConflict(PreconditionFailed):
    """A compare-and-set on the key/value table found another version."""


class KeyValueStore(Protocol):
    async def kv_get(self, namespace: str, key: str) -> tuple[bytes, int] | None: ...

    async def kv_put(
        self, namespace: str, key: str, value: bytes, expected_version: int
    ) -> int: ...

    async def kv_delete(self, namespace: str, key: str, expected_version: int) -> None: ...

    async def kv_list(
        self, namespace: str, prefix: str, start_after: str, limit: int
    ) -> list[tuple[str, bytes, int]]: ...


class MemoryKeyValueStore:
    """The table in this process's memory."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], tuple[bytes, int]] = {}

    async def kv_get(self, namespace: str, key: str) -> tuple[bytes, int] | None:
        return self._rows.get((namespace, key))

    async def kv_put(self, namespace: str, key: str, value: bytes, expected_version: int) -> int:
        current = self._rows.get((namespace, key))
        version = 0 if current is None else current[1]
        if version != expected_version:
            raise VersionConflict(
                f"{namespace}/{key} is at version {version}, not {expected_version}"
            )
        self._rows[(namespace, key)] = (bytes(value), version + 1)
        return version + 1

    async def kv_delete(self, namespace: str, key: str, expected_version: int) -> None:
        current = self._rows.get((namespace, key))
        version = 0 if current is None else current[1]
        if version != expected_version:
            raise VersionConflict(
                f"{namespace}/{key} is at version {version}, not {expected_version}"
            )
        self._rows.pop((namespace, key), None)

    async def kv_list(
        self, namespace: str, prefix: str, start_after: str, limit: int
    ) -> list[tuple[str, bytes, int]]:
        keys = sorted(
            key
            for space, key in self._rows
            if space == namespace and key.startswith(prefix) and key > start_after
        )
        return [(key, *self._rows[(namespace, key)]) for key in keys[:limit]]


class _MetadataKeyValueStore:
    """The metadata store's own table, its conflict error translated into ours."""

    def __init__(self, metadata: Any) -> None:
        self._metadata = metadata

    async def kv_get(self, namespace: str, key: str) -> tuple[bytes, int] | None:
        found = await self._metadata.kv_get(namespace, key)
        return None if found is None else (bytes(found[0]), int(found[1]))

    async def kv_put(self, namespace: str, key: str, value: bytes, expected_version: int) -> int:
        try:
            return int(await self._metadata.kv_put(namespace, key, value, expected_version))
        except PreconditionFailed as error:
            raise VersionConflict(str(error)) from error

    async def kv_delete(self, namespace: str, key: str, expected_version: int) -> None:
        try:
            await self._metadata.kv_delete(namespace, key, expected_version)
        except PreconditionFailed as error:
            raise VersionConflict(str(error)) from error

    async def kv_list(
        self, namespace: str, prefix: str, start_after: str, limit: int
    ) -> list[tuple[str, bytes, int]]:
        rows = await self._metadata.kv_list(namespace, prefix, start_after, limit)
        return [(str(row[0]), bytes(row[1]), int(row[2])) for row in rows]


def open_kv(metadata: Any) -> KeyValueStore:
    """The key/value table of ``metadata`` (see the module docstring)."""
    if all(hasattr(metadata, name) for name in ("kv_get", "kv_put", "kv_delete", "kv_list")):
        return _MetadataKeyValueStore(metadata)
    log.warning(
        "the metadata store %s has no key/value table: consumer groups' committed offsets and "
        "other nodes' Kafka addresses are kept in this process only (upgrade walstream)",
        type(metadata).__name__,
    )
    return MemoryKeyValueStore()
