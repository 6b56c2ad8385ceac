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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from .clock import Clock
from .config import CompactionConfig
from .errors import PreconditionFailed, WalstreamError
from .hooks import EngineHooks
from .metadata import (
    MetadataStore,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamRange,
    StreamState,
)
from .object_format import ObjectBuilder, decode_block, object_key, read_index
from .objects import ObjectStore

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
    ) -> None:
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
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self._config.interval_s)
                return
            except TimeoutError:
                pass
            try:
                await self.compact_once()
                await self.collect_garbage()
            except WalstreamError as exc:
                log.warning("compaction pass failed, will retry: %s", exc)

    async def compact_once(self) -> bool:
        """One pass; True if objects were rewritten."""
        committed = await self._metadata.list_objects(state=ObjectState.COMMITTED)
        candidates = [
            info
            for info in committed
            if info.kind is ObjectKind.STREAM_SET
            or (info.kind is ObjectKind.STREAM and info.size < self._config.small_object_bytes)
        ]
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
        except PreconditionFailed as exc:
            log.info("compaction lost a race (%s); its output is discarded", exc)
            await self._objects.delete(written_keys)
            return False
        except BaseException:
            await self._objects.delete(written_keys)
            raise
        size = sum(commit.size for commit in new_commits)
        self._hooks.compacted(sorted(sources), [c.object_id for c in new_commits], size)
        log.info(
            "compacted %d objects into %d stream objects (%d bytes)",
            len(sources),
            len(new_commits),
            size,
        )
        return True

    async def _write_run(self, run: list[_Piece]) -> list[ObjectCommit]:
        stream_id = run[0].range.stream_id
        outputs: list[tuple[ObjectBuilder, list[StreamRange]]] = []
        builder = ObjectBuilder()
        covered: list[StreamRange] = []
        for piece in run:
            index = await read_index(
                self._objects, piece.info.key, piece.info.size, piece.info.index_size
            )
            for entry in index.blocks_for(
                stream_id, piece.range.start_offset, piece.range.end_offset
            ):
                block = await self._objects.get(
                    piece.info.key, entry.position, entry.position + entry.size
                )
                for header, batch in decode_block(block, entry):
                    if (
                        header.base_offset < piece.range.start_offset
                        or header.base_offset >= piece.range.end_offset
                    ):
                        continue
                    if (
                        builder.size_bytes
                        and builder.size_bytes + len(batch) > self._config.max_object_bytes
                    ):
                        outputs.append((builder, covered))
                        builder, covered = ObjectBuilder(), []
                    builder.add_batch(batch)
                    covered = _extend(covered, piece.range, header.base_offset, header.end_offset)
        if builder.size_bytes:
            outputs.append((builder, covered))
        ids = await self._metadata.prepare_objects(len(outputs), 600_000)
        commits: list[ObjectCommit] = []
        for object_id, (output, ranges) in zip(ids, outputs, strict=True):
            built = output.finish()
            key = object_key(object_id)
            await self._objects.put(key, built.data)
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
        keys = [info.key for info in destroyed] + [object_key(object_id) for object_id in expired]
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
