"""Reference in-memory :class:`MetadataStore`, and the rules every metadata backend shares.

The rules (``plan_commit``, ``plan_replace``, ``check_claim`` …) are pure functions over the rows a
transaction read: a backend loads the streams, objects and node a call touches, asks the rule what
changes, and writes those changes in the same transaction. So the memory and SQLite stores cannot
drift apart on what a commit means.

State lives in named, process-wide volumes (like :mod:`walstream.wal.memory`): a store reopened on
the same name sees the same catalogue. Nothing survives the process.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream import records as validation
from walstream.clock import Clock, SystemClock
from walstream.config.factory import BackendFactory, BuildContext
from walstream.config.options import Option
from walstream.errors import (
    BackendUnavailable,
    FencedError,
    InvalidArgument,
    PreconditionFailed,
    StreamExists,
    StreamNotFound,
)
from walstream.metadata.contract import (
    DataLossGap,
    MetadataStore,
    NodeInfo,
    NodeState,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamInfo,
    StreamRange,
    StreamState,
)
from walstream.records import DEPLOYMENT_ID_BYTES

__all__ = [
    "MEMORY_METADATA",
    "CommitPlan",
    "MemoryMetadataStore",
    "ObjectRecord",
    "all_ranges_dead",
    "check_claim",
    "check_data_loss_range",
    "check_object_limit",
    "check_prepare_args",
    "check_stream_name",
    "encode_wal_config",
    "plan_commit",
    "plan_data_loss",
    "plan_replace",
    "require_node_epoch",
    "require_stream_epoch",
    "stream_not_found",
]


# -- shared rules ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """One object row as a backend stores it: the public info plus its prepare deadline."""

    info: ObjectInfo
    expires_ms: int = 0
    expired: bool = False
    """Set by :meth:`MetadataStore.expired_prepared`; a later commit of the id fails."""

    @staticmethod
    def prepared(object_id: int, expires_ms: int) -> ObjectRecord:
        info = ObjectInfo(object_id, "", ObjectKind.STREAM, ObjectState.PREPARED, 0, 0)
        return ObjectRecord(info, expires_ms)


@dataclass(frozen=True, slots=True)
class CommitPlan:
    """What a valid commit changes: new ``committed_end`` per stream and the final objects."""

    stream_ends: dict[int, int]
    objects: list[ObjectInfo]


def stream_not_found(name_or_id: str | int, deleted: bool = False) -> StreamNotFound:
    what = f"stream {name_or_id!r}"
    if deleted:
        return StreamNotFound(f"{what} was deleted; create a new stream to write again")
    return StreamNotFound(f"no active {what}: check the name with list_streams() or create it")


def require_node_epoch(node: NodeInfo | None, node_id: int, node_epoch: int) -> NodeInfo:
    """The node must be registered and ``node_epoch`` must be its current epoch."""
    if node is None:
        raise FencedError(f"node {node_id} is not registered; call register_node() first")
    if node.node_epoch != node_epoch:
        raise FencedError(
            f"node {node_id} epoch {node_epoch} is stale (current epoch {node.node_epoch}): "
            "a newer process or a failover replaced it; stop writing and restart this node"
        )
    return node


def require_stream_epoch(stream: StreamInfo, epoch: int, action: str) -> None:
    if stream.epoch != epoch:
        raise FencedError(
            f"cannot {action} stream {stream.stream_id}: epoch {epoch} is stale (current epoch "
            f"{stream.epoch}, owner node {stream.owner_node_id}); reopen the stream to write"
        )


def check_claim(
    stream: StreamInfo, node: NodeInfo | None, owner: NodeInfo | None, node_id: int, node_epoch: int
) -> StreamInfo:
    """The stream after ``node_id`` claims it (or :class:`FencedError`)."""
    require_node_epoch(node, node_id, node_epoch)
    owner_id = stream.owner_node_id
    released = (NodeState.STOPPED, NodeState.FAILED_OVER)
    if owner_id is not None and owner_id != node_id and owner is not None:
        if owner.state not in released:
            raise FencedError(
                f"stream {stream.stream_id} is owned by node {owner_id} (state "
                f"{owner.state.value}); close that node or fail it over before node {node_id} "
                "can claim it"
            )
    return dataclasses.replace(stream, epoch=stream.epoch + 1, owner_node_id=node_id)


def _stream_active(stream_id: int, streams: Mapping[int, StreamInfo]) -> bool:
    stream = streams.get(stream_id)
    return stream is not None and stream.state is StreamState.ACTIVE


def range_is_dead(stream_range: StreamRange, streams: Mapping[int, StreamInfo]) -> bool:
    """A range nobody can read: its stream is gone, or it lies wholly below ``start_offset``."""
    stream = streams.get(stream_range.stream_id)
    if stream is None or stream.state is StreamState.DELETED:
        return True
    return stream_range.end_offset <= stream.start_offset


def all_ranges_dead(ranges: Iterable[StreamRange], streams: Mapping[int, StreamInfo]) -> bool:
    return all(range_is_dead(stream_range, streams) for stream_range in ranges)


def _range_order(stream_range: StreamRange) -> tuple[int, int]:
    return (stream_range.stream_id, stream_range.start_offset)


def _validate_objects(objects: Sequence[ObjectCommit], what: str) -> None:
    seen: set[int] = set()
    for commit in objects:
        if commit.object_id in seen:
            raise InvalidArgument(f"{what}: object id {commit.object_id} appears twice")
        seen.add(commit.object_id)
        for stream_range in commit.ranges:
            start, end = stream_range.start_offset, stream_range.end_offset
            if start < 0 or end <= start:
                raise InvalidArgument(
                    f"{what}: object {commit.object_id} has an empty or reversed range "
                    f"[{stream_range.start_offset}, {stream_range.end_offset}) of stream "
                    f"{stream_range.stream_id}"
                )


def _require_prepared(record: ObjectRecord | None, object_id: int, now_ms: int) -> None:
    if (
        record is None
        or record.info.state is not ObjectState.PREPARED
        or record.expired
        or now_ms >= record.expires_ms
    ):
        raise PreconditionFailed(
            f"unknown/expired object id {object_id}: prepare new object ids and upload again "
            "(ids expire after their TTL and are never reused)"
        )


def _already_committed(
    record: ObjectRecord | None, commit: ObjectCommit, streams: Mapping[int, StreamInfo]
) -> bool:
    """True when ``commit`` was applied before (ranges of streams deleted since were dropped)."""
    if record is None or record.info.state is ObjectState.PREPARED:
        return False
    info = record.info
    if (info.key, info.kind, info.size, info.index_size) != (
        commit.key,
        commit.kind,
        commit.size,
        commit.index_size,
    ):
        return False
    stored = set(info.ranges)
    expected = {r for r in commit.ranges if r in stored or _stream_active(r.stream_id, streams)}
    return expected == stored


def _final_object(
    commit: ObjectCommit, streams: Mapping[int, StreamInfo], now_ms: int
) -> ObjectInfo:
    kept = tuple(
        sorted((r for r in commit.ranges if _stream_active(r.stream_id, streams)), key=_range_order)
    )
    state = ObjectState.MARK_DESTROYED if all_ranges_dead(kept, streams) else ObjectState.COMMITTED
    return ObjectInfo(
        commit.object_id,
        commit.key,
        commit.kind,
        state,
        commit.size,
        commit.index_size,
        kept,
        now_ms,
    )


def plan_commit(
    node: NodeInfo | None,
    node_id: int,
    node_epoch: int,
    objects: Sequence[ObjectCommit],
    streams: Mapping[int, StreamInfo],
    records: Mapping[int, ObjectRecord],
    now_ms: int,
) -> CommitPlan | None:
    """Check a commit against the rows it touches; ``None`` when it was already applied.

    ``streams`` must hold every stream named by a range, ``records`` every object id.
    """
    require_node_epoch(node, node_id, node_epoch)
    _validate_objects(objects, "commit_objects")
    if all(_already_committed(records.get(c.object_id), c, streams) for c in objects):
        return None
    for commit in objects:
        _require_prepared(records.get(commit.object_id), commit.object_id, now_ms)

    ranges_by_stream: dict[int, list[StreamRange]] = {}
    for commit in objects:
        for stream_range in commit.ranges:
            ranges_by_stream.setdefault(stream_range.stream_id, []).append(stream_range)
    stream_ends: dict[int, int] = {}
    for stream_id in sorted(ranges_by_stream):
        stream = streams.get(stream_id)
        if stream is None or stream.state is StreamState.DELETED:
            continue  # dropped: the stream is gone, nobody will read these bytes
        end = stream.committed_end
        for stream_range in sorted(ranges_by_stream[stream_id], key=_range_order):
            if stream.owner_node_id != node_id:
                raise FencedError(
                    f"stream {stream_id} is owned by node {stream.owner_node_id}, not node "
                    f"{node_id}; claim the stream before committing its data"
                )
            require_stream_epoch(stream, stream_range.epoch, "commit data to")
            if stream_range.start_offset != end:
                raise PreconditionFailed(
                    f"stream {stream_id}: a committed range must start at the stream's committed "
                    f"end; expected {end}, got {stream_range.start_offset} (commit objects in "
                    "upload order, without gaps)"
                )
            end = stream_range.end_offset
        stream_ends[stream_id] = end
    return CommitPlan(stream_ends, [_final_object(c, streams, now_ms) for c in objects])


def plan_data_loss(
    node: NodeInfo | None,
    node_id: int,
    node_epoch: int,
    stream: StreamInfo | None,
    gap: DataLossGap,
    recorded: DataLossGap | None,
) -> StreamInfo | None:
    """Check recording ``gap`` (invariant 12); the stream afterwards, or ``None`` when this gap
    was recorded before. ``recorded`` is the stream's gap starting at ``gap.start_offset``.

    The same rules as a commit of ``[start, end)``: current node epoch, the stream owned by the
    node, and continuity at ``committed_end``; so a lost range is accounted for exactly once
    and its offsets are never assigned again.
    """
    require_node_epoch(node, node_id, node_epoch)
    if not isinstance(gap.reason, str) or not gap.reason:
        raise InvalidArgument("record_data_loss: a gap needs a reason saying what was lost and why")
    if gap.start_offset < 0 or gap.end_offset <= gap.start_offset:
        raise InvalidArgument(
            f"record_data_loss: empty or reversed range [{gap.start_offset}, {gap.end_offset}) "
            f"of stream {gap.stream_id}"
        )
    if stream is None or stream.state is StreamState.DELETED:
        raise stream_not_found(gap.stream_id, deleted=stream is not None)
    if recorded is not None and recorded.end_offset == gap.end_offset:
        return None
    if stream.owner_node_id != node_id:
        raise FencedError(
            f"stream {stream.stream_id} is owned by node {stream.owner_node_id}, not node "
            f"{node_id}; only the node whose WAL lost the records can record the loss"
        )
    if gap.start_offset != stream.committed_end:
        raise PreconditionFailed(
            f"stream {stream.stream_id}: a lost range must start at the stream's committed end; "
            f"expected {stream.committed_end}, got {gap.start_offset} (commit what precedes the "
            "loss first)"
        )
    return dataclasses.replace(stream, committed_end=gap.end_offset)


def check_data_loss_range(stream_id: int, start_offset: int, end_offset: int | None) -> None:
    if start_offset < 0 or (end_offset is not None and end_offset < start_offset):
        raise InvalidArgument(
            f"get_data_loss: bad range [{start_offset}, {end_offset}) of stream {stream_id}"
        )


def _union(ranges: Iterable[StreamRange]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted((r.start_offset, r.end_offset) for r in ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covers(union: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(first <= start and end <= last for first, last in union)


def plan_replace(
    source_ids: Sequence[int],
    new_objects: Sequence[ObjectCommit],
    streams: Mapping[int, StreamInfo],
    records: Mapping[int, ObjectRecord],
    now_ms: int,
) -> list[ObjectInfo]:
    """Check a compaction swap; returns the final new objects (the sources become
    MARK_DESTROYED). ``streams`` must hold every stream named by a source or new range."""
    if not source_ids:
        raise InvalidArgument("replace_objects: no source objects given")
    if len(set(source_ids)) != len(source_ids):
        raise InvalidArgument(f"replace_objects: a source id appears twice in {list(source_ids)}")
    _validate_objects(new_objects, "replace_objects")
    sources: list[ObjectInfo] = []
    for source_id in source_ids:
        record = records.get(source_id)
        if record is None or record.info.state is not ObjectState.COMMITTED:
            state = "unknown" if record is None else record.info.state.value
            raise PreconditionFailed(
                f"compaction source object {source_id} is {state}, not committed: it changed "
                "since compaction read it; re-read the objects and compact again"
            )
        sources.append(record.info)
    for commit in new_objects:
        _require_prepared(records.get(commit.object_id), commit.object_id, now_ms)

    source_ranges: dict[int, list[StreamRange]] = {}
    for info in sources:
        for stream_range in info.ranges:
            source_ranges.setdefault(stream_range.stream_id, []).append(stream_range)
    new_ranges: dict[int, list[StreamRange]] = {}
    for commit in new_objects:
        for stream_range in commit.ranges:
            new_ranges.setdefault(stream_range.stream_id, []).append(stream_range)

    for stream_id, ranges in new_ranges.items():
        ordered = sorted(ranges, key=_range_order)
        for before, after in itertools.pairwise(ordered):
            if after.start_offset < before.end_offset:
                raise InvalidArgument(
                    f"replace_objects: new ranges of stream {stream_id} overlap at "
                    f"{after.start_offset}"
                )
        source_union = _union(source_ranges.get(stream_id, ()))
        for stream_range in ordered:
            if not _covers(source_union, stream_range.start_offset, stream_range.end_offset):
                raise PreconditionFailed(
                    f"compaction output range [{stream_range.start_offset}, "
                    f"{stream_range.end_offset}) of stream {stream_id} is not inside its source "
                    "objects; a compaction may only rewrite data it read"
                )
    for stream_id, ranges in source_ranges.items():
        stream = streams.get(stream_id)
        if stream is None or stream.state is StreamState.DELETED:
            continue
        new_union = _union(new_ranges.get(stream_id, ()))
        for stream_range in ranges:
            live_start = max(stream_range.start_offset, stream.start_offset)
            if stream_range.end_offset <= live_start:
                continue
            if not _covers(new_union, live_start, stream_range.end_offset):
                raise PreconditionFailed(
                    f"compaction output loses live data [{live_start}, "
                    f"{stream_range.end_offset}) of stream {stream_id}; the new objects must "
                    "cover every live source range"
                )
    return [_final_object(commit, streams, now_ms) for commit in new_objects]


def encode_wal_config(wal_config: dict[str, Any]) -> str:
    """The WAL config as stored: JSON, so only JSON values are accepted."""
    try:
        return json.dumps(wal_config, sort_keys=True)
    except (TypeError, ValueError) as error:
        raise InvalidArgument(
            f"register_node: wal_config must hold only JSON values (str, number, bool, list, "
            f"dict): {error}"
        ) from None


def check_prepare_args(count: int, ttl_ms: int) -> None:
    if count < 1:
        raise InvalidArgument(f"prepare_objects: count must be at least 1, got {count}")
    if ttl_ms < 0:
        raise InvalidArgument(f"prepare_objects: ttl_ms cannot be negative, got {ttl_ms}")


def check_stream_name(name: str | None) -> None:
    """The stream-name rule every metadata store applies on create (``None``: no name).

    1 to 255 characters of ``A-Z a-z 0-9 . _ -``, beginning with a letter, digit or ``_``, not
    all digits (:func:`walstream.records.check_stream_name` states why).
    """
    validation.check_stream_name(name)


def check_object_limit(limit: int) -> None:
    if limit < 1:
        raise InvalidArgument(f"get_objects: limit must be at least 1, got {limit}")


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

    async def create_stream(self, name: str | None) -> StreamInfo:
        volume = self._state()
        check_stream_name(name)
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
            created_ms=self._clock.now_ms(),
        )
        volume.streams[stream.stream_id] = stream
        return stream

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

    async def list_streams(self, prefix: str = "") -> list[StreamInfo]:
        streams = self._state().streams
        return [
            streams[stream_id]
            for stream_id in sorted(streams)
            if streams[stream_id].state is StreamState.ACTIVE
            and _matches_prefix(streams[stream_id], prefix)
        ]

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

    async def register_node(self, node_id: int, wal_config: dict[str, Any]) -> NodeInfo:
        volume = self._state()
        previous = volume.nodes.get(node_id)
        node = NodeInfo(
            node_id=node_id,
            node_epoch=(previous.node_epoch if previous else 0) + 1,
            state=NodeState.RUNNING,
            wal_config=json.loads(encode_wal_config(wal_config)),
            updated_ms=self._clock.now_ms(),
        )
        volume.nodes[node_id] = node
        return node

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
