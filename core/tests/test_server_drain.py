"""A rolling restart loses no acknowledged record: two ``walstream serve`` processes on one
SQLite metadata file and one local object store, each with its own file WAL and
``node.advertise``. Appends through node A to a stream owned by node B are forwarded to B; B
gets SIGTERM (it stops taking appends with 503, uploads what it acknowledged and releases its
streams); the next append through A claims the stream on A; every acknowledged record is read
back exactly once, in order."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from walstream.config.engine import EngineConfig
from walstream.metadata.contract import NodeState
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream_conformance.harness.child import free_port
from walstream_conformance.harness.serve import WalstreamServe

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"
BASIN = "drain-basin"
HEADERS = {"s2-basin": BASIN}
TIMEOUT = aiohttp.ClientTimeout(total=30)

pytestmark = pytest.mark.skipif(
    "advertise" not in {f.name for f in dataclasses.fields(EngineConfig)},
    reason="node.advertise and the cluster: section are not in this build",
)


def write_node(folder: Path, node_id: int, port: int) -> Path:
    path = folder / f"node{node_id}.yaml"
    path.write_text(
        f"node: {{id: {node_id}, advertise: 'http://127.0.0.1:{port}'}}\n"
        f"wal: {{type: ebs, path: wal{node_id}.img, capacity: 64MiB}}\n"
        "object_store: {type: local, root: objects, fsync: false}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        # Acknowledged records stay in the WAL only until the drain uploads them.
        "upload: {max_interval: 60s}\n"
        "compaction: {enabled: false}\n"
        "cluster: {lease_duration: 2s, heartbeat_interval: 200ms}\n"
    )
    return path


def start_node(folder: Path, node_id: int) -> WalstreamServe:
    port = free_port()
    node = WalstreamServe(write_node(folder, node_id, port), name=f"node {node_id}", port=port)
    node.start()
    return node


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[WalstreamServe, WalstreamServe]]:
    a = b = None
    try:
        b = start_node(tmp_path, 2)
        a = start_node(tmp_path, 1)
        yield a, b
    finally:
        for node in (a, b):
            if node is not None:
                node.kill()


async def append_exactly_once(session: aiohttp.ClientSession, url: str, seq: int, body: str) -> int:
    """Append ``body`` at ``seq`` (``match_seq_num``) through ``url``, retrying 503s and broken
    forwards; an answer of 412 means an earlier attempt landed: the record at ``seq`` must be
    this one. Returns the number of 503 answers seen."""
    unavailable = 0
    for _ in range(600):
        try:
            async with session.post(
                f"{url}/v1/streams/s/records",
                headers=HEADERS,
                json={"records": [{"body": body}], "match_seq_num": seq},
            ) as response:
                text = await response.text()
                if response.status == 200:
                    return unavailable
                if response.status == 412:
                    async with session.get(
                        f"{url}/v1/streams/s/records?seq_num={seq}&count=1", headers=HEADERS
                    ) as check:
                        assert (await check.json())["records"][0]["body"] == body, text
                    return unavailable
                assert response.status in (503, 504), (response.status, text)
                unavailable += 1
        except aiohttp.ClientConnectionError:
            unavailable += 1
        await asyncio.sleep(0.05)
    raise AssertionError(f"append of {body!r} at {seq} never succeeded")


@pytest.mark.slow
async def test_sigterm_drains_a_node_and_the_next_append_claims_its_stream_elsewhere(
    nodes: tuple[WalstreamServe, WalstreamServe], tmp_path: Path
) -> None:
    s2_sdk = pytest.importorskip("s2_sdk")
    a, b = nodes
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.post(f"{a.url}/v1/basins", json={"basin": BASIN}) as created:
            assert created.status == 201, await created.text()
        async with http.post(f"{a.url}/v1/streams", headers=HEADERS, json={"stream": "s"}) as made:
            assert made.status == 201, await made.text()
        # The first write goes to node B: B claims the stream.
        for seq in range(10):
            assert await append_exactly_once(http, b.url, seq, f"b{seq}") == 0

        metadata = SqliteMetadataStore(str(tmp_path / "meta.db"))
        try:
            assert (await metadata.get_stream(f"{BASIN}.s")).owner_node_id == 2
            # The official SDK through node A: forwarded to node B, which still owns it.
            sdk = s2_sdk.S2("no-token", endpoints=s2_sdk.Endpoints(account=a.url, basin=a.url))
            try:
                stream = sdk.basin(BASIN).stream("s")
                for seq in range(10, 20):
                    ack = await stream.append(
                        s2_sdk.AppendInput(
                            records=[s2_sdk.Record(body=b"a%d" % seq)], match_seq_num=seq
                        )
                    )
                    assert ack.start.seq_num == seq
            finally:
                await sdk.close()
            assert (await metadata.get_stream(f"{BASIN}.s")).owner_node_id == 2

            # A writer through node A keeps appending while node B drains and exits.
            expected = [f"b{i}" for i in range(10)] + [f"a{i}" for i in range(10, 20)]
            total = 120

            async def writer() -> int:
                unavailable = 0
                for seq in range(20, 20 + total):
                    unavailable += await append_exactly_once(http, a.url, seq, f"w{seq}")
                    await asyncio.sleep(0.005)
                return unavailable

            writing = asyncio.ensure_future(writer())
            await asyncio.sleep(0.3)
            stderr = await asyncio.to_thread(b.stop_cleanly)
            assert "uploads everything acknowledged" in stderr
            node_b = await metadata.get_node(2)
            assert node_b is not None and node_b.state is NodeState.STOPPED
            await asyncio.wait_for(writing, 60)
            expected += [f"w{seq}" for seq in range(20, 20 + total)]
            assert (await metadata.get_stream(f"{BASIN}.s")).owner_node_id == 1
        finally:
            await metadata.close()

        read: list[str] = []
        while len(read) < len(expected):
            async with http.get(
                f"{a.url}/v1/streams/s/records?seq_num={len(read)}", headers=HEADERS
            ) as answer:
                records = (await answer.json())["records"]
            assert records, f"read stopped at {len(read)} of {len(expected)}"
            read += [record["body"] for record in records]
        assert read == expected
    a.stop_cleanly()


@pytest.mark.slow
async def test_streams_move_moves_a_stream_between_running_nodes(
    nodes: tuple[WalstreamServe, WalstreamServe], tmp_path: Path
) -> None:
    a, b = nodes
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.post(f"{a.url}/v1/basins", json={"basin": BASIN}) as created:
            assert created.status == 201, await created.text()
        async with http.post(f"{a.url}/v1/streams", headers=HEADERS, json={"stream": "s"}) as made:
            assert made.status == 201, await made.text()
        for seq in range(5):
            await append_exactly_once(http, b.url, seq, f"b{seq}")  # node B claims it

        async def writer() -> None:
            for seq in range(5, 85):
                await append_exactly_once(http, b.url, seq, f"w{seq}")
                await asyncio.sleep(0.005)

        writing = asyncio.ensure_future(writer())
        await asyncio.sleep(0.2)
        moved = await asyncio.to_thread(
            subprocess.run,
            [WALSTREAM, "--config", "node1.yaml", "streams", "move", f"{BASIN}.s", "--to", "1"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert moved.returncode == 0, moved.stderr
        assert f"moved stream '{BASIN}.s'" in moved.stdout and "from node 2 to node 1" in (
            moved.stdout
        )
        await asyncio.wait_for(writing, 60)
        metadata = SqliteMetadataStore(str(tmp_path / "meta.db"))
        try:
            assert (await metadata.get_stream(f"{BASIN}.s")).owner_node_id == 1
        finally:
            await metadata.close()
        async with http.get(f"{b.url}/v1/streams/s/records?seq_num=0", headers=HEADERS) as read:
            bodies = [record["body"] for record in (await read.json())["records"]]
        assert bodies == [f"b{i}" for i in range(5)] + [f"w{i}" for i in range(5, 85)]
        # A node that does not exist is refused with the reason.
        refused = await asyncio.to_thread(
            subprocess.run,
            [WALSTREAM, "--config", "node1.yaml", "streams", "move", f"{BASIN}.s", "--to", "7"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0 and "--to 7: not a running node" in refused.stderr
    b.stop_cleanly()
    a.stop_cleanly()
