"""walstream: stream storage for the cloud.

Append-only streams whose acknowledged appends are durable in a write-ahead log and move, in
near real time, into object storage.
"""

from __future__ import annotations

from .errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    FencedError,
    InvalidArgument,
    OutOfRangeError,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
    WalstreamError,
)
from .client import Client, Stream
from .config import EngineConfig
from .opener import open
from .records import AppendAck, ReadResult, Record, SequencedRecord

__version__ = "0.1.0"

__all__ = [
    "AmbiguousError",
    "AppendAck",
    "BackendUnavailable",
    "CapacityError",
    "Client",
    "EngineConfig",
    "Stream",
    "open",
    "ConfigError",
    "CorruptionError",
    "FencedError",
    "InvalidArgument",
    "OutOfRangeError",
    "ReadResult",
    "Record",
    "SequencedRecord",
    "StreamExists",
    "StreamNotFound",
    "TailMismatchError",
    "WalstreamError",
]
