"""The object-store contract (docs/architecture/contracts.md): where uploaded stream data lives."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BufferedObjectWriter",
    "ObjectMeta",
    "ObjectStore",
    "ObjectStoreCapabilities",
    "ObjectWriter",
]


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    key: str
    size: int


@dataclass(frozen=True)
class ObjectStoreCapabilities:
    conditional_put: bool = True
    """``put_if_absent`` is really conditional (two concurrent creators: exactly one wins)."""
    list_page_size: int = 1000
    extra: dict[str, Any] = field(default_factory=dict)


class ObjectWriter(ABC):
    """A streaming upload: ``write`` parts, then ``close`` to publish or ``abort`` to discard.

    Nothing is visible under the key before ``close`` returns; ``abort`` leaves no object.
    """

    @abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abstractmethod
    async def close(self) -> ObjectMeta: ...

    @abstractmethod
    async def abort(self) -> None: ...

    async def __aenter__(self) -> ObjectWriter:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()


class ObjectStore(ABC):
    """A flat namespace of immutable objects.

    Invariants (the conformance suite has a test named after each):

    1. **put-get** — after ``put(key, data)`` returns, ``get(key)`` returns exactly ``data``;
       a ``put`` is atomic: readers see the old object or the new one, never a mix.
    2. **ranged-get** — ``get(key, start, end)`` returns bytes ``[start, end)``; ``end=None`` reads
       to the end; a range past the end is clamped; a negative ``start`` with ``end=None`` reads the
       last ``-start`` bytes (a suffix read).
    3. **put-if-absent** — ``put_if_absent`` creates the object only if the key does not exist,
       else raises :class:`PreconditionFailed`; of concurrent creators exactly one wins.
    4. **head** — ``head`` returns the size, or raises :class:`NotFound`.
    5. **delete-idempotent** — ``delete(keys)`` removes the keys; missing keys are not an error.
    6. **list** — ``list(prefix)`` yields every key starting with ``prefix`` exactly once, in
       lexicographic order, across pages.
    7. **writer** — a :class:`ObjectWriter` publishes on ``close`` and leaves nothing on ``abort``.
    8. **errors-typed** — failures are :class:`NotFound`, :class:`PreconditionFailed`,
       :class:`Throttled`, :class:`BackendUnavailable` or :class:`CorruptionError`.
    """

    capabilities: ObjectStoreCapabilities = ObjectStoreCapabilities()

    @abstractmethod
    async def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    async def put_if_absent(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...

    @abstractmethod
    async def head(self, key: str) -> ObjectMeta: ...

    @abstractmethod
    async def delete(self, keys: Iterable[str]) -> None: ...

    @abstractmethod
    def list(self, prefix: str = "") -> AsyncIterator[ObjectMeta]: ...

    def writer(self, key: str) -> ObjectWriter:
        """A streaming writer; the default buffers parts and publishes with one ``put``."""
        return BufferedObjectWriter(self, key)

    async def check(self) -> None:
        """Verify now that the store is usable (the bucket exists, the credentials work), so a
        node refuses to start instead of acknowledging appends it can never upload. Raises
        :class:`~walstream.errors.ConfigError` naming what is wrong, or
        :class:`~walstream.errors.BackendUnavailable`. The default checks nothing."""

    async def close(self) -> None:
        """Release connections; idempotent."""

    def describe(self) -> dict[str, Any]:
        return {"type": type(self).__name__}


class BufferedObjectWriter(ObjectWriter):
    def __init__(self, store: ObjectStore, key: str) -> None:
        self._store = store
        self._key = key
        self._parts: list[bytes] = []
        self._finished = False

    async def write(self, data: bytes) -> None:
        if self._finished:
            raise ValueError("write() after close()/abort()")
        self._parts.append(bytes(data))

    async def close(self) -> ObjectMeta:
        self._finished = True
        data = b"".join(self._parts)
        self._parts = []
        await self._store.put(self._key, data)
        return ObjectMeta(self._key, len(data))

    async def abort(self) -> None:
        self._finished = True
        self._parts = []


def clamp_range(size: int, start: int, end: int | None) -> tuple[int, int]:
    """Resolve a ranged-get request against an object of ``size`` bytes (invariant 2)."""
    if start < 0:
        if end is not None:
            raise ValueError("a suffix read (negative start) takes no end")
        return max(0, size + start), size
    stop = size if end is None else min(end, size)
    return min(start, size), max(min(start, size), stop)
