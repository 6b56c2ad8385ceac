"""A write-ahead log replicated over N replicas with quorum writes (DESIGN §9).

This module holds everything about quorums that does not depend on the medium, so every quorum
WAL (local-disk chunk servers, zonal object-store buckets, ...) shares one protocol. A medium
implements :class:`Replica`; :class:`QuorumWal` builds the WAL on N of them.

Vocabulary
----------

- A **chunk** is one group-commit group: the records of concurrent appends packed together
  (:func:`encode_chunk`). Chunks are numbered by a **seq** that starts at 1 and grows by one per
  chunk, with no gaps. The WAL offset of record ``i`` of chunk ``seq`` is
  ``seq * RECORDS_PER_CHUNK + i`` (:func:`chunk_offset`), so offsets strictly increase.
- Every writer owns the log under an **epoch** (the node epoch). A replica remembers the highest
  epoch that *claimed* it and refuses requests of older epochs with :class:`FencedError`.
- A **seal** ``(epoch E, end_seq)`` is recovery's decision: "the chunks written before epoch E
  end at ``end_seq``". It invalidates every chunk of an epoch ``< E`` at a seq ``> end_seq``.

The protocol (N replicas, write quorum W, claim/read quorum ``R = max(N - W + 1, N // 2 + 1)``)
---------------------------------------------------------------------------------------------

1. *Write*: a chunk ``(E, seq)`` is sent to all N replicas in parallel; it is durable once W
   accepted it. Acknowledgements complete in seq order (:class:`GroupCommitWal`). A replica that
   fails or is slow does not hold the acknowledgement up while W others answer; it is marked
   *lagging* and a background catch-up copies what it misses when it answers again.
2. *Claim*: recovery at epoch E claims the log on at least R replicas. A claimed replica refuses
   every later request of an older epoch, so an old writer can reach at most ``N - R < W``
   replicas: it never gets another acknowledgement (fencing).
3. *Resolve*: the claim replies are listings of R replicas. Because ``R + W > N``, every chunk
   that was ever acknowledged appears in at least one of them. Starting after the trim point,
   recovery walks seq = trim+1, trim+2, ... and keeps a seq as long as some listing holds a
   *valid* chunk for it (one that no known seal invalidates); it stops at the first seq nobody
   holds. Acknowledgements are in order, so every acknowledged chunk lies in that prefix; chunks
   after the first hole were never acknowledged and are discarded.
4. *Settle*: before yielding anything, recovery copies every kept chunk that fewer than W of the
   listed replicas hold to the others (tagged with epoch E), then writes the seal
   ``(E, end_seq)`` to at least W replicas. Only then are records returned.
5. The new writer continues at ``end_seq + 1`` with epoch E; a replica replaces a chunk of an
   older epoch at the same seq (the seal already invalidated it).

Why two recoveries never disagree: a recovery returns records only after its kept chunks and its
seal sit on at least W replicas. Any later recovery reads R replicas, ``R + W > N``, so it sees
the seal and at least one copy of each kept chunk; the seal invalidates the chunks the first
recovery discarded (they all have an older epoch and a seq beyond ``end_seq``), so the walk
finds exactly the same chunks up to ``end_seq``. Two recoveries running at once cannot both
settle: each claims a majority, so the older one meets a replica claimed by the newer one and
cannot gather W acceptances for its repairs or its seal; it fails before returning anything.
The content at a (valid) seq is unique: a writer writes each seq once, a repair copies the chosen
content, and a new writer only writes seqs above its own seal.

Records whose append failed may be recovered or not (an ambiguous failure); after a recovery
decided to discard them, their offsets may be reused by the next writer, but acknowledged
offsets never repeat.

Identity (WAL invariant 12)
---------------------------

A WAL bound to a deployment (:meth:`~walstream.wal.WriteAheadLog.bind_deployment`) stamps every
chunk with a :class:`LogIdentity` (deployment id and node id, chunk format 2) and passes it to
``claim``. A replica records the identity of a log with its first identified claim and refuses
a claim with another identity with :class:`IdentityMismatch` *before* changing anything (a
misconfigured node must not fence another deployment's writer); listings report the recorded
identity, so a read-only open checks it too. A chunk whose identity differs from the WAL's is
treated like a damaged copy: it is never yielded nor copied. Chunks of format 1 and logs without
a recorded identity (written before identities existed, or by an unbound WAL) are accepted as
ours; an unbound WAL checks nothing, as before.

Damage versus a torn tail (WAL invariant 11)
--------------------------------------------

Listings say what a replica *claims* to hold; recovery trusts only bytes it read back and
verified (the chunk checksum, the listing's checksum, the identity). For every seq it tries the
listed copies, newest epoch first, until one verifies. A copy that fails is simply not a holder:
rule 4 repairs the chunk from the verified copy, so one bad copy is never a loss.

A seq with *no* verified copy among the replicas read is either a write that was in flight at a
crash (never acknowledged: dropping it is correct) or an acknowledged chunk whose every copy was
damaged (dropping it silently would break invariant 11). Recovery tells them apart by evidence
that the chunk was committed, and only by evidence:

- *Watermarks.* Every chunk of format 2 carries the writer's ``acked_through`` when the chunk
  was formed: the highest seq that it and all before it had reached W replicas. A verified
  chunk with watermark ``c`` proves every seq ``<= c`` was committed. The chunks that can be in
  flight at a crash are exactly those above the watermark of every later chunk (the writer had
  not yet seen them reach W), so this is the uncertain window and nothing outside it.
- *Seals.* A seal ``(E, end_seq)`` was written only after recovery E kept (or reported) every
  seq up to ``end_seq``: those seqs were committed.
- *Quorum listings.* A seq listed by at least W of the replicas read reached W replicas: a
  write that completes on W is committed by the protocol (any later recovery would keep it),
  and a per-replica write is atomic, so it cannot be a torn one.

A seq without a verified copy but with such evidence is **damage**: it becomes a damaged link
of the chain (nothing to repair from), recovery continues after it, and the first record
yielded after the damaged region carries ``damage_before`` naming the chunks, the replicas and
what failed on each. Damage with no valid record after it is reported by a pure damage report
(an empty record whose ``offset`` is the end of the damage). A seq without evidence ends the
chain, as before: it and everything after it lie in the uncertain window, no acknowledgement
can depend on them (acknowledgements complete in seq order) and the seal invalidates them.
The next writer continues after the damaged links, so they keep being reported (the evidence
stays: later chunks' watermarks and the seal) until a trim passes them.

A replica that lost data it once held (a chunk server that found a segment file shorter than
it wrote it) says so in its listings (``incomplete``) until its log is sealed again. Absence on
such a replica proves nothing. When fewer than ``N - W + 1`` intact replicas were read, an
acknowledged chunk at the end of the log may have lived only on the replicas that lost data, so
the end of the log is itself uncertain *and not because of a crash*: recovery appends a **damage
marker** (a chunk without records that carries the reason, format 0xC3) after its chain and
settles it like a repair. The marker is reported as damage (a pure damage report at the end)
by this and every later recovery, until a trim passes it.

A replica that cannot answer a read is not evidence of anything: when a seq has no verified
copy and some replica failed for a reason other than bad or missing bytes, recovery fails with
:class:`BackendUnavailable` instead of guessing.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import crc32c

from walstream.clock import Clock
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    ConfigError,
    CorruptionError,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)
from walstream.format.frames import (
    CRC_BYTES,
    TableErrors,
    crc_trailer_ok,
    decode_record_table,
    encode_record_table,
    with_crc,
)
from walstream.records import DEPLOYMENT_ID_BYTES
from walstream.wal.contract import WalCapabilities, WalDamage, WalMode, WalOffset, WalRecord
from walstream.wal.group_commit import GroupCommitWal, PreparedGroup

__all__ = [
    "MAX_SEALS",
    "RECORDS_PER_CHUNK",
    "ChainLink",
    "Chunk",
    "ChunkInfo",
    "LogIdentity",
    "LogListing",
    "MemoryReplica",
    "QuorumWal",
    "Replica",
    "Resolution",
    "Seal",
    "chunk_crc",
    "chunk_offset",
    "decode_chunk",
    "encode_chunk",
    "encode_damage_marker",
    "identity_mismatch",
    "offset_seq",
    "parse_chunk",
    "quorum_wal_options",
    "resolve",
]

log = logging.getLogger(__name__)

#: WAL offset of record ``i`` in chunk ``seq`` is ``seq * RECORDS_PER_CHUNK + i``.
RECORDS_PER_CHUNK = 1 << 24
#: Seals a replica keeps per log (one per recovery); the oldest are forgotten beyond this.
MAX_SEALS = 4096

CHUNK_MAGIC = 0xC1
"""Chunk format 1: ``magic | count | records | crc`` (no identity, no watermark); still read."""
CHUNK_MAGIC_V2 = 0xC2
"""Chunk format 2: adds the writer's identity and its acknowledgement watermark."""
DAMAGE_MARKER_MAGIC = 0xC3
"""A damage marker: a chunk without records that recovery writes where it found that
acknowledged records may be lost (its reason is reported by every later recovery)."""
_CHUNK_HEAD = struct.Struct(">BI")
_CHUNK_HEAD_V2 = struct.Struct(f">B{DEPLOYMENT_ID_BYTES}sQQI")
#: The deployment id of a chunk written by a WAL that was bound to no deployment.
NO_DEPLOYMENT = bytes(DEPLOYMENT_ID_BYTES)

T = TypeVar("T")


def chunk_offset(seq: int, index: int) -> WalOffset:
    return seq * RECORDS_PER_CHUNK + index


def offset_seq(offset: WalOffset) -> int:
    return offset // RECORDS_PER_CHUNK


def chunk_crc(data: bytes) -> int:
    return crc32c.crc32c(data)


@dataclass(frozen=True, slots=True)
class LogIdentity:
    """Whose log it is: the deployment id (16 bytes) and the node id the WAL was started for."""

    deployment_id: bytes
    node_id: int

    def describe(self) -> str:
        return f"deployment {self.deployment_id.hex()} node {self.node_id}"


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
class Chunk:
    """A decoded chunk. ``identity`` is ``None`` for format 1 and for chunks of an unbound WAL;
    ``acked_through`` (0 for format 1) is the writer's watermark when it formed the chunk."""

    records: list[bytes]
    identity: LogIdentity | None = None
    acked_through: int = 0
    damage: str | None = None
    """Set for a damage marker: what recovery found lost there."""


def encode_damage_marker(
    reason: str, *, identity: LogIdentity | None = None, acked_through: int = 0
) -> bytes:
    """``magic 0xC3 u8 | deployment_id 16 | node_id u64 | acked_through u64 | len u32 |
    reason utf-8 | crc32c u32``."""
    deployment_id, node_id = (
        (identity.deployment_id, identity.node_id) if identity else (NO_DEPLOYMENT, 0)
    )
    raw = reason.encode()
    return with_crc(
        _CHUNK_HEAD_V2.pack(DAMAGE_MARKER_MAGIC, deployment_id, node_id, acked_through, len(raw)),
        raw,
    )


def encode_chunk(
    payloads: Sequence[bytes],
    *,
    identity: LogIdentity | None = None,
    acked_through: int = 0,
    version: int = 2,
) -> bytes:
    """Format 2: ``magic 0xC2 u8 | deployment_id 16 | node_id u64 | acked_through u64 |
    count u32 | (len u32 | bytes)* | crc32c u32`` (big-endian, CRC over everything before it).
    Format 1 (``version=1``, what older writers wrote): ``magic 0xC1 u8 | count u32 | records |
    crc32c u32``. Without an identity, format 2 stores the all-zero deployment id. The record
    table and the CRC trailer are :mod:`walstream.format.frames`'."""
    if version == 1:
        head = _CHUNK_HEAD.pack(CHUNK_MAGIC, len(payloads))
    elif version == 2:
        deployment_id, node_id = (
            (identity.deployment_id, identity.node_id) if identity else (NO_DEPLOYMENT, 0)
        )
        if len(deployment_id) != DEPLOYMENT_ID_BYTES:
            raise InvalidArgument(f"a deployment id has {DEPLOYMENT_ID_BYTES} bytes")
        head = _CHUNK_HEAD_V2.pack(
            CHUNK_MAGIC_V2, deployment_id, node_id, acked_through, len(payloads)
        )
    else:
        raise InvalidArgument(f"unknown chunk format version {version}")
    return with_crc(head, encode_record_table(payloads))


_CHUNK_TABLE_ERRORS = TableErrors(
    length_overrun="chunk record header overruns the chunk",
    payload_overrun="chunk record overruns the chunk",
    trailing="chunk has trailing bytes",
)


def parse_chunk(data: bytes) -> Chunk:
    """Decode a chunk of format 1 or 2; :class:`CorruptionError` when any byte is off."""
    if len(data) < _CHUNK_HEAD.size + CRC_BYTES:
        raise CorruptionError(f"chunk of {len(data)} bytes is too short")
    if not crc_trailer_ok(data):
        raise CorruptionError("chunk checksum mismatch")
    body = data[:-CRC_BYTES]
    magic = body[0]
    identity: LogIdentity | None = None
    acked_through = 0
    if magic == CHUNK_MAGIC:
        _, count = _CHUNK_HEAD.unpack_from(body, 0)
        position = _CHUNK_HEAD.size
    elif magic in (CHUNK_MAGIC_V2, DAMAGE_MARKER_MAGIC):
        if len(body) < _CHUNK_HEAD_V2.size:
            raise CorruptionError("chunk header overruns the chunk")
        _, deployment_id, node_id, acked_through, count = _CHUNK_HEAD_V2.unpack_from(body, 0)
        if deployment_id != NO_DEPLOYMENT:
            identity = LogIdentity(deployment_id, node_id)
        position = _CHUNK_HEAD_V2.size
        if magic == DAMAGE_MARKER_MAGIC:
            if position + count != len(body):
                raise CorruptionError("damage marker length mismatch")
            reason = body[position:].decode(errors="replace")
            return Chunk([], identity, acked_through, damage=reason)
    else:
        raise CorruptionError(f"bad chunk magic 0x{magic:02x}")
    records = decode_record_table(body, count, _CHUNK_TABLE_ERRORS, start=position)
    return Chunk(records, identity, acked_through)


def decode_chunk(data: bytes) -> list[bytes]:
    """The records of a chunk; :class:`CorruptionError` when any byte is off."""
    return parse_chunk(data).records


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


# -- a reference replica in memory -------------------------------------------------------------


@dataclass
class _MemoryLog:
    claimed_epoch: int = 0
    trim_seq: int = 0
    trim_offset: int = -1
    seals: list[Seal] = field(default_factory=list)
    chunks: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    identity: LogIdentity | None = None
    incomplete: bool = False
    """Set by tests to play a replica that lost data; cleared by the next seal."""


class MemoryReplica:
    """A :class:`Replica` in process memory: the reference for the rules above and the medium of
    core's own quorum tests. ``available=False`` makes every call fail like a dead server and
    ``delay_s`` makes it slow."""

    def __init__(self, name: str, *, delay_s: float = 0.0) -> None:
        self.name = name
        self.available = True
        self.delay_s = delay_s
        self.logs: dict[str, _MemoryLog] = {}

    async def _enter(self, log_id: str, epoch: int | None = None) -> _MemoryLog:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if not self.available:
            raise BackendUnavailable(f"replica {self.name} is unreachable; retry later")
        state = self.logs.setdefault(log_id, _MemoryLog())
        if epoch is not None:
            if epoch < state.claimed_epoch:
                raise FencedError(
                    f"replica {self.name}: log {log_id} is owned by epoch {state.claimed_epoch}"
                    f" > {epoch}"
                )
            state.claimed_epoch = epoch
        return state

    def _listing(self, state: _MemoryLog) -> LogListing:
        return LogListing(
            state.claimed_epoch,
            state.trim_seq,
            state.trim_offset,
            tuple(state.seals),
            {
                seq: ChunkInfo(seq, epoch, len(data), chunk_crc(data))
                for seq, (epoch, data) in state.chunks.items()
            },
            state.identity,
            state.incomplete,
        )

    async def claim(
        self, log_id: str, epoch: int, identity: LogIdentity | None = None
    ) -> LogListing:
        if identity is not None:
            state = await self._enter(log_id)
            if state.identity is not None and state.identity != identity:
                raise identity_mismatch(self.name, log_id, state.identity, identity)
            state.identity = identity
        return self._listing(await self._enter(log_id, epoch))

    async def list_chunks(self, log_id: str) -> LogListing:
        return self._listing(await self._enter(log_id))

    async def write_chunk(self, log_id: str, epoch: int, seq: int, data: bytes) -> None:
        state = await self._enter(log_id, epoch)
        if seq <= state.trim_seq:
            return
        existing = state.chunks.get(seq)
        if existing is not None and existing[0] == epoch and existing[1] != data:
            raise PreconditionFailed(f"replica {self.name}: chunk {seq} of epoch {epoch} differs")
        state.chunks[seq] = (epoch, bytes(data))

    async def read_chunk(self, log_id: str, seq: int) -> tuple[int, bytes]:
        state = await self._enter(log_id)
        try:
            return state.chunks[seq]
        except KeyError:
            raise NotFound(f"replica {self.name}: no chunk {seq} in log {log_id}") from None

    async def seal(self, log_id: str, epoch: int, end_seq: int) -> None:
        state = await self._enter(log_id, epoch)
        seal = Seal(epoch, end_seq)
        state.incomplete = False
        if seal not in state.seals:
            state.seals = sorted([*state.seals, seal])[-MAX_SEALS:]
        for seq, (chunk_epoch, data) in list(state.chunks.items()):
            if seal.invalidates(ChunkInfo(seq, chunk_epoch, len(data), 0)):
                del state.chunks[seq]

    async def trim(self, log_id: str, epoch: int, through_seq: int, trim_offset: int) -> None:
        state = await self._enter(log_id, epoch)
        state.trim_seq = max(state.trim_seq, through_seq)
        state.trim_offset = max(state.trim_offset, trim_offset)
        for seq in [seq for seq in state.chunks if seq <= state.trim_seq]:
            del state.chunks[seq]

    def healthy(self) -> bool:
        return self.available

    async def close(self) -> None:
        return None


# -- resolving the log from a quorum of listings ----------------------------------------------


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
    """The deterministic resolution of the log from replica listings alone (rule 3 of the module
    doc), trusting every listed copy. :class:`QuorumWal` refines it by reading the copies back
    (see "Damage versus a torn tail")."""
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


# -- the WAL ----------------------------------------------------------------------------------


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


@dataclass
class _ReplicaState:
    replica: Replica
    lagging: bool = False
    """Something may be missing on this replica; the catch-up task will fix it."""
    generation: int = 0
    """Bumped at every failure, so catch-up knows whether it raced with a new one."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class QuorumWal(GroupCommitWal):
    """A :class:`~walstream.wal.WriteAheadLog` replicated to N :class:`Replica` objects.

    ``write_quorum`` (W) defaults to a majority. ``request_timeout_s`` bounds every single
    replica request; ``write_timeout_s`` bounds how long a chunk (or a claim, seal, trim) keeps
    retrying when fewer than the needed replicas answer, before the WAL gives up.
    """

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        log_id: str,
        write_quorum: int | None = None,
        request_timeout_s: float = 2.0,
        write_timeout_s: float = 10.0,
        max_chunk_bytes: int = 1 << 20,
        max_chunk_delay_s: float = 0.002,
        max_inflight: int = 8,
        max_record_bytes: int = 8 << 20,
        catchup_buffer_bytes: int = 64 << 20,
        clock: Clock | None = None,
    ) -> None:
        self.verify_parallelism = 16
        """Chunks recovery reads back at once when it verifies the log at open."""
        replica_count = len(replicas)
        if replica_count == 0:
            raise ConfigError("a quorum WAL needs at least one replica")
        if len({replica.name for replica in replicas}) != replica_count:
            raise ConfigError("replica names must be distinct")
        write_quorum = write_quorum if write_quorum is not None else replica_count // 2 + 1
        if not 1 <= write_quorum <= replica_count:
            raise ConfigError(
                f"write_quorum must be between 1 and the {replica_count} replicas, "
                f"got {write_quorum}"
            )
        super().__init__(
            capabilities=WalCapabilities(
                max_record_bytes=max_record_bytes,
                capacity_bytes=None,
                supports_failover=True,
                survives_process_kill=True,
                survives_power_loss=True,
                shared_between_processes=True,
                checks_identity=True,
                reports_damage=True,
                extra={"replicas": replica_count, "write_quorum": write_quorum},
            ),
            max_group_bytes=max_chunk_bytes,
            max_group_delay_s=max_chunk_delay_s,
            max_inflight=max_inflight,
            clock=clock,
        )
        self.log_id = log_id
        self.replica_count = replica_count
        self.write_quorum = write_quorum
        self.read_quorum = max(replica_count - write_quorum + 1, replica_count // 2 + 1)
        self.request_timeout_s = request_timeout_s
        self.write_timeout_s = write_timeout_s
        self.catchup_buffer_bytes = catchup_buffer_bytes
        self._replicas = {replica.name: _ReplicaState(replica) for replica in replicas}
        self._resolution: Resolution | None = None
        self._next_seq = 1
        self._acked_through = 0
        """Highest seq such that it and all before it reached the write quorum."""
        self._quorum_done: set[int] = set()
        self._trim_seq = 0
        self._trim_offset = -1
        self._last_offset = -1
        self._chunk_records: dict[int, int] = {}
        self._chunk_cache: OrderedDict[int, bytes] = OrderedDict()
        self._chunk_cache_bytes = 0
        self._chunk_holders: dict[int, set[str]] = {}
        self._chunk_crcs: dict[int, int] = {}
        """CRC of every untrimmed chunk this writer knows (recovered or written)."""
        self._background: set[asyncio.Task[Any]] = set()
        self._fenced: FencedError | None = None
        self._identity: LogIdentity | None = None
        """Whose log this is; ``None`` when no deployment was bound (nothing is checked)."""
        self._node_id = 0
        self._verified: OrderedDict[int, bytes] = OrderedDict()
        """Chunks recovery read and verified at open, kept (bounded) for settle and recover."""
        self._verified_bytes = 0
        self._damaged: dict[int, str] = {}
        """Committed seqs with no valid copy anywhere (reported by recover, never copied)."""
        self._markers: dict[int, bytes] = {}
        """Damage markers this recovery made, for settle to write."""
        self._bad_copies: dict[str, set[int]] = {}
        """Seqs whose copy on a replica failed verification at recovery: catch-up rewrites them
        even when the listing looks right."""

    # -- opening and recovery -------------------------------------------------------------------

    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        self._node_id = node_id
        identity = LogIdentity(self.deployment_id, node_id) if self.deployment_id else None
        self._identity = identity
        if mode is WalMode.READ_ONLY or identity is not None:
            listings = await self._on_replicas(
                "list", lambda replica: replica.list_chunks(self.log_id), self.read_quorum
            )
            # Before claiming anything: a read quorum meets every write quorum of the owner, so
            # a log of another deployment is refused here, and no replica that missed its claim
            # (and so records no identity yet) adopts ours.
            self._check_identities(listings, identity)
        if mode is not WalMode.READ_ONLY:
            listings = await self._on_replicas(
                "claim",
                lambda replica: replica.claim(self.log_id, node_epoch, identity),
                self.read_quorum,
            )
        self._check_identities(listings, identity)
        resolution = await self._resolve(listings)
        self._resolution = resolution
        self._trim_seq, self._trim_offset = resolution.trim_seq, resolution.trim_offset
        self._next_seq = resolution.end_seq + 1
        self._acked_through = resolution.end_seq
        self._last_offset = max(chunk_offset(self._next_seq, 0) - 1, resolution.trim_offset)
        self._chunk_crcs = {
            link.seq: link.crc for link in resolution.chain if link.marker or not link.damage
        }
        self._damaged = {
            link.seq: link.damage for link in resolution.chain if link.damage and not link.marker
        }
        if mode is WalMode.READ_ONLY:
            return
        await self._settle(resolution, listings)
        for state in self._replicas.values():
            if state.replica.name not in listings or any(
                state.replica.name not in link.holders
                for link in resolution.chain
                if link.marker or not link.damage
            ):
                state.lagging = True
                state.wake.set()
        if mode is WalMode.READ_WRITE:
            for state in self._replicas.values():
                state.task = asyncio.create_task(
                    self._catch_up_loop(state), name=f"quorum-catchup-{state.replica.name}"
                )

    def _foreign(self, chunk: Chunk) -> str | None:
        """Why ``chunk`` is not ours (invariant 12), or ``None``."""
        if self._identity is None or chunk.identity is None or chunk.identity == self._identity:
            return None
        return f"belongs to {chunk.identity.describe()}, not {self._identity.describe()}"

    async def _read_verified(self, name: str, seq: int, crc: int) -> tuple[bytes, Chunk]:
        """Read chunk ``seq`` from replica ``name`` and verify it against the listed ``crc``,
        its own checksum and the identity; :class:`CorruptionError` when any check fails."""
        replica = self._replicas[name].replica
        _, data = await self._bounded(replica.read_chunk(self.log_id, seq))
        if chunk_crc(data) != crc:
            raise CorruptionError(f"chunk {seq} differs from the listing")
        chunk = parse_chunk(data)
        foreign = self._foreign(chunk)
        if foreign is not None:
            raise IdentityMismatch(f"chunk {seq} {foreign}")
        return data, chunk

    def _keep_verified(self, seq: int, data: bytes) -> None:
        self._verified[seq] = data
        self._verified_bytes += len(data)
        while self._verified_bytes > self.catchup_buffer_bytes and self._verified:
            _, evicted = self._verified.popitem(last=False)
            self._verified_bytes -= len(evicted)

    async def _resolve(self, listings: Mapping[str, LogListing]) -> Resolution:
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
        self._verified.clear()
        self._verified_bytes = 0
        self._bad_copies = {}
        self._markers = {}
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
                            data, decoded = await self._read_verified(name, seq, crc)
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
                    self._bad_copies.setdefault(name, set()).add(seq)
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
            data = encode_damage_marker(reason, identity=self._identity, acked_through=seq - 1)
            self._markers[seq] = data
            chain.append(
                ChainLink(seq, 0, len(data), chunk_crc(data), (), damage=reason, marker=True)
            )
        for link in chain:
            if link.damage:
                log.error("quorum WAL %s: %s", self.log_id, link.damage)
        return Resolution(trim_seq, listed.trim_offset, seals, tuple(chain))

    async def _settle(self, resolution: Resolution, listings: Mapping[str, LogListing]) -> None:
        """Make recovery's decision durable before anything is returned (rule 4)."""
        for link in resolution.chain:
            if (link.damage and not link.marker) or len(link.holders) >= self.write_quorum:
                continue
            data = self._markers.get(link.seq) or await self._read_link(link)
            lacking = [name for name in listings if name not in link.holders]
            seq = link.seq
            written = await self._on_replicas(
                f"repair chunk {seq}",
                lambda replica, data=data, seq=seq: replica.write_chunk(  # type: ignore[misc]
                    self.log_id, self.node_epoch, seq, data
                ),
                self.write_quorum - len(link.holders),
                names=lacking,
            )
            log.info("quorum WAL %s: repaired chunk %d to %s", self.log_id, seq, sorted(written))
        sealed = await self._on_replicas(
            "seal",
            lambda replica: replica.seal(self.log_id, self.node_epoch, resolution.end_seq),
            self.write_quorum,
        )
        log.info(
            "quorum WAL %s: epoch %d sealed at chunk %d on %s",
            self.log_id,
            self.node_epoch,
            resolution.end_seq,
            sorted(sealed),
        )

    async def _read_link(self, link: ChainLink) -> bytes:
        """The bytes of a kept chunk, from any replica holding them (verified)."""
        cached = self._verified.get(link.seq)
        if cached is not None:
            return cached
        errors: list[str] = []
        names = list(link.holders) + [name for name in self._replicas if name not in link.holders]
        for name in names:
            try:
                data, _ = await self._read_verified(name, link.seq, link.crc)
                return data
            except WalstreamError as exc:
                errors.append(f"{name}: {exc}")
        raise BackendUnavailable(
            f"quorum WAL {self.log_id}: no replica could return chunk {link.seq} "
            f"({'; '.join(errors)}); bring a replica holding it back and retry"
        )

    async def _recover(self) -> AsyncIterator[WalRecord]:
        resolution = self._resolution
        if resolution is None:
            return
        damage: list[ChainLink] = []

        def report(end: WalOffset) -> WalDamage:
            start = max(chunk_offset(damage[0].seq, 0), self._trim_offset + 1)
            reason = "; ".join(str(link.damage) for link in damage[:8])
            if len(damage) > 8:
                reason += f"; and {len(damage) - 8} more chunks up to {damage[-1].seq}"
            return WalDamage(start, end, sum(link.size for link in damage), reason)

        for link in resolution.chain:
            if link.damage:
                damage.append(link)
                self._verified.pop(link.seq, None)
                continue
            data = await self._read_link(link)
            self._verified.pop(link.seq, None)
            records = decode_chunk(data)
            self._chunk_records[link.seq] = len(records)
            if link is resolution.chain[-1]:
                self._last_offset = max(self._trim_offset, chunk_offset(link.seq, len(records) - 1))
            for index, record in enumerate(records):
                offset = chunk_offset(link.seq, index)
                if offset > self._trim_offset:
                    if damage:
                        yield WalRecord(offset, record, damage_before=report(offset))
                        damage = []
                    else:
                        yield WalRecord(offset, record)
        self._verified.clear()
        self._verified_bytes = 0
        if damage:
            # Committed chunks at the end with no valid copy: not a torn write (see the module
            # doc), so recovery says so instead of dropping them.
            end = chunk_offset(damage[-1].seq + 1, 0)
            yield WalRecord(end, b"", damage_before=report(end))

    # -- writing ----------------------------------------------------------------------------------

    def _prepare_group(self, payloads: Sequence[bytes]) -> PreparedGroup:
        if self._fenced is not None:
            raise self._fenced
        if len(payloads) >= RECORDS_PER_CHUNK:
            raise InvalidArgument(f"a chunk holds fewer than {RECORDS_PER_CHUNK} records")
        seq = self._next_seq
        self._next_seq += 1
        offsets = [chunk_offset(seq, index) for index in range(len(payloads))]
        self._last_offset = offsets[-1]
        self._chunk_records[seq] = len(payloads)
        data = encode_chunk(
            payloads,
            identity=self._identity,
            acked_through=self._acked_through,
        )
        self._chunk_crcs[seq] = chunk_crc(data)
        return PreparedGroup(offsets, list(payloads), state=(seq, data))

    async def _write_group(self, group: PreparedGroup) -> None:
        seq, data = group.state
        self._cache_chunk(seq, data)
        await self._on_replicas(
            f"write chunk {seq}",
            lambda replica: replica.write_chunk(self.log_id, self.node_epoch, seq, data),
            self.write_quorum,
            wait_all=False,
            on_success=lambda name: self._chunk_written(seq, name),
        )
        self._quorum_done.add(seq)
        while self._acked_through + 1 in self._quorum_done:
            self._acked_through += 1
            self._quorum_done.discard(self._acked_through)

    def _cache_chunk(self, seq: int, data: bytes) -> None:
        self._chunk_cache[seq] = data
        self._chunk_cache_bytes += len(data)
        # A replica down for long must not make the writer hold everything: beyond the bound,
        # catch-up reads the oldest chunks back from a healthy replica instead.
        while self._chunk_cache_bytes > self.catchup_buffer_bytes and len(self._chunk_cache) > 1:
            _, evicted = self._chunk_cache.popitem(last=False)
            self._chunk_cache_bytes -= len(evicted)

    def _drop_cached(self, seq: int) -> None:
        data = self._chunk_cache.pop(seq, None)
        if data is not None:
            self._chunk_cache_bytes -= len(data)
        self._chunk_holders.pop(seq, None)

    def _chunk_written(self, seq: int, name: str) -> None:
        holders = self._chunk_holders.setdefault(seq, set())
        holders.add(name)
        if len(holders) == self.replica_count:
            self._drop_cached(seq)

    # -- running one request on many replicas ----------------------------------------------------

    async def _bounded(self, call: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(call, self.request_timeout_s)
        except TimeoutError:
            raise AmbiguousError(
                f"replica request timed out after {self.request_timeout_s:g}s; it may have "
                "been applied"
            ) from None

    def _mark_lagging(self, name: str) -> None:
        state = self._replicas[name]
        state.generation += 1
        state.lagging = True
        state.wake.set()

    def _check_identities(
        self, listings: dict[str, LogListing], identity: LogIdentity | None
    ) -> None:
        if identity is None:
            return
        for name, listing in sorted(listings.items()):
            if listing.identity is not None and listing.identity != identity:
                raise identity_mismatch(name, self.log_id, listing.identity, identity)

    async def _on_replicas(
        self,
        what: str,
        request: Callable[[Replica], Awaitable[T]],
        needed: int,
        *,
        names: Sequence[str] | None = None,
        wait_all: bool = True,
        on_success: Callable[[str], None] | None = None,
    ) -> dict[str, T]:
        """Run ``request`` on the replicas (all, or ``names``) until ``needed`` succeeded.

        Replicas that fail are retried with backoff until ``write_timeout_s``; a
        :class:`FencedError` from any replica ends it at once. With ``wait_all`` the call also
        waits (bounded by the request timeout) for the other replicas' first answers, so
        recovery sees as many listings as are available; otherwise it returns at the quorum and
        the stragglers finish in the background.
        """
        targets = list(names) if names is not None else list(self._replicas)
        if needed <= 0:
            return {}
        if len(targets) < needed:
            raise BackendUnavailable(
                f"quorum WAL {self.log_id}: {what} needs {needed} replicas but only "
                f"{len(targets)} can take it; bring the missing chunk servers back"
            )
        results: dict[str, T] = {}
        errors: dict[str, WalstreamError] = {}
        running: dict[asyncio.Task[T], str] = {}
        deadline = self.clock.monotonic() + self.write_timeout_s
        backoff_s = 0.02
        retry_at: dict[str, float] = {}

        def launch(name: str) -> None:
            task = asyncio.ensure_future(self._bounded(request(self._replicas[name].replica)))
            running[task] = name

        def settle(task: asyncio.Task[T], name: str) -> None:
            if task.cancelled():
                return
            exc = task.exception()
            if exc is None:
                results[name] = task.result()
                errors.pop(name, None)
                if on_success is not None:
                    on_success(name)
            elif isinstance(exc, WalstreamError):
                errors[name] = exc
                if not isinstance(exc, FencedError | IdentityMismatch):
                    self._mark_lagging(name)
            else:
                errors[name] = AmbiguousError(f"{type(exc).__name__}: {exc}")
                self._mark_lagging(name)

        def finish_in_background(task: asyncio.Task[T], name: str) -> None:
            self._background.add(task)

            def done(finished: asyncio.Future[T]) -> None:
                self._background.discard(task)
                settle(task, name)
                if isinstance(errors.get(name), FencedError):
                    self._fenced = errors[name]  # type: ignore[assignment]

            task.add_done_callback(done)

        for name in targets:
            launch(name)
        try:
            while True:
                mismatch = next(
                    (exc for exc in errors.values() if isinstance(exc, IdentityMismatch)), None
                )
                if mismatch is not None:
                    # Another deployment's replica: retrying cannot help and nothing of ours
                    # may be written there.
                    raise mismatch
                if len(results) >= needed and (not wait_all or not running):
                    break
                fenced = next(
                    (exc for exc in errors.values() if isinstance(exc, FencedError)), None
                )
                if fenced is not None:
                    self._fenced = fenced
                    raise FencedError(
                        f"quorum WAL {self.log_id}: {what} refused, a newer epoch owns the log "
                        f"({fenced}); this writer must stop"
                    )
                now = self.clock.monotonic()
                idle = [name for name in targets if name not in results and name in errors]
                for name in idle:
                    if name not in running.values() and retry_at.get(name, 0.0) <= now:
                        if len(results) >= needed:
                            continue
                        launch(name)
                if not running:
                    if now >= deadline or not idle:
                        break
                    pending_retries = [retry_at.get(name, now) for name in idle]
                    await asyncio.sleep(max(0.0, min([*pending_retries, deadline]) - now))
                    continue
                done, _ = await asyncio.wait(
                    running, timeout=max(0.0, deadline - now), return_when=asyncio.FIRST_COMPLETED
                )
                if not done and self.clock.monotonic() >= deadline:
                    break
                for task in done:
                    name = running.pop(task)
                    settle(task, name)
                    if name in errors:
                        retry_at[name] = self.clock.monotonic() + backoff_s
                        backoff_s = min(backoff_s * 2, 0.5)
        finally:
            for task, name in running.items():
                finish_in_background(task, name)
        if len(results) < needed:
            detail = "; ".join(f"{name}: {exc}" for name, exc in sorted(errors.items()))
            reached = sorted(results)
            message = (
                f"quorum WAL {self.log_id}: {what} reached {len(reached)} of the {needed} "
                f"replicas it needs within {self.write_timeout_s:g}s ({detail or 'no answer'}); "
                "check that enough chunk servers are up"
            )
            if results or any(isinstance(exc, AmbiguousError) for exc in errors.values()):
                raise AmbiguousError(message)
            raise BackendUnavailable(message)
        return results

    # -- catching up lagging replicas -------------------------------------------------------------

    async def _catch_up_loop(self, state: _ReplicaState) -> None:
        backoff_s = 0.05
        while not self._closed and self._fenced is None:
            if not state.lagging:
                state.wake.clear()
                await state.wake.wait()
                continue
            generation = state.generation
            try:
                await self._catch_up(state.replica)
            except FencedError as exc:
                self._fenced = exc
                return
            except IdentityMismatch as exc:
                log.error(
                    "quorum WAL %s: not catching up %s: %s", self.log_id, state.replica.name, exc
                )
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            except WalstreamError as exc:
                log.debug("catch-up of %s failed: %s", state.replica.name, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            backoff_s = 0.05
            if state.generation == generation:
                state.lagging = False
                log.info("quorum WAL %s: replica %s caught up", self.log_id, state.replica.name)

    def _check_listing_identity(self, name: str, listing: LogListing) -> None:
        """Refuse to copy anything to a replica whose log belongs to someone else."""
        identity = self._identity
        if identity is not None and listing.identity is not None and listing.identity != identity:
            raise identity_mismatch(name, self.log_id, listing.identity, identity)

    async def _catch_up(self, replica: Replica) -> None:
        listing = await self._bounded(replica.list_chunks(self.log_id))
        self._check_listing_identity(replica.name, listing)
        resolution = self._resolution
        own_seal = Seal(self.node_epoch, resolution.end_seq) if resolution else None
        if resolution is not None and own_seal not in listing.seals:
            await self._bounded(replica.seal(self.log_id, self.node_epoch, resolution.end_seq))
        trim_seq, trim_offset = self._trim_seq, self._trim_offset
        if listing.trim_seq < trim_seq or listing.trim_offset < trim_offset:
            await self._bounded(replica.trim(self.log_id, self.node_epoch, trim_seq, trim_offset))
        for seq in range(max(trim_seq, listing.trim_seq) + 1, self._acked_through + 1):
            if self._closed:
                return
            if seq <= self._trim_seq or seq in self._damaged:
                continue
            if self._holds(replica.name, listing, seq):
                self._chunk_written(seq, replica.name)
                continue
            data = self._chunk_cache.get(seq)
            if data is None:
                data = await self._read_from_peers(seq, replica.name)
            await self._bounded(replica.write_chunk(self.log_id, self.node_epoch, seq, data))
            self._copy_repaired(seq, replica.name)

    def _holds(self, name: str, listing: LogListing, seq: int) -> bool:
        """Whether replica ``name`` holds a good copy of ``seq`` as far as catch-up can tell."""
        stored = listing.chunks.get(seq)
        return (
            stored is not None
            and stored.crc == self._chunk_crcs.get(seq)
            and seq not in self._bad_copies.get(name, ())
        )

    def _copy_repaired(self, seq: int, name: str) -> None:
        self._bad_copies.get(name, set()).discard(seq)
        self._chunk_written(seq, name)

    async def _read_from_peers(self, seq: int, exclude: str) -> bytes:
        errors: list[str] = []
        crc = self._chunk_crcs.get(seq)
        for name in self._replicas:
            if name == exclude:
                continue
            try:
                if crc is None:
                    raise NotFound(f"chunk {seq} is not known to this writer")
                data, _ = await self._read_verified(name, seq, crc)
                return data
            except WalstreamError as exc:
                errors.append(f"{name}: {exc}")
        raise BackendUnavailable(f"chunk {seq} is readable from no peer ({'; '.join(errors)})")

    def lagging_replicas(self) -> list[str]:
        """Names of replicas that may be missing chunks (catch-up pending)."""
        return sorted(name for name, state in self._replicas.items() if state.lagging)

    # -- trim, reset, close -----------------------------------------------------------------------

    async def _trim(self, offset: WalOffset) -> None:
        if offset > self._last_offset:
            raise InvalidArgument(
                f"trim({offset}) beyond the last offset {self._last_offset} of this WAL"
            )
        if offset <= self._trim_offset:
            return
        seq = offset_seq(offset)
        index = offset - chunk_offset(seq, 0)
        count = self._chunk_records.get(seq)
        through_seq = seq if count is not None and index >= count - 1 else seq - 1
        through_seq = min(through_seq, self._acked_through)
        await self._trim_to(max(through_seq, self._trim_seq), offset)

    async def _trim_to(self, through_seq: int, trim_offset: int) -> None:
        await self._on_replicas(
            "trim",
            lambda replica: replica.trim(self.log_id, self.node_epoch, through_seq, trim_offset),
            self.write_quorum,
            wait_all=False,
        )
        self._trim_seq = max(self._trim_seq, through_seq)
        self._trim_offset = max(self._trim_offset, trim_offset)
        for seq in [seq for seq in self._chunk_records if seq <= self._trim_seq]:
            del self._chunk_records[seq]
        for seq in [seq for seq in self._chunk_cache if seq <= self._trim_seq]:
            self._drop_cached(seq)
        for seq in [seq for seq in self._chunk_holders if seq <= self._trim_seq]:
            del self._chunk_holders[seq]
        for seq in [seq for seq in self._chunk_crcs if seq <= self._trim_seq]:
            del self._chunk_crcs[seq]
        for seq in [seq for seq in self._damaged if seq <= self._trim_seq]:
            del self._damaged[seq]

    async def _reset(self) -> None:
        end_seq = self._next_seq - 1
        if end_seq <= self._trim_seq and chunk_offset(self._next_seq, 0) - 1 <= self._trim_offset:
            return
        await self._trim_to(end_seq, chunk_offset(self._next_seq, 0) - 1)
        self._last_offset = max(self._last_offset, self._trim_offset)

    async def _close(self) -> None:
        tasks = [state.task for state in self._replicas.values() if state.task is not None]
        for state in self._replicas.values():
            state.wake.set()
        # Straggling writes and catch-up are bounded by the request timeout; give them a moment
        # so a slow replica still gets the tail, then stop.
        pending = [*tasks, *self._background]
        if pending:
            _, still = await asyncio.wait(pending, timeout=min(1.0, self.request_timeout_s))
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        for state in self._replicas.values():
            await state.replica.close()

    def describe(self) -> dict[str, Any]:
        return {
            "type": "quorum",
            "log_id": self.log_id,
            "replicas": {
                name: {"healthy": state.replica.healthy(), "lagging": state.lagging}
                for name, state in self._replicas.items()
            },
            "write_quorum": self.write_quorum,
            "next_seq": self._next_seq,
            "trim_offset": self._trim_offset,
        }
