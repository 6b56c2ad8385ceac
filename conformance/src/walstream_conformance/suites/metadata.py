"""The metadata suite: one test per numbered invariant of :class:`walstream.metadata.MetadataStore`.

A backend provides ``walstream_metadata_factory``: a callable making a new store instance on the
same database (so a test can check what survives a reopen). Tests use their own node ids and
stream names, so a shared database works too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from walstream.errors import (
    BasinExists,
    BasinNotFound,
    FencedError,
    InvalidArgument,
    PreconditionFailed,
    StreamExists,
    StreamNotFound,
    VersionMismatchError,
    WalstreamError,
)
from walstream.metadata import (
    DataLossGap,
    MetadataStore,
    NodeState,
    ObjectCommit,
    ObjectKind,
    ObjectState,
    StreamRange,
)
from walstream.stream_config import StreamConfig, Timestamping

from ..requirements import check_version

__all__ = ["MetadataKit", "MetadataSuite"]

_unique = itertools.count(1)
_TTL_MS = 600_000


@dataclass
class MetadataKit:
    factory: Callable[[], MetadataStore]
    tag: str = field(default_factory=lambda: f"{os.getpid()}-{next(_unique)}")
    _opened: list[MetadataStore] = field(default_factory=list)

    def open(self) -> MetadataStore:
        store = self.factory()
        self._opened.append(store)
        return store

    def node_id(self, index: int = 0) -> int:
        # Distinct per test so a shared database keeps working.
        return (os.getpid() % 10_000) * 100_000 + next(_unique) * 10 + index

    def name(self, label: str) -> str:
        return f"conformance-{self.tag}-{label}"

    async def aclose(self) -> None:
        for store in self._opened:
            await store.close()


@dataclass
class _Writer:
    """A registered node that owns one stream: the usual shape of a commit."""

    store: MetadataStore
    node_id: int
    node_epoch: int
    stream_id: int
    stream_epoch: int

    async def prepare(self, count: int = 1, ttl_ms: int = _TTL_MS) -> list[int]:
        return await self.store.prepare_objects(count, ttl_ms)

    def commit_of(
        self, object_id: int, start: int, end: int, epoch: int | None = None
    ) -> ObjectCommit:
        return ObjectCommit(
            object_id=object_id,
            key=f"objects/{object_id:08d}",
            kind=ObjectKind.STREAM,
            size=1000 + end - start,
            index_size=64,
            ranges=(
                StreamRange(
                    self.stream_id, start, end, self.stream_epoch if epoch is None else epoch
                ),
            ),
        )

    async def commit(self, *commits: ObjectCommit, node_epoch: int | None = None) -> None:
        await self.store.commit_objects(
            self.node_id, self.node_epoch if node_epoch is None else node_epoch, list(commits)
        )


async def _writer(kit: MetadataKit, store: MetadataStore, label: str) -> _Writer:
    node_id = kit.node_id()
    node = await store.register_node(node_id, {"type": "conformance"})
    stream = await store.create_stream(kit.name(label))
    claimed = await store.claim_stream(stream.stream_id, node_id, node.node_epoch)
    return _Writer(store, node_id, node.node_epoch, stream.stream_id, claimed.epoch)


async def _wait_for_store_time(store: MetadataStore, past_ms: int) -> None:
    """Wait until the store's clock reads later than ``past_ms`` (at most a few seconds)."""
    deadline = time.monotonic() + 5.0
    while await store.store_time_ms() <= past_ms:
        assert time.monotonic() < deadline, "the store's clock did not move for 5 s"
        await asyncio.sleep(0.005)


class MetadataSuite:
    """Subclass with one line next to a ``walstream_metadata_factory`` fixture."""

    pytestmark = pytest.mark.asyncio  # also under pytest-asyncio's strict mode

    @pytest.fixture(autouse=True)
    def _walstream_contract_version(self) -> None:
        check_version()

    @pytest_asyncio.fixture
    async def walstream_metadata_kit(
        self, walstream_metadata_factory: Callable[[], MetadataStore]
    ) -> AsyncIterator[MetadataKit]:
        kit = MetadataKit(walstream_metadata_factory)
        try:
            yield kit
        finally:
            await kit.aclose()

    # 1 ------------------------------------------------------------------------------------------
    async def test_atomic_commit(self, walstream_metadata_kit: MetadataKit) -> None:
        """A commit whose second object breaks a rule leaves no trace of its first."""
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "atomic")
        first, second = await writer.prepare(2)
        with pytest.raises(PreconditionFailed):
            await writer.commit(writer.commit_of(first, 0, 10), writer.commit_of(second, 11, 20))
        stream = await store.get_stream(writer.stream_id)
        assert stream.committed_end == 0, (
            f"a rejected commit moved committed_end to {stream.committed_end}"
        )
        assert await store.get_objects(writer.stream_id, 0) == [], (
            "a rejected commit left an object"
        )
        await writer.commit(writer.commit_of(first, 0, 10), writer.commit_of(second, 10, 20))
        objects = await store.get_objects(writer.stream_id, 0)
        assert [o.object_id for o in objects] == [first, second]
        assert (await store.get_stream(writer.stream_id)).committed_end == 20

    # 2 ------------------------------------------------------------------------------------------
    async def test_continuity(self, walstream_metadata_kit: MetadataKit) -> None:
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "continuity")
        ids = await writer.prepare(4)
        await writer.commit(writer.commit_of(ids[0], 0, 100))
        for gap_start in (99, 101, 0, 200):
            with pytest.raises(PreconditionFailed):
                await writer.commit(writer.commit_of(ids[1], gap_start, gap_start + 5))
        await writer.commit(writer.commit_of(ids[1], 100, 150))
        assert (await store.get_stream(writer.stream_id)).committed_end == 150
        objects = await store.get_objects(writer.stream_id, 120, 130)
        assert [
            (o.object_id, o.ranges[0].start_offset, o.ranges[0].end_offset) for o in objects
        ] == [(ids[1], 100, 150)]

    # 3 ------------------------------------------------------------------------------------------
    async def test_epochs_fence(self, walstream_metadata_kit: MetadataKit) -> None:
        """Stale node epochs and stale stream epochs are refused with FencedError."""
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "fence")
        ids = await writer.prepare(4)
        await writer.commit(writer.commit_of(ids[0], 0, 10))
        restarted = await store.register_node(writer.node_id, {"type": "conformance"})
        assert restarted.node_epoch > writer.node_epoch
        with pytest.raises(FencedError):
            await writer.commit(writer.commit_of(ids[1], 10, 20))  # stale node epoch
        reclaimed = await store.claim_stream(writer.stream_id, writer.node_id, restarted.node_epoch)
        with pytest.raises(FencedError):  # current node epoch, stale stream epoch
            await writer.commit(writer.commit_of(ids[1], 10, 20), node_epoch=restarted.node_epoch)
        with pytest.raises(FencedError):
            await store.trim_stream(writer.stream_id, writer.stream_epoch, 5)
        with pytest.raises(FencedError):
            await store.claim_stream(writer.stream_id, writer.node_id, writer.node_epoch)
        with pytest.raises(FencedError):
            await store.set_node_state(writer.node_id, writer.node_epoch, NodeState.STOPPED)
        stream = await store.get_stream(writer.stream_id)
        assert (stream.committed_end, stream.start_offset) == (10, 0), (
            "a fenced call changed the stream"
        )
        await store.commit_objects(
            writer.node_id,
            restarted.node_epoch,
            [writer.commit_of(ids[1], 10, 20, epoch=reclaimed.epoch)],
        )
        assert (await store.get_stream(writer.stream_id)).committed_end == 20

    # 4 ------------------------------------------------------------------------------------------
    async def test_idempotent_commit(self, walstream_metadata_kit: MetadataKit) -> None:
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "idempotent")
        ids = await writer.prepare(2)
        commits = (writer.commit_of(ids[0], 0, 10), writer.commit_of(ids[1], 10, 30))
        await writer.commit(*commits)
        before = await store.get_objects(writer.stream_id, 0)
        await writer.commit(*commits)
        await writer.commit(commits[1])
        assert (await store.get_stream(writer.stream_id)).committed_end == 30
        assert await store.get_objects(writer.stream_id, 0) == before

    # 5 ------------------------------------------------------------------------------------------
    async def test_prepared_ttl(self, walstream_metadata_kit: MetadataKit) -> None:
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "ttl")
        expiring = await writer.prepare(2, ttl_ms=1)
        lasting = await writer.prepare(1, ttl_ms=_TTL_MS * 100)
        await asyncio.sleep(0.01)
        # Far enough in the future for any store clock (system or an injected one near now).
        expired = await store.expired_prepared(time.time_ns() // 1_000_000 + 3_600_000)
        assert set(expiring) <= set(expired), (
            f"ids {expiring} with a 1 ms TTL were not listed: {expired}"
        )
        assert not set(lasting) & set(expired), "an id with a long TTL was listed as expired"
        with pytest.raises(PreconditionFailed):
            await writer.commit(writer.commit_of(expiring[0], 0, 10))
        await writer.commit(writer.commit_of(lasting[0], 0, 10))
        assert (await store.get_stream(writer.stream_id)).committed_end == 10

    # 6 ------------------------------------------------------------------------------------------
    async def test_names_unique(self, walstream_metadata_kit: MetadataKit) -> None:
        kit = walstream_metadata_kit
        store = kit.open()
        name = kit.name("unique")
        first = await store.create_stream(name)
        with pytest.raises(StreamExists):
            await store.create_stream(name)
        results = await asyncio.gather(
            *[store.create_stream(kit.name("raced")) for _ in range(5)], return_exceptions=True
        )
        assert sum(not isinstance(r, BaseException) for r in results) == 1, (
            "a name was created twice"
        )
        await store.delete_stream(first.stream_id)
        with pytest.raises(StreamNotFound):
            await store.get_stream(name)
        second = await store.create_stream(name)
        assert second.stream_id > first.stream_id, "a stream id was reused"
        assert (await store.get_stream(name)).stream_id == second.stream_id
        listed = [s.stream_id for s in await store.list_streams(kit.name(""))]
        assert first.stream_id not in listed and second.stream_id in listed
        deleted = await store.get_streams([first.stream_id])
        assert deleted[first.stream_id].state.value == "deleted"

    # 7 ------------------------------------------------------------------------------------------
    async def test_trim_monotonic(self, walstream_metadata_kit: MetadataKit) -> None:
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "trim")
        ids = await writer.prepare(3)
        await writer.commit(
            writer.commit_of(ids[0], 0, 10),
            writer.commit_of(ids[1], 10, 20),
            writer.commit_of(ids[2], 20, 30),
        )
        trimmed = await store.trim_stream(writer.stream_id, writer.stream_epoch, 15)
        assert trimmed.start_offset == 15
        try:
            await store.trim_stream(writer.stream_id, writer.stream_epoch, 5)
        except WalstreamError:
            pass
        assert (await store.get_stream(writer.stream_id)).start_offset == 15, (
            "trim moved start backwards"
        )
        states = {o.object_id: o.state for o in await store.list_objects()}
        assert states[ids[0]] is ObjectState.MARK_DESTROYED, (
            "an object wholly below start stayed live"
        )
        assert states[ids[1]] is ObjectState.COMMITTED and states[ids[2]] is ObjectState.COMMITTED
        assert [o.object_id for o in await store.get_objects(writer.stream_id, 15)] == ids[1:]
        await store.delete_stream(writer.stream_id)
        states = {o.object_id: o.state for o in await store.list_objects()}
        assert all(states[i] is ObjectState.MARK_DESTROYED for i in ids), (
            "a deleted stream's object stayed live"
        )

    # 8 ------------------------------------------------------------------------------------------
    async def test_node_epochs(self, walstream_metadata_kit: MetadataKit) -> None:
        kit = walstream_metadata_kit
        store = kit.open()
        node_id = kit.node_id()
        epochs = [(await store.register_node(node_id, {"path": "/x"})).node_epoch for _ in range(3)]
        assert epochs == sorted(set(epochs)), f"register_node epochs do not grow: {epochs}"
        failing = await store.begin_failover(node_id)
        assert failing.node_epoch > epochs[-1] and failing.state is NodeState.FAILING_OVER
        with pytest.raises(FencedError):
            await store.set_node_state(node_id, epochs[-1], NodeState.RUNNING)
        await store.set_node_state(node_id, failing.node_epoch, NodeState.FAILED_OVER)
        node = await store.get_node(node_id)
        assert node is not None and node.state is NodeState.FAILED_OVER
        assert node.wal_config == {"path": "/x"}
        again = await kit.open().register_node(node_id, {})
        assert again.node_epoch > failing.node_epoch, "a reopened store forgot the node epoch"

    # 9 ------------------------------------------------------------------------------------------
    async def test_compaction_atomic(self, walstream_metadata_kit: MetadataKit) -> None:
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "compaction")
        ids = await writer.prepare(3)
        await writer.commit(writer.commit_of(ids[0], 0, 10), writer.commit_of(ids[1], 10, 20))
        (merged,) = await writer.prepare(1)
        merged_commit = writer.commit_of(merged, 0, 20)
        with pytest.raises(PreconditionFailed):  # a source that is not committed
            await store.replace_objects([ids[0], ids[2]], [merged_commit])
        assert [o.object_id for o in await store.get_objects(writer.stream_id, 0)] == ids[:2]
        await store.replace_objects(ids[:2], [merged_commit])
        assert [o.object_id for o in await store.get_objects(writer.stream_id, 0)] == [merged]
        with pytest.raises(PreconditionFailed):  # the sources changed (already replaced)
            await store.replace_objects(
                ids[:2], [writer.commit_of((await writer.prepare(1))[0], 0, 20)]
            )
        assert (await store.get_stream(writer.stream_id)).committed_end == 20

    # 10 -----------------------------------------------------------------------------------------
    async def test_errors_typed(self, walstream_metadata_kit: MetadataKit) -> None:
        kit = walstream_metadata_kit
        store = kit.open()
        with pytest.raises(StreamNotFound):
            await store.get_stream(kit.name("missing"))
        with pytest.raises(StreamNotFound):
            await store.get_stream(10**12)
        assert await store.get_streams([10**12]) == {}
        assert await store.get_node(kit.node_id()) is None
        with pytest.raises(FencedError):
            await store.commit_objects(kit.node_id(), 1, [])

    # 11 -----------------------------------------------------------------------------------------
    async def test_deployment_id(self, walstream_metadata_kit: MetadataKit) -> None:
        """16 bytes, created once: the same from every call, instance and reopen."""
        kit = walstream_metadata_kit
        store = kit.open()
        other = kit.open()
        first, second = await asyncio.gather(store.deployment_id(), other.deployment_id())
        assert isinstance(first, bytes) and len(first) == 16, f"deployment id {first!r}"
        assert first == second, "two instances on one database disagree on the deployment id"
        assert first != bytes(16), "the deployment id must be random, not zeros"
        assert await store.deployment_id() == first
        await store.close()
        assert await kit.open().deployment_id() == first, "the deployment id changed on reopen"

    # 12 -----------------------------------------------------------------------------------------
    async def test_data_loss_gaps(self, walstream_metadata_kit: MetadataKit) -> None:
        """A recorded gap moves committed_end like a commit and is never assigned again."""
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "loss")
        assert await store.get_data_loss(writer.stream_id) == []
        ids = await writer.prepare(2)
        await writer.commit(writer.commit_of(ids[0], 0, 10))

        def gap(start: int, end: int) -> DataLossGap:
            return DataLossGap(writer.stream_id, start, end, f"conformance loss [{start},{end})")

        for start, end in ((9, 15), (11, 15)):  # continuity: only at committed_end
            with pytest.raises(PreconditionFailed):
                await store.record_data_loss(writer.node_id, writer.node_epoch, gap(start, end))
        for start, end in ((10, 10), (10, 9)):
            with pytest.raises(InvalidArgument):
                await store.record_data_loss(writer.node_id, writer.node_epoch, gap(start, end))
        stream = await store.record_data_loss(writer.node_id, writer.node_epoch, gap(10, 15))
        assert stream.committed_end == 15
        assert (await store.get_stream(writer.stream_id)).committed_end == 15
        # Idempotent: recording the same gap again changes nothing.
        again = await store.record_data_loss(writer.node_id, writer.node_epoch, gap(10, 15))
        assert again.committed_end == 15
        with pytest.raises(PreconditionFailed):  # a different gap at the same start
            await store.record_data_loss(writer.node_id, writer.node_epoch, gap(10, 20))
        # The lost offsets are never assigned again: the next commit starts after the gap.
        with pytest.raises(PreconditionFailed):
            await writer.commit(writer.commit_of(ids[1], 10, 20))
        await writer.commit(writer.commit_of(ids[1], 15, 20))
        assert (await store.get_stream(writer.stream_id)).committed_end == 20

        recorded = await store.get_data_loss(writer.stream_id)
        assert [(g.stream_id, g.start_offset, g.end_offset) for g in recorded] == [
            (writer.stream_id, 10, 15)
        ]
        assert recorded[0].reason == "conformance loss [10,15)"
        assert recorded[0].recorded_ms > 0, "the store sets recorded_ms"
        queries: list[tuple[int, int | None, int]] = [
            (0, 10, 0),
            (0, 11, 1),
            (14, None, 1),
            (15, None, 0),
            (12, 13, 1),
        ]
        for low, high, found in queries:
            assert len(await store.get_data_loss(writer.stream_id, low, high)) == found, (
                f"get_data_loss({low}, {high})"
            )

        # Epochs fence like a commit: a stale node epoch, or a node that does not own the stream.
        restarted = await store.register_node(writer.node_id, {"type": "conformance"})
        with pytest.raises(FencedError):
            await store.record_data_loss(writer.node_id, writer.node_epoch, gap(20, 25))
        stranger = kit.node_id(1)
        stranger_node = await store.register_node(stranger, {"type": "conformance"})
        with pytest.raises(FencedError):
            await store.record_data_loss(stranger, stranger_node.node_epoch, gap(20, 25))
        assert (await store.get_stream(writer.stream_id)).committed_end == 20
        await store.record_data_loss(writer.node_id, restarted.node_epoch, gap(20, 25))

        # Durable: a reopened store sees the gaps and the moved committed_end.
        await store.close()
        reopened = kit.open()
        assert [
            (g.start_offset, g.end_offset) for g in await reopened.get_data_loss(writer.stream_id)
        ] == [(10, 15), (20, 25)]
        assert (await reopened.get_stream(writer.stream_id)).committed_end == 25
        await reopened.delete_stream(writer.stream_id)
        with pytest.raises(StreamNotFound):
            await reopened.record_data_loss(writer.node_id, restarted.node_epoch, gap(25, 30))

    # 13 -----------------------------------------------------------------------------------------
    async def test_basins(self, walstream_metadata_kit: MetadataKit) -> None:
        """Created basins are found, listed by name and survive a reopen; a taken or malformed
        name is refused; a deleted basin is gone and its name can be created again; an updated
        config replaces the old one (only that basin's) and survives a reopen."""
        kit = walstream_metadata_kit
        store = kit.open()
        prefix = f"b{os.getpid() % 10_000:04d}-{next(_unique):03d}"
        names = [f"{prefix}-c", f"{prefix}-a", f"{prefix}-b"]
        config = {"default_stream_config": {"storage_class": "express"}, "n": [1, 2.5, None]}
        created = [await store.create_basin(names[0], config)]
        created += [await store.create_basin(name) for name in names[1:]]
        assert created[0].config == config and created[1].config == {}
        assert all(basin.created_ms > 0 for basin in created)
        with pytest.raises(BasinExists):
            await store.create_basin(names[0])
        for bad in (
            "short",
            "UPPERCASE-name",
            "-leading-hyphen",
            "trailing-hyphen-",
            "a" * 49,
            "has_underscore",
            "has.dot-name",
        ):
            with pytest.raises(InvalidArgument):
                await store.create_basin(bad)
        with pytest.raises(InvalidArgument):
            await store.create_basin(f"{prefix}-x", {"not": {1, 2}})
        await store.close()

        reopened = kit.open()
        assert (await reopened.get_basin(names[0])).config == config
        listed = await reopened.list_basins(prefix=prefix)
        assert [b.name for b in listed] == sorted(names)
        assert [b.name for b in await reopened.list_basins(prefix, limit=2)] == sorted(names)[:2]
        after = await reopened.list_basins(prefix, start_after=f"{prefix}-a")
        assert [b.name for b in after] == [f"{prefix}-b", f"{prefix}-c"]
        with pytest.raises(InvalidArgument):
            await reopened.list_basins(prefix, limit=0)

        await reopened.delete_basin(f"{prefix}-b")
        with pytest.raises(BasinNotFound):
            await reopened.get_basin(f"{prefix}-b")
        with pytest.raises(BasinNotFound):
            await reopened.delete_basin(f"{prefix}-b")
        assert [b.name for b in await reopened.list_basins(prefix)] == [
            f"{prefix}-a",
            f"{prefix}-c",
        ]
        again = await reopened.create_basin(f"{prefix}-b")
        assert again.config == {}

        # update_basin_config replaces the config, keeps name and creation time, survives reopen.
        first = await reopened.get_basin(names[0])
        kept: list[object] = [1, "x"]
        changed: dict[str, object] = {"create_stream_on_append": True, "nested": {"k": kept}}
        updated = await reopened.update_basin_config(names[0], changed)
        assert (updated.name, updated.config, updated.created_ms) == (
            first.name,
            changed,
            first.created_ms,
        )
        kept.append(2)  # the store kept its own copy
        with pytest.raises(BasinNotFound):
            await reopened.update_basin_config(f"{prefix}-missing", {})
        with pytest.raises(InvalidArgument):
            await reopened.update_basin_config(names[0], {"not": {1, 2}})
        await reopened.close()
        reopened = kit.open()
        assert (await reopened.get_basin(names[0])).config == {
            "create_stream_on_append": True,
            "nested": {"k": [1, "x"]},
        }
        assert (await reopened.get_basin(f"{prefix}-a")).config == {}
        for name in names:
            await reopened.delete_basin(name)
        assert await reopened.list_basins(prefix) == []

    # 14 -----------------------------------------------------------------------------------------
    async def test_lease_renew(self, walstream_metadata_kit: MetadataKit) -> None:
        """A renewal extends the lease on the store's clock; a stale epoch's renewal is fenced."""
        kit = walstream_metadata_kit
        store = kit.open()
        node_id = kit.node_id()
        address = "http://127.0.0.1:7400"
        first = await store.register_node(node_id, {"type": "conformance"}, address=address)
        assert (first.address, first.lease_expires_ms, first.state) == (
            address,
            0,
            NodeState.RUNNING,
        )
        before = await store.store_time_ms()
        renewed = await store.renew_lease(node_id, first.node_epoch, 60_000)
        after = await store.store_time_ms()
        assert before + 60_000 <= renewed.lease_expires_ms <= after + 60_000, (
            f"lease {renewed.lease_expires_ms} is not store time {before}..{after} + 60000"
        )
        assert renewed.node_epoch == first.node_epoch and renewed.live(after)
        seen = await kit.open().get_node(node_id)
        assert seen is not None and (seen.address, seen.lease_expires_ms) == (
            address,
            renewed.lease_expires_ms,
        ), "another instance does not see the address and lease"
        with pytest.raises(InvalidArgument):
            await store.renew_lease(node_id, first.node_epoch, 0)
        with pytest.raises(InvalidArgument):
            await store.register_node(node_id, {}, address="not a url")
        second = await store.register_node(node_id, {"type": "conformance"})
        assert second.node_epoch > first.node_epoch
        assert (second.lease_expires_ms, second.address) == (0, None), "a restart kept the lease"
        with pytest.raises(FencedError):
            await store.renew_lease(node_id, first.node_epoch, 60_000)
        with pytest.raises(FencedError):
            await store.renew_lease(kit.node_id(1), 1, 60_000)  # never registered

    async def test_lease_claim_of_live_node(self, walstream_metadata_kit: MetadataKit) -> None:
        """No claim succeeds while the node holds a live lease, or holds none, or is unknown."""
        kit = walstream_metadata_kit
        store = kit.open()
        node_id = kit.node_id()
        by = kit.node_id(1)
        node = await store.register_node(node_id, {"type": "conformance"})
        assert await store.claim_failover(node_id, node.node_epoch, by, 60_000) is None, (
            "a node that never took a lease was claimed"
        )
        await store.renew_lease(node_id, node.node_epoch, 60_000)
        assert await store.claim_failover(node_id, node.node_epoch, by, 60_000) is None, (
            "a live node was claimed"
        )
        assert await store.claim_failover(kit.node_id(2), 1, by, 60_000) is None
        after = await store.get_node(node_id)
        assert after is not None and after.node_epoch == node.node_epoch
        assert after.live(await store.store_time_ms())
        renewed = await store.renew_lease(node_id, node.node_epoch, 60_000)
        assert renewed.node_epoch == node.node_epoch

    async def test_lease_claim_expired(self, walstream_metadata_kit: MetadataKit) -> None:
        """Of two concurrent claims of an expired lease exactly one wins; it fences the node's
        renewals, and a new registration starts it again with a newer epoch."""
        kit = walstream_metadata_kit
        store = kit.open()
        node_id = kit.node_id()
        node = await store.register_node(node_id, {"path": "/wal"}, address="http://10.0.0.5:7400")
        leased = await store.renew_lease(node_id, node.node_epoch, 1)
        await _wait_for_store_time(store, leased.lease_expires_ms)
        claims = await asyncio.gather(
            kit.open().claim_failover(node_id, node.node_epoch, kit.node_id(1), 60_000),
            kit.open().claim_failover(node_id, node.node_epoch, kit.node_id(2), 60_000),
        )
        winners = [claim for claim in claims if claim is not None]
        assert len(winners) == 1, f"{len(winners)} of 2 concurrent failover claims won"
        (claimed,) = winners
        assert claimed.node_epoch == node.node_epoch + 1
        assert claimed.state is NodeState.FAILING_OVER
        assert claimed.lease_expires_ms >= leased.lease_expires_ms + 60_000, (
            "the claim did not give the claimer a failover lease of lease_ms"
        )
        assert claimed.wal_config == {"path": "/wal"}
        assert await store.claim_failover(node_id, node.node_epoch, kit.node_id(3), 60_000) is None
        with pytest.raises(FencedError):
            await store.renew_lease(node_id, node.node_epoch, 60_000)
        with pytest.raises(FencedError):  # the new epoch belongs to the failover, not a lease
            await store.renew_lease(node_id, claimed.node_epoch, 60_000)
        again = await store.register_node(node_id, {"path": "/wal"})
        assert again.node_epoch > claimed.node_epoch and again.state is NodeState.RUNNING
        assert again.lease_expires_ms == 0
        await store.renew_lease(node_id, again.node_epoch, 60_000)

    async def test_lease_failover_lease_holds(self, walstream_metadata_kit: MetadataKit) -> None:
        """While the claimer's failover lease runs nobody else can claim the failover; the
        claimer extends it with renew_failover, which needs the claimed epoch and FAILING_OVER."""
        kit = walstream_metadata_kit
        store = kit.open()
        node_id = kit.node_id()
        node = await store.register_node(node_id, {"path": "/wal"})
        with pytest.raises(FencedError):  # a running node is not failing over
            await store.renew_failover(node_id, node.node_epoch, 60_000)
        leased = await store.renew_lease(node_id, node.node_epoch, 1)
        await _wait_for_store_time(store, leased.lease_expires_ms)
        with pytest.raises(InvalidArgument):
            await store.claim_failover(node_id, node.node_epoch, kit.node_id(1), 0)
        claimed = await store.claim_failover(node_id, node.node_epoch, kit.node_id(1), 60_000)
        assert claimed is not None and claimed.state is NodeState.FAILING_OVER
        assert (
            await kit.open().claim_failover(node_id, claimed.node_epoch, kit.node_id(2), 60_000)
            is None
        ), "a failover whose failover lease still runs was claimed again"
        with pytest.raises(InvalidArgument):
            await store.renew_failover(node_id, claimed.node_epoch, 0)
        renewed = await store.renew_failover(node_id, claimed.node_epoch, 120_000)
        assert renewed.node_epoch == claimed.node_epoch
        assert renewed.state is NodeState.FAILING_OVER
        assert renewed.lease_expires_ms >= claimed.lease_expires_ms
        with pytest.raises(FencedError):  # the node's own epoch was fenced by the claim
            await store.renew_failover(node_id, node.node_epoch, 60_000)
        await store.set_node_state(node_id, claimed.node_epoch, NodeState.FAILED_OVER)
        with pytest.raises(FencedError):  # finished: nothing left to hold
            await store.renew_failover(node_id, claimed.node_epoch, 60_000)
        with pytest.raises(FencedError):
            await store.renew_failover(kit.node_id(2), 1, 60_000)  # never registered

    async def test_lease_failover_reclaim_expired(
        self, walstream_metadata_kit: MetadataKit
    ) -> None:
        """A failover whose claimer stopped halfway is claimed again once its failover lease
        expires: of two concurrent claims exactly one wins, with a newer epoch that fences the
        earlier claimer (its renew_failover and epoch-checked writes fail)."""
        kit = walstream_metadata_kit
        store = kit.open()
        node_id = kit.node_id()
        node = await store.register_node(node_id, {"path": "/wal"})
        leased = await store.renew_lease(node_id, node.node_epoch, 1)
        await _wait_for_store_time(store, leased.lease_expires_ms)
        first = await store.claim_failover(node_id, node.node_epoch, kit.node_id(1), 1)
        assert first is not None
        await _wait_for_store_time(store, first.lease_expires_ms)
        claims = await asyncio.gather(
            kit.open().claim_failover(node_id, first.node_epoch, kit.node_id(2), 60_000),
            kit.open().claim_failover(node_id, first.node_epoch, kit.node_id(3), 60_000),
        )
        winners = [claim for claim in claims if claim is not None]
        assert len(winners) == 1, (
            f"{len(winners)} of 2 concurrent claims of an expired failover lease won"
        )
        (second,) = winners
        assert second.node_epoch == first.node_epoch + 1
        assert second.state is NodeState.FAILING_OVER and second.wal_config == {"path": "/wal"}
        assert second.lease_expires_ms > first.lease_expires_ms
        with pytest.raises(FencedError):
            await store.renew_failover(node_id, first.node_epoch, 60_000)
        with pytest.raises(FencedError):
            await store.set_node_state(node_id, first.node_epoch, NodeState.FAILED_OVER)
        shortened = await store.renew_failover(node_id, second.node_epoch, 1)
        await store.set_node_state(node_id, second.node_epoch, NodeState.FAILED_OVER)
        await _wait_for_store_time(store, shortened.lease_expires_ms)
        assert await store.claim_failover(node_id, second.node_epoch, kit.node_id(1), 1) is None, (
            "a finished failover was claimed again"
        )

    # 15 -----------------------------------------------------------------------------------------
    async def test_kv_compare_and_set(self, walstream_metadata_kit: MetadataKit) -> None:
        """A write with a stale or wrong expected version changes nothing and says what it
        found; 0 creates only a key that has none; a version is never given twice, even to a
        key deleted and created again; namespaces are apart; values survive a reopen."""
        kit = walstream_metadata_kit
        store = kit.open()
        space, other = kit.name("kv"), kit.name("kv-other")
        assert await store.kv_get(space, "group/a") is None
        first = await store.kv_put(space, "group/a", b"one", 0)
        assert first > 0 and await store.kv_get(space, "group/a") == (b"one", first)

        async def refused(call: Any, actual: int) -> None:
            with pytest.raises(VersionMismatchError) as caught:
                await call
            assert caught.value.actual_version == actual, (
                f"VersionMismatchError.actual_version {caught.value.actual_version}, the key "
                f"holds version {actual}"
            )

        await refused(store.kv_put(space, "group/a", b"again", 0), first)
        await refused(store.kv_put(space, "group/a", b"wrong", first + 1000), first)
        assert await store.kv_get(space, "group/a") == (b"one", first), "a refused put wrote"
        second = await store.kv_put(space, "group/a", b"two", first)
        assert second > first, f"version {second} after {first}"
        await refused(store.kv_put(space, "group/a", b"stale", first), second)
        assert await store.kv_get(space, "group/a") == (b"two", second)
        third = await store.kv_put(space, "group/a", b"three", None)
        assert third > second
        await refused(store.kv_delete(space, "group/a", second), third)
        assert await store.kv_get(space, "group/a") == (b"three", third), "a refused delete"
        await store.kv_delete(space, "group/a", third)
        assert await store.kv_get(space, "group/a") is None
        await refused(store.kv_delete(space, "group/a", third), 0)
        await refused(store.kv_put(space, "group/a", b"back", third), 0)
        await store.kv_delete(space, "group/a", None)  # nothing there: nothing happens
        await store.kv_delete(space, "group/a", 0)  # expects nothing there: a check only
        again = await store.kv_put(space, "group/a", b"back", 0)
        assert again not in (first, second, third), "a version was given twice (ABA)"

        assert await store.kv_get(other, "group/a") is None, "namespaces see each other's keys"
        elsewhere = await store.kv_put(other, "group/a", b"", 0)
        assert await store.kv_get(other, "group/a") == (b"", elsewhere)
        assert await store.kv_get(space, "group/a") == (b"back", again)
        await refused(store.kv_delete(space, "group/a", 0), again)
        assert await store.kv_get(space, "group/a") == (b"back", again)
        large = bytes(range(256)) * 4096  # 1 MiB, every byte value
        big = await store.kv_put(space, "large", large, 0)
        await store.close()
        reopened = kit.open()
        assert await reopened.kv_get(space, "group/a") == (b"back", again)
        assert await reopened.kv_get(space, "large") == (large, big)
        await refused(reopened.kv_put(space, "group/a", b"x", 0), again)

        for bad_call in (
            lambda: reopened.kv_put("", "k", b"v", 0),
            lambda: reopened.kv_put(space, "", b"v", 0),
            lambda: reopened.kv_put(space, "nul\x00key", b"v", 0),
            lambda: reopened.kv_put(space, "k", "text", 0),  # type: ignore[arg-type]
            lambda: reopened.kv_put(space, "k", large + b"!", 0),
            lambda: reopened.kv_put(space, "k", b"v", -1),
            lambda: reopened.kv_put(space, "k", b"v", True),
            lambda: reopened.kv_delete(space, "k", -5),
            lambda: reopened.kv_get(space, "k" * 1025),
            lambda: reopened.kv_get(space, "\ud800"),
        ):
            with pytest.raises(InvalidArgument):
                await bad_call()

    async def test_kv_concurrent_writers(self, walstream_metadata_kit: MetadataKit) -> None:
        """Of concurrent writers expecting one version (from separate store instances) exactly
        one wins; the others learn the winner's version."""
        kit = walstream_metadata_kit
        space = kit.name("kv-race")
        stores = [kit.open() for _ in range(5)]
        results = await asyncio.gather(
            *(s.kv_put(space, "created", f"by {i}".encode(), 0) for i, s in enumerate(stores)),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, int)]
        assert len(winners) == 1, f"{len(winners)} of 5 concurrent creates of one key won"
        assert all(isinstance(r, VersionMismatchError) for r in results if r not in winners)
        (created,) = winners
        results = await asyncio.gather(
            *(
                s.kv_put(space, "created", f"now {i}".encode(), created)
                for i, s in enumerate(stores)
            ),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, int)]
        assert len(winners) == 1, f"{len(winners)} of 5 concurrent puts of one version won"
        (updated,) = winners
        losers = [r for r in results if not isinstance(r, int)]
        assert all(
            isinstance(r, VersionMismatchError) and r.actual_version == updated for r in losers
        ), losers
        found = await stores[0].kv_get(space, "created")
        assert found is not None and found.version == updated
        assert found.value == f"now {results.index(updated)}".encode()

    async def test_kv_list_pages(self, walstream_metadata_kit: MetadataKit) -> None:
        """kv_list pages one namespace by key in byte order; a prefix is a prefix (no
        wildcards); pages joined end to end are the whole listing."""
        kit = walstream_metadata_kit
        store = kit.open()
        space = kit.name("kv-list")
        keys = ["a/2", "a/10", "a/1", "a%", "a_", "a\u00e9", "a~", "b/1", "a/1/x", "\u4e2d"]
        versions = {key: await store.kv_put(space, key, key.encode(), 0) for key in keys}
        await store.kv_put(kit.name("kv-list-other"), "a/3", b"elsewhere", 0)
        in_byte_order = sorted(keys, key=lambda key: key.encode("utf-8"))

        listed = await store.kv_list(space)
        assert [e.key for e in listed] == in_byte_order
        assert all(e.value == e.key.encode() and e.version == versions[e.key] for e in listed)
        assert [e.key for e in await store.kv_list(space, prefix="a/")] == [
            "a/1",
            "a/1/x",
            "a/10",
            "a/2",
        ]
        assert [e.key for e in await store.kv_list(space, prefix="a%")] == ["a%"]
        assert [e.key for e in await store.kv_list(space, prefix="a_")] == ["a_"]
        assert [e.key for e in await store.kv_list(space, prefix="a\u00e9")] == ["a\u00e9"]
        assert await store.kv_list(space, prefix="c") == []

        pages: list[str] = []
        after = ""
        while True:
            page = await store.kv_list(space, prefix="a", start_after=after, limit=3)
            assert len(page) <= 3
            if not page:
                break
            pages.extend(e.key for e in page)
            after = page[-1].key
        assert pages == [key for key in in_byte_order if key.startswith("a")]
        after_tilde = ["a\u00e9", "b/1", "\u4e2d"]  # é (0xc3 0xa9) sorts after ~ (0x7e)
        assert [e.key for e in await store.kv_list(space, start_after="a~")] == after_tilde
        for limit in (0, 1001):
            with pytest.raises(InvalidArgument):
                await store.kv_list(space, limit=limit)

    # 16 -----------------------------------------------------------------------------------------
    async def test_stream_config_kept(self, walstream_metadata_kit: MetadataKit) -> None:
        """The config and creation token given at create are what every read returns, across
        a reopen; a reconfigure changes exactly the fields it names; a bad change changes
        nothing; claims, trims and commits leave the config alone."""
        kit = walstream_metadata_kit
        store = kit.open()
        config = StreamConfig(
            retention_age_s=7 * 86_400,
            timestamping=Timestamping.ARRIVAL,
            uncapped=True,
            delete_on_empty_min_age_s=3600,
            storage_class="standard",
            cipher="aes-256-gcm",
        )
        created = await store.create_stream(
            kit.name("configured"), config, creation_token="digest-1"
        )
        assert created.config == config and created.creation_token == "digest-1"
        plain = await store.create_stream(kit.name("plain"))
        assert plain.config == StreamConfig() and plain.creation_token is None
        assert plain.lifecycle_due_ms is None, "a stream without retention had work due"
        assert created.lifecycle_due_ms is not None, "a stream with retention had nothing due"

        changed = await store.reconfigure_stream(created.stream_id, {"storage_class": "express"})
        assert changed.config == dataclasses.replace(config, storage_class="express"), (
            "a reconfigure of one field changed others"
        )
        for bad in ({"retention_age_s": -1}, {"nonsense": 1}, {"timestamping": "sometimes"}):
            with pytest.raises(InvalidArgument):
                await store.reconfigure_stream(created.stream_id, bad)
        with pytest.raises(StreamNotFound):
            await store.reconfigure_stream(plain.stream_id + 10_000_000, {"uncapped": True})

        # Concurrent reconfigures of different fields, from separate store instances: each lands.
        others = [kit.open() for _ in range(3)]
        await asyncio.gather(
            others[0].reconfigure_stream(plain.stream_id, {"retention_age_s": 60}),
            others[1].reconfigure_stream(plain.stream_id, {"uncapped": True}),
            others[2].reconfigure_stream(plain.stream_id, {"storage_class": "standard"}),
        )
        both = StreamConfig(retention_age_s=60, uncapped=True, storage_class="standard")
        assert (await store.get_stream(plain.stream_id)).config == both, (
            "a concurrent reconfigure of another field was lost"
        )

        writer = await _writer(kit, store, "config-commit")
        await store.reconfigure_stream(writer.stream_id, {"retention_age_s": 3600})
        assert await store.set_lifecycle_due(
            writer.stream_id,
            None,
            if_due_ms=(await store.get_stream(writer.stream_id)).lifecycle_due_ms,
        )
        (object_id,) = await writer.prepare(1)
        commit = writer.commit_of(object_id, 0, 10)
        stamped = dataclasses.replace(
            commit,
            ranges=tuple(
                dataclasses.replace(r, min_timestamp_ms=5_000, max_timestamp_ms=9_000)
                for r in commit.ranges
            ),
        )
        await writer.commit(stamped)
        committed = await store.get_stream(writer.stream_id)
        assert committed.lifecycle_due_ms == 5_000 + 3_600_000, (
            f"a commit under retention set lifecycle_due_ms {committed.lifecycle_due_ms}, not "
            "the expiry of its oldest record"
        )
        assert committed.config == StreamConfig(retention_age_s=3600)
        due = await store.due_streams(5_000 + 3_600_000, limit=1000)
        assert writer.stream_id in {s.stream_id for s in due}
        assert writer.stream_id not in {
            s.stream_id for s in await store.due_streams(5_000 + 3_599_999, limit=1000)
        }
        page = await store.due_streams(5_000 + 3_600_000, limit=1000)
        keys = [(s.lifecycle_due_ms or 0, s.stream_id) for s in page]
        assert keys == sorted(keys), "due_streams is not in (due, id) order"
        after = await store.due_streams(5_000 + 3_600_000, limit=1000, start_after=keys[0])
        assert [(s.lifecycle_due_ms, s.stream_id) for s in after] == keys[1:], (
            "due_streams(start_after=) is not the rest of the listing"
        )
        assert not await store.set_lifecycle_due(writer.stream_id, None, if_due_ms=1), (
            "set_lifecycle_due ignored its condition"
        )

        await store.close()
        reopened = kit.open()
        again = await reopened.get_stream(kit.name("configured"))
        assert again.config == dataclasses.replace(config, storage_class="express")
        assert again.creation_token == "digest-1"
        listed = {s.stream_id: s for s in await reopened.list_streams(kit.name(""))}
        assert listed[plain.stream_id].config == both
        assert (await reopened.get_streams([created.stream_id]))[created.stream_id].config == (
            again.config
        )

    # 17 -----------------------------------------------------------------------------------------
    async def test_streams_in_bulk_list_pages(self, walstream_metadata_kit: MetadataKit) -> None:
        """list_streams: pages of any size joined end to end are the whole listing, in byte
        order of the names; a prefix is a prefix; deleted streams are absent; unnamed streams
        come first, by id, and page by id."""
        kit = walstream_metadata_kit
        store = kit.open()
        base = kit.name("pages")
        tails = ["b", "a", "a.1", "a-2", "A", "b_x", "a0", "z", "a.1.b"]
        created = await store.create_streams([f"{base}.{tail}" for tail in tails])
        assert [s.name for s in created] == [f"{base}.{tail}" for tail in tails]
        assert [s.stream_id for s in created] == sorted(s.stream_id for s in created)
        await store.create_stream(f"{base}x.after")  # shares the prefix without its dot
        await store.delete_stream(created[tails.index("z")].stream_id)
        alive = sorted(f"{base}.{tail}" for tail in tails if tail != "z")
        prefix = f"{base}."
        listed = [s.name for s in await store.list_streams(prefix)]
        assert listed == sorted(alive, key=lambda name: name.encode()), listed
        for size in (1, 2, 3, 100):
            pages: list[str] = []
            after: str | int | None = None
            for _ in range(len(listed) + 2):  # bounded: a store ignoring start_after repeats
                page = await store.list_streams(prefix, after, size)
                assert len(page) <= size
                pages += [s.name or "" for s in page]
                if len(page) < size:
                    break
                after = page[-1].name
            assert pages == listed, (size, pages)
        assert [s.name for s in await store.list_streams(f"{base}.a.1")] == [
            f"{base}.a.1",
            f"{base}.a.1.b",
        ]
        after_a0 = listed.index(f"{base}.a0") + 1
        page = await store.list_streams(prefix, f"{base}.a0", 2)
        assert [s.name for s in page] == listed[after_a0 : after_a0 + 2]
        assert await store.list_streams(f"{base}.zz") == []
        assert [s.name for s in await store.list_streams(base, limit=100)][-1] == f"{base}x.after"

        unnamed = [await store.create_stream(None) for _ in range(3)]
        first = await store.list_streams("", unnamed[0].stream_id - 1, 3)
        assert [s.stream_id for s in first] == [s.stream_id for s in unnamed]
        assert all(s.name is None for s in first)
        assert all(s.stream_id not in {u.stream_id for u in unnamed}
                   for s in await store.list_streams(prefix))  # fmt: skip
        start = await store.list_streams("", None, 1)
        assert start and start[0].name is None  # unnamed streams come first
        for limit in (0, 10_001, True):
            with pytest.raises(InvalidArgument):
                await store.list_streams(prefix, None, limit)
        with pytest.raises(InvalidArgument):
            await store.list_streams(prefix, 1.5)  # type: ignore[arg-type]

    async def test_streams_in_bulk_create(self, walstream_metadata_kit: MetadataKit) -> None:
        """create_streams: all of its names, or none."""
        kit = walstream_metadata_kit
        store = kit.open()
        names = [kit.name(f"bulk-{index}") for index in range(5)]
        created = await store.create_streams(names[:3])
        for info in created:
            assert (await store.get_stream(info.name or "")).stream_id == info.stream_id
        with pytest.raises(StreamExists, match=names[1]):
            await store.create_streams([names[3], names[1], names[4]])
        for name in names[3:]:
            with pytest.raises(StreamNotFound):
                await store.get_stream(name)  # nothing of the refused call was created
        for bad in ([], [names[3], names[3]], [names[3], None], names[3]):
            with pytest.raises(InvalidArgument):
                await store.create_streams(bad)  # type: ignore[arg-type]
        with pytest.raises(StreamNotFound):
            await store.get_stream(names[3])
        again = await kit.open().get_streams([s.stream_id for s in created])
        assert sorted(again) == sorted(s.stream_id for s in created)  # durable
        assert all(info.config == StreamConfig() for info in again.values())
        config = StreamConfig(retention_age_s=3600, storage_class="standard")
        configured = await store.create_streams([kit.name("bulk-c0"), kit.name("bulk-c1")], config)
        for info in configured:
            read = await store.get_stream(info.stream_id)
            assert read.config == config and read.lifecycle_due_ms is not None, read

    async def test_streams_in_bulk_claim(self, walstream_metadata_kit: MetadataKit) -> None:
        """claim_streams claims what claim_stream would, one epoch each, and nothing with a
        stale node epoch."""
        kit = walstream_metadata_kit
        store = kit.open()
        a_id, b_id = kit.node_id(0), kit.node_id(1)
        a = await store.register_node(a_id, {"type": "conformance"})
        b = await store.register_node(b_id, {"type": "conformance"})
        s1, s2, s3, gone = await store.create_streams(
            [kit.name(f"claims-{index}") for index in range(4)]
        )
        await store.claim_stream(s1.stream_id, a_id, a.node_epoch)
        await store.delete_stream(gone.stream_id)
        ids = [s1.stream_id, s2.stream_id, s3.stream_id, gone.stream_id, 10**15]
        claimed = await store.claim_streams(ids, b_id, b.node_epoch)
        assert sorted(claimed) == [s2.stream_id, s3.stream_id]  # s1 is a running node's
        for before in (s2, s3):
            after = (await store.get_streams([before.stream_id]))[before.stream_id]
            assert after == claimed[before.stream_id]
            assert (after.epoch, after.owner_node_id) == (before.epoch + 1, b_id)
        s1_now = (await store.get_streams([s1.stream_id]))[s1.stream_id]
        assert s1_now.owner_node_id == a_id
        restarted = await store.register_node(b_id, {"type": "conformance"})
        with pytest.raises(FencedError):
            await store.claim_streams([s1.stream_id, s2.stream_id], b_id, b.node_epoch)
        unchanged = (await store.get_streams([s2.stream_id]))[s2.stream_id]
        assert unchanged.epoch == s2.epoch + 1  # the stale call claimed nothing
        await store.set_node_state(a_id, a.node_epoch, NodeState.STOPPED)
        taken = await store.claim_streams([s1.stream_id, s2.stream_id], b_id, restarted.node_epoch)
        assert sorted(taken) == [s1.stream_id, s2.stream_id]
        assert taken[s1.stream_id].epoch == s1_now.epoch + 1
        for bad in ([], [s1.stream_id] * 10_001):
            with pytest.raises(InvalidArgument):
                await store.claim_streams(bad, b_id, restarted.node_epoch)

    async def test_streams_in_bulk_adopt(self, walstream_metadata_kit: MetadataKit) -> None:
        """adopt_streams pages through the streams a node owns, claiming each for its new
        epoch, and leaves other nodes' streams alone."""
        kit = walstream_metadata_kit
        store = kit.open()
        node_id, other_id = kit.node_id(0), kit.node_id(1)
        node = await store.register_node(node_id, {"type": "conformance"})
        other = await store.register_node(other_id, {"type": "conformance"})
        streams = await store.create_streams([kit.name(f"adopt-{index}") for index in range(5)])
        mine = await store.claim_streams(
            [s.stream_id for s in streams[:4]], node_id, node.node_epoch
        )
        theirs = await store.claim_stream(streams[4].stream_id, other_id, other.node_epoch)
        restarted = await store.register_node(node_id, {"type": "conformance"})
        with pytest.raises(FencedError):
            await store.adopt_streams(node_id, node.node_epoch)
        adopted: list[int] = []
        after = 0
        while True:
            page = await store.adopt_streams(node_id, restarted.node_epoch, after, 3)
            adopted += [s.stream_id for s in page]
            for info in page:
                assert info.epoch == mine[info.stream_id].epoch + 1
                assert info.owner_node_id == node_id
                assert (await store.get_streams([info.stream_id]))[info.stream_id] == info
            if len(page) < 3:
                break
            after = page[-1].stream_id
        assert adopted == sorted(mine)
        assert (await store.get_streams([theirs.stream_id]))[theirs.stream_id] == theirs

    # durability -----------------------------------------------------------------------------------
    async def test_reopen_keeps_state(self, walstream_metadata_kit: MetadataKit) -> None:
        """A new instance on the same database sees committed streams, objects and nodes."""
        kit = walstream_metadata_kit
        store = kit.open()
        writer = await _writer(kit, store, "reopen")
        (object_id,) = await writer.prepare(1)
        await writer.commit(writer.commit_of(object_id, 0, 42))
        await store.close()
        reopened = kit.open()
        stream = await reopened.get_stream(kit.name("reopen"))
        assert (stream.stream_id, stream.committed_end, stream.epoch) == (
            writer.stream_id,
            42,
            writer.stream_epoch,
        )
        assert [o.object_id for o in await reopened.get_objects(writer.stream_id, 0)] == [object_id]
        node = await reopened.get_node(writer.node_id)
        assert node is not None and node.node_epoch == writer.node_epoch
