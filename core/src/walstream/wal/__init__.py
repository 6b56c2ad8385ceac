"""The write-ahead log: the contract (``contract``), the shared group-commit machinery
(``group_commit``), the coalesced superseded-epoch check (``fencing``), the reference in-memory WAL (``memory``) and the quorum protocol (``quorum``).

A third-party WAL imports what it needs from here: ``from walstream.wal import GroupCommitWal``.
"""

from walstream.records import DEPLOYMENT_ID_BYTES
from walstream.wal.contract import (
    WalCapabilities,
    WalDamage,
    WalMode,
    WalOffset,
    WalRecord,
    WriteAheadLog,
)
from walstream.wal.fencing import (
    LEASE_MARGIN,
    FenceLease,
    SupersededCheck,
    checked_lease_s,
    lease_wait_s,
)
from walstream.wal.group_commit import (
    GroupCommitWal,
    PreparedGroup,
)

__all__ = [
    "DEPLOYMENT_ID_BYTES",
    "LEASE_MARGIN",
    "FenceLease",
    "GroupCommitWal",
    "PreparedGroup",
    "SupersededCheck",
    "WalCapabilities",
    "WalDamage",
    "WalMode",
    "WalOffset",
    "WalRecord",
    "WriteAheadLog",
    "checked_lease_s",
    "lease_wait_s",
]
