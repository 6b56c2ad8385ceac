"""A multi-node deployment gets failover without writing a ``cluster:`` section: a node that sets
``node.advertise`` (what other nodes forward to) holds a lease at the defaults, so when it dies
another node fails it over. Two real ``walstream serve`` processes on one SQLite catalogue, each
with an ebs WAL file (reachable from the other: one machine), neither with a ``cluster:``
section: node 1 owns a stream and is killed; appends through node 2 succeed once node 1's lease
has expired, and every acknowledged record reads back once, in order. ``cluster: false`` turns
the lease off."""

from __future__ import annotations

import importlib.util
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from walstream.config.engine import ClusterConfig
from walstream.config.host import find_host
from walstream_conformance.harness.child import free_port
from walstream_conformance.harness.serve import WalstreamServe
from walstream_conformance.waiting import eventually

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("walstream_wal_ebs") is None, reason="needs the ebs WAL"
)

HEADERS = {"s2-basin": "walstream", "Content-Type": "application/json"}


def _deployment(node_id: int, port: int, extra: str = "") -> str:
    return (
        f"node: {{id: {node_id}, advertise: 'http://127.0.0.1:{port}'}}\n"
        f"wal: {{type: ebs, path: wal{node_id}.img, capacity: 64MiB}}\n"
        "object_store: {type: local, root: objects, fsync: false}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        # Acknowledged records stay in node 1's WAL: only a failover brings them back.
        "upload: {max_interval: 60s}\n" + extra
    )


def test_advertise_without_a_cluster_section_holds_a_lease_at_the_defaults() -> None:
    host = find_host("the test loads deployments")
    with_address = host.load_deployment(
        {
            "node": {"id": 1, "advertise": "http://10.0.0.1:7400"},
            "wal": {"type": "memory"},
            "object_store": {"type": "memory"},
            "metadata": {"type": "memory"},
        }
    )
    assert with_address.engine_config.cluster == ClusterConfig()
    for section in ({"cluster": False}, {}):
        document: dict[str, Any] = {
            "node": {"id": 1, "advertise": "http://10.0.0.1:7400"} if section else {"id": 1},
            "wal": {"type": "memory"},
            "object_store": {"type": "memory"},
            "metadata": {"type": "memory"},
            **section,
        }
        assert host.load_deployment(document).engine_config.cluster is None, section


def _call(url: str, body: object | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=None if body is None else json.dumps(body).encode(), headers=HEADERS
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as failed:
        return failed.code, json.loads(failed.read() or b"{}")
    except (urllib.error.URLError, ConnectionError, TimeoutError) as failed:
        return 599, {"error": str(failed)}


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[dict[int, WalstreamServe]]:
    started: dict[int, WalstreamServe] = {}
    try:
        for node_id in (1, 2):
            port = free_port()
            path = tmp_path / f"node{node_id}.yaml"
            path.write_text(_deployment(node_id, port))
            started[node_id] = WalstreamServe(path, name=f"node {node_id}", port=port)
            started[node_id].start()
        yield started
    finally:
        for node in started.values():
            node.kill()


@pytest.mark.slow
async def test_a_dead_node_of_a_deployment_without_a_cluster_section_is_failed_over(
    nodes: dict[int, WalstreamServe],
) -> None:
    one, two = nodes[1].url, nodes[2].url
    status, _ = _call(f"{one}/v1/streams", {"stream": "orders"})
    assert status in (200, 201)
    acknowledged = []
    for seq in range(20):
        status, answer = _call(
            f"{one}/v1/streams/orders/records",
            {"records": [{"body": f"r{seq}"}], "match_seq_num": seq},
        )
        assert status == 200, answer
        acknowledged.append(f"r{seq}")
    nodes[1].kill()  # node 1 owns the stream, and its records are only in its WAL
    seq = len(acknowledged)

    def appended_through_node_2() -> bool:
        status, answer = _call(
            f"{two}/v1/streams/orders/records",
            {"records": [{"body": "after"}], "match_seq_num": seq},
        )
        assert status in (200, 412, 503), (status, answer)  # 412: an earlier attempt landed
        return status != 503

    # Node 2 answers 503 until node 1's lease (3 s) has expired and its WAL is replayed.
    await eventually(appended_through_node_2, "node 2 to accept an append after the failover")
    acknowledged.append("after")
    status, read = _call(f"{two}/v1/streams/orders/records?seq_num=0&count=100")
    assert status == 200, read
    assert [record["body"] for record in read["records"]] == acknowledged
