"""``release_stream`` on PostgreSQL: the owner of one stream gives it up; nobody else can."""

from __future__ import annotations

from typing import Any

import pytest
from walstream.errors import FencedError


async def test_release_stream(make_store: Any) -> None:
    store = make_store()
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
    assert (await store.claim_stream(stream.stream_id, 2, two.node_epoch)).owner_node_id == 2
    with pytest.raises(FencedError):
        await store.release_stream(stream.stream_id, 1, one.node_epoch)
