"""LocalObjectStore: objects as files under a root folder (the embedded default object store).

Key ``a/b/c.wso`` is the file ``root/a/b/c.wso``. Every write goes to a temporary file in the
target folder (named ``.tmp-…``, never listed), is flushed and fsynced, then published in one
atomic step — ``os.replace`` for ``put``, ``os.link`` for ``put_if_absent`` (which fails if the
name exists, so the create is conditional across processes) — and the folder is fsynced so the
new name survives a power loss. Blocking calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import stat
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

from walstream.config.factory import BackendFactory, BuildContext
from walstream.config.options import Option
from walstream.errors import (
    BackendUnavailable,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)
from walstream.objects.contract import (
    ObjectMeta,
    ObjectStore,
    ObjectStoreCapabilities,
    ObjectWriter,
    clamp_range,
)

__all__ = ["LOCAL_OBJECT_STORE", "LocalObjectStore", "LocalObjectWriter"]

TEMP_PREFIX = ".tmp-"
_READ_CHUNK_BYTES = 8 << 20
_UNAVAILABLE_HINTS = {
    errno.ENOSPC: "no space left on the device: free space or move object_store.root",
    errno.EDQUOT: "disk quota exceeded: free space or raise the quota",
    errno.EIO: "I/O error from the device: check the disk and the kernel log",
    errno.EACCES: "permission denied: give this process read/write access to the folder",
    errno.EPERM: "operation not permitted: check permissions and the filesystem type",
    errno.EROFS: "the filesystem is read-only: remount it read-write or move the root",
}


def validate_key(key: str) -> None:
    """Reject keys that cannot map to a file under the root (``InvalidArgument``)."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"object key must be a non-empty string, got {key!r}")
    if "\x00" in key:
        raise InvalidArgument(f"object key {key!r} contains a NUL character")
    if key.startswith("/"):
        raise InvalidArgument(f"object key {key!r} must be relative (no leading '/')")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidArgument(f"object key {key!r} has an empty, '.' or '..' path segment")
        if segment.startswith(TEMP_PREFIX):
            raise InvalidArgument(
                f"object key {key!r}: segments starting with {TEMP_PREFIX!r} are reserved "
                "for temporary files"
            )


def _translate(exc: OSError, action: str, path: Path, key: str) -> WalstreamError:
    """Map an OSError to the closed error taxonomy, naming the path and what to do."""
    code = exc.errno
    if code == errno.ENOENT:
        return NotFound(f"no object {key!r} ({path} does not exist)")
    if code in (errno.ENOTDIR, errno.EISDIR):
        return InvalidArgument(
            f"object key {key!r} clashes with another key: a local store cannot hold both "
            f"'x' and 'x/…' ({action} {path}: {exc.strerror})"
        )
    if code == errno.ENAMETOOLONG:
        return InvalidArgument(f"object key {key!r} is too long for the filesystem ({path})")
    hint = _UNAVAILABLE_HINTS.get(code or 0, "check the disk and the folder's permissions")
    return BackendUnavailable(
        f"local object store could not {action} {path}: {exc.strerror or exc}; {hint}"
    )


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalObjectStore(ObjectStore):
    """An :class:`ObjectStore` in a local folder. ``fsync=False`` skips fsync calls: faster,
    still atomic, but not durable across power loss (tests, scratch data)."""

    capabilities = ObjectStoreCapabilities(conditional_put=True, list_page_size=1000)

    def __init__(self, root: Path | str, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync

    # ------------------------------------------------------------------ paths and internals

    def path_of(self, key: str) -> Path:
        validate_key(key)
        return self.root.joinpath(*key.split("/"))

    def _ensure_folder(self, folder: Path, key: str) -> None:
        """Create ``folder`` and missing parents; fsync the parent of each new folder."""
        missing: list[Path] = []
        current = folder
        while not current.is_dir():
            missing.append(current)
            if current.parent == current:
                break
            current = current.parent
        for new_folder in reversed(missing):
            try:
                new_folder.mkdir()
            except FileExistsError:
                if not new_folder.is_dir():
                    raise _translate(
                        OSError(errno.ENOTDIR, "a file is in the way"), "create", new_folder, key
                    ) from None
                continue
            except OSError as exc:
                raise _translate(exc, "create folder", new_folder, key) from None
            if self.fsync:
                try:
                    _fsync_folder(new_folder.parent)
                except OSError as exc:
                    raise _translate(exc, "fsync folder", new_folder.parent, key) from None

    def _write_temp(self, folder: Path, key: str) -> tuple[int, Path]:
        self._ensure_folder(folder, key)
        temp = folder / f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise _translate(exc, "create temporary file", temp, key) from None
        return fd, temp

    @staticmethod
    def _write_all(fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def _finish_temp(self, fd: int, temp: Path, key: str) -> None:
        """fsync and close a temp file (the file is left for the caller to publish or drop)."""
        try:
            if self.fsync:
                os.fsync(fd)
        except OSError as exc:
            raise _translate(exc, "fsync", temp, key) from None
        finally:
            os.close(fd)

    def _sync_folder(self, folder: Path, key: str) -> None:
        if self.fsync:
            try:
                _fsync_folder(folder)
            except OSError as exc:
                raise _translate(exc, "fsync folder", folder, key) from None

    # ------------------------------------------------------------------ blocking operations

    def _put(self, key: str, data: bytes, conditional: bool) -> None:
        path = self.path_of(key)
        if conditional and path.exists():
            # Cheap early answer; the link below is what makes the create conditional.
            raise self._exists_error(path, key)
        fd, temp = self._write_temp(path.parent, key)
        try:
            try:
                self._write_all(fd, data)
            except OSError as exc:
                os.close(fd)
                raise _translate(exc, "write", temp, key) from None
            self._finish_temp(fd, temp, key)
            try:
                if conditional:
                    os.link(temp, path)
                else:
                    os.replace(temp, path)
            except FileExistsError:
                raise self._exists_error(path, key) from None
            except IsADirectoryError:
                raise _translate(
                    OSError(errno.EISDIR, "a folder is in the way"), "publish", path, key
                ) from None
            except OSError as exc:
                raise _translate(exc, "publish", path, key) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        self._sync_folder(path.parent, key)

    @staticmethod
    def _exists_error(path: Path, key: str) -> WalstreamError:
        if path.is_dir():
            return _translate(OSError(errno.EISDIR, "a folder is in the way"), "create", path, key)
        return PreconditionFailed(f"object {key!r} already exists")

    def _get(self, key: str, start: int, end: int | None) -> bytes:
        path = self.path_of(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object {key!r}") from None
        except OSError as exc:
            raise _translate(exc, "open", path, key) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise NotFound(f"no object {key!r} ({path} is not a file)")
            size = info.st_size
            try:
                first, last = clamp_range(size, start, end)
            except ValueError as exc:
                raise InvalidArgument(f"get({key!r}, {start}, {end}): {exc}") from None
            parts: list[bytes] = []
            position = first
            while position < last:
                chunk = os.pread(fd, min(last - position, _READ_CHUNK_BYTES), position)
                if not chunk:
                    break  # the file cannot shrink (objects are replaced, never rewritten)
                parts.append(chunk)
                position += len(chunk)
            return b"".join(parts)
        except OSError as exc:
            raise _translate(exc, "read", path, key) from None
        finally:
            os.close(fd)

    def _head(self, key: str) -> ObjectMeta:
        path = self.path_of(key)
        try:
            info = os.stat(path)
        except NotADirectoryError:
            raise NotFound(f"no object {key!r}") from None
        except OSError as exc:
            raise _translate(exc, "stat", path, key) from None
        if not stat.S_ISREG(info.st_mode):
            raise NotFound(f"no object {key!r} ({path} is not a file)")
        return ObjectMeta(key, info.st_size)

    def _delete(self, keys: list[str]) -> None:
        paths = [self.path_of(key) for key in keys]  # validate every key before deleting any
        touched: dict[Path, str] = {}
        for key, path in zip(keys, paths, strict=True):
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
            except OSError as exc:
                if exc.errno == errno.EISDIR:
                    continue
                raise _translate(exc, "delete", path, key) from None
            touched[path.parent] = key
        for folder, key in touched.items():
            self._sync_folder(folder, key)

    def _scan(self, folder: Path, relative: str, name_prefix: str) -> list[tuple[str, int, bool]]:
        """Entries of ``folder`` whose names start with ``name_prefix``, as (key or folder key,
        size, is_folder), sorted so that a depth-first walk yields keys in lexicographic order."""
        found: list[tuple[str, int, bool]] = []
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return found
        except OSError as exc:
            raise _translate(exc, "list", folder, relative or "") from None
        for entry in entries:
            name = entry.name
            if name.startswith(TEMP_PREFIX) or not name.startswith(name_prefix):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    found.append((f"{relative}{name}/", 0, True))
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    found.append((f"{relative}{name}", size, False))
            except FileNotFoundError:
                continue  # deleted while we listed
        # Every key under folder "x" starts with "x/", so sort folders by that string.
        found.sort(key=lambda item: item[0])
        return found

    # ------------------------------------------------------------------ the contract

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, key, bytes(data), False)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, key, bytes(data), True)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await asyncio.to_thread(self._get, key, start, end)

    async def head(self, key: str) -> ObjectMeta:
        return await asyncio.to_thread(self._head, key)

    async def delete(self, keys: Iterable[str]) -> None:
        await asyncio.to_thread(self._delete, list(keys))

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectMeta]:
        """Keys starting with ``prefix``, in lexicographic order. Only the folders that can hold
        matching keys are read: the folder part of the prefix is walked straight to."""
        if "\x00" in prefix:
            raise InvalidArgument("a list prefix cannot contain a NUL character")
        folder_part, _, name_prefix = prefix.rpartition("/")
        segments = folder_part.split("/") if folder_part else []
        if any(segment in ("", ".", "..") for segment in segments) or prefix.startswith("/"):
            return  # no valid key starts with this prefix
        relative = f"{folder_part}/" if folder_part else ""
        # A stack of sorted entry lists, consumed front to back: a depth-first, in-order walk.
        first_folder = self.root.joinpath(*segments)
        stack: list[Iterator[tuple[str, int, bool]]] = [
            iter(await asyncio.to_thread(self._scan, first_folder, relative, name_prefix))
        ]
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
                continue
            key, size, is_folder = item
            if is_folder:
                folder = self.root.joinpath(*key.rstrip("/").split("/"))
                stack.append(iter(await asyncio.to_thread(self._scan, folder, key, "")))
            else:
                yield ObjectMeta(key, size)

    def writer(self, key: str, *, if_absent: bool = False) -> LocalObjectWriter:
        """A streaming writer; with ``if_absent`` its ``close`` publishes like ``put_if_absent``
        (``PreconditionFailed`` if the key exists, never a replacement)."""
        validate_key(key)
        return LocalObjectWriter(self, key, if_absent=if_absent)

    def describe(self) -> dict[str, Any]:
        return {"type": "local", "root": str(self.root), "fsync": self.fsync}


class LocalObjectWriter(ObjectWriter):
    """Streams parts into a temporary file in the target folder; ``close`` fsyncs and renames it
    into place (links it, failing if the key exists, with ``if_absent``), ``abort`` removes it.
    Nothing is visible under the key before ``close``."""

    def __init__(self, store: LocalObjectStore, key: str, *, if_absent: bool = False) -> None:
        self._store = store
        self._key = key
        self._if_absent = if_absent
        self._path = store.path_of(key)
        self._fd: int | None = None
        self._temp: Path | None = None
        self._size = 0
        self._finished = False
        self._lock = asyncio.Lock()

    def _open(self) -> int:
        if self._fd is None:
            self._fd, self._temp = self._store._write_temp(self._path.parent, self._key)
        return self._fd

    def _write(self, data: bytes) -> None:
        fd = self._open()
        try:
            LocalObjectStore._write_all(fd, data)
        except OSError as exc:
            raise _translate(exc, "write", self._temp or self._path, self._key) from None
        self._size += len(data)

    def _publish(self) -> None:
        fd = self._open()
        temp = self._temp
        assert temp is not None
        self._fd = None
        try:
            self._store._finish_temp(fd, temp, self._key)
            try:
                if self._if_absent:
                    os.link(temp, self._path)
                else:
                    os.replace(temp, self._path)
            except FileExistsError:
                raise self._store._exists_error(self._path, self._key) from None
            except OSError as exc:
                raise _translate(exc, "publish", self._path, self._key) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        self._store._sync_folder(self._path.parent, self._key)

    def _discard(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._temp is not None:
            with contextlib.suppress(FileNotFoundError):
                self._temp.unlink()

    async def write(self, data: bytes) -> None:
        async with self._lock:
            if self._finished:
                raise InvalidArgument(f"write() to object {self._key!r} after close()/abort()")
            try:
                await asyncio.to_thread(self._write, bytes(data))
            except BaseException:
                self._finished = True
                await asyncio.to_thread(self._discard)
                raise

    async def close(self) -> ObjectMeta:
        async with self._lock:
            if self._finished:
                raise InvalidArgument(f"close() of object {self._key!r} after close()/abort()")
            self._finished = True
            try:
                await asyncio.to_thread(self._publish)
            except BaseException:
                await asyncio.to_thread(self._discard)
                raise
            return ObjectMeta(self._key, self._size)

    async def abort(self) -> None:
        async with self._lock:
            self._finished = True
            await asyncio.to_thread(self._discard)


def _make_local_object_store(options: dict[str, Any], context: BuildContext) -> LocalObjectStore:
    return LocalObjectStore(Path(options["root"]), fsync=options["fsync"])


def _provision(folder: Path) -> contextlib.AbstractContextManager[dict[str, Any]]:
    return contextlib.nullcontext({"root": folder / "objects", "fsync": False})


LOCAL_OBJECT_STORE: BackendFactory[LocalObjectStore] = BackendFactory(
    kind="object_store",
    name="local",
    description="objects as files in a local folder (the embedded default)",
    options=(
        Option("root", "path", "folder that holds the objects", required=True),
        Option(
            "fsync",
            "bool",
            "fsync files and folders so objects survive power loss (false: faster, not durable)",
            default=True,
        ),
    ),
    create=_make_local_object_store,
    provision=_provision,
)
