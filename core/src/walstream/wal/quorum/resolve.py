"""Rule 3 of the protocol as a pure function: the log that a set of replica listings shows.

:func:`resolve` trusts every listed copy; :class:`~walstream.wal.quorum.QuorumWal` refines its
answer by reading the copies back (see "Damage versus a torn tail" in the package doc).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from walstream.wal.quorum.replica import ChunkInfo, LogListing, Seal

__all__ = ["ChainLink", "Resolution", "resolve"]


@dataclass(frozen=True)
class ChainLink:
    """A chunk recovery keeps: its seq, the chosen copy and the replicas holding that content."""

    seq: int
    epoch: int
    size: int
    crc: int
    holders: tuple[str, ...]
    damage: str | None = None
    """Set when no copy of a committed chunk verifies: what failed where (the chunk is lost),
    and for a damage marker (then ``marker`` is set and the link is a real chunk)."""
    marker: bool = False


@dataclass(frozen=True)
class Resolution:
    trim_seq: int
    trim_offset: int
    seals: tuple[Seal, ...]
    chain: tuple[ChainLink, ...]

    @property
    def end_seq(self) -> int:
        return self.chain[-1].seq if self.chain else self.trim_seq


def resolve(listings: Mapping[str, LogListing]) -> Resolution:
    """The deterministic resolution of the log from replica listings alone (rule 3 of the
    protocol in :mod:`walstream.wal.quorum`), trusting every listed copy. Recovery refines it by
    reading the copies back (see "Damage versus a torn tail")."""
    trim_seq = max((listing.trim_seq for listing in listings.values()), default=0)
    trim_offset = max((listing.trim_offset for listing in listings.values()), default=-1)
    seals = tuple(sorted({seal for listing in listings.values() for seal in listing.seals}))

    def valid(chunk: ChunkInfo) -> bool:
        return not any(seal.invalidates(chunk) for seal in seals)

    chain: list[ChainLink] = []
    seq = trim_seq + 1
    while True:
        candidates = [
            (name, chunk)
            for name, listing in sorted(listings.items())
            if (chunk := listing.chunks.get(seq)) is not None and valid(chunk)
        ]
        if not candidates:
            break
        chosen = max(candidates, key=lambda item: (item[1].epoch, item[1].crc))[1]
        holders = tuple(
            name
            for name, chunk in candidates
            if chunk.crc == chosen.crc and chunk.size == chosen.size
        )
        chain.append(ChainLink(seq, chosen.epoch, chosen.size, chosen.crc, holders))
        seq += 1
    return Resolution(trim_seq, trim_offset, seals, tuple(chain))
