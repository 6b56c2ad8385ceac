"""``walstream streams config`` and ``streams create --retention …`` as real processes: alone on
the deployment (the command opens the node) and next to a running ``walstream serve`` (the
change goes through the server, whose owner applies it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from walstream_conformance.harness.serve import WalstreamServe

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"
DEPLOYMENT = (
    "node: {id: 1}\n"
    "wal: {type: ebs, path: data/wal.img, capacity: 16MiB}\n"
    "object_store: {type: local, root: data/objects}\n"
    "metadata: {type: sqlite, path: data/meta.db}\n"
)

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOYMENT)
    return path


@pytest.fixture
def cli(tmp_path: Path, deployment: Path) -> Cli:
    def run(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        command = [WALSTREAM, "--config", str(deployment), *args]
        result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert result.returncode == expect, (
            f"{command} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
        return result

    return run


def _config(cli: Cli, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(cli("streams", "config", name, "--json").stdout)
    return found


@pytest.mark.slow
def test_streams_config_shows_and_changes_settings(cli: Cli) -> None:
    cli("streams", "create", "orders", "--retention", "7d", "--storage-class", "standard")
    assert _config(cli, "orders") == {
        "stream_id": 1,
        "name": "orders",
        "retention_age_s": 604_800,
        "timestamping": "client-prefer",
        "uncapped": False,
        "delete_on_empty_min_age_s": 0,
        "storage_class": "standard",
        "cipher": None,
    }
    shown = cli("streams", "config", "orders", "--timestamping", "arrival", "--uncapped").stdout
    assert "changed" in shown and "arrival" in shown and "7d" in shown
    cli("streams", "config", "orders", "--retention", "infinite", "--delete-on-empty", "1h")
    now = _config(cli, "orders")
    assert (now["retention_age_s"], now["delete_on_empty_min_age_s"]) == (None, 3600)
    assert (now["timestamping"], now["uncapped"], now["storage_class"]) == (
        "arrival",
        True,
        "standard",
    )
    listed = cli("streams", "list").stdout
    assert "CONFIG" in listed and "retention infinite" in listed and "delete-on-empty 1h" in listed
    assert json.loads(cli("streams", "list", "--json").stdout)["config"]["uncapped"] is True
    assert "retention infinite" in cli("inspect", "metadata").stdout

    refused = cli("streams", "config", "orders", "--retention", "a while", expect=2)
    assert "--retention" in refused.stderr
    assert _config(cli, "orders") == now


@pytest.mark.slow
def test_streams_config_through_a_running_server(
    cli: Cli, deployment: Path, tmp_path: Path
) -> None:
    deployment.write_text(DEPLOYMENT + "streams: {retention: 30d}\n")
    server = WalstreamServe(deployment, workdir=tmp_path)
    server.start()
    try:
        cli("streams", "create", "events", "--retention", "2d")
        assert _config(cli, "events")["retention_age_s"] == 2 * 86_400, (
            "a create through the server took S2's default instead of the setting given"
        )
        cli("streams", "create", "plain")
        assert _config(cli, "plain")["retention_age_s"] == 30 * 86_400, (
            "the root basin's streams take the deployment's defaults, not S2's"
        )
        cli("streams", "create", "classed", "--storage-class", "standard")
        classed = _config(cli, "classed")
        assert (classed["storage_class"], classed["retention_age_s"]) == ("standard", 30 * 86_400)
        cli("streams", "config", "events", "--timestamping", "client-require")
        changed = _config(cli, "events")
        assert (changed["timestamping"], changed["retention_age_s"]) == (
            "client-require",
            2 * 86_400,
        )
    finally:
        server.stop_cleanly()
