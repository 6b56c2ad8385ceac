"""Running ``walstream-chunkd`` processes on 127.0.0.1: for tests, benchmarks and the
conformance suite's provisioning hook (each a
:class:`~walstream_conformance.harness.child.ChildServer`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from walstream_conformance.harness.child import ChildServer

__all__ = ["ChunkServerProcess", "chunk_servers"]


class ChunkServerProcess(ChildServer):
    """One ``walstream-chunkd`` process. The first start picks a free port; restarts reuse it."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        token: str | None = None,
        delay_ms: float = 0.0,
        segment_bytes: int | None = None,
    ) -> None:
        super().__init__("walstream-chunkd", port=port)
        self.data_dir = data_dir
        self.token = token
        self.delay_ms = delay_ms
        self.segment_bytes = segment_bytes

    def command(self) -> list[str]:
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
        return command

    def parse_port(self, line: str) -> int | None:
        """The chunk server announces ``listening on HOST:PORT``."""
        if line.startswith("listening on "):
            return int(line.rsplit(":", 1)[1])
        return None


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
