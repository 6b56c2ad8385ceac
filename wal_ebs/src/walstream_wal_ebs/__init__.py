"""walstream WAL on a raw block device (an EBS volume) or a preallocated file.

Entry point ``ebs`` in the ``walstream.wal`` group. YAML::

    wal: {type: ebs, path: ./walstream-data/wal.img, capacity: 1GiB}
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from walstream.config import BackendFactory, BuildContext, Option

from .device import supports_direct_io
from .inspect import inspect_wal
from .wal import EbsWal

__all__ = ["EBS_WAL", "EbsWal", "inspect_wal"]


def _create(options: dict[str, Any], context: BuildContext) -> EbsWal:
    return EbsWal(
        options["path"],
        capacity_bytes=options["capacity"],
        create=options["create"],
        direct=options["direct"],
        max_inflight=options["max_inflight"],
        max_group_bytes=options["max_group_bytes"],
        max_group_delay_s=options["max_group_delay"],
        fence_lease_s=options["fence_lease"],
    )


@contextlib.contextmanager
def _provision(folder: Path) -> Iterator[dict[str, Any]]:
    """A throwaway WAL file for the conformance suite."""
    yield {
        "path": str(folder / "wal.img"),
        "capacity": "8MiB",
        "direct": supports_direct_io(folder),
    }


EBS_WAL: BackendFactory[EbsWal] = BackendFactory(
    kind="wal",
    name="ebs",
    description="WAL on a raw block device or preallocated file (O_DIRECT + libaio, circular)",
    options=(
        Option("path", "path", "block device or WAL file (created if missing)", required=True),
        Option(
            "capacity",
            "size",
            "size of the file to create (header + ring)",
            default="1GiB",
            minimum=64 << 10,
        ),
        Option(
            "create", "bool", "create and format the file if missing or unformatted", default=True
        ),
        Option(
            "direct",
            "bool",
            "O_DIRECT + libaio; set false on filesystems refusing O_DIRECT",
            default=True,
        ),
        Option("max_inflight", "int", "group writes in flight at once", default=4, minimum=1),
        Option(
            "max_group_bytes",
            "size",
            "close a group at this many payload bytes",
            default="1MiB",
            minimum=1,
        ),
        Option(
            "max_group_delay",
            "duration",
            "longest a record waits for company while writes are in flight",
            default="500us",
        ),
        Option(
            "fence_lease",
            "duration",
            "acknowledge without a header read this long after one showed this writer the "
            "owner; a takeover waits it out (0: read the header after every group)",
            default="20ms",
        ),
    ),
    create=_create,
    provision=_provision,
    inspect=inspect_wal,
)
