"""``/health`` and ``/metrics`` of ``walstream serve`` report the cluster: this node's lease, the
membership at its last watch and the failovers it ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from walstream.server.serve import serve
from walstream_conformance.waiting import eventually

pytestmark = pytest.mark.asyncio

TOKEN = "cluster-token"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_health_and_metrics_report_the_lease_and_membership(tmp_path: Path) -> None:
    deployment = tmp_path / "deploy.yaml"
    deployment.write_text(
        "node: {id: 4, advertise: 'http://127.0.0.1:7404'}\n"
        f"wal: {{type: memory, name: cluster-{tmp_path.name}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "cluster: {lease_duration: 2s, heartbeat_interval: 100ms}\n"
    )
    async with serve(deployment, listen="127.0.0.1:0", token=TOKEN, environ={}) as running:
        timeout = aiohttp.ClientTimeout(total=20)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(
            base_url=running.url, headers=headers, timeout=timeout
        ) as http:
            health: dict[str, Any] = {}

            async def membership_seen() -> bool:
                nonlocal health
                async with http.get("/health") as response:
                    assert response.status == 200
                    health = await response.json()
                return bool(health["cluster"]["nodes_total"] == 1)

            # the membership comes with the first heartbeat's watch
            await eventually(membership_seen, "the first heartbeat's membership in /health")
            cluster = health["cluster"]
            assert health["status"] == "ok" and health["node_id"] == 4
            assert 0 < cluster["lease_remaining_s"] <= 2.0
            assert (cluster["nodes_live"], cluster["nodes_total"]) == (1, 1)
            assert cluster["nodes"] == [
                {
                    "node_id": 4,
                    "epoch": running.client.node_epoch,
                    "state": "running",
                    "address": "http://127.0.0.1:7404",
                }
            ]
            async with http.get("/metrics") as response:
                assert response.status == 200
                samples = _samples(await response.text())
    assert samples[("walstream_cluster_nodes_live", ())] == 1
    assert samples[("walstream_cluster_nodes", ())] == 1
    assert 0 < samples[("walstream_cluster_lease_remaining_seconds", ())] <= 2.0
    assert samples[("walstream_cluster_lease_renewals_total", (("outcome", "ok"),))] >= 1
    assert samples[("walstream_cluster_failovers_total", (("outcome", "done"),))] == 0
