"""The reference :class:`~walstream.wal.quorum.Replica` in process memory: the rules of the
contract in their plainest form, and the medium of core's own quorum tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from walstream.clock import Clock, SystemClock
from walstream.errors import BackendUnavailable, FencedError, NotFound, PreconditionFailed
from walstream.wal.quorum.chunk import LogIdentity, chunk_crc
from walstream.wal.quorum.replica import (
    MAX_SEALS,
    ChunkInfo,
    LogListing,
    Seal,
    identity_mismatch,
)

__all__ = ["MemoryReplica"]


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
    """A :class:`Replica` in process memory: the reference for its numbered rules and the medium of
    core's own quorum tests. ``available=False`` makes every call fail like a dead server and
    ``delay_s`` (on ``clock``) makes it slow."""

    def __init__(self, name: str, *, delay_s: float = 0.0, clock: Clock | None = None) -> None:
        self.name = name
        self.available = True
        self.delay_s = delay_s
        self.clock: Clock = clock or SystemClock()
        self.logs: dict[str, _MemoryLog] = {}

    async def _enter(self, log_id: str, epoch: int | None = None) -> _MemoryLog:
        if self.delay_s:
            await self.clock.sleep(self.delay_s)
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
