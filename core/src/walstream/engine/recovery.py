"""Restart recovery and failover (docs/architecture/recovery.md).

Restart: ``wal.recover()`` → drop batches already committed, of deleted streams or of a stale
stream epoch → rebuild the LogCache → upload and commit through the normal pipeline →
``wal.reset()``. Every step is safe to replay after a crash: commits are continuity-checked, so a
batch committed by an interrupted recovery is dropped by the next one.

Failover: another node opens the dead node's WAL in FAILOVER mode with a bumped node epoch
(fencing the old writer), runs the same replay under the dead node's identity, resets the WAL and
releases the dead node's streams.

**The loss rule** (shared by both). Acknowledged records may be lost when the WAL reports damage
(a record carrying ``damage_before``, or a pure damage report at the end: WAL invariant 11), when
a record is not a valid batch, or when a stream's batch starts above what the stream committed
plus what was recovered before it (a discontinuity). Then, unless accept-loss was requested
(:class:`~walstream.config.RecoveryConfig`), recovery commits only what is provably safe
(everything of a stream before its first gap: continuity keeps that exact) and the node refuses
to start with :class:`RecoveryRefused`, naming the WAL, the damaged positions and the streams and
offsets affected. Nothing is reset or discarded, so the operator can still copy the medium.

With accept-loss, every lost range is recorded in metadata as a
:class:`~walstream.metadata.DataLossGap` (which moves ``committed_end`` past it, so the offsets
are never assigned again) and everything valid is committed:

* **exact gap** — the stream's records continue after the damage: the gap is exactly
  ``[expected, base of the continuation)``.
* **bounded gap** — no record of the stream follows the damage: its lost records, if any, sat
  in the damaged bytes. A batch takes :data:`BATCH_HEADER` (33) bytes plus at least
  :data:`MIN_RECORD_BYTES` (18: timestamp, key length, value length, header count) per record,
  so ``D`` damaged bytes hold at most ``(D - 33) // 18`` records of one stream; the gap is that
  many offsets from the stream's expected tail (summed over the damaged regions after the
  stream's last surviving batch). Every offset acknowledged before the crash is below the end of
  that gap, so a new append never reuses one. Streams considered: those with a batch in the WAL
  and those owned by the node (their uncommitted records could all have been in the damage).

A batch after an unaccepted gap is never committed (the gap would have to be recorded first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from walstream.clock import Clock, Rng
from walstream.config.engine import EngineConfig
from walstream.engine.cache import LogCache
from walstream.engine.events import EngineHooks, Recovered
from walstream.engine.upload import Uploader
from walstream.errors import CorruptionError
from walstream.format.batch import BATCH_HEADER, decode_batch
from walstream.metadata.contract import (
    DataLossGap,
    MetadataStore,
    NodeInfo,
    NodeState,
    StreamInfo,
    StreamState,
)
from walstream.objects.contract import ObjectStore
from walstream.wal.contract import WalMode, WalOffset, WriteAheadLog

__all__ = [
    "ACCEPT_LOSS_COMMAND",
    "MIN_RECORD_BYTES",
    "RecoveryRefused",
    "RecoveryStats",
    "StreamLoss",
    "WalDamageEvent",
    "failover_node",
    "max_records_in",
    "refusal",
    "replay_wal",
]

log = logging.getLogger(__name__)

#: The fewest bytes one record takes in a batch: timestamp i64, key length i32, value length
#: i32 and header count u16 (no key, empty value, no headers).
MIN_RECORD_BYTES = 8 + 4 + 4 + 2

#: What an operator runs to accept a restart's loss (``-c`` names the deployment YAML).
ACCEPT_LOSS_COMMAND = "walstream recover --accept-loss -c <deployment.yaml>"


def max_records_in(damaged_bytes: int) -> int:
    """The most records of one stream that ``damaged_bytes`` of WAL could have held (at least 1,
    so a damaged region never counts as provably empty)."""
    return max(1, (damaged_bytes - BATCH_HEADER.size) // MIN_RECORD_BYTES)


@dataclass(frozen=True, slots=True)
class WalDamageEvent:
    """A damaged WAL region, or a WAL record that is not a valid batch."""

    start: WalOffset
    end: WalOffset
    damaged_bytes: int
    reason: str
    not_a_batch: bool = False

    def describe(self) -> str:
        if self.not_a_batch:
            return (
                f"the WAL record at offset {self.start} ({self.damaged_bytes} bytes) is not a "
                f"valid batch: {self.reason}"
            )
        return (
            f"WAL offsets [{self.start}, {self.end}): {self.damaged_bytes} damaged bytes "
            f"({self.reason})"
        )


@dataclass(frozen=True, slots=True)
class StreamLoss:
    """Offsets of one stream that acknowledged records may have held, found by recovery."""

    stream_id: int
    name: str | None
    start_offset: int
    end_offset: int
    exact: bool
    """True when the stream's records continue at ``end_offset`` after the damage; False when
    no record of it followed and ``end_offset`` is the bound of what the damage could hold."""
    cause: str
    recorded: bool = False
    """Recorded as a data-loss gap (by this recovery or an interrupted earlier one)."""

    def describe(self) -> str:
        label = f"stream {self.stream_id}" + (f" ({self.name!r})" if self.name else "")
        if self.exact:
            return (
                f"{label}: offsets [{self.start_offset}, {self.end_offset}) are lost (its records "
                f"continue at {self.end_offset}); {self.cause}"
            )
        return (
            f"{label}: offsets from {self.start_offset} may be lost (no later record of the "
            f"stream survived; the damaged bytes could hold at most "
            f"{self.end_offset - self.start_offset} of its records, up to offset "
            f"{self.end_offset}); {self.cause}"
        )


@dataclass
class RecoveryStats:
    records: int = 0
    batches: int = 0
    dropped_batches: int = 0
    """Batches already committed, of deleted streams or stale epochs (not loss)."""
    withheld_batches: int = 0
    """Valid batches after an unaccepted gap of their stream: left in the WAL, not committed."""
    tails: dict[int, int] = field(default_factory=dict)
    """Stream id → tail after the recovered batches."""
    damage: list[WalDamageEvent] = field(default_factory=list)
    losses: list[StreamLoss] = field(default_factory=list)
    recorded_gaps: list[DataLossGap] = field(default_factory=list)
    """Gaps this recovery recorded (accept-loss)."""

    @property
    def loss_detected(self) -> bool:
        """The WAL showed damage or a discontinuity: acknowledged records may be lost."""
        return bool(self.damage or self.losses)

    def loss_lines(self) -> list[str]:
        """Human-readable lines: the damage, then the streams affected."""
        lines = [f"  - {event.describe()}" for event in self.damage]
        if self.losses:
            lines.append("streams affected:")
            lines.extend(f"  - {loss.describe()}" for loss in self.losses)
        else:
            lines.append(
                "streams affected: none shows a lost range (every stream of the node continued "
                "after the damage)"
            )
        return lines


class RecoveryRefused(CorruptionError):
    """Recovery found that acknowledged records may be lost and accept-loss was not requested.

    ``stats`` holds the damage and the per-stream losses. Nothing was reset or discarded; records
    before the damage may have been committed. The message names the command that accepts the
    loss.
    """

    def __init__(self, message: str, stats: RecoveryStats) -> None:
        super().__init__(message)
        self.stats = stats


def refusal(
    stats: RecoveryStats, node_id: int, wal: dict[str, Any], how_to_accept: str
) -> RecoveryRefused:
    lines = [
        f"node {node_id} refuses to start: its WAL {wal} shows that acknowledged records may be "
        "lost:",
        *stats.loss_lines(),
        "Nothing was reset or discarded (records before the damage were committed; restore or "
        "copy the WAL medium now if you can). To start anyway, recording these ranges as lost "
        "(reads of them raise DataLossError and their offsets are never reused), run:",
        f"  {how_to_accept}",
    ]
    return RecoveryRefused("\n".join(lines), stats)


def _cause(events: list[WalDamageEvent]) -> str:
    if not events:
        return (
            "stream discontinuity: the WAL reported no damage but holds no record of these offsets"
        )
    return "; ".join(event.describe() for event in events)


async def replay_wal(
    *,
    wal: WriteAheadLog,
    metadata: MetadataStore,
    cache: LogCache,
    uploader: Uploader,
    node_id: int,
    node_epoch: int,
    upload_max_bytes: int,
    accept_loss: bool = False,
) -> RecoveryStats:
    """Feed the WAL's records into ``cache`` as acknowledged batches; ``uploader`` uploads them.

    Applies the loss rule (module docstring): the result's ``loss_detected`` tells the caller to
    refuse unless ``accept_loss``; with ``accept_loss`` every lost range is recorded as a
    data-loss gap under ``node_id``/``node_epoch`` before the stream's later batches commit.
    """
    stats = RecoveryStats()
    infos: dict[int, StreamInfo | None] = {}
    expected: dict[int, int] = {}
    damage_seen: dict[int, int] = {}
    """Stream id → how many damage events preceded its last batch."""
    broken: set[int] = set()

    async def record(loss: StreamLoss) -> StreamLoss:
        # Everything before the gap must be committed first: the gap starts at committed_end.
        await uploader.flush()
        gap = DataLossGap(
            loss.stream_id, loss.start_offset, loss.end_offset, f"node {node_id}: {loss.cause}"
        )
        await metadata.record_data_loss(node_id, node_epoch, gap)
        stats.recorded_gaps.append(gap)
        log.warning("recorded data loss (accepted by the operator): %s", loss.describe())
        return dataclasses.replace(loss, recorded=True)

    async for wal_record in wal.recover():
        damage = wal_record.damage_before
        if damage is not None:
            event = WalDamageEvent(damage.start, damage.end, damage.damaged_bytes, damage.reason)
            stats.damage.append(event)
            log.error("WAL %s: %s", wal.describe(), event.describe())
        if wal_record.is_damage_report:
            continue
        try:
            header, records = decode_batch(wal_record.data)
            if header.size != len(wal_record.data):
                raise CorruptionError("the record holds more than one batch")
        except CorruptionError as exc:
            event = WalDamageEvent(
                wal_record.offset, wal_record.offset, len(wal_record.data), str(exc), True
            )
            stats.damage.append(event)
            log.error("WAL %s: %s", wal.describe(), event.describe())
            continue
        stream_id = header.stream_id
        if stream_id not in infos:
            infos[stream_id] = (await metadata.get_streams([stream_id])).get(stream_id)
        info = infos[stream_id]
        if (
            info is None
            or info.state is StreamState.DELETED
            or header.epoch != info.epoch
            or info.owner_node_id not in (node_id, None)
        ):
            # A deleted stream, or a stale epoch (the stream's data was taken over since).
            stats.dropped_batches += 1
            continue
        since = damage_seen.get(stream_id, 0)
        damage_seen[stream_id] = len(stats.damage)
        next_offset = expected.setdefault(stream_id, info.committed_end)
        if header.base_offset < next_offset:
            # Already committed (or recovered): the stream's records before it are accounted for.
            stats.dropped_batches += 1
            continue
        if header.base_offset > next_offset:
            loss = StreamLoss(
                stream_id,
                info.name,
                next_offset,
                header.base_offset,
                True,
                _cause(stats.damage[since:]),
            )
            if accept_loss:
                loss = await record(loss)
            else:
                broken.add(stream_id)
            stats.losses.append(loss)
        expected[stream_id] = header.end_offset
        if stream_id in broken:
            stats.withheld_batches += 1
            continue
        timestamps = [record.timestamp_ms for record in records]
        block = cache.active  # add() puts the batch in the active block
        index = cache.add(
            stream_id,
            header.epoch,
            header.base_offset,
            header.end_offset,
            wal_record.data,
            min(timestamps),
            max(timestamps),
        )
        block.settle(index, wal_record.offset)
        stats.batches += 1
        stats.records += header.count
        if cache.active.size_bytes >= upload_max_bytes:
            uploader.request_upload()
        if cache.unuploaded_bytes >= cache.max_bytes:
            await uploader.flush()

    if stats.damage:
        await _bounded_losses(stats, metadata, infos, expected, damage_seen, node_id, accept_loss)
        for index, loss in enumerate(stats.losses):
            if accept_loss and not loss.recorded:
                stats.losses[index] = await record(loss)
    stats.tails = expected
    return stats


async def _bounded_losses(
    stats: RecoveryStats,
    metadata: MetadataStore,
    infos: dict[int, StreamInfo | None],
    expected: dict[int, int],
    damage_seen: dict[int, int],
    node_id: int,
    accept_loss: bool,
) -> None:
    """Add a bounded loss for each stream whose records may have sat in damage after its last
    surviving batch: the streams seen in the WAL and those the node owns."""
    candidates: dict[int, StreamInfo] = {
        stream_id: info for stream_id, info in infos.items() if stream_id in expected and info
    }
    for info in await metadata.list_streams():
        if info.owner_node_id == node_id:
            candidates.setdefault(info.stream_id, info)
    for stream_id in sorted(candidates):
        info = candidates[stream_id]
        events = stats.damage[damage_seen.get(stream_id, 0) :]
        if not events:
            continue
        start = expected.get(stream_id, info.committed_end)
        bound = sum(max_records_in(event.damaged_bytes) for event in events)
        loss = StreamLoss(stream_id, info.name, start, start + bound, False, _cause(events))
        if accept_loss and start > 0:
            # An interrupted accept-loss run may have recorded this very gap already: the
            # stream then ends at the gap's end, with the same cause.
            before = await metadata.get_data_loss(stream_id, start - 1, start)
            reason = f"node {node_id}: {loss.cause}"
            if before and before[-1].end_offset == start and before[-1].reason == reason:
                loss = dataclasses.replace(
                    loss,
                    start_offset=before[-1].start_offset,
                    end_offset=start,
                    recorded=True,
                )
        stats.losses.append(loss)


async def failover_node(
    *,
    dead_node_id: int,
    wal: WriteAheadLog,
    objects: ObjectStore,
    metadata: MetadataStore,
    config: EngineConfig,
    hooks: EngineHooks,
    clock: Clock,
    rng: Rng,
    accept_loss: bool | None = None,
    claimed: NodeInfo | None = None,
    finishing: asyncio.Event | None = None,
) -> RecoveryStats:
    """Take over ``dead_node_id``'s WAL: fence it, upload what it acknowledged, release it.

    ``claimed``: the node as a won :meth:`~walstream.metadata.MetadataStore.claim_failover`
    returned it (already fenced and FAILING_OVER); without it the node is fenced here with
    :meth:`~walstream.metadata.MetadataStore.begin_failover`.

    The loss rule applies (module docstring): when the WAL shows that acknowledged records may
    be lost and ``accept_loss`` (default: ``config.recovery.accept_loss``) is false, this raises
    :class:`RecoveryRefused` and leaves the dead node FAILING_OVER with its streams and WAL
    untouched (nobody can claim its streams and reuse the lost offsets). Calling it again with
    ``accept_loss=True`` records the losses under the dead node's identity and completes.

    ``finishing`` is set just before the final writes (the node's FAILED_OVER state, then the
    release of its streams). A caller that stops the failover when it loses its failover lease
    (:class:`~walstream.engine.cluster.ClusterMember`) must not stop it from then on: the store
    checks both writes against the claimed epoch, and once FAILED_OVER is committed no node can
    claim the failover again, so a failover stopped there would leave the streams owned by the
    dead node and never be finished or reported.
    """
    if accept_loss is None:
        accept_loss = config.recovery.accept_loss
    node = claimed if claimed is not None else await metadata.begin_failover(dead_node_id)
    wal.bind_deployment(await metadata.deployment_id())
    await wal.start(dead_node_id, node.node_epoch, WalMode.FAILOVER)
    cache = LogCache(config.cache.log_cache_bytes, clock)
    failures: list[BaseException] = []
    uploader = Uploader(
        cache=cache,
        wal=wal,
        objects=objects,
        metadata=metadata,
        node_id=dead_node_id,
        node_epoch=node.node_epoch,
        config=config.upload,
        hooks=hooks,
        clock=clock,
        rng=rng,
        is_live=lambda stream_id: True,
        on_fatal=failures.append,
        trim_wal=False,
    )
    uploader.start()
    try:
        stats = await replay_wal(
            wal=wal,
            metadata=metadata,
            cache=cache,
            uploader=uploader,
            node_id=dead_node_id,
            node_epoch=node.node_epoch,
            upload_max_bytes=config.upload.max_bytes,
            accept_loss=accept_loss,
        )
        await uploader.flush()
    finally:
        await uploader.close(abort=bool(failures))
    if failures:
        raise failures[0]
    if stats.loss_detected and not accept_loss:
        await wal.close()
        raise refusal(
            stats,
            dead_node_id,
            wal.describe(),
            f"client.failover({dead_node_id}, wal, accept_loss=True) on a running node",
        )
    await wal.reset()
    await wal.close()
    if finishing is not None:
        finishing.set()
    await metadata.set_node_state(dead_node_id, node.node_epoch, NodeState.FAILED_OVER)
    await metadata.release_streams(dead_node_id, node.node_epoch)
    hooks.emit(Recovered(dead_node_id, stats.records, stats.batches, stats.dropped_batches, True))
    return stats
