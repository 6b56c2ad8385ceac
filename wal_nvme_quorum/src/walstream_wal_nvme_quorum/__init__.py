"""walstream WAL over a quorum of local-disk chunk servers (``walstream-chunkd``).

``type: nvme-quorum`` in a deployment's ``wal:`` section::

    wal:
      type: nvme-quorum
      servers: [10.0.1.5:7400, 10.0.2.5:7400, 10.0.3.5:7400]
      write_quorum: 2

The quorum protocol itself (fencing, tail resolution, catch-up) lives in
:mod:`walstream.wal.quorum`; this package adds the chunk server and its client.
"""

from __future__ import annotations

import contextlib
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from walstream.config import BackendFactory, BuildContext, Option
from walstream.errors import ConfigError
from walstream.wal.quorum import QuorumWal, quorum_wal_options

from .client import ChunkServerReplica, parse_address
from .processes import ChunkServerProcess, chunk_servers

__all__ = [
    "NVME_QUORUM_WAL",
    "ChunkServerProcess",
    "ChunkServerReplica",
    "NvmeQuorumWal",
    "chunk_servers",
    "create_wal",
]


class NvmeQuorumWal(QuorumWal):
    """A :class:`QuorumWal` whose replicas are chunk servers."""

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "type": "nvme-quorum"}


def create_wal(options: dict[str, Any], context: BuildContext) -> NvmeQuorumWal:
    servers: list[str] = list(options["servers"] or [])
    if not servers:
        raise ConfigError("wal.servers: list at least one chunk server as HOST:PORT")
    for address in servers:
        try:
            parse_address(address)
        except ValueError as exc:
            raise ConfigError(f"wal.servers: {exc}") from None
    if len(set(servers)) != len(servers):
        raise ConfigError("wal.servers: a chunk server is listed twice")
    replication = options["replication"] or len(servers)
    if not 1 <= replication <= len(servers):
        raise ConfigError(
            f"wal.replication: must be between 1 and the {len(servers)} servers listed, "
            f"got {replication}"
        )
    write_quorum = options["write_quorum"] or replication // 2 + 1
    if not 1 <= write_quorum <= replication:
        raise ConfigError(
            f"wal.write_quorum: must be between 1 and replication={replication}, got {write_quorum}"
        )
    log_id = options["log_id"] or f"node-{context.node_id}"
    # Logs of different nodes start at different servers, spreading the load when
    # replication < the number of servers; the choice is stable for one log id.
    first = zlib.crc32(log_id.encode()) % len(servers)
    chosen = [servers[(first + index) % len(servers)] for index in range(replication)]
    replicas = [ChunkServerReplica(address, token=options["token"]) for address in chosen]
    return NvmeQuorumWal(
        replicas,
        log_id=log_id,
        write_quorum=write_quorum,
        **quorum_wal_options(options),
    )


@contextlib.contextmanager
def provision(tmp_path: Path | None = None) -> Iterator[dict[str, Any]]:
    """Three throwaway chunk servers on 127.0.0.1; yields the WAL options for them."""
    with contextlib.ExitStack() as stack:
        if tmp_path is None:
            tmp_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chunkd-")))
        servers = stack.enter_context(chunk_servers(Path(tmp_path)))
        yield {"servers": [server.address for server in servers]}


NVME_QUORUM_WAL: BackendFactory[NvmeQuorumWal] = BackendFactory(
    kind="wal",
    name="nvme-quorum",
    description="WAL replicated to N local-disk chunk servers (walstream-chunkd), quorum acks",
    options=(
        Option("servers", "str_list", "chunk servers as HOST:PORT", required=True),
        Option(
            "replication", "int", "N: servers each chunk is written to (default: all)", minimum=1
        ),
        Option(
            "write_quorum",
            "int",
            "W: acknowledgements a chunk needs (default: majority)",
            minimum=1,
        ),
        Option("log_id", "str", "name of this node's log on the servers (default node-{id})"),
        Option("max_chunk_bytes", "size", "close a chunk at this size", default="1MiB"),
        Option(
            "max_chunk_delay",
            "duration",
            "or when its oldest record waited this long",
            default="2ms",
        ),
        Option("max_inflight", "int", "chunks being written at once", default=8, minimum=1),
        Option("max_record_bytes", "size", "largest single append", default="8MiB"),
        Option("request_timeout", "duration", "bound of one request to one server", default="2s"),
        Option(
            "write_timeout",
            "duration",
            "how long a chunk keeps retrying without a quorum before the WAL fails",
            default="10s",
        ),
        Option("token", "str", "shared secret of the chunk servers (their --token)"),
    ),
    create=create_wal,
    provision=provision,
)
