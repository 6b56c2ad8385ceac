"""What a quorum replica is: the :class:`Replica` contract and its numbered rules, and the
values it exchanges with :class:`~walstream.wal.quorum.QuorumWal` (listings, seals)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from walstream.errors import IdentityMismatch
from walstream.wal.quorum.chunk import LogIdentity

__all__ = [
    "MAX_SEALS",
    "ChunkInfo",
    "LogListing",
    "Replica",
    "Seal",
    "identity_mismatch",
]

#: Seals a replica keeps per log (one per recovery); the oldest are forgotten beyond this.
MAX_SEALS = 4096


def identity_mismatch(
    replica: str, log_id: str, stored: LogIdentity, expected: LogIdentity
) -> IdentityMismatch:
    """The error a replica (or the WAL) raises for a log that belongs to someone else."""
    return IdentityMismatch(
        f"replica {replica}: log {log_id} belongs to {stored.describe()}, not to "
        f"{expected.describe()} that opens it; check that the WAL configuration points at this "
        "deployment's replicas (a bucket, prefix or chunk server of another deployment?)"
    )


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One stored chunk as a listing shows it."""

    seq: int
    epoch: int
    size: int
    crc: int


@dataclass(frozen=True, slots=True, order=True)
class Seal:
    """Chunks of an epoch older than ``epoch`` and a seq above ``end_seq`` are invalid."""

    epoch: int
    end_seq: int

    def invalidates(self, chunk: ChunkInfo) -> bool:
        return chunk.epoch < self.epoch and chunk.seq > self.end_seq


@dataclass(frozen=True)
class LogListing:
    """What one replica holds of one log."""

    claimed_epoch: int = 0
    trim_seq: int = 0
    """Every chunk with ``seq <= trim_seq`` is deleted."""
    trim_offset: int = -1
    """Records at offsets ``<= trim_offset`` are trimmed (the chunk holding it may remain)."""
    seals: tuple[Seal, ...] = ()
    chunks: Mapping[int, ChunkInfo] = field(default_factory=dict)
    identity: LogIdentity | None = None
    """Whose log the replica says this is (recorded by the first identified claim)."""
    incomplete: bool = False
    """The replica lost data it once held (e.g. a truncated file) and has not been sealed
    since: its listing cannot show that a chunk was never written."""


class Replica(Protocol):
    """One copy of the log on one medium (a chunk server, a zonal bucket, ...).

    Rules every implementation keeps (``QuorumWal`` relies on them):

    1. Every request carrying an ``epoch`` older than the highest epoch that claimed, sealed or
       wrote the log raises :class:`FencedError` and changes nothing. A request with a newer
       epoch raises the claimed epoch to it.
    2. ``write_chunk`` is durable when it returns and conditional per seq: the same
       ``(epoch, seq, bytes)`` again succeeds (idempotent); other bytes under the same epoch and
       seq raise :class:`PreconditionFailed`; a chunk of an older epoch at that seq is replaced.
       A seq at or below the trim point is accepted and dropped.
    3. ``seal(epoch, end_seq)`` records the seal durably and deletes the chunks it invalidates.
    4. ``trim`` deletes chunks with ``seq <= through_seq``; trim points only move forward.
    5. ``claim`` and ``list_chunks`` return a listing that includes every write acknowledged
       before the call; after ``claim`` returns, older epochs are refused.
    6. Errors: :class:`BackendUnavailable` when the request surely did not happen,
       :class:`AmbiguousError` when it may have, :class:`NotFound` for a missing chunk,
       :class:`CorruptionError` for bad stored bytes.
    7. ``claim`` with an ``identity`` checks it before anything else: a log that recorded
       another identity raises :class:`IdentityMismatch` (see :func:`identity_mismatch`) and
       changes nothing; a log without one records it durably with the claim. Listings report
       the recorded identity.
    """

    name: str

    async def claim(
        self, log_id: str, epoch: int, identity: LogIdentity | None = None
    ) -> LogListing: ...

    async def list_chunks(self, log_id: str) -> LogListing: ...

    async def write_chunk(self, log_id: str, epoch: int, seq: int, data: bytes) -> None: ...

    async def read_chunk(self, log_id: str, seq: int) -> tuple[int, bytes]:
        """``(epoch, data)`` of the stored chunk."""
        ...

    async def seal(self, log_id: str, epoch: int, end_seq: int) -> None: ...

    async def trim(self, log_id: str, epoch: int, through_seq: int, trim_offset: int) -> None: ...

    def healthy(self) -> bool:
        """Whether the replica is believed reachable now (no I/O)."""
        ...

    async def close(self) -> None: ...
