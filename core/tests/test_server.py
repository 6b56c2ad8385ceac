"""``walstream serve`` (S2's REST API v1, the HTTP service) and ``walstream bench``, against
real servers on 127.0.0.1: in-process for the routes (HTTP/1.1 and JSON here; S2's own SDK in
test_server_s2_sdk.py), and as real processes for signals and the CLI."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import walstream
from prometheus_client.parser import text_string_to_metric_families
from walstream.server.serve import RunningServer, serve
from walstream_conformance.harness.serve import WalstreamServe
from walstream_conformance.waiting import eventually

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASIN = "test-basin"
IN_BASIN = {"s2-basin": BASIN}
MAX_BODY_BYTES = 64 * 1024
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=20)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def write_deployment(folder: Path, wal_name: str) -> Path:
    path = folder / "deploy.yaml"
    path.write_text(
        "node: {id: 1}\n"
        f"wal: {{type: memory, name: {wal_name}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
        "server: {listen: 127.0.0.1:7400}\n"
    )
    return path


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    return write_deployment(tmp_path, f"server-{tmp_path.name}")


@pytest.fixture
async def server(deployment: Path) -> AsyncIterator[RunningServer]:
    """The node served over HTTP."""
    async with serve(
        deployment,
        listen="127.0.0.1:0",
        token=TOKEN,
        max_body_bytes=MAX_BODY_BYTES,
        max_wait_s=10.0,
        environ={},
    ) as running:
        yield running


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[aiohttp.ClientSession]:
    """A session on the server's base URL that sends the token and names the test basin
    (created here)."""
    async with aiohttp.ClientSession(
        base_url=server.url, headers={**AUTH, **IN_BASIN}, timeout=REQUEST_TIMEOUT
    ) as session:
        await call(session, "POST", "/v1/basins", 201, json={"basin": BASIN})
        yield session


async def call(
    session: aiohttp.ClientSession, method: str, path: str, expect: int, **kwargs: Any
) -> Any:
    async with session.request(method, path, **kwargs) as response:
        text = await response.text()
        assert response.status == expect, (response.status, text)
        return json.loads(text) if text else None


async def create(session: aiohttp.ClientSession, name: str) -> dict[str, Any]:
    body: dict[str, Any] = await call(session, "POST", "/v1/streams", 201, json={"stream": name})
    return body


async def append_texts(session: aiohttp.ClientSession, stream: str, *texts: str) -> dict[str, Any]:
    body: dict[str, Any] = await call(
        session,
        "POST",
        f"/v1/streams/{stream}/records",
        200,
        json={"records": [{"body": text} for text in texts]},
    )
    return body


# -- auth and health --------------------------------------------------------------------------


async def test_health_needs_no_token_and_every_other_route_does(server: RunningServer) -> None:
    async with aiohttp.ClientSession(base_url=server.url, timeout=REQUEST_TIMEOUT) as anonymous:
        health = await call(anonymous, "GET", "/health", 200)
        assert health == {"status": "ok", "node_id": 1, "node_epoch": server.client.node_epoch}
        assert server.client.node_epoch >= 1

        for method, path in [
            ("GET", "/v1/basins"),
            ("GET", "/metrics"),
            ("POST", "/v1/basins"),
            ("GET", "/v1/streams/x/records/tail"),
        ]:
            async with anonymous.request(method, path, headers=IN_BASIN) as response:
                assert response.status == 401, path
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
                body = await response.json()
                assert body["code"] == "authn"
                assert "Authorization: Bearer" in body["message"]

        wrong = {"Authorization": "Bearer not-the-token"}
        body = await call(anonymous, "GET", "/v1/basins", 401, headers=wrong)
        assert body["message"] == "wrong bearer token"
        await call(anonymous, "GET", "/v1/basins", 401, headers={"Authorization": TOKEN})
        listed = await call(anonymous, "GET", "/v1/basins", 200, headers=AUTH)
        assert [basin["name"] for basin in listed["basins"]] == ["walstream"]


async def test_health_is_503_once_a_newer_process_fences_the_node(
    server: RunningServer, http: aiohttp.ClientSession, deployment: Path
) -> None:
    await create(http, "orders")
    await append_texts(http, "orders", "before")
    # Another process of node 1 starts on the same metadata: a newer node epoch fences us.
    usurper = write_deployment(deployment.parent, f"usurper-{deployment.parent.name}")
    async with walstream.open(usurper) as newer:
        assert newer.node_epoch > server.client.node_epoch
        # The next upload's commit is refused; the node stops accepting writes.
        await append_texts(http, "orders", "in flight")
        health: dict[str, Any] = {}

        async def failed() -> bool:
            nonlocal health
            async with http.get("/health") as response:
                health = await response.json()
                return response.status == 503

        await eventually(failed, "/health to report the fenced node")
        assert health["status"] == "failed"
        assert health["error"] == "FencedError"
        refused = await call(
            http, "POST", "/v1/streams/orders/records", 409, json={"records": [{"body": "x"}]}
        )
        assert refused["code"] == "transaction_conflict"


async def test_token_from_environment_and_no_token_means_open(deployment: Path) -> None:
    async with serve(
        deployment, listen="127.0.0.1:0", environ={"WALSTREAM_TOKEN": "from-env"}
    ) as running:
        assert running.token == "from-env"
        async with aiohttp.ClientSession(base_url=running.url, timeout=REQUEST_TIMEOUT) as s:
            await call(s, "GET", "/v1/basins", 401)
            await call(s, "GET", "/v1/basins", 200, headers={"Authorization": "Bearer from-env"})
    async with serve(deployment, listen="127.0.0.1:0", environ={}) as running:
        assert running.token is None
        async with aiohttp.ClientSession(base_url=running.url, timeout=REQUEST_TIMEOUT) as s:
            await call(s, "GET", "/v1/basins", 200)


# -- basins and streams -----------------------------------------------------------------------


async def test_basins_are_created_listed_ensured_and_deleted_with_their_streams(
    http: aiohttp.ClientSession, server: RunningServer
) -> None:
    info = await call(http, "POST", "/v1/basins", 201, json={"basin": "second-basin"})
    assert info["name"] == "second-basin" and info["created_at"].endswith("Z")
    listed = await call(http, "GET", "/v1/basins", 200, params={"prefix": "se"})
    assert [b["name"] for b in listed["basins"]] == ["second-basin"]
    assert listed["has_more"] is False
    page = await call(http, "GET", "/v1/basins", 200, params={"limit": "1"})
    assert [b["name"] for b in page["basins"]] == ["second-basin"] and page["has_more"]
    after = await call(http, "GET", "/v1/basins", 200, params={"start_after": "second-basin"})
    assert [b["name"] for b in after["basins"]] == [BASIN, "walstream"]
    config = await call(http, "GET", "/v1/basins/second-basin", 200)
    assert config["create_stream_on_append"] is False

    async with http.put("/v1/basins/second-basin") as response:
        assert response.status == 200 and response.headers["s2-provision-result"] == "noop"
    async with http.put(
        "/v1/basins/third-basin", json={"config": {"create_stream_on_append": True}}
    ) as response:
        assert response.status == 201 and response.headers["s2-provision-result"] == "created"
    # create_stream_on_append: the first append makes the stream.
    third = {"s2-basin": "third-basin"}
    ack = await call(
        http,
        "POST",
        "/v1/streams/auto/records",
        200,
        json={"records": [{"body": "x"}]},
        headers=third,
    )
    assert ack["end"]["seq_num"] == 1

    # Streams of a basin are walstream streams named <basin>.<stream>.
    await create(http, "orders")
    names = [info.name for info in await server.client.list_streams()]
    assert f"{BASIN}.orders" in names and "third-basin.auto" in names
    await call(http, "DELETE", "/v1/basins/third-basin", 202)
    assert "third-basin.auto" not in [info.name for info in await server.client.list_streams()]
    await call(http, "GET", "/v1/basins/third-basin", 404)
    missing = await call(http, "GET", "/v1/streams", 404, headers=third)
    assert missing["code"] == "basin_not_found"


async def test_basins_persist_across_restarts(deployment: Path) -> None:
    async with serve(deployment, listen="127.0.0.1:0", environ={}) as running:
        async with aiohttp.ClientSession(base_url=running.url, timeout=REQUEST_TIMEOUT) as s:
            await call(s, "POST", "/v1/basins", 201, json={"basin": "lasting-basin"})
    async with serve(deployment, listen="127.0.0.1:0", environ={}) as running:
        async with aiohttp.ClientSession(base_url=running.url, timeout=REQUEST_TIMEOUT) as s:
            listed = await call(s, "GET", "/v1/basins", 200)
            assert "lasting-basin" in [b["name"] for b in listed["basins"]]


async def test_create_list_get_ensure_delete_streams(http: aiohttp.ClientSession) -> None:
    created = await create(http, "orders")
    assert created["name"] == "orders" and created["deleted_at"] is None
    await create(http, "order-lines")
    await create(http, "zeta")
    listed = await call(http, "GET", "/v1/streams", 200, params={"prefix": "order"})
    assert [s["name"] for s in listed["streams"]] == ["order-lines", "orders"]
    page = await call(http, "GET", "/v1/streams", 200, params={"limit": "2"})
    assert [s["name"] for s in page["streams"]] == ["order-lines", "orders"] and page["has_more"]
    rest = await call(http, "GET", "/v1/streams", 200, params={"start_after": "orders"})
    assert [s["name"] for s in rest["streams"]] == ["zeta"]

    again = await call(http, "POST", "/v1/streams", 409, json={"stream": "orders"})
    assert again["code"] == "resource_already_exists"
    config = await call(http, "GET", "/v1/streams/orders", 200)
    assert config["retention_policy"] == {"age": 7 * 86_400}, "S2's default in an S2 basin"
    assert config["timestamping"] == {"mode": "client-prefer", "uncapped": False}
    async with http.put("/v1/streams/orders") as response:
        assert response.status == 200 and response.headers["s2-provision-result"] == "noop"
    async with http.put("/v1/streams/fresh", json={"storage_class": "standard"}) as response:
        assert response.status == 201 and response.headers["s2-provision-result"] == "created"
    changed = await call(
        http, "PATCH", "/v1/streams/orders", 200, json={"retention_policy": {"age": 3600}}
    )
    assert changed["retention_policy"] == {"age": 3600}
    refused = await call(
        http, "PATCH", "/v1/streams/orders", 422, json={"retention_policy": {"age": 0}}
    )
    assert "retention_policy" in refused["message"]
    kept = await call(http, "PATCH", "/v1/streams/orders", 200, json={"storage_class": "express"})
    assert (kept["storage_class"], kept["retention_policy"]) == ("express", {"age": 3600})

    assert await call(http, "DELETE", "/v1/streams/orders", 202) is None
    missing = await call(http, "GET", "/v1/streams/orders", 404)
    assert missing["code"] == "stream_not_found"
    await call(http, "DELETE", "/v1/streams/orders", 404)
    await create(http, "orders")  # the name is free again: a new, empty stream
    tail = await call(http, "GET", "/v1/streams/orders/records/tail", 200)
    assert tail["tail"]["seq_num"] == 0


async def test_the_root_basin_holds_every_walstream_stream_by_its_own_name(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    native = await server.client.create_stream("native")
    await native.append([walstream.Record(b"v", key=b"k", headers=(("h", b"1"),))])
    await create(http, "orders")
    root = {"s2-basin": "walstream"}
    listed = await call(http, "GET", "/v1/streams", 200, headers=root)
    assert [s["name"] for s in listed["streams"]] == ["native", f"{BASIN}.orders"]
    read = await call(
        http, "GET", "/v1/streams/native/records", 200, params={"seq_num": "0"}, headers=root
    )
    # The key travels as the first header, walstream-key.
    assert read["records"][0]["headers"] == [["walstream-key", "k"], ["h", "1"]]
    # ... and an append whose first header is walstream-key stores it as the key.
    await call(
        http,
        "POST",
        "/v1/streams/native/records",
        200,
        json={"records": [{"body": "w", "headers": [["walstream-key", "k2"], ["h", "2"]]}]},
        headers=root,
    )
    records = (await native.read(start=1)).records
    assert (records[0].key, records[0].headers, records[0].value) == (b"k2", (("h", b"2"),), b"w")


async def test_a_basin_endpoint_host_names_the_basin(http: aiohttp.ClientSession) -> None:
    """S2's hosted basin endpoints are ``{basin}.b.<domain>``: without ``s2-basin`` the Host
    header names the basin."""
    await create(http, "orders")
    async with aiohttp.ClientSession(
        base_url=str(http._base_url), headers=AUTH, timeout=REQUEST_TIMEOUT
    ) as plain:
        listed = await call(
            plain, "GET", "/v1/streams", 200, headers={"Host": f"{BASIN}.b.example.com"}
        )
        assert [s["name"] for s in listed["streams"]] == ["orders"]
        missing = await call(plain, "GET", "/v1/streams", 400, headers={"Host": "example.com"})
        assert missing["code"] == "bad_header" and "s2-basin" in missing["message"]


# -- records ----------------------------------------------------------------------------------


async def test_json_append_then_read_every_field(http: aiohttp.ClientSession) -> None:
    await create(http, "orders")
    now_ms = int(time.time() * 1000)
    ack = await call(
        http,
        "POST",
        "/v1/streams/orders/records",
        200,
        json={
            "records": [
                {"body": b64(b"\x00\xffbinary"), "headers": [[b64(b"h"), b64(b"\x01")]]},
                {"body": b64(b"stamped"), "timestamp": 1_700_000_000_000},
                {"body": b64(b"future"), "timestamp": now_ms + 3_600_000},
            ],
            "match_seq_num": 0,
        },
        headers={"s2-format": "base64"},
    )
    assert ack["start"]["seq_num"] == 0 and ack["end"]["seq_num"] == 3
    assert ack["tail"] == ack["end"]
    first_ts = ack["start"]["timestamp"]
    assert now_ms - 5000 <= first_ts <= now_ms + 5000  # arrival time
    read = await call(
        http,
        "GET",
        "/v1/streams/orders/records",
        200,
        params={"seq_num": "0"},
        headers={"s2-format": "base64"},
    )
    records = read["records"]
    assert [unb64(r["body"]) for r in records] == [b"\x00\xffbinary", b"stamped", b"future"]
    assert records[0]["headers"] == [[b64(b"h"), b64(b"\x01")]]
    assert [r["seq_num"] for r in records] == [0, 1, 2]
    # Timestamps never go backwards, and a future one is capped at the arrival time.
    assert records[1]["timestamp"] == first_ts
    assert first_ts <= records[2]["timestamp"] <= int(time.time() * 1000)
    assert read["tail"] == {"seq_num": 3, "timestamp": records[2]["timestamp"]}

    raw = await call(http, "GET", "/v1/streams/orders/records", 200, params={"seq_num": "1"})
    assert [r["body"] for r in raw["records"]] == ["stamped", "future"]
    counted = await call(
        http, "GET", "/v1/streams/orders/records", 200, params={"seq_num": "0", "count": "1"}
    )
    assert [r["seq_num"] for r in counted["records"]] == [0] and "tail" not in counted
    by_tail = await call(
        http, "GET", "/v1/streams/orders/records", 200, params={"tail_offset": "1"}
    )
    assert [r["seq_num"] for r in by_tail["records"]] == [2]
    last_ts = records[2]["timestamp"]
    by_time = await call(
        http, "GET", "/v1/streams/orders/records", 200, params={"timestamp": str(last_ts)}
    )
    expected = min(r["seq_num"] for r in records if r["timestamp"] >= last_ts)
    assert by_time["records"][0]["seq_num"] == expected
    until = await call(
        http,
        "GET",
        "/v1/streams/orders/records",
        200,
        params={"seq_num": "0", "until": str(last_ts)},
    )
    assert [r["seq_num"] for r in until["records"]] == [
        r["seq_num"] for r in records if r["timestamp"] < last_ts
    ]
    metered = 8 + len("stamped")  # S2's metered size of record 1
    limited = await call(
        http,
        "GET",
        "/v1/streams/orders/records",
        200,
        params={"seq_num": "1", "bytes": str(metered)},
    )
    assert [r["seq_num"] for r in limited["records"]] == [1]


@pytest.mark.slow
async def test_append_conditions_commands_and_read_positions_answer_s2s_errors(
    http: aiohttp.ClientSession,
) -> None:
    await create(http, "orders")
    await append_texts(http, "orders", "a", "b")
    path = "/v1/streams/orders/records"
    mismatch = await call(
        http, "POST", path, 412, json={"records": [{"body": "c"}], "match_seq_num": 5}
    )
    assert mismatch == {"seq_num_mismatch": 2}

    fence = {"records": [{"body": "token-1", "headers": [["", "fence"]]}]}
    assert (await call(http, "POST", path, 200, json=fence))["start"]["seq_num"] == 2
    wrong = await call(
        http, "POST", path, 412, json={"records": [{"body": "x"}], "fencing_token": "other"}
    )
    assert wrong == {"fencing_token_mismatch": "token-1"}
    empty = await call(
        http, "POST", path, 412, json={"records": [{"body": "x"}], "fencing_token": ""}
    )
    assert empty == {"fencing_token_mismatch": "token-1"}
    await call(
        http, "POST", path, 200, json={"records": [{"body": "d"}], "fencing_token": "token-1"}
    )

    trim = {
        "records": [{"body": b64((2).to_bytes(8, "big")), "headers": [[b64(b""), b64(b"trim")]]}],
        "fencing_token": "token-1",
    }
    await call(http, "POST", path, 200, json=trim, headers={"s2-format": "base64"})
    # Trimmed positions read from the first record left; the commands are records too.
    read = await call(http, "GET", path, 200, params={"seq_num": "0"})
    assert [r["seq_num"] for r in read["records"]] == [2, 3, 4]
    assert read["records"][0]["headers"] == [["", "fence"]]

    past = await call(http, "GET", path, 416, params={"seq_num": "9"})
    assert past["tail"]["seq_num"] == 5
    at_tail = await call(http, "GET", path, 416, params={"seq_num": "5"})
    assert at_tail["tail"]["seq_num"] == 5
    clamped = await call(
        http, "GET", path, 200, params={"seq_num": "9", "clamp": "true", "wait": "1"}
    )
    assert clamped["records"] == [] and clamped["tail"]["seq_num"] == 5
    future = await call(http, "GET", path, 416, params={"timestamp": str(2**62)})
    assert future["tail"]["seq_num"] == 5
    tail = await call(http, "GET", path + "/tail", 200)
    assert tail["tail"] == past["tail"]


async def test_no_append_with_the_old_token_lands_after_a_fence(
    http: aiohttp.ClientSession,
) -> None:
    await create(http, "fenced")
    path = "/v1/streams/fenced/records"

    async def old_writer(index: int) -> int | None:
        body = {"records": [{"body": f"old {index}"}], "fencing_token": ""}
        async with http.post(path, json=body) as response:
            answer = await response.json()
            if response.status == 412:
                assert answer == {"fencing_token_mismatch": "new-writer"}
                return None
            assert response.status == 200, answer
            return int(answer["start"]["seq_num"])

    async def fence() -> int:
        body = {"records": [{"body": "new-writer", "headers": [["", "fence"]]}]}
        return int((await call(http, "POST", path, 200, json=body))["start"]["seq_num"])

    results = await asyncio.gather(
        *[old_writer(i) for i in range(10)], fence(), *[old_writer(i) for i in range(10, 20)]
    )
    fence_at = results[10]
    landed = [seq for seq in results[:10] + results[11:] if seq is not None]
    assert all(seq < fence_at for seq in landed), (fence_at, landed)
    assert len(landed) < 20  # the later ones were refused


@pytest.mark.slow
async def test_long_poll_returns_as_soon_as_another_request_appends(
    http: aiohttp.ClientSession,
) -> None:
    await create(http, "live")
    await append_texts(http, "live", "before")
    path = "/v1/streams/live/records"

    started = time.monotonic()
    empty = await call(http, "GET", path, 200, params={"seq_num": "1", "wait": "1"})
    assert empty["records"] == [] and empty["tail"]["seq_num"] == 1
    assert time.monotonic() - started >= 0.9

    waiting = asyncio.ensure_future(
        call(http, "GET", path, 200, params={"seq_num": "1", "wait": "8"})
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()
    appended_at = time.monotonic()
    await append_texts(http, "live", "news")
    result = await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - appended_at < 4  # far below the 8 s wait
    assert [record["body"] for record in result["records"]] == ["news"]
    assert result["records"][0]["seq_num"] == 1
    assert result["tail"]["seq_num"] == 2


async def test_sse_read_session_sends_batches_pings_and_done(http: aiohttp.ClientSession) -> None:
    await create(http, "events")
    await append_texts(http, "events", "a", "b", "c")
    async with http.get(
        "/v1/streams/events/records",
        params={"seq_num": "0", "count": "4", "wait": "5"},
        headers={"Accept": "text/event-stream"},
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        first = await response.content.readuntil(b"\n\n")
        await append_texts(http, "events", "d")
        rest = await asyncio.wait_for(response.content.read(), 10)
    events = [block for block in (first + rest).decode().split("\n\n") if block]
    batches = [e for e in events if e.startswith("event: batch")]
    bodies = [
        record["body"]
        for event in batches
        for record in json.loads(event.split("data: ", 1)[1].split("\n")[0])["records"]
    ]
    assert bodies == ["a", "b", "c", "d"]
    assert "id: 2,3," in batches[0]  # S2: the last seq_num, records and bytes so far
    assert events[-1] == "event: done\ndata: [DONE]"


async def test_shutdown_answers_waiting_long_polls_and_uploads_everything(
    deployment: Path,
) -> None:
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT, headers=IN_BASIN) as session:
        async with serve(deployment, listen="127.0.0.1:0", max_wait_s=30, environ={}) as running:
            # An idle keep-alive HTTP/1.1 connection does not hold shutdown up either.
            _, idle = await asyncio.open_connection(running.host, running.port)
            url = running.url
            await call(session, "POST", f"{url}/v1/basins", 201, json={"basin": BASIN})
            await call(session, "POST", f"{url}/v1/streams", 201, json={"stream": "orders"})
            await call(
                session,
                "POST",
                f"{url}/v1/streams/orders/records",
                200,
                json={"records": [{"body": "a"}, {"body": "b"}]},
            )
            waiting = asyncio.ensure_future(
                call(
                    session,
                    "GET",
                    f"{url}/v1/streams/orders/records",
                    200,
                    params={"seq_num": "2", "wait": "30"},
                )
            )
            await asyncio.sleep(0.3)
            assert not waiting.done()
            shutdown_started = time.monotonic()
        # Leaving serve() stopped the server: the waiting poll did not hold it for 30 s.
        assert time.monotonic() - shutdown_started < 15
        idle.close()
        result = await asyncio.wait_for(waiting, 1)
        assert result["records"] == [] and result["tail"]["seq_num"] == 2

    # A new node on the same deployment (a fresh memory WAL: only object storage and metadata
    # are shared) reads both records: closing uploaded and committed them.
    fresh = write_deployment(deployment.parent, f"other-{deployment.parent.name}")
    async with walstream.open(fresh) as client:
        stream = await client.open_stream(f"{BASIN}.orders")
        assert [record.value for record in (await stream.read(start=0)).records] == [b"a", b"b"]


# -- metrics ----------------------------------------------------------------------------------


def sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for metric in family.samples:
            if metric.name == name and all(metric.labels.get(k) == v for k, v in labels.items()):
                total += metric.value
    return total


async def test_metrics_are_prometheus_text_and_counters_move(
    http: aiohttp.ClientSession,
) -> None:
    async def scrape() -> str:
        async with http.get("/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            assert "version=0.0.4" in response.headers["Content-Type"]
            return await response.text()

    before = await scrape()
    await create(http, "m")
    await append_texts(http, "m", "one", "two", "three")
    await call(http, "GET", "/v1/streams/m/records", 200, params={"seq_num": "0"})
    after = await scrape()

    assert "walstream_wal_appended_records_total" in after
    assert (
        sample(after, "walstream_wal_appended_records_total")
        - sample(before, "walstream_wal_appended_records_total")
        == 3
    )
    assert (
        sample(after, "walstream_wal_appends_total") - sample(before, "walstream_wal_appends_total")
        == 1
    )
    assert (
        sample(after, "walstream_read_records_total")
        - sample(before, "walstream_read_records_total")
        >= 3
    )
    assert (
        sample(
            after,
            "walstream_http_requests_total",
            method="POST",
            route="/v1/streams/{name}/records",
            status="200",
        )
        == 1
    )


# -- real processes ---------------------------------------------------------------------------


async def test_serve_process_answers_health_and_exits_0_on_sigterm(deployment: Path) -> None:
    process = WalstreamServe(deployment, token=TOKEN)
    url = await asyncio.to_thread(process.start)
    try:
        assert "listening on http://127.0.0.1:" in process.banner, process.banner
        assert "token required" in process.banner
        async with aiohttp.ClientSession(base_url=url, timeout=REQUEST_TIMEOUT) as s:
            health = await call(s, "GET", "/health", 200)
            assert health["status"] == "ok"
            assert health["node_id"] == 1
            await call(s, "GET", "/v1/basins", 401)
            root = {**AUTH, "s2-basin": "walstream"}
            await call(s, "POST", "/v1/streams", 201, json={"stream": "p"}, headers=root)
            await call(
                s,
                "POST",
                "/v1/streams/p/records",
                200,
                headers=root,
                json={"records": [{"body": "kept"}]},
            )
    finally:
        stderr = await asyncio.to_thread(process.stop_cleanly)
    assert "stopping" in stderr

    # The process closed its node: the record is in object storage for the next node.
    fresh = write_deployment(deployment.parent, f"after-{deployment.parent.name}")
    async with walstream.open(fresh) as client:
        stream = await client.open_stream("p")
        assert [record.value for record in (await stream.read(start=0)).records] == [b"kept"]


def test_serve_rejects_a_bad_listen_address(deployment: Path) -> None:
    result = subprocess.run(
        [WALSTREAM, "serve", "-c", str(deployment), "--listen", "nowhere"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "ConfigError" in result.stderr and "host:port" in result.stderr


@pytest.mark.slow
async def test_bench_prints_its_table_and_writes_json(deployment: Path, tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    result = subprocess.run(
        [
            WALSTREAM,
            "-c",
            str(deployment),
            "bench",
            "--streams",
            "2",
            "--records",
            "300",
            "--value-bytes",
            "64",
            "--batch",
            "20",
            "--concurrency",
            "3",
            "--json",
            str(output),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("walstream bench: 2 streams, 300 records of 64 B")
    header = next(line for line in lines if line.startswith("PHASE"))
    for column in ("RECORDS/S", "MiB/S", "P50 MS", "P99 MS", "P999 MS"):
        assert column in header
    assert any(line.startswith("append ") and " 300 " in line for line in lines)
    assert any(line.startswith("read (cold)") and " 300 " in line for line in lines)
    assert "verification: OK (300 records read back)" in result.stdout

    report = json.loads(output.read_text())
    assert report["parameters"] == {
        "streams": 2,
        "records": 300,
        "value_bytes": 64,
        "batch": 20,
        "concurrency": 3,
    }
    assert report["append"]["records"] == 300
    assert report["append"]["value_bytes"] == 300 * 64
    assert report["append"]["batches"] == 15  # three shares of 100 in batches of 20
    latency = report["append"]["latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["p999"]
    assert report["read_cold"]["records"] == 300
    assert report["read_cold"]["value_bytes"] == 300 * 64
    assert report["append"]["records_per_s"] > 0 and report["read_cold"]["mib_per_s"] > 0
    assert report["verified"] is True

    # Its streams were deleted afterwards.
    async with walstream.open(deployment) as client:
        assert await client.list_streams(prefix="bench-") == []
