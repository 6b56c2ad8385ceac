"""The old name of :mod:`walstream.blocking` (the blocking facade), kept so that existing imports
go on working; importing it warns. ``sync`` read as "fsync" to newcomers."""

from __future__ import annotations

import warnings

from walstream.blocking import EventLoopThread, SyncClient, SyncStream, TailIterator, open

__all__ = ["EventLoopThread", "SyncClient", "SyncStream", "TailIterator", "open"]

warnings.warn(
    "walstream.sync is now walstream.blocking; import walstream.blocking instead "
    "(walstream.sync goes away in a later release)",
    DeprecationWarning,
    stacklevel=2,
)
