"""The S2 service's per-stream caches are bounded: the least recently used entry goes first, so
their memory follows the streams in use, not every stream ever touched."""

from __future__ import annotations

import pytest
from walstream.server.s2.lru import STREAM_CACHE_ENTRIES, Lru


def test_the_least_recently_used_entry_goes_first() -> None:
    cache: Lru[str, int] = Lru(3)
    for number, name in enumerate(["a", "b", "c"]):
        cache[name] = number
    assert cache.get("a") == 0  # a is now the most recent
    cache["d"] = 3
    assert "b" not in cache and cache.get("b") is None
    assert [cache.get(name) for name in ("a", "c", "d")] == [0, 2, 3]
    cache["c"] = 20  # setting an entry makes it the most recent too
    cache["e"] = 4
    assert "a" not in cache and cache.get("c") == 20 and len(cache) == 3
    assert cache.pop("c") == 20 and cache.pop("c") is None and len(cache) == 2
    cache.clear()
    assert len(cache) == 0


def test_many_names_keep_the_cache_at_its_bound() -> None:
    cache: Lru[str, int] = Lru()
    for number in range(STREAM_CACHE_ENTRIES + 5_000):
        cache[f"stream-{number}"] = number
    assert len(cache) == STREAM_CACHE_ENTRIES
    assert cache.get("stream-0") is None
    assert cache.get(f"stream-{STREAM_CACHE_ENTRIES + 4_999}") == STREAM_CACHE_ENTRIES + 4_999


def test_a_cache_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Lru(0)


def test_the_services_stream_maps_are_bounded() -> None:
    from walstream.server.s2.context import S2Context

    context = S2Context(object())  # type: ignore[arg-type]  # only its maps are used
    maps = (context.stream_ids, context.tail_timestamps, context.router._owners)
    for bounded in maps:
        assert isinstance(bounded, Lru) and bounded.capacity == STREAM_CACHE_ENTRIES
    for number in range(STREAM_CACHE_ENTRIES + 10):
        context.stream_ids[f"s{number}"] = number
    assert len(context.stream_ids) == STREAM_CACHE_ENTRIES
