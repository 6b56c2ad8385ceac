"""The rules every metadata backend shares (the memory and SQLite stores run the same code).

The rules (``plan_commit``, ``plan_replace``, ``check_claim`` …) are pure functions over the rows a
transaction read: a backend loads the streams, objects and node a call touches, asks the rule what
changes, and writes those changes in the same transaction. So the memory and SQLite stores cannot
drift apart on what a commit means. Nothing here does I/O or keeps state.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from walstream.errors import (
    BasinNotFound,
    FencedError,
    InvalidArgument,
    PreconditionFailed,
    StreamExists,
    StreamNotFound,
    VersionMismatchError,
)
from walstream.metadata.contract import (
    MAX_CLAIM_STREAMS,
    MAX_CREATE_STREAMS,
    MAX_LIST_STREAMS,
    DataLossGap,
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
from walstream.records import check_stream_name, check_text
from walstream.stream_config import StreamConfig

__all__ = [
    "BASIN_NAME_RULE",
    "MAX_BASIN_LIST",
    "MAX_KV_KEY_BYTES",
    "MAX_KV_LIST",
    "MAX_KV_NAMESPACE_BYTES",
    "MAX_KV_VALUE_BYTES",
    "CommitPlan",
    "ObjectRecord",
    "all_ranges_dead",
    "basin_not_found",
    "check_address",
    "check_basin_list_args",
    "check_basin_name",
    "check_claim",
    "check_claim_count",
    "check_config_changes",
    "check_create_streams_args",
    "check_creation_token",
    "check_data_loss_range",
    "check_due_limit",
    "check_kv_delete",
    "check_kv_key",
    "check_kv_list_args",
    "check_kv_put",
    "check_lease_ms",
    "check_list_streams_args",
    "check_object_limit",
    "check_prepare_args",
    "check_release",
    "check_stream_config",
    "check_stream_name",
    "decode_basin_config",
    "encode_basin_config",
    "encode_wal_config",
    "failover_claimable",
    "has_lifecycle",
    "lifecycle_due_on_change",
    "plan_commit",
    "plan_data_loss",
    "plan_failover_claim",
    "plan_failover_renewal",
    "plan_renewal",
    "plan_replace",
    "prefix_end",
    "range_is_dead",
    "require_node_epoch",
    "require_stream_epoch",
    "stream_exists",
    "stream_not_found",
    "version_mismatch",
]


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
    lifecycle_due: dict[int, int] = dataclasses.field(default_factory=dict)
    """Streams with retention whose lifecycle work becomes due earlier: the expiry of the
    oldest record this commit adds (invariant 16)."""


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
    return CommitPlan(
        stream_ends,
        [_final_object(c, streams, now_ms) for c in objects],
        _retention_due(ranges_by_stream, streams),
    )


def _retention_due(
    ranges_by_stream: Mapping[int, Sequence[StreamRange]], streams: Mapping[int, StreamInfo]
) -> dict[int, int]:
    """When committed ranges expire under their stream's retention, for the streams whose due
    time this moves earlier."""
    due: dict[int, int] = {}
    for stream_id, ranges in ranges_by_stream.items():
        stream = streams.get(stream_id)
        if stream is None or stream.state is StreamState.DELETED:
            continue
        retention_ms = stream.config.retention_ms
        if retention_ms is None:
            continue
        expires_ms = min(r.min_timestamp_ms for r in ranges) + retention_ms
        if stream.lifecycle_due_ms is None or expires_ms < stream.lifecycle_due_ms:
            due[stream_id] = expires_ms
    return due


def lifecycle_due_on_change(before: StreamConfig, after: StreamConfig) -> bool:
    """Whether a config change makes the stream's lifecycle work due now: any change, so the
    node that owns the stream reads its new config at its next lifecycle pass (retention and
    delete-on-empty are judged then too)."""
    return before != after


def has_lifecycle(config: StreamConfig) -> bool:
    """Whether a stream of this config has lifecycle work at all."""
    return config.retention_age_s is not None or config.delete_on_empty_min_age_s > 0


def check_due_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise InvalidArgument(f"due_streams: limit is 1 to 1000, got {limit!r}")


def check_stream_config(config: Any) -> StreamConfig:
    if config is None:
        return StreamConfig()
    if not isinstance(config, StreamConfig):
        raise InvalidArgument(f"a stream config is a StreamConfig, got {type(config).__name__}")
    return config


def check_config_changes(changes: Any) -> None:
    """A reconfigure's changes: a mapping of field names (checked with the values inside the
    transaction, by :meth:`StreamConfig.with_changes`); checked up front too, so a bad call
    fails before any I/O."""
    if not isinstance(changes, Mapping):
        raise InvalidArgument(f"reconfigure_stream: changes is a mapping, got {changes!r}")
    StreamConfig().with_changes(changes)


def check_creation_token(token: Any) -> str | None:
    if token is None:
        return None
    if not isinstance(token, str) or not 1 <= len(token) <= 256:
        raise InvalidArgument("creation_token: 1 to 256 characters of text, or None")
    return token


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


def check_object_limit(limit: int) -> None:
    if limit < 1:
        raise InvalidArgument(f"get_objects: limit must be at least 1, got {limit}")


# -- basins -------------------------------------------------------------------------------------

#: The basin-name rule, as the S2 API states it (so names move between S2 and walstream as-is).
BASIN_NAME_RULE = (
    "8 to 48 characters of lowercase letters, digits and hyphens, not beginning or ending "
    "with a hyphen (e.g. my-basin-1)"
)
_BASIN_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{6,46})[a-z0-9]")
#: Most basins one :meth:`~walstream.metadata.MetadataStore.list_basins` call returns.
MAX_BASIN_LIST = 1000


def check_basin_name(name: Any) -> str:
    """``name`` if it follows :data:`BASIN_NAME_RULE`, else :class:`InvalidArgument`."""
    if not isinstance(name, str):
        raise InvalidArgument(f"a basin name must be a string, got {type(name).__name__}")
    if _BASIN_NAME.fullmatch(name) is None:
        shown = name if len(name) <= 60 else name[:60] + "…"
        raise InvalidArgument(f"basin name {shown!r} is not allowed: use {BASIN_NAME_RULE}")
    return name


def basin_not_found(name: str) -> BasinNotFound:
    return BasinNotFound(
        f"no basin named {name!r}; create it first (POST /v1/basins) or list the basins"
    )


def check_basin_list_args(prefix: str, start_after: str, limit: int) -> None:
    if not isinstance(prefix, str) or not isinstance(start_after, str):
        raise InvalidArgument("list_basins: prefix and start_after must be strings")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BASIN_LIST:
        raise InvalidArgument(
            f"list_basins: limit must be between 1 and {MAX_BASIN_LIST}, got {limit!r}"
        )


def encode_basin_config(config: Any) -> str:
    """A basin's config as stored: a JSON object (``None`` is the empty object)."""
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise InvalidArgument(
            f"a basin config must be a JSON object (dict), got {type(config).__name__}"
        )
    try:
        return json.dumps(config, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidArgument(f"a basin config must hold only JSON values: {error}") from None


def decode_basin_config(text: str) -> dict[str, Any]:
    config = json.loads(text)
    assert isinstance(config, dict)
    return config


# -- leases -------------------------------------------------------------------------------------

#: Longest advertised address a store keeps (a base URL; far longer is a configuration mistake).
MAX_ADDRESS_LENGTH = 2048


def check_address(address: Any) -> str | None:
    """``address`` if it is None or an ``http://`` / ``https://`` base URL with a host."""
    if address is None:
        return None
    if not isinstance(address, str) or len(address) > MAX_ADDRESS_LENGTH:
        raise InvalidArgument(
            f"register_node: address must be a base URL string of at most {MAX_ADDRESS_LENGTH} "
            f"characters, got {type(address).__name__}"
        )
    match = re.fullmatch(r"(https?)://([^/\s?#]+)(/[^\s?#]*)?", address)
    if match is None:
        raise InvalidArgument(
            f"register_node: address {address!r} is not a base URL like http://10.0.0.5:7400 "
            "(node.advertise: scheme http or https, a host, an optional port and path)"
        )
    return address


def check_lease_ms(lease_ms: Any, action: str = "renew_lease") -> int:
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms <= 0:
        raise InvalidArgument(f"{action}: lease_ms must be a positive integer, got {lease_ms!r}")
    return lease_ms


def plan_renewal(
    node: NodeInfo | None, node_id: int, node_epoch: int, lease_ms: int, now_ms: int
) -> NodeInfo:
    """The node after renewing its lease at store time ``now_ms`` (or :class:`FencedError`)."""
    check_lease_ms(lease_ms)
    current = require_node_epoch(node, node_id, node_epoch)
    if current.state is not NodeState.RUNNING:
        raise FencedError(
            f"node {node_id} epoch {node_epoch} is {current.state.value}, not running: its lease "
            "was lost and another node may have failed it over; stop acknowledging and restart "
            "this node (it registers with a new epoch)"
        )
    return dataclasses.replace(current, lease_expires_ms=now_ms + lease_ms, updated_ms=now_ms)


def plan_failover_renewal(
    node: NodeInfo | None, node_id: int, node_epoch: int, lease_ms: int, now_ms: int
) -> NodeInfo:
    """The node after its claimer extended the failover lease at store time ``now_ms``, or
    :class:`FencedError` when ``node_epoch`` is no longer the claimed epoch (another node
    re-claimed the failover) or the node is no longer FAILING_OVER."""
    check_lease_ms(lease_ms, "renew_failover")
    current = require_node_epoch(node, node_id, node_epoch)
    if current.state is not NodeState.FAILING_OVER:
        raise FencedError(
            f"failover of node {node_id} epoch {node_epoch}: the node is "
            f"{current.state.value}, not failing_over; stop replaying its WAL"
        )
    return dataclasses.replace(current, lease_expires_ms=now_ms + lease_ms, updated_ms=now_ms)


def failover_claimable(node: NodeInfo, now_ms: int) -> bool:
    """Whether a failover claim of ``node`` may happen at store time ``now_ms``: a RUNNING node
    whose lease expired, or a FAILING_OVER node whose claimer's failover lease expired (the
    claimer stopped halfway). A node holding no lease (0) is never claimed automatically."""
    if node.state not in (NodeState.RUNNING, NodeState.FAILING_OVER):
        return False
    return 0 < node.lease_expires_ms < now_ms


def plan_failover_claim(
    node: NodeInfo | None, node_epoch: int, lease_ms: int, now_ms: int
) -> NodeInfo | None:
    """The node after a successful failover claim at store time ``now_ms``, or None when the
    claim must not happen (epoch moved on, no lease, or the lease or failover lease still
    runs). The claim bumps the epoch (fencing the node and any earlier claimer) and gives the
    claimer a failover lease until ``now_ms + lease_ms``."""
    check_lease_ms(lease_ms, "claim_failover")
    if node is None or node.node_epoch != node_epoch or not failover_claimable(node, now_ms):
        return None
    return dataclasses.replace(
        node,
        node_epoch=node.node_epoch + 1,
        state=NodeState.FAILING_OVER,
        lease_expires_ms=now_ms + lease_ms,
        updated_ms=now_ms,
    )


def check_release(
    stream: StreamInfo, node: NodeInfo | None, node_id: int, node_epoch: int
) -> StreamInfo:
    """The stream after ``node_id`` releases it (no owner; the next writer claims it), or
    :class:`FencedError` when the node's epoch is stale or another node owns the stream."""
    require_node_epoch(node, node_id, node_epoch)
    if stream.owner_node_id not in (None, node_id):
        raise FencedError(
            f"stream {stream.stream_id} is owned by node {stream.owner_node_id}, not node "
            f"{node_id}; only its owner releases it"
        )
    return dataclasses.replace(stream, owner_node_id=None)


# -- key/value ----------------------------------------------------------------------------------

#: Longest namespace and key of :meth:`~walstream.metadata.MetadataStore.kv_put`, in UTF-8 bytes.
MAX_KV_NAMESPACE_BYTES = 256
MAX_KV_KEY_BYTES = 1024
#: Largest value: the store keeps small state, not data (that goes in a stream).
MAX_KV_VALUE_BYTES = 1 << 20
#: Most keys one :meth:`~walstream.metadata.MetadataStore.kv_list` call returns.
MAX_KV_LIST = 1000


def _kv_text(what: str, text: Any, most: int, empty: bool = False) -> str:
    if not isinstance(text, str):
        raise InvalidArgument(f"a key/value {what} must be a string, got {type(text).__name__}")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"a key/value {what} must be valid Unicode: {text!r}") from None
    if "\x00" in text:
        raise InvalidArgument(f"a key/value {what} cannot hold NUL characters: {text!r}")
    if size > most or (size == 0 and not empty):
        shown = text if len(text) <= 60 else text[:60] + "…"
        raise InvalidArgument(
            f"a key/value {what} must be {'0' if empty else '1'} to {most} bytes of UTF-8, "
            f"got {size}: {shown!r}"
        )
    return text


def check_kv_key(namespace: Any, key: Any) -> None:
    """``namespace`` and ``key`` are what the key/value calls accept, else InvalidArgument."""
    _kv_text("namespace", namespace, MAX_KV_NAMESPACE_BYTES)
    _kv_text("key", key, MAX_KV_KEY_BYTES)


def _check_expected(expected_version: Any, action: str) -> None:
    if expected_version is None:
        return
    if (
        isinstance(expected_version, bool)
        or not isinstance(expected_version, int)
        or expected_version < 0
    ):
        raise InvalidArgument(
            f"{action}: expected_version must be None, 0 (the key must not exist) or a version "
            f"kv_get returned, got {expected_version!r}"
        )


def check_kv_put(namespace: Any, key: Any, value: Any, expected_version: Any) -> bytes:
    """The value as stored (bytes) once every argument of ``kv_put`` is checked."""
    check_kv_key(namespace, key)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"kv_put: value must be bytes, got {type(value).__name__}")
    stored = bytes(value)
    if len(stored) > MAX_KV_VALUE_BYTES:
        raise InvalidArgument(
            f"kv_put: value of {len(stored)} bytes is larger than {MAX_KV_VALUE_BYTES}: keep "
            "small state here and data in a stream"
        )
    _check_expected(expected_version, "kv_put")
    return stored


def check_kv_delete(namespace: Any, key: Any, expected_version: Any) -> None:
    check_kv_key(namespace, key)
    _check_expected(expected_version, "kv_delete")


def check_kv_list_args(namespace: Any, prefix: Any, start_after: Any, limit: Any) -> None:
    _kv_text("namespace", namespace, MAX_KV_NAMESPACE_BYTES)
    _kv_text("prefix", prefix, MAX_KV_KEY_BYTES, empty=True)
    _kv_text("start_after key", start_after, MAX_KV_KEY_BYTES, empty=True)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_KV_LIST:
        raise InvalidArgument(f"kv_list: limit must be between 1 and {MAX_KV_LIST}, got {limit!r}")


def version_mismatch(
    action: str, namespace: str, key: str, expected_version: int, actual_version: int
) -> VersionMismatchError:
    expected = "no value" if expected_version == 0 else f"version {expected_version}"
    found = "no value" if actual_version == 0 else f"version {actual_version}"
    return VersionMismatchError(
        f"{action} {namespace!r}/{key!r}: expected {expected}, found {found}; nothing was "
        "changed: read it again (kv_get) and retry on what it holds now",
        actual_version,
    )


def prefix_end(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (so keys with the
    prefix are exactly those in ``[prefix, prefix_end(prefix))`` in code-point order, which is
    UTF-8 byte order); None when no string is (an empty prefix, or one of U+10FFFF only)."""
    chars = list(prefix)
    while chars:
        following = ord(chars.pop()) + 1
        if following <= 0x10FFFF:
            if 0xD800 <= following <= 0xDFFF:  # surrogates are not text: skip to the next
                following = 0xE000
            return "".join(chars) + chr(following)
    return None


def check_list_streams_args(prefix: Any, start_after: Any, limit: Any) -> None:
    """The arguments of :meth:`MetadataStore.list_streams
    <walstream.metadata.contract.MetadataStore.list_streams>`."""
    check_text(prefix, "list_streams: prefix")
    if isinstance(start_after, str):
        check_text(start_after, "list_streams: start_after")
    elif start_after is not None and (
        isinstance(start_after, bool) or not isinstance(start_after, int)
    ):
        raise InvalidArgument(
            "list_streams: start_after is the last page's last name, or its id for a stream "
            f"without name (page_key), or None; got {start_after!r}"
        )
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_STREAMS
    ):
        raise InvalidArgument(
            f"list_streams: limit must be between 1 and {MAX_LIST_STREAMS} (or None), got {limit!r}"
        )


def check_create_streams_args(names: Any) -> list[str]:
    """The names of :meth:`MetadataStore.create_streams
    <walstream.metadata.contract.MetadataStore.create_streams>`, as a list."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise InvalidArgument(f"create_streams: expected a list of names, got {names!r:.80}")
    found = list(names)
    if not 1 <= len(found) <= MAX_CREATE_STREAMS:
        raise InvalidArgument(
            f"create_streams: 1 to {MAX_CREATE_STREAMS} names at a time, got {len(found)}; "
            "create more in several calls"
        )
    seen: set[str] = set()
    for name in found:
        if name is None:
            raise InvalidArgument("create_streams: every stream needs a name (None is not one)")
        check_stream_name(name)
        if name in seen:
            raise InvalidArgument(f"create_streams: {name!r} is named twice")
        seen.add(name)
    return found


def check_claim_count(what: str, count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_CLAIM_STREAMS:
        raise InvalidArgument(f"{what}: 1 to {MAX_CLAIM_STREAMS} streams at a time, got {count!r}")


def stream_exists(name: str, stream_id: int | str) -> StreamExists:
    return StreamExists(
        f"stream {name!r} already exists (id {stream_id}); open it instead, or delete it first"
    )
