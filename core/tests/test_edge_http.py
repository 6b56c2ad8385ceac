"""``walstream serve`` at its edge: bad input gets a 4xx with S2's error body, never a 500 or
a traceback; slow and greedy clients are bounded (header and body timeouts, connection
and long-poll bounds) while a normal client is still served.

Every test runs a real server on 127.0.0.1 (in-process, memory WAL). The property-based test
sends arbitrary requests (paths, stream references, query strings, headers, JSON and raw bodies)
and asserts the only 5xx is a 503 ``unavailable``. ``--soak`` runs many more examples.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import yarl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from walstream.errors import ConfigError
from walstream.server.limits import ServerLimits
from walstream.server.serve import RunningServer, serve

TOKEN = "edge-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT = aiohttp.ClientTimeout(total=20)
MAX_BODY_BYTES = 4 << 20
LIMITS = ServerLimits(
    header_timeout_s=1.0, body_timeout_s=1.0, max_connections=64, max_long_polls=2
)


def write_deployment(folder: Path) -> Path:
    path = folder / "deploy.yaml"
    path.write_text(
        "node: {id: 1}\n"
        f"wal: {{type: memory, name: edge-http-{folder.name}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
    )
    return path


def start(
    folder: Path,
    limits: ServerLimits = LIMITS,
    listen: str = "127.0.0.1:0",
) -> AbstractAsyncContextManager[RunningServer]:
    return serve(
        write_deployment(folder),
        listen=listen,
        token=TOKEN,
        max_body_bytes=MAX_BODY_BYTES,
        max_wait_s=10.0,
        limits=limits,
        environ={},
    )


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    """The node served over HTTP."""
    async with start(tmp_path) as running:
        yield running


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=server.url, headers=AUTH, timeout=TIMEOUT) as session:
        yield session


async def answer(
    session: aiohttp.ClientSession, method: str, path: str, **kwargs: Any
) -> tuple[int, Any]:
    async with session.request(method, path, **kwargs) as response:
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            raise AssertionError(
                f"{response.status} answered without a JSON body: {text!r}"
            ) from None


def assert_error_body(status: int, body: Any, expect_status: int, expect_code: str) -> None:
    """S2's error body: ``{"code", "message"}``, short, no traceback."""
    assert status == expect_status, (status, body)
    assert isinstance(body, dict), body
    assert body["code"] == expect_code, body
    assert isinstance(body["message"], str) and body["message"], body
    assert "Traceback" not in body["message"]
    assert len(body["message"]) < 1000, "the input is not echoed back at length"


def records_body(**record: Any) -> dict[str, Any]:
    return {"records": [{"body": "v", **record}]}


def deep(levels: int) -> bytes:
    return b'{"records": ' + b"[" * levels + b"]" * levels + b"}"


# -- explicit examples --------------------------------------------------------------------------

BASIN = "edge-basin"
APPEND = "/v1/streams/orders/records"
BAD_REQUESTS: list[tuple[str, str, str, dict[str, Any], int, str]] = [
    # label, method, path, request kwargs, status, code
    ("timestamp 2**64", "POST", APPEND, {"json": records_body(timestamp=2**64)}, 422, "invalid"),
    ("negative timestamp", "POST", APPEND, {"json": records_body(timestamp=-1)}, 422, "invalid"),
    ("no records", "POST", APPEND, {"json": {"records": []}}, 422, "invalid"),
    (
        "1001 records",
        "POST",
        APPEND,
        {"json": {"records": [{"body": ""}] * 1001}},
        422,
        "invalid",
    ),
    (
        "over 1 MiB metered",
        "POST",
        APPEND,
        {"json": {"records": [{"body": "x" * (1 << 20)}]}},
        422,
        "invalid",
    ),
    (
        "65536 headers",
        "POST",
        APPEND,
        {"json": records_body(headers=[["h", ""]] * 65536)},
        422,
        "invalid",
    ),
    (
        "lone surrogate in a header name",
        "POST",
        APPEND,
        {"data": b'{"records": [{"body": "v", "headers": [["\\ud800", ""]]}]}'},
        422,
        "invalid",
    ),
    (
        "lone surrogate in a body",
        "POST",
        APPEND,
        {"data": b'{"records": [{"body": "\\udc00"}]}'},
        422,
        "invalid",
    ),
    (
        "lone surrogate in a fencing token",
        "POST",
        APPEND,
        {"data": b'{"records": [{"body": "v"}], "fencing_token": "\\ud800"}'},
        422,
        "invalid",
    ),
    (
        "non-UTF-8 header name (base64)",
        "POST",
        APPEND,
        {"json": records_body(headers=[["/w==", ""]]), "headers": {"s2-format": "base64"}},
        422,
        "invalid",
    ),
    (
        "not base64",
        "POST",
        APPEND,
        {"json": records_body(body="*"), "headers": {"s2-format": "base64"}},
        422,
        "invalid",
    ),
    (
        "unknown s2-format",
        "POST",
        APPEND,
        {"json": records_body(), "headers": {"s2-format": "hex"}},
        400,
        "bad_header",
    ),
    (
        "fence token over 36 bytes",
        "POST",
        APPEND,
        {"json": {"records": [{"body": "t" * 37, "headers": [["", "fence"]]}]}},
        422,
        "invalid",
    ),
    (
        "trim body not 8 bytes",
        "POST",
        APPEND,
        {"json": {"records": [{"body": "1", "headers": [["", "trim"]]}]}},
        422,
        "invalid",
    ),
    (
        "unknown command",
        "POST",
        APPEND,
        {"json": {"records": [{"body": "", "headers": [["", "explode"]]}]}},
        422,
        "invalid",
    ),
    (
        "5,000-digit match_seq_num",
        "POST",
        APPEND,
        {"data": b'{"records": [{"body": "v"}], "match_seq_num": ' + b"7" * 5000 + b"}"},
        400,
        "bad_json",
    ),
    ("5,000-digit seq_num", "GET", APPEND + "?seq_num=" + "7" * 5000, {}, 400, "bad_query"),
    ("seq_num 2**63", "GET", APPEND + f"?seq_num={2**63}", {}, 400, "bad_query"),
    ("two starts", "GET", APPEND + "?seq_num=0&tail_offset=1", {}, 400, "bad_query"),
    ("count 2**64", "GET", APPEND + f"?seq_num=0&count={2**64}", {}, 400, "bad_query"),
    ("seq_num with underscores", "GET", APPEND + "?seq_num=1_0", {}, 400, "bad_query"),
    ("wait=nan", "GET", APPEND + "?seq_num=0&wait=nan", {}, 400, "bad_query"),
    ("wait over 60", "GET", APPEND + "?seq_num=0&wait=61", {}, 400, "bad_query"),
    ("clamp=maybe", "GET", APPEND + "?seq_num=0&clamp=maybe", {}, 400, "bad_query"),
    ("deeply nested JSON", "POST", APPEND, {"data": deep(100_000)}, 400, "bad_json"),
    ("deeply nested create", "POST", "/v1/streams", {"data": b"[" * 50_000}, 400, "bad_json"),
    (
        "huge JSON body",
        "POST",
        APPEND,
        {"data": b'{"records": [' + b" " * (MAX_BODY_BYTES + 1)},
        413,
        "invalid",
    ),
    ("stream name ..", "POST", "/v1/streams", {"json": {"stream": ".."}}, 422, "invalid"),
    ("stream name .", "POST", "/v1/streams", {"json": {"stream": "."}}, 422, "invalid"),
    ("stream name empty", "POST", "/v1/streams", {"json": {"stream": ""}}, 422, "invalid"),
    (
        "stream name not UTF-8",
        "POST",
        "/v1/streams",
        {"data": b'{"stream": "\\ud800"}'},
        422,
        "invalid",
    ),
    (
        "stream of 1 MiB",
        "POST",
        "/v1/streams",
        {"json": {"stream": "x" * (1 << 20)}},
        422,
        "invalid",
    ),
    (
        "stream over 512 bytes",
        "POST",
        "/v1/streams",
        {"json": {"stream": "é" * 257}},
        422,
        "invalid",
    ),
    ("stream not a string", "POST", "/v1/streams", {"json": {"stream": [[1]]}}, 422, "invalid"),
    (
        "retention age 0",
        "POST",
        "/v1/streams",
        {"json": {"stream": "aged", "config": {"retention_policy": {"age": 0}}}},
        422,
        "invalid",
    ),
    (
        "unknown timestamping mode",
        "POST",
        "/v1/streams",
        {"json": {"stream": "t", "config": {"timestamping": {"mode": "sometimes"}}}},
        422,
        "invalid",
    ),
    ("basin name too short", "POST", "/v1/basins", {"json": {"basin": "short"}}, 422, "invalid"),
    (
        "basin name uppercase",
        "POST",
        "/v1/basins",
        {"json": {"basin": "Upper-Case"}},
        422,
        "invalid",
    ),
    (
        "basin cipher",
        "POST",
        "/v1/basins",
        {"json": {"basin": "cipher-basin", "config": {"stream_cipher": "rot13"}}},
        422,
        "invalid",
    ),
    (
        "basin exists",
        "POST",
        "/v1/basins",
        {"json": {"basin": BASIN}},
        409,
        "resource_already_exists",
    ),
    (
        "root basin exists",
        "POST",
        "/v1/basins",
        {"json": {"basin": "walstream"}},
        409,
        "resource_already_exists",
    ),
    ("root basin delete", "DELETE", "/v1/basins/walstream", {}, 403, "permission_denied"),
    ("no such basin", "GET", "/v1/basins/missing-basin", {}, 404, "basin_not_found"),
    (
        "stream of no basin",
        "GET",
        "/v1/streams",
        {"headers": {"s2-basin": "missing-basin"}},
        404,
        "basin_not_found",
    ),
    ("no basin header", "GET", "/v1/streams", {"headers": {"s2-basin": "x"}}, 400, "bad_header"),
    ("no such stream", "GET", "/v1/streams/missing/records/tail", {}, 404, "stream_not_found"),
    (
        "stream exists",
        "POST",
        "/v1/streams",
        {"json": {"stream": "orders"}},
        409,
        "resource_already_exists",
    ),
    ("no such route", "GET", "/v1/nothing", {}, 404, "bad_path"),
    ("access tokens", "GET", "/v1/access-tokens", {}, 501, "not_implemented"),
    (
        "wrong token",
        "GET",
        "/v1/basins",
        {"headers": {"Authorization": "Bearer nope"}},
        401,
        "authn",
    ),
    (
        "non-ASCII token",
        "GET",
        "/v1/basins",
        {"headers": {"Authorization": "Bearer é"}},
        401,
        "authn",
    ),
    ("no token", "GET", "/v1/basins", {"headers": {"Authorization": ""}}, 401, "authn"),
]


async def make_basin_and_stream(http: aiohttp.ClientSession) -> None:
    created, _ = await answer(http, "POST", "/v1/basins", json={"basin": BASIN})
    assert created == 201
    created, _ = await answer(
        http, "POST", "/v1/streams", json={"stream": "orders"}, headers={"s2-basin": BASIN}
    )
    assert created == 201


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
async def test_bad_input_gets_a_4xx_with_the_s2_error_body(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
    code: str,
) -> None:
    await make_basin_and_stream(http)
    kwargs = dict(kwargs)  # the case is shared by every stack's run: not changed here
    headers = {"s2-basin": BASIN, **kwargs.pop("headers", {})}
    if "data" in kwargs:
        headers.setdefault("Content-Type", "application/json")
    got, body = await answer(
        http,
        method,
        yarl.URL(path, encoded=True),
        headers=headers,
        **kwargs,  # type: ignore[arg-type]
    )
    assert_error_body(got, body, status, code)
    # Nothing was appended and the node still serves.
    tail_status, tail = await answer(
        http, "GET", "/v1/streams/orders/records/tail", headers={"s2-basin": BASIN}
    )
    assert (tail_status, tail["tail"]["seq_num"]) == (200, 0)


async def raw_exchange(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    """Send ``request`` bytes as they are and return everything the server answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def parse_raw(response: bytes) -> tuple[int, Any]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


async def test_a_non_utf8_authorization_header_gets_401(server: RunningServer) -> None:
    for value in (b"Bearer \xff\xfe", b"Bearer \xc3\xa9", b"\xff\xff \xff"):
        response = await raw_exchange(
            server.port,
            b"GET /v1/basins HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: "
            + value
            + b"\r\n\r\n",
        )
        status, body = parse_raw(response)
        assert_error_body(status, body, 401, "authn")


@pytest.mark.slow
async def test_requests_the_http_server_cannot_parse_get_a_4xx_and_nothing_happens(
    server: RunningServer,
) -> None:
    """Malformed HTTP is refused by the HTTP server itself: 400 or 431 in S2's error shape (or a
    disconnect)."""
    for request in (
        b"GET /v1/basins?x=" + b"9" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nX-Long: " + b"v" * 70_000 + b"\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
        b"POST /v1/basins HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    ):
        response = await raw_exchange(server.port, request)
        if response:  # some malformed requests are simply disconnected
            status = int(response.split(b" ", 2)[1])
            assert 400 <= status < 500, response[:200]
            status, body = parse_raw(response)
            assert_error_body(status, body, status, "invalid")
    async with aiohttp.ClientSession(headers=AUTH, timeout=TIMEOUT) as session:
        status, health = await answer(session, "GET", server.url + "/health")
    assert (status, health["status"]) == (200, "ok")


async def test_the_limits_still_accept_the_largest_valid_values(
    http: aiohttp.ClientSession,
) -> None:
    await make_basin_and_stream(http)
    root = {"s2-basin": "walstream"}
    longest = "x" * 512  # S2's longest name (512 bytes), in the root basin
    status, _ = await answer(http, "POST", "/v1/streams", json={"stream": longest}, headers=root)
    assert status == 201
    headers = [["n" * 1000, ""]] * 500
    status, ack = await answer(
        http,
        "POST",
        f"/v1/streams/{longest}/records",
        json={"records": [{"body": "b" * 1000, "headers": headers}] * 1, "match_seq_num": 0},
        headers=root,
    )
    assert (status, ack["start"]["seq_num"]) == (200, 0), ack
    status, read = await answer(
        http, "GET", f"/v1/streams/{longest}/records?seq_num=0", headers=root
    )
    assert status == 200
    assert read["records"][0]["headers"] == headers
    status, read = await answer(
        http, "GET", f"/v1/streams/{longest}/records?timestamp=0", headers=root
    )
    assert status == 200 and len(read["records"]) == 1
    # The longest stream name of a basin, every byte escaped (3 characters each in walstream).
    status, _ = await answer(
        http,
        "POST",
        "/v1/streams",
        json={"stream": "\u00e9" * 256},
        headers={"s2-basin": BASIN},
    )
    assert status == 201


# -- slow and greedy clients ----------------------------------------------------------------------


async def _until_closed(reader: asyncio.StreamReader) -> None:
    try:
        await reader.read()
    except ConnectionError:
        pass  # closed with our last bytes unread: a reset, closed all the same


async def _slowloris(port: int, request: bytes, interval: float) -> float:
    """Send ``request`` one byte every ``interval`` seconds; the seconds until the server closed
    the connection (or ``inf`` when the whole request went out first)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    began = time.monotonic()
    closed = asyncio.ensure_future(_until_closed(reader))
    try:
        for index in range(len(request)):
            if closed.done():
                break
            writer.write(request[index : index + 1])
            try:
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait({closed}, timeout=interval)
        else:
            return float("inf")
        await asyncio.wait_for(closed, 10)
        return time.monotonic() - began
    finally:
        closed.cancel()
        writer.close()


@pytest.mark.slow
async def test_slowloris_connections_are_closed_while_a_normal_client_is_served(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    head = b"GET /v1/basins HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"p" * 200 + b"\r\n\r\n"
    body_request = (
        b"POST /v1/streams/orders/records HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b"\r\ns2-basin: " + BASIN.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 400\r\n\r\n" + b" " * 400
    )
    await make_basin_and_stream(http)
    basin = {"s2-basin": BASIN}
    began = time.monotonic()
    attackers = [asyncio.ensure_future(_slowloris(server.port, head, 0.05)) for _ in range(20)] + [
        asyncio.ensure_future(_slowloris(server.port, body_request, 0.05)) for _ in range(5)
    ]
    served = 0
    while not all(attacker.done() for attacker in attackers):
        status, _ = await answer(
            http, "POST", "/v1/streams/orders/records", json=records_body(), headers=basin
        )
        assert status == 200
        served += 1
        await asyncio.sleep(0.05)
        assert time.monotonic() - began < 15, "slow connections were not closed"
    closed_after = [attacker.result() for attacker in attackers]
    # Heads: closed at header_timeout (1 s); bodies: 408 at body_timeout (1 s) after the head
    # (~7 s of head at one byte per 0.05 s would be cut at 1 s by the header timeout first).
    assert all(seconds < 1.0 + 2.0 for seconds in closed_after), closed_after
    assert served >= 3
    status, tail = await answer(http, "GET", "/v1/streams/orders/records/tail", headers=basin)
    assert (status, tail["tail"]["seq_num"]) == (200, served)


@pytest.mark.slow
async def test_a_slow_body_gets_408_and_the_connection_is_closed(server: RunningServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(
            b"POST /v1/basins HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        began = time.monotonic()
        response = await asyncio.wait_for(reader.read(), 10)
        waited = time.monotonic() - began
    finally:
        writer.close()
    status, body = parse_raw(response)
    assert_error_body(status, body, 408, "request_timeout")
    assert "server.body_timeout" in body["message"]
    assert 0.9 <= waited < 4.0, waited


@pytest.mark.slow
async def test_a_slow_second_head_on_a_kept_alive_connection_is_closed(
    server: RunningServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b"}"), 5)
        assert b" 200 " in first.split(b"\r\n", 1)[0]
        writer.write(b"GET /hea")  # and nothing more
        began = time.monotonic()
        rest = await asyncio.wait_for(reader.read(), 10)
        assert rest == b"" or b"HTTP/1.1 200" not in rest
        assert time.monotonic() - began < 1.0 + 2.5
    finally:
        writer.close()


async def test_connections_over_the_bound_get_503_when_none_is_idle(tmp_path: Path) -> None:
    """A connection over ``max_connections`` when every open one has a request in progress is
    answered 503 and closed."""
    limits = ServerLimits(header_timeout_s=10.0, max_connections=4)
    async with start(tmp_path, limits) as running:
        busy = [await asyncio.open_connection("127.0.0.1", running.port) for _ in range(4)]
        for _, writer in busy:  # a body that never completes: each stays busy
            writer.write(
                b"POST /v1/basins HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + TOKEN.encode()
                + b"\r\nContent-Length: 50\r\n\r\n{"
            )
        await asyncio.sleep(0.2)
        assert getattr(running.listener, "open", None) == 4
        status, body = parse_raw(
            await raw_exchange(
                running.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
        )
        assert_error_body(status, body, 503, "unavailable")
        assert "server.max_connections" in body["message"]
        for _, writer in busy:
            writer.close()
        await asyncio.sleep(0.2)
        async with aiohttp.ClientSession(headers=AUTH, timeout=TIMEOUT) as session:
            status, health = await answer(session, "GET", running.url + "/health")
        assert (status, health["status"]) == (200, "ok")


async def test_a_busy_listen_address_is_refused(tmp_path: Path) -> None:
    """A second server on a port in use fails instead of sharing it."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    async with start(first) as running:
        with pytest.raises(ConfigError, match="already in use"):
            async with start(second, listen=running.url[7:]):
                pass
        async with aiohttp.ClientSession(headers=AUTH, timeout=TIMEOUT) as session:
            status, health = await answer(session, "GET", running.url + "/health")
        assert (status, health["status"]) == (200, "ok")


async def test_http_stack_is_accepted_with_a_deprecation_warning_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``server.http_stack`` (granian, hypercorn or native before there was one stack) still
    loads for one release, with a warning that says it is ignored and will be refused."""
    deployment = write_deployment(tmp_path)
    deployment.write_text(deployment.read_text() + "server: {http_stack: granian}\n")
    caplog.set_level(logging.WARNING)
    async with serve(deployment, listen="127.0.0.1:0", token=TOKEN, environ={}) as running:
        async with aiohttp.ClientSession(headers=AUTH, timeout=TIMEOUT) as session:
            status, health = await answer(session, "GET", running.url + "/health")
        assert (status, health["status"]) == (200, "ok")
    assert any(
        "server.http_stack is deprecated and ignored" in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.slow
async def test_long_polls_over_the_bound_get_429(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await make_basin_and_stream(http)
    basin = {"s2-basin": BASIN}
    poll = "/v1/streams/orders/records?seq_num=0&wait=8"
    waiting = [asyncio.ensure_future(answer(http, "GET", poll, headers=basin)) for _ in range(2)]
    await asyncio.sleep(0.3)
    status, body = await answer(http, "GET", poll, headers=basin)
    assert_error_body(status, body, 429, "rate_limited")
    assert "server.max_long_polls" in body["message"]
    # A request that does not wait is still served.
    status, tail = await answer(http, "GET", "/v1/streams/orders/records/tail", headers=basin)
    assert (status, tail["tail"]["seq_num"]) == (200, 0)
    await answer(http, "POST", "/v1/streams/orders/records", json=records_body(), headers=basin)
    for result in await asyncio.gather(*waiting):
        assert result[0] == 200 and len(result[1]["records"]) == 1
    # The bound frees up again.
    status, read = await answer(
        http, "GET", "/v1/streams/orders/records?seq_num=1&wait=1", headers=basin
    )
    assert (status, read["records"]) == (200, [])


@pytest.mark.slow
async def test_a_long_poll_whose_client_leaves_frees_its_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every HTTP server tells the application (http.disconnect) when a client leaves: its long
    poll ends at once instead of holding a place under max_long_polls until ``wait`` runs out,
    and nothing is logged as a failure."""
    caplog.set_level(logging.WARNING)
    limits = ServerLimits(header_timeout_s=5.0, max_long_polls=1)
    async with start(tmp_path, limits) as running:
        async with aiohttp.ClientSession(
            base_url=running.url, headers=AUTH, timeout=TIMEOUT
        ) as http:
            await make_basin_and_stream(http)
            basin = {"s2-basin": BASIN}
            poll = "/v1/streams/orders/records?seq_num=0&wait=30"
            _, leaving = await asyncio.open_connection("127.0.0.1", running.port)
            leaving.write(
                f"GET {poll} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"s2-basin: {BASIN}\r\n\r\n".encode()
            )
            await asyncio.sleep(0.3)
            status, body = await answer(http, "GET", poll, headers=basin)
            assert_error_body(status, body, 429, "rate_limited")
            leaving.close()
            began = time.monotonic()
            while True:
                status, body = await answer(
                    http, "GET", "/v1/streams/orders/records?seq_num=0&wait=1", headers=basin
                )
                if status == 200:
                    break
                assert status == 429, body
                assert time.monotonic() - began < 4, "the long poll outlived its client"
                await asyncio.sleep(0.05)
            assert running.app.long_polls == 0
    failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not failures, [r.getMessage() for r in failures]


MEMORY = {
    "wal": {"type": "memory"},
    "object_store": {"type": "memory"},
    "metadata": {"type": "memory"},
}


def test_server_options_come_from_the_yaml_server_section(tmp_path: Path) -> None:
    import walstream_plugins
    from walstream.errors import ConfigError
    from walstream.server.limits import limits_from_section

    deployment = walstream_plugins.load_deployment(
        {
            **MEMORY,
            "server": {
                "header_timeout": "2s",
                "body_timeout": "500ms",
                "max_connections": 7,
                "max_long_polls": 3,
            },
        }
    )
    assert limits_from_section(deployment.sections["server"]) == ServerLimits(
        header_timeout_s=2.0, body_timeout_s=0.5, max_connections=7, max_long_polls=3
    )
    defaults = walstream_plugins.load_deployment(MEMORY)
    assert limits_from_section(defaults.sections["server"]) == ServerLimits()
    for bad in ({"max_connections": 0}, {"header_timeout": "0s"}, {"max_long_polls": "x"}):
        with pytest.raises(ConfigError):
            walstream_plugins.load_deployment({**MEMORY, "server": bad})


def test_every_hostile_client_bound_is_a_checked_server_option() -> None:
    import walstream_plugins
    from walstream.errors import ConfigError
    from walstream.server.limits import limits_from_section

    section = {
        "send_timeout": "5s",
        "max_connections_per_address": 9,
        "max_long_polls_per_address": 4,
        "max_connection_output": "2MiB",
        "max_output": "32MiB",
        "max_resets_per_connection": 50,
        "max_resets_per_address": 200,
        "max_control_frames": 300,
    }
    deployment = walstream_plugins.load_deployment({**MEMORY, "server": section})
    assert limits_from_section(deployment.sections["server"]) == ServerLimits(
        send_timeout_s=5.0,
        max_connections_per_address=9,
        max_long_polls_per_address=4,
        max_connection_output_bytes=2 << 20,
        max_output_bytes=32 << 20,
        max_resets_per_connection=50,
        max_resets_per_address=200,
        max_control_frames=300,
    )
    for bad, key in (
        ({"send_timeout": "0s"}, "server.send_timeout"),
        ({"max_connections_per_address": 0}, "server.max_connections_per_address"),
        ({"max_connection_output": "64KiB"}, "server.max_connection_output"),
        ({"max_resets_per_address": -1}, "server.max_resets_per_address"),
        ({"max_control_frames": "many"}, "server.max_control_frames"),
        ({"tls": {"key": "k.pem"}}, "server.tls.certificate"),
        ({"tls": {"certificate": "c.pem", "key": "k.pem", "ca": "x"}}, "server.tls.ca"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            walstream_plugins.load_deployment({**MEMORY, "server": bad})
    # Bounds that contradict each other are refused where they are made.
    with pytest.raises(ConfigError, match="max_output"):
        ServerLimits(max_connection_output_bytes=8 << 20, max_output_bytes=4 << 20)


# -- property-based: arbitrary requests -----------------------------------------------------------

ROUTES = [
    ("GET", "/v1/basins"),
    ("POST", "/v1/basins"),
    ("GET", "/v1/basins/{ref}"),
    ("PUT", "/v1/basins/{ref}"),
    ("DELETE", "/v1/basins/{ref}"),
    ("GET", "/v1/streams"),
    ("POST", "/v1/streams"),
    ("GET", "/v1/streams/{ref}"),
    ("PUT", "/v1/streams/{ref}"),
    ("PATCH", "/v1/streams/{ref}"),
    ("DELETE", "/v1/streams/{ref}"),
    ("POST", "/v1/streams/{ref}/records"),
    ("GET", "/v1/streams/{ref}/records"),
    ("GET", "/v1/streams/{ref}/records/tail"),
    ("GET", "/{ref}"),
]


def percent(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


# Short numbers, and numbers around Python's 4,300-digit conversion limit.
digits = st.one_of(
    st.integers(min_value=0, max_value=30), st.integers(min_value=4200, max_value=5000)
).map(lambda n: "9" * n)
int_texts = st.one_of(
    st.integers().map(str),
    st.sampled_from([str(2**63), str(2**63 - 1), str(2**64), "1_0", " 5", "+5", "١"]),
    digits,
)
texts = st.one_of(st.text(max_size=20), st.text(st.characters(exclude_categories=()), max_size=8))
refs = st.one_of(
    st.sampled_from(["target", "edge-basin", "walstream", "%2F", "..", "%00", "%ED%A0%80"]),
    texts.filter(bool).map(percent),
)
query_keys = st.sampled_from(
    [
        "seq_num",
        "timestamp",
        "tail_offset",
        "count",
        "bytes",
        "until",
        "clamp",
        "wait",
        "prefix",
        "start_after",
        "limit",
        "x",
    ]
)
queries = st.dictionaries(
    query_keys, st.one_of(int_texts, texts, st.floats().map(str)), max_size=4
).map(lambda pairs: "&".join(f"{key}={percent(value)}" for key, value in pairs.items()))
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=2**62, max_value=2**70),
        st.floats(),
        texts,
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=10,
)
b64_texts = st.binary(max_size=20).map(lambda data: base64.b64encode(data).decode())
commands = st.sampled_from(["", "fence", "trim", "other"])
record_objects = st.fixed_dictionaries(
    {},
    optional={
        "body": st.one_of(texts, b64_texts, json_values),
        "headers": st.one_of(
            st.lists(st.tuples(texts, texts).map(list), max_size=3),
            st.lists(st.tuples(st.just(""), commands).map(list), max_size=2),
            json_values,
        ),
        "timestamp": st.one_of(st.integers(), st.integers(min_value=2**62), json_values),
    },
)
append_bodies = st.fixed_dictionaries(
    {"records": st.one_of(st.lists(record_objects, max_size=3), json_values)},
    optional={
        "match_seq_num": st.one_of(st.integers(), json_values),
        "fencing_token": st.one_of(texts, json_values),
        "other": json_values,
    },
)


def encode_json(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")  # ensure_ascii: surrogates travel as \ud800


bodies = st.one_of(
    st.none(),
    st.binary(max_size=64),
    json_values.map(encode_json),
    append_bodies.map(encode_json),
    st.fixed_dictionaries(
        {},
        optional={
            "basin": st.one_of(texts, json_values),
            "stream": st.one_of(texts, json_values),
            "config": json_values,
        },
    ).map(encode_json),
    digits.map(lambda n: ('{"match_seq_num": ' + (n or "0") + ', "records": []}').encode()),
    st.integers(min_value=1, max_value=20_000).map(lambda n: b"[" * n),
)
header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from("éÿ€"), max_size=30
)
request_headers = st.dictionaries(
    st.sampled_from(["Content-Type", "Accept", "s2-format", "s2-basin"]),
    st.one_of(
        header_text,
        st.sampled_from(
            ["application/json", "application/x-protobuf", "base64", "raw", "edge-basin"]
        ),
    ),
    max_size=4,
)
# Mostly the right token, so requests get past authentication; sometimes anything.
authorizations = st.one_of(st.none(), st.none(), st.none(), header_text)
requests = st.tuples(
    st.sampled_from(ROUTES), refs, queries, bodies, request_headers, authorizations
)


def check_error_answer(status: int, text: str) -> None:
    """An error answer is S2's: ``ErrorInfo``, or the 412 and 416 bodies."""
    parsed = json.loads(text)
    assert "Traceback" not in text
    if status == 412:
        assert set(parsed) & {"seq_num_mismatch", "fencing_token_mismatch"}, parsed
    elif status == 416:
        assert "seq_num" in parsed["tail"], parsed
    else:
        assert parsed["code"] and parsed["message"], parsed


@pytest.mark.slow
def test_arbitrary_http_requests_never_get_a_5xx_other_than_503(tmp_path: Path, soak: bool) -> None:
    loop = asyncio.new_event_loop()
    context = start(tmp_path)
    running = loop.run_until_complete(context.__aenter__())

    async def open_session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(headers=AUTH, timeout=TIMEOUT)

    session = loop.run_until_complete(open_session())
    statuses: dict[int, int] = {}
    try:

        async def setup() -> None:
            status, _ = await answer(
                session, "POST", running.url + "/v1/basins", json={"basin": BASIN}
            )
            assert status == 201
            status, _ = await answer(
                session,
                "POST",
                running.url + "/v1/streams",
                json={"stream": "target"},
                headers={"s2-basin": BASIN},
            )
            assert status == 201

        loop.run_until_complete(setup())

        async def send(request: tuple[Any, ...]) -> None:
            (method, template), ref, query, body, drawn_headers, authorization = request
            headers = {"Content-Type": "application/json", "s2-basin": BASIN, **drawn_headers}
            if authorization is not None:
                headers["Authorization"] = authorization
            if method == "DELETE" and ref in ("target", BASIN):
                ref = "kept"
            path = template.replace("{ref}", ref) + ("?" + query if query else "")
            url = yarl.URL(running.url + path, encoded=True)
            async with session.request(method, url, data=body, headers=headers) as response:
                text = await response.text(errors="replace")
                statuses[response.status] = statuses.get(response.status, 0) + 1
                if response.status >= 400:
                    check_error_answer(response.status, text)
                if response.status >= 500:
                    assert response.status == 503, text
                    assert json.loads(text)["code"] == "unavailable", text

        @settings(
            max_examples=1500 if soak else 120,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            database=None,
        )
        @given(requests)
        def check(request: tuple[Any, ...]) -> None:
            loop.run_until_complete(asyncio.wait_for(send(request), 20))

        check()

        async def still_serving() -> None:
            status, health = await answer(session, "GET", running.url + "/health")
            assert (status, health["status"]) == (200, "ok")
            status, ack = await answer(
                session,
                "POST",
                running.url + "/v1/streams/target/records",
                json=records_body(),
                headers={"s2-basin": BASIN},
            )
            assert status == 200, ack

        loop.run_until_complete(still_serving())
        assert any(status < 300 for status in statuses), statuses
    finally:
        loop.run_until_complete(session.close())
        loop.run_until_complete(context.__aexit__(None, None, None))
        loop.close()
