"""walstream: stream storage for the cloud.

Append-only streams whose acknowledged appends are durable in a write-ahead log and move, in
near real time, into object storage.
"""

from __future__ import annotations

from .client import Client, Stream
from .config import EngineConfig
from .errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    DataLossError,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    OutOfRangeError,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
    WalstreamError,
)
from .opener import open
from .records import AppendAck, ReadResult, Record, SequencedRecord

__version__ = "0.1.0"

__all__ = [
    "AmbiguousError",
    "AppendAck",
    "BackendUnavailable",
    "CapacityError",
    "Client",
    "ConfigError",
    "CorruptionError",
    "DataLossError",
    "EngineConfig",
    "FencedError",
    "IdentityMismatch",
    "InvalidArgument",
    "OutOfRangeError",
    "ReadResult",
    "Record",
    "SequencedRecord",
    "Stream",
    "StreamExists",
    "StreamNotFound",
    "TailMismatchError",
    "WalstreamError",
    "open",
]
