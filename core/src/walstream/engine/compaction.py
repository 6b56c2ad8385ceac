"""Compaction and garbage collection of objects.

Compaction rewrites small objects so that a stream's history lives in few, large *stream
objects*: every committed stream-set object, and stream objects smaller than
``small_object_bytes``, are candidates. Per stream, the candidates' ranges are grouped into runs
of contiguous offsets; each run that involves a stream-set object or at least two stream objects
is rewritten as stream object(s) of at most ``max_object_bytes``. The swap is one metadata
transaction (``replace_objects``) that fails if a source changed meanwhile; trimmed ranges and
ranges of deleted streams are dropped.

Garbage collection deletes the keys of MARK_DESTROYED objects and of prepared ids whose TTL
expired (uploads that never committed), then forgets them in metadata. A reader that raced a
deletion gets ``NotFound`` and looks the range up again.

Schedule: when a pass is due is derived from durable state, so restarts do not reset it. A pass
is due once the oldest candidate has been committed for ``interval_s`` (its ``committed_ms``), or
at once when garbage waits; within one process passes are at least ``interval_s`` apart. A node
restarted more often than ``interval_s`` therefore still compacts: right after it starts.

Outputs are written with :func:`walstream.engine.upload.publish_object` (conditional create, never an
overwrite), carry the deployment and object id, and source objects are read with their identity
checked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from walstream.clock import Clock, Rng, make_rng
from walstream.config.engine import CompactionConfig
from walstream.engine.events import Compacted, EngineHooks
from walstream.engine.object_reader import read_index
from walstream.engine.upload import publish_object
from walstream.errors import IdentityMismatch, PreconditionFailed, WalstreamError
from walstream.format.object import ObjectIdentity, decode_block
from walstream.format.object_builder import ObjectBuilder
from walstream.format.object_keys import object_key
from walstream.metadata.contract import (
    MetadataStore,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamRange,
    StreamState,
)
from walstream.objects.contract import ObjectStore

__all__ = ["Compactor"]

log = logging.getLogger(__name__)


@dataclass
class _Piece:
    info: ObjectInfo
    range: StreamRange


class Compactor:
    def __init__(
        self,
        *,
        objects: ObjectStore,
        metadata: MetadataStore,
        config: CompactionConfig,
        hooks: EngineHooks,
        clock: Clock,
        on_destroyed: Callable[[set[int]], None] | None = None,
        deployment_id: bytes | None = None,
        rng: Rng | None = None,
    ) -> None:
        self._deployment_id = deployment_id
        """The deployment whose objects this compacts (loaded from metadata when not given)."""
        self._rng = rng or make_rng(None)
        self._objects = objects
        self._metadata = metadata
        self._config = config
        self._hooks = hooks
        self._clock = clock
        self._on_destroyed = on_destroyed
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="compactor")

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        last_pass_ms: int | None = None
        while not self._stop.is_set():
            try:
                delay = await self.seconds_until_due(last_pass_ms)
            except WalstreamError as exc:
                log.warning("cannot tell when compaction is due, will retry: %s", exc)
                delay = self._config.interval_s
            if delay > 0:
                if await self._clock.wait(self._stop, delay):
                    return
            try:
                await self.compact_once()
                await self.collect_garbage()
            except WalstreamError as exc:
                log.warning("compaction pass failed, will retry: %s", exc)
            last_pass_ms = self._clock.now_ms()

    async def seconds_until_due(self, last_pass_ms: int | None = None) -> float:
        """Seconds until the next pass is due (0: now), from durable state: due when the oldest
        candidate was committed ``interval_s`` ago, or now when garbage waits; never sooner than
        ``interval_s`` after ``last_pass_ms`` (this process's previous pass, if any). With fewer
        candidates than ``min_objects`` and no garbage, the answer is ``interval_s`` (look
        again then)."""
        interval_ms = int(self._config.interval_s * 1000)
        now_ms = self._clock.now_ms()
        earliest = now_ms if last_pass_ms is None else last_pass_ms + interval_ms
        committed = await self._metadata.list_objects(state=ObjectState.COMMITTED)
        candidates = [info for info in committed if self._is_candidate(info)]
        if len(candidates) >= self._config.min_objects:
            due = min(info.committed_ms for info in candidates) + interval_ms
        elif await self._metadata.list_objects(state=ObjectState.MARK_DESTROYED):
            due = now_ms
        else:
            due = now_ms + interval_ms
        return max(0, max(due, earliest) - now_ms) / 1000

    def _is_candidate(self, info: ObjectInfo) -> bool:
        return info.kind is ObjectKind.STREAM_SET or (
            info.kind is ObjectKind.STREAM and info.size < self._config.small_object_bytes
        )

    async def _deployment(self) -> bytes:
        if self._deployment_id is None:
            self._deployment_id = await self._metadata.deployment_id()
        return self._deployment_id

    async def compact_once(self) -> bool:
        """One pass; True if objects were rewritten."""
        committed = await self._metadata.list_objects(state=ObjectState.COMMITTED)
        candidates = [info for info in committed if self._is_candidate(info)]
        if len(candidates) < self._config.min_objects:
            return False
        # Bound one pass: oldest candidates first, up to max_object_bytes of input.
        selected: list[ObjectInfo] = []
        total = 0
        for info in candidates:
            if selected and total + info.size > self._config.max_object_bytes:
                break
            selected.append(info)
            total += info.size
        stream_ids = sorted({r.stream_id for info in selected for r in info.ranges})
        streams = await self._metadata.get_streams(stream_ids)

        pieces: dict[int, list[_Piece]] = {}
        for info in selected:
            for stream_range in info.ranges:
                stream = streams.get(stream_range.stream_id)
                if stream is None or stream.state is StreamState.DELETED:
                    continue
                if stream_range.end_offset <= stream.start_offset:
                    continue
                pieces.setdefault(stream_range.stream_id, []).append(_Piece(info, stream_range))

        runs: list[list[_Piece]] = []
        for stream_pieces in pieces.values():
            stream_pieces.sort(key=lambda piece: piece.range.start_offset)
            run: list[_Piece] = []
            for piece in stream_pieces:
                if run and piece.range.start_offset != run[-1].range.end_offset:
                    runs.append(run)
                    run = []
                run.append(piece)
            if run:
                runs.append(run)
        rewrite = [
            run for run in runs if len(run) >= 2 or run[0].info.kind is ObjectKind.STREAM_SET
        ]
        sources = {piece.info.object_id: piece.info for run in rewrite for piece in run}
        # A stream-set object is destroyed as a whole: all of its live ranges must be rewritten.
        for info in selected:
            if info.kind is ObjectKind.STREAM_SET:
                sources[info.object_id] = info
        if not sources or (
            len(sources) < 2 and all(info.kind is ObjectKind.STREAM for info in sources.values())
        ):
            return False

        new_commits: list[ObjectCommit] = []
        written_keys: list[str] = []
        try:
            for run in rewrite:
                for commit in await self._write_run(run):
                    new_commits.append(commit)
                    written_keys.append(commit.key)
            await self._metadata.replace_objects(sorted(sources), new_commits)
        except IdentityMismatch:
            await self._objects.delete(written_keys)
            raise
        except PreconditionFailed as exc:
            log.info("compaction lost a race (%s); its output is discarded", exc)
            await self._objects.delete(written_keys)
            return False
        except BaseException:
            await self._objects.delete(written_keys)
            raise
        size = sum(commit.size for commit in new_commits)
        self._hooks.emit(Compacted(sorted(sources), [c.object_id for c in new_commits], size))
        log.info(
            "compacted %d objects into %d stream objects (%d bytes)",
            len(sources),
            len(new_commits),
            size,
        )
        return True

    async def _write_run(self, run: list[_Piece]) -> list[ObjectCommit]:
        stream_id = run[0].range.stream_id
        deployment_id = await self._deployment()
        outputs: list[tuple[list[bytes], list[StreamRange]]] = []
        batches: list[bytes] = []
        batches_bytes = 0
        covered: list[StreamRange] = []
        for piece in run:
            index = await read_index(
                self._objects,
                piece.info.key,
                piece.info.size,
                piece.info.index_size,
                expected=ObjectIdentity(deployment_id, piece.info.object_id),
            )
            for entry in index.blocks_for(
                stream_id, piece.range.start_offset, piece.range.end_offset
            ):
                block = await self._objects.get(
                    piece.info.key, entry.position, entry.position + entry.size
                )
                for header, batch in decode_block(block, entry, index.block_crc_seed):
                    if (
                        header.base_offset < piece.range.start_offset
                        or header.base_offset >= piece.range.end_offset
                    ):
                        continue
                    if batches and batches_bytes + len(batch) > self._config.max_object_bytes:
                        outputs.append((batches, covered))
                        batches, batches_bytes, covered = [], 0, []
                    batches.append(batch)
                    batches_bytes += len(batch)
                    covered = _extend(covered, piece.range, header.base_offset, header.end_offset)
        if batches:
            outputs.append((batches, covered))
        ids = await self._metadata.prepare_objects(len(outputs), 600_000)
        commits: list[ObjectCommit] = []
        for object_id, (output, ranges) in zip(ids, outputs, strict=True):
            # The output's identity needs its id, which exists only once the outputs are counted.
            identity = ObjectIdentity(deployment_id, object_id)
            builder = ObjectBuilder(identity=identity)
            for batch in output:
                builder.add_batch(batch)
            built = builder.finish()
            key = object_key(object_id, deployment_id)
            await publish_object(
                self._objects,
                key,
                built.data,
                identity,
                clock=self._clock,
                rng=self._rng,
                give_up=self._stop.is_set,
            )
            commits.append(
                ObjectCommit(
                    object_id,
                    key,
                    ObjectKind.STREAM,
                    len(built.data),
                    built.index_size,
                    tuple(ranges),
                )
            )
        return commits

    async def collect_garbage(self) -> int:
        """Delete destroyed objects and expired uploads; returns how many were removed."""
        destroyed = await self._metadata.list_objects(state=ObjectState.MARK_DESTROYED)
        expired = await self._metadata.expired_prepared(self._clock.now_ms())
        keys = [info.key for info in destroyed]
        if expired:
            deployment_id = await self._deployment()
            # An expired id has no key in metadata: delete where an upload would have put it.
            # Keys of the format before (without the deployment) are left alone: another
            # deployment sharing the location may own an object under the same legacy key.
            keys.extend(object_key(object_id, deployment_id) for object_id in expired)
        if not keys:
            return 0
        await self._objects.delete(keys)
        ids = [info.object_id for info in destroyed] + list(expired)
        await self._metadata.forget_objects(ids)
        if self._on_destroyed is not None:
            self._on_destroyed(set(ids))
        return len(ids)


def _extend(
    ranges: list[StreamRange], source: StreamRange, start: int, end: int
) -> list[StreamRange]:
    """Grow the output's single range of the stream by one batch ``[start, end)``."""
    if ranges:
        last = ranges[-1]
        return [
            StreamRange(
                last.stream_id,
                last.start_offset,
                end,
                last.epoch,
                min(last.min_timestamp_ms, source.min_timestamp_ms),
                max(last.max_timestamp_ms, source.max_timestamp_ms),
            )
        ]
    return [
        StreamRange(
            source.stream_id,
            start,
            end,
            source.epoch,
            source.min_timestamp_ms,
            source.max_timestamp_ms,
        )
    ]
