"""``release_stream``: the owner of one stream gives it up (a stream move); nobody else can."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from walstream.errors import FencedError
from walstream.metadata import MetadataStore
from walstream.metadata.memory import MemoryMetadataStore
from walstream.metadata.sqlite import SqliteMetadataStore


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetadataStore]:
    made: MetadataStore = (
        MemoryMetadataStore()
        if request.param == "memory"
        else SqliteMetadataStore(str(tmp_path / "meta.db"))
    )
    try:
        yield made
    finally:
        await made.close()


async def check_release_stream(store: MetadataStore) -> None:
    """The contract, for any store."""
    one = await store.register_node(1, {})
    two = await store.register_node(2, {})
    stream = await store.create_stream("moving")
    claimed = await store.claim_stream(stream.stream_id, 1, one.node_epoch)
    with pytest.raises(FencedError, match="owned by node 1, not node 2"):
        await store.release_stream(stream.stream_id, 2, two.node_epoch)
    with pytest.raises(FencedError, match="stale"):
        await store.release_stream(stream.stream_id, 1, one.node_epoch - 1)
    released = await store.release_stream(stream.stream_id, 1, one.node_epoch)
    assert released.owner_node_id is None and released.epoch == claimed.epoch
    assert (await store.get_stream("moving")).owner_node_id is None
    # Released while node 1 runs: node 2 may claim it now, and node 1 can no longer release it.
    assert (await store.claim_stream(stream.stream_id, 2, two.node_epoch)).owner_node_id == 2
    with pytest.raises(FencedError):
        await store.release_stream(stream.stream_id, 1, one.node_epoch)
    assert (await store.release_stream(stream.stream_id, 2, two.node_epoch)).owner_node_id is None
    # Releasing a stream nobody owns changes nothing.
    assert (await store.release_stream(stream.stream_id, 1, one.node_epoch)).owner_node_id is None


async def test_release_stream(store: MetadataStore) -> None:
    await check_release_stream(store)
