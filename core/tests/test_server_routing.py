"""Any node serves any stream: two ``walstream serve`` nodes (in-process, HTTP/1.1) on one
SQLite metadata file and one object store, each with its own WAL. A request for a stream owned
by the other node is forwarded there and its answer relayed; a forwarded request is never
forwarded again; a stream without a live owner is claimed by the node that receives a write."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from walstream.server.s2 import routing
from walstream.server.s2.forward import FORWARDED_HEADER
from walstream.server.serve import RunningServer, serve

BASIN = "routed-basin"
HEADERS = {"s2-basin": BASIN}
TIMEOUT = aiohttp.ClientTimeout(total=20)


def deployment(folder: Path, node_id: int) -> Path:
    path = folder / f"node{node_id}.yaml"
    path.write_text(
        f"node: {{id: {node_id}}}\n"
        f"wal: {{type: memory, name: routing-{folder.name}-{node_id}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
    )
    return path


class Cluster:
    """Nodes by id, with the addresses they advertise (set per test)."""

    def __init__(self, folder: Path, stack: AsyncExitStack) -> None:
        self.folder = folder
        self.stack = stack
        self.nodes: dict[int, RunningServer] = {}
        self.addresses: dict[int, str] = {}

    async def start(self, node_id: int) -> RunningServer:
        running = await self.stack.enter_async_context(
            serve(deployment(self.folder, node_id), listen="127.0.0.1:0", environ={})
        )
        self.nodes[node_id] = running
        self.addresses[node_id] = running.url
        return running


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with AsyncExitStack() as stack:
        nodes = Cluster(tmp_path, stack)

        def advertised(node: Any) -> str | None:
            return nodes.addresses.get(node.node_id)

        monkeypatch.setattr(routing, "advertised", advertised)
        await nodes.start(1)
        await nodes.start(2)
        yield nodes


async def call(
    url: str, method: str, path: str, expect: int, **kwargs: Any
) -> tuple[Any, dict[str, str]]:
    headers = {**HEADERS, **kwargs.pop("headers", {})}
    async with aiohttp.ClientSession(base_url=url, timeout=TIMEOUT) as session:
        async with session.request(method, path, headers=headers, **kwargs) as response:
            text = await response.text()
            assert response.status == expect, (response.status, text)
            return (json.loads(text) if text else None), dict(response.headers)


async def append(url: str, stream: str, *texts: str, expect: int = 200) -> Any:
    body, _ = await call(
        url,
        "POST",
        f"/v1/streams/{stream}/records",
        expect,
        json={"records": [{"body": text} for text in texts]},
    )
    return body


async def read_all(url: str, stream: str) -> list[str]:
    body, _ = await call(url, "GET", f"/v1/streams/{stream}/records?seq_num=0", 200)
    return [record["body"] for record in body["records"]]


async def setup_stream(cluster: Cluster, stream: str) -> None:
    a = cluster.nodes[1].url
    await call(a, "POST", "/v1/basins", 201, json={"basin": BASIN})
    await call(a, "POST", "/v1/streams", 201, json={"stream": stream})


async def test_a_write_through_another_node_is_forwarded_to_the_owner(cluster: Cluster) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "s")
    first = await append(a.url, "s", "a0", "a1")  # node 1 claims the stream
    assert (first["start"]["seq_num"], first["end"]["seq_num"]) == (0, 2)

    second = await append(b.url, "s", "b0")
    assert (second["start"]["seq_num"], second["end"]["seq_num"]) == (2, 3)
    assert b.app.router.forwarded == 1
    assert await read_all(b.url, "s") == ["a0", "a1", "b0"]
    tail, _ = await call(b.url, "GET", "/v1/streams/s/records/tail", 200)
    assert tail["tail"]["seq_num"] == 3
    # Node 2 never wrote: the owner in metadata is still node 1.
    info = await a.client.metadata.get_stream(f"{BASIN}.s")
    assert info.owner_node_id == 1
    # A condition is checked by the owner, and its 412 body relayed as is.
    body, _ = await call(
        b.url,
        "POST",
        "/v1/streams/s/records",
        412,
        json={"records": [{"body": "x"}], "match_seq_num": 0},
    )
    assert body == {"seq_num_mismatch": 3}


async def test_a_long_poll_is_relayed_when_the_record_arrives(cluster: Cluster) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "poll")
    await append(a.url, "poll", "first")
    waiting = asyncio.ensure_future(
        call(b.url, "GET", "/v1/streams/poll/records?seq_num=1&wait=10", 200)
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await append(a.url, "poll", "second")
    body, _ = await asyncio.wait_for(waiting, 10)
    assert [record["body"] for record in body["records"]] == ["second"]


async def test_a_forwarded_request_is_never_forwarded_again(cluster: Cluster) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "loop")
    await append(a.url, "loop", "a0")
    body, headers = await call(
        b.url,
        "POST",
        "/v1/streams/loop/records",
        503,
        json={"records": [{"body": "x"}]},
        headers={FORWARDED_HEADER: "1"},
    )
    assert body["code"] == "unavailable"
    assert "does not forward a forwarded request again" in body["message"]
    assert headers["retry-after-ms"] == "1000"
    assert b.app.router.forwarded == 0
    assert await read_all(a.url, "loop") == ["a0"]


async def test_an_unreachable_owner_is_503_with_a_retry_hint(cluster: Cluster) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "gone")
    await append(a.url, "gone", "a0")
    cluster.addresses[1] = "http://127.0.0.1:9"  # nothing listens there
    body, headers = await call(
        b.url, "POST", "/v1/streams/gone/records", 503, json={"records": [{"body": "x"}]}
    )
    assert body["code"] == "unavailable"
    assert "cannot be reached" in body["message"]
    assert headers["retry-after-ms"] == "1000"
    # An owner that advertises no address: node 2's claim is refused, which is 503 (not 409).
    del cluster.addresses[1]
    body, _ = await call(
        b.url, "POST", "/v1/streams/gone/records", 503, json={"records": [{"body": "x"}]}
    )
    assert "another node owns it" in body["message"]
    assert await read_all(a.url, "gone") == ["a0"]


async def test_a_stream_released_by_a_stopped_node_is_claimed_by_the_next_writer(
    cluster: Cluster,
) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "moved")
    await append(a.url, "moved", "a0", "a1")
    a.app.begin_shutdown()
    body, headers = await call(
        a.url, "POST", "/v1/streams/moved/records", 503, json={"records": [{"body": "x"}]}
    )
    assert body["code"] == "server_draining"
    assert headers["retry-after-ms"] == "1000"
    await a.client.close()  # uploads what node 1 acknowledged and releases its streams
    assert (await b.client.metadata.get_stream(f"{BASIN}.moved")).owner_node_id is None
    ack = await append(b.url, "moved", "b0")
    assert ack["start"]["seq_num"] == 2
    assert b.app.router.forwarded == 0
    assert (await b.client.metadata.get_stream(f"{BASIN}.moved")).owner_node_id == 2
    assert await read_all(b.url, "moved") == ["a0", "a1", "b0"]


async def test_the_s2_sdk_appends_and_reads_through_a_node_that_does_not_own_the_stream(
    cluster: Cluster,
) -> None:
    s2_sdk = pytest.importorskip("s2_sdk")
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "sdk")
    await append(a.url, "sdk", "a0")  # node 1 owns the stream
    client = s2_sdk.S2("unused-token", endpoints=s2_sdk.Endpoints(account=b.url, basin=b.url))
    try:
        stream = client.basin(BASIN).stream("sdk")
        ack = await stream.append(
            s2_sdk.AppendInput(records=[s2_sdk.Record(body=b"b0")], match_seq_num=1)
        )
        assert (ack.start.seq_num, ack.end.seq_num) == (1, 2)
        with pytest.raises(s2_sdk.SeqNumMismatchError) as mismatch:
            await stream.append(
                s2_sdk.AppendInput(records=[s2_sdk.Record(body=b"x")], match_seq_num=0)
            )
        assert mismatch.value.expected_seq_num == 2
        # The S2S producer session streams its body through node 2 to node 1.
        async with stream.producer() as producer:
            tickets = [await producer.submit(s2_sdk.Record(body=b"p%d" % i)) for i in range(20)]
            acks = [await ticket for ticket in tickets]
        assert [ack.seq_num for ack in acks] == list(range(2, 22))
        read: list[bytes] = []
        async for batch in stream.read_session(
            start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=22)
        ):
            read += [record.body for record in batch.records]
        assert read == [b"a0", b"b0", *(b"p%d" % i for i in range(20))]
        assert (await stream.check_tail()).seq_num == 22
    finally:
        await client.close()
    assert b.app.router.forwarded >= 5
    assert (await a.client.metadata.get_stream(f"{BASIN}.sdk")).owner_node_id == 1


async def test_an_owner_whose_lease_expired_is_not_forwarded_to(cluster: Cluster) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "lease")
    await append(a.url, "lease", "a0")
    metadata = b.client.metadata
    await metadata.renew_lease(1, a.client.node_epoch, 1)
    while (await metadata.get_node(1)).live(await metadata.store_time_ms()):  # type: ignore[union-attr]
        await asyncio.sleep(0.01)
    # Node 1 still answers, but its lease expired: node 2 does not forward (a paused owner
    # would hold the request), nor write, nor read what is committed (node 1's WAL may hold
    # acknowledged records): 503 until node 1 is failed over.
    body, headers = await call(
        b.url, "POST", "/v1/streams/lease/records", 503, json={"records": [{"body": "x"}]}
    )
    assert body["code"] == "unavailable" and headers["retry-after-ms"] == "1000"
    assert "not live" in body["message"]
    body, _ = await call(b.url, "GET", "/v1/streams/lease/records?seq_num=0", 503)
    assert body["code"] == "unavailable"
    assert b.app.router.forwarded == 0
    await metadata.renew_lease(1, a.client.node_epoch, 60_000)
    assert (await append(b.url, "lease", "b0"))["start"]["seq_num"] == 1
    assert b.app.router.forwarded == 1


async def test_a_stream_moves_live_and_held_appends_retry_at_the_new_owner(
    cluster: Cluster,
) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "mv")
    await append(a.url, "mv", "a0", "a1")
    stream_id = (await a.client.metadata.get_stream(f"{BASIN}.mv")).stream_id
    # Appends keep coming through node 2 (forwarded to node 1) while the stream moves.
    acked: list[str] = []

    async def writer() -> None:
        for i in range(40):
            text = f"w{i}"
            while True:
                async with aiohttp.ClientSession(base_url=b.url, timeout=TIMEOUT) as session:
                    async with session.post(
                        "/v1/streams/mv/records",
                        headers=HEADERS,
                        json={"records": [{"body": text}], "match_seq_num": 2 + i},
                    ) as response:
                        if response.status == 200:
                            acked.append(text)
                            break
                        assert response.status == 503, await response.text()
                await asyncio.sleep(0.02)

    writing = asyncio.ensure_future(writer())
    await asyncio.sleep(0.1)
    body, _ = await call(a.url, "POST", f"/cluster/v1/streams/{stream_id}/move?to=2", 200)
    assert body == {"stream_id": stream_id, "owner_node_id": 2}
    assert (await a.client.metadata.get_stream(stream_id)).owner_node_id == 2
    await asyncio.wait_for(writing, 30)
    assert await read_all(a.url, "mv") == ["a0", "a1", *acked]
    assert acked == [f"w{i}" for i in range(40)]
    # Moving it to where it is, or to a node that does not exist, is refused or a no-op.
    body, _ = await call(b.url, "POST", f"/cluster/v1/streams/{stream_id}/move?to=2", 200)
    assert body["owner_node_id"] == 2
    body, _ = await call(b.url, "POST", f"/cluster/v1/streams/{stream_id}/move?to=9", 422)
    assert "node 9 is not a running node" in body["message"]


async def test_reads_of_committed_data_are_served_by_any_node(cluster: Cluster) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "history")
    await append(a.url, "history", *(f"r{i}" for i in range(10)))
    await a.client.flush()  # r0..r9 are committed to object storage
    await append(a.url, "history", "fresh")  # acknowledged by node 1, perhaps not committed
    body, _ = await call(b.url, "GET", "/v1/streams/history/records?seq_num=2&count=3", 200)
    assert [record["body"] for record in body["records"]] == ["r2", "r3", "r4"]
    assert body.get("tail") is None  # as node 1 answers: the batch does not end at the tail
    assert (b.app.router.served_committed, b.app.router.forwarded) == (1, 0)
    # A read that reaches the committed end needs the owner (it knows the acknowledged tail).
    body, _ = await call(b.url, "GET", "/v1/streams/history/records?seq_num=8", 200)
    assert [record["body"] for record in body["records"]] == ["r8", "r9", "fresh"]
    assert body["tail"]["seq_num"] == 11
    assert (b.app.router.served_committed, b.app.router.forwarded) == (1, 1)
    # While the owner is not live, committed data is still read here; the rest is 503.
    await b.client.metadata.renew_lease(1, a.client.node_epoch, 1)
    await asyncio.sleep(0.05)
    b.app.router.forget((await a.client.metadata.get_stream(f"{BASIN}.history")).stream_id)
    body, _ = await call(b.url, "GET", "/v1/streams/history/records?seq_num=0&count=2", 200)
    assert [record["body"] for record in body["records"]] == ["r0", "r1"]
    await call(b.url, "GET", "/v1/streams/history/records?seq_num=9", 503)


async def test_an_sse_read_session_is_relayed_as_it_streams(cluster: Cluster) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    await setup_stream(cluster, "sse")
    await append(a.url, "sse", "e0")
    async with aiohttp.ClientSession(base_url=b.url, timeout=TIMEOUT) as session:
        async with session.get(
            "/v1/streams/sse/records?seq_num=0&count=2&wait=10",
            headers={**HEADERS, "accept": "text/event-stream"},
        ) as response:
            assert response.status == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
            while b'"e0"' not in first:
                first += await asyncio.wait_for(response.content.readuntil(b"\n\n"), 10)
            await append(a.url, "sse", "e1")  # arrives while the relayed session waits
            rest = await asyncio.wait_for(response.content.read(), 10)
    assert b'"e1"' in rest
    assert b.app.router.forwarded == 1
