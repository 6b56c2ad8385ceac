"""walstream's HTTP stack (:mod:`walstream.server.http`) over HTTP/1.1
at the byte level: raw sockets on 127.0.0.1 against ``walstream serve`` in this process, or
against the listener with a small ASGI application where the S2 application cannot provoke the
case (an application that fails, an answer that waits).

What each test reads is what a client sees: status lines, headers, bodies, chunk framing, and
when the server closes the connection."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from walstream.server.http import HttpListener, open_listener
from walstream.server.limits import ServerLimits
from walstream.server.serve import RunningServer, serve

TOKEN = "native-token"
BASIN = "native-basin"
LIMITS = ServerLimits(header_timeout_s=1.0, body_timeout_s=2.0, max_connections=8)
AUTH = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
IN_BASIN = b"s2-basin: " + BASIN.encode() + b"\r\n"


def start(
    folder: Path, limits: ServerLimits = LIMITS
) -> AbstractAsyncContextManager[RunningServer]:
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        f"wal: {{type: memory, name: native-{folder.name}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
    )
    return serve(
        deployment,
        listen="127.0.0.1:0",
        token=TOKEN,
        max_wait_s=30.0,
        limits=limits,
        environ={},
    )


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with start(tmp_path) as running:
        yield running


# -- a raw HTTP/1.1 client ----------------------------------------------------------------------


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def read_answer(reader: asyncio.StreamReader, *, head_request: bool = False) -> Answer:
    """One answer: its head, then a body framed by content-length or chunks (none for HEAD),
    else everything until the server closes."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    status = int(status_line.split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        assert name.lower() not in headers, f"{name} given twice"
        headers[name.lower()] = value.strip()
    if head_request or status in (204, 304) or 100 <= status < 200:
        return Answer(status, headers, b"")
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    elif headers.get("transfer-encoding") == "chunked":
        body = b"".join([chunk async for chunk in read_chunks(reader)])
    else:
        body = await asyncio.wait_for(reader.read(), 10)
    return Answer(status, headers, body)


async def read_chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        size = int(size_line.strip(), 16)
        if size == 0:
            assert await reader.readexactly(2) == b"\r\n"
            return
        chunk = await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"
        yield chunk


async def closed_by_server(reader: asyncio.StreamReader, within_s: float = 5.0) -> bool:
    """True when the server closes the connection within ``within_s`` (nothing more arrives)."""
    try:
        rest = await asyncio.wait_for(reader.read(), within_s)
    except ConnectionError:
        return True
    except TimeoutError:
        return False
    assert rest == b"", rest[:200]
    return True


def request(method: str, target: str, body: bytes = b"", extra: bytes = b"") -> bytes:
    length = b"Content-Length: %d\r\n" % len(body) if body or method in ("POST", "PUT") else b""
    return (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
        + AUTH
        + IN_BASIN
        + length
        + extra
        + b"\r\n"
        + body
    )


def append(*texts: str) -> bytes:
    body = json.dumps({"records": [{"body": text} for text in texts]}).encode()
    return request(
        "POST", "/v1/streams/orders/records", body, b"Content-Type: application/json\r\n"
    )


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def make_stream(port: int) -> None:
    reader, writer = await connect(port)
    try:
        writer.write(request("POST", "/v1/basins", json.dumps({"basin": BASIN}).encode()))
        writer.write(request("POST", "/v1/streams", json.dumps({"stream": "orders"}).encode()))
        assert (await read_answer(reader)).status == 201
        assert (await read_answer(reader)).status == 201
    finally:
        writer.close()


# -- HTTP/1.1 as clients send it ------------------------------------------------------------------


async def test_pipelined_requests_are_answered_in_order(server: RunningServer) -> None:
    await make_stream(server.port)
    reader, writer = await connect(server.port)
    try:
        writer.write(
            append("one")
            + append("two", "three")
            + request("GET", "/v1/streams/orders/records?seq_num=0")
            + request("GET", "/health", extra=b"Connection: close\r\n")
        )
        first, second, read, health = [await read_answer(reader) for _ in range(4)]
        assert (first.status, first.json()["start"]["seq_num"]) == (200, 0)
        assert (second.status, second.json()["start"]["seq_num"]) == (200, 1)
        assert [r["body"] for r in read.json()["records"]] == ["one", "two", "three"]
        assert (health.status, health.json()["status"], health.headers["connection"]) == (
            200,
            "ok",
            "close",
        )
        assert await closed_by_server(reader)
    finally:
        writer.close()


async def test_many_pipelined_requests_in_one_write_all_come_back(server: RunningServer) -> None:
    """More than the listener lets wait at once: reading pauses and resumes, none is lost."""
    await make_stream(server.port)
    reader, writer = await connect(server.port)
    try:
        writer.write(b"".join(append(f"r{i}") for i in range(60)))
        answers = [await read_answer(reader) for _ in range(60)]
        assert [a.json()["start"]["seq_num"] for a in answers] == list(range(60))
    finally:
        writer.close()


async def test_an_sse_read_is_chunked_and_readable_by_a_raw_client(server: RunningServer) -> None:
    await make_stream(server.port)
    reader, writer = await connect(server.port)
    try:
        writer.write(append("a", "b"))
        assert (await read_answer(reader)).status == 200
        writer.write(
            request(
                "GET",
                "/v1/streams/orders/records?seq_num=0&count=2",
                extra=b"Accept: text/event-stream\r\n",
            )
        )
        answer = await read_answer(reader)
        assert answer.status == 200
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in answer.headers
        events = [e for e in answer.body.decode().split("\n\n") if e]
        assert events[0].startswith("event: batch\ndata: ")
        batch = json.loads(events[0].split("\n")[1].removeprefix("data: "))
        assert [r["body"] for r in batch["records"]] == ["a", "b"]
        assert events[-1] == "event: done\ndata: [DONE]"
        # The connection carries the next request after the last chunk.
        writer.write(request("GET", "/health"))
        assert (await read_answer(reader)).json()["status"] == "ok"
    finally:
        writer.close()


async def test_an_sse_answer_begins_before_its_first_event(server: RunningServer) -> None:
    """A read session that waits at the tail: the client gets the head at once (it is not
    held for the first body bytes), and the first batch when it is appended."""
    await make_stream(server.port)
    reader, writer = await connect(server.port)
    try:
        writer.write(
            request(
                "GET",
                "/v1/streams/orders/records?seq_num=0&count=1&wait=20",
                extra=b"Accept: text/event-stream\r\n",
            )
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert head.startswith(b"HTTP/1.1 200 ")
        other_reader, other_writer = await connect(server.port)
        other_writer.write(append("late"))
        assert (await read_answer(other_reader)).status == 200
        other_writer.close()
        body = b"".join([chunk async for chunk in read_chunks(reader)])
        assert b'"body":"late"' in body
    finally:
        writer.close()


async def test_expect_100_continue_gets_continue_before_the_body(server: RunningServer) -> None:
    reader, writer = await connect(server.port)
    try:
        body = json.dumps({"basin": BASIN}).encode()
        writer.write(
            request("POST", "/v1/basins", extra=b"Expect: 100-continue\r\n").replace(
                b"Content-Length: 0", b"Content-Length: %d" % len(body)
            )
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        answer = await read_answer(reader)
        assert (answer.status, answer.json()["name"]) == (201, BASIN)
        assert "connection" not in answer.headers  # kept alive
    finally:
        writer.close()


async def test_head_is_answered_without_a_body(server: RunningServer) -> None:
    """The S2 application has no HEAD routes (404, with a JSON body for a GET): the head says
    how long that body would be, and none follows."""
    reader, writer = await connect(server.port)
    try:
        writer.write(request("HEAD", "/v1/nothing") + request("GET", "/v1/nothing"))
        head = await read_answer(reader, head_request=True)
        get = await read_answer(reader)  # right after the head: no body came in between
        assert head.status == get.status == 404
        assert get.json()["code"] == "bad_path"
        assert int(head.headers["content-length"]) == len(get.body) > 0
    finally:
        writer.close()


async def test_http_1_0_closes_unless_asked_to_keep_alive(server: RunningServer) -> None:
    reader, writer = await connect(server.port)
    try:
        writer.write(b"GET /health HTTP/1.0\r\n\r\n")
        answer = await read_answer(reader)
        assert (answer.status, answer.json()["status"]) == (200, "ok")
        assert answer.headers["connection"] == "close"
        assert await closed_by_server(reader)
    finally:
        writer.close()
    reader, writer = await connect(server.port)
    try:
        for _ in range(2):
            writer.write(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            answer = await read_answer(reader)
            assert answer.headers["connection"] == "keep-alive"
            assert answer.json()["status"] == "ok"
    finally:
        writer.close()


async def test_an_upgrade_to_h2c_is_served_as_http_1_1(server: RunningServer) -> None:
    """curl --http2 asks to switch protocols on a cleartext request; the server may ignore it
    (RFC 9110 7.8): the answer is HTTP/1.1, and a body after such a request is read as one."""
    upgrade = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    reader, writer = await connect(server.port)
    try:
        body = json.dumps({"basin": BASIN}).encode()
        writer.write(request("GET", "/health", extra=upgrade))
        writer.write(request("POST", "/v1/basins", body, upgrade))
        writer.write(request("GET", f"/v1/basins/{BASIN}"))
        health, created, config = [await read_answer(reader) for _ in range(3)]
        assert (health.status, health.json()["status"]) == (200, "ok")
        assert (created.status, created.json()["name"]) == (201, BASIN)
        assert config.status == 200
    finally:
        writer.close()


# -- what the listener answers itself -------------------------------------------------------------


@pytest.mark.parametrize(
    "garbage",
    [
        b"NOT AN HTTP REQUEST\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
        b"POST /v1/basins HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"POST /v1/basins HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    ],
    ids=["words", "tls-hello", "bad-length", "length-and-chunked"],
)
async def test_a_malformed_request_gets_400_in_s2s_shape_and_the_connection_closes(
    server: RunningServer, garbage: bytes
) -> None:
    reader, writer = await connect(server.port)
    try:
        writer.write(garbage)
        answer = await read_answer(reader)
        assert answer.status == 400
        assert answer.json()["code"] == "invalid"
        assert "malformed" in answer.json()["message"]
        assert answer.headers["connection"] == "close"
        assert await closed_by_server(reader)
    finally:
        writer.close()


async def test_a_malformed_request_after_a_good_one_is_answered_in_its_turn(
    server: RunningServer,
) -> None:
    reader, writer = await connect(server.port)
    try:
        writer.write(request("GET", "/health") + b"BROKEN\r\n\r\n")
        first, second = await read_answer(reader), await read_answer(reader)
        assert (first.status, second.status) == (200, 400)
        assert await closed_by_server(reader)
    finally:
        writer.close()


@pytest.mark.parametrize("where", ["header", "target"])
async def test_a_head_over_64_kib_gets_431(server: RunningServer, where: str) -> None:
    reader, writer = await connect(server.port)
    try:
        if where == "header":
            writer.write(b"GET /health HTTP/1.1\r\nX-Long: " + b"v" * 70_000 + b"\r\n\r\n")
        else:
            writer.write(b"GET /health?x=" + b"9" * 70_000 + b" HTTP/1.1\r\n\r\n")
        answer = await read_answer(reader)
        assert (answer.status, answer.json()["code"]) == (431, "invalid")
        assert await closed_by_server(reader)
    finally:
        writer.close()


async def test_a_head_that_never_ends_is_cut_at_64_kib(server: RunningServer) -> None:
    """A header line sent without end: the server answers 431 once it holds 128 KiB of it,
    instead of buffering it without bound (what follows is read and dropped)."""
    reader, writer = await connect(server.port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nX-Endless: ")
        for _ in range(48):  # 192 KiB
            writer.write(b"v" * 4096)
            await writer.drain()
        answer = await read_answer(reader)
        assert (answer.status, answer.json()["code"]) == (431, "invalid")
        assert await closed_by_server(reader)
    finally:
        writer.close()


def busy_request() -> bytes:
    """An append whose body never completes: its connection stays busy (not idle)."""
    return (
        b"POST /v1/streams/busy/records HTTP/1.1\r\nhost: x\r\n"
        + AUTH
        + IN_BASIN
        + b"content-type: application/json\r\ncontent-length: 100\r\n\r\n{"
    )


async def test_connections_over_the_bound_get_503_when_none_is_idle(tmp_path: Path) -> None:
    limits = ServerLimits(header_timeout_s=10.0, max_connections=3)
    async with start(tmp_path, limits) as running:
        listener = running.listener
        assert isinstance(listener, HttpListener)
        busy = [await connect(running.port) for _ in range(3)]
        for _, writer in busy:
            writer.write(busy_request())
        await asyncio.sleep(0.3)
        assert listener.open == 3
        reader, writer = await connect(running.port)
        writer.write(request("GET", "/health"))
        answer = await read_answer(reader)
        assert (answer.status, answer.json()["code"]) == (503, "unavailable")
        assert "server.max_connections" in answer.json()["message"]
        assert answer.headers["retry-after-ms"] == "1000"
        assert await closed_by_server(reader)
        writer.close()
        assert (listener.refused, listener.open) == (1, 3)
        busy[0][1].close()
        await asyncio.sleep(0.2)
        reader, writer = await connect(running.port)
        writer.write(request("GET", "/health"))
        assert (await read_answer(reader)).json()["status"] == "ok"
        writer.close()
        for _, other in busy[1:]:
            other.close()


async def test_idle_connections_give_way_to_new_ones_when_the_server_is_full(
    tmp_path: Path,
) -> None:
    """A client holding idle sockets (never used, or idle after an answer) cannot lock others
    out: the longest-idle one is closed for each new connection."""
    limits = ServerLimits(header_timeout_s=30.0, max_connections=3)
    async with start(tmp_path, limits) as running:
        listener = running.listener
        assert isinstance(listener, HttpListener)
        idle = [await connect(running.port) for _ in range(3)]
        await asyncio.sleep(0.2)
        assert listener.open == 3
        for _ in range(5):
            reader, writer = await connect(running.port)
            writer.write(request("GET", "/health"))
            assert (await read_answer(reader)).json()["status"] == "ok"
            writer.close()
            await asyncio.sleep(0.05)
        assert listener.refused == 0
        assert listener.evicted >= 1
        assert await closed_by_server(idle[0][0])  # the longest idle went first
        for _, writer in idle:
            writer.close()


@pytest.mark.slow
async def test_an_idle_connection_is_closed_after_the_header_timeout(
    server: RunningServer,
) -> None:
    # One that never sent anything, and one idle after an answer.
    silent_reader, silent_writer = await connect(server.port)
    reader, writer = await connect(server.port)
    try:
        writer.write(request("GET", "/health"))
        assert (await read_answer(reader)).status == 200
        began = time.monotonic()
        assert await closed_by_server(reader, 5.0)
        assert await closed_by_server(silent_reader, 5.0)
        waited = time.monotonic() - began
        assert 0.7 <= waited < 1.0 + 1.5, waited
    finally:
        writer.close()
        silent_writer.close()


@pytest.mark.slow
async def test_a_connection_busy_with_a_long_poll_is_not_cut_by_the_header_timeout(
    server: RunningServer,
) -> None:
    await make_stream(server.port)
    reader, writer = await connect(server.port)
    try:
        writer.write(request("GET", "/v1/streams/orders/records?seq_num=0&wait=2"))
        answer = await read_answer(reader)  # waits 2 s, twice the header timeout
        assert (answer.status, answer.json()["records"]) == (200, [])
    finally:
        writer.close()


# -- HTTP/2 on the same port ----------------------------------------------------------------------


class H2Client:
    """A minimal h2c (prior knowledge) client on the ``h2`` state machine."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.connection = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.connection.initiate_connection()
        self.writer.write(self.connection.data_to_send())
        self.terminated = False

    async def get(self, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
        stream_id = self.connection.get_next_available_stream_id()
        self.connection.send_headers(
            stream_id,
            [
                (b":method", b"GET"),
                (b":scheme", b"http"),
                (b":authority", b"127.0.0.1"),
                (b":path", path.encode()),
                *headers,
            ],
            end_stream=True,
        )
        self.writer.write(self.connection.data_to_send())
        status, body = 0, b""
        while True:
            for event in await self.events():
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                    body += event.data
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
                    return status, body

    async def events(self) -> list[h2.events.Event]:
        data = await asyncio.wait_for(self.reader.read(65536), 10)
        if not data:
            raise ConnectionError("the server closed the HTTP/2 connection")
        events = self.connection.receive_data(data)
        self.terminated |= any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
        self.writer.write(self.connection.data_to_send())
        return events


async def test_h2c_with_prior_knowledge_is_served_on_the_same_port(
    server: RunningServer,
) -> None:
    reader, writer = await connect(server.port)
    client = H2Client(reader, writer)
    try:
        status, body = await client.get("/health", [])
        assert (status, json.loads(body)["status"]) == (200, "ok")
        status, body = await client.get(
            "/v1/basins", [(b"authorization", f"Bearer {TOKEN}".encode())]
        )
        assert status == 200 and "walstream" in [b["name"] for b in json.loads(body)["basins"]]
        # HTTP/1.1 still answers on the same port.
        http1_reader, http1_writer = await connect(server.port)
        http1_writer.write(request("GET", "/health"))
        assert (await read_answer(http1_reader)).json()["status"] == "ok"
        assert isinstance(server.listener, HttpListener) and server.listener.open == 2
        http1_writer.close()
    finally:
        writer.close()


# -- graceful close -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_close_lets_a_request_in_progress_finish_and_closes_idle_connections(
    server: RunningServer,
) -> None:
    """HTTP/1.1: an idle connection is closed at once; a request whose body is still arriving
    is answered (``connection: close``), then its connection closes. HTTP/2: an idle connection
    gets GOAWAY and is closed; a long poll in progress is answered, followed by GOAWAY. New connections are
    refused meanwhile, and close() returns once all of them are done."""
    await make_stream(server.port)
    listener = server.listener
    assert isinstance(listener, HttpListener)
    idle_reader, idle_writer = await connect(server.port)
    idle_h2 = H2Client(*await connect(server.port))
    assert (await idle_h2.get("/health", []))[0] == 200
    busy_h2 = H2Client(*await connect(server.port))
    auth = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"s2-basin", BASIN.encode())]
    long_poll = asyncio.ensure_future(
        busy_h2.get("/v1/streams/orders/records?seq_num=0&wait=1", auth)
    )
    busy_reader, busy_writer = await connect(server.port)
    head, body = append("during shutdown").split(b"\r\n\r\n", 1)
    busy_writer.write(head + b"\r\n\r\n" + body[:5])  # the request is in progress
    await asyncio.sleep(0.3)
    closing = asyncio.ensure_future(listener.close(grace_s=10.0))
    try:
        assert await closed_by_server(idle_reader, 2.0)
        with pytest.raises(ConnectionError):
            while True:
                await idle_h2.events()
        assert idle_h2.terminated  # GOAWAY, then the close
        with pytest.raises(OSError):
            await connect(server.port)
        assert not closing.done()
        busy_writer.write(body[5:])
        answer = await read_answer(busy_reader)
        assert (answer.status, answer.json()["start"]["seq_num"]) == (200, 0)
        assert answer.headers["connection"] == "close"
        assert await closed_by_server(busy_reader)
        status, polled = await asyncio.wait_for(long_poll, 5)
        assert status == 200 and json.loads(polled)["records"][0]["body"] == "during shutdown"
        with pytest.raises(ConnectionError):
            while True:
                await busy_h2.events()
        assert busy_h2.terminated  # GOAWAY before the close
        await asyncio.wait_for(closing, 5)
        assert not listener.connections and listener.open == 0
    finally:
        long_poll.cancel()
        for writer in (idle_writer, idle_h2.writer, busy_h2.writer, busy_writer):
            writer.close()


# -- the listener with a small application --------------------------------------------------------

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def listening(app: App, limits: ServerLimits = LIMITS) -> HttpListener:
    return await open_listener(app, "127.0.0.1", 0, limits)


async def test_an_application_error_before_the_answer_is_a_500_and_after_it_a_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/late":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("the application broke")

    listener = await listening(app)
    try:
        reader, writer = await connect(listener.port)
        writer.write(b"GET /early HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await read_answer(reader)
        assert (answer.status, answer.json()["code"]) == (500, "other")
        assert "Traceback" not in answer.body.decode()
        writer.write(b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b"transfer-encoding: chunked" in head
        # The chunked body never ends: the connection is closed mid-answer.
        rest = await asyncio.wait_for(reader.read(), 5)
        assert rest == b"7\r\npartial\r\n"
        writer.close()
    finally:
        await listener.close(1.0)
    failures = [r for r in caplog.records if r.exc_info and r.exc_info[1] is not None]
    assert [str(r.exc_info[1]) for r in failures if r.exc_info] == ["the application broke"] * 2


async def test_an_answer_header_with_a_line_break_is_refused_not_written() -> None:
    """A header value that would split the answer (response splitting) is an application
    error: the client gets a 500, never the injected header."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"x-echo", b"a\r\nx-injected: yes"), (b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    listener = await listening(app)
    try:
        reader, writer = await connect(listener.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await read_answer(reader)
        assert answer.status == 500 and "x-injected" not in answer.headers
        writer.close()
    finally:
        await listener.close(1.0)


async def test_receive_says_disconnect_when_the_client_goes_and_sends_are_dropped() -> None:
    seen: list[str] = []
    done = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((await receive())["type"])  # the (empty) body
        seen.append((await receive())["type"])  # waits: the client is still there
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"too late"})
        done.set()

    listener = await listening(app)
    try:
        _, writer = await connect(listener.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.2)
        assert seen == ["http.request"]
        writer.close()
        await asyncio.wait_for(done.wait(), 5)
        assert seen == ["http.request", "http.disconnect"]
        await asyncio.sleep(0.1)
        assert not listener.connections and listener.open == 0
    finally:
        await listener.close(1.0)


async def test_a_streamed_request_body_arrives_in_pieces_with_more_body() -> None:
    pieces: list[tuple[bytes, bool]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            pieces.append((message["body"], message["more_body"]))
            if not message["more_body"]:
                break
        body = b"".join(piece for piece, _ in pieces)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    listener = await listening(app)
    try:
        reader, writer = await connect(listener.port)
        writer.write(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        )
        await asyncio.sleep(0.2)
        writer.write(b"6\r\n world\r\n0\r\n\r\n")
        answer = await read_answer(reader)
        assert answer.body == b"hello world"
        assert answer.headers["transfer-encoding"] == "chunked"  # no length was given
        assert pieces[0] == (b"hello", True) and pieces[-1][1] is False
        writer.close()
    finally:
        await listener.close(1.0)


async def test_the_scope_is_asgi_3() -> None:
    scopes: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scopes.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    listener = await listening(app)
    try:
        sock = socket.create_connection(("127.0.0.1", listener.port))
        sock.sendall(
            b"GET /a%20b/%E2%82%AC/c%2Fd?x=1&y=%20 HTTP/1.1\r\nHost: x\r\nX-Mixed-Case: V\r\n\r\n"
        )
        reader, writer = await asyncio.open_connection(sock=sock)
        assert (await read_answer(reader)).status == 204
        writer.close()
    finally:
        await listener.close(1.0)
    (scope,) = scopes
    assert scope["type"] == "http"
    assert scope["asgi"]["version"] == "3.0"
    assert (scope["http_version"], scope["method"], scope["scheme"]) == ("1.1", "GET", "http")
    assert scope["path"] == "/a b/€/c/d"
    assert scope["raw_path"] == b"/a%20b/%E2%82%AC/c%2Fd"
    assert scope["query_string"] == b"x=1&y=%20"
    assert scope["root_path"] == ""
    assert (b"x-mixed-case", b"V") in scope["headers"]
    assert scope["server"] == ("127.0.0.1", listener.port)
    assert scope["client"][0] == "127.0.0.1"


def test_the_application_asks_for_output_room_under_the_stacks_extension_name() -> None:
    """The S2 application finds the stack's output reservation by name (it does not import the
    stack): a renamed extension would silently turn every read's reservation off."""
    from walstream.server.http import OUTPUT_ROOM as stack_name
    from walstream.server.s2.request import OUTPUT_ROOM as application_name

    assert stack_name == application_name


async def test_a_read_over_http1_reserves_its_answer_before_building_it(tmp_path: Path) -> None:
    """With the connection's output budget held, a read waits for room (nothing is built) and
    answers 503 when none comes within send_timeout."""
    limits = ServerLimits(
        header_timeout_s=10.0, send_timeout_s=0.5, max_connection_output_bytes=1 << 20
    )
    async with start(tmp_path, limits) as running:
        await make_stream(running.port)
        reader, writer = await connect(running.port)
        try:
            record = json.dumps({"records": [{"body": "r0"}]}).encode()
            writer.write(request("POST", "/v1/streams/orders/records", record))
            assert (await read_answer(reader)).status == 200
            port = writer.get_extra_info("sockname")[1]
            await asyncio.sleep(0.1)
            listener = running.listener
            assert isinstance(listener, HttpListener)
            (connection,) = [
                c for c in listener.connections if c.client is not None and c.client[1] == port
            ]
            connection.output.used = connection.output.limit  # an answer not taken holds it
            writer.write(request("GET", "/v1/streams/orders/records?seq_num=0"))
            answer = await read_answer(reader)
            assert answer.status == 503, (answer.status, answer.body[:300])
            assert answer.json()["code"] == "unavailable"
            assert "server.send_timeout" in answer.json()["message"]
            connection.output.used = 0
            writer.write(request("GET", "/v1/streams/orders/records?seq_num=0"))
            assert (await read_answer(reader)).status == 200
        finally:
            writer.close()
