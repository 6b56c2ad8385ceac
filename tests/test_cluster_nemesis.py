"""The nemesis test: three ``walstream serve`` nodes on one PostgreSQL and one moto S3, clients
appending with ``match_seq_num`` and reading through random nodes while a seeded nemesis
SIGKILLs and pauses nodes (a paused owner wakes up as a zombie after its lease was taken over)
and crashes PostgreSQL and the S3 endpoint. Every stream's history must be linearizable, every
acknowledged record present exactly once at its seq num, nothing unsent or read-then-vanished
visible (:mod:`walstream_metadata_postgres.testing.nemesis`).

CI runs 6 faults; ``--soak`` runs 200. ``WALSTREAM_NEMESIS_SEED`` replays a schedule.
"""

from __future__ import annotations

import json
import os

import pytest
from walstream.errors import BackendUnavailable
from walstream_metadata_postgres.testing.cluster import (
    Cluster,
    ClusterSettings,
    cluster_features_available,
)
from walstream_metadata_postgres.testing.nemesis import NemesisPlan, run_nemesis
from walstream_metadata_postgres.testing.server import find_postgres_bin

pytestmark = pytest.mark.soak

LEASE = "3s"


@pytest.fixture
def postgres_binaries() -> None:
    try:
        find_postgres_bin()
    except BackendUnavailable as missing:
        pytest.skip(str(missing))


@pytest.mark.slow
@pytest.mark.skipif(
    not cluster_features_available(),
    reason="this walstream has no node leases (NodeInfo.lease_expires_ms, node.advertise, cluster:): "
    "no automatic failover or forwarding to test",
)
async def test_nemesis_keeps_every_acknowledged_record_once(
    soak: bool, postgres_binaries: None
) -> None:
    seed = int(os.environ.get("WALSTREAM_NEMESIS_SEED", "20261123"))
    plan = NemesisPlan(seed=seed, faults=200 if soak else 6, lease_s=3.0, route="random")
    settings = ClusterSettings(
        nodes=3, lease_duration=LEASE, extra={"upload": {"max_interval": "100ms"}}
    )
    with Cluster(settings) as cluster:
        result = await run_nemesis(cluster, plan)
        logs = cluster.node_logs()
    report = json.dumps(result.summary())
    print(f"nemesis seed {seed}: {report}")  # pytest -s shows the counts of a passing run
    assert not result.violations, (
        f"seed {seed}: {report}\nfaults:\n  "
        + "\n  ".join(result.faults)
        + "\nviolations:\n  "
        + "\n  ".join(result.violations[:20])
        + "".join(f"\nnode {node_id} log:\n{log}" for node_id, log in logs.items())
    )
    assert result.acknowledged > 0, report  # the clients got through between the faults
    assert len(result.faults) == plan.faults
