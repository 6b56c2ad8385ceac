"""Partition planning on the driver, from metadata only (no object is read).

A request ``[start, end)`` of one stream becomes *slices*: the committed object ranges that
cover it, clipped to the request, then

1. **split** — a range above ``target_bytes`` or ``max_records`` is cut into equal record counts;
2. **merged** — neighbouring pieces of the same stream are joined while the result stays within
   both bounds (many small objects after a busy upload interval become one task).

Byte sizes are estimates: an object's size shared out by record count over its ranges (metadata
lists only the requested stream's range of a stream-set object, so those count whole — an
overestimate that only makes slices smaller). The plan depends only on the metadata it was
given: the same committed state gives the same slices, in stream order then offset order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from walstream.errors import DataLossError
from walstream.metadata import MetadataStore

from .options import OffsetSpec

__all__ = ["ReadSlice", "StreamRequest", "plan_slices", "resolve_requests"]

_PAGE = 1000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamRequest:
    name: str
    stream_id: int
    start: int
    end: int
    min_timestamp_ms: int | None = None


@dataclass(frozen=True)
class ReadSlice:
    """One Spark task: records ``[start, end)`` of one stream (the executor clips to what is
    still untrimmed and drops records older than ``min_timestamp_ms``)."""

    name: str
    stream_id: int
    start: int
    end: int
    estimated_bytes: int
    min_timestamp_ms: int | None = None

    @property
    def records(self) -> int:
        return self.end - self.start


async def resolve_requests(
    metadata: MetadataStore,
    streams: list[str],
    starting: OffsetSpec,
    ending: OffsetSpec | None,
    from_timestamp_ms: int | None = None,
) -> list[StreamRequest]:
    """Turn stream names and offset options into concrete ``[start, end)`` ranges inside each
    stream's readable, committed data. ``ending=None`` means the committed tail."""
    requests = []
    for name in streams:
        info = await metadata.get_stream(name)
        start = starting.resolve(name, info)
        end = info.committed_end if ending is None else ending.resolve(name, info)
        if from_timestamp_ms is not None:
            start = max(
                start,
                await _first_offset_at(metadata, info.stream_id, start, end, from_timestamp_ms),
            )
        requests.append(
            StreamRequest(name, info.stream_id, start, max(start, end), from_timestamp_ms)
        )
    return requests


async def _first_offset_at(
    metadata: MetadataStore, stream_id: int, start: int, end: int, timestamp_ms: int
) -> int:
    """Start of the first committed range whose newest record is at or after ``timestamp_ms``
    (timestamps never decrease within a stream); ``end`` when there is none."""
    position = start
    while position < end:
        infos = await metadata.get_objects(stream_id, position, end, limit=_PAGE)
        before = position
        for info in infos:
            stream_range = info.ranges[0]
            if stream_range.max_timestamp_ms >= timestamp_ms:
                return max(position, stream_range.start_offset)
            position = max(position, stream_range.end_offset)
        if position == before:
            break
    return end


async def plan_slices(
    metadata: MetadataStore,
    requests: list[StreamRequest],
    target_bytes: int,
    max_records: int,
    fail_on_data_loss: bool = True,
) -> list[ReadSlice]:
    """Slices covering every request. Offsets recorded as lost (``walstream recover
    --accept-loss``) inside a request raise :class:`DataLossError` unless ``fail_on_data_loss``
    is false, in which case they are skipped with a warning."""
    slices: list[ReadSlice] = []
    for request in requests:
        pieces = await _committed_pieces(metadata, request)
        await _check_holes(metadata, request, pieces, fail_on_data_loss)
        slices.extend(_merge(_split(pieces, target_bytes, max_records), target_bytes, max_records))
    return slices


async def _committed_pieces(metadata: MetadataStore, request: StreamRequest) -> list[ReadSlice]:
    pieces: list[ReadSlice] = []
    position = request.start
    while position < request.end:
        infos = await metadata.get_objects(request.stream_id, position, request.end, limit=_PAGE)
        before = position
        for info in infos:
            stream_range = info.ranges[0]
            low = max(position, stream_range.start_offset)
            high = min(request.end, stream_range.end_offset)
            if high <= low:
                continue
            range_records = max(1, stream_range.end_offset - stream_range.start_offset)
            estimated = info.size * (high - low) // range_records
            pieces.append(
                ReadSlice(
                    request.name, request.stream_id, low, high, estimated, request.min_timestamp_ms
                )
            )
            position = high
        if position == before:
            break  # nothing committed beyond here (the request was clipped to committed_end)
    return pieces


async def _check_holes(
    metadata: MetadataStore,
    request: StreamRequest,
    pieces: list[ReadSlice],
    fail_on_data_loss: bool,
) -> None:
    """Recorded data-loss gaps between (or after) the committed pieces of a request."""
    position = request.start
    holes: list[tuple[int, int]] = []
    for piece in pieces:
        if piece.start > position:
            holes.append((position, piece.start))
        position = max(position, piece.end)
    if position < request.end:
        holes.append((position, request.end))
    for low, high in holes:
        gaps = await metadata.get_data_loss(request.stream_id, low, high)
        if not gaps:
            # No object and no recorded loss: a trim or a delete raced the plan (the executors
            # clip to what is still readable).
            continue
        for gap in gaps:
            message = (
                f"stream {request.name!r}: offsets [{gap.start_offset}, {gap.end_offset}) were "
                f"recorded as lost ({gap.reason})"
            )
            if fail_on_data_loss:
                raise DataLossError(
                    message + "; read around them, or set option failOnDataLoss=false to skip "
                    "lost offsets",
                    request.stream_id,
                    gap.start_offset,
                    gap.end_offset,
                )
            log.warning("%s; skipped (failOnDataLoss=false)", message)


def _split(pieces: list[ReadSlice], target_bytes: int, max_records: int) -> list[ReadSlice]:
    result: list[ReadSlice] = []
    for piece in pieces:
        parts = max(-(-piece.estimated_bytes // target_bytes), -(-piece.records // max_records), 1)
        parts = min(parts, piece.records)
        for index in range(parts):
            low = piece.start + piece.records * index // parts
            high = piece.start + piece.records * (index + 1) // parts
            share = piece.estimated_bytes * (high - low) // max(1, piece.records)
            result.append(
                ReadSlice(piece.name, piece.stream_id, low, high, share, piece.min_timestamp_ms)
            )
    return result


def _merge(pieces: list[ReadSlice], target_bytes: int, max_records: int) -> list[ReadSlice]:
    result: list[ReadSlice] = []
    for piece in pieces:
        if result:
            last = result[-1]
            if (
                last.end == piece.start
                and last.estimated_bytes + piece.estimated_bytes <= target_bytes
                and last.records + piece.records <= max_records
            ):
                result[-1] = ReadSlice(
                    last.name,
                    last.stream_id,
                    last.start,
                    piece.end,
                    last.estimated_bytes + piece.estimated_bytes,
                    last.min_timestamp_ms,
                )
                continue
        result.append(piece)
    return result
