"""A ``walstream serve`` node that was failed over rejoins by itself: it is paused (SIGSTOP)
longer than its lease, another node fails it over, and once resumed the server opens a new epoch
of the same node and serves it, without a restart, losing and duplicating nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import walstream
from walstream.metadata import NodeState
from walstream_conformance.waiting import eventually

pytestmark = pytest.mark.asyncio

IN_BASIN = {"s2-basin": "rejoin-basin"}

SERVER = """
import asyncio, logging, sys
from walstream.server.serve import serve
from walstream_conformance.waiting import eventually

async def main():
    logging.basicConfig(level=logging.WARNING)
    async with serve(sys.argv[1], listen="127.0.0.1:0", environ={}) as running:
        print("URL", running.url, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def _deployment(root: Path, node_id: int) -> Path:
    path = root / f"node{node_id}.yaml"
    path.write_text(
        f"node: {{id: {node_id}, advertise: 'http://127.0.0.1:{7400 + node_id}'}}\n"
        f"wal: {{type: ebs, path: wal{node_id}.img, capacity: 64MiB}}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "upload: {max_interval: 10s}\n"  # the acknowledged records are only in node 1's WAL
        "compaction: {enabled: false}\n"
        "cluster: {lease_duration: 1s, heartbeat_interval: 200ms}\n"
    )
    return path


def _stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (Linux: state T in /proc; elsewhere assumed)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return True
    for task in tasks.iterdir():
        with contextlib.suppress(FileNotFoundError):
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
    return True


def _pause_between_transactions(pid: int, meta_db: Path) -> None:
    """SIGSTOP ``pid`` while this test holds the SQLite file's write lock, released only once
    the process is stopped: so it is paused between two of its metadata transactions. Paused
    inside one it would hold the write lock of the file every node shares, and the surviving
    node's renewals would wait for it until that node fenced itself: nobody could fail it over
    (a paused process on a machine whose metadata is one SQLite file stops every writer; the
    test is about a server paused longer than its lease, not about that)."""
    shared = sqlite3.connect(f"file:{meta_db}?mode=rw", uri=True, timeout=30, isolation_level=None)
    with contextlib.closing(shared) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            os.kill(pid, signal.SIGSTOP)
            while not _stopped(pid):
                time.sleep(0.001)
        finally:
            db.execute("ROLLBACK")


async def _call(http: aiohttp.ClientSession, method: str, path: str, **kwargs: Any) -> Any:
    async with http.request(method, path, **kwargs) as response:
        body = await response.json()
        assert response.status in (200, 201), (response.status, body)
        return body


@pytest.mark.slow
async def test_a_failed_over_server_rejoins_with_a_new_epoch(tmp_path: Path) -> None:
    survivor = await walstream.open(_deployment(tmp_path, 2))
    log_path = tmp_path / "node1.log"
    with log_path.open("wb") as log_file:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SERVER,
            str(_deployment(tmp_path, 1)),
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
        )
    try:
        assert child.stdout is not None
        line = (await asyncio.wait_for(child.stdout.readline(), 20)).decode()
        assert line.startswith("URL "), log_path.read_text()
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(
            base_url=line.split()[1], headers=IN_BASIN, timeout=timeout
        ) as http:
            await _call(http, "POST", "/v1/basins", json={"basin": IN_BASIN["s2-basin"]})
            await _call(http, "POST", "/v1/streams", json={"stream": "orders"})
            acked = []
            for i in range(20):
                ack = await _call(
                    http,
                    "POST",
                    "/v1/streams/orders/records",
                    json={"records": [{"body": f"r{i}"}]},
                )
                acked.append((ack["start"]["seq_num"], f"r{i}"))
            assert [seq for seq, _ in acked] == list(range(20))
            before = await _call(http, "GET", "/health")
            assert before["cluster"]["rejoins"] == 0

            # Longer than its lease: node 2 fails it over.
            await asyncio.to_thread(_pause_between_transactions, child.pid, tmp_path / "meta.db")
            member = survivor.cluster
            assert member is not None

            async def failed_over() -> bool:
                return member.stats.failovers_done + member.stats.failovers_failed > 0

            try:
                await eventually(failed_over, "node 2 to fail node 1 over")
            finally:
                child.send_signal(signal.SIGCONT)
            assert (member.stats.failovers_done, member.stats.failovers_failed) == (1, 0)
            failed = await survivor.metadata.get_node(1)
            assert failed is not None and failed.node_epoch >= before["node_epoch"]
            assert failed.state is NodeState.FAILED_OVER

            health: dict[str, Any] = {}

            async def rejoined() -> bool:
                nonlocal health
                async with http.get("/health") as response:
                    health = await response.json()
                    return response.status == 200 and health["node_epoch"] > before["node_epoch"]

            await eventually(rejoined, "node 1 to rejoin with a new epoch")
            assert health["node_epoch"] > failed.node_epoch
            assert health["cluster"]["rejoins"] == 1
            async with http.get("/metrics") as response:
                assert "walstream_cluster_rejoins_total 1" in await response.text()
            ack = await _call(
                http, "POST", "/v1/streams/orders/records", json={"records": [{"body": "after"}]}
            )
            assert ack["start"]["seq_num"] == 20
            read = await _call(
                http, "GET", "/v1/streams/orders/records", params={"seq_num": "0", "count": "100"}
            )
            got = [(record["seq_num"], record["body"]) for record in read["records"]]
            assert got == [*acked, (20, "after")]
            registered = await survivor.metadata.get_node(1)
            assert registered is not None and registered.state is NodeState.RUNNING
            assert registered.node_epoch == health["node_epoch"]
        assert "rejoined with epoch" in log_path.read_text()
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGCONT)
            child.terminate()
            try:
                await asyncio.wait_for(child.wait(), 15)
            except TimeoutError:
                child.kill()
                await child.wait()
        await survivor.close()


async def test_only_a_fenced_cluster_node_is_rejoined() -> None:
    """A broken WAL device or a failed upload is not a lost lease: a new epoch would not fix
    it, so the server keeps reporting it (503) instead of reopening the node."""
    from types import SimpleNamespace
    from typing import cast

    from walstream.engine.client import Client
    from walstream.errors import BackendUnavailable, FencedError
    from walstream.server.serve import rejoinable

    def client(cluster: object, failure: BaseException | None) -> Client:
        return cast(Client, SimpleNamespace(cluster=cluster, failure=failure))

    member = object()
    assert rejoinable(client(member, FencedError("node 1 lost its lease")))
    assert not rejoinable(client(member, BackendUnavailable("WAL device failed")))
    assert not rejoinable(client(member, None))
    assert not rejoinable(client(None, FencedError("a newer process took the WAL")))


async def test_a_node_registered_again_by_another_live_process_is_not_taken_back() -> None:
    # Two processes started with one node.id fence each other; the fenced one must not rejoin
    # (it would take the node back, and the other would in turn), unless the newer epoch is no
    # longer live (failed over, or its lease ran out).
    from types import SimpleNamespace

    from walstream.metadata.memory import MemoryMetadataStore
    from walstream.server.serve import held_by_another_process

    store = MemoryMetadataStore()
    first = await store.register_node(1, {"type": "memory"})
    fenced: Any = SimpleNamespace(metadata=store, node_id=1, node_epoch=first.node_epoch)
    await store.renew_lease(1, first.node_epoch, 60_000)
    assert not await held_by_another_process(fenced)  # its own epoch: a lost lease, rejoin
    second = await store.register_node(1, {"type": "memory"})
    assert not await held_by_another_process(fenced)  # the newer epoch holds no lease yet
    await store.renew_lease(1, second.node_epoch, 60_000)
    assert await held_by_another_process(fenced)  # another live process holds the node
    await store.set_node_state(1, second.node_epoch, NodeState.FAILED_OVER)
    assert not await held_by_another_process(fenced)  # that process was failed over in turn
