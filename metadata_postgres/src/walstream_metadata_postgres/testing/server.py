"""A throwaway PostgreSQL server for tests, the conformance suite and benchmarks.

:class:`PostgresServer` runs Debian's PostgreSQL binaries (``/usr/lib/postgresql/<version>/bin``,
the newest installed version, or ``$WALSTREAM_PG_BIN``) on a fresh cluster in a temporary folder:

- ``initdb`` then ``postgres`` as an unprivileged user: PostgreSQL refuses to run as root, so when
  this process is root both run as the ``postgres`` OS user (the temporary folder is handed to
  it); otherwise as the current user;
- listening on ``127.0.0.1`` at a free port only (its Unix socket stays in the temporary folder);
- ``fsync=on`` and ``synchronous_commit=on`` (the defaults, stated explicitly): a returned commit is
  on disk, which is what the metadata store promises;
- :meth:`kill` is SIGKILL of the postmaster and every backend at once: the crash the
  fault tests recover from; :meth:`freeze` / :meth:`thaw` are SIGSTOP / SIGCONT (a hung server); :meth:`stop` is a fast shutdown; :meth:`start` restarts on the same
  port and data folder; :meth:`remove` (and leaving the ``with`` block) stops it and deletes the
  folder.

Run by hand: ``python -m walstream_metadata_postgres.testing.server`` prints the DSN and serves
until its standard input closes.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from walstream.errors import BackendUnavailable, ConfigError
from walstream_conformance.harness.child import free_port

__all__ = ["PostgresServer", "find_postgres_bin"]

_BIN_ROOT = Path("/usr/lib/postgresql")
_USER = "walstream"


def find_postgres_bin() -> Path:
    """The ``bin`` folder of the newest PostgreSQL installed (``$WALSTREAM_PG_BIN`` overrides)."""
    configured = os.environ.get("WALSTREAM_PG_BIN")
    if configured:
        folder = Path(configured)
        if not (folder / "postgres").exists():
            raise ConfigError(f"WALSTREAM_PG_BIN={configured!r} holds no postgres binary")
        return folder
    versions = []
    if _BIN_ROOT.is_dir():
        for entry in _BIN_ROOT.iterdir():
            if re.fullmatch(r"\d+(\.\d+)?", entry.name) and (entry / "bin" / "postgres").exists():
                versions.append((float(entry.name), entry / "bin"))
    on_path = shutil.which("pg_ctl")
    if not versions and on_path:
        return Path(on_path).parent
    if not versions:
        raise BackendUnavailable(
            "no PostgreSQL server binaries in /usr/lib/postgresql/<version>/bin: install Debian's "
            "postgresql package (make install does), or set WALSTREAM_PG_BIN"
        )
    return max(versions)[1]


class PostgresServer:
    """A PostgreSQL cluster in a temporary folder (see the module docstring)."""

    start_timeout_s = 30.0

    def __init__(
        self,
        *,
        settings: dict[str, str] | None = None,
        superuser: str = _USER,
        create_database: bool = True,
    ) -> None:
        """``superuser``: the role ``initdb`` creates and :attr:`dsn` connects as (another name
        than ``walstream`` lets a test create the role ``walstream`` itself, as a DBA would);
        ``create_database``: create the database ``walstream`` at the first start."""
        self.bin = find_postgres_bin()
        self.superuser = superuser
        self.create_database = create_database
        self.port = 0
        self.folder: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.settings = {
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "max_connections": "200",
            "shared_buffers": "32MB",
        }
        self.settings.update(settings or {})
        self._run_as: str | None = "postgres" if os.geteuid() == 0 else None

    # -- addresses --------------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """``postgresql://walstream@127.0.0.1:<port>/walstream`` (trust authentication)."""
        if not self.port:
            raise RuntimeError("PostgreSQL test server not started")
        return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/walstream"

    @property
    def data_dir(self) -> Path:
        if self.folder is None:
            raise RuntimeError("PostgreSQL test server not created")
        return self.folder / "data"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- lifecycle --------------------------------------------------------------------------------

    def _child_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"cwd": str(self.folder)}
        if self._run_as is not None:
            entry = pwd.getpwnam(self._run_as)
            kwargs.update(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
            kwargs["env"] = {"PATH": "/usr/bin:/bin", "HOME": str(self.folder), "LANG": "C"}
        return kwargs

    def create(self) -> None:
        """Make the folder and run ``initdb`` (with data checksums) and ``createdb``."""
        self.folder = Path(tempfile.mkdtemp(prefix="walstream-pg-"))
        if self._run_as is not None:
            entry = pwd.getpwnam(self._run_as)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        result = subprocess.run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                self.superuser,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--data-checksums",
            ],
            capture_output=True,
            check=False,
            **self._child_kwargs(),
        )
        if result.returncode != 0:
            raise BackendUnavailable(
                f"initdb failed ({result.returncode}): {result.stderr.decode(errors='replace')}"
            )

    def start(self) -> None:
        """Start the postmaster (again, on the same port) and wait until it accepts connections."""
        if self.folder is None:
            self.create()
        if self.running:
            return
        first = not self.port
        if first:
            self.port = free_port()
        command = [
            str(self.bin / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-k",
            str(self.folder),
            "-c",
            "listen_addresses=127.0.0.1",
        ]
        for key, value in self.settings.items():
            command += ["-c", f"{key}={value}"]
        log = open(self.data_dir.parent / "server.log", "ab")  # the child's stdout and stderr
        try:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no terminal signal of ours reaches the server
                **self._child_kwargs(),
            )
        finally:
            log.close()
        self._wait_ready()
        if first and self.create_database:
            self._psql("postgres", "CREATE DATABASE walstream")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if not self.running:
                raise BackendUnavailable(f"PostgreSQL test server exited: {self.log_tail()}")
            result = subprocess.run(
                [str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                check=False,
            )
            if result.returncode == 0:
                return
            time.sleep(0.05)
        raise BackendUnavailable(
            f"PostgreSQL test server not ready after {self.start_timeout_s:g}s: {self.log_tail()}"
        )

    def _psql(self, database: str, sql: str) -> str:
        result = subprocess.run(
            [
                str(self.bin / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.superuser,
                "-d",
                database,
                "-c",
                sql,
            ],
            capture_output=True,
            check=False,
        )
        if result.returncode != 0:
            raise BackendUnavailable(f"psql {sql!r} failed: {result.stderr.decode().strip()}")
        return result.stdout.decode()

    def sql(self, sql: str, database: str = "walstream") -> str:
        """Run ``sql`` in ``database`` (default ``walstream``) with psql as the superuser;
        returns its unaligned output."""
        return self._psql(database, sql)

    def _family(self) -> list[int]:
        """The postmaster and its children (each backend calls setsid(), so a process-group
        signal would reach the postmaster only)."""
        if self.process is None:
            return []
        postmaster = self.process.pid
        family = [postmaster]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
            fields = stat.rpartition(")")[2].split()
            if len(fields) > 1 and int(fields[1]) == postmaster:
                family.append(int(entry.name))
        return family

    def _signal_family(self, signum: int) -> None:
        for pid in self._family():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend at once: a crash, nothing shut down cleanly."""
        if self.process is None:
            return
        self._signal_family(signal.SIGKILL)
        self.process.wait()
        self.process = None

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every backend: connections stay open and hang."""
        self._signal_family(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        self._signal_family(signal.SIGCONT)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        self.process = None

    def remove(self) -> None:
        """Stop the server and delete its folder."""
        self.stop()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def log_tail(self, lines: int = 20) -> str:
        if self.folder is None:
            return ""
        try:
            text = (self.folder / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def main() -> None:
    """Serve a throwaway cluster until stdin closes; prints its DSN first."""
    with PostgresServer() as server:
        print(f"DSN {server.dsn}", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
