"""Executor side of reads: one slice of one stream, straight from the object store.

No node is involved: metadata says which objects hold the slice, :class:`ObjectReader` fetches
their blocks with ranged GETs. Only committed data exists here, so a reader sees a stream up to
its ``committed_end`` — at most one upload interval behind the node's acknowledged tail.

A slice is a sequential scan: its reader reads ahead from its first GET, with the deployment's
``cache.readahead_*`` options (up to ``readahead_depth x readahead_max_bytes`` in flight per
task), on the walstream event loop while Spark consumes the previous chunk; whatever was read
ahead is dropped and its GETs cancelled when the slice ends or Spark stops reading it early.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from walstream.encryption import EncryptionKey, open_records
from walstream.engine.object_reader import ObjectReader
from walstream.errors import BackendUnavailable, StreamNotFound
from walstream.records import SequencedRecord

from .planning import ReadSlice
from .runtime import DeploymentBackends, run

__all__ = ["ARROW_SCHEMA", "SCHEMA", "read_slice", "read_slice_batches"]

#: The DataFrame schema of ``spark.read.format("walstream")``.
SCHEMA = (
    "stream string, offset long, timestamp timestamp, key binary, value binary, "
    "headers map<string,binary>"
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.map_(pa.string(), pa.binary())),
    ]
)

_CHUNK_RECORDS = 10_000
_CHUNK_BYTES = 16 << 20
_BLOCK_CACHE_BYTES = 32 << 20


def read_slice(
    backends: DeploymentBackends, piece: ReadSlice, encryption: EncryptionKey | None = None
) -> Iterator[list[SequencedRecord]]:
    """Chunks of the slice's records, in offset order; trimmed records and records older than
    ``piece.min_timestamp_ms`` are left out. Encrypted records are opened with ``encryption``
    (option ``encryptionKey``); without it they raise EncryptionKeyRequired."""
    cache = backends.engine_config.cache
    reader = ObjectReader(
        backends.objects,
        backends.metadata,
        block_cache_bytes=_BLOCK_CACHE_BYTES,
        readahead_min_bytes=cache.readahead_min_bytes,
        readahead_max_bytes=cache.readahead_max_bytes,
        readahead_depth=cache.readahead_depth,
    )
    try:
        for records in _read_chunks(backends, piece, reader):
            yield open_records(records, encryption, piece.stream_id)
    finally:
        run(_release(reader, piece.stream_id))


async def _release(reader: ObjectReader, stream_id: int) -> None:
    """On the loop that runs the reader's GETs: cancelling them is not thread-safe elsewhere."""
    reader.release(stream_id)


def _read_chunks(
    backends: DeploymentBackends, piece: ReadSlice, reader: ObjectReader
) -> Iterator[list[SequencedRecord]]:
    position = piece.start
    stop = piece.end
    while position < stop:
        info = run(backends.metadata.get_streams([piece.stream_id])).get(piece.stream_id)
        if info is None:
            raise StreamNotFound(f"stream {piece.name!r} (id {piece.stream_id}) no longer exists")
        position = max(position, info.start_offset)
        stop = min(stop, max(info.committed_end, position))
        if position >= stop:
            return
        records = run(
            reader.read(
                piece.stream_id, position, stop, _CHUNK_RECORDS, _CHUNK_BYTES, sequential=True
            )
        )
        if not records:
            # Trimmed meanwhile? The next round re-reads start_offset; otherwise it is a hole.
            info = run(backends.metadata.get_streams([piece.stream_id])).get(piece.stream_id)
            if info is not None and info.start_offset > position:
                continue
            raise BackendUnavailable(
                f"stream {piece.name!r}: offsets [{position}, {stop}) are committed in metadata "
                "but no object holds them; check that the object store and metadata belong to "
                "the same deployment"
            )
        position = records[-1].offset + 1
        if piece.min_timestamp_ms is not None:
            records = [
                record for record in records if record.timestamp_ms >= piece.min_timestamp_ms
            ]
        if records:
            yield records


def read_slice_batches(
    backends: DeploymentBackends, piece: ReadSlice, encryption: EncryptionKey | None = None
) -> Iterator[pa.RecordBatch]:
    for records in read_slice(backends, piece, encryption):
        yield to_arrow(piece.name, records)


def to_arrow(stream: str, records: list[SequencedRecord]) -> pa.RecordBatch:
    count = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([stream] * count, pa.string()),
            pa.array([record.offset for record in records], pa.int64()),
            pa.array(
                [record.timestamp_ms * 1000 for record in records], pa.timestamp("us", tz="UTC")
            ),
            pa.array([record.key for record in records], pa.binary()),
            pa.array([record.value for record in records], pa.binary()),
            pa.array(
                [list(record.headers) for record in records], pa.map_(pa.string(), pa.binary())
            ),
        ],
        schema=ARROW_SCHEMA,
    )
