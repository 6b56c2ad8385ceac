"""The write-ahead log contract and the shared group-commit machinery every WAL plugin builds on.

A plugin implements a handful of medium-specific primitives on top of :class:`GroupCommitWal`
(``_open``, ``_prepare_group``, ``_write_group``, ``_recover``, ``_trim``, ``_reset``,
``_close``); grouping of concurrent appends, the sliding window of in-flight writes, in-order
acknowledgement and error translation live here, once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from walstream.errors import (
    InvalidArgument,
)
from walstream.records import DEPLOYMENT_ID_BYTES

__all__ = [
    "WalCapabilities",
    "WalDamage",
    "WalMode",
    "WalOffset",
    "WalRecord",
    "WriteAheadLog",
]


log = logging.getLogger(__name__)

#: A position in one WAL. Strictly increasing in append order; its unit is the WAL's own
#: (a byte position on a block device, a record sequence number on S3, ...).
WalOffset = int


class WalMode(enum.Enum):
    READ_WRITE = "read_write"
    """Own the WAL: recover it, then append and trim."""
    FAILOVER = "failover"
    """Take over a dead node's WAL: fence its writer, recover, trim/reset; no appends."""
    READ_ONLY = "read_only"
    """Inspect: recover only, never write, never fence."""


@dataclass(frozen=True)
class WalCapabilities:
    """What a WAL promises; the conformance suite skips tests whose capability is missing."""

    max_record_bytes: int
    """Largest ``data`` one ``append`` accepts."""
    capacity_bytes: int | None = None
    """Untrimmed bytes the WAL can hold (``None``: unbounded). The engine keeps well below it."""
    supports_failover: bool = False
    """``start(mode=FAILOVER)`` by another process fences the old writer."""
    survives_process_kill: bool = True
    """Acknowledged records survive SIGKILL of the writing process."""
    survives_power_loss: bool = True
    """Acknowledged records were synced to stable media (not only to the OS page cache)."""
    shared_between_processes: bool = True
    """Another process can open the same WAL (restart, failover). False for in-memory WALs."""
    checks_identity: bool = False
    """The medium records the deployment id (and node id) it was formatted for and refuses to be
    opened by another (invariant 12)."""
    reports_damage: bool = False
    """:meth:`WriteAheadLog.recover` tells damage from a torn tail (invariant 11)."""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WalDamage:
    """A region of the WAL that failed its checks although valid records follow it.

    ``start`` is the WAL offset where the damage begins (the end of the last valid record before
    it); ``end`` the offset of the next valid record. ``damaged_bytes`` is how much of the medium
    the region spans (an upper bound for what the lost records could have held) and ``reason``
    says what failed (checksum, magic, a missing object, ...).
    """

    start: WalOffset
    end: WalOffset
    damaged_bytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class WalRecord:
    offset: WalOffset
    data: bytes
    damage_before: WalDamage | None = None
    """Set on the first valid record after a damaged region (invariant 11): records between the
    previous yielded record and this one may have been acknowledged and are lost.

    A record with ``damage_before`` set and empty ``data`` is a pure damage report: damage at the
    end of the log that provably is not a torn write (a complete S3 object failing its checksum,
    a record attested as acknowledged by a later write); ``offset`` is then the damage's end."""

    @property
    def is_damage_report(self) -> bool:
        return self.damage_before is not None and not self.data


class WriteAheadLog(ABC):
    """A durable, ordered log of opaque records owned by one node.

    Lifecycle: ``start`` → ``recover`` (iterate to the end) → optionally ``reset`` → ``append`` /
    ``trim`` … → ``close``.

    Invariants (the conformance suite has a test named after each):

    1. **ack-order** — futures returned by :meth:`append` complete in call order; a record is
       acknowledged only once it and every record appended before it are durable.
    2. **acked-recovered** — every acknowledged, untrimmed record is yielded by :meth:`recover`
       after a restart (after a process kill too, when ``survives_process_kill``).
    3. **recover-order-exactly-once** — :meth:`recover` yields records in append order, each
       once, with the offset :meth:`append` returned and the exact bytes. It may also yield
       records whose append failed ambiguously, but never bytes that were not appended.
    4. **offsets-increase** — offsets strictly increase in append order, across restarts.
    5. **trim-inclusive** — after ``trim(offset)``, no record at an offset ``<= offset`` is
       recovered again, also after a restart; trimming is idempotent and never goes backwards.
    6. **reset** — after ``reset()``, :meth:`recover` yields nothing and new offsets are greater
       than every earlier offset.
    7. **capacity** — ``append`` of more than ``capabilities.max_record_bytes`` raises
       :class:`CapacityError` at once and writes nothing; when untrimmed records fill the WAL,
       appends wait for a trim, then fail with :class:`CapacityError`.
    8. **fencing** — once another process started the WAL in ``FAILOVER`` mode with a higher
       node epoch, none of the old writer's later appends is acknowledged: they fail with
       :class:`FencedError`.
    9. **errors-typed** — every failure is a :mod:`walstream.errors` type; a write that failed
       after reaching the medium is :class:`AmbiguousError`, and after any failed write the WAL
       refuses further appends (a hole must never be followed by an acknowledged record).
    10. **close** — ``close`` waits for in-flight appends to finish; afterwards ``append`` raises.
    11. **damage-reported** — :meth:`recover` never drops an acknowledged record silently. Only
        a damaged region at the very end of the log, holding nothing that a later durable write
        shows was acknowledged (what can legitimately be in flight at a crash: a torn tail), may
        be dropped. A damaged region with valid data after it is reported: the next valid record
        carries it as ``damage_before`` and recovery continues after it. (``reports_damage``)
    12. **identity** — a WAL records the deployment id given to :meth:`bind_deployment` and the
        node id it was started for; :meth:`start` refuses a medium formatted for another
        deployment or node, or one shorter than it was formatted for, with
        :class:`~walstream.errors.IdentityMismatch` / :class:`CorruptionError`, and
        :meth:`recover` never yields bytes written for another deployment. (``checks_identity``)
    """

    capabilities: WalCapabilities
    deployment_id: bytes = b""
    """The deployment this WAL belongs to; empty until :meth:`bind_deployment`."""

    def bind_deployment(self, deployment_id: bytes) -> None:
        """Tell the WAL which deployment it belongs to; the engine calls this before ``start``.

        WALs that declare ``checks_identity`` write it into their medium when they format it and
        compare it on open and on every record or object they recover.
        """
        if len(deployment_id) != DEPLOYMENT_ID_BYTES:
            raise InvalidArgument(
                f"a deployment id has {DEPLOYMENT_ID_BYTES} bytes, got {len(deployment_id)}"
            )
        self.deployment_id = bytes(deployment_id)

    @abstractmethod
    async def start(self, node_id: int, node_epoch: int, mode: WalMode) -> None: ...

    @abstractmethod
    def append(self, data: bytes) -> asyncio.Future[WalOffset]:
        """Enqueue ``data`` now (call order is log order) and return a future that completes
        with its offset once it is durable (futures complete in call order, invariant 1)."""

    @abstractmethod
    def recover(self) -> AsyncIterator[WalRecord]: ...

    @abstractmethod
    async def trim(self, offset: WalOffset) -> None: ...

    @abstractmethod
    async def reset(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly description for ``walstream inspect`` and logs."""
        return {"type": type(self).__name__}


