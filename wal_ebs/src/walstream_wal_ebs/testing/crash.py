"""How the shared crash harness (:mod:`walstream_conformance.harness.crash`) builds an ebs WAL
in its writer processes."""

from __future__ import annotations

from pathlib import Path

from walstream_conformance.backends import BackendSpec

__all__ = ["crash_spec"]


def crash_spec(path: Path | str, *, capacity_bytes: int = 1 << 20) -> BackendSpec:
    """How a crash writer process builds an ebs WAL on ``path`` (a file or a block device):
    a small capacity so that trims and wrap-around happen within seconds."""
    return BackendSpec(
        "wal",
        target="walstream_wal_ebs.wal:EbsWal",
        kwargs={
            "path": str(path),
            "capacity_bytes": capacity_bytes,
            "max_inflight": 4,
            "max_group_bytes": 64 << 10,
            "max_group_delay_s": 0.0002,
            "capacity_wait_s": 2.0,
        },
    )
