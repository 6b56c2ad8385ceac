"""The row shapes the SQL metadata stores share: column lists in a fixed order and the codecs
from a row in that order to the contract's dataclasses.

The SQL store (:mod:`walstream.metadata.sql`) reads and writes these columns on every dialect
(SQLite, PostgreSQL), so a row means the same thing in both.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from walstream.metadata.contract import (
    BasinInfo,
    DataLossGap,
    NodeInfo,
    NodeState,
    StreamInfo,
    StreamRange,
    StreamState,
)
from walstream.metadata.rules import decode_basin_config
from walstream.stream_config import StreamConfig

__all__ = [
    "BASIN_COLUMNS",
    "GAP_COLUMNS",
    "MAX_OFFSET",
    "NODE_COLUMNS",
    "OBJECT_COLUMNS",
    "RANGE_COLUMNS",
    "STREAM_COLUMNS",
    "basin_of",
    "gap_of",
    "node_of",
    "range_of",
    "stream_of",
]

STREAM_COLUMNS = (
    "stream_id, name, epoch, start_offset, committed_end, state, owner_node_id, fencing_token, "
    "created_ms, config, creation_token, lifecycle_due_ms"
)
OBJECT_COLUMNS = "object_id, state, expires_ms, expired, key, kind, size, index_size, committed_ms"
RANGE_COLUMNS = "stream_id, start_offset, end_offset, epoch, min_timestamp_ms, max_timestamp_ms"
NODE_COLUMNS = "node_id, node_epoch, state, wal_config, updated_ms, address, lease_expires_ms"
GAP_COLUMNS = "stream_id, start_offset, end_offset, reason, recorded_ms"
BASIN_COLUMNS = "name, config, created_ms"
#: The largest offset a stored range may end at (a signed 64-bit column).
MAX_OFFSET = (1 << 63) - 1


@functools.lru_cache(maxsize=256)
def _config_of(text: str | None) -> StreamConfig:
    """A stored config decoded once per distinct text: most streams share a few configs, and a
    :class:`StreamConfig` is immutable, so the rows of a commit of thousands of streams share
    the decoded one (a bad text raises each time: errors are not cached)."""
    return StreamConfig.decode(text)


def stream_of(row: Sequence[Any]) -> StreamInfo:
    return StreamInfo(
        stream_id=row[0],
        name=row[1],
        epoch=row[2],
        start_offset=row[3],
        committed_end=row[4],
        state=StreamState(row[5]),
        owner_node_id=row[6],
        fencing_token=row[7],
        created_ms=row[8],
        config=_config_of(row[9]),
        creation_token=row[10],
        lifecycle_due_ms=row[11],
    )


def range_of(row: Sequence[Any]) -> StreamRange:
    return StreamRange(row[0], row[1], row[2], row[3], row[4], row[5])


def node_of(row: Sequence[Any]) -> NodeInfo:
    return NodeInfo(
        row[0], row[1], NodeState(row[2]), json.loads(row[3]), row[4], row[5], int(row[6])
    )


def gap_of(row: Sequence[Any]) -> DataLossGap:
    return DataLossGap(row[0], row[1], row[2], row[3], row[4])


def basin_of(row: Sequence[Any]) -> BasinInfo:
    return BasinInfo(str(row[0]), decode_basin_config(row[1]), int(row[2]))
