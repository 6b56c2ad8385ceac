"""``walstream serve`` (the HTTP service) and ``walstream bench``, against real servers on
127.0.0.1: in-process for the routes, and as real processes for signals and the CLI."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
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

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
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
    """A session on the server's base URL that sends the token."""
    async with aiohttp.ClientSession(
        base_url=server.url, headers=AUTH, timeout=REQUEST_TIMEOUT
    ) as session:
        yield session


async def call(
    session: aiohttp.ClientSession, method: str, path: str, expect: int, **kwargs: Any
) -> Any:
    async with session.request(method, path, **kwargs) as response:
        body = await response.json()
        assert response.status == expect, (response.status, body)
        return body


async def create(session: aiohttp.ClientSession, name: str) -> dict[str, Any]:
    body: dict[str, Any] = await call(session, "POST", "/v1/streams", 201, json={"name": name})
    return body


async def append_texts(session: aiohttp.ClientSession, stream: str, *texts: str) -> dict[str, Any]:
    body: dict[str, Any] = await call(
        session,
        "POST",
        f"/v1/streams/{stream}/records",
        200,
        json={"records": [{"value_text": text} for text in texts]},
    )
    return body


# -- auth and health --------------------------------------------------------------------------


async def test_health_needs_no_token_and_every_other_route_does(server: RunningServer) -> None:
    async with aiohttp.ClientSession(base_url=server.url, timeout=REQUEST_TIMEOUT) as anonymous:
        health = await call(anonymous, "GET", "/health", 200)
        assert health == {"status": "ok", "node_id": 1, "node_epoch": server.client.node_epoch}
        assert server.client.node_epoch >= 1

        for method, path in [
            ("GET", "/v1/streams"),
            ("GET", "/metrics"),
            ("POST", "/v1/streams"),
            ("GET", "/v1/streams/x/tail"),
        ]:
            async with anonymous.request(method, path) as response:
                assert response.status == 401, path
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
                body = await response.json()
                assert body["error"] == "Unauthorized"
                assert "Authorization: Bearer" in body["message"]

        wrong = {"Authorization": "Bearer not-the-token"}
        body = await call(anonymous, "GET", "/v1/streams", 401, headers=wrong)
        assert body["message"] == "wrong bearer token"
        await call(anonymous, "GET", "/v1/streams", 401, headers={"Authorization": TOKEN})
        assert await call(anonymous, "GET", "/v1/streams", 200, headers=AUTH) == {"streams": []}


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
        await call(
            http,
            "POST",
            "/v1/streams/orders/records",
            200,
            json={"records": [{"value_text": "in flight"}]},
        )
        deadline = time.monotonic() + 10
        while True:
            async with http.get("/health") as response:
                health = await response.json()
                if response.status == 503 or time.monotonic() > deadline:
                    break
            await asyncio.sleep(0.05)
        assert response.status == 503, health
        assert health["status"] == "failed"
        assert health["error"] == "FencedError"
        refused = await call(
            http,
            "POST",
            "/v1/streams/orders/records",
            409,
            json={"records": [{"value_text": "after"}]},
        )
        assert refused["error"] == "FencedError"


async def test_token_from_environment_and_no_token_means_open(deployment: Path) -> None:
    async with serve(
        deployment, listen="127.0.0.1:0", environ={"WALSTREAM_TOKEN": "from-env"}
    ) as running:
        assert running.token == "from-env"
        async with aiohttp.ClientSession(base_url=running.url, timeout=REQUEST_TIMEOUT) as s:
            await call(s, "GET", "/v1/streams", 401)
            await call(s, "GET", "/v1/streams", 200, headers={"Authorization": "Bearer from-env"})
    async with serve(deployment, listen="127.0.0.1:0", environ={}) as running:
        assert running.token is None
        async with aiohttp.ClientSession(base_url=running.url, timeout=REQUEST_TIMEOUT) as s:
            await call(s, "GET", "/v1/streams", 200)


# -- streams ----------------------------------------------------------------------------------


async def test_create_list_delete_streams(http: aiohttp.ClientSession) -> None:
    orders = await create(http, "orders")
    assert orders["name"] == "orders"
    await create(http, "payments")
    clash = await call(http, "POST", "/v1/streams", 409, json={"name": "orders"})
    assert clash["error"] == "StreamExists"
    assert clash["definitely_not_applied"] is True

    listing = await call(http, "GET", "/v1/streams", 200)
    assert [stream["name"] for stream in listing["streams"]] == ["orders", "payments"]
    assert listing["streams"][0]["stream_id"] == orders["stream_id"]
    only = await call(http, "GET", "/v1/streams", 200, params={"prefix": "pay"})
    assert [stream["name"] for stream in only["streams"]] == ["payments"]

    # A stream is also addressed by id as "#ID".
    by_id = await call(http, "GET", f"/v1/streams/%23{orders['stream_id']}/tail", 200)
    assert by_id == {"tail": 0, "start_offset": 0}

    deleted = await call(http, "DELETE", "/v1/streams/orders", 200)
    assert deleted == {"deleted": "orders", "stream_id": orders["stream_id"]}
    listing = await call(http, "GET", "/v1/streams", 200)
    assert [stream["name"] for stream in listing["streams"]] == ["payments"]
    missing = await call(http, "DELETE", "/v1/streams/orders", 404)
    assert missing["error"] == "StreamNotFound"
    missing = await call(http, "GET", "/v1/streams/orders/records", 404, params={"start": "0"})
    assert missing["error"] == "StreamNotFound"
    await call(http, "POST", "/v1/streams", 400, json={"name": ""})
    await call(http, "POST", "/v1/streams", 400, json={"title": "x"})


# -- append and read --------------------------------------------------------------------------


async def test_json_append_then_read_every_field(http: aiohttp.ClientSession) -> None:
    await create(http, "events")
    binary = bytes(range(256))
    ack = await call(
        http,
        "POST",
        "/v1/streams/events/records",
        200,
        json={
            "records": [
                {
                    "value": b64(binary),
                    "key": b64(b"\x00key"),
                    "headers": {"h1": b64(b"\xffx")},
                    "timestamp_ms": 1_000,
                },
                {
                    "value_text": "héllo",
                    "headers": [["dup", b64(b"1")], ["dup", b64(b"2")]],
                    "timestamp_ms": 2_000,
                },
                {"value_text": "", "timestamp_ms": 3_000},
            ],
        },
    )
    assert ack == {"start": 0, "end": 3, "tail": 3}
    ack = await append_texts(http, "events", "last")
    assert ack == {"start": 3, "end": 4, "tail": 4}

    result = await call(http, "GET", "/v1/streams/events/records", 200, params={"start": "0"})
    assert result["tail"] == 4
    records = result["records"]
    assert [record["offset"] for record in records] == [0, 1, 2, 3]
    assert unb64(records[0]["value"]) == binary
    assert unb64(records[0]["key"]) == b"\x00key"
    assert records[0]["headers"] == [["h1", b64(b"\xffx")]]
    assert records[0]["timestamp_ms"] == 1_000
    assert unb64(records[1]["value"]) == "héllo".encode()
    assert records[1]["key"] is None
    assert records[1]["headers"] == [["dup", b64(b"1")], ["dup", b64(b"2")]]
    assert unb64(records[2]["value"]) == b""
    assert unb64(records[3]["value"]) == b"last"

    page = await call(
        http, "GET", "/v1/streams/events/records", 200, params={"start": "1", "limit": "2"}
    )
    assert [record["offset"] for record in page["records"]] == [1, 2]
    # limit_bytes: at least one record, and no more than fit.
    page = await call(
        http, "GET", "/v1/streams/events/records", 200, params={"start": "0", "limit_bytes": "1"}
    )
    assert [record["offset"] for record in page["records"]] == [0]
    page = await call(
        http, "GET", "/v1/streams/events/records", 200, params={"from_timestamp": "2000"}
    )
    assert [record["offset"] for record in page["records"]] == [1, 2, 3]
    page = await call(http, "GET", "/v1/streams/events/records", 200, params={"tail_offset": "1"})
    assert [unb64(record["value"]) for record in page["records"]] == [b"last"]
    assert await call(http, "GET", "/v1/streams/events/tail", 200) == {"tail": 4, "start_offset": 0}


async def test_binary_append_one_record_per_body(http: aiohttp.ClientSession) -> None:
    await create(http, "raw")
    payload = os.urandom(4096)
    ack = await call(
        http,
        "POST",
        "/v1/streams/raw/records",
        200,
        data=payload,
        headers={
            "Content-Type": "application/octet-stream",
            "X-Walstream-Key": b64(b"k-1"),
            "X-Walstream-Timestamp-Ms": "12345",
        },
    )
    assert ack == {"start": 0, "end": 1, "tail": 1}
    ack = await call(
        http,
        "POST",
        "/v1/streams/raw/records",
        200,
        data=b"second",
        headers={"Content-Type": "application/octet-stream", "X-Walstream-Match-Tail": "1"},
    )
    assert ack == {"start": 1, "end": 2, "tail": 2}
    mismatch = await call(
        http,
        "POST",
        "/v1/streams/raw/records",
        412,
        data=b"third",
        headers={"Content-Type": "application/octet-stream", "X-Walstream-Match-Tail": "1"},
    )
    assert mismatch["actual_tail"] == 2
    bad_key = await call(
        http,
        "POST",
        "/v1/streams/raw/records",
        400,
        data=b"x",
        headers={"Content-Type": "application/octet-stream", "X-Walstream-Key": "%%%"},
    )
    assert "X-Walstream-Key" in bad_key["message"]

    result = await call(http, "GET", "/v1/streams/raw/records", 200, params={"start": "0"})
    assert [unb64(record["value"]) for record in result["records"]] == [payload, b"second"]
    assert unb64(result["records"][0]["key"]) == b"k-1"
    assert result["records"][0]["timestamp_ms"] == 12345
    assert result["tail"] == 2


# -- errors -----------------------------------------------------------------------------------


async def test_engine_errors_map_to_statuses_with_their_fields(
    http: aiohttp.ClientSession,
) -> None:
    await create(http, "orders")
    await append_texts(http, "orders", *[f"r{index}" for index in range(5)])

    mismatch = await call(
        http,
        "POST",
        "/v1/streams/orders/records",
        412,
        json={"records": [{"value_text": "x"}], "match_tail": 3},
    )
    assert mismatch["error"] == "TailMismatchError"
    assert mismatch["actual_tail"] == 5
    ok = await call(
        http,
        "POST",
        "/v1/streams/orders/records",
        200,
        json={"records": [{"value_text": "x"}], "match_tail": 5},
    )
    assert ok["start"] == 5

    beyond = await call(http, "GET", "/v1/streams/orders/records", 416, params={"start": "9"})
    assert beyond["error"] == "OutOfRangeError"
    assert (beyond["start_offset"], beyond["tail"]) == (0, 6)

    assert await call(http, "POST", "/v1/streams/orders/trim", 200, json={"start": 2}) == {
        "start": 2
    }
    trimmed = await call(http, "GET", "/v1/streams/orders/records", 416, params={"start": "0"})
    assert (trimmed["start_offset"], trimmed["tail"]) == (2, 6)
    after = await call(
        http,
        "GET",
        "/v1/streams/orders/records",
        200,
        params={"start": str(trimmed["start_offset"])},
    )
    assert [unb64(record["value"]) for record in after["records"]] == [b"r2", b"r3", b"r4", b"x"]
    assert await call(http, "GET", "/v1/streams/orders/tail", 200) == {"tail": 6, "start_offset": 2}

    await call(http, "POST", "/v1/streams/orders/fencing-token", 200, json={"token": "t1"})
    fenced = await call(
        http,
        "POST",
        "/v1/streams/orders/records",
        409,
        json={"records": [{"value_text": "old"}], "fencing_token": "t0"},
    )
    assert fenced["error"] == "FencedError"
    fenced = await call(
        http,
        "POST",
        "/v1/streams/orders/records",
        409,
        data=b"old",
        headers={"Content-Type": "application/octet-stream", "X-Walstream-Fencing-Token": "t0"},
    )
    assert fenced["error"] == "FencedError"
    ok = await call(
        http,
        "POST",
        "/v1/streams/orders/records",
        200,
        json={"records": [{"value_text": "new"}], "fencing_token": "t1"},
    )
    assert ok == {"start": 6, "end": 7, "tail": 7}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"records": [', "not valid JSON"),
        (b"", "needs a JSON body"),
        (b"[1, 2]", '{"records": [...]}'),
        (b'{"records": []}', "non-empty list"),
        (b'{"records": [{"value": "!!notbase64"}]}', "records[0].value: not valid base64"),
        (b'{"records": [{"value_text": "a", "value": "YQ=="}]}', "exactly one of value"),
        (b'{"records": [{"value_text": "a", "colour": 1}]}', "unknown field(s) colour"),
        (b'{"records": [{"value_text": "a", "key": 7}]}', "records[0].key"),
        (b'{"records": [{"value_text": "a", "headers": {"h": "*"}}]}', "records[0].headers.h"),
        (b'{"records": [{"value_text": "a", "timestamp_ms": "now"}]}', "timestamp_ms"),
        (b'{"records": [{"value_text": "a"}], "match_tail": -1}', "match_tail"),
    ],
)
async def test_malformed_append_bodies_are_400_with_a_clear_message(
    http: aiohttp.ClientSession, body: bytes, needle: str
) -> None:
    await create(http, "s")
    answer = await call(
        http,
        "POST",
        "/v1/streams/s/records",
        400,
        data=body,
        headers={"Content-Type": "application/json"},
    )
    assert answer["error"] == "InvalidArgument"
    assert needle in answer["message"]
    tail = await call(http, "GET", "/v1/streams/s/tail", 200)
    assert tail["tail"] == 0  # nothing was appended


async def test_bad_reads_and_routes_and_oversized_bodies(http: aiohttp.ClientSession) -> None:
    await create(http, "s")
    for params, needle in [
        ({}, "exactly one of"),
        ({"start": "0", "tail_offset": "1"}, "exactly one of"),
        ({"start": "zero"}, "query parameter start"),
        ({"start": "-1"}, "query parameter start"),
        ({"start": "0", "limit": "0"}, "query parameter limit"),
        ({"start": "0", "wait": "soon"}, "query parameter wait"),
    ]:
        answer = await call(http, "GET", "/v1/streams/s/records", 400, params=params)
        assert needle in answer["message"], (params, answer)
    await call(http, "POST", "/v1/streams/s/trim", 400, json={"begin": 1})

    too_big = await call(
        http,
        "POST",
        "/v1/streams/s/records",
        413,
        data=b"x" * (MAX_BODY_BYTES + 1),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert too_big["error"] == "RequestEntityTooLarge"
    assert str(MAX_BODY_BYTES) in too_big["message"]

    unknown = await call(http, "GET", "/v2/anything", 404)
    assert unknown["error"] == "NotFound"
    wrong_method = await call(http, "PUT", "/v1/streams/s/tail", 405)
    assert "GET" in wrong_method["message"]
    assert (await call(http, "GET", "/v1/streams/s/tail", 200))["tail"] == 0


# -- long poll --------------------------------------------------------------------------------


async def test_long_poll_returns_as_soon_as_another_request_appends(
    http: aiohttp.ClientSession,
) -> None:
    await create(http, "live")
    await append_texts(http, "live", "before")

    started = time.monotonic()
    empty = await call(
        http, "GET", "/v1/streams/live/records", 200, params={"start": "1", "wait": "0.3"}
    )
    assert empty == {"records": [], "tail": 1}
    assert time.monotonic() - started >= 0.25

    waiting = asyncio.ensure_future(
        call(http, "GET", "/v1/streams/live/records", 200, params={"start": "1", "wait": "8"})
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()
    appended_at = time.monotonic()
    await append_texts(http, "live", "news")
    result = await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - appended_at < 4  # far below the 8 s wait
    assert [unb64(record["value"]) for record in result["records"]] == [b"news"]
    assert result["records"][0]["offset"] == 1
    assert result["tail"] == 2


async def test_shutdown_answers_waiting_long_polls_and_uploads_everything(
    deployment: Path,
) -> None:
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        async with serve(deployment, listen="127.0.0.1:0", max_wait_s=30, environ={}) as running:
            url = running.url
            await call(session, "POST", f"{url}/v1/streams", 201, json={"name": "orders"})
            await call(
                session,
                "POST",
                f"{url}/v1/streams/orders/records",
                200,
                json={"records": [{"value_text": "a"}, {"value_text": "b"}]},
            )
            waiting = asyncio.ensure_future(
                call(
                    session,
                    "GET",
                    f"{url}/v1/streams/orders/records",
                    200,
                    params={"start": "2", "wait": "30"},
                )
            )
            await asyncio.sleep(0.3)
            assert not waiting.done()
            shutdown_started = time.monotonic()
        # Leaving serve() stopped the server: the waiting poll did not hold it for 30 s.
        assert time.monotonic() - shutdown_started < 15
        result = await asyncio.wait_for(waiting, 1)
        assert result == {"records": [], "tail": 2}

    # A new node on the same deployment (a fresh memory WAL: only object storage and metadata
    # are shared) reads both records: closing uploaded and committed them.
    fresh = write_deployment(deployment.parent, f"other-{deployment.parent.name}")
    async with walstream.open(fresh) as client:
        stream = await client.open_stream("orders")
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
    await call(http, "GET", "/v1/streams/m/records", 200, params={"start": "0"})
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
    env = {**os.environ, "WALSTREAM_TOKEN": TOKEN}
    process = await asyncio.create_subprocess_exec(
        WALSTREAM,
        "serve",
        "-c",
        str(deployment),
        "--listen",
        "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=deployment.parent,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "listening on http://127.0.0.1:" in line, line
        assert "token required" in line
        url = line.split("listening on ")[1].split()[0]
        async with aiohttp.ClientSession(base_url=url, timeout=REQUEST_TIMEOUT) as s:
            health = await call(s, "GET", "/health", 200)
            assert health["status"] == "ok"
            assert health["node_id"] == 1
            await call(s, "GET", "/v1/streams", 401)
            await call(s, "POST", "/v1/streams", 201, json={"name": "p"}, headers=AUTH)
            await call(
                s,
                "POST",
                "/v1/streams/p/records",
                200,
                headers=AUTH,
                json={"records": [{"value_text": "kept"}]},
            )
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.stderr is not None
    stderr = (await process.stderr.read()).decode()
    assert "stopping" in stderr
    assert "Traceback" not in stderr

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


def test_data_loss_is_410_with_the_lost_range() -> None:
    from walstream.errors import DataLossError
    from walstream.server.codec import error_json, error_status

    error = DataLossError("offsets [10, 20) of stream 3 were lost", 3, 10, 20)
    assert error_status(error) == 410
    body = error_json(error)
    assert body["error"] == "DataLossError"
    assert (body["stream_id"], body["start_offset"], body["end_offset"]) == (3, 10, 20)
