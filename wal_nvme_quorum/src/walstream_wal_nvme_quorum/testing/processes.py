"""Running ``walstream-chunkd`` processes on 127.0.0.1: for tests, benchmarks and the
conformance suite's provisioning hook."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from walstream.errors import BackendUnavailable

__all__ = ["ChunkServerProcess", "chunk_servers"]


class ChunkServerProcess:
    """One chunk server process. The first start picks a free port; restarts reuse it."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        token: str | None = None,
        delay_ms: float = 0.0,
        segment_bytes: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        self.token = token
        self.delay_ms = delay_ms
        self.segment_bytes = segment_bytes
        self.process: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout_s: float = 15.0) -> None:
        if self.running:
            return
        command = [
            sys.executable,
            "-m",
            "walstream_wal_nvme_quorum.server",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--data",
            str(self.data_dir),
        ]
        if self.token is not None:
            command += ["--token", self.token]
        if self.delay_ms:
            command += ["--delay-ms", str(self.delay_ms)]
        if self.segment_bytes is not None:
            command += ["--segment-bytes", str(self.segment_bytes)]
        deadline = time.monotonic() + timeout_s
        while True:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=None, text=True)
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            if line.startswith("listening on "):
                self.port = int(line.rsplit(":", 1)[1])
                return
            self.process.wait()
            # The old port may still be held for a moment after a kill; retry until the deadline.
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"walstream-chunkd did not start on port {self.port} "
                    f"(exit code {self.process.returncode})"
                )
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no chance to flush or close anything."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def restart(self) -> None:
        self.kill()
        self.start()


@contextlib.contextmanager
def chunk_servers(
    root: Path, count: int = 3, **options: object
) -> Iterator[list[ChunkServerProcess]]:
    """Start ``count`` chunk servers with data folders under ``root``; stop them on exit."""
    servers = [
        ChunkServerProcess(root / f"chunkd-{index}", **options)  # type: ignore[arg-type]
        for index in range(count)
    ]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()
