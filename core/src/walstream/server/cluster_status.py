"""What ``/health`` and ``/metrics`` of ``walstream serve`` report of the cluster: this node's
lease and its view of the membership, from the last heartbeat (no metadata call per request);
and, in ``/metrics``, its stream lifecycle work (retention, delete-on-empty)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from walstream.engine.client import Client

__all__ = ["cluster_health", "cluster_metrics", "lifecycle_metrics", "with_cluster_metrics"]


def cluster_health(client: Client, rejoins: int = 0) -> dict[str, Any] | None:
    """The ``cluster`` object of ``/health`` (None: the node runs without a ``cluster:``
    section). ``nodes`` lists every node as of this node's last watch; ``rejoins`` counts the
    times this server replaced a fenced client by a new epoch."""
    member = client.cluster
    if member is None:
        return None
    stats = member.stats
    remaining = member.lease_remaining_s
    return {
        "lease_remaining_s": None if remaining is None else round(remaining, 3),
        "lease_duration_s": member.config.lease_duration_s,
        "nodes_live": stats.nodes_live,
        "nodes_total": stats.nodes_total,
        "failovers_done": stats.failovers_done,
        "failovers_failed": stats.failovers_failed,
        "failovers_retried": stats.failovers_retried,
        "failovers_fenced": stats.failovers_fenced,
        "rejoins": rejoins,
        "nodes": [
            {
                "node_id": node.node_id,
                "epoch": node.node_epoch,
                "state": node.state.value,
                "address": node.address,
            }
            for node in member.nodes
        ],
    }


def cluster_metrics(client: Client, rejoins: int = 0) -> str:
    """Prometheus text of this node's lease and the failovers it ran ('' without a lease)."""
    member = client.cluster
    if member is None:
        return ""
    stats = member.stats
    remaining = member.lease_remaining_s
    lines = [
        "# HELP walstream_cluster_nodes Nodes in the metadata store at this node's last watch.",
        "# TYPE walstream_cluster_nodes gauge",
        f"walstream_cluster_nodes {stats.nodes_total}",
        "# HELP walstream_cluster_nodes_live Nodes running with an unexpired lease.",
        "# TYPE walstream_cluster_nodes_live gauge",
        f"walstream_cluster_nodes_live {stats.nodes_live}",
        "# HELP walstream_cluster_lease_remaining_seconds This node's own view of its lease.",
        "# TYPE walstream_cluster_lease_remaining_seconds gauge",
        f"walstream_cluster_lease_remaining_seconds {0.0 if remaining is None else remaining}",
        "# HELP walstream_cluster_lease_renewals_total Lease renewals by outcome.",
        "# TYPE walstream_cluster_lease_renewals_total counter",
        f'walstream_cluster_lease_renewals_total{{outcome="ok"}} {stats.renewals}',
        f'walstream_cluster_lease_renewals_total{{outcome="failed"}} {stats.renew_failures}',
        "# HELP walstream_cluster_lease_renew_seconds Round trip of the last renewal.",
        "# TYPE walstream_cluster_lease_renew_seconds gauge",
        f"walstream_cluster_lease_renew_seconds {stats.last_renew_ms / 1000}",
        "# HELP walstream_cluster_failovers_total Failovers of other nodes this node claimed.",
        "# TYPE walstream_cluster_failovers_total counter",
        f'walstream_cluster_failovers_total{{outcome="claimed"}} {stats.failovers_claimed}',
        f'walstream_cluster_failovers_total{{outcome="done"}} {stats.failovers_done}',
        f'walstream_cluster_failovers_total{{outcome="failed"}} {stats.failovers_failed}',
        f'walstream_cluster_failovers_total{{outcome="retried"}} {stats.failovers_retried}',
        f'walstream_cluster_failovers_total{{outcome="fenced"}} {stats.failovers_fenced}',
        "# HELP walstream_cluster_rejoins_total Fenced clients replaced by a new epoch.",
        "# TYPE walstream_cluster_rejoins_total counter",
        f"walstream_cluster_rejoins_total {rejoins}",
    ]
    return "\n".join(lines) + "\n"


def lifecycle_metrics(client: Client) -> str:
    """Prometheus text of this node's retention and delete-on-empty work
    (:mod:`walstream.engine.retention`)."""
    stats = client.lifecycle
    lines = [
        "# HELP walstream_lifecycle_passes_total Passes of the stream lifecycle loop.",
        "# TYPE walstream_lifecycle_passes_total counter",
        f"walstream_lifecycle_passes_total {stats.passes}",
        "# HELP walstream_lifecycle_streams_total Streams whose retention or delete-on-empty "
        "work this node ran.",
        "# TYPE walstream_lifecycle_streams_total counter",
        f"walstream_lifecycle_streams_total {stats.streams_handled}",
        "# HELP walstream_lifecycle_due_streams Streams found due by the last pass.",
        "# TYPE walstream_lifecycle_due_streams gauge",
        f"walstream_lifecycle_due_streams {stats.last_due}",
        "# HELP walstream_lifecycle_lag_seconds How late the most overdue stream of the last "
        "pass was handled.",
        "# TYPE walstream_lifecycle_lag_seconds gauge",
        f"walstream_lifecycle_lag_seconds {stats.last_lag_s}",
        "# HELP walstream_retention_trims_total Trims made by retention.",
        "# TYPE walstream_retention_trims_total counter",
        f"walstream_retention_trims_total {stats.trims}",
        "# HELP walstream_retention_expired_records_total Records made unreadable by retention.",
        "# TYPE walstream_retention_expired_records_total counter",
        f"walstream_retention_expired_records_total {stats.records_expired}",
        "# HELP walstream_retention_objects_deleted_total Objects deleted by the garbage "
        "collection after retention passes.",
        "# TYPE walstream_retention_objects_deleted_total counter",
        f"walstream_retention_objects_deleted_total {stats.objects_collected}",
        "# HELP walstream_streams_deleted_on_empty_total Streams deleted once empty for their "
        "delete_on_empty age.",
        "# TYPE walstream_streams_deleted_on_empty_total counter",
        f"walstream_streams_deleted_on_empty_total {stats.streams_deleted}",
        "# HELP walstream_lifecycle_failures_total Lifecycle work that failed (retried later).",
        "# TYPE walstream_lifecycle_failures_total counter",
        f"walstream_lifecycle_failures_total {stats.failures}",
    ]
    return "\n".join(lines) + "\n"


def with_cluster_metrics(
    render: Callable[[], str] | None, client: Client | Callable[[], tuple[Client, int]]
) -> Callable[[], str] | None:
    """``render`` followed by :func:`cluster_metrics` (None stays None: metrics disabled).
    ``client`` is the client, or a function giving the current client and its rejoin count
    (a server that replaces its client after a fence)."""
    if render is None:
        return None
    inner = render

    def rendered() -> str:
        if isinstance(client, Client):
            return inner() + cluster_metrics(client) + lifecycle_metrics(client)
        current, rejoins = client()
        return inner() + cluster_metrics(current, rejoins) + lifecycle_metrics(current)

    return rendered
