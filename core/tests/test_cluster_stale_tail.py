"""A node past its lease never answers a read or a tail from what it remembers.

The scenario the nemesis test found: node 1 writes a stream, then stops heartbeating (a paused
process; its own failure is not latched yet, as when it just woke up). Node 2 fails it over and
appends to the stream. Node 1 still holds the stream's state as it claimed it: answering a tail
or an out-of-range read from it would be older than node 2's acknowledged append. It must refuse
(retryable ``BackendUnavailable``, 503 over HTTP), and a ``walstream serve`` node forwards such a
read to the stream's new owner instead.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from walstream import Client, EngineConfig, Record
from walstream.config import CompactionConfig, UploadConfig
from walstream.config.engine import ClusterConfig
from walstream.errors import BackendUnavailable
from walstream.metadata import NodeState
from walstream.metadata.memory import MemoryMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.server import serve as serve_module
from walstream.server.s2 import routing
from walstream.server.serve import RunningServer, serve
from walstream.wal.memory import MemoryWal
from walstream_conformance.waiting import eventually

pytestmark = pytest.mark.asyncio

LEASE_S, HEARTBEAT_S = 1.0, 0.1



@pytest.mark.slow
async def test_a_node_past_its_lease_refuses_reads_and_tails_of_a_stream_it_claimed() -> None:
    name = f"stale-{os.urandom(4).hex()}"
    objects = MemoryObjectStore(name)

    def node(node_id: int) -> Client:
        client = Client(
            wal=MemoryWal(name=f"{name}-wal{node_id}"),
            objects=objects,
            metadata=MemoryMetadataStore(name),
            config=EngineConfig(
                node_id=node_id,
                upload=UploadConfig(max_interval_s=0.02),
                compaction=CompactionConfig(enabled=False),
                cluster=ClusterConfig(LEASE_S, HEARTBEAT_S),
                advertise=f"http://127.0.0.1:{7400 + node_id}",
            ),
        )
        client.wal_factory = lambda info: MemoryWal(name=f"{name}-wal{info.node_id}")
        return client

    first, second = node(1), node(2)
    await first.start()
    await second.start()
    try:
        zombie = await first.create_stream("orders")
        for i in range(3):
            await zombie.append([Record(b"%d" % i)])
        assert await zombie.check_tail() == 3
        assert first.cluster is not None and second.cluster is not None
        await first.cluster.stop()  # node 1 pauses: no more renewals, nothing latched

        async def failed_over() -> bool:
            info = await second.metadata.get_node(1)
            return info is not None and info.state is NodeState.FAILED_OVER

        await eventually(failed_over, "node 2 to fail node 1 over")
        taken = await second.open_stream("orders")
        ack = await taken.append([Record(b"3")])
        assert (ack.start, ack.end) == (3, 4)  # acknowledged: every later answer names tail 4

        # Node 1 still remembers the stream as it claimed it (tail 3) but cannot vouch for it.
        with pytest.raises(BackendUnavailable, match="lost its lease or was fenced"):
            await zombie.check_tail()
        with pytest.raises(BackendUnavailable, match="retry"):
            await zombie.read(start=3)  # would be an empty answer naming tail 3
        with pytest.raises(BackendUnavailable):
            await zombie.read(start=0)
        assert zombie.writing and not zombie.owned_here
        assert [r.value for r in (await taken.read(start=0)).records] == [b"0", b"1", b"2", b"3"]
    finally:
        await first.close()
        await second.close()


# -- over HTTP: a fenced node forwards the read to the stream's new owner ------------------------


def _deployment(folder: Path, node_id: int) -> Path:
    path = folder / f"node{node_id}.yaml"
    path.write_text(
        f"node: {{id: {node_id}, advertise: 'http://127.0.0.1:{7400 + node_id}'}}\n"
        f"wal: {{type: memory, name: stale-{folder.name}-{node_id}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        # Node 1 uploads nothing during the test: its acknowledged records are only in its WAL
        # (node 2's failover replays them), and no fenced commit wakes it before the reads do.
        "upload: {max_interval: 10s}\n"
        "compaction: {enabled: false}\n"
        f"cluster: {{lease_duration: {int(LEASE_S * 1000)}ms, "
        f"heartbeat_interval: {int(HEARTBEAT_S * 1000)}ms}}\n"
    )
    return path


@pytest.fixture
async def nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[dict[int, RunningServer]]:
    running: dict[int, RunningServer] = {}
    monkeypatch.setattr(routing, "advertised", lambda node: _url(running, node.node_id))
    # A fenced node stays as it is (no new epoch): the window between a paused node waking up
    # and its rejoin, held open so the test sees what the node answers in it.
    monkeypatch.setattr(serve_module, "rejoinable", lambda client: False)
    async with AsyncExitStack() as stack:
        for node_id in (1, 2):
            running[node_id] = await stack.enter_async_context(
                serve(_deployment(tmp_path, node_id), listen="127.0.0.1:0", environ={})
            )
        yield running


def _url(running: dict[int, RunningServer], node_id: int) -> str | None:
    server = running.get(node_id)
    return None if server is None else server.url


async def _call(url: str, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(base_url=url, timeout=timeout) as session:
        headers = {"s2-basin": "stale-basin"}
        async with session.request(method, path, headers=headers, **kwargs) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None


@pytest.mark.slow
async def test_a_paused_then_failed_over_server_never_answers_an_older_tail(
    nodes: dict[int, RunningServer],
) -> None:
    one, two = nodes[1].url, nodes[2].url
    assert (await _call(one, "POST", "/v1/basins", json={"basin": "stale-basin"}))[0] == 201
    assert (await _call(one, "POST", "/v1/streams", json={"stream": "s"}))[0] == 201
    records = {"records": [{"body": "a"}, {"body": "b"}]}
    status, ack = await _call(one, "POST", "/v1/streams/s/records", json=records)
    assert status == 200 and ack["end"]["seq_num"] == 2  # node 1 claimed the stream
    first = nodes[1].client
    assert first.cluster is not None
    await first.cluster.stop()  # node 1 pauses: its lease runs out, nothing latched yet
    metadata = nodes[2].client.metadata

    async def failed_over() -> bool:
        info = await metadata.get_node(1)
        return info is not None and info.state is NodeState.FAILED_OVER

    # Nothing reaches node 1 meanwhile (an append forwarded to it would wake it up: fenced).
    await eventually(failed_over, "node 2 to fail node 1 over")

    async def appended_on_two() -> bool:
        status, body = await _call(
            two, "POST", "/v1/streams/s/records", json={"records": [{"body": "c"}]}
        )
        return status == 200 and body["start"]["seq_num"] == 2

    await eventually(appended_on_two, "node 2 to take the stream")
    # Every answer through node 1 from now on names tail 3 (or is a retryable 503): the read
    # goes to node 2, the stream's new owner, never to what node 1 remembers (tail 2).
    seen: list[tuple[int, Any]] = []
    for path in ("/v1/streams/s/records?seq_num=2", "/v1/streams/s/records/tail"):
        for _ in range(50):
            status, body = await _call(one, "GET", path)
            seen.append((status, body))
            if status != 503:
                break
            await asyncio.sleep(0.1)
        assert status == 200, seen
        tail = body["tail"]["seq_num"] if "tail" in body else None
        assert tail == 3, seen
    status, body = await _call(one, "GET", "/v1/streams/s/records?seq_num=0")
    assert status == 200 and [r["body"] for r in body["records"]] == ["a", "b", "c"], body
    # An append through node 1 goes to node 2 as well (a retryable 503 at most while node 1
    # finds the owner): node 1 neither appends on its own view nor refuses for good.
    conditional = {"records": [{"body": "d"}], "match_seq_num": 3}
    answers: list[tuple[int, Any]] = []
    for _ in range(50):
        status, body = await _call(one, "POST", "/v1/streams/s/records", json=conditional)
        answers.append((status, body))
        if status != 503:
            break
        await asyncio.sleep(0.1)
    assert status == 200 and body["start"]["seq_num"] == 3, answers
    status, body = await _call(two, "GET", "/v1/streams/s/records?seq_num=0")
    assert [r["body"] for r in body["records"]] == ["a", "b", "c", "d"], body
