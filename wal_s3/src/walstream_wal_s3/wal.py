"""The S3 WAL: appends are batched into WAL objects in an S3 bucket (DESIGN §9).

Built on :class:`walstream.wal.GroupCommitWal`: concurrent appends are grouped into one object
(bounded by ``max_batch_bytes`` and ``max_batch_interval``; an idle WAL writes at once), up to
``max_inflight`` PUTs run concurrently and acknowledgements complete in append order.
A :data:`WalOffset` is a record sequence number.

Layout under ``<prefix>wal/<node_id>/``::

    epochs/<epoch>              epoch marker, created with If-None-Match: * (the fence)
    bases/<epoch>               first offset epoch <epoch> may write (written after its recovery)
    data/<first>-<last>-<epoch> WAL object holding records first..last (inclusive)
    trim/<start>                records below <start> are trimmed (the largest key wins)

(numbers zero-padded to 20 digits, so keys sort numerically).

**Fencing argument.** A writer of epoch ``e`` acknowledges a group only after (1) its PUT
completed and (2) a LIST of ``epochs/`` *started after* that PUT completed found no marker
newer than ``e``. A new owner (epoch ``f > e``, READ_WRITE restart or FAILOVER) first creates
``epochs/f`` and only then lists the data objects. S3 is strongly consistent for
read-after-write and list-after-write, so:

- if the old writer's check started after ``epochs/f`` was created, it sees the marker and
  fails with :class:`FencedError` — no acknowledgement;
- otherwise its PUT completed before the check, which started before ``epochs/f`` existed,
  which is before the new owner listed: the object is in the new owner's listing and its
  records are recovered.

So no record is acknowledged by a zombie after the new owner's fence, and every record it did
acknowledge is recovered. Objects of epoch ``e`` that land later (a PUT in flight when the
zombie paused) were never acknowledged; to keep them out of every later recovery, the new
owner writes ``bases/f`` = the first offset after the chain it recovered, and recovery ignores
an object of epoch ``e`` starting at or after ``bases/f`` for any ``f > e``.

**Recovery** reads the trim point (largest ``trim/`` key), drops objects excluded by a newer
epoch's base, then follows the contiguous chain of objects from the trim point (at equal first
offsets, the newer epoch wins) and stops at the first gap; records after a gap were never
acknowledged (acks are in order), and the next epoch's base makes them unreachable.

**Trim** writes ``trim/<start>`` first, then deletes the covered WAL objects, then the older
``trim/`` keys: the persisted trim point is never lost, and a crash in between leaves only
garbage that the next trim or start removes.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import crc32c
from walstream.clock import Clock
from walstream.errors import (
    CorruptionError,
    FencedError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)
from walstream.wal import (
    GroupCommitWal,
    PreparedGroup,
    WalCapabilities,
    WalMode,
    WalOffset,
    WalRecord,
)

from .objects import S3ObjectStore

__all__ = [
    "WAL_OBJECT_MAGIC",
    "S3Wal",
    "WalKeys",
    "WalObjectName",
    "decode_wal_object",
    "encode_wal_object",
]

log = logging.getLogger(__name__)

WAL_OBJECT_MAGIC = b"WSW1"
_HEADER = struct.Struct(">4sHHqqqIII")  # magic, version, flags, node, epoch, first, count,
_HEADER_CRC = struct.Struct(">I")  #        body_len, body_crc | header_crc
_HEADER_BYTES = _HEADER.size + _HEADER_CRC.size
_LENGTH = struct.Struct(">I")
_FORMAT_VERSION = 1
_RECOVERY_PREFETCH = 8


def encode_wal_object(
    node_id: int, epoch: int, first_offset: int, payloads: Sequence[bytes]
) -> bytes:
    """One WAL object: a CRC32C-protected header, then ``len u32 | data`` per record (body
    CRC32C in the header)."""
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(_LENGTH.pack(len(payload)))
        parts.append(payload)
    body = b"".join(parts)
    header = _HEADER.pack(
        WAL_OBJECT_MAGIC, _FORMAT_VERSION, 0, node_id, epoch, first_offset, len(payloads),
        len(body), crc32c.crc32c(body),
    )
    return header + _HEADER_CRC.pack(crc32c.crc32c(header)) + body


def decode_wal_object(data: bytes, where: str = "WAL object") -> tuple[int, int, int, list[bytes]]:
    """``(node_id, epoch, first_offset, payloads)``; :class:`CorruptionError` on bad bytes."""
    if len(data) < _HEADER_BYTES:
        raise CorruptionError(f"{where}: {len(data)} bytes is shorter than a WAL object header")
    header = data[: _HEADER.size]
    (header_crc,) = _HEADER_CRC.unpack_from(data, _HEADER.size)
    if crc32c.crc32c(header) != header_crc:
        raise CorruptionError(f"{where}: header checksum mismatch")
    magic, version, _, node_id, epoch, first, count, body_len, body_crc = _HEADER.unpack(header)
    if magic != WAL_OBJECT_MAGIC or version != _FORMAT_VERSION:
        raise CorruptionError(f"{where}: not a WAL object (magic {magic!r}, version {version})")
    body = memoryview(data)[_HEADER_BYTES:]
    if len(body) != body_len or crc32c.crc32c(body) != body_crc:
        raise CorruptionError(f"{where}: body checksum or length mismatch")
    payloads: list[bytes] = []
    position = 0
    for _ in range(count):
        if position + 4 > body_len:
            raise CorruptionError(f"{where}: record table overruns the body")
        (length,) = _LENGTH.unpack_from(body, position)
        position += 4
        if position + length > body_len:
            raise CorruptionError(f"{where}: record overruns the body")
        payloads.append(bytes(body[position : position + length]))
        position += length
    if position != body_len:
        raise CorruptionError(f"{where}: {body_len - position} trailing bytes after the records")
    return node_id, epoch, first, payloads


@dataclass(frozen=True, order=True)
class WalObjectName:
    """What a data key says: records ``first..last`` (inclusive) written by ``epoch``."""

    first: int
    last: int
    epoch: int
    key: str = field(compare=False)


def _number(value: int) -> str:
    return f"{value:020d}"


@dataclass(frozen=True)
class WalKeys:
    """Object keys of one node's WAL (relative to the store's prefix)."""

    root: str

    @classmethod
    def for_node(cls, node_id: int) -> WalKeys:
        return cls(f"wal/{node_id}/")

    @property
    def epochs(self) -> str:
        return self.root + "epochs/"

    @property
    def bases(self) -> str:
        return self.root + "bases/"

    @property
    def data(self) -> str:
        return self.root + "data/"

    @property
    def trims(self) -> str:
        return self.root + "trim/"

    def epoch(self, epoch: int) -> str:
        return self.epochs + _number(epoch)

    def base(self, epoch: int) -> str:
        return self.bases + _number(epoch)

    def trim(self, start: int) -> str:
        return self.trims + _number(start)

    def data_object(self, first: int, last: int, epoch: int) -> WalObjectName:
        key = f"{self.data}{_number(first)}-{_number(last)}-{_number(epoch)}"
        return WalObjectName(first, last, epoch, key)

    def parse_data(self, key: str) -> WalObjectName | None:
        try:
            first, last, epoch = (int(part) for part in key[len(self.data) :].split("-"))
        except ValueError:
            return None
        return WalObjectName(first, last, epoch, key)

    def parse_number(self, key: str, folder: str) -> int | None:
        try:
            return int(key[len(folder) :])
        except ValueError:
            return None


@dataclass
class _Scan:
    """One listing of a node's WAL and the chain it implies."""

    trim_start: int = 0
    trim_keys: list[str] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    bases: dict[int, int] = field(default_factory=dict)
    objects: list[WalObjectName] = field(default_factory=list)

    def excluded(self, name: WalObjectName) -> bool:
        """Written by an epoch that a newer epoch's base cut off (see module doc)."""
        return any(
            epoch > name.epoch and name.first >= base for epoch, base in self.bases.items()
        )

    def chain(self) -> tuple[list[WalObjectName], list[WalObjectName]]:
        """``(chain, garbage)``: the contiguous objects from the trim point, and the rest."""
        valid = [name for name in self.objects if not self.excluded(name)]
        by_first: dict[int, list[WalObjectName]] = {}
        for name in valid:
            by_first.setdefault(name.first, []).append(name)
        chain: list[WalObjectName] = []
        expected = self.trim_start
        while True:
            candidates = by_first.get(expected) or [
                # Only at the trim point can an object start before `expected`.
                name for name in valid if name.first < expected <= name.last
            ]
            if not candidates:
                break
            best = max(candidates, key=lambda name: (name.first, name.epoch))
            chain.append(best)
            expected = best.last + 1
        in_chain = {name.key for name in chain}
        garbage = [name for name in self.objects if name.key not in in_chain]
        return chain, garbage

    @property
    def newest_epoch(self) -> int:
        return max(self.epochs, default=-1)


class _FenceCheck:
    """Coalesced "is a newer epoch marker there?" checks.

    :meth:`confirm` returns once a check that *started after the call* found no newer marker;
    concurrent callers share checks, so one LIST covers every PUT completed before it began.
    """

    def __init__(self, check: Callable[[], Awaitable[None]]) -> None:
        self._check = check
        self._running: asyncio.Future[None] | None = None
        self._queued: asyncio.Future[None] | None = None
        self.fenced: FencedError | None = None
        self.checks = 0

    async def confirm(self) -> None:
        if self.fenced is not None:
            raise self.fenced
        loop = asyncio.get_running_loop()
        if self._running is None:
            future: asyncio.Future[None] = loop.create_future()
            self._launch(future)
        else:
            if self._queued is None:
                self._queued = loop.create_future()
            future = self._queued
        await asyncio.shield(future)

    def _launch(self, future: asyncio.Future[None]) -> None:
        self._running = future
        asyncio.get_running_loop().create_task(self._run(future))

    async def _run(self, future: asyncio.Future[None]) -> None:
        self.checks += 1
        try:
            await self._check()
        except BaseException as exc:
            if isinstance(exc, FencedError):
                self.fenced = exc
            future.set_exception(exc)
            future.exception()  # waiters re-raise it; keep asyncio from logging it twice
        else:
            future.set_result(None)
        finally:
            self._running = None
            queued, self._queued = self._queued, None
            if queued is not None:
                self._launch(queued)


class S3Wal(GroupCommitWal):
    """A WAL of batched S3 objects (see the module doc for layout, fencing and recovery)."""

    def __init__(
        self,
        store: S3ObjectStore,
        *,
        max_batch_bytes: int = 8 << 20,
        max_batch_interval_s: float = 0.25,
        max_inflight: int = 8,
        max_record_bytes: int = 64 << 20,
        owns_store: bool = True,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            capabilities=WalCapabilities(
                max_record_bytes=max_record_bytes,
                capacity_bytes=None,
                supports_failover=True,
                survives_process_kill=True,
                survives_power_loss=True,
                shared_between_processes=True,
                extra={"offset_unit": "record", "medium": "s3"},
            ),
            max_group_bytes=max_batch_bytes,
            max_group_delay_s=max_batch_interval_s,
            max_inflight=max_inflight,
            clock=clock,
        )
        self.store = store
        self._owns_store = owns_store
        self._keys = WalKeys.for_node(0)
        self._next_offset = 0
        self._trim_start = 0
        self._trim_keys: list[str] = []
        self._chain: list[WalObjectName] = []
        self._live: deque[WalObjectName] = deque()
        """Objects that may exist, in offset order: deleted once a trim covers them."""
        self._fence = _FenceCheck(self._check_not_fenced)
        self._trim_lock: asyncio.Lock | None = None
        self.objects_written = 0
        self.bytes_written = 0

    # -- open and fence -----

    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        if node_id < 0 or node_epoch < 0:
            raise InvalidArgument(f"node id and epoch must be >= 0, got {node_id}/{node_epoch}")
        self._keys = WalKeys.for_node(node_id)
        self._trim_lock = asyncio.Lock()
        if mode is not WalMode.READ_ONLY:
            await self.store.require_conditional(
                "the S3 WAL fences zombie writers with conditional creates"
            )
            await self._claim_epoch(node_epoch)
        scan = await self._scan()
        chain, garbage = scan.chain()
        self._trim_start = scan.trim_start
        self._trim_keys = scan.trim_keys
        self._chain = chain
        self._next_offset = max(chain[-1].last + 1 if chain else 0, scan.trim_start)
        self._live = deque(chain)
        if mode is WalMode.READ_ONLY:
            return
        await self.store.put(self._keys.base(node_epoch), str(self._next_offset).encode())
        await self._fence.confirm()
        if garbage:
            # Unreachable from now on (our base excludes them); remove them while we own the WAL.
            await self.store.delete(name.key for name in garbage)
        log.info(
            "S3 WAL node=%d epoch=%d %s: %d objects to recover, trim start %d, next offset %d",
            node_id, node_epoch, mode.value, len(chain), self._trim_start, self._next_offset,
        )

    async def _claim_epoch(self, node_epoch: int) -> None:
        newest = -1
        async for meta in self.store.list(self._keys.epochs):
            epoch = self._keys.parse_number(meta.key, self._keys.epochs)
            if epoch is not None:
                newest = max(newest, epoch)
        if newest >= node_epoch:
            raise FencedError(
                f"S3 WAL of node {self.node_id} is owned by epoch {newest} >= {node_epoch}; "
                "start the node with a newer epoch"
            )
        marker = f"node={self.node_id} epoch={node_epoch} mode={self.mode and self.mode.value}"
        try:
            await self.store.put_if_absent(self._keys.epoch(node_epoch), marker.encode())
        except PreconditionFailed:
            raise FencedError(
                f"S3 WAL of node {self.node_id}: epoch {node_epoch} was claimed by another "
                "process; start with a newer epoch"
            ) from None

    async def _check_not_fenced(self) -> None:
        async for meta in self.store.list(
            self._keys.epochs, start_after=self._keys.epoch(self.node_epoch), limit=1
        ):
            newer = self._keys.parse_number(meta.key, self._keys.epochs)
            raise FencedError(
                f"S3 WAL of node {self.node_id} was taken over by epoch {newer}; this writer "
                f"(epoch {self.node_epoch}) is fenced and acknowledges nothing more"
            )

    async def _scan(self) -> _Scan:
        scan = _Scan()
        keys = self._keys
        async for meta in self.store.list(keys.root):
            key = meta.key
            if key.startswith(keys.data):
                name = keys.parse_data(key)
                if name is not None:
                    scan.objects.append(name)
            elif key.startswith(keys.trims):
                start = keys.parse_number(key, keys.trims)
                if start is not None:
                    scan.trim_keys.append(key)
                    scan.trim_start = max(scan.trim_start, start)
            elif key.startswith(keys.epochs):
                epoch = keys.parse_number(key, keys.epochs)
                if epoch is not None:
                    scan.epochs.append(epoch)
            elif key.startswith(keys.bases):
                epoch = keys.parse_number(key, keys.bases)
                if epoch is not None:
                    scan.bases[epoch] = await self._read_base(key)
        return scan

    async def _read_base(self, key: str) -> int:
        data = await self.store.get(key)
        try:
            return int(data.decode())
        except (UnicodeDecodeError, ValueError):
            raise CorruptionError(f"S3 WAL base object {key!r} holds {data[:40]!r}") from None

    # -- write -----

    def _prepare_group(self, payloads: Sequence[bytes]) -> PreparedGroup:
        first = self._next_offset
        offsets = list(range(first, first + len(payloads)))
        self._next_offset += len(payloads)
        name = self._keys.data_object(first, offsets[-1], self.node_epoch)
        self._live.append(name)
        return PreparedGroup(offsets, list(payloads), state=name)

    async def _write_group(self, group: PreparedGroup) -> None:
        name: WalObjectName = group.state
        body = encode_wal_object(self.node_id, self.node_epoch, name.first, group.payloads)
        await self.store.put(name.key, body)
        self.objects_written += 1
        self.bytes_written += len(body)
        await self._fence.confirm()

    # -- recover -----

    async def _recover(self) -> AsyncIterator[WalRecord]:
        chain = [name for name in self._chain if name.last >= self._trim_start]
        fetches: deque[asyncio.Task[bytes]] = deque()
        position = 0
        try:
            while position < len(chain) or fetches:
                while position < len(chain) and len(fetches) < _RECOVERY_PREFETCH:
                    fetches.append(asyncio.create_task(self.store.get(chain[position].key)))
                    position += 1
                name = chain[position - len(fetches)]
                try:
                    data = await fetches.popleft()
                except NotFound:
                    raise CorruptionError(
                        f"S3 WAL object {name.key} vanished during recovery; was the WAL "
                        "trimmed or reset by another process?"
                    ) from None
                _, _, first, payloads = decode_wal_object(data, f"S3 WAL object {name.key}")
                if first != name.first or len(payloads) != name.last - name.first + 1:
                    raise CorruptionError(
                        f"S3 WAL object {name.key} holds offsets {first}+{len(payloads)}, "
                        "not what its key says"
                    )
                for index, payload in enumerate(payloads):
                    offset = first + index
                    if offset >= self._trim_start:
                        yield WalRecord(offset, payload)
        finally:
            for task in fetches:
                task.cancel()

    # -- trim, reset, close -----

    async def _trim(self, offset: WalOffset) -> None:
        if offset >= self._next_offset:
            raise InvalidArgument(
                f"trim({offset}) beyond the last offset {self._next_offset - 1} of this WAL"
            )
        await self._trim_to(offset + 1)

    async def _reset(self) -> None:
        await self._trim_to(self._next_offset)

    async def _trim_to(self, start: int) -> None:
        assert self._trim_lock is not None
        async with self._trim_lock:
            if start <= self._trim_start:
                return
            await self._fence.confirm()  # a fenced writer never moves the trim point
            new_key = self._keys.trim(start)
            await self.store.put(new_key, b"")
            self._trim_start = start
            covered: list[str] = []
            while self._live and self._live[0].last < start:
                covered.append(self._live.popleft().key)
            old_trims = [key for key in self._trim_keys if key != new_key]
            self._trim_keys = [new_key]
            try:
                await self.store.delete(covered)
                await self.store.delete(old_trims)
            except WalstreamError as exc:
                # The trim point is persisted; leftovers are ignored by recovery.
                log.warning("S3 WAL trim to %d left objects behind: %s", start, exc)

    async def _close(self) -> None:
        if self._owns_store:
            await self.store.close()

    def describe(self) -> dict[str, Any]:
        return {
            "type": "s3",
            "node_id": self.node_id,
            "node_epoch": self.node_epoch,
            "next_offset": self._next_offset,
            "trim_start": self._trim_start,
            "objects_written": self.objects_written,
            "fence_checks": self._fence.checks,
            **self.store.settings.describe(),
        }

