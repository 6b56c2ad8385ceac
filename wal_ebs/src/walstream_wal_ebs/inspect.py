"""``walstream inspect wal PATH`` for the ebs WAL: the header slots and every record of the chain,
with its checksum status. Reads only; never fences nor writes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path

from walstream.errors import BackendUnavailable, CorruptionError

from .layout import BLOCK_BYTES, RECORD_AREA_START, HeaderSlot, pick_header
from .scan import scan_ring

__all__ = ["inspect_wal"]


def inspect_wal(path: Path | str) -> Iterator[str]:
    """Printable lines describing the WAL at ``path``; raises CorruptionError when no header
    slot is valid (the records cannot be located)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return iter(asyncio.run(_inspect(Path(path))))
    # Called from async code (a test, a service): decode on a thread with its own loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return iter(pool.submit(asyncio.run, _inspect(Path(path))).result())


async def _inspect(path: Path) -> list[str]:
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
                f"header slot {index}: sequence={decoded.sequence} owner=node {decoded.node_id} "
                f"epoch {decoded.node_epoch} capacity={decoded.capacity_bytes} "
                f"area_start={decoded.area_start} tail={decoded.tail_offset} "
                f"trim={decoded.trim_offset} head_floor={decoded.head_floor} "
                f"timestamp_ms={decoded.timestamp_ms} crc=ok{newest}"
            )
        if header is None:
            raise CorruptionError(
                f"{path}: no valid header slot; the records cannot be located"
            )
        records = record_bytes = 0
        async for step in scan_ring(read, header):
            if step.kind == "record":
                assert step.data is not None
                records += 1
                record_bytes += len(step.data)
                status = "trimmed" if step.offset <= header.trim_offset else "crc=ok"
                lines.append(f"record offset={step.offset} length={len(step.data)} {status}")
            elif step.kind == "padding":
                lines.append(f"padding offset={step.offset} length={step.end - step.offset}")
            elif step.kind == "jump":
                lines.append(f"resume offset={step.offset} (a later writer resumed here)")
            else:
                verdict = "CORRUPT" if step.corrupt else "end"
                lines.append(f"{verdict} at offset={step.offset}: {step.problem}")
        lines.append(f"{records} record(s), {record_bytes} payload bytes after the tail")
        return lines
    finally:
        os.close(fd)
