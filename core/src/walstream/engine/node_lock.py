"""Which process runs a node: the node lock of a deployment with a file-based metadata store.

A process that runs node N of a deployment whose metadata is a SQLite file (``walstream serve``,
or a CLI command that opens the node itself) holds an exclusive ``fcntl.flock`` on the file
``<metadata file>.node-<N>.lock`` for as long as the node is open, and writes who it is into it:
one JSON object ``{"pid", "node_id", "command", "url"}`` (``url``: the HTTP address of a serving
node, ``null`` while it starts and for a CLI command).

Liveness is the lock, never the file's contents: the kernel releases a flock when its process
exits however it exits (SIGKILL included), so a leftover file of a crashed server is recognised
as stale by anyone who can take the lock. The contents are only read while the lock is held by
someone else, and only its holder writes them.

Deployments whose metadata is not a file (the memory store) cannot be shared between processes,
so they have no node lock (:func:`lock_path` is ``None``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from walstream.errors import ConfigError

__all__ = ["LiveNode", "NodeBusy", "NodeLock", "held_here", "hold", "lock_path", "probe"]


class NodeBusy(ConfigError):
    """The node is already run by another live process (named in the message)."""

    def __init__(self, message: str, holder: LiveNode) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass(frozen=True)
class LiveNode:
    """What the process holding a node lock wrote about itself (fields may be ``None`` when
    it has not written them yet)."""

    path: Path | None
    """The lock file; None for a node known live from its lease in a shared metadata store
    (PostgreSQL), which has no lock file."""
    pid: int | None = None
    node_id: int | None = None
    command: str | None = None
    url: str | None = None

    def describe(self) -> str:
        """``node 1 is served at http://127.0.0.1:7400 (pid 42)`` or, without a URL,
        ``node 1 is in use by pid 42 (walstream append)``."""
        node = f"node {self.node_id}" if self.node_id is not None else "the node"
        if self.path is None:
            where = f"at {self.url}" if self.url else "with no node.advertise address"
            return f"{node} is running {where} (its lease in the metadata store is live)"
        pid = f"pid {self.pid}" if self.pid is not None else "another process"
        if self.url:
            return f"{node} is running at {self.url} ({pid}; lock file {self.path})"
        command = f" ({self.command})" if self.command else ""
        return f"{node} is in use by {pid}{command} (lock file {self.path})"


def lock_path(deployment: Any) -> Path | None:
    """The node lock of ``deployment`` (a Deployment of the plugin host): next to its SQLite
    metadata file, or ``None`` when its metadata is not a file."""
    section = deployment.sections.get("metadata") or {}
    raw = section.get("path")
    if section.get("type") != "sqlite" or raw is None or str(raw) in ("", ":memory:"):
        return None
    path = Path(raw)
    if not path.is_absolute():
        base = getattr(deployment, "base_dir", None)
        path = Path(base or ".") / path
    return path.with_name(f"{path.name}.node-{deployment.node_id}.lock")


#: Node locks this process holds, by resolved path (a second flock of the same file from this
#: process would conflict with its own first one).
_HELD: dict[Path, NodeLock] = {}


def held_here(path: Path) -> bool:
    """True while this process itself holds the node lock at ``path`` (a CLI command or
    ``walstream serve`` that opens the node through :func:`walstream.open` after locking it)."""
    return path.resolve() in _HELD


class NodeLock:
    """The exclusive lock of one node, held until :meth:`release` (or the process's end)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        _HELD[path.resolve()] = self

    @classmethod
    def acquire(cls, path: Path, node_id: int, command: str) -> NodeLock:
        """Take the lock without waiting and record this process in it. Raises
        :class:`NodeBusy` naming the holder when another live process has it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = _read(path)
            raise NodeBusy(
                f"{holder.describe()}: stop it first, or use its HTTP API", holder
            ) from None
        lock = cls(path, fd)
        lock.record(node_id=node_id, command=command, url=None)
        return lock

    def record(self, *, node_id: int, command: str, url: str | None) -> None:
        """Rewrite who holds the lock (e.g. once the server listens and knows its URL)."""
        if self._fd is None:
            raise ConfigError(f"the node lock {self.path} was already released")
        data = json.dumps(
            {"pid": os.getpid(), "node_id": node_id, "command": command, "url": url}
        ).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        """Release the lock (idempotent). The file stays: deleting it could let two processes
        lock two different files of the same name."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if _HELD.get(self.path.resolve()) is self:
                del _HELD[self.path.resolve()]
            os.close(fd)


def hold(deployment: Any, command: str) -> NodeLock | None:
    """Take the node lock of ``deployment`` for ``command`` (raising :class:`NodeBusy` naming
    the holder when another live process runs the node). ``None`` when there is nothing to take:
    the deployment has no lock, or this process holds it already (a command that locked before
    it opened the node), in which case the lock stays with that holder."""
    path = lock_path(deployment)
    if path is None or held_here(path):
        return None
    return NodeLock.acquire(path, deployment.node_id, command)


def probe(path: Path | None) -> LiveNode | None:
    """The live process holding the node lock at ``path``, or ``None`` when no process holds
    it (never locked, or its holder exited or crashed)."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            # A shared lock conflicts only with a holder's exclusive one, and is dropped at once.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            return _read(path)
        return None
    finally:
        os.close(fd)


def _read(path: Path) -> LiveNode:
    """The holder's record; missing or partial contents (it is being written) give a record
    of ``None`` fields rather than an error: the lock alone proves the holder is alive."""
    try:
        raw = json.loads(path.read_bytes() or b"{}")
    except (OSError, ValueError):
        raw = {}
    if not isinstance(raw, dict):
        raw = {}

    def field(name: str, kind: type) -> Any:
        value = raw.get(name)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    return LiveNode(
        path=path,
        pid=field("pid", int),
        node_id=field("node_id", int),
        command=field("command", str),
        url=field("url", str),
    )
