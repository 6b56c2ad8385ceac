"""``EbsWal``: the write-ahead log on a raw block device (an EBS volume) or a preallocated file.

Layout and record format: :mod:`walstream_wal_ebs.layout`. I/O and durability (``O_DIRECT`` +
``O_DSYNC`` through Linux AIO): :mod:`walstream_wal_ebs.device`.

Write path. :class:`~walstream.wal.GroupCommitWal` groups concurrent appends; ``_prepare_group``
packs one group's records back to back into fresh 4 KiB blocks at the next logical offsets (the
``WalOffset`` of a record is the logical byte offset of its header), ends the group with a padding
record up to the block boundary, and — when the group would cross the end of the ring — first
writes a padding record from the current position to the ring end and starts the group at the
beginning of the ring. Groups never share a block, so in-flight groups never overlap.
``_write_group`` writes the blocks and then makes sure that no other node id or epoch owns the WAL
before anything is acknowledged (else the group fails with :class:`FencedError`); see *Fencing*.

Fencing. A header read that shows this writer the owner proves that no FAILOVER had fenced it when
the read started. The writer holds a *fence lease* of ``fence_lease_s`` from the start of such a
read: a group whose write is durable before the lease runs out is acknowledged without another
read (a background read renews the lease while groups keep completing); a group durable after it
waits for a header read that starts after the write, or for the read under way when the lease that
read yields (from its start) covers the write. The lease is recorded in the header (format
version 3), and whoever takes the WAL over (FAILOVER, or a restart with a higher epoch) waits it
out (:func:`walstream.wal.fencing.lease_wait_s`: the lease times a margin, plus a millisecond)
after fencing the writer and before reading the log. So a write the old writer acknowledges was durable before the taker reads the
log, exactly as when every group re-read the header. Both sides measure the lease on their
:class:`~walstream.clock.Clock`, whose rate the margin assumes to agree within 20%.

Every group carries a watermark (record format 2): the offset of the first record of the oldest
group still in flight when it was issued (or the group's own start): everything below it was
acknowledged. A clean close records the same in the header (``acked_through``).

Recovery walks the chain from the header's tail offset (:mod:`walstream_wal_ebs.scan`) and yields
records only once the walk reaches a 4 KiB boundary after them (a group's end). Where the chain
breaks, the walk finds the next valid record; a break that a later watermark (or the header's
acked-through) shows held acknowledged records is reported as ``damage_before`` on the next
record (invariant 11), while a break nothing attests is a torn tail and is dropped with the
valid records after it (they were in flight with it, unacknowledged).

Opening checks the identity (invariant 12): the header records the deployment id bound with
``bind_deployment`` and the node id; another deployment's or node's WAL is refused with
:class:`IdentityMismatch`, a version-1 header (no identity) is adopted. A medium shorter than its
header declares, or holding data without a readable header, is refused with
:class:`CorruptionError`; only an all-zero medium is formatted.

Restarts. Up to ``max_inflight`` groups were in flight when the previous writer died; some may
have landed beyond the point where the walk stops. A writer therefore never resumes at the stop
point itself: it resumes at the same physical position but a whole number of capacities further
in logical offsets, beyond ``max(head_floor, tail) + capacity`` (every offset ever written is
below that), and records that resume point in the header (``head_floor``) before its first
write. Bytes left by an earlier writer then carry offsets that can never match the walk, and the
first record of the new writer is found as a *jump*. ``reset`` resumes the same way, so stale bytes
never parse as records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import secrets
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Sequence
from pathlib import Path
from typing import Any

from crc32c import crc32c
from walstream.clock import Clock
from walstream.errors import (
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    WalstreamError,
)
from walstream.wal import (
    GroupCommitWal,
    PreparedGroup,
    WalCapabilities,
    WalDamage,
    WalMode,
    WalOffset,
    WalRecord,
    checked_lease_s,
    lease_wait_s,
)

from .device import BufferPool, WalDevice, aligned_buffer, create_preallocated_file
from .layout import (
    BLOCK_BYTES,
    FORMAT_VERSION,
    NO_DEPLOYMENT,
    PADDING_MAGIC,
    RECORD_AREA_START,
    RECORD_HEADER_BYTES,
    RECORD_MAGIC,
    HeaderSlot,
    align_up,
    pack_record_header,
    pick_header,
    record_header,
    salt_seed,
)
from .scan import DEFAULT_RESYNC_SCAN_BYTES, walk_log

__all__ = ["DEFAULT_FENCE_LEASE_S", "MIN_CAPACITY_BYTES", "EbsWal"]

log = logging.getLogger(__name__)

MIN_CAPACITY_BYTES = RECORD_AREA_START + 16 * BLOCK_BYTES
_MAX_RECORD_BYTES = 64 << 20
DEFAULT_FENCE_LEASE_S = 0.02
"""How long a header read showing this writer the owner lets it acknowledge writes (module
docstring, *Fencing*): what a takeover waits, against one header read per lease instead of one
per group."""
_MAX_FENCE_LEASE_S = 10.0
#: Records smaller than this are joined with their headers before one copy into a group's
#: buffer; larger ones are copied into it directly.
_JOIN_BELOW_BYTES = 16 << 10
"""A taker waits this many leases (plus a millisecond): room for the two clocks' rates to differ."""
_FORMAT_CHECK_BYTES = 1 << 20
"""How much of the record area must be zero (besides both header slots) for a medium without a
valid header to be formatted: every format starts writing at ring position 0, so a medium that
held a WAL has records there."""


class EbsWal(GroupCommitWal):
    """A circular WAL on a block device or a preallocated file (see the module docstring)."""

    def __init__(
        self,
        path: Path | str,
        *,
        capacity_bytes: int = 1 << 30,
        create: bool = True,
        direct: bool = True,
        max_inflight: int = 4,
        max_group_bytes: int = 1 << 20,
        max_group_delay_s: float = 0.0005,
        capacity_wait_s: float = 5.0,
        clock: Clock | None = None,
        salt: int | None = None,
        fence_lease_s: float = DEFAULT_FENCE_LEASE_S,
    ) -> None:
        checked_lease_s(fence_lease_s, _MAX_FENCE_LEASE_S)
        if capacity_bytes < MIN_CAPACITY_BYTES:
            raise ConfigError(
                f"wal.capacity: at least {MIN_CAPACITY_BYTES} bytes, got {capacity_bytes}"
            )
        self.path = Path(path)
        self.create = create
        self.direct = direct
        self._requested_bytes = capacity_bytes
        self._salt = salt
        super().__init__(
            capabilities=self._capabilities_for(align_down(capacity_bytes - RECORD_AREA_START)),
            max_group_bytes=max_group_bytes,
            max_group_delay_s=max_group_delay_s,
            max_inflight=min(max_inflight, 64),
            capacity_wait_s=capacity_wait_s,
            clock=clock,
        )
        self._device: WalDevice | None = None
        self._created = False
        """This open created the file (an empty file found on disk is not formatted)."""
        self._header: HeaderSlot | None = None
        self._header_lock = asyncio.Lock()
        self._capacity = 0
        self._area_start = RECORD_AREA_START
        self._seed = 0
        self._head = 0
        """Next logical write position (4 KiB aligned)."""
        self._tail = 0
        """First untrimmed logical offset (what the header's tail offset says)."""
        self._written_end = 0
        """Just past the last group written (or the end of the recovered chain): what a clean
        close records as acknowledged-through."""
        self._trim_offset = -1
        self._segments: deque[list[int]] = deque()
        """Untrimmed logical runs ``[start, end)``; runs are physically contiguous, a restart
        starts a new run further in logical offsets."""
        self._used_bytes = 0
        self._records: deque[tuple[int, int]] = deque()
        """``(offset, end)`` of every untrimmed record, written or in flight, in order."""
        self._buffers = BufferPool()
        self._fence_waiters: list[tuple[float, asyncio.Future[None]]] = []
        """Groups waiting for a header read, each with the clock time its write was durable."""
        self._fence_task: asyncio.Task[None] | None = None
        self.fence_lease_s = fence_lease_s
        self._lease_until = -math.inf
        """Clock time until which a durable write may be acknowledged without a header read."""
        self.fence_reads = 0
        """Header reads made to check the fence (for tests and ``describe``)."""

    @staticmethod
    def _capabilities_for(ring_bytes: int) -> WalCapabilities:
        return WalCapabilities(
            max_record_bytes=max(1, min(_MAX_RECORD_BYTES, ring_bytes // 4)),
            capacity_bytes=ring_bytes,
            supports_failover=True,
            survives_process_kill=True,
            survives_power_loss=True,
            shared_between_processes=True,
            checks_identity=True,
            reports_damage=True,
            extra={"block_bytes": BLOCK_BYTES},
        )

    # -- primitives ----------------------------------------------------------------------------

    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        if not self.path.exists():
            if mode is not WalMode.READ_WRITE or not self.create:
                raise BackendUnavailable(
                    f"the WAL file {self.path} does not exist "
                    + ("(create: false)" if not self.create else f"(nothing to {mode.value})")
                )
            create_preallocated_file(self.path, self._requested_bytes)
            self._created = True
        device = WalDevice(self.path, direct=self.direct, writable=mode is not WalMode.READ_ONLY)
        try:
            device.attach(asyncio.get_running_loop())
            self._device = device
            raw = await device.read(0, RECORD_AREA_START)
            slots = [raw[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] for i in range(2)]
            header, problems = pick_header(slots)
            if header is not None:
                for problem in problems:
                    log.warning("WAL %s: header %s; using the other slot", self.path, problem)
            if header is None:
                header = await self._format(raw, problems, mode)
            self._check_size(header, device)
            header = self._check_identity(header, node_id, mode)
            self._adopt(header)
            if mode is WalMode.FAILOVER:
                await self._take_over()
            elif mode is WalMode.READ_WRITE:
                await self._claim()
        except BaseException:
            device.close()
            self._device = None
            raise

    async def _format(self, raw: bytes, problems: list[str], mode: WalMode) -> HeaderSlot:
        """Format a new medium; refuse one that holds anything (a WAL whose header is damaged
        must never be silently replaced by an empty one)."""
        assert self._device is not None
        probe = raw
        if self._device.size_bytes > RECORD_AREA_START:
            probe += await self._device.read(
                RECORD_AREA_START,
                min(_FORMAT_CHECK_BYTES, align_up(self._device.size_bytes - RECORD_AREA_START)),
            )
        if not self._created and self._device.size_bytes < MIN_CAPACITY_BYTES:
            if not self._device.is_block_device:
                # This code creates WAL files at their full size: a shorter one was cut.
                raise CorruptionError(
                    f"the WAL file {self.path} has only {self._device.size_bytes} bytes and no "
                    f"header, less than any WAL ({MIN_CAPACITY_BYTES}): if it held a WAL, it was "
                    "truncated and its records are gone. Restore it, or delete it to start an "
                    "empty WAL (unuploaded records are lost)"
                )
        if probe.count(0) != len(probe):
            raise CorruptionError(
                f"the WAL {self.path} has no readable header slot ({'; '.join(problems)}) but "
                "is not empty: its records cannot be located, and it is not formatted over. "
                "Restore the device from a backup, or, to give up its unuploaded records, "
                "delete the file (or zero its first 8 KiB and first MiB of records)"
            )
        if mode is not WalMode.READ_WRITE or not self.create:
            raise BackendUnavailable(
                f"{self.path} holds no walstream WAL; open it READ_WRITE with create: true "
                "to format it"
            )
        assert self._device is not None
        ring_bytes = align_down(self._device.size_bytes - RECORD_AREA_START)
        if ring_bytes + RECORD_AREA_START < MIN_CAPACITY_BYTES:
            raise ConfigError(
                f"wal.path: {self.path} has {self._device.size_bytes} bytes; the WAL needs at "
                f"least {MIN_CAPACITY_BYTES}"
            )
        salt = self._salt if self._salt is not None else secrets.randbits(63)
        header = HeaderSlot(
            sequence=1,
            timestamp_ms=self.clock.now_ms(),
            capacity_bytes=ring_bytes,
            area_start=RECORD_AREA_START,
            tail_offset=0,
            trim_offset=-1,
            head_floor=0,
            node_id=self.node_id,
            node_epoch=self.node_epoch,
            salt=salt,
            deployment_id=self.deployment_id or NO_DEPLOYMENT,
            home_node_id=self.node_id if self.deployment_id else -1,
        )
        # Both slots, so that a header left by an earlier format can never win.
        await self._write_slot(header)
        await self._write_slot(header.next())
        log.info("WAL %s formatted: %d bytes of ring", self.path, ring_bytes)
        return header.next()

    def _check_size(self, header: HeaderSlot, device: WalDevice) -> None:
        if device.size_bytes < header.ring_end:
            raise CorruptionError(
                f"the WAL {self.path} has {device.size_bytes} bytes but its header declares "
                f"{header.ring_end} ({header.capacity_bytes} bytes of records after "
                f"{header.area_start} of header): it was truncated or copied incompletely and "
                "records are missing. Restore the complete file or device"
            )

    def _check_identity(self, header: HeaderSlot, node_id: int, mode: WalMode) -> HeaderSlot:
        """Refuse a WAL of another deployment or node; adopt an old one that records none.

        Returns the header to use: with the identity filled in when this open adopts it (the
        next header write, made before any record, persists it)."""
        wanted = self.deployment_id
        if not wanted:
            return header  # no deployment bound: nothing to compare (embedded tests, tools)
        if header.has_identity:
            theirs = (header.deployment_id, header.home_node_id)
            if theirs != (wanted, node_id):
                raise IdentityMismatch(
                    f"the WAL {self.path} belongs to deployment {header.deployment_id.hex()} "
                    f"node {header.home_node_id}, not to this deployment {wanted.hex()} node "
                    f"{node_id}: check that wal.path points at this deployment's and this "
                    "node's WAL (and the metadata store at this deployment's), and was not "
                    "copied from another deployment or node"
                )
            return header
        if header.home_node_id >= 0 and header.home_node_id != node_id:
            raise IdentityMismatch(
                f"the WAL {self.path} belongs to node {header.home_node_id}, not to node "
                f"{node_id}: check that wal.path points at this node's WAL"
            )
        if mode is WalMode.READ_ONLY:
            log.info(
                "WAL %s records no deployment id (format version %d); reading it as %s",
                self.path,
                header.version,
                wanted.hex(),
            )
            return header
        log.warning(
            "WAL %s records no deployment id (format version %d): adopting it for deployment "
            "%s node %d (written to its header now)",
            self.path,
            header.version,
            wanted.hex(),
            node_id,
        )
        return dataclasses.replace(
            header, version=FORMAT_VERSION, deployment_id=wanted, home_node_id=node_id
        )

    def _adopt(self, header: HeaderSlot) -> None:
        self._header = header
        self._capacity = header.capacity_bytes
        self._area_start = header.area_start
        self._seed = salt_seed(header.salt)
        self._tail = self._head = header.tail_offset
        self._trim_offset = header.trim_offset
        self.capabilities = self._capabilities_for(self._capacity)
        requested = align_down(self._requested_bytes - RECORD_AREA_START)
        if requested != self._capacity and not (self._device and self._device.is_block_device):
            log.info(
                "WAL %s keeps its formatted ring of %d bytes (wal.capacity asks for %d)",
                self.path,
                self._capacity,
                requested,
            )

    async def _claim(self) -> None:
        """READ_WRITE: become the owner unless a newer epoch already is."""
        header = self._header
        assert header is not None
        if header.node_epoch > self.node_epoch or (
            header.node_epoch == self.node_epoch and header.node_id != self.node_id
        ):
            raise FencedError(
                f"the WAL {self.path} is owned by node {header.node_id} epoch "
                f"{header.node_epoch}; this node (id {self.node_id}, epoch {self.node_epoch}) "
                "must start with a higher epoch"
            )
        await self._outwait_lease(await self._persist_header(take_over=True))

    async def _take_over(self) -> None:
        """FAILOVER: fence the old writer by owning the header with a higher epoch.

        The new owner is written to both slots one after the other (``_persist_header``): a
        racing header write of the old writer (it read the header before the first of them) can
        then overwrite at most one of them, and the other still carries the newest sequence.
        """
        header = self._header
        assert header is not None
        if self.node_epoch <= header.node_epoch:
            raise FencedError(
                f"FAILOVER of the WAL {self.path} needs an epoch above its owner's "
                f"({header.node_epoch}); got {self.node_epoch}"
            )
        await self._outwait_lease(await self._persist_header(take_over=True))

    async def _outwait_lease(self, displaced: HeaderSlot) -> None:
        """After fencing the owner of ``displaced``: wait until a write it acknowledges without
        a header read must already be durable (module docstring, *Fencing*)."""
        if not displaced.fence_lease_us:
            return  # a version-1/2 writer, a clean close, or a FAILOVER reader: no lease held
        if (displaced.node_id, displaced.node_epoch) == (self.node_id, self.node_epoch):
            return  # the same owner again: nobody is fenced
        wait_s = lease_wait_s(displaced.fence_lease_us / 1e6)
        log.info(
            "WAL %s: waiting %.1f ms for the fence lease of node %d epoch %d to run out",
            self.path,
            wait_s * 1e3,
            displaced.node_id,
            displaced.node_epoch,
        )
        await self.clock.sleep(wait_s)

    def _prepare_group(self, payloads: Sequence[bytes]) -> PreparedGroup:
        capacity = self._capacity
        content_bytes = sum(RECORD_HEADER_BYTES + len(payload) for payload in payloads)
        span = align_up(content_bytes)
        if 0 < span - content_bytes < RECORD_HEADER_BYTES:
            span += BLOCK_BYTES  # the closing padding record needs room for its header
        ring_position = self._head % capacity
        wrap_bytes = capacity - ring_position if ring_position + span > capacity else 0
        total = wrap_bytes + span
        if self._used_bytes + total > capacity:
            raise CapacityError(
                f"the WAL {self.path} is full: {self._used_bytes} of {capacity} bytes are "
                f"untrimmed and this group needs {total}; upload and trim, or raise wal.capacity"
            )
        # The group's watermark: every record below it is acknowledged now (the oldest group
        # still in flight holds the first record that is not). Recovery reads it to tell damage
        # from a torn tail (see scan.py).
        watermark = self.acknowledged_below(self._head)
        buffers = []
        writes: list[tuple[memoryview, int]] = []
        if wrap_bytes:
            padding = self._buffers.take(BLOCK_BYTES)
            buffers.append(padding)
            view = memoryview(padding)[:BLOCK_BYTES]
            pack_record_header(
                view,
                0,
                PADDING_MAGIC,
                wrap_bytes - RECORD_HEADER_BYTES,
                self._head,
                watermark,
                0,
                self._seed,
            )
            writes.append((view, self._area_start + ring_position))
        start = self._head + wrap_bytes
        # A pooled buffer may hold an earlier group's bytes past ``span``: never written, and
        # the bytes inside this group's closing padding are never parsed.
        buffer = self._buffers.take(span)
        buffers.append(buffer)
        offsets: list[WalOffset] = []
        position = 0
        view = memoryview(buffer)[:span]
        # Small records' headers and bodies are joined, then copied into the buffer at once:
        # per record a few C calls, not a slice and a copy of the buffer (a group holds up to
        # thousands). A large body is copied straight into the buffer (no second copy).
        parts: list[bytes] = []
        parts_at = 0
        seed = self._seed
        records = self._records
        for payload in payloads:
            offset = start + position
            size = len(payload)
            header = record_header(RECORD_MAGIC, size, offset, watermark, crc32c(payload), seed)
            if size < _JOIN_BELOW_BYTES:
                parts.append(header)
                parts.append(payload)
            else:
                if parts:
                    joined = b"".join(parts)
                    view[parts_at : parts_at + len(joined)] = joined
                    parts.clear()
                body_at = position + RECORD_HEADER_BYTES
                view[position:body_at] = header
                view[body_at : body_at + size] = payload
                parts_at = body_at + size
            offsets.append(offset)
            position += RECORD_HEADER_BYTES + size
            records.append((offset, start + position))
        if parts:
            view[parts_at:position] = b"".join(parts)
        if position < span:
            pack_record_header(
                view,
                position,
                PADDING_MAGIC,
                span - position - RECORD_HEADER_BYTES,
                start + position,
                watermark,
                0,
                self._seed,
            )
        writes.append((view, self._area_start + start % capacity))
        if self._segments and self._segments[-1][1] == self._head:
            self._segments[-1][1] += total
        else:
            self._segments.append([self._head, self._head + total])
        self._head += total
        self._written_end = self._head
        self._used_bytes += total
        return PreparedGroup(offsets, list(payloads), state=(writes, buffers, None))

    def _start_write(self, group: PreparedGroup) -> None:
        # Submit the group's writes now rather than when its write task first runs.
        writes, buffers, _ = group.state
        started: Coroutine[Any, Any, None]
        try:
            started = self._require_device().start_writes(writes)
        except Exception as exc:  # _write_group reports it, as the contract wants
            started = _raise(exc)
        group.state = (writes, buffers, started)

    async def _write_group(self, group: PreparedGroup) -> None:
        device = self._require_device()
        writes, buffers, started = group.state
        group.state = None
        try:
            await (started if started is not None else device.write_all(writes))
        except asyncio.CancelledError:
            raise  # the kernel may still read the buffers: never reuse them
        except BaseException:
            self._recycle(writes, buffers)
            raise
        self._recycle(writes, buffers)
        # The write is durable now: under the lease it may be acknowledged as it is.
        now = self.clock.monotonic()
        if now < self._lease_until:
            if self._lease_until - now < self.fence_lease_s / 2:
                self._start_fence_read()  # renew before it runs out; nobody waits for it
            return
        await self._check_fence(now)

    def _recycle(self, writes: list[tuple[memoryview, int]], buffers: list[Any]) -> None:
        for view, _ in writes:
            view.release()
        for buffer in buffers:
            self._buffers.give_back(buffer)

    async def _recover(self) -> AsyncIterator[WalRecord]:
        device = self._require_device()
        header = self._header
        assert header is not None
        self._records.clear()
        self._segments = deque([[self._tail, self._tail]])
        chain_end = self._tail
        damage: WalDamage | None = None
        reported = False
        """The last record yielded was an empty one carrying ``damage`` (a damage report)."""
        async for item in walk_log(
            device.read,
            header,
            clean_bytes=self._clean_scan_bytes(),
            resync_bytes=min(DEFAULT_RESYNC_SCAN_BYTES, self._capacity),
        ):
            if item.kind == "end":
                chain_end = item.offset
                if item.torn_start >= 0:
                    log.warning("WAL %s: %s", self.path, item.problem)
                else:
                    log.info(
                        "WAL %s: recovery ended at offset %d: %s",
                        self.path,
                        item.offset,
                        item.problem,
                    )
                break
            if item.kind == "jump":
                self._segments.append([item.offset, item.offset])
                continue
            if item.kind == "damage":
                found = item.damage
                assert found is not None
                # The damaged bytes stay in the ring until trimmed.
                self._segments[-1][1] = max(self._segments[-1][1], item.end)
                if item.continues_at >= 0 and item.continues_at != item.end:
                    self._segments.append([item.continues_at, item.continues_at])
                if found.end - 1 <= self._trim_offset:
                    continue  # only trimmed records were there
                log.error(
                    "WAL %s: CorruptionError: damaged region from offset %d to %d (%d bytes: "
                    "%s) although later writes show it held acknowledged records; reported "
                    "to the engine as possible data loss",
                    self.path,
                    found.start,
                    found.end,
                    found.damaged_bytes,
                    found.reason,
                )
                damage = found if damage is None else _merge(damage, found)
                reported = False
                continue
            self._segments[-1][1] = item.end
            if item.kind == "record":
                assert item.data is not None
                self._records.append((item.offset, item.end))
                if item.offset > self._trim_offset:
                    yield WalRecord(item.offset, item.data, damage_before=damage)
                    # An empty record carrying damage reads as a pure damage report: keep the
                    # damage for the next record with data too.
                    reported = damage is not None and not item.data
                    if item.data:
                        damage = None
        if damage is not None and not reported:
            yield WalRecord(damage.end, b"", damage_before=damage)
        self._segments[-1][1] = max(self._segments[-1][1], chain_end)
        self._used_bytes = sum(end - start for start, end in self._segments)
        self._head = self._written_end = chain_end
        if self.mode is WalMode.READ_WRITE:
            await self._resume_after(chain_end)

    def _clean_scan_bytes(self) -> int:
        """How far past a clean end (zeros, stale bytes) the walk looks for groups written out of
        order: the in-flight window, doubled (8 MiB by default). Only a lost write (a group that
        reads as never written although later ones attest it) needs this look; damage within a
        record is found by the walk itself, however far the next record lies."""
        group = self.max_group_bytes + 2 * BLOCK_BYTES
        return min(self._capacity, 2 * self.max_inflight * group)

    async def _resume_after(self, chain_end: int) -> None:
        """Resume writing beyond everything an earlier writer may have left (module docstring)."""
        frontier = align_up(chain_end)
        if frontier != chain_end:
            # Only the tail itself can be unaligned; what follows it up to the block boundary
            # did not parse, so the walk restarts at the boundary.
            self._tail = frontier
            self._segments.clear()
            self._used_bytes = 0
        resume = self._resume_offset(frontier)
        await self._persist_header(tail_offset=self._tail, head_floor=resume)
        self._head = resume

    def _resume_offset(self, frontier: int) -> int:
        assert self._header is not None
        capacity = self._capacity
        bound = max(self._header.head_floor, self._tail, frontier) + 2 * capacity
        laps = max(1, -(-(bound - frontier) // capacity))
        return frontier + laps * capacity

    async def _trim(self, offset: WalOffset) -> None:
        if offset <= self._trim_offset:
            return
        if offset >= self._head:
            raise InvalidArgument(
                f"trim({offset}) beyond the last written offset of the WAL {self.path}"
            )
        kept = 0
        while kept < len(self._records) and self._records[kept][0] <= offset:
            kept += 1
        new_tail = self._records[kept][0] if kept < len(self._records) else self._head
        await self._persist_header(tail_offset=new_tail, trim_offset=offset)
        for _ in range(kept):
            self._records.popleft()
        self._tail = new_tail
        self._trim_offset = offset
        while self._segments and self._segments[0][1] <= new_tail:
            start, end = self._segments.popleft()
            self._used_bytes -= end - start
        if self._segments and self._segments[0][0] < new_tail:
            self._used_bytes -= new_tail - self._segments[0][0]
            self._segments[0][0] = new_tail

    async def _reset(self) -> None:
        resume = self._resume_offset(align_up(self._head))
        await self._persist_header(tail_offset=resume, trim_offset=resume - 1, head_floor=resume)
        self._head = self._tail = resume
        self._trim_offset = resume - 1
        self._segments.clear()
        self._records.clear()
        self._used_bytes = 0

    async def _close(self) -> None:
        self._lease_until = -math.inf
        if self._fence_task is not None:
            await asyncio.gather(self._fence_task, return_exceptions=True)
        await self._record_clean_close()
        if self._device is not None:
            self._device.close()
            self._device = None

    async def _record_clean_close(self) -> None:
        """Every append was answered and none failed: record in the header that everything below
        the head was acknowledged, so that damage at the very end of the log is reported rather
        than taken for a torn write at the next recovery."""
        header = self._header
        if (
            self.mode is not WalMode.READ_WRITE
            or not self._writable
            or self._failure is not None
            or self._device is None
            or header is None
            or (self._written_end <= header.acked_through and not header.fence_lease_us)
        ):
            return
        try:
            # No more acknowledgements from this writer: it gives its lease back, so the next
            # owner need not wait for it.
            await self._persist_header(
                acked_through=max(self._written_end, header.acked_through), fence_lease_us=0
            )
        except (WalstreamError, OSError) as exc:
            log.warning("WAL %s: could not record the clean close: %s", self.path, exc)

    # -- header and fence ------------------------------------------------------------------------

    def _require_device(self) -> WalDevice:
        if self._device is None:
            raise InvalidArgument(f"the WAL {self.path} is not open")
        return self._device

    async def _read_header(self) -> HeaderSlot:
        raw = await self._require_device().read(0, RECORD_AREA_START)
        header, problems = pick_header(
            [raw[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] for i in range(2)]
        )
        if header is None:
            raise CorruptionError(
                f"both header slots of the WAL {self.path} are damaged ({'; '.join(problems)})"
            )
        return header

    def _owner_check(self, header: HeaderSlot) -> None:
        if (header.node_id, header.node_epoch) != (self.node_id, self.node_epoch):
            raise FencedError(
                f"the WAL {self.path} was taken over by node {header.node_id} epoch "
                f"{header.node_epoch}; this writer (node {self.node_id}, epoch "
                f"{self.node_epoch}) is fenced and must stop"
            )

    async def _write_slot(self, header: HeaderSlot) -> None:
        buffer = aligned_buffer(BLOCK_BYTES)
        try:
            buffer[:] = header.encode()
            await self._require_device().write_all([(buffer, header.slot_index * BLOCK_BYTES)])
        finally:
            buffer.close()

    async def _persist_header(self, *, take_over: bool = False, **changes: Any) -> HeaderSlot:
        """Write the new header state to both slots, one after the other; unless taking over,
        only while this node still owns the WAL (checked before each write). Returns the header
        found on the device before (whose owner a takeover fenced).

        The header declares this writer's fence lease (none unless READ_WRITE) before any
        write is acknowledged under it.

        Both slots: a slot that later fails its CRC (a flipped bit) then falls back to the same
        state, never to an older tail that would bring trimmed records back. A torn write of
        the first leaves the previous state in the other slot; of the second, the new state in
        the first."""
        async with self._header_lock:
            on_device = await self._read_header()
            if take_over:
                if on_device.node_epoch > self.node_epoch:
                    raise FencedError(
                        f"the WAL {self.path} was just taken by epoch {on_device.node_epoch}"
                    )
            else:
                self._owner_check(on_device)
            assert self._header is not None
            lease_us = round(self.fence_lease_s * 1e6) if self.mode is WalMode.READ_WRITE else 0
            fields: dict[str, Any] = {"fence_lease_us": lease_us, **changes}
            new = dataclasses.replace(
                self._header,
                sequence=on_device.sequence + 1,
                version=FORMAT_VERSION,
                timestamp_ms=self.clock.now_ms(),
                node_id=self.node_id,
                node_epoch=self.node_epoch,
                **fields,
            )
            await self._write_slot(new)
            self._header = new
            # A FAILOVER may have taken the WAL meanwhile: its slots must stay the newest.
            self._owner_check(await self._read_header())
            second = new.next(timestamp_ms=self.clock.now_ms())
            await self._write_slot(second)
            self._header = second
            return on_device

    async def _check_fence(self, durable_at: float) -> None:
        """Wait until a header read shows this writer the owner under a lease that covers
        ``durable_at`` (the clock time the caller's write was durable): either a read that
        started after it, or one already under way whose lease (from its start) runs past it.
        Either proves that a FAILOVER taking the WAL now reads the log only after the write was
        durable (module docstring, *Fencing*). Concurrent callers share reads."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fence_waiters.append((durable_at, waiter))
        self._start_fence_read()
        await waiter

    def _start_fence_read(self) -> None:
        """Read the header now unless a read is under way (its loop serves later waiters)."""
        if self._fence_task is None or self._fence_task.done():
            self._fence_task = asyncio.create_task(self._read_fences())

    async def _read_fences(self) -> None:
        """One header read, then one more for as long as waiters remain that it did not cover.
        Each read that shows this writer the owner extends the lease from its start and releases
        every waiter whose write was durable before the lease runs out; a waiter whose write was
        durable later waits for the next read, which starts after that write."""
        while True:
            # Waiters already registered: their writes were durable before this read starts.
            earlier, self._fence_waiters = self._fence_waiters, []
            problem: WalstreamError | None = None
            started = self.clock.monotonic()
            self.fence_reads += 1
            try:
                self._owner_check(await self._read_header())
            except WalstreamError as exc:
                problem = exc
            except OSError as exc:
                problem = BackendUnavailable(f"reading the WAL header of {self.path}: {exc}")
            if problem is None:
                self._lease_until = max(self._lease_until, started + self.fence_lease_s)
            else:
                self._lease_until = -math.inf
            # Waiters that arrived during the read: covered if durable within its lease.
            during, self._fence_waiters = self._fence_waiters, []
            for index, (durable_at, waiter) in enumerate(earlier + during):
                if waiter.done():
                    continue
                if problem is not None:
                    waiter.set_exception(problem)
                elif index < len(earlier) or durable_at < self._lease_until:
                    waiter.set_result(None)
                else:
                    self._fence_waiters.append((durable_at, waiter))
            if not self._fence_waiters:
                return

    # -- description ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "type": "ebs",
            "path": str(self.path),
            "direct": self.direct,
            "capacity_bytes": self._capacity,
            "untrimmed_bytes": self._used_bytes,
            "head_offset": self._head,
            "tail_offset": self._tail,
            "trim_offset": self._trim_offset,
            "block_device": bool(self._device and self._device.is_block_device),
            "deployment_id": self._header.deployment_id.hex() if self._header else "",
            "home_node_id": self._header.home_node_id if self._header else -1,
            "format_version": self._header.version if self._header else 0,
            "fence_lease_s": self.fence_lease_s,
            "fence_reads": self.fence_reads,
        }


async def _raise(exc: Exception) -> None:
    raise exc


def _merge(first: WalDamage, second: WalDamage) -> WalDamage:
    """Two damaged regions with no record between them, reported as one."""
    return WalDamage(
        first.start,
        second.end,
        first.damaged_bytes + second.damaged_bytes,
        f"{first.reason}; {second.reason}",
    )


def align_down(value: int) -> int:
    return max(0, value - value % BLOCK_BYTES)
