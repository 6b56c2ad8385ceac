"""A power-loss simulation for WALs on files: a thin "medium" layer between the WAL and ``os``.

:class:`SimulatedDisk` offers the ``os`` calls a file WAL uses (``open``, ``pread``, ``pwrite``,
``write``, ``fsync``, ``fdatasync``, ``fstat``, ``close``). Every call reaches the real file at
once — as the OS page cache would, so a SIGKILL of the process keeps the data — but the disk
also keeps, per file, the image that was last made durable by ``fsync``. :meth:`lose_power`
puts each file back to that image plus a seeded random prefix of the unsynced writes (the last
one possibly torn), the way a machine losing power keeps some of its dirty pages. File
descriptors opened before the power loss fail afterwards (the machine is off).

A WAL that takes its ``os``-like module as a parameter (``io=os`` by default) runs on it
unchanged; one that acknowledges before ``fsync`` loses acknowledged records here.

Why not a kernel-level tool: dm-log-writes or dm-flakey need root, device-mapper and loop
devices, which CI containers rarely have; this layer needs nothing and replays by seed.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from dataclasses import dataclass, field

__all__ = ["SimulatedDisk"]


@dataclass
class _FileState:
    synced: bytearray
    unsynced: list[tuple[int, bytes]] = field(default_factory=list)


class SimulatedDisk:
    """Real files whose durability is decided by ``fsync`` (see the module docstring)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random(0)
        self._lock = threading.Lock()
        self._files: dict[str, _FileState] = {}
        self._fd_paths: dict[int, str] = {}
        self._positions: dict[int, int] = {}
        self._broken = False
        self.power_losses = 0
        self.lost_writes = 0

    # -- faults -----------------------------------------------------------------------------------

    def fail(self, broken: bool) -> None:
        """While broken, every write and sync raises ``OSError(EIO)`` (a failing device)."""
        self._broken = broken

    def lose_power(self) -> None:
        """Drop unsynced writes (keeping a seeded random prefix, the last one maybe torn) and
        invalidate every open file descriptor."""
        with self._lock:
            for path, state in self._files.items():
                keep = self._rng.randint(0, len(state.unsynced))
                content = bytearray(state.synced)
                for index, (offset, data) in enumerate(state.unsynced[:keep]):
                    if index == keep - 1:
                        data = data[: self._rng.randint(0, len(data))]
                    _apply(content, offset, data)
                self.lost_writes += len(state.unsynced) - keep
                with open(path, "wb") as file:
                    file.write(content)
                state.synced = content
                state.unsynced.clear()
            for fd in list(self._fd_paths):
                os.close(fd)
            self._fd_paths.clear()
            self._positions.clear()
            self.power_losses += 1

    # -- the os-like calls ----------------------------------------------------------------------

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
        self._check_up()
        resolved = os.path.abspath(os.fspath(path))
        fd = os.open(resolved, flags, mode)
        with self._lock:
            if resolved not in self._files:
                with open(resolved, "rb") as file:
                    self._files[resolved] = _FileState(bytearray(file.read()))
            self._fd_paths[fd] = resolved
            self._positions[fd] = os.fstat(fd).st_size if flags & os.O_APPEND else 0
        return fd

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        path = self._path_of(fd)
        self._check_up()
        written = os.pwrite(fd, data, offset)
        with self._lock:
            self._files[path].unsynced.append((offset, bytes(data[:written])))
        return written

    def write(self, fd: int, data: bytes) -> int:
        written = self.pwrite(fd, data, self._positions[fd])
        self._positions[fd] += written
        return written

    def fsync(self, fd: int) -> None:
        path = self._path_of(fd)
        self._check_up()
        os.fsync(fd)
        with self._lock:
            state = self._files[path]
            for offset, data in state.unsynced:
                _apply(state.synced, offset, data)
            state.unsynced.clear()

    fdatasync = fsync

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        self._path_of(fd)
        return os.pread(fd, length, offset)

    def fstat(self, fd: int) -> os.stat_result:
        self._path_of(fd)
        return os.fstat(fd)

    def close(self, fd: int) -> None:
        with self._lock:
            if self._fd_paths.pop(fd, None) is None:
                raise OSError(errno.EBADF, "file descriptor closed by a power loss")
            self._positions.pop(fd, None)
        os.close(fd)

    def _path_of(self, fd: int) -> str:
        try:
            return self._fd_paths[fd]
        except KeyError:
            raise OSError(errno.EIO, "the device lost power; reopen the file") from None

    def _check_up(self) -> None:
        if self._broken:
            raise OSError(errno.EIO, "simulated device failure")


def _apply(content: bytearray, offset: int, data: bytes) -> None:
    end = offset + len(data)
    if end > len(content):
        content.extend(b"\0" * (end - len(content)))
    content[offset:end] = data
