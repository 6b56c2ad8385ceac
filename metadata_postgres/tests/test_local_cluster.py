"""``walstream local-cluster`` as a user runs it: ``start`` and ``stop`` in the background, the
commands refuse what they must, the former ``python -m`` entry still runs, and a CLI command
given a live node's deployment goes through its HTTP API instead of taking the node over.

The walk-through of ``docs/operations/local-cluster.md`` (three nodes up, node 1 killed, an
append through node 2 once node 1 is failed over, every record read back once through node 3)
runs as written in tests/test_docs_examples.py, which checks its output."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
WALSTREAM = shutil.which("walstream", path=str(BIN)) or "walstream"


def _environment() -> dict[str, str]:
    # The page's commands run as a user's shell would: walstream on PATH.
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _walstream(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WALSTREAM, *args], capture_output=True, text=True, cwd=cwd, env=_environment(), timeout=300
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    try:
        yield tmp_path
    finally:  # whatever the test did, no cluster outlives it
        _walstream(tmp_path, "local-cluster", "stop", "--folder", "rig")


def test_commands_refuse_without_a_cluster_and_a_second_start(workdir: Path) -> None:
    status = _walstream(workdir, "local-cluster", "status", "--folder", "rig")
    assert status.returncode == 2
    assert "no cluster runs in" in status.stderr and "local-cluster start" in status.stderr
    stopped = _walstream(workdir, "local-cluster", "stop", "--folder", "rig")
    assert stopped.returncode == 0 and "no cluster runs in" in stopped.stdout

    started = _walstream(workdir, "local-cluster", "start", "1", "--folder", "rig")
    assert started.returncode == 0, started.stderr
    again = _walstream(workdir, "local-cluster", "start", "1", "--folder", "rig")
    assert again.returncode == 2 and "already runs in" in again.stderr
    unknown = _walstream(workdir, "local-cluster", "kill", "5", "--folder", "rig")
    assert unknown.returncode == 2 and "has no node 5 (its nodes: 1)" in unknown.stderr

    # A CLI command given the live node's deployment goes through its HTTP API: the node keeps
    # its epoch (opening it here would register epoch 2 and fence the server).
    deployment = str(workdir / "rig" / "node-1.yaml")
    created = _walstream(workdir, "-c", deployment, "streams", "create", "events")
    assert created.returncode == 0, created.stderr
    listed = _walstream(workdir, "-c", deployment, "streams", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == ["events"]
    cluster = _walstream(workdir, "-c", deployment, "cluster", "status", "--json")
    (node,) = [json.loads(line) for line in cluster.stdout.splitlines()]
    assert (node["epoch"], node["state"], node["live"]) == (1, "running", True), node
    recover = _walstream(workdir, "-c", deployment, "recover")
    assert recover.returncode == 2 and "NodeBusy" in recover.stderr, recover.stderr
    assert "its lease in the metadata store is live" in recover.stderr

    status = _walstream(workdir, "local-cluster", "status", "--folder", "rig")
    assert status.returncode == 0 and re.search(r"^node 1 .* healthy$", status.stdout, re.M)


def test_the_former_module_command_runs_until_stdin_closes(tmp_path: Path) -> None:
    """``python -m walstream_metadata_postgres.testing.cluster up N`` (the earlier documented
    form, which crashed: its S3 gate was started as ``python -m __main__``) still runs: it is
    ``walstream local-cluster up N --until-stdin-closes``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "walstream_metadata_postgres.testing.cluster", "up", "1"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**_environment(), "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        seen = []
        for line in process.stdout:
            seen.append(line)
            if line.startswith("NODE 1 "):
                break
        assert seen and seen[-1].startswith("NODE 1 http://127.0.0.1:"), "".join(seen)
        process.stdin.close()  # Ctrl-D
        rest = process.stdout.read()
        assert process.wait(timeout=120) == 0, "".join(seen) + rest
        assert "walstream local-cluster: stopped" in rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
