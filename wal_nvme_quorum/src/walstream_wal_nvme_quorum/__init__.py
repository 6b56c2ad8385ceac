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
from walstream.wal.quorum import (
    QuorumWal,
    quorum_option_set,
    quorum_wal_options,
    write_quorum_of,
)

from .client import ChunkServerReplica, parse_address

__all__ = [
    "NVME_QUORUM_WAL",
    "ChunkServerReplica",
    "NvmeQuorumWal",
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
    write_quorum = write_quorum_of(
        options["write_quorum"],
        replication,
        key="wal.write_quorum",
        among=f"replication={replication}",
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
    from .testing.processes import chunk_servers

    with contextlib.ExitStack() as stack:
        if tmp_path is None:
            tmp_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chunkd-")))
        servers = stack.enter_context(chunk_servers(Path(tmp_path)))
        yield {"servers": [server.address for server in servers]}


_QUORUM = quorum_option_set(
    replica="server",
    log_place="on the servers",
    acknowledged_by="acknowledgements",
    max_chunk_bytes="1MiB",
    max_chunk_delay="2ms",
    max_chunk_delay_doc="or when its oldest record waited this long",
)

NVME_QUORUM_WAL: BackendFactory[NvmeQuorumWal] = BackendFactory(
    kind="wal",
    name="nvme-quorum",
    description="WAL replicated to N local-disk chunk servers (walstream-chunkd), quorum acks",
    options=(
        Option("servers", "str_list", "chunk servers as HOST:PORT", required=True),
        Option(
            "replication", "int", "N: servers each chunk is written to (default: all)", minimum=1
        ),
        _QUORUM.write_quorum,
        _QUORUM.log_id,
        *_QUORUM.tuning,
        Option("token", "str", "shared secret of the chunk servers (their --token)"),
    ),
    create=create_wal,
    provision=provision,
)
