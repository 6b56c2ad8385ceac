"""`walstream` commands next to a running `walstream serve` of the same deployment, as real
processes: they must never take the node over (which would fence the server), and a second
server of the same node must refuse to start."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from walstream.engine import node_lock
from walstream.errors import BackendUnavailable
from walstream_conformance.harness.serve import WalstreamServe

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"
HAS_HTTP = importlib.util.find_spec("httptools") is not None
HAS_EBS = importlib.util.find_spec("walstream_wal_ebs") is not None

pytestmark = pytest.mark.skipif(
    not (HAS_HTTP and HAS_EBS),
    reason="needs httptools (walstream serve) and the ebs WAL of the embedded deployment",
)

# The embedded deployment's shape (ebs WAL file, local objects, SQLite), with uploads so rare
# that records appended during a test stay in the WAL only: reads must get them from the node.
DEPLOYMENT = (
    "node: {id: 1}\n"
    "wal: {type: ebs, path: data/wal.img, capacity: 64MiB}\n"
    "object_store: {type: local, root: data/objects}\n"
    "metadata: {type: sqlite, path: data/meta.db}\n"
    "upload: {max_bytes: 64MiB, max_interval: 1h}\n"
)

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOYMENT)
    return path


@pytest.fixture
def cli(tmp_path: Path, deployment: Path) -> Cli:
    def run(*args: str, input: str | None = None, expect: int | None = 0) -> Any:
        command = [WALSTREAM, "--config", str(deployment), *args]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, cwd=tmp_path, timeout=60
        )
        if expect is not None:
            assert result.returncode == expect, (
                f"{command} exited {result.returncode}\nstdout:\n{result.stdout}\n"
                f"stderr:\n{result.stderr}"
            )
        return result

    return run


class Server(WalstreamServe):
    """``walstream serve`` of the test's deployment, with S2 calls in the root basin."""

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            # The S2 API; the root basin holds every walstream stream under its own name.
            headers={"Content-Type": "application/json", "s2-basin": "walstream"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as failed:
            return failed.code, json.loads(failed.read() or b"{}")

    def append(self, stream: str, *values: str) -> dict[str, Any]:
        status, body = self.call(
            "POST",
            f"/v1/streams/{stream}/records",
            {"records": [{"body": value} for value in values]},
        )
        assert status == 200, body
        return {name: position["seq_num"] for name, position in body.items()}


@pytest.fixture
def server(deployment: Path) -> Iterator[Server]:
    with Server(deployment) as running:
        yield running


def assert_serving(server: Server, stream: str, expected_offset: int) -> None:
    """The server was not fenced: healthy, and it still appends at the expected offset."""
    status, body = server.call("GET", "/health")
    assert status == 200, body
    assert server.append(stream, "after")["start"] == expected_offset


@pytest.mark.slow
def test_commands_go_through_the_running_server_and_never_fence_it(
    cli: Cli, server: Server
) -> None:
    status, _ = server.call("POST", "/v1/streams", {"stream": "orders"})
    assert status == 201
    server.append("orders", "a", "b", "c")

    listing = cli("streams", "list").stdout
    assert re.search(r"^\d+\s+orders\s", listing, re.MULTILINE), listing
    # Not uploaded yet (uploads every hour): only the node has them.
    assert cli("read", "orders").stdout.splitlines() == ["0\ta", "1\tb", "2\tc"]
    appended = cli("append", "orders", input="d\ne\n")
    assert appended.stdout.splitlines() == ["offsets 3..4"]
    assert cli("tail", "orders", "-n", "2").stdout.splitlines() == ["3\td", "4\te"]
    # Through the server a trim is S2's trim command record: it takes offset 5.
    assert "trimmed" in cli("trim", "orders", "1").stdout
    cli("streams", "create", "other")
    cli("streams", "delete", "other")
    assert "other" not in cli("streams", "list").stdout

    assert_serving(server, "orders", 6)
    lines = cli("read", "orders").stdout.splitlines()
    assert lines[:4] == ["1\tb", "2\tc", "3\td", "4\te"]
    assert lines[4].startswith("5\t") and lines[5:] == ["6\tafter"]
    assert server.running


def test_tail_follow_through_the_server_shows_new_records_and_exits_0_on_ctrl_c(
    tmp_path: Path, deployment: Path, server: Server
) -> None:
    server.call("POST", "/v1/streams", {"stream": "feed"})
    server.append("feed", "a")
    follower = subprocess.Popen(
        [WALSTREAM, "--config", str(deployment), "tail", "feed", "-f", "--start", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "0\ta\n"
        server.append("feed", "b")
        assert follower.stdout.readline() == "1\tb\n"
        follower.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, stderr = follower.communicate(timeout=30)
        # Not held up by the long poll in flight (it waits up to 10 s for records).
        assert time.monotonic() - started < 5
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert_serving(server, "feed", 2)


@pytest.mark.slow
def test_read_combines_committed_objects_with_the_servers_newest_records(
    cli: Cli, tmp_path: Path, deployment: Path
) -> None:
    deployment.write_text(DEPLOYMENT.replace("max_interval: 1h", "max_interval: 50ms"))
    with Server(deployment) as server:
        server.call("POST", "/v1/streams", {"stream": "orders"})
        server.append("orders", *(f"old {i}" for i in range(1000)))  # S2: 1000 at most
        server.append("orders", *(f"old {i}" for i in range(1000, 1500)))
        while "1500" not in cli("streams", "list").stdout:  # committed: uploaded
            time.sleep(0.1)  # bounded by the test's timeout, not a deadline of its own
        server.append("orders", "new")
        lines = cli("read", "orders").stdout.splitlines()
        assert lines == [f"{i}\told {i}" for i in range(1500)] + ["1500\tnew"]
        assert cli("read", "orders", "--start", "1499").stdout.splitlines() == [
            "1499\told 1499",
            "1500\tnew",
        ]
        assert_serving(server, "orders", 1501)


@pytest.mark.slow
def test_a_second_serve_or_a_recover_of_the_same_node_exits_2_naming_the_first(
    cli: Cli, tmp_path: Path, deployment: Path, server: Server
) -> None:
    status, _ = server.call("POST", "/v1/streams", {"stream": "orders"})
    assert status == 201
    with pytest.raises(BackendUnavailable) as refused:
        WalstreamServe(deployment).start()
    stderr = str(refused.value)
    assert "exit code 2" in stderr, stderr
    assert "NodeBusy" in stderr and server.url in stderr, stderr
    assert f"pid {server.pid}" in stderr, stderr
    # `recover` runs the node itself (no way through the server): it refuses too.
    recover = cli("recover", expect=2)
    assert "NodeBusy" in recover.stderr and server.url in recover.stderr, recover.stderr
    assert_serving(server, "orders", 0)
    assert "NodeBusy" in cli("serve", "--help").stdout


@pytest.mark.slow
def test_after_the_server_is_killed_commands_recover_the_node(
    cli: Cli, tmp_path: Path, deployment: Path, server: Server
) -> None:
    server.call("POST", "/v1/streams", {"stream": "orders"})
    server.append("orders", "a", "b")
    server.kill()

    # The lock died with the process; its file (with the dead URL) stays behind.
    assert "127.0.0.1" in (tmp_path / "data" / "meta.db.node-1.lock").read_text()
    # Acknowledged but never uploaded: recovered from the WAL, as without a server.
    assert cli("read", "orders").stdout.splitlines() == ["0\ta", "1\tb"]
    assert cli("append", "orders", input="c\n").stdout.splitlines() == ["offsets 2..2"]
    assert cli("read", "orders").stdout.splitlines() == ["0\ta", "1\tb", "2\tc"]


@pytest.mark.slow
def test_a_node_held_by_a_process_without_a_server_reads_committed_and_refuses_writes(
    cli: Cli, tmp_path: Path, deployment: Path
) -> None:
    cli("streams", "create", "orders")
    cli("append", "orders", input="a\nb\n")  # closing the node uploads them
    path = tmp_path / "data" / "meta.db.node-1.lock"
    holder = node_lock.NodeLock.acquire(path, 1, "walstream tail")
    try:
        read = cli("read", "orders")
        assert read.stdout.splitlines() == ["0\ta", "1\tb"]
        assert "committed records only" in read.stderr
        assert f"pid {os.getpid()}" in read.stderr
        refused = cli("append", "orders", input="c\n", expect=2)
        assert "NodeBusy" in refused.stderr and f"pid {os.getpid()}" in refused.stderr
    finally:
        holder.release()
    assert cli("append", "orders", input="c\n").stdout.splitlines() == ["offsets 2..2"]


def test_python_open_of_a_served_node_refuses_instead_of_fencing_the_server(
    server: Server, deployment: Path, tmp_path: Path
) -> None:
    """``walstream.open`` from another Python process takes the node lock like the CLI: with a
    server running the node it raises NodeBusy naming the server, and the server stays healthy."""
    assert server.call("POST", "/v1/streams", {"stream": "py"})[0] in (200, 201)
    server.append("py", "one")
    script = (
        "import asyncio, sys, walstream\n"
        "from walstream.engine.node_lock import NodeBusy\n"
        "async def main():\n"
        "    try:\n"
        "        async with walstream.open(sys.argv[1]):\n"
        "            print('OPENED')\n"
        "    except NodeBusy as busy:\n"
        "        print('BUSY', busy)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(deployment)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BUSY"), done.stdout
    assert str(server.pid) in done.stdout
    assert server.call("GET", "/health")[0] == 200
    assert server.append("py", "two")["end"] == 2  # not fenced


async def test_python_open_locks_the_node_while_open_and_releases_it_on_close(
    deployment: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import walstream
    from walstream_plugins import load_deployment

    monkeypatch.chdir(tmp_path)
    path = node_lock.lock_path(load_deployment(deployment))
    assert path is not None
    async with walstream.open(deployment) as client:
        await client.create_stream("locked")
        holder = node_lock.probe(path)
        assert holder is not None and holder.pid == os.getpid()
        assert (holder.command or "").startswith("walstream.open in ")
        # A caller that locked first (the CLI, serve) opens under its own lock.
        assert node_lock.held_here(path)
    assert node_lock.probe(path) is None
    assert not node_lock.held_here(path)
    own = node_lock.NodeLock.acquire(path, 1, "walstream test")
    try:
        async with walstream.open(deployment) as client:
            assert [info.name for info in await client.list_streams()] == ["locked"]
        # ... and leaves that lock to its holder when it closes.
        assert node_lock.held_here(path)
        still = node_lock.probe(path)
        assert still is not None and still.command == "walstream test"
    finally:
        own.release()
