"""Reference in-memory :class:`MetadataStore`.

It runs the rules of :mod:`walstream.metadata.rules` that every backend shares. State lives in
named, process-wide volumes (like :mod:`walstream.wal.memory`): a store reopened on the same name
sees the same catalogue. Nothing survives the process.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.clock import Clock, SystemClock
from walstream.config.factory import BackendFactory, BuildContext
from walstream.config.options import Option
from walstream.errors import (
    BackendUnavailable,
    BasinExists,
    FencedError,
    InvalidArgument,
    StreamExists,
)
from walstream.metadata.contract import (
    BasinInfo,
    DataLossGap,
    KvEntry,
    KvValue,
    MetadataStore,
    NodeInfo,
    NodeState,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamInfo,
    StreamState,
)
from walstream.metadata.rules import (
    ObjectRecord,
    all_ranges_dead,
    basin_not_found,
    check_address,
    check_basin_list_args,
    check_basin_name,
    check_claim,
    check_claim_count,
    check_config_changes,
    check_create_streams_args,
    check_creation_token,
    check_data_loss_range,
    check_due_limit,
    check_kv_delete,
    check_kv_key,
    check_kv_list_args,
    check_kv_put,
    check_list_streams_args,
    check_object_limit,
    check_prepare_args,
    check_release,
    check_stream_config,
    check_stream_name,
    decode_basin_config,
    encode_basin_config,
    encode_wal_config,
    has_lifecycle,
    lifecycle_due_on_change,
    plan_commit,
    plan_data_loss,
    plan_failover_claim,
    plan_failover_renewal,
    plan_renewal,
    plan_replace,
    require_node_epoch,
    require_stream_epoch,
    stream_exists,
    stream_not_found,
    version_mismatch,
)
from walstream.records import DEPLOYMENT_ID_BYTES
from walstream.stream_config import StreamConfig

__all__ = ["MEMORY_METADATA", "MemoryMetadataStore"]


def _matches_prefix(stream: StreamInfo, prefix: str) -> bool:
    if stream.name is None:
        return prefix == ""
    return stream.name.startswith(prefix)


# -- the in-memory store ------------------------------------------------------------------------


@dataclass
class _MetadataVolume:
    last_stream_id: int = 0
    last_object_id: int = 0
    streams: dict[int, StreamInfo] = field(default_factory=dict)
    objects: dict[int, ObjectRecord] = field(default_factory=dict)
    nodes: dict[int, NodeInfo] = field(default_factory=dict)
    data_loss: dict[int, dict[int, DataLossGap]] = field(default_factory=dict)
    """Stream id → recorded gaps by start offset."""
    deployment_id: bytes = field(default_factory=lambda: os.urandom(DEPLOYMENT_ID_BYTES))
    basins: dict[str, BasinInfo] = field(default_factory=dict)
    kv: dict[str, dict[str, KvValue]] = field(default_factory=dict)
    """Namespace → key → value and version."""
    last_kv_version: int = 0


_METADATA_VOLUMES: dict[str, _MetadataVolume] = {}


class MemoryMetadataStore(MetadataStore):
    """A catalogue in process memory. Every method runs without awaiting, so each call is one
    atomic step on the event loop: checks first, changes after."""

    def __init__(self, name: str | None = None, clock: Clock | None = None) -> None:
        self._volume = (
            _METADATA_VOLUMES.setdefault(name, _MetadataVolume()) if name else _MetadataVolume()
        )
        self._name = name
        self._clock: Clock = clock or SystemClock()
        self._closed = False

    def _state(self) -> _MetadataVolume:
        if self._closed:
            raise BackendUnavailable("memory metadata store is closed; open a new one")
        return self._volume

    def _active(self, stream_id: int) -> StreamInfo:
        stream = self._state().streams.get(stream_id)
        if stream is None or stream.state is not StreamState.ACTIVE:
            raise stream_not_found(stream_id, deleted=stream is not None)
        return stream

    def _destroy_dead(self, object_ids: Iterable[int]) -> None:
        volume = self._volume
        for object_id in object_ids:
            record = volume.objects[object_id]
            if record.info.state is ObjectState.COMMITTED and all_ranges_dead(
                record.info.ranges, volume.streams
            ):
                info = dataclasses.replace(record.info, state=ObjectState.MARK_DESTROYED)
                volume.objects[object_id] = dataclasses.replace(record, info=info)

    def _objects_of(self, stream_id: int) -> list[int]:
        return [
            object_id
            for object_id, record in self._volume.objects.items()
            if any(r.stream_id == stream_id for r in record.info.ranges)
        ]

    # -- identity ---------------------------------------------------------------------------------

    async def deployment_id(self) -> bytes:
        return self._state().deployment_id

    # -- streams ----------------------------------------------------------------------------------

    async def create_stream(
        self,
        name: str | None,
        config: StreamConfig | None = None,
        *,
        creation_token: str | None = None,
    ) -> StreamInfo:
        volume = self._state()
        check_stream_name(name)
        config = check_stream_config(config)
        token = check_creation_token(creation_token)
        created_ms = self._clock.now_ms()
        if name is not None:
            for stream in volume.streams.values():
                if stream.name == name and stream.state is StreamState.ACTIVE:
                    raise StreamExists(
                        f"stream {name!r} already exists (id {stream.stream_id}); open it "
                        "instead, or delete it first"
                    )
        volume.last_stream_id += 1
        stream = StreamInfo(
            stream_id=volume.last_stream_id,
            name=name,
            epoch=0,
            start_offset=0,
            committed_end=0,
            state=StreamState.ACTIVE,
            owner_node_id=None,
            created_ms=created_ms,
            config=config,
            creation_token=token,
            lifecycle_due_ms=created_ms if has_lifecycle(config) else None,
        )
        volume.streams[stream.stream_id] = stream
        return stream

    async def reconfigure_stream(self, stream_id: int, changes: dict[str, Any]) -> StreamInfo:
        check_config_changes(changes)
        stream = self._active(stream_id)
        config = stream.config.with_changes(changes)
        due_ms = stream.lifecycle_due_ms
        if lifecycle_due_on_change(stream.config, config):
            due_ms = self._clock.now_ms()
        changed = dataclasses.replace(stream, config=config, lifecycle_due_ms=due_ms)
        self._state().streams[stream_id] = changed
        return changed

    async def due_streams(
        self, now_ms: int, limit: int = 100, start_after: tuple[int, int] | None = None
    ) -> list[StreamInfo]:
        check_due_limit(limit)
        after = start_after if start_after is not None else (-(1 << 62), -1)
        due = [
            stream
            for stream in self._state().streams.values()
            if stream.state is StreamState.ACTIVE
            and stream.lifecycle_due_ms is not None
            and stream.lifecycle_due_ms <= now_ms
            and (stream.lifecycle_due_ms, stream.stream_id) > after
        ]
        due.sort(key=lambda stream: (stream.lifecycle_due_ms or 0, stream.stream_id))
        return due[:limit]

    async def set_lifecycle_due(
        self, stream_id: int, due_ms: int | None, *, if_due_ms: int | None = None
    ) -> bool:
        streams = self._state().streams
        stream = streams.get(stream_id)
        if (
            stream is None
            or stream.state is not StreamState.ACTIVE
            or stream.lifecycle_due_ms != if_due_ms
        ):
            return False
        streams[stream_id] = dataclasses.replace(stream, lifecycle_due_ms=due_ms)
        return True

    async def get_stream(self, name_or_id: str | int) -> StreamInfo:
        volume = self._state()
        if isinstance(name_or_id, int):
            return self._active(name_or_id)
        for stream in volume.streams.values():
            if stream.name == name_or_id and stream.state is StreamState.ACTIVE:
                return stream
        raise stream_not_found(name_or_id)

    async def get_streams(self, stream_ids: Sequence[int]) -> dict[int, StreamInfo]:
        streams = self._state().streams
        return {stream_id: streams[stream_id] for stream_id in stream_ids if stream_id in streams}

    async def list_streams(
        self, prefix: str = "", start_after: str | int | None = None, limit: int | None = None
    ) -> list[StreamInfo]:
        check_list_streams_args(prefix, start_after, limit)
        active = [s for s in self._state().streams.values() if s.state is StreamState.ACTIVE]
        found: list[StreamInfo] = []
        if prefix == "" and not isinstance(start_after, str):
            after_id = 0 if start_after is None else start_after
            found = sorted(
                (s for s in active if s.name is None and s.stream_id > after_id),
                key=lambda s: s.stream_id,
            )
        after_name = start_after if isinstance(start_after, str) else ""
        # Code-point order is the byte order of UTF-8.
        found += sorted(
            (
                s
                for s in active
                if s.name is not None and s.name > after_name and s.name.startswith(prefix)
            ),
            key=lambda s: s.name or "",
        )
        return found if limit is None else found[:limit]

    async def create_streams(
        self, names: Sequence[str], config: StreamConfig | None = None
    ) -> list[StreamInfo]:
        wanted = check_create_streams_args(names)
        volume = self._state()
        taken = {
            s.name: s.stream_id
            for s in volume.streams.values()
            if s.name is not None and s.state is StreamState.ACTIVE
        }
        for name in wanted:
            if name in taken:
                raise stream_exists(name, taken[name])
        return [await self.create_stream(name, config) for name in wanted]

    async def claim_streams(
        self, stream_ids: Sequence[int], node_id: int, node_epoch: int
    ) -> dict[int, StreamInfo]:
        ids = list(stream_ids)
        check_claim_count("claim_streams", len(ids))
        volume = self._state()
        require_node_epoch(volume.nodes.get(node_id), node_id, node_epoch)
        claimed: dict[int, StreamInfo] = {}
        for stream_id in sorted(set(ids)):
            stream = volume.streams.get(stream_id)
            if stream is None or stream.state is not StreamState.ACTIVE:
                continue
            owner = (
                volume.nodes.get(stream.owner_node_id) if stream.owner_node_id is not None else None
            )
            try:
                info = check_claim(stream, volume.nodes.get(node_id), owner, node_id, node_epoch)
            except FencedError:
                continue  # owned by a node still running: claim_stream says so
            volume.streams[stream_id] = claimed[stream_id] = info
        return claimed

    async def adopt_streams(
        self, node_id: int, node_epoch: int, start_after: int = 0, limit: int = 10_000
    ) -> list[StreamInfo]:
        check_claim_count("adopt_streams", limit)
        volume = self._state()
        node = volume.nodes.get(node_id)
        require_node_epoch(node, node_id, node_epoch)
        owned = sorted(
            stream_id
            for stream_id, s in volume.streams.items()
            if s.owner_node_id == node_id
            and s.state is StreamState.ACTIVE
            and stream_id > start_after
        )[:limit]
        adopted: list[StreamInfo] = []
        for stream_id in owned:
            info = check_claim(volume.streams[stream_id], node, node, node_id, node_epoch)
            volume.streams[stream_id] = info
            adopted.append(info)
        return adopted

    async def delete_stream(self, stream_id: int) -> None:
        volume = self._state()
        stream = volume.streams.get(stream_id)
        if stream is None:
            raise stream_not_found(stream_id)
        if stream.state is StreamState.DELETED:
            return
        volume.streams[stream_id] = dataclasses.replace(stream, state=StreamState.DELETED)
        self._destroy_dead(self._objects_of(stream_id))

    async def claim_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        volume = self._state()
        stream = self._active(stream_id)
        owner = volume.nodes.get(stream.owner_node_id) if stream.owner_node_id is not None else None
        claimed = check_claim(stream, volume.nodes.get(node_id), owner, node_id, node_epoch)
        volume.streams[stream_id] = claimed
        return claimed

    async def release_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        volume = self._state()
        released = check_release(
            self._active(stream_id), volume.nodes.get(node_id), node_id, node_epoch
        )
        volume.streams[stream_id] = released
        return released

    async def release_streams(self, node_id: int, node_epoch: int) -> None:
        volume = self._state()
        require_node_epoch(volume.nodes.get(node_id), node_id, node_epoch)
        for stream_id, stream in list(volume.streams.items()):
            if stream.owner_node_id == node_id:
                volume.streams[stream_id] = dataclasses.replace(stream, owner_node_id=None)

    async def trim_stream(self, stream_id: int, epoch: int, new_start: int) -> StreamInfo:
        volume = self._state()
        stream = self._active(stream_id)
        require_stream_epoch(stream, epoch, "trim")
        if new_start < 0:
            raise InvalidArgument(f"trim_stream: new start {new_start} is negative")
        trimmed = dataclasses.replace(stream, start_offset=max(stream.start_offset, new_start))
        volume.streams[stream_id] = trimmed
        self._destroy_dead(self._objects_of(stream_id))
        return trimmed

    async def set_fencing_token(self, stream_id: int, epoch: int, token: str | None) -> None:
        volume = self._state()
        stream = self._active(stream_id)
        require_stream_epoch(stream, epoch, "set the fencing token of")
        volume.streams[stream_id] = dataclasses.replace(stream, fencing_token=token)

    # -- objects ----------------------------------------------------------------------------------

    async def prepare_objects(self, count: int, ttl_ms: int) -> list[int]:
        volume = self._state()
        check_prepare_args(count, ttl_ms)
        expires_ms = self._clock.now_ms() + ttl_ms
        object_ids = list(range(volume.last_object_id + 1, volume.last_object_id + count + 1))
        volume.last_object_id += count
        for object_id in object_ids:
            volume.objects[object_id] = ObjectRecord.prepared(object_id, expires_ms)
        return object_ids

    async def commit_objects(
        self, node_id: int, node_epoch: int, objects: Sequence[ObjectCommit]
    ) -> None:
        volume = self._state()
        plan = plan_commit(
            volume.nodes.get(node_id),
            node_id,
            node_epoch,
            objects,
            volume.streams,
            volume.objects,
            self._clock.now_ms(),
        )
        if plan is None:
            return
        for stream_id, end in plan.stream_ends.items():
            volume.streams[stream_id] = dataclasses.replace(
                volume.streams[stream_id], committed_end=end
            )
        for stream_id, due_ms in plan.lifecycle_due.items():
            volume.streams[stream_id] = dataclasses.replace(
                volume.streams[stream_id], lifecycle_due_ms=due_ms
            )
        for info in plan.objects:
            volume.objects[info.object_id] = ObjectRecord(info)

    async def replace_objects(
        self, source_ids: Sequence[int], new_objects: Sequence[ObjectCommit]
    ) -> None:
        volume = self._state()
        final = plan_replace(
            source_ids, new_objects, volume.streams, volume.objects, self._clock.now_ms()
        )
        for source_id in source_ids:
            record = volume.objects[source_id]
            info = dataclasses.replace(record.info, state=ObjectState.MARK_DESTROYED)
            volume.objects[source_id] = dataclasses.replace(record, info=info)
        for info in final:
            volume.objects[info.object_id] = ObjectRecord(info)

    async def get_objects(
        self, stream_id: int, start_offset: int, end_offset: int | None = None, limit: int = 100
    ) -> list[ObjectInfo]:
        volume = self._state()
        check_object_limit(limit)
        found: list[ObjectInfo] = []
        for record in volume.objects.values():
            if record.info.state is not ObjectState.COMMITTED:
                continue
            for stream_range in record.info.ranges:
                if (
                    stream_range.stream_id == stream_id
                    and stream_range.end_offset > start_offset
                    and (end_offset is None or stream_range.start_offset < end_offset)
                ):
                    found.append(dataclasses.replace(record.info, ranges=(stream_range,)))
        found.sort(key=lambda info: info.ranges[0].start_offset)
        return found[:limit]

    async def list_objects(
        self, state: ObjectState | None = None, kind: ObjectKind | None = None
    ) -> list[ObjectInfo]:
        objects = self._state().objects
        return [
            objects[object_id].info
            for object_id in sorted(objects)
            if (state is None or objects[object_id].info.state is state)
            and (kind is None or objects[object_id].info.kind is kind)
        ]

    async def expired_prepared(self, now_ms: int) -> list[int]:
        objects = self._state().objects
        expired: list[int] = []
        for object_id in sorted(objects):
            record = objects[object_id]
            if record.info.state is ObjectState.PREPARED and record.expires_ms <= now_ms:
                objects[object_id] = dataclasses.replace(record, expired=True)
                expired.append(object_id)
        return expired

    async def forget_objects(self, object_ids: Sequence[int]) -> None:
        """Ids in other states (or unknown) are left alone."""
        objects = self._state().objects
        for object_id in object_ids:
            record = objects.get(object_id)
            if record is not None and (
                record.info.state is ObjectState.MARK_DESTROYED or record.expired
            ):
                del objects[object_id]

    # -- nodes ------------------------------------------------------------------------------------

    async def register_node(
        self, node_id: int, wal_config: dict[str, Any], address: str | None = None
    ) -> NodeInfo:
        config = json.loads(encode_wal_config(wal_config))
        address = check_address(address)
        volume = self._state()
        previous = volume.nodes.get(node_id)
        node = NodeInfo(
            node_id=node_id,
            node_epoch=(previous.node_epoch if previous else 0) + 1,
            state=NodeState.RUNNING,
            wal_config=config,
            updated_ms=self._clock.now_ms(),
            address=address,
        )
        volume.nodes[node_id] = node
        return node

    async def renew_lease(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        volume = self._state()
        renewed = plan_renewal(
            volume.nodes.get(node_id), node_id, node_epoch, lease_ms, self._clock.now_ms()
        )
        volume.nodes[node_id] = renewed
        return renewed

    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        volume = self._state()
        claimed = plan_failover_claim(
            volume.nodes.get(node_id), node_epoch, lease_ms, self._clock.now_ms()
        )
        if claimed is not None:
            volume.nodes[node_id] = claimed
        return claimed

    async def renew_failover(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        volume = self._state()
        renewed = plan_failover_renewal(
            volume.nodes.get(node_id), node_id, node_epoch, lease_ms, self._clock.now_ms()
        )
        volume.nodes[node_id] = renewed
        return renewed

    async def store_time_ms(self) -> int:
        return self._clock.now_ms()

    async def get_node(self, node_id: int) -> NodeInfo | None:
        return self._state().nodes.get(node_id)

    async def list_nodes(self) -> list[NodeInfo]:
        nodes = self._state().nodes
        return [nodes[node_id] for node_id in sorted(nodes)]

    async def set_node_state(self, node_id: int, node_epoch: int, state: NodeState) -> None:
        volume = self._state()
        node = require_node_epoch(volume.nodes.get(node_id), node_id, node_epoch)
        volume.nodes[node_id] = dataclasses.replace(
            node, state=state, updated_ms=self._clock.now_ms()
        )

    async def begin_failover(self, node_id: int) -> NodeInfo:
        volume = self._state()
        node = volume.nodes.get(node_id)
        if node is None:
            raise InvalidArgument(f"begin_failover: node {node_id} was never registered")
        failing = dataclasses.replace(
            node,
            node_epoch=node.node_epoch + 1,
            state=NodeState.FAILING_OVER,
            updated_ms=self._clock.now_ms(),
            lease_expires_ms=0,
        )
        volume.nodes[node_id] = failing
        return failing

    # -- data loss --------------------------------------------------------------------------------

    async def record_data_loss(self, node_id: int, node_epoch: int, gap: DataLossGap) -> StreamInfo:
        volume = self._state()
        gaps = volume.data_loss.get(gap.stream_id, {})
        stream = volume.streams.get(gap.stream_id)
        changed = plan_data_loss(
            volume.nodes.get(node_id), node_id, node_epoch, stream, gap, gaps.get(gap.start_offset)
        )
        if changed is None:
            assert stream is not None
            return stream
        volume.streams[gap.stream_id] = changed
        stored = dataclasses.replace(gap, recorded_ms=self._clock.now_ms())
        volume.data_loss.setdefault(gap.stream_id, {})[gap.start_offset] = stored
        return changed

    async def get_data_loss(
        self, stream_id: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[DataLossGap]:
        volume = self._state()
        check_data_loss_range(stream_id, start_offset, end_offset)
        gaps = volume.data_loss.get(stream_id, {})
        return [
            gaps[start]
            for start in sorted(gaps)
            if gaps[start].end_offset > start_offset and (end_offset is None or start < end_offset)
        ]

    # -- basins -----------------------------------------------------------------------------------

    async def create_basin(self, name: str, config: dict[str, Any] | None = None) -> BasinInfo:
        volume = self._state()
        check_basin_name(name)
        stored = decode_basin_config(encode_basin_config(config))  # a copy the caller cannot change
        if name in volume.basins:
            raise BasinExists(f"basin {name!r} already exists; use it, or delete it first")
        basin = BasinInfo(name=name, config=stored, created_ms=self._clock.now_ms())
        volume.basins[name] = basin
        return basin

    async def get_basin(self, name: str) -> BasinInfo:
        basin = self._state().basins.get(name)
        if basin is None:
            raise basin_not_found(name)
        return basin

    async def list_basins(
        self, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[BasinInfo]:
        check_basin_list_args(prefix, start_after, limit)
        basins = self._state().basins
        names = sorted(n for n in basins if n.startswith(prefix) and n > start_after)
        return [basins[n] for n in names[:limit]]

    async def update_basin_config(self, name: str, config: dict[str, Any]) -> BasinInfo:
        basins = self._state().basins
        stored = decode_basin_config(encode_basin_config(config))
        basin = basins.get(name)
        if basin is None:
            raise basin_not_found(name)
        basins[name] = updated = BasinInfo(name=name, config=stored, created_ms=basin.created_ms)
        return updated

    async def delete_basin(self, name: str) -> None:
        if self._state().basins.pop(name, None) is None:
            raise basin_not_found(name)

    # -- key/value --------------------------------------------------------------------------------

    def _kv_version(self) -> int:
        self._volume.last_kv_version += 1
        return self._volume.last_kv_version

    async def kv_get(self, namespace: str, key: str) -> KvValue | None:
        check_kv_key(namespace, key)
        return self._state().kv.get(namespace, {}).get(key)

    async def kv_put(
        self, namespace: str, key: str, value: bytes, expected_version: int | None
    ) -> int:
        stored = check_kv_put(namespace, key, value, expected_version)
        keys = self._state().kv.setdefault(namespace, {})
        current = keys.get(key)
        actual = 0 if current is None else current.version
        if expected_version is not None and expected_version != actual:
            raise version_mismatch("kv_put", namespace, key, expected_version, actual)
        version = self._kv_version()
        keys[key] = KvValue(stored, version)
        return version

    async def kv_delete(self, namespace: str, key: str, expected_version: int | None) -> None:
        check_kv_delete(namespace, key, expected_version)
        keys = self._state().kv.get(namespace, {})
        current = keys.get(key)
        actual = 0 if current is None else current.version
        if expected_version is not None and expected_version != actual:
            raise version_mismatch("kv_delete", namespace, key, expected_version, actual)
        keys.pop(key, None)

    async def kv_list(
        self, namespace: str, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[KvEntry]:
        check_kv_list_args(namespace, prefix, start_after, limit)
        keys = self._state().kv.get(namespace, {})
        # str order is code-point order, which is UTF-8 byte order (as the SQL stores sort).
        found = sorted(k for k in keys if k > start_after and k.startswith(prefix))
        return [KvEntry(k, keys[k].value, keys[k].version) for k in found[:limit]]

    async def close(self) -> None:
        self._closed = True

    def describe(self) -> dict[str, Any]:
        volume = self._volume
        return {
            "type": "memory",
            "name": self._name,
            "streams": len(volume.streams),
            "objects": len(volume.objects),
        }


def _make_memory_metadata(options: dict[str, Any], context: BuildContext) -> MemoryMetadataStore:
    return MemoryMetadataStore(name=options["name"])


MEMORY_METADATA: BackendFactory[MemoryMetadataStore] = BackendFactory(
    kind="metadata",
    name="memory",
    description="metadata in process memory (tests, demos; nothing survives the process)",
    options=(
        Option("name", "str", "volume name: stores opened with the same name share the catalogue"),
    ),
    create=_make_memory_metadata,
)
