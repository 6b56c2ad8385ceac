"""MetadataStore behaviour, one test per numbered invariant of the contract, run against the
memory and SQLite stores; plus SQLite durability and several-process safety."""

from __future__ import annotations

import itertools
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from walstream.clock import ManualClock
from walstream.config import BuildContext
from walstream.errors import (
    BackendUnavailable,
    ConfigError,
    CorruptionError,
    FencedError,
    InvalidArgument,
    PreconditionFailed,
    StreamExists,
    StreamNotFound,
    WalstreamError,
)
from walstream.metadata import (
    MetadataStore,
    NodeInfo,
    NodeState,
    ObjectCommit,
    ObjectKind,
    ObjectState,
    StreamInfo,
    StreamRange,
    StreamState,
)
from walstream.metadata.memory import MEMORY_METADATA, MemoryMetadataStore
from walstream.metadata.sqlite import (
    SCHEMA_VERSION,
    SQLITE_METADATA,
    SqliteMetadataStore,
    open_connection,
)

Opener = Callable[[], MetadataStore]
_volume_names = itertools.count()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["memory", "sqlite"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Opener:
    """Opens a client on one backing catalogue; a second call sees the same state."""
    if request.param == "memory":
        name = f"metadata-test-{next(_volume_names)}"
        return lambda: MemoryMetadataStore(name, clock=clock)
    path = tmp_path / "meta" / "walstream.db"
    return lambda: SqliteMetadataStore(path, busy_timeout_s=5, clock=clock)


@pytest.fixture
async def store(open_store: Opener) -> AsyncIterator[MetadataStore]:
    opened = open_store()
    yield opened
    await opened.close()


# -- shared steps ----------------------------------------------------------------------------------


async def writable_stream(
    store: MetadataStore, node: NodeInfo, name: str | None = None
) -> StreamInfo:
    created = await store.create_stream(name)
    return await store.claim_stream(created.stream_id, node.node_id, node.node_epoch)


def stream_object(
    object_id: int, stream: StreamInfo, start: int, end: int, key: str | None = None
) -> ObjectCommit:
    return ObjectCommit(
        object_id,
        key or f"objects/{object_id}",
        ObjectKind.STREAM,
        size=(end - start) * 10,
        index_size=48,
        ranges=(StreamRange(stream.stream_id, start, end, stream.epoch),),
    )


def set_object(object_id: int, ranges: list[tuple[StreamInfo, int, int]]) -> ObjectCommit:
    return ObjectCommit(
        object_id,
        f"objects/{object_id}",
        ObjectKind.STREAM_SET,
        size=1000,
        index_size=96,
        ranges=tuple(StreamRange(s.stream_id, start, end, s.epoch) for s, start, end in ranges),
    )


async def commit_range(
    store: MetadataStore, node: NodeInfo, stream: StreamInfo, start: int, end: int
) -> int:
    [object_id] = await store.prepare_objects(1, ttl_ms=60_000)
    await store.commit_objects(
        node.node_id, node.node_epoch, [stream_object(object_id, stream, start, end)]
    )
    return object_id


async def states(store: MetadataStore) -> dict[int, ObjectState]:
    return {info.object_id: info.state for info in await store.list_objects()}


async def committed_end(store: MetadataStore, stream_id: int) -> int:
    return (await store.get_streams([stream_id]))[stream_id].committed_end


# -- one test per invariant ------------------------------------------------------------------------


async def test_atomic_commit(store: MetadataStore) -> None:
    node = await store.register_node(1, {})
    first = await writable_stream(store, node, "first")
    second = await writable_stream(store, node, "second")
    a, b, c = await store.prepare_objects(3, ttl_ms=60_000)
    broken = [
        stream_object(a, first, 0, 10),
        set_object(b, [(first, 10, 15), (second, 0, 5)]),
        stream_object(c, second, 7, 9),  # gap: second's committed end will be 5, not 7
    ]
    with pytest.raises(PreconditionFailed):
        await store.commit_objects(node.node_id, node.node_epoch, broken)
    assert await committed_end(store, first.stream_id) == 0
    assert await committed_end(store, second.stream_id) == 0
    assert await states(store) == {
        a: ObjectState.PREPARED,
        b: ObjectState.PREPARED,
        c: ObjectState.PREPARED,
    }
    assert await store.get_objects(first.stream_id, 0) == []

    fixed = [*broken[:2], stream_object(c, second, 5, 9)]
    await store.commit_objects(node.node_id, node.node_epoch, fixed)
    assert await committed_end(store, first.stream_id) == 15
    assert await committed_end(store, second.stream_id) == 9
    assert set((await states(store)).values()) == {ObjectState.COMMITTED}
    shared = (await store.list_objects(kind=ObjectKind.STREAM_SET))[0]
    assert shared.object_id == b
    assert [(r.stream_id, r.start_offset, r.end_offset) for r in shared.ranges] == [
        (first.stream_id, 10, 15),
        (second.stream_id, 0, 5),
    ]


async def test_commit_of_many_streams_keeps_every_field(store: MetadataStore) -> None:
    """A commit naming many streams over two objects stores each stream's end and each range
    exactly as given: offsets, epoch, timestamps."""
    node = await store.register_node(1, {})
    streams = [await writable_stream(store, node, f"wide-{i}") for i in range(12)]
    first = await store.create_stream("bumped")
    await store.claim_stream(first.stream_id, node.node_id, node.node_epoch)
    bumped = await store.claim_stream(first.stream_id, node.node_id, node.node_epoch)
    streams.append(bumped)  # an epoch of 2 among epochs of 1
    a, b = await store.prepare_objects(2, ttl_ms=60_000)
    ranges = [
        StreamRange(s.stream_id, 0, 3 + i, s.epoch, 1_000 + i, 2_000 + 7 * i)
        for i, s in enumerate(streams)
    ]
    later = [
        StreamRange(s.stream_id, 3 + i, 10 + i, s.epoch, 3_000, 4_000 + i)
        for i, s in enumerate(streams[:5])
    ]
    commits = [
        ObjectCommit(a, "objects/a", ObjectKind.STREAM_SET, 1000, 96, tuple(ranges)),
        ObjectCommit(b, "objects/b", ObjectKind.STREAM_SET, 500, 64, tuple(later)),
    ]
    await store.commit_objects(node.node_id, node.node_epoch, commits)
    ends = await store.get_streams([s.stream_id for s in streams])
    assert {i: ends[s.stream_id].committed_end for i, s in enumerate(streams)} == {
        i: (10 + i if i < 5 else 3 + i) for i in range(len(streams))
    }
    for i, s in enumerate(streams):
        stored = [o.ranges[0] for o in await store.get_objects(s.stream_id, 0)]
        assert stored == ([ranges[i], later[i]] if i < 5 else [ranges[i]])


async def test_continuity(store: MetadataStore) -> None:
    node = await store.register_node(1, {})
    stream = await writable_stream(store, node, "orders")
    await commit_range(store, node, stream, 0, 10)
    await commit_range(store, node, stream, 10, 20)
    for start in (25, 5, 0):
        with pytest.raises(PreconditionFailed) as failure:
            await commit_range(store, node, stream, start, start + 30)
        message = str(failure.value)
        assert f"stream {stream.stream_id}" in message
        assert "expected 20" in message and f"got {start}" in message
    assert await committed_end(store, stream.stream_id) == 20
    found = await store.get_objects(stream.stream_id, 0)
    assert [(o.ranges[0].start_offset, o.ranges[0].end_offset) for o in found] == [
        (0, 10),
        (10, 20),
    ]


async def test_epochs_fence(store: MetadataStore) -> None:
    old = await store.register_node(1, {})
    stream = await writable_stream(store, old, "orders")
    await commit_range(store, old, stream, 0, 10)

    # A newer process of the same node: the old node epoch can no longer commit or claim.
    new = await store.register_node(1, {})
    with pytest.raises(FencedError):
        await commit_range(store, old, stream, 10, 20)
    with pytest.raises(FencedError):
        await store.claim_stream(stream.stream_id, old.node_id, old.node_epoch)
    with pytest.raises(FencedError):
        await store.release_streams(old.node_id, old.node_epoch)
    # The new process claims the stream: the old stream epoch is fenced everywhere.
    reclaimed = await store.claim_stream(stream.stream_id, new.node_id, new.node_epoch)
    assert reclaimed.epoch == stream.epoch + 1 and reclaimed.owner_node_id == 1
    with pytest.raises(FencedError):
        await commit_range(store, new, stream, 10, 20)  # range carries the stale stream epoch
    with pytest.raises(FencedError):
        await store.trim_stream(stream.stream_id, stream.epoch, 5)
    with pytest.raises(FencedError):
        await store.set_fencing_token(stream.stream_id, stream.epoch, "token")
    assert await committed_end(store, stream.stream_id) == 10
    await commit_range(store, new, reclaimed, 10, 20)
    await store.set_fencing_token(stream.stream_id, reclaimed.epoch, "token-1")
    assert (await store.get_stream(stream.stream_id)).fencing_token == "token-1"

    # Another node cannot take a stream whose owner is running ...
    other = await store.register_node(2, {})
    with pytest.raises(FencedError) as failure:
        await store.claim_stream(stream.stream_id, other.node_id, other.node_epoch)
    assert "node 1" in str(failure.value) and "close that node or fail it over" in str(
        failure.value
    )
    # ... nor commit to it (it is not the owner).
    with pytest.raises(FencedError):
        await commit_range(store, other, reclaimed, 20, 30)
    # Once the owner stopped cleanly, the claim succeeds and fences the previous writer.
    await store.set_node_state(new.node_id, new.node_epoch, NodeState.STOPPED)
    taken = await store.claim_stream(stream.stream_id, other.node_id, other.node_epoch)
    assert taken.owner_node_id == 2 and taken.epoch == reclaimed.epoch + 1
    with pytest.raises(FencedError):
        await commit_range(store, new, reclaimed, 20, 30)
    await commit_range(store, other, taken, 20, 30)

    await store.release_streams(other.node_id, other.node_epoch)
    assert (await store.get_stream(stream.stream_id)).owner_node_id is None
    unregistered = NodeInfo(9, 1, NodeState.RUNNING)
    with pytest.raises(FencedError):
        await store.claim_stream(stream.stream_id, unregistered.node_id, 1)


async def test_idempotent_commit(store: MetadataStore) -> None:
    node = await store.register_node(1, {})
    kept = await writable_stream(store, node, "kept")
    doomed = await writable_stream(store, node, "doomed")
    a, b = await store.prepare_objects(2, ttl_ms=60_000)
    commits = [
        stream_object(a, kept, 0, 10),
        set_object(b, [(kept, 10, 12), (doomed, 0, 4)]),
    ]
    await store.commit_objects(node.node_id, node.node_epoch, commits)
    before = (await store.list_objects(), await store.get_streams([kept.stream_id]))
    await store.commit_objects(node.node_id, node.node_epoch, commits)
    # Still the same after the second stream is deleted (its range is dead, not different).
    await store.delete_stream(doomed.stream_id)
    await store.commit_objects(node.node_id, node.node_epoch, commits)
    after = (await store.list_objects(), await store.get_streams([kept.stream_id]))
    assert before[1] == after[1]
    assert [o.ranges for o in before[0]] == [o.ranges for o in after[0]]

    # A commit naming the same id with different content is not a repeat.
    with pytest.raises(PreconditionFailed):
        await store.commit_objects(
            node.node_id, node.node_epoch, [stream_object(a, kept, 0, 10, key="objects/other")]
        )
    # A repeat of a commit whose range was dropped because its stream was already deleted.
    [c] = await store.prepare_objects(1, ttl_ms=60_000)
    dropped = [set_object(c, [(kept, 12, 20), (doomed, 4, 8)])]
    await store.commit_objects(node.node_id, node.node_epoch, dropped)
    await store.commit_objects(node.node_id, node.node_epoch, dropped)
    assert await committed_end(store, kept.stream_id) == 20
    [info] = [o for o in await store.list_objects() if o.object_id == c]
    assert [(r.stream_id, r.start_offset) for r in info.ranges] == [(kept.stream_id, 12)]


async def test_prepared_ttl(store: MetadataStore, clock: ManualClock) -> None:
    node = await store.register_node(1, {})
    stream = await writable_stream(store, node, "orders")
    late, swept, fresh = await store.prepare_objects(3, ttl_ms=1_000)
    assert await store.expired_prepared(clock.now_ms()) == []

    clock.advance(2.0)
    with pytest.raises(PreconditionFailed, match="unknown/expired object id"):
        await store.commit_objects(
            node.node_id, node.node_epoch, [stream_object(late, stream, 0, 10)]
        )
    assert await store.expired_prepared(clock.now_ms()) == [late, swept, fresh]
    assert await committed_end(store, stream.stream_id) == 0

    # An id listed by the sweeper stays dead even if the clock disagrees (another process).
    [marked] = await store.prepare_objects(1, ttl_ms=1_000)
    assert await store.expired_prepared(clock.now_ms() + 5_000) == [late, swept, fresh, marked]
    with pytest.raises(PreconditionFailed):
        await store.commit_objects(
            node.node_id, node.node_epoch, [stream_object(marked, stream, 0, 10)]
        )

    await store.forget_objects([late, swept, fresh, marked])
    assert await store.list_objects() == []
    # Ids are never handed out again.
    [next_id] = await store.prepare_objects(1, ttl_ms=1_000)
    assert next_id == marked + 1
    await store.commit_objects(
        node.node_id, node.node_epoch, [stream_object(next_id, stream, 0, 10)]
    )
    await store.forget_objects([next_id])  # committed: left alone
    assert (await states(store)) == {next_id: ObjectState.COMMITTED}


async def test_names_unique(store: MetadataStore, clock: ManualClock) -> None:
    first = await store.create_stream("orders")
    assert (first.stream_id, first.epoch, first.start_offset, first.committed_end) == (1, 0, 0, 0)
    assert first.state is StreamState.ACTIVE and first.owner_node_id is None
    assert first.created_ms == clock.now_ms()
    with pytest.raises(StreamExists):
        await store.create_stream("orders")
    unnamed = [await store.create_stream(None) for _ in range(2)]
    assert [s.stream_id for s in unnamed] == [2, 3]

    await store.delete_stream(first.stream_id)
    with pytest.raises(StreamNotFound, match="deleted"):
        await store.get_stream(first.stream_id)
    with pytest.raises(StreamNotFound):
        await store.get_stream("orders")
    again = await store.create_stream("orders")
    assert again.stream_id == 4  # never reuses the deleted stream's id
    assert (await store.get_stream("orders")).stream_id == 4
    assert (await store.get_streams([1, 4, 99])) == {
        1: replace(first, state=StreamState.DELETED),
        4: again,
    }
    await store.create_stream("order-lines")
    assert [s.name for s in await store.list_streams("order")] == ["order-lines", "orders"]
    assert [s.stream_id for s in await store.list_streams()] == [
        2,
        3,
        5,
        4,
    ]  # by name: order-lines, orders
    with pytest.raises(StreamExists):
        await store.create_stream("orders")


async def test_trim_monotonic(store: MetadataStore) -> None:
    node = await store.register_node(1, {})
    left = await writable_stream(store, node, "left")
    right = await writable_stream(store, node, "right")
    low = await commit_range(store, node, left, 0, 10)
    [shared_id] = await store.prepare_objects(1, ttl_ms=60_000)
    await store.commit_objects(
        node.node_id, node.node_epoch, [set_object(shared_id, [(left, 10, 20), (right, 0, 5)])]
    )
    high = await commit_range(store, node, left, 20, 30)

    trimmed = await store.trim_stream(left.stream_id, left.epoch, 10)
    assert trimmed.start_offset == 10
    assert (await store.trim_stream(left.stream_id, left.epoch, 3)).start_offset == 10
    assert (await store.get_stream(left.stream_id)).start_offset == 10
    assert (await states(store))[low] is ObjectState.MARK_DESTROYED

    # The shared object still holds live data of ``right``.
    await store.trim_stream(left.stream_id, left.epoch, 25)
    assert (await states(store))[shared_id] is ObjectState.COMMITTED
    assert (await states(store))[high] is ObjectState.COMMITTED
    assert [o.object_id for o in await store.get_objects(left.stream_id, 25)] == [high]
    # Deleting ``right`` kills its last live range.
    await store.delete_stream(right.stream_id)
    await store.delete_stream(right.stream_id)  # a repeat is harmless
    assert (await states(store))[shared_id] is ObjectState.MARK_DESTROYED

    # The engine's tail may be ahead of what is committed: trimming past committed_end is allowed.
    beyond = await store.trim_stream(left.stream_id, left.epoch, 40)
    assert (beyond.start_offset, beyond.committed_end) == (40, 30)
    assert (await states(store))[high] is ObjectState.MARK_DESTROYED
    # A commit below the new start is still continuous, but holds only dead data.
    dead = await commit_range(store, node, left, 30, 35)
    assert (await states(store))[dead] is ObjectState.MARK_DESTROYED
    assert await committed_end(store, left.stream_id) == 35
    with pytest.raises(InvalidArgument):
        await store.trim_stream(left.stream_id, left.epoch, -1)


async def test_node_epochs(store: MetadataStore, clock: ManualClock) -> None:
    assert await store.get_node(7) is None
    first = await store.register_node(7, {"type": "ebs", "capacity": 1 << 30})
    assert (first.node_epoch, first.state) == (1, NodeState.RUNNING)
    assert first.wal_config == {"type": "ebs", "capacity": 1 << 30}
    assert first.updated_ms == clock.now_ms()
    second = await store.register_node(7, {"type": "ebs"})
    assert second.node_epoch == 2
    failing = await store.begin_failover(7)
    assert (failing.node_epoch, failing.state) == (3, NodeState.FAILING_OVER)
    with pytest.raises(FencedError):
        await store.set_node_state(7, second.node_epoch, NodeState.STOPPED)
    await store.set_node_state(7, failing.node_epoch, NodeState.FAILED_OVER)
    node = await store.get_node(7)
    assert node is not None and (node.node_epoch, node.state) == (3, NodeState.FAILED_OVER)
    assert node.wal_config == {"type": "ebs"}
    assert (await store.register_node(7, {})).node_epoch == 4
    await store.register_node(3, {})
    assert [(n.node_id, n.node_epoch) for n in await store.list_nodes()] == [(3, 1), (7, 4)]
    with pytest.raises(InvalidArgument):
        await store.begin_failover(99)


async def test_failover_takes_streams(store: MetadataStore) -> None:
    dead = await store.register_node(1, {})
    stream = await writable_stream(store, dead, "orders")
    await commit_range(store, dead, stream, 0, 10)
    survivor = await store.register_node(2, {})
    # The survivor recovers the dead node's WAL under the dead node's identity.
    failing = await store.begin_failover(1)
    with pytest.raises(FencedError):
        await commit_range(store, dead, stream, 10, 20)
    recovered = await store.claim_stream(stream.stream_id, 1, failing.node_epoch)
    await commit_range(store, failing, recovered, 10, 20)
    await store.release_streams(1, failing.node_epoch)
    await store.set_node_state(1, failing.node_epoch, NodeState.FAILED_OVER)
    taken = await store.claim_stream(stream.stream_id, survivor.node_id, survivor.node_epoch)
    await commit_range(store, survivor, taken, 20, 30)
    assert await committed_end(store, stream.stream_id) == 30


async def test_compaction_atomic(store: MetadataStore) -> None:
    node = await store.register_node(1, {})
    orders = await writable_stream(store, node, "orders")
    other = await writable_stream(store, node, "other")
    a = await commit_range(store, node, orders, 0, 10)
    [b] = await store.prepare_objects(1, ttl_ms=60_000)
    await store.commit_objects(
        node.node_id, node.node_epoch, [set_object(b, [(orders, 10, 20), (other, 0, 8)])]
    )
    c = await commit_range(store, node, orders, 20, 30)
    before = await store.list_objects()

    x, y = await store.prepare_objects(2, ttl_ms=60_000)
    losing = [stream_object(x, orders, 0, 15), stream_object(y, other, 0, 8)]
    with pytest.raises(PreconditionFailed, match="loses live data"):
        await store.replace_objects([a, b], losing)
    outside = [stream_object(x, orders, 0, 25), stream_object(y, other, 0, 8)]
    with pytest.raises(PreconditionFailed, match="not inside"):
        await store.replace_objects([a, b], outside)
    with pytest.raises(PreconditionFailed):  # the new ids must be prepared
        await store.replace_objects(
            [a, b], [stream_object(c, orders, 0, 20), stream_object(y, other, 0, 8)]
        )
    assert await store.list_objects(state=ObjectState.COMMITTED) == before

    good = [stream_object(x, orders, 0, 20), stream_object(y, other, 0, 8)]
    await store.replace_objects([a, b], good)
    found = await store.get_objects(orders.stream_id, 0)
    assert [(o.object_id, o.ranges[0].start_offset) for o in found] == [(x, 0), (c, 20)]
    assert (await states(store)) == {
        a: ObjectState.MARK_DESTROYED,
        b: ObjectState.MARK_DESTROYED,
        c: ObjectState.COMMITTED,
        x: ObjectState.COMMITTED,
        y: ObjectState.COMMITTED,
    }
    assert await committed_end(store, orders.stream_id) == 30
    # A source that changed (already replaced) fails the swap; nothing moves.
    [z] = await store.prepare_objects(1, ttl_ms=60_000)
    with pytest.raises(PreconditionFailed, match="not committed"):
        await store.replace_objects([a, c], [stream_object(z, orders, 0, 10)])
    assert (await states(store))[c] is ObjectState.COMMITTED

    # After a trim, compaction may drop the dead part of its sources.
    await store.trim_stream(orders.stream_id, orders.epoch, 25)
    await store.replace_objects([c], [stream_object(z, orders, 25, 30)])
    assert [o.object_id for o in await store.get_objects(orders.stream_id, 25)] == [z]


async def test_errors_typed(open_store: Opener) -> None:
    store = open_store()
    node = await store.register_node(1, {})
    stream = await writable_stream(store, node, "orders")
    failures: list[Callable[[], Awaitable[object]]] = [
        lambda: store.get_stream("missing"),
        lambda: store.get_stream(404),
        lambda: store.delete_stream(404),
        lambda: store.claim_stream(404, 1, node.node_epoch),
        lambda: store.trim_stream(404, 0, 1),
        lambda: store.create_stream(""),
        lambda: store.prepare_objects(0, 1000),
        lambda: store.get_objects(stream.stream_id, 0, limit=0),
        lambda: store.register_node(2, {"bad": object()}),
        lambda: store.begin_failover(404),
        lambda: store.commit_objects(1, node.node_epoch, [stream_object(404, stream, 0, 1)]),
        lambda: store.commit_objects(1, node.node_epoch, [stream_object(404, stream, 5, 1)]),
        lambda: store.replace_objects([], []),
        lambda: store.set_node_state(404, 1, NodeState.STOPPED),
    ]
    for failing in failures:
        with pytest.raises(WalstreamError):
            await failing()
    with pytest.raises(StreamNotFound, match="list_streams"):
        await store.get_stream("missing")
    assert (await store.get_streams([stream.stream_id]))[stream.stream_id].committed_end == 0
    await store.close()
    await store.close()
    with pytest.raises(BackendUnavailable):
        await store.create_stream("after-close")


# -- reads -----------------------------------------------------------------------------------------


async def test_get_objects_window(store: MetadataStore) -> None:
    node = await store.register_node(1, {})
    stream = await writable_stream(store, node, "orders")
    other = await writable_stream(store, node, "other")
    ids = [await commit_range(store, node, stream, start, start + 10) for start in range(0, 50, 10)]
    [shared] = await store.prepare_objects(1, ttl_ms=60_000)
    await store.commit_objects(
        node.node_id, node.node_epoch, [set_object(shared, [(other, 0, 5), (stream, 50, 60)])]
    )
    window = await store.get_objects(stream.stream_id, 15, 35)
    assert [o.object_id for o in window] == ids[1:4]
    assert await store.get_objects(stream.stream_id, 20, 20) == []
    assert [o.object_id for o in await store.get_objects(stream.stream_id, 0, limit=2)] == ids[:2]
    [tail] = await store.get_objects(stream.stream_id, 59)
    assert tail.object_id == shared and tail.kind is ObjectKind.STREAM_SET
    assert tail.ranges == (StreamRange(stream.stream_id, 50, 60, stream.epoch),)
    assert (tail.key, tail.size, tail.index_size) == (f"objects/{shared}", 1000, 96)
    assert await store.get_objects(stream.stream_id, 60) == []
    [full] = await store.list_objects(kind=ObjectKind.STREAM_SET)
    assert len(full.ranges) == 2


# -- SQLite specifics ------------------------------------------------------------------------------


async def test_memory_named_volume_survives_reopen(clock: ManualClock) -> None:
    first = MemoryMetadataStore("reopen-volume", clock=clock)
    await first.create_stream("kept")
    await first.close()
    second = MemoryMetadataStore("reopen-volume", clock=clock)
    assert (await second.get_stream("kept")).stream_id == 1
    assert await MemoryMetadataStore(clock=clock).list_streams() == []


async def test_sqlite_survives_reopen(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "deep" / "folder" / "meta.db"
    store = SqliteMetadataStore(path, clock=clock)
    node = await store.register_node(1, {"type": "ebs"})
    stream = await writable_stream(store, node, "orders")
    object_id = await commit_range(store, node, stream, 0, 10)
    await store.trim_stream(stream.stream_id, stream.epoch, 2)
    await store.close()

    reopened = SqliteMetadataStore(path, clock=clock)
    try:
        expected = replace(stream, committed_end=10, start_offset=2)
        assert await reopened.get_stream("orders") == expected
        [info] = await reopened.get_objects(stream.stream_id, 0)
        assert info.object_id == object_id and info.committed_ms == clock.now_ms()
        node_again = await reopened.get_node(1)
        assert node_again is not None and node_again.wal_config == {"type": "ebs"}
        assert (await reopened.prepare_objects(1, 1000)) == [object_id + 1]
        assert (await reopened.create_stream(None)).stream_id == stream.stream_id + 1
    finally:
        await reopened.close()


async def test_sqlite_journal_mode_wal_and_read_index(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    store = SqliteMetadataStore(path)
    await store.create_stream("orders")
    await store.close()
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("SELECT max(version) FROM schema_version").fetchone() == (
            SCHEMA_VERSION,
        )
        plan = " | ".join(
            str(row[-1])
            for row in connection.execute(
                "EXPLAIN QUERY PLAN SELECT o.object_id FROM ranges AS r JOIN objects AS o "
                "ON o.object_id = r.object_id WHERE r.stream_id = ? AND r.end_offset > ? "
                "AND r.start_offset < ? AND o.state = 'committed' ORDER BY r.end_offset "
                "LIMIT ?",
                (1, 0, 100, 10),
            )
        )
    finally:
        connection.close()
    assert "ranges_stream_end" in plan and "TEMP B-TREE" not in plan, plan


@pytest.mark.slow
async def test_sqlite_id_lists_of_any_length(tmp_path: Path, clock: ManualClock) -> None:
    """Calls naming many ids at once (listing, forgetting, reading streams) bind them as one
    parameter per id up to a bound and as one JSON array beyond it: both give the same rows,
    with no limit on how many."""
    store = SqliteMetadataStore(tmp_path / "meta.db", clock=clock)
    try:
        node = await store.register_node(1, {})
        streams = [await writable_stream(store, node, f"s{i}") for i in range(3)]
        few = await commit_range(store, node, streams[0], 0, 10)
        many = await store.prepare_objects(40_000, ttl_ms=1)
        prepared = await store.list_objects(ObjectState.PREPARED)
        assert [o.object_id for o in prepared] == many
        wanted = [s.stream_id for s in streams] + list(range(10_000, 10_100))
        assert sorted(await store.get_streams(wanted)) == [s.stream_id for s in streams]
        await store.forget_objects([*many, few])  # none may be forgotten yet
        assert len(await store.list_objects()) == 40_001
        clock.advance(1.0)
        assert await store.expired_prepared(clock.now_ms()) == many
        await store.forget_objects([*many, few])
        assert [o.object_id for o in await store.list_objects()] == [few]
    finally:
        await store.close()


async def test_sqlite_damaged_file(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    path.write_bytes(b"this is not a database, just some bytes" * 200)
    store = SqliteMetadataStore(path)
    with pytest.raises(CorruptionError, match="backup"):
        await store.create_stream("orders")
    await store.close()


async def test_sqlite_locked_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    store = SqliteMetadataStore(path, busy_timeout_s=0.2)
    await store.create_stream("orders")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(BackendUnavailable, match="busy_timeout"):
            await store.create_stream("blocked")
        assert [s.name for s in await store.list_streams()] == ["orders"]  # readers go on
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await store.create_stream("later")
    await store.close()


_HAMMER = textwrap.dedent(
    """
    import asyncio, json, sys
    from walstream.errors import StreamExists
    from walstream.metadata import ObjectCommit, ObjectKind, StreamRange
    from walstream.metadata.sqlite import SqliteMetadataStore

    async def main(path: str, node_id: int, rounds: int) -> None:
        store = SqliteMetadataStore(path, busy_timeout_s=20)
        node = await store.register_node(node_id, {})
        streams, objects, shared = [], [], []
        for i in range(rounds):
            stream = await store.create_stream(f"node{node_id}-{i}")
            stream = await store.claim_stream(stream.stream_id, node_id, node.node_epoch)
            ids = await store.prepare_objects(2, 60_000)
            await store.commit_objects(node_id, node.node_epoch, [
                ObjectCommit(ids[0], f"k{ids[0]}", ObjectKind.STREAM, 1, 1,
                             (StreamRange(stream.stream_id, 0, 10, stream.epoch),)),
                ObjectCommit(ids[1], f"k{ids[1]}", ObjectKind.STREAM, 1, 1,
                             (StreamRange(stream.stream_id, 10, 25, stream.epoch),)),
            ])
            streams.append(stream.stream_id)
            objects.extend(ids)
            try:
                shared.append((await store.create_stream(f"shared-{i}")).stream_id)
            except StreamExists:
                pass
        await store.close()
        print(json.dumps({"streams": streams, "objects": objects, "shared": shared}))

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    """
)


async def test_sqlite_two_processes(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "meta.db"
    rounds = 30
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _HAMMER, str(path), str(node_id), str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node_id in (1, 2)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        results.append(json.loads(out))

    streams = [s for r in results for s in r["streams"]]
    shared = [s for r in results for s in r["shared"]]
    objects = [o for r in results for o in r["objects"]]
    assert len(set(streams + shared)) == len(streams) + len(shared) == 3 * rounds
    assert sorted(streams + shared) == list(range(1, 3 * rounds + 1))
    assert sorted(objects) == list(range(1, 4 * rounds + 1))

    store = SqliteMetadataStore(path)
    try:
        active = await store.list_streams()
        assert len(active) == 3 * rounds
        assert sorted(s.name for s in active if s.name and s.name.startswith("shared-")) == sorted(
            f"shared-{i}" for i in range(rounds)
        )
        for stream_id in streams:
            assert await committed_end(store, stream_id) == 25
            found = await store.get_objects(stream_id, 0)
            assert [(o.ranges[0].start_offset, o.ranges[0].end_offset) for o in found] == [
                (0, 10),
                (10, 25),
            ]
        committed = await store.list_objects(state=ObjectState.COMMITTED)
        assert sorted(o.object_id for o in committed) == sorted(objects)
        assert [(n.node_id, n.node_epoch) for n in await store.list_nodes()] == [(1, 1), (2, 1)]
    finally:
        await store.close()


_COMMIT_FOREVER = textwrap.dedent(
    """
    import asyncio, sys
    from walstream.metadata import ObjectCommit, ObjectKind, StreamRange
    from walstream.metadata.sqlite import SqliteMetadataStore

    async def main(path: str) -> None:
        store = SqliteMetadataStore(path)
        node = await store.register_node(1, {})
        stream = await store.create_stream("orders")
        stream = await store.claim_stream(stream.stream_id, 1, node.node_epoch)
        end = 0
        while True:
            [object_id] = await store.prepare_objects(1, 60_000)
            await store.commit_objects(1, node.node_epoch, [
                ObjectCommit(object_id, f"k{object_id}", ObjectKind.STREAM, 1, 1,
                             (StreamRange(stream.stream_id, end, end + 7, stream.epoch),)),
            ])
            end += 7
            print(end, flush=True)

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_sqlite_keeps_acknowledged_commits_after_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    process = subprocess.Popen(
        [sys.executable, "-c", _COMMIT_FOREVER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    acknowledged = 0
    try:
        for line in process.stdout:
            acknowledged = int(line)
            if acknowledged >= 7 * 25:
                break
    finally:
        process.send_signal(signal.SIGKILL)
        rest, err = process.communicate(timeout=30)
    assert acknowledged >= 7 * 25, err
    acknowledged = max([acknowledged, *(int(line) for line in rest.split())])

    store = SqliteMetadataStore(path)
    try:
        stream = await store.get_stream("orders")
        assert stream.committed_end >= acknowledged
        objects = await store.get_objects(stream.stream_id, 0, limit=10_000)
        ranges = [(o.ranges[0].start_offset, o.ranges[0].end_offset) for o in objects]
        assert ranges == [(start, start + 7) for start in range(0, stream.committed_end, 7)]
        # The store is usable after the crash: the next id is new.
        [next_id] = await store.prepare_objects(1, 1000)
        assert next_id > max(o.object_id for o in objects)
    finally:
        await store.close()


# -- factories -------------------------------------------------------------------------------------


async def test_factories_and_entry_points(tmp_path: Path) -> None:
    memory = MEMORY_METADATA.build({"name": "factory-volume"}, BuildContext(), "metadata")
    assert isinstance(memory, MemoryMetadataStore)
    sqlite_store = SQLITE_METADATA.build(
        {"type": "sqlite", "path": "data/meta.db", "busy_timeout": "2s"},
        BuildContext(base_dir=tmp_path),
        "metadata",
    )
    assert isinstance(sqlite_store, SqliteMetadataStore)
    assert sqlite_store.path == tmp_path / "data" / "meta.db"
    await sqlite_store.create_stream("x")
    await sqlite_store.close()
    assert (tmp_path / "data" / "meta.db").exists()
    with pytest.raises(ConfigError, match=r"metadata\.path"):
        SQLITE_METADATA.build({}, BuildContext(base_dir=tmp_path), "metadata")
    with pytest.raises(ConfigError, match="busy_timeout"):
        SQLITE_METADATA.build(
            {"path": "m.db", "busy_timeout": "soon"}, BuildContext(base_dir=tmp_path), "metadata"
        )
    loaded = {ep.name: ep.load() for ep in entry_points(group="walstream.metadata")}
    assert loaded.get("memory") is MEMORY_METADATA
    assert loaded.get("sqlite") is SQLITE_METADATA


@pytest.mark.slow
def test_sqlite_files_opened_by_several_connections_at_once_all_open(tmp_path: Path) -> None:
    """Switching a new file to WAL journaling takes an exclusive lock, and SQLite refuses at
    once ("database is locked", its busy handler not consulted) a connection that would
    otherwise wait for another opening the same file: each one retries until its busy timeout.
    Without the retry about one round in ten of these fails."""
    failures: list[BaseException] = []
    for round_ in range(60):
        path = tmp_path / f"round-{round_}" / "metadata.db"
        together = threading.Barrier(6)

        def open_once(path: Path = path, together: threading.Barrier = together) -> None:
            together.wait()
            try:
                open_connection(path, 5.0).close()
            except BaseException as error:  # the assertion below names it
                failures.append(error)

        threads = [threading.Thread(target=open_once) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []
