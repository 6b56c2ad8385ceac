"""One test server in a child process: start it, wait for its port, stop, kill, freeze, restart.

The S3 rigs (moto, the fault proxy, the s3express zones) and the nvme chunk servers are all the
same thing to a test: a process on ``127.0.0.1`` that prints one line naming its port once it
listens. :class:`ChildServer` runs such a process; a subclass says how to start it
(:meth:`ChildServer.command`) and, if its line is not ``PORT <n>``, how to read the port
(:meth:`ChildServer.parse_port`).

Contract:

- the first start takes whatever port the child picked (``command`` sees ``self.port == 0``);
  every restart asks for the same port again, retrying while the old one is still held, until
  ``start_timeout_s`` passes;
- :meth:`stop` closes the child's stdin and sends SIGTERM, and SIGKILLs it if it has not exited
  within ``stop_timeout_s``; :meth:`kill` is SIGKILL at once (nothing flushed or closed);
- :meth:`freeze` / :meth:`thaw` are SIGSTOP / SIGCONT: connections hang, then resume;
- a child that exits before naming its port raises :class:`walstream.errors.BackendUnavailable`
  with the tail of its stderr;
- the child runs in ``cwd`` (default: this process's working directory); its stderr stays
  readable after :meth:`stop_and_read_log` for the test to check; it goes to a temporary file,
  or is appended to ``log_path`` when one is given (a log a user reads, kept after the stop).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from walstream.errors import BackendUnavailable

__all__ = ["ChildServer", "free_port"]


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (for a child that must know its port
    before it starts, e.g. to advertise it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ChildServer:
    """A test server in a child process (see the module docstring)."""

    start_hint = ""
    """Appended to the start failure message (e.g. which extra to install)."""
    start_timeout_s = 15.0
    stop_timeout_s = 10.0

    def __init__(
        self, name: str, *, port: int = 0, cwd: Path | None = None, log_path: Path | None = None
    ) -> None:
        self.name = name
        self.port = port
        self.cwd = cwd
        self.log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self._log_start = 0
        self._frozen = False

    # -- what a subclass says ---------------------------------------------------------------------

    def command(self) -> list[str]:
        """The child's command line; ``self.port`` is 0 on the first start, then its port."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """Variables added to this process's environment for the child (default: none)."""
        return {}

    def parse_port(self, line: str) -> int | None:
        """The port named by the child's first stdout line, or None if it is not that line."""
        if line.startswith("PORT "):
            return int(line.split()[1])
        return None

    # -- state ------------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``; raises if the server never started."""
        if not self.port:
            raise RuntimeError(f"{self.name} server not started")
        return f"http://{self.address}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> str:
        """Start the child (no-op if running) and wait until it names its port; the endpoint."""
        if self.running:
            return self.endpoint_url
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            self._close_log()
            self._log = (
                tempfile.TemporaryFile(mode="w+")
                if self.log_path is None
                else open(self.log_path, "a+")  # the child's stderr, kept for its user
            )
            self._log_start = self._log.tell()
            process = subprocess.Popen(
                self.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.environment()},
                cwd=self.cwd,
            )
            self.process = process
            assert process.stdout is not None
            port = self.parse_port(process.stdout.readline())
            if port is not None:
                self.port = port
                self._frozen = False
                return self.endpoint_url
            self._reap(kill=True)
            # A restart may find its old port held for a moment after a kill: retry a while.
            if not self.port or time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"{self.name} server did not start on 127.0.0.1:{self.port} "
                    f"(exit code {process.returncode}): {self._read_log()}\n{self.start_hint}".strip()
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """Close stdin and SIGTERM; SIGKILL if it has not exited within ``stop_timeout_s``."""
        self._reap(kill=False)
        self._close_log()

    def stop_and_read_log(self) -> tuple[int | None, str]:
        """:meth:`stop`, then the child's exit code (None if it never ran) and its whole
        stderr."""
        process = self.process
        self._reap(kill=False)
        log = self._read_log(tail_chars=None)
        self._close_log()
        return (None if process is None else process.returncode), log

    def kill(self) -> None:
        """SIGKILL: it stops answering at once, with no chance to flush anything."""
        self._reap(kill=True)

    def restart(self) -> str:
        """SIGKILL, then start again on the same port."""
        self.kill()
        return self.start()

    def freeze(self) -> None:
        """SIGSTOP: connections hang until :meth:`thaw`."""
        if self.process is not None and not self._frozen:
            os.kill(self.process.pid, signal.SIGSTOP)
            self._frozen = True

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        if self.process is not None and self._frozen:
            os.kill(self.process.pid, signal.SIGCONT)
            self._frozen = False

    def __enter__(self) -> ChildServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------------------

    def _reap(self, *, kill: bool) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if self._frozen:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGCONT)
            self._frozen = False
        if process.poll() is None:
            if kill:
                process.kill()
            else:
                with contextlib.suppress(OSError):
                    assert process.stdin is not None
                    process.stdin.close()
                process.terminate()
        try:
            process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _read_log(self, tail_chars: int | None = 2000) -> str:
        if self._log is None:
            return ""
        self._log.seek(self._log_start)
        text = self._log.read()
        return text if tail_chars is None else text[-tail_chars:]
