"""``walstream inspect wal PATH`` for the ebs WAL: the header slots with the WAL's identity, and
every record of the chain with its checksum status, damaged regions and a torn tail with their
positions. Reads only; never fences nor writes.

:func:`inspect_wal` returns the lines lazily and, once they are all out, raises
:class:`~walstream.errors.CorruptionError` when the WAL is damaged (a damaged region holding
acknowledged records, a truncated medium, no valid header) and
:class:`~walstream.errors.IdentityMismatch` when it belongs to another deployment or node than the
one asked for; ``walstream inspect wal`` then exits 2. A torn tail (unacknowledged writes cut by a
crash) is reported but is not damage.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path

from walstream.errors import BackendUnavailable, CorruptionError, IdentityMismatch

from .layout import BLOCK_BYTES, RECORD_AREA_START, HeaderSlot, pick_header
from .scan import walk_log

__all__ = ["inspect_wal"]


def inspect_wal(
    path: Path | str, *, deployment_id: bytes | None = None, node_id: int | None = None
) -> Iterator[str]:
    """Printable lines describing the WAL at ``path``; after the last line, raises
    CorruptionError on damage and IdentityMismatch when ``deployment_id`` / ``node_id`` are
    given and the WAL records others."""
    lines, problem = _run(Path(path), deployment_id, node_id)
    yield from lines
    if problem is not None:
        raise problem


def _run(
    path: Path, deployment_id: bytes | None, node_id: int | None
) -> tuple[list[str], CorruptionError | None]:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_inspect(path, deployment_id, node_id))
    # Called from async code (a test, a service): decode on a thread with its own loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _inspect(path, deployment_id, node_id)).result()


async def _inspect(
    path: Path, deployment_id: bytes | None, node_id: int | None
) -> tuple[list[str], CorruptionError | None]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise BackendUnavailable(f"cannot open {path}: {exc}") from exc
    loop = asyncio.get_running_loop()

    async def read(position: int, length: int) -> bytes:
        data = await loop.run_in_executor(None, os.pread, fd, length, position)
        return data + bytes(length - len(data))

    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        lines = [f"WAL {path}: {size} bytes"]
        raw = await read(0, RECORD_AREA_START)
        slots = [raw[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES] for i in range(2)]
        header, _ = pick_header(slots)
        for index, slot in enumerate(slots):
            try:
                decoded = HeaderSlot.decode(slot)
            except ValueError as exc:
                lines.append(f"header slot {index}: INVALID ({exc})")
                continue
            newest = " (newest: in use)" if decoded == header else ""
            lines.append(
                f"header slot {index}: version={decoded.version} sequence={decoded.sequence} "
                f"owner=node {decoded.node_id} epoch {decoded.node_epoch} "
                f"capacity={decoded.capacity_bytes} area_start={decoded.area_start} "
                f"tail={decoded.tail_offset} trim={decoded.trim_offset} "
                f"head_floor={decoded.head_floor} acked_through={decoded.acked_through} "
                f"fence_lease_us={decoded.fence_lease_us} timestamp_ms={decoded.timestamp_ms} crc=ok{newest}"
            )
        if header is None:
            raise CorruptionError(f"{path}: no valid header slot; the records cannot be located")
        if header.has_identity:
            lines.append(
                f"identity: deployment {header.deployment_id.hex()} node {header.home_node_id}"
            )
        else:
            lines.append(
                f"identity: none recorded (format version {header.version}); the next "
                "read-write open adopts it"
            )
        problem: CorruptionError | None = None
        mismatch = _identity_problem(path, header, deployment_id, node_id)
        if mismatch is not None:
            lines.append(f"IDENTITY MISMATCH: {mismatch}")
            problem = mismatch
        if size < header.ring_end:
            truncated = CorruptionError(
                f"{path} has {size} bytes but its header declares {header.ring_end}: "
                "truncated, records are missing"
            )
            lines.append(f"TRUNCATED: {truncated}")
            return lines, problem or truncated
        records = record_bytes = damaged_regions = 0
        async for item in walk_log(read, header):
            if item.kind == "record":
                assert item.data is not None
                records += 1
                record_bytes += len(item.data)
                status = "trimmed" if item.offset <= header.trim_offset else "crc=ok"
                lines.append(f"record offset={item.offset} length={len(item.data)} {status}")
            elif item.kind == "padding":
                lines.append(f"padding offset={item.offset} length={item.end - item.offset}")
            elif item.kind == "jump":
                lines.append(f"resume offset={item.offset} (a later writer resumed here)")
            elif item.kind == "damage":
                damage = item.damage
                assert damage is not None
                if damage.end - 1 <= header.trim_offset:
                    lines.append(
                        f"damaged (trimmed) offset={damage.start}..{damage.end}: {damage.reason}"
                    )
                    continue
                damaged_regions += 1
                position = header.area_start + damage.start % header.capacity_bytes
                lines.append(
                    f"DAMAGED offset={damage.start}..{damage.end} file position={position} "
                    f"bytes={damage.damaged_bytes}: {damage.reason} (later writes show "
                    "acknowledged records were there)"
                )
            elif item.torn_start >= 0:
                position = header.area_start + item.torn_start % header.capacity_bytes
                lines.append(
                    f"torn tail at offset={item.torn_start} file position={position}: "
                    f"{item.problem} (not damage)"
                )
            else:
                lines.append(f"end at offset={item.offset}: {item.problem}")
        lines.append(f"{records} record(s), {record_bytes} payload bytes after the tail")
        if damaged_regions:
            damaged = CorruptionError(
                f"{path}: {damaged_regions} damaged region(s) holding acknowledged records; "
                "restore the device, or accept the loss with walstream recover --accept-loss"
            )
            lines.append(f"CORRUPT: {damaged}")
            problem = problem or damaged
        return lines, problem
    finally:
        os.close(fd)


def _identity_problem(
    path: Path, header: HeaderSlot, deployment_id: bytes | None, node_id: int | None
) -> IdentityMismatch | None:
    if deployment_id is not None and header.has_identity and header.deployment_id != deployment_id:
        return IdentityMismatch(
            f"{path} belongs to deployment {header.deployment_id.hex()}, not "
            f"{deployment_id.hex()}; check that the path is this deployment's WAL"
        )
    if node_id is not None and header.home_node_id >= 0 and header.home_node_id != node_id:
        return IdentityMismatch(
            f"{path} belongs to node {header.home_node_id}, not {node_id}; check that the path "
            "is this node's WAL"
        )
    return None
