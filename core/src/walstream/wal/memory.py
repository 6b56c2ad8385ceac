"""Reference in-memory backends. Small on purpose: they document the contracts.

State lives in named, process-wide "volumes" so that closing a client and opening a new one on
the same name sees the same data (the way a restart sees a disk). Nothing survives the process.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from walstream.config.factory import BackendFactory, BuildContext
from walstream.config.options import Option
from walstream.errors import (
    FencedError,
    IdentityMismatch,
    InvalidArgument,
)
from walstream.wal.contract import WalCapabilities, WalMode, WalOffset, WalRecord
from walstream.wal.group_commit import GroupCommitWal, PreparedGroup

__all__ = [
    "MEMORY_WAL",
    "MemoryWal",
]


@dataclass
class _WalVolume:
    records: list[WalRecord] = field(default_factory=list)
    next_offset: int = 0
    trim_offset: int = -1
    owner_epoch: int = -1
    used_bytes: int = 0
    deployment_id: bytes = b""
    """The deployment the volume was first opened for (empty until one is bound)."""


_WAL_VOLUMES: dict[str, _WalVolume] = {}


class MemoryWal(GroupCommitWal):
    """A WAL in process memory. ``capacity_bytes`` bounds untrimmed bytes (back-pressure)."""

    def __init__(
        self,
        name: str | None = None,
        capacity_bytes: int = 256 << 20,
        max_record_bytes: int = 16 << 20,
        write_delay_s: float = 0.0,
        **group_options: Any,
    ) -> None:
        super().__init__(
            capabilities=WalCapabilities(
                max_record_bytes=max_record_bytes,
                capacity_bytes=capacity_bytes,
                supports_failover=True,
                survives_process_kill=False,
                survives_power_loss=False,
                shared_between_processes=False,
                checks_identity=True,
            ),
            **group_options,
        )
        self._volume = _WAL_VOLUMES.setdefault(name, _WalVolume()) if name else _WalVolume()
        self._capacity_bytes = capacity_bytes
        self._write_delay_s = write_delay_s
        self._reserved_bytes = 0

    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        volume = self._volume
        self._check_identity(volume)
        if mode is not WalMode.READ_ONLY:
            if node_epoch < volume.owner_epoch:
                raise FencedError(
                    f"memory WAL is owned by epoch {volume.owner_epoch} > {node_epoch}"
                )
            volume.owner_epoch = node_epoch

    def _check_identity(self, volume: _WalVolume) -> None:
        if not self.deployment_id:
            return
        if not volume.deployment_id:
            volume.deployment_id = self.deployment_id
        elif volume.deployment_id != self.deployment_id:
            raise IdentityMismatch(
                f"memory WAL volume belongs to deployment {volume.deployment_id.hex()}, not "
                f"{self.deployment_id.hex()}; give each deployment its own volume name"
            )

    def _prepare_group(self, payloads: Sequence[bytes]) -> PreparedGroup:
        from walstream.errors import CapacityError

        size = sum(len(payload) for payload in payloads)
        if self._volume.used_bytes + self._reserved_bytes + size > self._capacity_bytes:
            raise CapacityError(
                f"memory WAL full: {self._volume.used_bytes} of {self._capacity_bytes} bytes "
                "untrimmed"
            )
        self._reserved_bytes += size
        offsets = []
        for _ in payloads:
            offsets.append(self._volume.next_offset)
            self._volume.next_offset += 1
        return PreparedGroup(offsets, list(payloads), state=size)

    async def _write_group(self, group: PreparedGroup) -> None:
        if self._write_delay_s:
            await self.clock.sleep(self._write_delay_s)
        volume = self._volume
        self._reserved_bytes -= group.state
        if volume.owner_epoch != self.node_epoch:
            raise FencedError(
                f"memory WAL was taken over by epoch {volume.owner_epoch}; "
                f"this writer has epoch {self.node_epoch}"
            )
        for offset, payload in zip(group.offsets, group.payloads, strict=True):
            volume.records.append(WalRecord(offset, payload))
            volume.used_bytes += len(payload)

    async def _recover(self) -> AsyncIterator[WalRecord]:
        for record in list(self._volume.records):
            if record.offset > self._volume.trim_offset:
                yield record

    async def _trim(self, offset: WalOffset) -> None:
        volume = self._volume
        if offset >= volume.next_offset:
            raise InvalidArgument(f"trim({offset}) beyond the last offset {volume.next_offset - 1}")
        volume.trim_offset = max(volume.trim_offset, offset)
        offsets = [record.offset for record in volume.records]
        cut = bisect.bisect_right(offsets, volume.trim_offset)
        volume.used_bytes -= sum(len(record.data) for record in volume.records[:cut])
        del volume.records[:cut]

    async def _reset(self) -> None:
        volume = self._volume
        volume.records.clear()
        volume.used_bytes = 0
        volume.trim_offset = volume.next_offset - 1

    async def _close(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"type": "memory", "untrimmed_bytes": self._volume.used_bytes}


def _make_memory_wal(options: dict[str, Any], context: BuildContext) -> MemoryWal:
    return MemoryWal(
        name=options["name"],
        capacity_bytes=options["capacity"],
        max_record_bytes=options["max_record_bytes"],
    )


def _provision(folder: Path) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """A throwaway volume for the conformance suite: named after the test's scratch folder,
    and small enough (32 MiB) for the back-pressure test to fill it."""
    return contextlib.nullcontext({"name": f"provisioned:{folder}", "capacity": "32MiB"})


MEMORY_WAL: BackendFactory[MemoryWal] = BackendFactory(
    kind="wal",
    name="memory",
    description="WAL in process memory (tests, demos; nothing survives the process)",
    options=(
        Option("name", "str", "volume name: clients opened with the same name share the data"),
        Option("capacity", "size", "untrimmed bytes it holds", default="256MiB"),
        Option("max_record_bytes", "size", "largest append", default="16MiB"),
    ),
    create=_make_memory_wal,
    provision=_provision,
)
