"""The CPU half of a compaction step: check the source objects, decide what goes where, build the
new objects. Pure (bytes in, bytes out, no I/O, no event loop), so the compactor runs it in a
worker thread while the event loop keeps serving appends and reads.

A step takes whole source objects (a source is always destroyed whole) and turns their *live*
data into at most as many new objects as it had sources:

- every source's index is parsed once and every block that is copied is checked against its CRC
  first (a bad block stops the step with :class:`CorruptionError`: nothing is rewritten from it);
- a block is live when its stream is ACTIVE, it lies inside the stream's range that metadata
  records for that source, and it holds an offset at or after the stream's ``start_offset``
  (blocks wholly below a trim are dropped; a block straddling the trim is kept whole, so output
  ranges stay on block boundaries and inside the sources' ranges);
- per stream, the live pieces are ordered by offset and joined into *runs* of contiguous
  offsets; a data-loss gap or data held by an object outside the step splits them;
- a stream whose live bytes in the step reach ``stream_split_bytes`` gets a stream object per
  run (largest streams first, only while the step's output count stays within its source
  count); the other streams' runs stay together in one stream-set object per "layer" (layer *i*
  holds each remaining stream's *i*-th run; a stream has at most one run per source, so the
  layers never outnumber the sources).

Building copies block bodies without decoding their batches (a fresh CRC seeded with the new
object's identity is computed over them); small blocks of one stream merge up to the block
target, so the new index has fewer entries than the sources' indexes together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from walstream.errors import CorruptionError, IdentityMismatch
from walstream.format.object import (
    IndexEntry,
    ObjectIdentity,
    block_body,
    cut_block_body,
    parse_index,
)
from walstream.format.object_builder import BuiltObject, ObjectBuilder
from walstream.format.object_keys import is_identity_key
from walstream.metadata.contract import (
    ObjectInfo,
    ObjectKind,
    StreamInfo,
    StreamRange,
    StreamState,
)

__all__ = [
    "CompactionHalted",
    "OutputPlan",
    "Piece",
    "Run",
    "StepPlan",
    "build_outputs",
    "plan_step",
]


class CompactionHalted(Exception):
    """The compactor was stopped while this thread worked: the step is abandoned."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Checked batch bytes ``body`` of one stream holding offsets ``[start_offset, end_offset)``."""

    body: memoryview
    start_offset: int
    end_offset: int


@dataclass(slots=True)
class Run:
    """Contiguous live data of one stream within a step, from one or more sources."""

    stream_id: int
    pieces: list[Piece]
    size: int
    epoch: int
    min_timestamp_ms: int
    max_timestamp_ms: int

    @property
    def start_offset(self) -> int:
        return self.pieces[0].start_offset

    @property
    def end_offset(self) -> int:
        return self.pieces[-1].end_offset

    def stream_range(self) -> StreamRange:
        return StreamRange(
            self.stream_id,
            self.start_offset,
            self.end_offset,
            self.epoch,
            self.min_timestamp_ms,
            self.max_timestamp_ms,
        )


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """One new object: its runs, one per stream, by stream id."""

    kind: ObjectKind
    runs: list[Run]

    @property
    def size(self) -> int:
        return sum(run.size for run in self.runs)


@dataclass(slots=True)
class StepPlan:
    outputs: list[OutputPlan] = field(default_factory=list)
    source_bytes: int = 0
    live_bytes: int = 0
    split_streams: int = 0


_YIELD_EVERY = 128
"""Blocks handled between two hand-overs of the GIL (about a quarter of a millisecond)."""


class _Pacer:
    """Checks the halt flag and hands the GIL over every :data:`_YIELD_EVERY` blocks.

    A thread that wants the GIL waits for the holder's switch interval (5 ms) unless the holder
    lets go; ``time.sleep(0)`` lets go at once, so the event loop waits a fraction of a
    millisecond for the GIL instead of up to 5 ms while a step is planned or built."""

    __slots__ = ("count", "halt")

    def __init__(self, halt: threading.Event | None) -> None:
        self.halt = halt
        self.count = 0

    def tick(self, work: int = 1) -> None:
        self.count += work
        if self.count >= _YIELD_EVERY:
            self.count = 0
            if self.halt is not None and self.halt.is_set():
                raise CompactionHalted
            time.sleep(0)


def _halt_check(halt: threading.Event | None) -> None:
    if halt is not None and halt.is_set():
        raise CompactionHalted


def plan_step(
    sources: Sequence[tuple[ObjectInfo, bytes]],
    streams: Mapping[int, StreamInfo],
    deployment_id: bytes,
    stream_split_bytes: int,
    halt: threading.Event | None = None,
) -> StepPlan:
    """Check ``sources`` (each an object and its whole bytes) and plan the step's outputs.

    ``streams`` holds every stream named by a source's ranges that still exists. Raises
    :class:`CorruptionError` (:class:`IdentityMismatch`) for a damaged (foreign) source and
    :class:`CompactionHalted` once ``halt`` is set."""
    plan = StepPlan()
    pacer = _Pacer(halt)
    runs_by_stream: dict[int, list[Run]] = {}
    for info, data in sources:
        _halt_check(halt)
        plan.source_bytes += len(data)
        expected = ObjectIdentity(deployment_id, info.object_id)
        try:
            index = parse_index(
                data,
                len(data),
                key=info.key,
                expected=expected,
                require_identity=is_identity_key(info.key),
            )
        except IdentityMismatch:
            raise
        except CorruptionError as exc:
            raise CorruptionError(f"object {info.key!r}: {exc}") from None
        seed = index.block_crc_seed
        pacer.tick(_YIELD_EVERY)  # after parsing an index
        for stream_range in info.ranges:
            pacer.tick()
            stream = streams.get(stream_range.stream_id)
            if stream is None or stream.state is StreamState.DELETED:
                continue
            live_from = max(stream_range.start_offset, stream.start_offset)
            if stream_range.end_offset <= live_from:
                continue
            pieces = _live_pieces(
                data, index.blocks_for(stream_range.stream_id, live_from, stream_range.end_offset),
                seed, stream_range, live_from, info.key,
            )  # fmt: skip
            if not pieces:
                raise CorruptionError(
                    f"object {info.key!r} lacks offsets [{live_from}, {stream_range.end_offset}) "
                    f"of stream {stream_range.stream_id} that metadata says it holds"
                )
            _add_pieces(runs_by_stream, stream_range, pieces)
    for runs in runs_by_stream.values():
        runs.sort(key=lambda run: run.start_offset)
        merged: list[Run] = []
        for run in runs:
            if merged and merged[-1].end_offset == run.start_offset:
                last = merged[-1]
                last.pieces.extend(run.pieces)
                last.size += run.size
                last.epoch = max(last.epoch, run.epoch)
                last.min_timestamp_ms = min(last.min_timestamp_ms, run.min_timestamp_ms)
                last.max_timestamp_ms = max(last.max_timestamp_ms, run.max_timestamp_ms)
            else:
                merged.append(run)
        runs[:] = merged
    plan.live_bytes = sum(run.size for runs in runs_by_stream.values() for run in runs)
    plan.outputs, plan.split_streams = _assign(runs_by_stream, stream_split_bytes, len(sources))
    return plan


def _live_pieces(
    data: bytes,
    entries: list[IndexEntry],
    seed: int,
    stream_range: StreamRange,
    live_from: int,
    key: str,
) -> list[Piece]:
    """The checked bodies of ``entries`` (one stream's blocks from ``live_from`` on), cut to the
    metadata range where a block reaches outside it (blocks below the trim point are not in
    ``entries``)."""
    pieces: list[Piece] = []
    for entry in entries:
        body = block_body(data, entry, seed, at=entry.position)
        start, end = entry.start_offset, entry.end_offset
        if start < stream_range.start_offset or end > stream_range.end_offset:
            body, start, end = cut_block_body(
                body, entry, max(start, stream_range.start_offset),
                min(end, stream_range.end_offset),
            )  # fmt: skip
            if start == end:
                continue
        if pieces and pieces[-1].end_offset != start:
            raise CorruptionError(
                f"object {key!r}: blocks of stream {entry.stream_id} leave a gap at "
                f"{pieces[-1].end_offset}"
            )
        pieces.append(Piece(body, start, end))
    return pieces


def _add_pieces(
    runs_by_stream: dict[int, list[Run]], stream_range: StreamRange, pieces: list[Piece]
) -> None:
    runs_by_stream.setdefault(stream_range.stream_id, []).append(
        Run(
            stream_range.stream_id,
            pieces,
            sum(len(piece.body) for piece in pieces),
            stream_range.epoch,
            stream_range.min_timestamp_ms,
            stream_range.max_timestamp_ms,
        )
    )


def _assign(
    runs_by_stream: dict[int, list[Run]], stream_split_bytes: int, source_count: int
) -> tuple[list[OutputPlan], int]:
    """Outputs of a step: split streams get stream objects, the rest share layered stream-set
    objects; never more outputs than ``source_count``."""
    sizes = {stream_id: sum(run.size for run in runs) for stream_id, runs in runs_by_stream.items()}
    big = sorted(
        (stream_id for stream_id, size in sizes.items() if size >= stream_split_bytes),
        key=lambda stream_id: (-sizes[stream_id], stream_id),
    )
    layers_of = sorted((len(runs) for runs in runs_by_stream.values()), reverse=True)
    split: set[int] = set()
    split_outputs = 0
    for stream_id in big:
        run_count = len(runs_by_stream[stream_id])
        layers_of.remove(run_count)
        layers = layers_of[0] if layers_of else 0
        if split_outputs + run_count + layers <= source_count:
            split.add(stream_id)
            split_outputs += run_count
        else:
            layers_of.append(run_count)
            layers_of.sort(reverse=True)
    outputs: list[OutputPlan] = []
    layered: list[list[Run]] = []
    for stream_id in sorted(runs_by_stream):
        runs = runs_by_stream[stream_id]
        if stream_id in split:
            outputs.extend(OutputPlan(ObjectKind.STREAM, [run]) for run in runs)
            continue
        for layer, run in enumerate(runs):
            if layer == len(layered):
                layered.append([])
            layered[layer].append(run)
    for layer_runs in layered:
        kind = ObjectKind.STREAM_SET if len(layer_runs) > 1 else ObjectKind.STREAM
        outputs.append(OutputPlan(kind, layer_runs))
    return outputs, len(split)


def build_outputs(
    outputs: Sequence[OutputPlan],
    identities: Sequence[ObjectIdentity],
    block_target_bytes: int,
    halt: threading.Event | None = None,
    format_version: int | None = None,
) -> list[BuiltObject]:
    """The bytes of each planned output, built for its identity (same order), in
    ``format_version`` (None: the current one)."""
    built: list[BuiltObject] = []
    pacer = _Pacer(halt)
    for output, identity in zip(outputs, identities, strict=True):
        builder = ObjectBuilder(
            block_target_bytes, identity=identity, format_version=format_version
        )
        for run in output.runs:
            _halt_check(halt)
            pacer.tick(len(run.pieces))
            for piece in run.pieces:
                builder.add_block_body(
                    run.stream_id, piece.start_offset, piece.end_offset, piece.body
                )
        built.append(builder.finish())
    return built
