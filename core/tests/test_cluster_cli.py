"""``walstream cluster status``: nodes, addresses, leases, epochs, states and owned streams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from walstream.cli import main


def test_cluster_status_lists_nodes_with_their_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(
        "node: {id: 3, advertise: 'http://127.0.0.1:7403'}\n"
        "wal: {type: ebs, path: wal.img, capacity: 64MiB}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "cluster: {lease_duration: 30s, heartbeat_interval: 1s}\n"
    )
    assert main(["streams", "create", "orders", "-c", str(config)]) == 0
    capsys.readouterr()
    assert main(["cluster", "status", "--json", "-c", str(config)]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["node_id"] == 3 and row["address"] == "http://127.0.0.1:7403"
    assert row["state"] == "stopped" and row["live"] is False and row["wal"] == "ebs"
    assert 0 < row["lease_remaining_ms"] <= 30_000
    assert main(["cluster", "status", "-c", str(config)]) == 0
    text = capsys.readouterr().out
    assert "nodes (1, 0 live):" in text and "http://127.0.0.1:7403" in text and "s left" in text
