"""The S3 WAL: appends are batched into WAL objects in an S3 bucket (docs/architecture/wal-plugins.md).

Built on :class:`walstream.wal.GroupCommitWal`: concurrent appends are grouped into one object
(bounded by ``max_batch_bytes`` and ``max_batch_interval``; an idle WAL writes at once), up to
``max_inflight`` PUTs run concurrently and acknowledgements complete in append order.
A :data:`WalOffset` is a record sequence number.

Layout under ``<prefix>wal/<node_id>/``::

    epochs/<epoch>              epoch marker, created with If-None-Match: * (the fence); says
                                which deployment and node it belongs to and the writer's
                                max_inflight
    bases/<epoch>               first offset epoch <epoch> may write (written after its recovery)
    released/<epoch>            epoch <epoch> closed cleanly: it acknowledges nothing more
    data/<first>-<last>-<epoch> WAL object holding records first..last (inclusive)
    trim/<start>                records below <start> are trimmed (the largest key wins)

(numbers zero-padded to 20 digits, so keys sort numerically).

**WAL objects** (:func:`encode_wal_object`) start with a CRC32C-protected header: magic, format
version, node id, epoch, first offset, record count, body length and body CRC32C. Version 2 adds
the deployment id (invariant 12) and ``durable_before``: every offset below it was durable in this
WAL (written and fence-confirmed by this writer, or recovered at its start) when the object was
written. Version 1 objects (no deployment id, no attestation) are still read.

**Identity.** :meth:`S3Wal.start` reads the newest epoch marker before claiming an epoch and
refuses, with :class:`IdentityMismatch`, a prefix whose marker names another deployment (or node).
During recovery an object whose header names another deployment, node or epoch, or other offsets
than its key, is damage: never yielded. Without a bound deployment id nothing is compared.

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
an object of epoch ``e`` starting at or after ``bases/f`` for any ``f > e`` (zombie objects).

**Fence lease** (:class:`walstream.wal.fencing.FenceLease`). A writer (READ_WRITE) holds a lease
of ``fence_lease_s`` from the *start* of each LIST of ``epochs/`` that found no newer marker: a
group whose PUT completed before the lease runs out is acknowledged without another LIST (a
background LIST renews the lease while groups keep completing; a group completing later waits
for a LIST as above). Its epoch marker records the lease (``fence_lease_ms``), and a new owner,
after creating its marker, waits out the longest lease of the epochs that may still be writing
— every epoch from the newest one with a base on (an epoch writes its base only after it waited
out the ones before it), except those that closed cleanly (``released/<epoch>``) — times a
margin for the two clocks' rates (:func:`walstream.wal.fencing.lease_wait_s`) before it lists
the data objects. A zombie's LIST that missed the new marker started before the marker existed,
so a group it acknowledges under that lease completed before the new owner lists: the argument
above holds with "the check started after the PUT" replaced by "the lease of a check covers the
PUT". Lease 0: a LIST after every group, as before.

**Recovery** reads the trim point (largest ``trim/`` key), drops zombie objects, then walks the
objects from the trim point in offset order (at equal first offsets, the newer epoch wins). A PUT
is atomic, so an object that exists but fails its checksum, structure or identity check is never
a torn write: it is damage. Where no object holds the next offsets there is a *gap*, and each
gap is either the torn tail of a crashed writer or damage (invariant 11):

A gap starting at offset ``g`` is a **torn tail** only when everything after it could have been
in flight, unacknowledged, together with the missing PUT:

1. no epoch's base is above ``g`` (``bases/f > g`` means epoch ``f``'s recovery already recovered
   past ``g``: the gap appeared later, so it is lost data — this keeps a verdict stable across
   restarts and failovers);
2. all objects after ``g`` were written by one epoch ``w`` (one writer's in-flight window;
   objects of a superseded epoch beyond a newer base are zombie objects and ignored before);
3. the objects and gaps from ``g`` on number at most ``max_inflight`` of epoch ``w`` (from its
   marker; this WAL's own setting for markers of format 1): acknowledgements complete in order,
   so while the missing group was unacknowledged at most ``max_inflight - 1`` later groups were
   issued, and after a failed write none is;
4. no object after ``g`` attests ``g`` (``durable_before > g``) and every one of their headers is
   intact and ours.

The conditions only get easier for later gaps, so the first gap that meets them starts the torn
tail: it and everything after it are dropped (never acknowledged), the next offset is ``g`` and
the new owner's base turns the dropped objects into garbage. Every earlier gap is damage: the
first valid record after it carries :class:`~walstream.wal.WalDamage` in ``damage_before``
(reason: the missing offsets and the rule that proves them acknowledged), and recovery goes on.
A damaged object at the end of the chain (a complete object that fails its checks) is reported
with a pure damage report ``WalRecord(next_offset, b"", damage_before=...)``. A damage-reporting
gap stays in the chain until a trim passes it, so every later recovery reports it again (its
base rule holds). Trimming needs no rule of its own: the walk starts at the trim point, gaps
below it do not matter, and a trim never deletes the object holding the trim point. When
an object starting at a damaged gap shows up in a second LIST, the scan is repeated: a LIST
racing a live writer (as a READ_ONLY reader's can) may miss an object that lands meanwhile.

Rule 4 is what catches a lost object followed by fewer than ``max_inflight`` others (a writer
that awaits each append writes one object at a time): every object records, at the time it is
written, the offset below which every group has completed. Format 1 objects attest nothing, so
for them rules 1-3 decide. Objects of a dropped torn tail are read no further than their headers.
A missing object's size is unknown: ``damaged_bytes`` counts the damaged objects that exist and,
for missing WAL records, the largest size each could have had (``max_record_bytes``), so the
engine's bound on what a lost range could hold stays an upper bound.

**Trim** writes ``trim/<start>`` first, then deletes the covered WAL objects, then the older
``trim/`` keys: the persisted trim point is never lost, and a crash in between leaves only
garbage that the next trim or start removes.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from walstream.clock import Clock, make_rng
from walstream.errors import (
    CorruptionError,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
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
)
from walstream.wal.fencing import FenceLease, checked_lease_s, lease_wait_s

from .layout import (
    FORMAT_VERSION,
    MAX_HEADER_BYTES,
    WAL_OBJECT_MAGIC,
    EpochMarker,
    WalKeys,
    WalObjectHeader,
    WalObjectName,
    decode_wal_header,
    decode_wal_object,
    encode_wal_object,
    read_wal_object,
)
from .objects import S3ObjectStore

__all__ = [
    "WAL_OBJECT_MAGIC",
    "EpochMarker",
    "S3Wal",
    "WalKeys",
    "WalObjectHeader",
    "WalObjectName",
    "decode_wal_header",
    "decode_wal_object",
    "encode_wal_object",
    "read_wal_object",
]

log = logging.getLogger(__name__)

_RECOVERY_PREFETCH = 8
_RESCANS = 3
DEFAULT_FENCE_LEASE_S = 1.0
"""How long a LIST of ``epochs/`` that found no newer owner covers acknowledgements."""
_MAX_FENCE_LEASE_S = 60.0
_REASONS_SHOWN = 4


@dataclass(frozen=True)
class _Gap:
    """Offsets ``start..end-1`` that no WAL object in the walk holds."""

    start: int
    end: int


@dataclass
class _Scan:
    """One listing of a node's WAL."""

    trim_start: int = 0
    trim_keys: list[str] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    bases: dict[int, int] = field(default_factory=dict)
    objects: list[WalObjectName] = field(default_factory=list)

    def excluded(self, name: WalObjectName) -> bool:
        """Written by an epoch that a newer epoch's base cut off (a zombie object)."""
        return any(epoch > name.epoch and name.first >= base for epoch, base in self.bases.items())

    def walk(self) -> list[WalObjectName | _Gap]:
        """The objects from the trim point in offset order, with the gaps between them.

        At equal first offsets the newer epoch wins; only at the trim point can the object to
        take start before the expected offset.
        """
        valid = sorted(
            (name for name in self.objects if not self.excluded(name)),
            key=lambda name: (name.first, -name.epoch),
        )
        firsts = [name.first for name in valid]
        items: list[WalObjectName | _Gap] = []
        expected = self.trim_start
        while True:
            index = bisect.bisect_left(firsts, expected)
            if index < len(valid) and valid[index].first == expected:
                best = valid[index]
            elif not items and (
                covering := [name for name in valid if name.first < expected <= name.last]
            ):
                best = max(covering, key=lambda name: (name.first, name.epoch))
            elif index < len(valid):
                # Nothing holds `expected`; the walk resumes at the next object.
                items.append(_Gap(expected, valid[index].first))
                best = valid[index]
            else:
                return items
            items.append(best)
            expected = best.last + 1


@dataclass
class _Chain:
    """What recovery keeps of a scan: the chain, its damaged gaps and the dropped torn tail."""

    objects: list[WalObjectName]
    """Objects to recover, in offset order (damaged gaps may lie between them)."""
    gaps: dict[int, tuple[int, str]]
    """Damaged gaps in the chain: start → (end, why it is not a torn tail)."""
    torn_start: int | None
    torn: list[WalObjectName]
    garbage: list[WalObjectName]
    """Objects outside the chain (torn tail, superseded, zombie), removed by a new owner."""
    end: int
    """The next offset to write."""


@dataclass
class _Damage:
    """A damaged region being collected during recovery (reported on the next valid record)."""

    start: int
    end: int
    damaged_bytes: int = 0
    reasons: list[str] = field(default_factory=list)

    def extend(self, end: int, damaged_bytes: int, reason: str) -> None:
        self.end = max(self.end, end)
        self.damaged_bytes += damaged_bytes
        self.reasons.append(reason)

    def report(self, end: int) -> WalDamage:
        shown = "; ".join(self.reasons[:_REASONS_SHOWN])
        if len(self.reasons) > _REASONS_SHOWN:
            shown += f"; and {len(self.reasons) - _REASONS_SHOWN} more damaged objects or gaps"
        return WalDamage(self.start, end, self.damaged_bytes, shown)


class S3Wal(GroupCommitWal):
    """A WAL of batched S3 objects (see the module doc for layout, fencing, identity and
    recovery)."""

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
        rng: random.Random | None = None,
        fence_lease_s: float = DEFAULT_FENCE_LEASE_S,
    ) -> None:
        checked_lease_s(fence_lease_s, _MAX_FENCE_LEASE_S)
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
        self._gaps: dict[int, tuple[int, str]] = {}
        self._markers: dict[int, EpochMarker | None] = {}
        self._live: deque[WalObjectName] = deque()
        """Objects that may exist, in offset order: deleted once a trim covers them."""
        self._unfinished: set[int] = set()
        """First offsets of groups whose PUT or fence check has not completed."""
        self.fence_lease_s = fence_lease_s
        self._fence = FenceLease(self._check_not_fenced, 0.0, self.clock)
        """Its lease is ``fence_lease_s`` once started READ_WRITE (module doc, *Fence lease*)."""
        self._trim_lock: asyncio.Lock | None = None
        self._rng = rng or make_rng(None)
        """Draws the token that makes each epoch claim's marker unique."""
        self.objects_written = 0
        self.bytes_written = 0
        self.damage_reported = 0
        """Damaged regions reported by the last recovery."""
        self.torn_objects = 0
        """Objects dropped as a torn tail by the last start."""

    # -- open, identity and fence -----

    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        if node_id < 0 or node_epoch < 0:
            raise InvalidArgument(f"node id and epoch must be >= 0, got {node_id}/{node_epoch}")
        self._fence.lease_s = self.fence_lease_s if mode is WalMode.READ_WRITE else 0.0
        self._keys = WalKeys.for_node(node_id)
        self._trim_lock = asyncio.Lock()
        if mode is not WalMode.READ_ONLY:
            await self.store.require_conditional(
                "the S3 WAL fences zombie writers with conditional creates"
            )
            await self._claim_epoch(node_epoch)
        else:
            await self._check_identity(await self._newest_epoch())
        scan, chain = await self._resolve_chain()
        self._trim_start = scan.trim_start
        self._trim_keys = scan.trim_keys
        self._chain = chain.objects
        self._gaps = chain.gaps
        self._next_offset = max(chain.end, scan.trim_start)
        self._live = deque(chain.objects)
        self.torn_objects = len(chain.torn)
        if chain.torn_start is not None:
            log.warning(
                "S3 WAL node=%d: torn tail from offset %d dropped (%d objects written while the "
                "missing one was in flight, never acknowledged): %s",
                node_id,
                chain.torn_start,
                len(chain.torn),
                ", ".join(name.key for name in chain.torn[:_REASONS_SHOWN]),
            )
        for start, (end, reason) in chain.gaps.items():
            log.error(
                "S3 WAL node=%d: offsets %d..%d are lost: %s", node_id, start, end - 1, reason
            )
        if mode is WalMode.READ_ONLY:
            return
        await self.store.put(self._keys.base(node_epoch), str(self._next_offset).encode())
        await self._fence.confirm()
        if chain.garbage:
            # Unreachable from now on (our base excludes them); remove them while we own the WAL.
            await self.store.delete(name.key for name in chain.garbage)
        log.info(
            "S3 WAL node=%d epoch=%d %s: %d objects to recover, trim start %d, next offset %d",
            node_id,
            node_epoch,
            mode.value,
            len(chain.objects),
            self._trim_start,
            self._next_offset,
        )

    async def _newest_epoch(self) -> int:
        return max(await self._numbers(self._keys.epochs), default=-1)

    def _location(self) -> str:
        settings = self.store.settings
        return f"s3://{settings.bucket}/{settings.prefix}{self._keys.root}"

    async def _marker(self, epoch: int) -> EpochMarker | None:
        """The marker of ``epoch`` (cached), ``None`` when it does not exist."""
        if epoch not in self._markers:
            key = self._keys.epoch(epoch)
            try:
                data = await self.store.get(key)
            except NotFound:
                self._markers[epoch] = None
            else:
                self._markers[epoch] = EpochMarker.parse(data, key)
        return self._markers[epoch]

    async def _check_identity(self, newest: int) -> None:
        """Refuse a WAL whose newest epoch marker names another node or deployment."""
        if newest < 0:
            return
        marker = await self._marker(newest)
        if marker is None:
            return
        key = self._keys.epoch(newest)
        if marker.node_id != self.node_id:
            raise IdentityMismatch(
                f"S3 WAL at {self._location()} was claimed by node {marker.node_id} (epoch "
                f"marker {key}), not node {self.node_id}: check the node id and the WAL prefix "
                "of this node's configuration"
            )
        theirs = marker.deployment_id
        if self.deployment_id and theirs and theirs != self.deployment_id:
            raise IdentityMismatch(
                f"S3 WAL at {self._location()} belongs to deployment "
                f"{theirs.hex()} (epoch marker {key}), not to this deployment "
                f"{self.deployment_id.hex()}: check that the WAL bucket and prefix point at this "
                "deployment's WAL and that the metadata store is this deployment's; two "
                "deployments must never share a WAL prefix"
            )

    async def _claim_epoch(self, node_epoch: int) -> None:
        newest = await self._newest_epoch()
        await self._check_identity(newest)
        if newest >= node_epoch:
            raise FencedError(
                f"S3 WAL of node {self.node_id} is owned by epoch {newest} >= {node_epoch}; "
                "start the node with a newer epoch"
            )
        lease_ms = round(self.fence_lease_s * 1000) if self.mode is WalMode.READ_WRITE else 0
        marker = EpochMarker(
            self.node_id, node_epoch, self.deployment_id, self.max_inflight, lease_ms
        )
        mode = self.mode.value if self.mode else "none"
        data = marker.encode(mode, f"{self._rng.getrandbits(64):016x}")
        try:
            await self.store.put_if_absent(self._keys.epoch(node_epoch), data)
        except PreconditionFailed:
            raise FencedError(
                f"S3 WAL of node {self.node_id}: epoch {node_epoch} was claimed by another "
                "process; start with a newer epoch"
            ) from None
        self._markers[node_epoch] = marker
        await self._outwait_leases(node_epoch)

    async def _numbers(self, folder: str) -> list[int]:
        """The numbers of the keys in ``folder``."""
        numbers = []
        async for meta in self.store.list(folder):
            number = self._keys.parse_number(meta.key, folder)
            if number is not None:
                numbers.append(number)
        return numbers

    async def _outwait_leases(self, node_epoch: int) -> None:
        """Wait out the fence leases of the epochs before ``node_epoch`` that may still be
        acknowledging, before anything of theirs is listed (module docstring, *Fence lease*).
        Listed after our marker exists: an epoch that got a lease from a check missing our
        marker created its own marker before that check, so it is listed here."""
        based = await self._numbers(self._keys.bases)
        released = set(await self._numbers(self._keys.releases))
        floor = max((epoch for epoch in based if epoch < node_epoch), default=-1)
        lease_ms, holder = 0, -1
        for epoch in await self._numbers(self._keys.epochs):
            if floor <= epoch < node_epoch and epoch not in released:
                marker = await self._marker(epoch)
                if marker is not None and marker.fence_lease_ms > lease_ms:
                    lease_ms, holder = marker.fence_lease_ms, epoch
        if lease_ms:
            wait_s = lease_wait_s(lease_ms / 1000)
            log.info(
                "S3 WAL node=%d: waiting %.0f ms for the fence lease of epoch %d to run out",
                self.node_id,
                wait_s * 1000,
                holder,
            )
            await self.clock.sleep(wait_s)
        # Releases before our epoch matter no more once we own it (a later owner that misses
        # one waits that lease out: slower, never unsafe).
        await self.store.delete(
            self._keys.release(epoch) for epoch in released if epoch < node_epoch
        )

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

    # -- the chain: torn tail or damage -----

    async def _resolve_chain(self) -> tuple[_Scan, _Chain]:
        """Scan and split the walk into chain, damaged gaps and torn tail (module doc).

        A damaged gap whose first key exists by now was a LIST racing a writer: list again.
        """
        for attempt in range(_RESCANS):
            scan = await self._scan()
            chain = await self._split(scan)
            listed = {name.key for name in scan.objects}
            raced = False
            for start in chain.gaps:
                async for meta in self.store.list(self._keys.data_starting_at(start), limit=1):
                    raced = raced or meta.key not in listed
            if not raced or attempt == _RESCANS - 1:
                return scan, chain
            log.info("S3 WAL node=%d: an object landed while listing; listing again", self.node_id)
        raise AssertionError("unreachable")

    async def _split(self, scan: _Scan) -> _Chain:
        """Apply the torn-tail rules to the gaps of the walk, first to last: the first gap that
        can be torn starts the dropped tail, every earlier one is damage."""
        items = scan.walk()
        gap_indexes = [index for index, item in enumerate(items) if isinstance(item, _Gap)]
        gaps: dict[int, tuple[int, str]] = {}
        torn_index: int | None = None
        for index in gap_indexes:
            gap = items[index]
            assert isinstance(gap, _Gap)
            why_not_torn = await self._why_not_torn(scan, gap, items[index + 1 :])
            if why_not_torn is None:
                torn_index = index
                break
            gaps[gap.start] = (gap.end, why_not_torn)
        kept = items if torn_index is None else items[:torn_index]
        objects = [item for item in kept if isinstance(item, WalObjectName)]
        torn: list[WalObjectName] = []
        torn_start: int | None = None
        if torn_index is not None:
            torn_gap = items[torn_index]
            assert isinstance(torn_gap, _Gap)
            torn_start = torn_gap.start
            torn = [item for item in items[torn_index:] if isinstance(item, WalObjectName)]
            end = torn_gap.start
        else:
            end = objects[-1].last + 1 if objects else scan.trim_start
        in_chain = {name.key for name in objects}
        garbage = [name for name in scan.objects if name.key not in in_chain]
        return _Chain(objects, gaps, torn_start, torn, garbage, end)

    async def _why_not_torn(
        self, scan: _Scan, gap: _Gap, after: Sequence[WalObjectName | _Gap]
    ) -> str | None:
        """Why ``gap`` cannot be a torn tail, or ``None`` when it can (module doc, rules 1-4)."""
        missing = f"no WAL object holds offsets {gap.start}..{gap.end - 1}"
        recovered_past = sorted(
            (epoch, base) for epoch, base in scan.bases.items() if base > gap.start
        )
        if recovered_past:
            epoch, base = recovered_past[0]
            return (
                f"{missing}, but the recovery of epoch {epoch} had recovered past them "
                f"(base {base}): the objects were deleted or lost since"
            )
        names = [item for item in after if isinstance(item, WalObjectName)]
        epochs = sorted({name.epoch for name in names})
        if len(epochs) > 1:
            return (
                f"{missing}, and objects of epochs {epochs} follow them: more than one writer's "
                "in-flight window, so they were acknowledged"
            )
        writer = epochs[0]
        marker = await self._marker_or_none(writer)
        window = marker.max_inflight if marker and marker.max_inflight else self.max_inflight
        if len(after) + 1 > window:
            return (
                f"{missing}, and {len(names)} WAL objects of epoch {writer} follow them "
                f"(first {names[0].key}): more than the {window - 1} that can be in flight "
                f"behind an unacknowledged one (max_inflight {window}), so they were acknowledged"
            )
        headers = await asyncio.gather(*(self._tail_header(name) for name in names))
        for name, (header, problem) in zip(names, headers, strict=True):
            if problem is not None:
                return f"{missing}, and a later object cannot vouch for a torn write: {problem}"
            assert header is not None
            if header.durable_before is not None and header.durable_before > gap.start:
                return (
                    f"{missing}, but WAL object {name.key} written later attests that offsets "
                    f"below {header.durable_before} were durable"
                )
        return None

    async def _marker_or_none(self, epoch: int) -> EpochMarker | None:
        try:
            return await self._marker(epoch)
        except CorruptionError as exc:
            log.warning("S3 WAL node=%d: %s; using this WAL's max_inflight", self.node_id, exc)
            return None

    async def _tail_header(self, name: WalObjectName) -> tuple[WalObjectHeader | None, str | None]:
        """The checked header of an object after a gap, or what is wrong with it."""
        try:
            data = await self.store.get(name.key, 0, MAX_HEADER_BYTES)
        except NotFound:
            return None, f"WAL object {name.key} vanished while recovering"
        try:
            header = decode_wal_header(data, f"WAL object {name.key}")
        except CorruptionError as exc:
            return None, str(exc)
        problem = await self._header_problem(name, header)
        if problem is not None:
            return None, f"WAL object {name.key}: {problem}"
        return header, None

    async def _header_problem(self, name: WalObjectName, header: WalObjectHeader) -> str | None:
        """What makes a WAL object not ours or not what its key says, if anything."""
        if header.node_id != self.node_id:
            return f"written by node {header.node_id}, not node {self.node_id}"
        if header.epoch != name.epoch:
            return f"written by epoch {header.epoch}, but its key says epoch {name.epoch}"
        if header.first_offset != name.first or header.count != name.last - name.first + 1:
            return f"holds offsets {header.first_offset}+{header.count}, not what its key says"
        if not self.deployment_id:
            return None
        if header.deployment_id:
            if header.deployment_id != self.deployment_id:
                return (
                    f"belongs to deployment {header.deployment_id.hex()}, not to this "
                    f"deployment {self.deployment_id.hex()} (identity mismatch)"
                )
            return None
        # Written without a deployment id (format 1, or an unbound writer): only acceptable
        # when the epoch that wrote it did not record one either.
        marker = await self._marker_or_none(name.epoch)
        if marker is not None and marker.deployment_id:
            return (
                f"carries no deployment id although epoch {name.epoch} was claimed by "
                f"deployment {marker.deployment_id.hex()}"
            )
        return None

    # -- write -----

    def _prepare_group(self, payloads: Sequence[bytes]) -> PreparedGroup:
        first = self._next_offset
        offsets = list(range(first, first + len(payloads)))
        self._next_offset += len(payloads)
        name = self._keys.data_object(first, offsets[-1], self.node_epoch)
        self._live.append(name)
        self._unfinished.add(first)
        return PreparedGroup(offsets, list(payloads), state=name)

    async def _write_group(self, group: PreparedGroup) -> None:
        name: WalObjectName = group.state
        # Every group below the oldest unfinished one completed (PUT and fence check), and
        # everything below this epoch's first group was recovered at start: attest it.
        durable_before = min(self._unfinished)
        body = encode_wal_object(
            self.node_id,
            self.node_epoch,
            name.first,
            group.payloads,
            deployment_id=self.deployment_id,
            durable_before=durable_before,
        )
        await self.store.put(name.key, body)
        self.objects_written += 1
        self.bytes_written += len(body)
        # Completed now: under the fence lease it may be acknowledged as it is.
        await self._fence.written()
        self._unfinished.discard(name.first)

    # -- recover -----

    async def _recover(self) -> AsyncIterator[WalRecord]:
        chain = [name for name in self._chain if name.last >= self._trim_start]
        fetches: deque[asyncio.Task[bytes | None]] = deque()
        position = 0
        expected = self._trim_start  # the next offset to yield: below it, yielded or trimmed
        damage: _Damage | None = None
        self.damage_reported = 0

        def note(start: int, end: int, damaged_bytes: int, reason: str) -> None:
            nonlocal damage
            if damage is None:
                damage = _Damage(start, end)
            damage.extend(end, damaged_bytes, reason)

        try:
            while position < len(chain) or fetches:
                while position < len(chain) and len(fetches) < _RECOVERY_PREFETCH:
                    fetches.append(asyncio.create_task(self._fetch(chain[position].key)))
                    position += 1
                name = chain[position - len(fetches)]
                data = await fetches.popleft()
                if name.first > expected:
                    _, reason = self._gaps.get(
                        expected,
                        (name.first, f"no WAL object holds offsets {expected}..{name.first - 1}"),
                    )
                    note(expected, name.first, self._missing_bytes(name.first - expected), reason)
                    expected = name.first
                if name.last < expected:
                    continue  # an overlapping object at the trim point; already covered
                if data is None:
                    if await self._trimmed_past(name.last):
                        expected = name.last + 1
                        continue
                    note(
                        expected,
                        name.last + 1,
                        self._missing_bytes(name.last + 1 - expected),
                        f"WAL object {name.key} vanished during recovery without a trim",
                    )
                    expected = name.last + 1
                    continue
                problem: str | None
                payloads: list[bytes] = []
                try:
                    header, payloads = read_wal_object(data, f"WAL object {name.key}")
                except CorruptionError as exc:
                    problem = str(exc)
                else:
                    problem = await self._header_problem(name, header)
                    if problem is not None:
                        problem = f"WAL object {name.key} {problem}"
                if problem is not None:
                    note(expected, name.last + 1, len(data), problem)
                    expected = name.last + 1
                    continue
                for index, payload in enumerate(payloads):
                    offset = name.first + index
                    if offset < expected:
                        continue
                    if damage is not None:
                        self.damage_reported += 1
                        yield WalRecord(offset, payload, damage_before=damage.report(offset))
                        damage = None
                    else:
                        yield WalRecord(offset, payload)
                expected = name.last + 1
            if damage is not None:
                # Damage at the end that is no torn write (a complete object failed its checks).
                self.damage_reported += 1
                yield WalRecord(expected, b"", damage_before=damage.report(expected))
        finally:
            for task in fetches:
                task.cancel()

    def _missing_bytes(self, records: int) -> int:
        """An upper bound of the bytes ``records`` missing WAL records held (their objects are
        gone, so their sizes are unknown): the engine bounds a data-loss gap with it."""
        return max(0, records) * self.capabilities.max_record_bytes

    async def _fetch(self, key: str) -> bytes | None:
        """The object's bytes; ``None`` when it does not exist."""
        try:
            return await self.store.get(key)
        except NotFound:
            return None

    async def _trimmed_past(self, last: int) -> bool:
        """Whether a trim that covers offset ``last`` was persisted since the scan."""
        async for meta in self.store.list(self._keys.trims):
            start = self._keys.parse_number(meta.key, self._keys.trims)
            if start is not None and start > last:
                self._trim_start = max(self._trim_start, start)
                return True
        return False

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
        try:
            await self._fence.close()
            if (
                self.mode is WalMode.READ_WRITE
                and self.fence_lease_s
                and self._fence.fenced is None
                and self.node_epoch in self._markers
            ):
                # Every group completed (close waited for them) and no more are acknowledged:
                # the next owner need not wait out this writer's lease.
                try:
                    await self.store.put(self._keys.release(self.node_epoch), b"")
                except WalstreamError as exc:
                    log.warning(
                        "S3 WAL node=%d: could not record the clean close (the next owner "
                        "waits out the fence lease): %s",
                        self.node_id,
                        exc,
                    )
        finally:
            if self._owns_store:
                await self.store.close()

    def describe(self) -> dict[str, Any]:
        return {
            "type": "s3",
            "node_id": self.node_id,
            "node_epoch": self.node_epoch,
            "deployment_id": self.deployment_id.hex() or None,
            "format_version": FORMAT_VERSION,
            "next_offset": self._next_offset,
            "trim_start": self._trim_start,
            "objects_written": self.objects_written,
            "fence_checks": self._fence.checks,
            "fence_lease_s": self.fence_lease_s,
            "damaged_gaps": len(self._gaps),
            "torn_objects": self.torn_objects,
            **self.store.settings.describe(),
        }
