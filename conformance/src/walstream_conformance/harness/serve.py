"""``walstream serve`` in a child process: the one rig every test (and benchmark) uses that talks
to a real server process of a deployment file.

Contract (besides :class:`~walstream_conformance.harness.child.ChildServer`'s):

- the child runs ``walstream --config <deployment> serve --listen 127.0.0.1:<port>`` in
  ``workdir`` (relative paths of the deployment resolve there), with ``--token`` when one is
  given; ``WALSTREAM_TOKEN`` is emptied for the child, so the outer environment never decides
  the token (the deployment's ``server.token`` still applies);
- it is up once its first stdout line says ``listening on http://…`` or ``https://…`` (kept
  as :attr:`banner`);
  a child that exits first raises :class:`walstream.errors.BackendUnavailable` naming its exit
  code and the tail of its stderr (e.g. a second server of a node refused with ``NodeBusy``);
- :meth:`WalstreamServe.stop_cleanly` is SIGTERM and a wait, and fails the test unless the
  server exited 0 with no traceback in its log.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .child import ChildServer

__all__ = ["WalstreamServe", "walstream_command"]

_LISTENING = re.compile(r"listening on (https?)://[^\s:]+:(\d+)")


def walstream_command() -> list[str]:
    """The ``walstream`` command of this interpreter's environment."""
    script = shutil.which("walstream", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "walstream.cli"]


class WalstreamServe(ChildServer):
    """One ``walstream serve`` process of the deployment file ``config_path``."""

    start_timeout_s = 60.0
    stop_timeout_s = 30.0

    def __init__(
        self,
        config_path: Path,
        *,
        name: str = "walstream serve",
        port: int = 0,
        token: str | None = None,
        workdir: Path | None = None,
        environ: Mapping[str, str] | None = None,
        serve_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        """``workdir`` defaults to the deployment's folder; ``environ`` is added to the
        child's environment; ``serve_args`` go after ``serve --listen …``; ``log_path`` keeps
        the server's stderr in that file (default: a temporary file)."""
        super().__init__(name, port=port, cwd=workdir or config_path.parent, log_path=log_path)
        self.config_path = config_path
        self.token = token
        self.environ = dict(environ or {})
        self.serve_args = list(serve_args)
        self.banner = ""
        """The first stdout line of the last start (``listening on http://… …``)."""
        self.scheme = "http"
        """``https`` when the server serves TLS (``server.tls``)."""

    def command(self) -> list[str]:
        token = [] if self.token is None else ["--token", self.token]
        return [
            *walstream_command(),
            "--config",
            str(self.config_path),
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            *token,
            *self.serve_args,
        ]

    def environment(self) -> dict[str, str]:
        return {"WALSTREAM_TOKEN": "", **self.environ}

    def parse_port(self, line: str) -> int | None:
        self.banner = line
        match = _LISTENING.search(line)
        if match is None:
            return None
        self.scheme = match.group(1)
        return int(match.group(2))

    @property
    def url(self) -> str:
        """The server's base URL (``http://127.0.0.1:<port>``, or ``https://`` over TLS)."""
        return self.scheme + self.endpoint_url.removeprefix("http")

    @property
    def pid(self) -> int:
        """The running child's process id."""
        if self.process is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.process.pid

    def stop_cleanly(self) -> str:
        """SIGTERM and wait; the server's whole stderr. Raises AssertionError unless it exited
        0 with no traceback logged."""
        code, log = self.stop_and_read_log()
        if code != 0:
            raise AssertionError(f"{self.name} exited {code}:\n{log}")
        if "Traceback" in log:
            raise AssertionError(f"{self.name} logged a traceback:\n{log}")
        return log
