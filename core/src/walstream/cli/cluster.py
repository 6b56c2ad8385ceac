"""``walstream cluster status``: the nodes of a deployment as its metadata store sees them.

Reads only the metadata store (no node lock, no WAL): safe to run next to live nodes.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from walstream.cli.arguments import add_command
from walstream.cli.deployments import backend
from walstream.cli.output import out, table
from walstream.cli.runner import EXIT_OK
from walstream.metadata.contract import NodeInfo

__all__ = ["add_commands", "cmd_cluster_status", "node_status"]


def node_status(node: NodeInfo, now_ms: int, owned: int) -> dict[str, Any]:
    """One node's row: lease remaining (negative: expired that long ago; None: no lease) and age
    of its last renewal or state change, both on the store's clock."""
    return {
        "node_id": node.node_id,
        "address": node.address,
        "epoch": node.node_epoch,
        "state": node.state.value,
        "live": node.live(now_ms),
        "lease_remaining_ms": node.lease_expires_ms - now_ms if node.lease_expires_ms else None,
        "updated_age_ms": now_ms - node.updated_ms,
        "owned_streams": owned,
        "wal": node.wal_config.get("type") if node.wal_config else None,
    }


def _lease_text(remaining_ms: int | None) -> str:
    if remaining_ms is None:
        return "none"
    if remaining_ms >= 0:
        return f"{remaining_ms / 1000:.1f}s left"
    return f"expired {-remaining_ms / 1000:.1f}s ago"


async def cmd_cluster_status(args: argparse.Namespace) -> int:
    async with backend(args.config, "metadata") as metadata:
        nodes = await metadata.list_nodes()
        now_ms = await metadata.store_time_ms()
        streams = await metadata.list_streams()
    owned: dict[int, int] = {}
    for stream in streams:
        if stream.owner_node_id is not None:
            owned[stream.owner_node_id] = owned.get(stream.owner_node_id, 0) + 1
    rows = [node_status(node, now_ms, owned.get(node.node_id, 0)) for node in nodes]
    if args.json:
        for row in rows:
            out(json.dumps(row, sort_keys=True))
        return EXIT_OK
    live = sum(1 for row in rows if row["live"])
    out(f"nodes ({len(rows)}, {live} live):")
    out(
        table(
            [
                (
                    row["node_id"],
                    row["address"] or "-",
                    row["epoch"],
                    row["state"],
                    _lease_text(row["lease_remaining_ms"]),
                    f"{row['updated_age_ms'] / 1000:.1f}s",
                    row["owned_streams"],
                    row["wal"] or "-",
                )
                for row in rows
            ],
            ("ID", "ADDRESS", "EPOCH", "STATE", "LEASE", "UPDATED", "STREAMS", "WAL"),
        )
    )
    return EXIT_OK


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="the nodes of the deployment: addresses, leases, epochs, owned streams",
        parents=[common],
        description="The cluster as the metadata store sees it.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cluster_commands = cluster.add_subparsers(dest="cluster_command", metavar="WHAT", required=True)
    status = add_command(
        cluster_commands,
        "status",
        "print every node: ID, ADDRESS (node.advertise), EPOCH, STATE, LEASE (time left, or "
        "how long ago it expired, on the metadata store's clock; none: the node holds no lease), "
        "UPDATED (age of its last renewal or state change), STREAMS (streams it owns) and WAL "
        "(its WAL type). A node is live when running with a lease left.",
        cmd_cluster_status,
        common,
        "examples:\n  walstream cluster status\n  walstream cluster status --json",
    )
    status.add_argument(
        "--json", action="store_true", help="JSON lines: one object per node, keys as above"
    )
