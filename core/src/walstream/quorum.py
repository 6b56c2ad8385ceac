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

from .clock import Clock
from .errors import (
    AmbiguousError,
    BackendUnavailable,
    ConfigError,
    CorruptionError,
    FencedError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)
from .wal import GroupCommitWal, PreparedGroup, WalCapabilities, WalMode, WalOffset, WalRecord

__all__ = [
    "MAX_SEALS",
    "RECORDS_PER_CHUNK",
    "ChainLink",
    "ChunkInfo",
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
    "offset_seq",
    "quorum_wal_options",
    "resolve",
]

log = logging.getLogger(__name__)

#: WAL offset of record ``i`` in chunk ``seq`` is ``seq * RECORDS_PER_CHUNK + i``.
RECORDS_PER_CHUNK = 1 << 24
#: Seals a replica keeps per log (one per recovery); the oldest are forgotten beyond this.
MAX_SEALS = 4096

CHUNK_MAGIC = 0xC1
_CHUNK_HEAD = struct.Struct(">BI")
_U32 = struct.Struct(">I")

T = TypeVar("T")


def chunk_offset(seq: int, index: int) -> WalOffset:
    return seq * RECORDS_PER_CHUNK + index


def offset_seq(offset: WalOffset) -> int:
    return offset // RECORDS_PER_CHUNK


def chunk_crc(data: bytes) -> int:
    return crc32c.crc32c(data)


def encode_chunk(payloads: Sequence[bytes]) -> bytes:
    """``magic u8 | count u32 | (len u32 | bytes)* | crc32c u32`` (big-endian)."""
    parts = [_CHUNK_HEAD.pack(CHUNK_MAGIC, len(payloads))]
    for payload in payloads:
        parts.append(_U32.pack(len(payload)))
        parts.append(payload)
    body = b"".join(parts)
    return body + _U32.pack(crc32c.crc32c(body))


def decode_chunk(data: bytes) -> list[bytes]:
    """The records of a chunk; :class:`CorruptionError` when any byte is off."""
    if len(data) < _CHUNK_HEAD.size + 4:
        raise CorruptionError(f"chunk of {len(data)} bytes is too short")
    body, (crc,) = data[:-4], _U32.unpack_from(data, len(data) - 4)
    if crc32c.crc32c(body) != crc:
        raise CorruptionError("chunk checksum mismatch")
    magic, count = _CHUNK_HEAD.unpack_from(body, 0)
    if magic != CHUNK_MAGIC:
        raise CorruptionError(f"bad chunk magic 0x{magic:02x}")
    records: list[bytes] = []
    position = _CHUNK_HEAD.size
    for _ in range(count):
        if position + 4 > len(body):
            raise CorruptionError("chunk record header overruns the chunk")
        (length,) = _U32.unpack_from(body, position)
        position += 4
        if position + length > len(body):
            raise CorruptionError("chunk record overruns the chunk")
        records.append(body[position : position + length])
        position += length
    if position != len(body):
        raise CorruptionError("chunk has trailing bytes")
    return records


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
    """

    name: str

    async def claim(self, log_id: str, epoch: int) -> LogListing: ...

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
        )

    async def claim(self, log_id: str, epoch: int) -> LogListing:
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
    """The deterministic resolution of the log from replica listings (rule 3 of the module doc)."""
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

    # -- opening and recovery -------------------------------------------------------------------

    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        if mode is WalMode.READ_ONLY:
            listings = await self._on_replicas(
                "list", lambda replica: replica.list_chunks(self.log_id), self.read_quorum
            )
        else:
            listings = await self._on_replicas(
                "claim", lambda replica: replica.claim(self.log_id, node_epoch), self.read_quorum
            )
        resolution = resolve(listings)
        self._resolution = resolution
        self._trim_seq, self._trim_offset = resolution.trim_seq, resolution.trim_offset
        self._next_seq = resolution.end_seq + 1
        self._acked_through = resolution.end_seq
        self._last_offset = max(chunk_offset(self._next_seq, 0) - 1, resolution.trim_offset)
        self._chunk_crcs = {link.seq: link.crc for link in resolution.chain}
        if mode is WalMode.READ_ONLY:
            return
        await self._settle(resolution, listings)
        for state in self._replicas.values():
            if state.replica.name not in listings or any(
                state.replica.name not in link.holders for link in resolution.chain
            ):
                state.lagging = True
                state.wake.set()
        if mode is WalMode.READ_WRITE:
            for state in self._replicas.values():
                state.task = asyncio.create_task(
                    self._catch_up_loop(state), name=f"quorum-catchup-{state.replica.name}"
                )

    async def _settle(self, resolution: Resolution, listings: Mapping[str, LogListing]) -> None:
        """Make recovery's decision durable before anything is returned (rule 4)."""
        for link in resolution.chain:
            if len(link.holders) >= self.write_quorum:
                continue
            data = await self._read_link(link)
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
        errors: list[str] = []
        names = list(link.holders) + [name for name in self._replicas if name not in link.holders]
        for name in names:
            replica = self._replicas[name].replica
            try:
                _, data = await self._bounded(replica.read_chunk(self.log_id, link.seq))
                if chunk_crc(data) != link.crc:
                    raise CorruptionError(f"chunk {link.seq} differs from the listing")
                decode_chunk(data)
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
        for link in resolution.chain:
            data = await self._read_link(link)
            records = decode_chunk(data)
            self._chunk_records[link.seq] = len(records)
            if link is resolution.chain[-1]:
                self._last_offset = max(self._trim_offset, chunk_offset(link.seq, len(records) - 1))
            for index, record in enumerate(records):
                offset = chunk_offset(link.seq, index)
                if offset > self._trim_offset:
                    yield WalRecord(offset, record)

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
        data = encode_chunk(payloads)
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
                if not isinstance(exc, FencedError):
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
            except WalstreamError as exc:
                log.debug("catch-up of %s failed: %s", state.replica.name, exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            backoff_s = 0.05
            if state.generation == generation:
                state.lagging = False
                log.info("quorum WAL %s: replica %s caught up", self.log_id, state.replica.name)

    async def _catch_up(self, replica: Replica) -> None:
        listing = await self._bounded(replica.list_chunks(self.log_id))
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
            if seq <= self._trim_seq:
                continue
            stored = listing.chunks.get(seq)
            if stored is not None and stored.crc == self._chunk_crcs.get(seq):
                self._chunk_written(seq, replica.name)
                continue
            data = self._chunk_cache.get(seq)
            if data is None:
                data = await self._read_from_peers(seq, replica.name)
            await self._bounded(replica.write_chunk(self.log_id, self.node_epoch, seq, data))
            self._chunk_written(seq, replica.name)

    async def _read_from_peers(self, seq: int, exclude: str) -> bytes:
        errors: list[str] = []
        for name, state in self._replicas.items():
            if name == exclude:
                continue
            try:
                _, data = await self._bounded(state.replica.read_chunk(self.log_id, seq))
                decode_chunk(data)
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
