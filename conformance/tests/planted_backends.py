"""Deliberately broken backends. Each breaks one promise; the conformance tests must catch every
one of them (see test_conformance_planted.py). Loaded by file path, also in child processes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

from walstream.errors import PreconditionFailed
from walstream.metadata import NodeInfo, NodeState, ObjectCommit
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.stream_config import StreamConfig
from walstream.wal import PreparedGroup, WalMode, WalOffset, WalRecord, WriteAheadLog
from walstream.wal.memory import MemoryWal
from walstream_conformance.backends import load_target

_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "appendfile_wal.py"
AppendFileWal: Any = load_target(f"{_EXAMPLE}:AppendFileWal")


class MemoryAckFileWal(AppendFileWal):  # type: ignore[misc]
    """Acknowledges while the records are only in process memory; writes them at close.

    Declares ``survives_process_kill`` (inherited) — the crash harness proves it false.
    """

    def __init__(self, path: str, **options: Any) -> None:
        super().__init__(path, **options)
        self._unwritten: list[tuple[int, bytes]] = []

    async def _write_group(self, group: PreparedGroup) -> None:
        position, buffer, _previous, done = group.state
        self._unwritten.append((position, buffer))
        done.set_result(None)

    async def _close(self) -> None:
        for position, buffer in self._unwritten:
            self._durable_write(position, buffer)
        self._unwritten.clear()
        await super()._close()


class UnsyncedFileWal(AppendFileWal):  # type: ignore[misc]
    """Acknowledges once the write reached the OS, without fsync (claims power-loss safety)."""

    def _durable_write(self, position: int, buffer: bytes) -> None:
        self._call("write", self.io.pwrite, self._fd, buffer, position)


class ReorderingWal(WriteAheadLog):
    """Durable in order, but acknowledges in a random order (each ack after a random delay)."""

    def __init__(self, volume: str, seed: int = 0) -> None:
        self._inner = MemoryWal(volume)
        self.capabilities = self._inner.capabilities
        self._rng = random.Random(seed)

    async def start(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        await self._inner.start(node_id, node_epoch, mode)

    def append(self, data: bytes) -> Awaitable[WalOffset]:
        durable = self._inner.append(data)
        delay = self._rng.uniform(0, 0.005)

        async def acknowledge() -> WalOffset:
            offset = await durable
            await asyncio.sleep(delay)
            return offset

        return asyncio.ensure_future(acknowledge())

    def recover(self) -> AsyncIterator[WalRecord]:
        return self._inner.recover()

    async def trim(self, offset: WalOffset) -> None:
        await self._inner.trim(offset)

    async def reset(self) -> None:
        await self._inner.reset()

    async def close(self) -> None:
        await self._inner.close()


class ExclusiveTrimWal(MemoryWal):
    """``trim(offset)`` keeps the record at ``offset``: returns a trimmed record after restart."""

    async def _trim(self, offset: WalOffset) -> None:
        await super()._trim(offset - 1)


class StaleEpochMetadata(MemoryMetadataStore):
    """Accepts commits from a stale node epoch (a zombie node's commits go through)."""

    async def commit_objects(self, node_id: int, node_epoch: int, objects: Any) -> None:
        node = await self.get_node(node_id)
        current = node.node_epoch if node is not None else node_epoch
        await super().commit_objects(node_id, current, list[ObjectCommit](objects))


class RacyFailoverClaim(MemoryMetadataStore):
    """``claim_failover`` reads the node, then writes: two concurrent claimers can both win."""

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        node = await self.get_node(node_id)
        await asyncio.sleep(0)  # e.g. a SELECT then an UPDATE without a condition
        if node is None or node.node_epoch != node_epoch or node.state is not NodeState.RUNNING:
            return None
        if not 0 < node.lease_expires_ms < await self.store_time_ms():
            return None
        claimed = dataclasses.replace(
            node,
            node_epoch=node_epoch + 1,
            state=NodeState.FAILING_OVER,
            lease_expires_ms=await self.store_time_ms() + lease_ms,
        )
        self._state().nodes[node_id] = claimed
        return claimed


class LeaseBlindClaim(MemoryMetadataStore):
    """``claim_failover`` ignores the lease: a live node is taken over."""

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        node = await self.get_node(node_id)
        if node is None or node.node_epoch != node_epoch:
            return None
        return await self.begin_failover(node_id)


class NoFailoverReclaim(MemoryMetadataStore):
    """``claim_failover`` takes only RUNNING nodes: a failover whose claimer stopped halfway
    stays FAILING_OVER for ever."""

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        node = await self.get_node(node_id)
        if node is None or node.state is not NodeState.RUNNING:
            return None
        return await super().claim_failover(node_id, node_epoch, by_node_id, lease_ms)


class FailoverLeaseBlindClaim(MemoryMetadataStore):
    """``claim_failover`` of a FAILING_OVER node ignores the claimer's failover lease: a
    failover that is still running is taken over."""

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        node = await self.get_node(node_id)
        if node is not None and node.state is NodeState.FAILING_OVER:
            node = dataclasses.replace(node, lease_expires_ms=1)
            self._state().nodes[node_id] = node
        return await super().claim_failover(node_id, node_epoch, by_node_id, lease_ms)


class VersionBlindKv(MemoryMetadataStore):
    """``kv_put`` ignores the expected version: every write wins (a lost update)."""

    async def kv_put(
        self, namespace: str, key: str, value: bytes, expected_version: int | None
    ) -> int:
        return await super().kv_put(namespace, key, value, None)


class RacyKv(MemoryMetadataStore):
    """``kv_put`` reads the version, then writes: concurrent writers expecting one version can
    all win (a SELECT, then an UPDATE without the version in its condition)."""

    async def kv_put(
        self, namespace: str, key: str, value: bytes, expected_version: int | None
    ) -> int:
        current = await self.kv_get(namespace, key)
        await asyncio.sleep(0)
        if expected_version is not None and expected_version != (current.version if current else 0):
            return await super().kv_put(namespace, key, value, expected_version)
        return await super().kv_put(namespace, key, value, None)


class ReconfigureResets(MemoryMetadataStore):
    """``reconfigure_stream`` writes the fields it names over the defaults: the others are
    lost (an UPDATE of the whole config from the request alone)."""

    async def reconfigure_stream(self, stream_id: int, changes: dict[str, Any]) -> Any:
        whole = StreamConfig().to_json()
        whole.update(changes)
        return await super().reconfigure_stream(stream_id, whole)


class RacyReconfigure(MemoryMetadataStore):
    """``reconfigure_stream`` reads the config, then writes all of it back with its change:
    of concurrent reconfigures of different fields only the last one's survives."""

    async def reconfigure_stream(self, stream_id: int, changes: dict[str, Any]) -> Any:
        whole = (await self.get_stream(stream_id)).config.to_json()
        await asyncio.sleep(0)
        whole.update(changes)
        return await super().reconfigure_stream(stream_id, whole)


class RacyConditionalStore(MemoryObjectStore):
    """``put_if_absent`` checks, then writes: two concurrent creators can both win."""

    async def put_if_absent(self, key: str, data: bytes) -> None:
        if key in self._objects:
            raise PreconditionFailed(f"object {key!r} already exists")
        await asyncio.sleep(0)  # e.g. a HEAD then a PUT over the network
        self._objects[key] = bytes(data)


def make_memory_ack_wal(path: str) -> WriteAheadLog:
    return MemoryAckFileWal(os.fspath(path))


def make_unsynced_wal(path: str) -> WriteAheadLog:
    return UnsyncedFileWal(os.fspath(path))


class IdentityBlindWal(MemoryWal):
    """Declares ``checks_identity`` but opens a volume for any deployment."""

    def _check_identity(self, volume: Any) -> None:
        return None
