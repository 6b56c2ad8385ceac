"""Node credentials (:mod:`walstream.server.node_auth`): with ``WALSTREAM_CLUSTER_SECRET`` a
forwarded request or an internal one (``/cluster/...``) is refused unless a node signed it, even
when it carries a valid client token and the forwarding header; nodes that share the secret
still forward to each other and move streams. Without a secret the old rules hold (documented in
``docs/guides/security.md``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from walstream.errors import ConfigError
from walstream.server.limits import ServerLimits
from walstream.server.node_auth import (
    NODE_AUTH_HEADER,
    REPLAY_WINDOW_S,
    SECRET_ENVIRONMENT_VARIABLE,
    NodeCredentials,
)
from walstream.server.s2 import routing
from walstream.server.s2.forward import FORWARDED_HEADER
from walstream.server.serve import RunningServer, serve

SECRET = "a-cluster-secret-of-32-characters"
TOKEN = "client-token"
BASIN = "secured-basin"
AUTH = {"authorization": f"Bearer {TOKEN}", "s2-basin": BASIN}
TIMEOUT = aiohttp.ClientTimeout(total=30)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_signature_holds_for_its_method_target_and_window_only() -> None:
    clock = Clock(1_000_000.0)
    signer = NodeCredentials(SECRET, 2, clock)
    checker = NodeCredentials(SECRET, 1, clock)
    value = signer.sign("POST", "/v1/streams/a/records")
    assert checker.verify("POST", "/v1/streams/a/records", value) == 2
    assert checker.verify("GET", "/v1/streams/a/records", value) is None
    assert checker.verify("POST", "/v1/streams/b/records", value) is None
    assert (
        checker.verify("POST", "/v1/streams/a/records", value.replace("node=2", "node=3")) is None
    )
    other = NodeCredentials("another-secret-of-enough-bytes", 1, clock)
    assert other.verify("POST", "/v1/streams/a/records", value) is None
    clock.now += REPLAY_WINDOW_S + 1  # a replay after the window
    assert checker.verify("POST", "/v1/streams/a/records", value) is None
    clock.now -= 2 * (REPLAY_WINDOW_S + 1)  # or a timestamp from the future
    assert checker.verify("POST", "/v1/streams/a/records", value) is None
    for garbage in ("", "v2 node=2 ts=1 sig=00", "v1 node=x ts=1 sig=" + "0" * 64, "v1"):
        assert checker.verify("POST", "/", garbage) is None


def test_a_short_secret_is_refused_with_how_to_make_one() -> None:
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        NodeCredentials("short", 1)


def deployment(folder: Path, node_id: int) -> Path:
    path = folder / f"node{node_id}.yaml"
    path.write_text(
        f"node: {{id: {node_id}}}\n"
        f"wal: {{type: memory, name: node-auth-{folder.name}-{node_id}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
    )
    return path


@pytest.fixture
async def nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[dict[int, RunningServer]]:
    """Two nodes sharing the secret and the metadata store, each advertising its URL."""
    addresses: dict[int, str] = {}
    monkeypatch.setattr(routing, "advertised", lambda node: addresses.get(node.node_id))
    monkeypatch.setenv(SECRET_ENVIRONMENT_VARIABLE, SECRET)  # the streams move CLI would read it
    environ = {SECRET_ENVIRONMENT_VARIABLE: SECRET}
    async with AsyncExitStack() as stack:
        running = {}
        for node_id in (1, 2):
            running[node_id] = await stack.enter_async_context(
                serve(
                    deployment(tmp_path, node_id),
                    listen="127.0.0.1:0",
                    token=TOKEN,
                    environ=environ,
                )
            )
            addresses[node_id] = running[node_id].url
        yield running


async def call(
    url: str, method: str, path: str, headers: dict[str, str], **kwargs: Any
) -> tuple[int, Any]:
    async with aiohttp.ClientSession(base_url=url, timeout=TIMEOUT) as session:
        async with session.request(method, path, headers=headers, **kwargs) as response:
            text = await response.text()
            return response.status, (json.loads(text) if text else None)


async def make_stream(url: str, stream: str) -> int:
    assert (await call(url, "POST", "/v1/basins", AUTH, json={"basin": BASIN}))[0] in (201, 409)
    status, _ = await call(url, "POST", "/v1/streams", AUTH, json={"stream": stream})
    assert status == 201
    status, body = await call(
        url, "POST", f"/v1/streams/{stream}/records", AUTH, json={"records": [{"body": "a0"}]}
    )
    assert status == 200, body
    return int(body["end"]["seq_num"])


async def test_a_forwarded_request_without_node_credentials_is_refused_even_with_the_token(
    nodes: dict[int, RunningServer],
) -> None:
    a = nodes[1]
    await make_stream(a.url, "owned-by-1")
    forged = {**AUTH, FORWARDED_HEADER: "2"}
    for method, path, body in (
        ("POST", "/v1/streams/owned-by-1/records", {"records": [{"body": "forged"}]}),
        ("GET", "/v1/streams/owned-by-1/records?seq_num=0", None),
        ("GET", "/v1/basins", None),
    ):
        status, answer = await call(a.url, method, path, forged, json=body)
        assert (status, answer["code"]) == (401, "authn"), answer
        assert SECRET_ENVIRONMENT_VARIABLE in answer["message"]
    # A signature made for another request (a replay on another route) does not open it.
    signed_elsewhere = NodeCredentials(SECRET, 2).sign("GET", "/v1/basins")
    status, _ = await call(
        a.url,
        "POST",
        "/v1/streams/owned-by-1/records",
        {**forged, NODE_AUTH_HEADER: signed_elsewhere},
        json={"records": [{"body": "forged"}]},
    )
    assert status == 401
    # Nothing forged was appended.
    status, read = await call(a.url, "GET", "/v1/streams/owned-by-1/records?seq_num=0", AUTH)
    assert [record["body"] for record in read["records"]] == ["a0"]


async def test_internal_routes_need_node_credentials_and_the_token_alone_does_not_open_them(
    nodes: dict[int, RunningServer],
) -> None:
    a = nodes[1]
    await make_stream(a.url, "claimed")
    stream_id = (await a.client.metadata.get_stream(f"{BASIN}.claimed")).stream_id
    for path in (
        f"/cluster/v1/streams/{stream_id}/claim",
        f"/cluster/v1/streams/{stream_id}/move?to=2",
    ):
        status, answer = await call(a.url, "POST", path, AUTH)
        assert (status, answer["code"]) == (401, "authn"), answer
        status, _ = await call(a.url, "POST", path, {**AUTH, FORWARDED_HEADER: "2"})
        assert status == 401
    assert (await a.client.metadata.get_stream(stream_id)).owner_node_id == 1
    # Signed by a node that holds the secret: the move goes through (node 1 asks node 2 to
    # claim, signing that internal request too).
    path = f"/cluster/v1/streams/{stream_id}/move?to=2"
    signed = {**AUTH, NODE_AUTH_HEADER: NodeCredentials(SECRET, 2).sign("POST", path)}
    status, answer = await call(a.url, "POST", path, signed)
    assert (status, answer) == (200, {"stream_id": stream_id, "owner_node_id": 2})


async def test_nodes_sharing_the_secret_forward_to_each_other(
    nodes: dict[int, RunningServer],
) -> None:
    a, b = nodes[1], nodes[2]
    await make_stream(a.url, "relayed")
    status, body = await call(
        b.url, "POST", "/v1/streams/relayed/records", AUTH, json={"records": [{"body": "via-b"}]}
    )
    assert status == 200, body
    assert b.app.router.forwarded >= 1
    status, read = await call(b.url, "GET", "/v1/streams/relayed/records?seq_num=0", AUTH)
    assert [record["body"] for record in read["records"]] == ["a0", "via-b"]


async def test_without_a_secret_the_forwarding_header_and_the_token_are_trusted(
    tmp_path: Path,
) -> None:
    """What holds without a secret (documented): internal routes take the service token, and a
    forwarded request is served (never forwarded again)."""
    async with serve(
        deployment(tmp_path, 1), listen="127.0.0.1:0", token=TOKEN, environ={}
    ) as running:
        await make_stream(running.url, "open")
        status, _ = await call(
            running.url,
            "GET",
            "/v1/streams/open/records?seq_num=0",
            {**AUTH, FORWARDED_HEADER: "2"},
        )
        assert status == 200
        stream_id = (await running.client.metadata.get_stream(f"{BASIN}.open")).stream_id
        status, _ = await call(running.url, "POST", f"/cluster/v1/streams/{stream_id}/claim", AUTH)
        assert status == 200


async def test_one_address_holds_a_bounded_number_of_connections_and_nodes_are_exempt(
    tmp_path: Path,
) -> None:
    """Past ``max_connections_per_address`` a connection from that address gets 503, unless its
    first request is signed by a node; another address is served meanwhile."""
    limits = ServerLimits(max_connections_per_address=2, header_timeout_s=30.0)
    async with serve(
        deployment(tmp_path, 1),
        listen="127.0.0.1:0",
        token=TOKEN,
        limits=limits,
        environ={SECRET_ENVIRONMENT_VARIABLE: SECRET},
    ) as running:

        async def ask(source: str, extra: bytes = b"") -> bytes:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", running.port, local_addr=(source, 0)
            )
            try:
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
                return await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
            finally:
                writer.close()

        held = [
            await asyncio.open_connection("127.0.0.1", running.port, local_addr=("127.0.0.2", 0))
            for _ in range(2)
        ]
        await asyncio.sleep(0.1)
        assert b" 503 " in await ask("127.0.0.2")
        assert b" 200 " in await ask("127.0.0.1")  # another address is served
        signed = NodeCredentials(SECRET, 2).sign("GET", "/health")
        assert b" 200 " in await ask("127.0.0.2", f"{NODE_AUTH_HEADER}: {signed}\r\n".encode())
        held[0][1].close()
        await asyncio.sleep(0.2)
        assert b" 200 " in await ask("127.0.0.2")  # room again
        for _, writer in held:
            writer.close()
