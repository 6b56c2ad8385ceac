"""In-process chunk servers over real data folders, for tests that damage the folders between
runs (the real :class:`ChunkServer` and :class:`ChunkStore`; a restart costs milliseconds)."""

from __future__ import annotations

from pathlib import Path

from .. import ChunkServerReplica, NvmeQuorumWal
from ..server import ChunkServer
from ..store import ChunkStore

__all__ = ["InProcessServers"]

LOG = "node-1"


class InProcessServers:
    """Three chunk servers over data folders under ``root``, started and stopped in-process."""

    def __init__(self, root: Path, segment_bytes: int) -> None:
        self.folders = [root / f"chunkd-{index}" for index in range(3)]
        self.segment_bytes = segment_bytes
        self.running: list[tuple[ChunkServer, ChunkStore]] = []
        self.addresses: list[str] = []

    async def start(self) -> None:
        self.addresses = []
        for folder in self.folders:
            store = ChunkStore(folder, segment_bytes=self.segment_bytes)
            store.open()
            server = ChunkServer(store)
            host, port = await server.start("127.0.0.1", 0)
            self.running.append((server, store))
            self.addresses.append(f"{host}:{port}")

    async def stop(self) -> None:
        for server, store in self.running:
            await server.stop()
            store.close()
        self.running = []

    def wal(self, **options: float) -> NvmeQuorumWal:
        """A WAL over the running servers (log ``node-1``, short timeouts)."""
        settings = {"request_timeout_s": 1.0, "write_timeout_s": 3.0, **options}
        return NvmeQuorumWal(
            [ChunkServerReplica(address) for address in self.addresses],
            log_id=LOG,
            **settings,  # type: ignore[arg-type]
        )
