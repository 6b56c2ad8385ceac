"""The medium under the ebs WAL: a block device or a preallocated file, opened for durable,
4 KiB-aligned I/O.

With ``direct=True`` (the default) the file is opened ``O_DIRECT | O_DSYNC`` and every read and
write goes through Linux AIO (``io_submit``), completions arriving on an eventfd watched by the
asyncio loop: no thread per write, many writes in flight at once. Buffers are anonymous ``mmap``
regions, hence page aligned, as ``O_DIRECT`` requires.

With ``direct=False`` (filesystems that refuse ``O_DIRECT``, such as some tmpfs) the file is opened
``O_DSYNC`` only and writes run ``pwrite`` on the default thread pool.

Durability: ``O_DSYNC`` on the descriptor, rather than ``fdatasync`` after each write. Each AIO
write then completes only once its own data (and the extent metadata needed to read it back) is on
stable media — the kernel issues it with FUA or follows it with a cache flush — so every write of
the sliding window is durable on its own completion, in one system call, without waiting for the
other in-flight writes the way an ``fdatasync`` of the whole file would. (An AIO ``fdatasync``
command is also refused by most filesystems.)

Each AIO request costs little Python (:class:`_Aio`): the control blocks are allocated once per
open and reused; a request fills five fields of a free one and goes to ``io_submit`` through the
``ctypes`` declarations of the ``libaio`` package, and completions are collected into one
preallocated event array. (The package's object layer built a control block, an iovec array and a
bookkeeping entry per request, and a 512-event array per collection.)
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import mmap
import os
import stat
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from walstream.errors import AmbiguousError, BackendUnavailable, ConfigError

from .layout import BLOCK_BYTES

__all__ = [
    "BufferPool",
    "WalDevice",
    "aligned_buffer",
    "create_preallocated_file",
    "supports_direct_io",
]

_AIO_MAX_EVENTS = 512
_REAP_BATCH = 64
"""Completion events collected per ``io_getevents`` call (more calls when more are ready)."""
_IO_CMD_PREAD = 0
_IO_CMD_PWRITE = 1
_IOCB_FLAG_RESFD = 1
"""``struct iocb`` flag: signal ``aio_resfd`` (an eventfd) when the request completes."""

WriteBuffer = mmap.mmap | memoryview
"""A page-aligned buffer, or a view of one starting at its first byte."""


def aligned_buffer(length: int) -> mmap.mmap:
    """A zero-filled, page-aligned buffer (anonymous mmap) of ``length`` bytes."""
    return mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class BufferPool:
    """Reuses page-aligned buffers: a fresh ``mmap`` costs a page fault per 4 KiB on first
    touch, which dominates the cost of packing a large group. Buffers come in power-of-two
    sizes; ``take`` returns a buffer and a view of exactly the requested length."""

    def __init__(self, max_pooled_bytes: int = 64 << 20) -> None:
        self._free: dict[int, list[mmap.mmap]] = {}
        self._pooled_bytes = 0
        self._max_pooled_bytes = max_pooled_bytes

    def take(self, length: int) -> mmap.mmap:
        size = max(BLOCK_BYTES, 1 << (length - 1).bit_length())
        free = self._free.get(size)
        if free:
            self._pooled_bytes -= size
            return free.pop()
        return aligned_buffer(size)

    def give_back(self, buffer: mmap.mmap) -> None:
        size = len(buffer)
        if self._pooled_bytes + size > self._max_pooled_bytes:
            return  # dropped: unmapped when collected
        self._free.setdefault(size, []).append(buffer)
        self._pooled_bytes += size


def create_preallocated_file(path: Path, size_bytes: int) -> None:
    """Create ``path`` with ``size_bytes`` allocated (``fallocate``); fsync it and its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise BackendUnavailable(f"cannot create the WAL file {path}: {exc}") from exc
    try:
        os.posix_fallocate(fd, 0, size_bytes)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise BackendUnavailable(
            f"cannot preallocate {size_bytes} bytes for the WAL file {path}: {exc}; "
            "free space or lower wal.capacity"
        ) from exc
    os.close(fd)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def supports_direct_io(folder: Path) -> bool:
    """Whether files in ``folder`` accept ``O_DIRECT`` (tmpfs, for one, may not)."""
    probe = folder / ".walstream-direct-probe"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    else:
        os.close(fd)
        return True
    finally:
        probe.unlink(missing_ok=True)


class WalDevice:
    """An open WAL medium. ``write`` returns once the bytes are durable."""

    def __init__(self, path: Path, *, direct: bool, writable: bool) -> None:
        self.path = path
        self.direct = direct
        flags = (os.O_RDWR | os.O_DSYNC) if writable else os.O_RDONLY
        flags |= os.O_CLOEXEC
        if direct:
            flags |= os.O_DIRECT
        try:
            self.fd = os.open(path, flags)
        except FileNotFoundError as exc:
            raise BackendUnavailable(
                f"the WAL file {path} does not exist; set wal.create: true to create it"
            ) from exc
        except OSError as exc:
            if direct and exc.errno == errno.EINVAL:
                raise ConfigError(
                    f"wal.direct: the filesystem holding {path} refuses O_DIRECT (tmpfs?); "
                    "set direct: false for this WAL or move it to a disk"
                ) from exc
            raise BackendUnavailable(f"cannot open the WAL file {path}: {exc}") from exc
        mode = os.fstat(self.fd).st_mode
        self.is_block_device = stat.S_ISBLK(mode)
        self.size_bytes = os.lseek(self.fd, 0, os.SEEK_END)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aio: _Aio | None = None
        self._read_buffers = BufferPool(max_pooled_bytes=1 << 20)
        """Read buffers are reused: a header read (every fence check) would otherwise map and
        unmap a fresh buffer, and unmapping is a costly system call."""

    # -- lifecycle ---------------------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start delivering AIO completions to ``loop`` (direct mode only)."""
        self._loop = loop
        if not self.direct:
            return
        aio = _Aio(self.fd, _AIO_MAX_EVENTS)
        self._aio = aio
        loop.add_reader(aio.eventfd, aio.reap)

    def close(self) -> None:
        if self._aio is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._aio.eventfd)
            self._aio.close()
            self._aio = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- I/O -----------------------------------------------------------------------------------

    def start_writes(self, writes: Sequence[tuple[WriteBuffer, int]]) -> Coroutine[Any, Any, None]:
        """Submit ``writes`` now (direct mode: ``io_submit`` before returning) and return what
        to await for :meth:`write_all`'s outcome: the writes are durable when it returns. The
        result must be awaited (it is what reports a failed submission)."""
        if not self.direct:
            return self.write_all(writes)
        issued = self._issue(writes, write=True)
        return self._finish_writes(writes, self._complete(issued, write=True))

    async def write_all(self, writes: Sequence[tuple[WriteBuffer, int]]) -> None:
        """Write each ``(buffer, position)`` (4 KiB aligned) concurrently; durable on return."""
        if self.direct:
            results = await self._submit(writes, write=True)
        else:
            loop = self._require_loop()
            results = await asyncio.gather(
                *(
                    loop.run_in_executor(None, _pwrite_or_errno, self.fd, buffer, position)
                    for buffer, position in writes
                )
            )
        self._check_writes(writes, results)

    async def _finish_writes(
        self, writes: Sequence[tuple[WriteBuffer, int]], completion: Awaitable[list[int]]
    ) -> None:
        self._check_writes(writes, await completion)

    def _check_writes(self, writes: Sequence[tuple[WriteBuffer, int]], results: list[int]) -> None:
        for (buffer, position), result in zip(writes, results, strict=True):
            if result != len(buffer):
                raise AmbiguousError(self._io_problem("write", position, len(buffer), result))

    async def read(self, position: int, length: int) -> bytes:
        """Read ``length`` bytes at ``position`` (both 4 KiB aligned) from the medium."""
        if position % BLOCK_BYTES or length % BLOCK_BYTES:
            raise ValueError("unaligned read")
        buffer = self._read_buffers.take(length)
        view = memoryview(buffer)[:length]
        try:
            if self.direct:
                (result,) = await self._submit([(view, position)], write=False)
            else:
                loop = self._require_loop()
                result = await loop.run_in_executor(None, _pread_or_errno, self.fd, view, position)
        except asyncio.CancelledError:
            view.release()
            raise  # the kernel may still write into the buffer: never reuse it
        except BaseException:
            view.release()
            self._read_buffers.give_back(buffer)
            raise
        try:
            if result < 0:
                raise BackendUnavailable(self._io_problem("read", position, length, result))
            return bytes(view[:result]) + bytes(length - result)
        finally:
            view.release()
            self._read_buffers.give_back(buffer)

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("WalDevice.attach() was not called")
        return self._loop

    async def _submit(
        self, requests: Sequence[tuple[WriteBuffer, int]], *, write: bool
    ) -> list[int]:
        return await self._complete(self._issue(requests, write=write), write=write)

    def _issue(self, requests: Sequence[tuple[WriteBuffer, int]], *, write: bool) -> _Issued:
        """``io_submit`` the requests now; :meth:`_complete` waits for them."""
        aio = self._aio
        if aio is None:
            raise RuntimeError("WalDevice.attach() was not called")
        return aio.submit(self._require_loop(), requests, write=write)

    async def _complete(self, issued: _Issued, *, write: bool) -> list[int]:
        futures, submitted, exc = issued.futures, issued.submitted, issued.error
        if exc is not None:
            action = "write" if write else "read"
            problem = f"io_submit of a {action} to {self.path} failed: {exc}"
            if submitted:
                # Part of the request reached the device: wait for it before reporting.
                await asyncio.gather(*futures[:submitted], return_exceptions=True)
            if write and submitted:
                raise AmbiguousError(problem) from exc
            raise BackendUnavailable(problem) from exc
        if len(futures) == 1:
            return [await futures[0]]  # no gathering: one hop of the loop less
        return list(await asyncio.gather(*futures))

    def _io_problem(self, action: str, position: int, length: int, result: int) -> str:
        if result < 0:
            reason = os.strerror(-result)
            if self.direct and -result == errno.EINVAL:
                reason += " (the filesystem may refuse O_DIRECT: set direct: false)"
        else:
            reason = f"only {result} bytes transferred"
        return f"{action} of {length} bytes at {position} on {self.path} failed: {reason}"


@dataclass(frozen=True, slots=True)
class _Issued:
    """Requests handed to the kernel: a future per request (the first ``submitted`` of them
    resolve), and the error that stopped the submission, if any."""

    futures: list[asyncio.Future[int]]
    submitted: int
    error: OSError | None


class _Aio:
    """A Linux AIO context for one descriptor, with ``slots`` control blocks allocated once.

    A request takes a free block, fills in its operation, buffer, length and position (the
    descriptor and the eventfd to signal are set once) and is submitted with ``io_submit``; its
    future and buffer stay in the block's slot until :meth:`reap` collects its completion event
    (the block's ``data`` field names the slot), resolves the future with the result (bytes
    transferred or ``-errno``) and frees the slot. A request that was not submitted frees its
    slot at once. Buffers must be writable (``mmap`` or a view of one): their address is taken
    through ``ctypes``."""

    def __init__(self, fd: int, slots: int) -> None:
        from libaio import libaio as raw  # ctypes declarations of libaio.h; no type information

        self._raw: Any = raw
        context = raw.io_context_t()
        raw.io_setup(slots, ctypes.byref(context))
        self._context: Any = context
        try:
            self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            raw.io_destroy(context)
            raise
        blocks = (raw.iocb * slots)()
        self._blocks: Any = blocks
        self._common: list[Any] = []
        """Each block's read/write part (``u.c``), looked up once."""
        self._pointers: list[Any] = []
        for index in range(slots):
            block = blocks[index]
            block.aio_fildes = fd
            block.data = index + 1  # 0 would read back as None
            common = block.u.c
            common.flags = _IOCB_FLAG_RESFD
            common.resfd = self.eventfd
            self._common.append(common)
            self._pointers.append(ctypes.pointer(block))
        self._submit_list: Any = (raw.iocb_p * slots)()
        self._free = list(range(slots - 1, -1, -1))
        self._futures: list[asyncio.Future[int] | None] = [None] * slots
        self._buffers: list[WriteBuffer | None] = [None] * slots
        """What each submitted request reads from or writes into: kept alive until it completes."""
        self._events: Any = (raw.io_event * _REAP_BATCH)()
        self._no_wait: Any = ctypes.byref(raw.timespec(0, 0))

    def submit(
        self,
        loop: asyncio.AbstractEventLoop,
        requests: Sequence[tuple[WriteBuffer, int]],
        *,
        write: bool,
    ) -> _Issued:
        futures: list[asyncio.Future[int]] = []
        taken: list[int] = []
        opcode = _IO_CMD_PWRITE if write else _IO_CMD_PREAD
        blocks, common, submit_list = self._blocks, self._common, self._submit_list
        try:
            for buffer, position in requests:
                if not self._free:
                    raise OSError(errno.EAGAIN, "no free AIO control block")
                index = self._free.pop()
                taken.append(index)
                blocks[index].aio_lio_opcode = opcode
                part = common[index]
                part.buf = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
                part.nbytes = len(buffer)
                part.offset = position
                future: asyncio.Future[int] = loop.create_future()
                futures.append(future)
                self._futures[index] = future
                self._buffers[index] = buffer
                submit_list[len(taken) - 1] = self._pointers[index]
        except (OSError, TypeError, ValueError) as exc:
            self._release(taken)
            problem = exc if isinstance(exc, OSError) else OSError(errno.EINVAL, str(exc))
            return _Issued([], 0, problem)
        submitted = 0
        try:
            while submitted < len(taken):
                if submitted:
                    for at, index in enumerate(taken[submitted:]):
                        submit_list[at] = self._pointers[index]
                submitted += self._raw.io_submit(self._context, len(taken) - submitted, submit_list)
        except OSError as exc:
            self._release(taken[submitted:])
            return _Issued(futures, submitted, exc)
        return _Issued(futures, submitted, None)

    def _release(self, indexes: Sequence[int]) -> None:
        for index in indexes:
            self._futures[index] = None
            self._buffers[index] = None
            self._free.append(index)

    def reap(self) -> None:
        """Collect every completion the kernel has (never waiting); resolve their futures."""
        try:
            os.eventfd_read(self.eventfd)
        except BlockingIOError:
            pass
        raw, events, futures, buffers, free = (
            self._raw,
            self._events,
            self._futures,
            self._buffers,
            self._free,
        )
        while True:
            count = raw.io_getevents(self._context, 0, _REAP_BATCH, events, self._no_wait)
            for at in range(count):
                event = events[at]
                index = event.data - 1
                future = futures[index]
                futures[index] = None
                buffers[index] = None
                free.append(index)
                if future is not None and not future.done():
                    future.set_result(event.res)
            if count < _REAP_BATCH:
                return

    def close(self) -> None:
        """Destroy the context (waiting for requests in flight), then close the eventfd."""
        self._raw.io_destroy(self._context)
        os.close(self.eventfd)


def _pwrite_or_errno(fd: int, buffer: WriteBuffer, position: int) -> int:
    try:
        return os.pwrite(fd, buffer, position)
    except OSError as exc:
        return -(exc.errno or errno.EIO)


def _pread_or_errno(fd: int, buffer: WriteBuffer, position: int) -> int:
    try:
        return os.preadv(fd, [buffer], position)
    except OSError as exc:
        return -(exc.errno or errno.EIO)
