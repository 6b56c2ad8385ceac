"""The protobuf forms of the unary records routes of ``walstream serve`` over plain HTTP/1.1, with
the headers S2's SDKs send: the TypeScript SDK (``@s2-dev/streamstore``) names the messages
``application/protobuf``, the Python SDK ``application/x-protobuf``. As on S2's own server, the
request body's form follows ``Content-Type`` and the answer's form follows the first type of
``Accept``. Messages are built and parsed with S2's generated classes (from ``s2-sdk``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from walstream.server.serve import RunningServer, serve

pb = pytest.importorskip("s2_sdk._generated.s2.v1.s2_pb2")

TOKEN = "protobuf-token"
BASIN = "proto-basin"
PATH = "/v1/streams/orders/records"
TIMEOUT = aiohttp.ClientTimeout(total=20)
# What the TypeScript SDK sends with a batch holding a bytes record, and with a read `as: "bytes"`.
TS_APPEND = {"Accept": "application/protobuf", "Content-Type": "application/protobuf"}
TS_READ = {"Accept": "application/protobuf"}


@pytest.fixture
async def http(
    tmp_path: Path,
) -> AsyncIterator[aiohttp.ClientSession]:
    """A session on a fresh server (memory WAL, each HTTP server in turn) that sends the token
    and names a basin holding the stream ``orders``."""
    deployment = tmp_path / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        f"wal: {{type: memory, name: proto-{tmp_path.name}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
    )
    running: RunningServer
    async with (
        serve(
            deployment,
            listen="127.0.0.1:0",
            token=TOKEN,
            environ={},
        ) as running,
        aiohttp.ClientSession(
            base_url=running.url,
            headers={
                "Authorization": f"Bearer {TOKEN}",
                "s2-basin": BASIN,
                "user-agent": "s2-sdk-typescript",
            },
            timeout=TIMEOUT,
        ) as session,
    ):
        async with session.post("/v1/basins", json={"basin": BASIN}) as answer:
            assert answer.status == 201, await answer.text()
        async with session.post("/v1/streams", json={"stream": "orders"}) as answer:
            assert answer.status == 201, await answer.text()
        yield session


def append_input(*bodies: bytes, command: bytes | None = None) -> bytes:
    message = pb.AppendInput()
    for body in bodies:
        record = message.records.add(body=body)
        if command is not None:
            record.headers.add(name=b"", value=command)
    return bytes(message.SerializeToString())


async def exchange(
    http: aiohttp.ClientSession, method: str, headers: dict[str, str], **kwargs: Any
) -> tuple[str, bytes]:
    """(the answer's content type, its body) of a 200 answer."""
    async with http.request(method, PATH, headers=headers, **kwargs) as answer:
        body = await answer.read()
        assert answer.status == 200, (answer.status, body[:300])
        return answer.headers["Content-Type"], body


async def test_typescript_sdk_protobuf_append_read_and_trim(http: aiohttp.ClientSession) -> None:
    first = pb.AppendInput()
    record = first.records.add(body=b"\x00\x01\xff")
    record.headers.add(name=b"kind", value=b"\xfe\x00")
    answer_type, body = await exchange(
        http, "POST", TS_APPEND, data=bytes(first.SerializeToString())
    )
    assert answer_type == "application/protobuf"
    ack = pb.AppendAck.FromString(body)
    assert (ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num) == (0, 1, 1)
    assert ack.end.timestamp > 0

    await exchange(http, "POST", TS_APPEND, data=append_input(b"b", b"c"))
    answer_type, body = await exchange(http, "GET", TS_READ, params={"seq_num": "0", "count": "1"})
    assert answer_type == "application/protobuf"
    batch = pb.ReadBatch.FromString(body)
    assert [(r.seq_num, r.body) for r in batch.records] == [(0, b"\x00\x01\xff")]
    assert [(h.name, h.value) for h in batch.records[0].headers] == [(b"kind", b"\xfe\x00")]

    # AppendRecord.trim(2) of the TypeScript SDK: a bytes command record, so protobuf.
    trim_point = (2).to_bytes(8, "big")
    _, body = await exchange(
        http, "POST", TS_APPEND, data=append_input(trim_point, command=b"trim")
    )
    assert pb.AppendAck.FromString(body).start.seq_num == 3
    _, body = await exchange(http, "GET", TS_READ, params={"seq_num": "0"})
    batch = pb.ReadBatch.FromString(body)
    assert [r.seq_num for r in batch.records] == [2, 3]
    assert batch.records[1].body == trim_point
    assert batch.tail.seq_num == 4


async def test_the_answer_form_follows_the_first_type_of_accept(
    http: aiohttp.ClientSession,
) -> None:
    # A protobuf body asking for JSON gets a JSON ack.
    answer_type, body = await exchange(
        http,
        "POST",
        {"Content-Type": "application/x-protobuf", "Accept": "application/json"},
        data=append_input(b"a"),
    )
    assert answer_type == "application/json"
    assert json.loads(body)["end"]["seq_num"] == 1
    # A protobuf body asking for nothing gets JSON too (S2's default form).
    answer_type, body = await exchange(
        http, "POST", {"Content-Type": "application/protobuf"}, data=append_input(b"b")
    )
    assert json.loads(body)["start"]["seq_num"] == 1
    # A JSON body asking for protobuf (the Python SDK's type, with a parameter) gets protobuf.
    answer_type, body = await exchange(
        http,
        "POST",
        {"Accept": "application/x-protobuf; q=1"},
        json={"records": [{"body": "c"}]},
    )
    assert answer_type == "application/x-protobuf"
    assert pb.AppendAck.FromString(body).start.seq_num == 2
    # Only the first type of Accept counts.
    answer_type, body = await exchange(
        http, "GET", {"Accept": "application/json, application/protobuf"}, params={"seq_num": "0"}
    )
    assert answer_type == "application/json"
    assert [r["body"] for r in json.loads(body)["records"]] == ["a", "b", "c"]
    answer_type, body = await exchange(
        http, "GET", {"Accept": "Application/Protobuf, application/json"}, params={"seq_num": "2"}
    )
    assert answer_type == "application/protobuf"
    assert [r.body for r in pb.ReadBatch.FromString(body).records] == [b"c"]


async def test_typescript_sdk_bytes_read_of_records_appended_as_json(
    http: aiohttp.ClientSession,
) -> None:
    _, body = await exchange(
        http,
        "POST",
        {"s2-format": "base64"},
        json={"records": [{"body": "AAH/"}, {"body": "eA=="}]},
    )
    assert json.loads(body)["end"]["seq_num"] == 2
    answer_type, body = await exchange(http, "GET", TS_READ, params={"seq_num": "0"})
    assert answer_type == "application/protobuf"
    batch = pb.ReadBatch.FromString(body)
    assert [r.body for r in batch.records] == [b"\x00\x01\xff", b"x"]
    assert batch.tail.seq_num == 2
