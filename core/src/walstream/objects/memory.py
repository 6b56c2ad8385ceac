"""The reference in-memory object store: named process-wide volumes, nothing survives the process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from walstream.config.factory import BackendFactory
from walstream.config.options import Option
from walstream.errors import (
    NotFound,
    PreconditionFailed,
)
from walstream.objects.contract import ObjectMeta, ObjectStore, ObjectStoreCapabilities, clamp_range

__all__ = [
    "MEMORY_OBJECT_STORE",
    "MemoryObjectStore",
]



_OBJECT_VOLUMES: dict[str, dict[str, bytes]] = {}


class MemoryObjectStore(ObjectStore):
    capabilities = ObjectStoreCapabilities(conditional_put=True, list_page_size=1000)

    def __init__(self, name: str | None = None) -> None:
        self._objects: dict[str, bytes] = _OBJECT_VOLUMES.setdefault(name, {}) if name else {}

    async def put(self, key: str, data: bytes) -> None:
        self._objects[key] = bytes(data)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        if key in self._objects:
            raise PreconditionFailed(f"object {key!r} already exists")
        self._objects[key] = bytes(data)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        try:
            data = self._objects[key]
        except KeyError:
            raise NotFound(f"no object {key!r}") from None
        first, last = clamp_range(len(data), start, end)
        return data[first:last]

    async def head(self, key: str) -> ObjectMeta:
        try:
            return ObjectMeta(key, len(self._objects[key]))
        except KeyError:
            raise NotFound(f"no object {key!r}") from None

    async def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._objects.pop(key, None)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectMeta]:  # type: ignore[override]
        for key in sorted(self._objects):
            if key.startswith(prefix) and key in self._objects:
                yield ObjectMeta(key, len(self._objects[key]))

    def describe(self) -> dict[str, Any]:
        return {"type": "memory", "objects": len(self._objects)}


MEMORY_OBJECT_STORE: BackendFactory[MemoryObjectStore] = BackendFactory(
    kind="object_store",
    name="memory",
    description="objects in process memory (tests, demos)",
    options=(Option("name", "str", "volume name shared by clients of one process"),),
    create=lambda options, context: MemoryObjectStore(options["name"]),
)
