"""The object-store suite: a test per numbered invariant of :class:`walstream.objects.ObjectStore`.

A backend provides the ``walstream_object_store`` fixture (an instance; it may be shared between
tests — every test works under its own key prefix).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random

import pytest
from walstream.errors import NotFound, PreconditionFailed, WalstreamError
from walstream.objects import ObjectStore

from ..requirements import ObjectStoreRequirements, check_version

__all__ = ["ObjectStoreSuite"]

_prefix_counter = itertools.count()


def _prefix(test: str) -> str:
    # Unique per run and test, so a shared (configured) store needs no cleanup between tests.
    return f"conformance/{os.getpid()}-{next(_prefix_counter)}/{test}/"


async def _keys(store: ObjectStore, prefix: str) -> list[str]:
    return [meta.key async for meta in store.list(prefix)]


class ObjectStoreSuite:
    """Subclass with one line next to a ``walstream_object_store`` fixture."""

    pytestmark = pytest.mark.asyncio  # also under pytest-asyncio's strict mode

    @pytest.fixture(autouse=True)
    def _walstream_contract_version(self) -> None:
        check_version()

    # 1 ------------------------------------------------------------------------------------------
    async def test_put_get(self, walstream_object_store: ObjectStore) -> None:
        store = walstream_object_store
        base = _prefix("put_get")
        rng = random.Random(1)
        for size in (0, 1, 4096, 1 << 20):
            data = rng.randbytes(size)
            await store.put(f"{base}{size}", data)
            assert await store.get(f"{base}{size}") == data, (
                f"object of {size} bytes read back differently"
            )
        await store.put(f"{base}over", b"old" * 1000)
        new = rng.randbytes(5000)
        readers_saw: list[bytes] = []

        async def reader() -> None:
            for _ in range(20):
                readers_saw.append(await store.get(f"{base}over"))
                await asyncio.sleep(0)

        await asyncio.gather(reader(), store.put(f"{base}over", new), reader())
        assert await store.get(f"{base}over") == new, (
            "an overwrite was not visible after put returned"
        )
        mixed = [seen for seen in readers_saw if seen not in (new, b"old" * 1000)]
        assert not mixed, "a reader saw a mix of the old and the new object"

    # 2 ------------------------------------------------------------------------------------------
    async def test_ranged_get(self, walstream_object_store: ObjectStore) -> None:
        store = walstream_object_store
        key = _prefix("ranged_get") + "object"
        data = bytes(range(256)) * 40
        await store.put(key, data)
        cases = [
            (0, None),
            (0, 1),
            (5, 17),
            (100, 100),
            (4000, None),
            (len(data) - 3, None),
            (10, len(data) + 500),
            (len(data), None),
            (len(data) + 10, len(data) + 20),
        ]
        for start, end in cases:
            got = await store.get(key, start, end)
            assert got == data[start:end], f"get({start}, {end}) returned {len(got)} wrong bytes"
        for suffix in (1, 7, 4096, len(data), len(data) + 99):
            got = await store.get(key, -suffix)
            assert got == data[-suffix:], f"suffix read of the last {suffix} bytes is wrong"

    # 3 ------------------------------------------------------------------------------------------
    async def test_put_if_absent(self, walstream_object_store: ObjectStore) -> None:
        """Conditional create; of concurrent creators exactly one wins."""
        store = walstream_object_store
        ObjectStoreRequirements(store.capabilities).require("conditional_put")
        base = _prefix("put_if_absent")
        await store.put_if_absent(f"{base}single", b"first")
        with pytest.raises(PreconditionFailed):
            await store.put_if_absent(f"{base}single", b"second")
        assert await store.get(f"{base}single") == b"first", (
            "a failed put_if_absent changed the object"
        )
        for round_index in range(5):
            key = f"{base}race-{round_index}"
            contenders = [f"creator-{i}".encode() for i in range(8)]
            results = await asyncio.gather(
                *[store.put_if_absent(key, data) for data in contenders], return_exceptions=True
            )
            winners = [
                data for data, result in zip(contenders, results, strict=True) if result is None
            ]
            losers = [result for result in results if result is not None]
            assert len(winners) == 1, (
                f"{len(winners)} of {len(contenders)} concurrent put_if_absent calls won "
                f"(round {round_index}); exactly one must"
            )
            assert all(isinstance(loser, PreconditionFailed) for loser in losers), (
                f"losers failed with {sorted({type(r).__name__ for r in losers})}, "
                "expected PreconditionFailed"
            )
            assert await store.get(key) == winners[0], "the stored object is not the winner's"

    # 4 ------------------------------------------------------------------------------------------
    async def test_head(self, walstream_object_store: ObjectStore) -> None:
        store = walstream_object_store
        key = _prefix("head") + "object"
        await store.put(key, b"x" * 1234)
        meta = await store.head(key)
        assert (meta.key, meta.size) == (key, 1234)
        with pytest.raises(NotFound):
            await store.head(key + "-missing")

    # 5 ------------------------------------------------------------------------------------------
    async def test_delete_idempotent(self, walstream_object_store: ObjectStore) -> None:
        store = walstream_object_store
        base = _prefix("delete")
        for name in ("a", "b", "c"):
            await store.put(base + name, name.encode())
        await store.delete([base + "a", base + "b", base + "never-existed"])
        await store.delete([base + "a"])
        await store.delete([])
        assert await _keys(store, base) == [base + "c"]
        with pytest.raises(NotFound):
            await store.get(base + "a")

    # 6 ------------------------------------------------------------------------------------------
    async def test_list(self, walstream_object_store: ObjectStore) -> None:
        """Every key under the prefix exactly once, in order, across pages."""
        store = walstream_object_store
        base = _prefix("list")
        page = store.capabilities.list_page_size
        count = min(page + 3, 2003)
        names = [f"{base}many/{index:06d}" for index in range(count)]
        sem = asyncio.Semaphore(32)

        async def put(key: str) -> None:
            async with sem:
                await store.put(key, b"")

        await asyncio.gather(*[put(name) for name in names])
        others = [f"{base}man", f"{base}manz/1", f"{base}other/x", f"{base}many-x"]
        for key in others:
            await store.put(key, key.encode())
        listed = await _keys(store, f"{base}many/")
        assert listed == names, (
            f"list over {count} keys (page size {page}) returned {len(listed)} keys, "
            f"{len(set(listed))} distinct, sorted={listed == sorted(listed)}"
        )
        assert await _keys(store, f"{base}many") == [f"{base}many-x", *names]
        assert await _keys(store, f"{base}other/") == [f"{base}other/x"]
        assert await _keys(store, f"{base}nothing-here/") == []
        sizes = {meta.key: meta.size async for meta in store.list(f"{base}man")}
        assert sizes[f"{base}man"] == len(f"{base}man")

    # 7 ------------------------------------------------------------------------------------------
    async def test_writer(self, walstream_object_store: ObjectStore) -> None:
        store = walstream_object_store
        base = _prefix("writer")
        parts = [os.urandom(1000), b"", os.urandom(70_000), b"tail"]
        writer = store.writer(base + "published")
        for part in parts:
            await writer.write(part)
            with pytest.raises(NotFound):
                await store.head(base + "published")
        meta = await writer.close()
        assert meta.size == sum(map(len, parts))
        assert await store.get(base + "published") == b"".join(parts)
        aborted = store.writer(base + "aborted")
        await aborted.write(b"garbage" * 1000)
        await aborted.abort()
        assert await _keys(store, base) == [base + "published"]

    # 8 ------------------------------------------------------------------------------------------
    async def test_errors_typed(self, walstream_object_store: ObjectStore) -> None:
        store = walstream_object_store
        base = _prefix("errors")
        for call in (
            lambda: store.get(base + "missing"),
            lambda: store.get(base + "missing", 0, 10),
            lambda: store.head(base + "missing"),
        ):
            try:
                await call()
            except NotFound:
                continue
            except WalstreamError as exc:
                raise AssertionError(
                    f"a missing key raised {type(exc).__name__}, expected NotFound"
                ) from exc
            raise AssertionError("reading a missing key did not fail")
