"""Processes around a benchmark: servers it starts as children, the CPU and memory they use, the
tools it needs, and the event loop it runs on.

- :class:`ServerProcess`: a server child process, ready once its output says so;
- :func:`process_cpu_s`, :func:`rss_bytes`: CPU seconds and resident memory from ``/proc``;
- :func:`require_tools`: the executables a benchmark needs, or the error ``bench/run_all.py``
  reports as "skipped";
- :func:`use_uvloop`, :func:`run`: uvloop when it is installed (as ``walstream serve`` runs),
  else asyncio's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

__all__ = [
    "ServerProcess",
    "free_port",
    "process_cpu_s",
    "require_tools",
    "rss_bytes",
    "run",
    "use_uvloop",
    "uvloop_installed",
]

T = TypeVar("T")


class ServerProcess:
    """A server child process, ready once a line of its output (stdout and stderr) matches
    ``pattern``; its port is ``port`` when given, else the pattern's group 1. The output goes
    on to ``server.log`` in ``cwd``. A context manager: the server stops on exit."""

    def __init__(
        self,
        command: list[str],
        pattern: str,
        *,
        cwd: Path,
        port: int | None = None,
        timeout_s: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = cwd / "server.log"
        self._log_file = self.log.open("w")
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        regex = re.compile(pattern)
        assert self.process.stdout is not None
        output = self.process.stdout
        found = threading.Event()
        self.port = 0

        def drain() -> None:
            # Read until the server exits, so a chatty server never blocks on a full pipe.
            for line in output:
                self._log_file.write(line)
                if not found.is_set():
                    match = regex.search(line)
                    if match:
                        self.port = port if port is not None else int(match.group(1))
                        found.set()
            found.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        found.wait(timeout_s)
        if not self.port:
            self.stop()
            raise RuntimeError(f"{command[0]} did not become ready: {self.log.read_text()[-2000:]}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._drain.join(timeout=5)
        self._log_file.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server that cannot listen on port 0)."""
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def process_cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds process ``pid`` (default: this one) has used, from Linux
    ``/proc``; 0 when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid or 'self'}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes() -> int:
    """This process's resident memory (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def require_tools(*tools: str) -> None:
    """Raise ``FileNotFoundError`` naming the first of ``tools`` not on ``PATH``:
    ``bench/run_all.py`` reports the benchmark as skipped, naming what it needs."""
    for tool in tools:
        if shutil.which(tool) is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), tool)


def uvloop_installed() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def use_uvloop() -> str:
    """Install uvloop's event loop policy if it is installed; the loop's name."""
    if not uvloop_installed():
        return "asyncio"
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def run(main: Coroutine[Any, Any, T], *, uvloop: bool = True) -> T:
    """Run ``main`` on uvloop when ``uvloop`` and it is installed, else on asyncio's loop."""
    if uvloop and uvloop_installed():
        import uvloop as uvloop_module

        result: T = uvloop_module.run(main)
        return result
    return asyncio.run(main)
