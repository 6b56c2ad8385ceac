"""The quorum WAL: :class:`QuorumWal` on N :class:`~walstream.wal.quorum.Replica` objects.

The protocol it follows, and why it is safe, is the doc of :mod:`walstream.wal.quorum`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Any

from walstream.clock import Clock
from walstream.errors import (
    BackendUnavailable,
    ConfigError,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    NotFound,
    WalstreamError,
)
from walstream.wal._waits import wait_tasks
from walstream.wal.contract import WalCapabilities, WalDamage, WalMode, WalOffset, WalRecord
from walstream.wal.group_commit import GroupCommitWal, PreparedGroup
from walstream.wal.quorum.chunk import (
    RECORDS_PER_CHUNK,
    LogIdentity,
    chunk_crc,
    chunk_offset,
    decode_chunk,
    encode_chunk,
    offset_seq,
)
from walstream.wal.quorum.fanout import Fanout, ReplicaState
from walstream.wal.quorum.options import write_quorum_of
from walstream.wal.quorum.recovery import Recovery
from walstream.wal.quorum.replica import (
    LogListing,
    Replica,
    Seal,
    identity_mismatch,
)
from walstream.wal.quorum.resolve import ChainLink, Resolution

__all__ = ["QuorumWal"]

log = logging.getLogger(__name__)


class QuorumWal(GroupCommitWal):
    """A :class:`~walstream.wal.WriteAheadLog` replicated to N :class:`Replica` objects.

    ``write_quorum`` (W) defaults to a majority. ``request_timeout_s`` bounds every single
    replica request; ``write_timeout_s`` bounds how long a chunk (or a claim, seal, trim) keeps
    retrying when fewer than the needed replicas answer, before the WAL gives up.
    ``catch_up_parallelism`` is how many chunks catch-up copies to a returning replica at once:
    a medium whose requests take milliseconds (an object store) needs several, or a busy writer
    outruns the replica it is trying to repair.
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
        catch_up_parallelism: int = 1,
        clock: Clock | None = None,
    ) -> None:
        self.verify_parallelism = 16
        """Chunks recovery reads back at once when it verifies the log at open."""
        replica_count = len(replicas)
        if replica_count == 0:
            raise ConfigError("a quorum WAL needs at least one replica")
        if len({replica.name for replica in replicas}) != replica_count:
            raise ConfigError("replica names must be distinct")
        write_quorum = write_quorum_of(write_quorum, replica_count)
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
        if catch_up_parallelism < 1:
            raise ConfigError(
                f"catch_up_parallelism must be at least 1, got {catch_up_parallelism}"
            )
        self.catch_up_parallelism = catch_up_parallelism
        self._fanout = Fanout(
            replicas,
            log_id=log_id,
            request_timeout_s=request_timeout_s,
            write_timeout_s=write_timeout_s,
            clock=self.clock,
        )
        self._replicas = self._fanout.states
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
        self._background = self._fanout.background
        self._identity: LogIdentity | None = None
        """Whose log this is; ``None`` when no deployment was bound (nothing is checked)."""
        self._node_id = 0
        self._damaged: dict[int, str] = {}
        """Committed seqs with no valid copy anywhere (reported by recover, never copied)."""
        self._recovery = Recovery(
            self._fanout,
            log_id=log_id,
            write_quorum=write_quorum,
            buffer_bytes=catchup_buffer_bytes,
            verify_parallelism=self.verify_parallelism,
        )

    # -- opening and recovery -------------------------------------------------------------------

    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        self._node_id = node_id
        identity = LogIdentity(self.deployment_id, node_id) if self.deployment_id else None
        self._identity = identity
        self._recovery.identity = identity
        self._recovery.verify_parallelism = self.verify_parallelism
        if mode is WalMode.READ_ONLY or identity is not None:
            listings = await self._fanout.on_replicas(
                "list", lambda replica: replica.list_chunks(self.log_id), self.read_quorum
            )
            # Before claiming anything: a read quorum meets every write quorum of the owner, so
            # a log of another deployment is refused here, and no replica that missed its claim
            # (and so records no identity yet) adopts ours.
            self._check_identities(listings, identity)
        if mode is not WalMode.READ_ONLY:
            listings = await self._fanout.on_replicas(
                "claim",
                lambda replica: replica.claim(self.log_id, node_epoch, identity),
                self.read_quorum,
            )
        self._check_identities(listings, identity)
        resolution = await self._recovery.resolve(listings)
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
        await self._recovery.settle(resolution, listings, self.node_epoch)
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
                self._recovery.verified.pop(link.seq, None)
                continue
            data = await self._recovery.read_link(link)
            self._recovery.verified.pop(link.seq, None)
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
        self._recovery.verified.clear()
        self._recovery.verified_bytes = 0
        if damage:
            # Committed chunks at the end with no valid copy: not a torn write (see the module
            # doc), so recovery says so instead of dropping them.
            end = chunk_offset(damage[-1].seq + 1, 0)
            yield WalRecord(end, b"", damage_before=report(end))

    # -- writing ----------------------------------------------------------------------------------

    def _prepare_group(self, payloads: Sequence[bytes]) -> PreparedGroup:
        if self._fanout.fenced is not None:
            raise self._fanout.fenced
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
        await self._fanout.on_replicas(
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

    def _check_identities(
        self, listings: dict[str, LogListing], identity: LogIdentity | None
    ) -> None:
        if identity is None:
            return
        for name, listing in sorted(listings.items()):
            if listing.identity is not None and listing.identity != identity:
                raise identity_mismatch(name, self.log_id, listing.identity, identity)

    # -- catching up lagging replicas -------------------------------------------------------------

    async def _catch_up_loop(self, state: ReplicaState) -> None:
        backoff_s = 0.05
        while not self._closed and self._fanout.fenced is None:
            if not state.lagging:
                state.wake.clear()
                await state.wake.wait()
                continue
            generation = state.generation
            try:
                await self._catch_up(state.replica)
            except FencedError as exc:
                self._fanout.fenced = exc
                return
            except IdentityMismatch as exc:
                log.error(
                    "quorum WAL %s: not catching up %s: %s", self.log_id, state.replica.name, exc
                )
                await self.clock.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            except WalstreamError as exc:
                log.debug("catch-up of %s failed: %s", state.replica.name, exc)
                await self.clock.sleep(backoff_s)
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
        listing = await self._fanout.bounded(replica.list_chunks(self.log_id))
        self._check_listing_identity(replica.name, listing)
        resolution = self._resolution
        own_seal = Seal(self.node_epoch, resolution.end_seq) if resolution else None
        if resolution is not None and own_seal not in listing.seals:
            await self._fanout.bounded(
                replica.seal(self.log_id, self.node_epoch, resolution.end_seq)
            )
        trim_seq, trim_offset = self._trim_seq, self._trim_offset
        if listing.trim_seq < trim_seq or listing.trim_offset < trim_offset:
            await self._fanout.bounded(
                replica.trim(self.log_id, self.node_epoch, trim_seq, trim_offset)
            )
        pending = iter(range(max(trim_seq, listing.trim_seq) + 1, self._acked_through + 1))
        failures: list[Exception] = []

        def next_missing() -> int | None:
            """The next seq the replica lacks; ``None`` when done, closed or after a failure."""
            for seq in pending:
                if self._closed or failures:
                    return None
                if seq <= self._trim_seq or seq in self._damaged:
                    continue  # trimmed meanwhile, or no valid copy anywhere (recovery reports it)
                if self._holds(replica.name, listing, seq):
                    self._chunk_written(seq, replica.name)
                    continue
                return seq
            return None

        async def copy_missing() -> None:
            while (seq := next_missing()) is not None:
                try:
                    data = self._chunk_cache.get(seq)
                    if data is None:
                        data = await self._read_from_peers(seq, replica.name)
                    await self._fanout.bounded(
                        replica.write_chunk(self.log_id, self.node_epoch, seq, data)
                    )
                except Exception as exc:  # the first failure stops every copier; raised below
                    failures.append(exc)
                    return
                self._copy_repaired(seq, replica.name)

        await asyncio.gather(*(copy_missing() for _ in range(self.catch_up_parallelism)))
        if failures:
            raise next((exc for exc in failures if isinstance(exc, FencedError)), failures[0])

    def _holds(self, name: str, listing: LogListing, seq: int) -> bool:
        """Whether replica ``name`` holds a good copy of ``seq`` as far as catch-up can tell."""
        stored = listing.chunks.get(seq)
        return (
            stored is not None
            and stored.crc == self._chunk_crcs.get(seq)
            and seq not in self._recovery.bad_copies.get(name, ())
        )

    def _copy_repaired(self, seq: int, name: str) -> None:
        self._recovery.bad_copies.get(name, set()).discard(seq)
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
                data, _ = await self._recovery.read_verified(name, seq, crc)
                return data
            except WalstreamError as exc:
                errors.append(f"{name}: {exc}")
        raise BackendUnavailable(f"chunk {seq} is readable from no peer ({'; '.join(errors)})")

    @property
    def replicas(self) -> list[Replica]:
        """The replicas, in the order they were given."""
        return [state.replica for state in self._replicas.values()]

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
        await self._fanout.on_replicas(
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
            _, still = await wait_tasks(self.clock, pending, min(1.0, self.request_timeout_s))
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
