"""The YAML options every quorum WAL plugin shares, the write-quorum rule, and how the options
become :class:`~walstream.wal.quorum.QuorumWal` arguments.

A plugin lists its own keys (where the replicas are) around the shared ones::

    quorum = quorum_option_set(replica="zone", log_place="in the buckets", ...)
    options = (buckets, ..., quorum.log_id, quorum.write_quorum, *quorum.tuning, ...)

and builds the WAL with ``write_quorum_of(...)`` and ``**quorum_wal_options(options)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from walstream.config import Option
from walstream.errors import ConfigError

__all__ = [
    "GROUP_DELAY_DOC",
    "QuorumOptions",
    "quorum_option_set",
    "quorum_wal_options",
    "write_quorum_of",
]

GROUP_DELAY_DOC = "while chunks are in flight, appends wait at most this long for company"
"""What ``max_chunk_delay`` means (the group-commit delay of :class:`GroupCommitWal`)."""


@dataclass(frozen=True)
class QuorumOptions:
    """The shared options of a quorum WAL, worded for one medium."""

    write_quorum: Option
    log_id: Option
    tuning: tuple[Option, ...]
    """``max_chunk_bytes``, ``max_chunk_delay``, ``max_inflight``, ``max_record_bytes``,
    ``request_timeout``, ``write_timeout``, in that order."""


def quorum_option_set(
    *,
    replica: str,
    log_place: str,
    acknowledged_by: str,
    max_chunk_bytes: str,
    max_chunk_delay: str,
    max_chunk_delay_doc: str = GROUP_DELAY_DOC,
    max_chunk_bytes_minimum: int | None = None,
) -> QuorumOptions:
    """The shared options for a medium whose replica is called ``replica`` (``"server"``),
    whose logs live ``log_place`` (``"on the servers"``) and whose write quorum counts
    ``acknowledged_by`` (``"acknowledgements"``); the defaults are the medium's."""
    return QuorumOptions(
        write_quorum=Option(
            "write_quorum",
            "int",
            f"W: {acknowledged_by} a chunk needs (default: majority)",
            minimum=1,
        ),
        log_id=Option(
            "log_id", "str", f"name of this node's log {log_place} (default node-{{id}})"
        ),
        tuning=(
            Option(
                "max_chunk_bytes",
                "size",
                "close a chunk at this size",
                default=max_chunk_bytes,
                minimum=max_chunk_bytes_minimum,
            ),
            Option("max_chunk_delay", "duration", max_chunk_delay_doc, default=max_chunk_delay),
            Option("max_inflight", "int", "chunks being written at once", default=8, minimum=1),
            Option("max_record_bytes", "size", "largest single append", default="8MiB"),
            Option(
                "request_timeout",
                "duration",
                f"bound of one request to one {replica}",
                default="2s",
            ),
            Option(
                "write_timeout",
                "duration",
                "how long a chunk keeps retrying without a quorum before the WAL fails",
                default="10s",
            ),
        ),
    )


def write_quorum_of(
    requested: int | None, replica_count: int, *, key: str = "write_quorum", among: str = ""
) -> int:
    """W: ``requested``, or a majority of ``replica_count`` when unset.

    :class:`ConfigError` naming ``key`` unless ``1 <= W <= replica_count``; ``among`` says what
    bounds it in the user's terms (default: ``the N replicas``).
    """
    write_quorum = requested if requested is not None else replica_count // 2 + 1
    if not 1 <= write_quorum <= replica_count:
        bound = among or f"the {replica_count} replicas"
        raise ConfigError(f"{key}: must be between 1 and {bound}, got {write_quorum}")
    return write_quorum


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
