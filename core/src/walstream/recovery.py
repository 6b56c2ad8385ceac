"""Restart recovery and failover (DESIGN §8).

Restart: ``wal.recover()`` → drop batches already committed, of deleted streams or of a stale
stream epoch, and a stream's batches after its first gap → rebuild the LogCache → upload and
commit through the normal pipeline → ``wal.reset()``. Every step is safe to replay after a crash:
commits are continuity-checked, so a batch committed by an interrupted recovery is dropped by the
next one.

Failover: another node opens the dead node's WAL in FAILOVER mode with a bumped node epoch
(fencing the old writer), runs the same replay under the dead node's identity, resets the WAL and
releases the dead node's streams.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from .cache import LogCache
from .clock import Clock
from .config import EngineConfig
from .errors import CorruptionError
from .hooks import EngineHooks
from .metadata import MetadataStore, NodeState, StreamInfo, StreamState
from .objects import ObjectStore
from .records import decode_batch
from .upload import Uploader
from .wal import WalMode, WriteAheadLog

__all__ = ["RecoveryStats", "failover_node", "replay_wal"]

log = logging.getLogger(__name__)


@dataclass
class RecoveryStats:
    records: int = 0
    batches: int = 0
    dropped_batches: int = 0
    tails: dict[int, int] = field(default_factory=dict)
    """Stream id → tail after the recovered batches."""


async def replay_wal(
    *,
    wal: WriteAheadLog,
    metadata: MetadataStore,
    cache: LogCache,
    uploader: Uploader,
    node_id: int,
    upload_max_bytes: int,
) -> RecoveryStats:
    """Feed the WAL's records into ``cache`` as acknowledged batches; ``uploader`` uploads them."""
    stats = RecoveryStats()
    infos: dict[int, StreamInfo | None] = {}
    expected: dict[int, int] = {}
    async for wal_record in wal.recover():
        try:
            header, records = decode_batch(wal_record.data)
            if header.size != len(wal_record.data):
                raise CorruptionError("WAL record holds more than one batch")
        except CorruptionError as exc:
            log.error("WAL record at offset %d is not a batch, skipped: %s", wal_record.offset, exc)
            stats.dropped_batches += 1
            continue
        stream_id = header.stream_id
        if stream_id not in infos:
            infos[stream_id] = (await metadata.get_streams([stream_id])).get(stream_id)
        info = infos[stream_id]
        if info is None or info.state is StreamState.DELETED:
            stats.dropped_batches += 1
            continue
        next_offset = expected.setdefault(stream_id, info.committed_end)
        if (
            header.base_offset != next_offset
            or header.epoch != info.epoch
            or info.owner_node_id not in (node_id, None)
        ):
            # Already committed, written by a stale epoch, or after a gap left by a write that
            # was never acknowledged: none of these can be an acknowledged, uncommitted batch.
            stats.dropped_batches += 1
            continue
        timestamps = [record.timestamp_ms for record in records]
        batch = cache.add(
            stream_id,
            header.epoch,
            header.base_offset,
            header.end_offset,
            wal_record.data,
            min(timestamps),
            max(timestamps),
        )
        batch.wal_offset = wal_record.offset
        batch.acked = True
        batch.block.settle_one()
        expected[stream_id] = header.end_offset
        stats.batches += 1
        stats.records += header.count
        if cache.active.size_bytes >= upload_max_bytes:
            uploader.request_upload()
        if cache.unuploaded_bytes >= cache.max_bytes:
            await uploader.flush()
    stats.tails = expected
    return stats


async def failover_node(
    *,
    dead_node_id: int,
    wal: WriteAheadLog,
    objects: ObjectStore,
    metadata: MetadataStore,
    config: EngineConfig,
    hooks: EngineHooks,
    clock: Clock,
    rng: random.Random,
) -> RecoveryStats:
    """Take over ``dead_node_id``'s WAL: fence it, upload what it acknowledged, release it."""
    node = await metadata.begin_failover(dead_node_id)
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
            upload_max_bytes=config.upload.max_bytes,
        )
        await uploader.flush()
    finally:
        await uploader.close(abort=bool(failures))
    if failures:
        raise failures[0]
    await wal.reset()
    await wal.close()
    await metadata.set_node_state(dead_node_id, node.node_epoch, NodeState.FAILED_OVER)
    await metadata.release_streams(dead_node_id, node.node_epoch)
    hooks.recovered(dead_node_id, stats.records, stats.batches, stats.dropped_batches, True)
    return stats
