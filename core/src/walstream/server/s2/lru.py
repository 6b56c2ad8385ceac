"""A map that keeps at most a fixed number of entries, dropping the least recently used.

The S2 service remembers per stream what saves a metadata query on its hot paths (a name's
stream id, a tail's timestamp). With a stream per user or entity those maps would grow with
every stream ever touched; bounded, their memory follows the streams in use, and a stream
dropped from them costs one metadata query when it is used again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["STREAM_CACHE_ENTRIES", "Lru"]

K = TypeVar("K")
V = TypeVar("V")

STREAM_CACHE_ENTRIES = 100_000
"""Entries the S2 service keeps per stream cache (names to ids, tails' timestamps): about 10 MB
each when full, for the 100,000 most recently used streams."""


class Lru(Generic[K, V]):
    """At most ``capacity`` entries; :meth:`get` and setting an entry make it the most recent."""

    __slots__ = ("_entries", "capacity")

    def __init__(self, capacity: int = STREAM_CACHE_ENTRIES) -> None:
        if capacity < 1:
            raise ValueError(f"an Lru holds at least one entry, not {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        if len(entries) > self.capacity:
            entries.popitem(last=False)

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._entries.pop(key, default)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
