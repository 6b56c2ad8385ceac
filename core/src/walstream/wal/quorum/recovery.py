"""Recovery of a quorum WAL at open: the copies listed by a read quorum are read back and
verified (rule 3 on verified copies, with damaged links where a committed chunk has no valid
copy), and the decision is made durable on a write quorum before anything is returned (rule 4).
See "Damage versus a torn tail" in the doc of :mod:`walstream.wal.quorum`."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping

from walstream.errors import (
    BackendUnavailable,
    CorruptionError,
    IdentityMismatch,
    NotFound,
    WalstreamError,
)
from walstream.wal.quorum.chunk import (
    Chunk,
    LogIdentity,
    chunk_crc,
    encode_damage_marker,
    parse_chunk,
)
from walstream.wal.quorum.fanout import Fanout
from walstream.wal.quorum.replica import ChunkInfo, LogListing
from walstream.wal.quorum.resolve import ChainLink, Resolution, resolve

__all__ = ["Recovery"]

log = logging.getLogger(__name__)


class Recovery:
    """Reads and verifies chunk copies for one quorum WAL and settles what recovery decided.

    It keeps what recovery learned for the WAL's later use: the chunks it verified (bounded by
    ``buffer_bytes``, for settle and recover), the copies that failed verification per replica
    (``bad_copies``: catch-up rewrites them even when a listing looks right) and the damage
    markers it made (``markers``, for settle to write). ``identity`` is whose log this is
    (``None``: nothing is checked).
    """

    def __init__(
        self,
        fanout: Fanout,
        *,
        log_id: str,
        write_quorum: int,
        buffer_bytes: int,
        verify_parallelism: int,
    ) -> None:
        self.fanout = fanout
        self.log_id = log_id
        self.replica_count = len(fanout.states)
        self.write_quorum = write_quorum
        self.buffer_bytes = buffer_bytes
        self.verify_parallelism = verify_parallelism
        self.identity: LogIdentity | None = None
        self.verified: OrderedDict[int, bytes] = OrderedDict()
        self.verified_bytes = 0
        self.bad_copies: dict[str, set[int]] = {}
        self.markers: dict[int, bytes] = {}

    def _foreign(self, chunk: Chunk) -> str | None:
        """Why ``chunk`` is not ours (invariant 12), or ``None``."""
        if self.identity is None or chunk.identity is None or chunk.identity == self.identity:
            return None
        return f"belongs to {chunk.identity.describe()}, not {self.identity.describe()}"

    async def read_verified(self, name: str, seq: int, crc: int) -> tuple[bytes, Chunk]:
        """Read chunk ``seq`` from replica ``name`` and verify it against the listed ``crc``,
        its own checksum and the identity; :class:`CorruptionError` when any check fails."""
        replica = self.fanout.states[name].replica
        _, data = await self.fanout.bounded(replica.read_chunk(self.log_id, seq))
        if chunk_crc(data) != crc:
            raise CorruptionError(f"chunk {seq} differs from the listing")
        chunk = parse_chunk(data)
        foreign = self._foreign(chunk)
        if foreign is not None:
            raise IdentityMismatch(f"chunk {seq} {foreign}")
        return data, chunk

    def _keep_verified(self, seq: int, data: bytes) -> None:
        self.verified[seq] = data
        self.verified_bytes += len(data)
        while self.verified_bytes > self.buffer_bytes and self.verified:
            _, evicted = self.verified.popitem(last=False)
            self.verified_bytes -= len(evicted)

    async def resolve(self, listings: Mapping[str, LogListing]) -> Resolution:
        """Rule 3 on verified copies: the chain of kept chunks, with damaged links where a
        committed chunk has no valid copy (see "Damage versus a torn tail")."""
        listed = resolve(listings)
        trim_seq, seals = listed.trim_seq, listed.seals
        candidates: dict[int, list[tuple[str, ChunkInfo]]] = {}
        for name, listing in sorted(listings.items()):
            for seq, chunk in listing.chunks.items():
                if seq > trim_seq and not any(seal.invalidates(chunk) for seal in seals):
                    candidates.setdefault(seq, []).append((name, chunk))
        committed_through = max((seal.end_seq for seal in seals), default=0)
        verified: dict[int, ChainLink] = {}
        failed: dict[int, str] = {}
        self.verified.clear()
        self.verified_bytes = 0
        self.bad_copies = {}
        self.markers = {}
        unreachable: dict[int, str] = {}
        slots = asyncio.Semaphore(self.verify_parallelism)

        async def verify(seq: int) -> None:
            nonlocal committed_through
            groups: dict[tuple[int, int, int], list[str]] = {}
            for name, chunk in candidates[seq]:
                groups.setdefault((chunk.epoch, chunk.crc, chunk.size), []).append(name)
            order = sorted(groups, key=lambda key: (-key[0], -len(groups[key]), key[1]))
            problems: dict[str, str] = {}
            transient: list[str] = []
            async with slots:
                for epoch, crc, size in order:
                    for name in groups[(epoch, crc, size)]:
                        try:
                            data, decoded = await self.read_verified(name, seq, crc)
                        except (CorruptionError, NotFound) as exc:
                            problems[name] = str(exc)
                            continue
                        except WalstreamError as exc:
                            problems[name] = str(exc)
                            transient.append(name)
                            continue
                        holders = tuple(
                            holder
                            for holder in groups[(epoch, crc, size)]
                            if holder not in problems
                        )
                        verified[seq] = ChainLink(
                            seq,
                            epoch,
                            size,
                            crc,
                            holders,
                            damage=decoded.damage,
                            marker=decoded.damage is not None,
                        )
                        committed_through = max(committed_through, decoded.acked_through)
                        self._keep_verified(seq, data)
                        break
                    if seq in verified:
                        break
            for name in problems:
                if name not in transient:
                    self.bad_copies.setdefault(name, set()).add(seq)
            detail = "; ".join(f"{name}: {problem}" for name, problem in sorted(problems.items()))
            if seq in verified:
                if problems:
                    log.warning(
                        "quorum WAL %s: chunk %d is damaged on %s; repairing it from %s",
                        self.log_id,
                        seq,
                        detail,
                        verified[seq].holders,
                    )
            elif transient:
                unreachable[seq] = (
                    f"quorum WAL {self.log_id}: no copy of chunk {seq} could be verified and "
                    f"{', '.join(sorted(transient))} did not answer ({detail}); recovery cannot "
                    "tell damage from an unreachable replica, retry when it is up"
                )
            else:
                failed[seq] = detail

        await asyncio.gather(*(verify(seq) for seq in sorted(candidates)))
        if unreachable:
            raise BackendUnavailable(unreachable[min(unreachable)])
        chain: list[ChainLink] = []
        last_listed = max(candidates, default=trim_seq)
        for seq in range(trim_seq + 1, max(last_listed, committed_through) + 1):
            link = verified.get(seq)
            if link is not None:
                chain.append(link)
                continue
            listed_by = [name for name, _ in candidates.get(seq, [])]
            if seq > committed_through and len(listed_by) < self.write_quorum:
                break  # the uncertain window: never acknowledged, dropped with what follows
            absent = sorted(name for name in listings if name not in listed_by)
            reason = failed.get(seq, "")
            if absent:
                reason = "; ".join(filter(None, [reason, f"absent on {', '.join(absent)}"]))
            evidence = (
                f"committed through chunk {committed_through}"
                if seq <= committed_through
                else f"listed by {len(listed_by)} >= W={self.write_quorum} replicas"
            )
            size = max((chunk.size for _, chunk in candidates.get(seq, [])), default=0)
            chain.append(
                ChainLink(
                    seq,
                    0,
                    size,
                    0,
                    (),
                    damage=f"chunk {seq} has no valid copy on the replicas read ({reason}) "
                    f"although it was committed ({evidence})",
                )
            )
        complete = [name for name, listing in listings.items() if not listing.incomplete]
        if len(complete) < self.replica_count - self.write_quorum + 1:
            # Too few replicas can vouch for the end of the log: an acknowledged chunk may have
            # lived only on the replicas that lost data. Record that durably as a marker chunk
            # (written by settle like a repair), so every later recovery reports it too.
            lost = sorted(name for name in listings if name not in complete)
            seq = chain[-1].seq + 1 if chain else trim_seq + 1
            reason = (
                f"replicas {', '.join(lost)} lost data they held (truncated or damaged files) and "
                f"only {len(complete)} intact replicas were read (a write quorum of "
                f"{self.write_quorum} needs {self.replica_count - self.write_quorum + 1}): "
                f"acknowledged records after chunk {seq - 1} may be lost"
            )
            data = encode_damage_marker(reason, identity=self.identity, acked_through=seq - 1)
            self.markers[seq] = data
            chain.append(
                ChainLink(seq, 0, len(data), chunk_crc(data), (), damage=reason, marker=True)
            )
        for link in chain:
            if link.damage:
                log.error("quorum WAL %s: %s", self.log_id, link.damage)
        return Resolution(trim_seq, listed.trim_offset, seals, tuple(chain))

    async def settle(
        self, resolution: Resolution, listings: Mapping[str, LogListing], epoch: int
    ) -> None:
        """Make recovery's decision durable before anything is returned (rule 4)."""
        for link in resolution.chain:
            if (link.damage and not link.marker) or len(link.holders) >= self.write_quorum:
                continue
            data = self.markers.get(link.seq) or await self.read_link(link)
            lacking = [name for name in listings if name not in link.holders]
            seq = link.seq
            written = await self.fanout.on_replicas(
                f"repair chunk {seq}",
                lambda replica, data=data, seq=seq: replica.write_chunk(  # type: ignore[misc]
                    self.log_id, epoch, seq, data
                ),
                self.write_quorum - len(link.holders),
                names=lacking,
            )
            log.info("quorum WAL %s: repaired chunk %d to %s", self.log_id, seq, sorted(written))
        sealed = await self.fanout.on_replicas(
            "seal",
            lambda replica: replica.seal(self.log_id, epoch, resolution.end_seq),
            self.write_quorum,
        )
        log.info(
            "quorum WAL %s: epoch %d sealed at chunk %d on %s",
            self.log_id,
            epoch,
            resolution.end_seq,
            sorted(sealed),
        )

    async def read_link(self, link: ChainLink) -> bytes:
        """The bytes of a kept chunk, from any replica holding them (verified)."""
        cached = self.verified.get(link.seq)
        if cached is not None:
            return cached
        errors: list[str] = []
        names = list(link.holders) + [
            name for name in self.fanout.states if name not in link.holders
        ]
        for name in names:
            try:
                data, _ = await self.read_verified(name, link.seq, link.crc)
                return data
            except WalstreamError as exc:
                errors.append(f"{name}: {exc}")
        raise BackendUnavailable(
            f"quorum WAL {self.log_id}: no replica could return chunk {link.seq} "
            f"({'; '.join(errors)}); bring a replica holding it back and retry"
        )
