"""walstream: stream storage for the cloud.

Append-only streams whose acknowledged appends are durable in a write-ahead log and move, in
near real time, into object storage.
"""

from __future__ import annotations

from walstream.config.engine import EngineConfig
from walstream.encryption import Cipher, EncryptionKey
from walstream.engine.client import Client, Stream
from walstream.engine.opener import open
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    DataLossError,
    DecryptionFailed,
    EncryptionKeyRequired,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    OutOfRangeError,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
    WalstreamError,
)
from walstream.records import AppendAck, ReadResult, Record, SequencedRecord
from walstream.stream_config import StreamConfig, Timestamping
from walstream.tuning import tune_gc

__version__ = "0.1.0"

__all__ = [
    "AmbiguousError",
    "AppendAck",
    "BackendUnavailable",
    "CapacityError",
    "Cipher",
    "Client",
    "ConfigError",
    "CorruptionError",
    "DataLossError",
    "DecryptionFailed",
    "EncryptionKey",
    "EncryptionKeyRequired",
    "EngineConfig",
    "FencedError",
    "IdentityMismatch",
    "InvalidArgument",
    "OutOfRangeError",
    "ReadResult",
    "Record",
    "SequencedRecord",
    "Stream",
    "StreamConfig",
    "StreamExists",
    "StreamNotFound",
    "TailMismatchError",
    "Timestamping",
    "WalstreamError",
    "open",
    "tune_gc",
]
