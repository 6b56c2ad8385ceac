"""Test rigs of the nvme-quorum WAL: chunk servers as child processes (:mod:`.processes`) and
in-process over real data folders (:mod:`.inprocess`). Runtime modules import them only lazily,
from the factory's ``provision`` hook."""

from __future__ import annotations

from .inprocess import InProcessServers
from .processes import ChunkServerProcess, chunk_servers

__all__ = ["ChunkServerProcess", "InProcessServers", "chunk_servers"]
