"""The YAML options every quorum WAL plugin shares, and how they become :class:`QuorumWal`
arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["quorum_wal_options"]


def quorum_wal_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`QuorumWal` keyword arguments from the YAML options every quorum WAL plugin shares
    (``request_timeout``, ``write_timeout``, ``max_chunk_bytes``, ``max_chunk_delay``,
    ``max_inflight``, ``max_record_bytes``)."""
    return {
        "request_timeout_s": options["request_timeout"],
        "write_timeout_s": options["write_timeout"],
        "max_chunk_bytes": options["max_chunk_bytes"],
        "max_chunk_delay_s": options["max_chunk_delay"],
        "max_inflight": options["max_inflight"],
        "max_record_bytes": options["max_record_bytes"],
    }
