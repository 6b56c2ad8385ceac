"""An example third-party WAL on one append-only file, fsynced before acknowledging; it passes the
conformance suite with its declared capabilities. Entries: ``kind u8 | offset i64 | length u32 |
crc32 u32 | data``; trim appends a TRIM entry; recovery stops at the first torn entry."""

from __future__ import annotations

import asyncio
import os
import struct
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from walstream.errors import BackendUnavailable
from walstream.wal import GroupCommitWal, PreparedGroup, WalCapabilities, WalMode, WalRecord

HEADER, DATA, TRIM = struct.Struct(">BqII"), 1, 2


def _entry(kind: int, offset: int, data: bytes) -> bytes:
    crc = zlib.crc32(data, zlib.crc32(struct.pack(">Bq", kind, offset)))
    return HEADER.pack(kind, offset, len(data), crc) + data


class AppendFileWal(GroupCommitWal):
    def __init__(self, path: str | os.PathLike[str], io: Any = os, max_record_bytes: int = 1 << 20):
        caps = WalCapabilities(max_record_bytes=max_record_bytes, supports_failover=False)
        super().__init__(capabilities=caps, max_inflight=1)
        self.path, self.io = os.fspath(path), io
        self._fd, self._end, self._next, self._trimmed = -1, 0, 0, -1
        self._recovered: list[WalRecord] = []
        self._last_write: asyncio.Future[None] | None = None  # writes land in file order

    def _call(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return function(*args)
        except OSError as error:
            raise BackendUnavailable(f"WAL {self.path}: {what}: {error}; check the disk") from error

    async def _open(self, node_id: int, node_epoch: int, mode: WalMode) -> None:
        flags = os.O_RDONLY if mode is WalMode.READ_ONLY else os.O_RDWR | os.O_CREAT
        self._fd = self._call("open", self.io.open, self.path, flags, 0o644)
        size = self._call("stat", self.io.fstat, self._fd).st_size
        data, position = self._call("read", self.io.pread, self._fd, size, 0), 0
        while position + HEADER.size <= len(data):
            kind, offset, length, _ = HEADER.unpack_from(data, position)
            body = data[position + HEADER.size : position + HEADER.size + length]
            if _entry(kind, offset, body) != data[position : position + HEADER.size + length]:
                break  # a torn or never-written entry: the end of the log
            if kind == TRIM:
                self._trimmed = max(self._trimmed, offset)
            self._recovered += [WalRecord(offset, body)] if kind == DATA else []
            self._next = max(self._next, offset + 1)
            position += HEADER.size + length
        self._end = position

    def _prepare_group(self, payloads: Sequence[bytes]) -> PreparedGroup:
        offsets = list(range(self._next, self._next + len(payloads)))
        self._next += len(payloads)
        buffer = b"".join(_entry(DATA, o, p) for o, p in zip(offsets, payloads, strict=True))
        return PreparedGroup(offsets, list(payloads), state=self._reserve(buffer))

    def _reserve(self, buffer: bytes) -> tuple[int, bytes, Any, asyncio.Future[None]]:
        position, self._end = self._end, self._end + len(buffer)
        previous, self._last_write = self._last_write, asyncio.get_running_loop().create_future()
        return position, buffer, previous, self._last_write

    async def _write_group(self, group: PreparedGroup) -> None:
        await self._write_in_order(*group.state)

    async def _write_in_order(self, position: int, buffer: bytes, previous: Any, done: Any) -> None:
        # In file order: a crash never leaves a TRIM behind a hole that ends recovery before it.
        try:
            await asyncio.shield(previous) if previous is not None else None
            await asyncio.to_thread(self._durable_write, position, buffer)
        finally:
            done.set_result(None)

    def _durable_write(self, position: int, buffer: bytes) -> None:
        self._call("write", self.io.pwrite, self._fd, buffer, position)
        self._call("fsync", self.io.fsync, self._fd)

    async def _recover(self) -> AsyncIterator[WalRecord]:
        records, self._recovered = self._recovered, []
        for record in (record for record in records if record.offset > self._trimmed):
            yield record

    async def _trim(self, offset: int) -> None:
        if offset > self._trimmed:
            self._trimmed = offset
            await self._write_in_order(*self._reserve(_entry(TRIM, offset, b"")))

    async def _reset(self) -> None:
        await self._trim(self._next - 1)

    async def _close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self._call("close", self.io.close, fd)
