"""walstream's HTTP stack (:mod:`walstream.server.http`) over HTTP/2 (h2c with prior knowledge), at the frame level: the
``h2`` library as a raw client on real sockets (127.0.0.1) against ``walstream serve`` in this
process, or against the listener with a small ASGI application where the S2 application cannot
provoke the case (an application that does not read, fails, or answers early).

Each test reads what a client sees: frames and their error codes, statuses, bodies, window
updates, and when the server closes the connection."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
from walstream.server.http import HttpListener, open_listener
from walstream.server.http.http2 import MAX_STREAMS, WINDOW_BYTES
from walstream.server.limits import ServerLimits
from walstream.server.serve import RunningServer, serve

TOKEN = "h2-token"
BASIN = "h2-basin"
LIMITS = ServerLimits(header_timeout_s=1.0, body_timeout_s=5.0, max_connections=16)
S2_HEADERS = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"s2-basin", BASIN.encode())]
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def start(
    folder: Path, limits: ServerLimits = LIMITS
) -> AbstractAsyncContextManager[RunningServer]:
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        f"wal: {{type: memory, name: h2-{folder.name}}}\n"
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


# -- a raw HTTP/2 client ------------------------------------------------------------------------


class Answer:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.ended = False
        self.reset: int | None = None
        """The error code of a RST_STREAM from the server."""

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None

    def json(self) -> Any:
        return json.loads(self.body)


class Peer:
    """An h2c client on the ``h2`` state machine: a task reads frames and keeps every event
    and each stream's answer; data is acknowledged as it arrives unless ``read_slowly``."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        validate: bool = True,
        initial: bool = True,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=True,
                header_encoding=None,
                validate_outbound_headers=validate,
                normalize_outbound_headers=validate,
            )
        )
        self.events: list[h2.events.Event] = []
        self.answers: dict[int, Answer] = {}
        self.eof = False
        self.error: Exception | None = None
        self.read_slowly = False
        self.unacknowledged: list[tuple[int, int]] = []
        self._changed = asyncio.Event()
        if initial:
            self.h2.initiate_connection()
            self.flush()
        self.task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, port: int, **options: Any) -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, **options)

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.writer.write(data)

    async def _read(self) -> None:
        while True:
            try:
                data = await self.reader.read(1 << 16)
            except ConnectionError:
                data = b""
            if not data:
                self.eof = True
                self._changed.set()
                return
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError as error:
                self.error = error
                self._changed.set()
                return
            for event in events:
                self.events.append(event)
                stream_id = getattr(event, "stream_id", 0)
                answer = self.answers.get(stream_id) if stream_id else None
                if answer is None:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    answer.headers = dict(event.headers)
                    answer.status = int(answer.headers[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    answer.body += event.data
                    if self.read_slowly:
                        self.unacknowledged.append((stream_id, event.flow_controlled_length))
                    else:
                        self.h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    answer.ended = True
                elif isinstance(event, h2.events.StreamReset):
                    answer.reset = event.error_code
            self.flush()
            self._changed.set()

    async def until(self, check: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if self.eof or self.error is not None:
                if check():
                    return
                raise ConnectionError(f"the connection ended (eof={self.eof}, {self.error!r})")
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the expected frames did not come")
            try:  # (polled too: a check may turn on what this client sent itself)
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))
            except TimeoutError:
                pass

    def acknowledge_all(self) -> None:
        for stream_id, size in self.unacknowledged:
            try:
                self.h2.acknowledge_received_data(size, stream_id)
            except h2.exceptions.StreamClosedError:
                pass
        self.unacknowledged.clear()
        self.flush()

    def open(
        self,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        *,
        end: bool = True,
    ) -> int:
        stream_id = self.h2.get_next_available_stream_id()
        self.answers[stream_id] = Answer()
        self.h2.send_headers(
            stream_id,
            [
                (b":method", method.encode()),
                (b":scheme", b"http"),
                (b":authority", b"127.0.0.1"),
                (b":path", path.encode()),
                *(headers or []),
            ],
            end_stream=end,
        )
        self.flush()
        return stream_id

    async def send_body(self, stream_id: int, body: bytes, *, end: bool = True) -> None:
        """Send ``body`` in frames within the server's frame size and windows."""
        sent = 0
        while sent < len(body):
            room = min(
                self.h2.local_flow_control_window(stream_id),
                self.h2.max_outbound_frame_size,
                len(body) - sent,
            )
            if room <= 0:
                self.flush()
                await self.until(lambda: self.h2.local_flow_control_window(stream_id) > 0)
                continue
            self.h2.send_data(stream_id, body[sent : sent + room])
            sent += room
        if end:
            self.h2.end_stream(stream_id)
        self.flush()

    async def request(
        self,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        body: bytes = b"",
    ) -> Answer:
        stream_id = self.open(method, path, headers, end=not body)
        if body:
            await self.send_body(stream_id, body)
        answer = self.answers[stream_id]
        await self.until(lambda: answer.done)
        return answer

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()


def appended(*texts: str) -> bytes:
    return json.dumps({"records": [{"body": text} for text in texts]}).encode()


JSON_BODY = [(b"content-type", b"application/json")]


async def make_stream(peer: Peer) -> None:
    basin = await peer.request(
        "POST", "/v1/basins", S2_HEADERS[:1] + JSON_BODY, json.dumps({"basin": BASIN}).encode()
    )
    assert basin.status == 201, basin.body
    stream = await peer.request(
        "POST", "/v1/streams", S2_HEADERS + JSON_BODY, json.dumps({"stream": "orders"}).encode()
    )
    assert stream.status == 201, stream.body


App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def listening(app: App, limits: ServerLimits = LIMITS) -> HttpListener:
    return await open_listener(app, "127.0.0.1", 0, limits)


# -- streams ------------------------------------------------------------------------------------


async def test_many_concurrent_streams_on_one_connection_are_each_answered(
    server: RunningServer,
) -> None:
    peer = await Peer.connect(server.port)
    try:
        await make_stream(peer)
        count = 100
        ids = []
        for index in range(count):  # all opened before the first answer is read
            stream_id = peer.open(
                "POST",
                "/v1/streams/orders/records",
                S2_HEADERS + JSON_BODY + [(b"content-length", b"%d" % len(appended(f"r{index}")))],
                end=False,
            )
            peer.h2.send_data(stream_id, appended(f"r{index}"), end_stream=True)
            ids.append(stream_id)
        peer.flush()
        await peer.until(lambda: all(peer.answers[i].done for i in ids))
        positions = sorted(peer.answers[i].json()["start"]["seq_num"] for i in ids)
        assert positions == list(range(count))
        assert all(peer.answers[i].status == 200 for i in ids)
        # Each stream got its own record's position: read back what each one appended.
        read = await peer.request(
            "GET", f"/v1/streams/orders/records?seq_num=0&count={count}", S2_HEADERS
        )
        by_seq = {r["seq_num"]: r["body"] for r in read.json()["records"]}
        for index, stream_id in enumerate(ids):
            assert by_seq[peer.answers[stream_id].json()["start"]["seq_num"]] == f"r{index}"
        settings = peer.h2.remote_settings
        assert settings.max_concurrent_streams == MAX_STREAMS
        assert settings.initial_window_size == WINDOW_BYTES
        assert settings.max_header_list_size == 64 * 1024
    finally:
        peer.close()


async def test_a_request_body_over_the_window_and_an_answer_over_the_clients_window(
    server: RunningServer,
) -> None:
    """Flow control both ways with the S2 application: a ~1.4 MB append (1,000 records of
    1,000 bytes, base64) is more than the server's 1 MiB windows, so it arrives only as the
    server hands the window back; reading it back is more than the client's 64 KiB window, so
    the server waits for the client's WINDOW_UPDATE (h2 would raise if it sent beyond it)."""
    peer = await Peer.connect(server.port)
    try:
        await make_stream(peer)
        values = [os.urandom(1000) for _ in range(1000)]
        body = json.dumps(
            {"records": [{"body": base64.b64encode(v).decode()} for v in values]}
        ).encode()
        assert len(body) > WINDOW_BYTES
        answer = await peer.request(
            "POST",
            "/v1/streams/orders/records",
            S2_HEADERS + JSON_BODY + [(b"s2-format", b"base64")],
            body,
        )
        assert answer.status == 200, answer.body
        assert answer.json()["end"]["seq_num"] == 1000
        assert peer.h2.remote_settings.initial_window_size == WINDOW_BYTES
        read = await peer.request(
            "GET",
            "/v1/streams/orders/records?seq_num=0&count=1000",
            [*S2_HEADERS, (b"s2-format", b"base64")],
        )
        assert read.status == 200
        assert len(read.body) > 65535 * 4
        got = [base64.b64decode(r["body"]) for r in read.json()["records"]]
        assert got == values[: len(got)] and len(got) > 500
    finally:
        peer.close()


async def test_a_5_mib_body_flows_as_the_application_reads_and_a_slow_reader_holds_back_the_client() -> (
    None
):
    """The server hands window back as the application takes the body: an application that
    has not read yet holds the client at the stream window (1 MiB); once it reads, the whole
    5 MiB arrives. The 5 MiB answer goes out within the client's windows, acknowledged slowly."""
    reading = asyncio.Event()
    received: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await reading.wait()
        digest = hashlib.sha256()
        while True:
            message = await receive()
            digest.update(message["body"])
            received.append(len(message["body"]))
            if not message["more_body"]:
                break
        answer = digest.digest() * (5 * 1024 * 1024 // 32)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % len(answer))],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    listener = await listening(app)
    try:
        peer = await Peer.connect(listener.port)
        body = os.urandom(5 * 1024 * 1024)
        stream_id = peer.open("POST", "/", [(b"content-length", b"%d" % len(body))], end=False)
        sending = asyncio.ensure_future(peer.send_body(stream_id, body))
        await peer.until(lambda: peer.h2.local_flow_control_window(stream_id) == 0)
        await asyncio.sleep(0.3)
        # Nothing was read: the window stays closed, the client is held at 1 MiB.
        assert peer.h2.local_flow_control_window(stream_id) == 0 and not sending.done()
        assert not peer.of_type(h2.events.WindowUpdated) or all(
            e.stream_id == 0 or e.stream_id != stream_id
            for e in peer.of_type(h2.events.WindowUpdated)
        )
        peer.read_slowly = True
        reading.set()
        await asyncio.wait_for(sending, 10)
        answer = peer.answers[stream_id]
        while not answer.done:  # the answer arrives as the client opens its window
            await peer.until(lambda: bool(peer.unacknowledged) or answer.done)
            peer.acknowledge_all()
        assert sum(received) == len(body)
        assert answer.status == 200 and len(answer.body) == 5 * 1024 * 1024 // 32 * 32
        assert bytes(answer.body[:32]) == hashlib.sha256(body).digest()
        peer.close()
    finally:
        await listener.close(1.0)


@pytest.mark.slow
async def test_reset_of_a_long_poll_ends_it_and_frees_its_place(tmp_path: Path) -> None:
    limits = ServerLimits(header_timeout_s=5.0, max_long_polls=1)
    async with start(tmp_path, limits) as running:
        peer = await Peer.connect(running.port)
        try:
            await make_stream(peer)
            poll = "/v1/streams/orders/records?seq_num=0&wait=30"
            leaving = peer.open("GET", poll, S2_HEADERS)
            await asyncio.sleep(0.3)
            assert running.app.long_polls == 1
            refused = await peer.request("GET", poll, S2_HEADERS)
            assert (refused.status, refused.json()["code"]) == (429, "rate_limited")
            peer.h2.reset_stream(leaving, h2.errors.ErrorCodes.CANCEL)
            peer.flush()
            began = time.monotonic()
            while running.app.long_polls:
                assert time.monotonic() - began < 2, "the long poll outlived its stream"
                await asyncio.sleep(0.02)
            answer = await peer.request(
                "GET", "/v1/streams/orders/records?seq_num=0&wait=1", S2_HEADERS
            )
            assert answer.status == 200
        finally:
            peer.close()


async def test_a_stream_the_client_resets_has_its_work_cancelled() -> None:
    """Rapid reset's cost: a reset stream's application is cancelled (its work stops), not left
    running to answer nobody; the connection serves on."""
    seen: list[str] = []
    done = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/wait":
            seen.append((await receive())["type"])  # the (empty) body
            try:
                await asyncio.sleep(60)  # work in progress
            except asyncio.CancelledError:
                seen.append("cancelled")
                done.set()
                raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"answer"})

    listener = await listening(app)
    try:
        peer = await Peer.connect(listener.port)
        stream_id = peer.open("GET", "/wait")
        await asyncio.sleep(0.2)
        assert seen == ["http.request"]
        peer.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        peer.flush()
        await asyncio.wait_for(done.wait(), 5)
        assert seen == ["http.request", "cancelled"]
        # The connection still serves: another stream is answered.
        assert (await peer.request("GET", "/")).status == 200
        assert peer.answers[stream_id].status == 0  # nothing was sent after the reset
        peer.close()
    finally:
        await listener.close(1.0)


async def test_a_closed_connection_says_disconnect_to_every_stream_and_is_forgotten() -> None:
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # the (empty) body
        seen.append((await receive())["type"])  # waits until the client is gone
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"too late"})

    listener = await listening(app)
    try:
        peer = await Peer.connect(listener.port)
        for _ in range(3):
            peer.open("GET", "/")
        await asyncio.sleep(0.2)
        assert seen == [] and listener.open == 1
        peer.close()
        for _ in range(100):
            if len(seen) == 3 and not listener.connections:
                break
            await asyncio.sleep(0.02)
        assert seen == ["http.disconnect"] * 3
        assert not listener.connections and listener.open == 0
    finally:
        await listener.close(1.0)


async def test_an_answer_complete_before_its_request_ends_the_stream_with_no_error() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"2")]}
        )
        await send({"type": "http.response.body", "body": b"no"})

    listener = await listening(app)
    try:
        peer = await Peer.connect(listener.port)
        stream_id = peer.open("POST", "/", end=False)
        peer.h2.send_data(stream_id, b"x" * 1000)
        peer.flush()
        answer = peer.answers[stream_id]
        await peer.until(lambda: answer.reset is not None)
        assert (answer.status, bytes(answer.body), answer.ended) == (413, b"no", True)
        assert answer.reset == h2.errors.ErrorCodes.NO_ERROR
        assert (await peer.request("GET", "/")).status == 413
        peer.close()
    finally:
        await listener.close(1.0)


# -- the connection -----------------------------------------------------------------------------


async def test_ping_is_answered(server: RunningServer) -> None:
    peer = await Peer.connect(server.port)
    try:
        peer.h2.ping(b"walstrm!")
        peer.flush()
        await peer.until(lambda: bool(peer.of_type(h2.events.PingAckReceived)))
        assert peer.of_type(h2.events.PingAckReceived)[0].ping_data == b"walstrm!"
    finally:
        peer.close()


@pytest.mark.slow
async def test_graceful_close_lets_a_stream_finish_refuses_new_ones_then_goaway() -> None:
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            await release.wait()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]}
        )
        await send({"type": "http.response.body", "body": b"done"})

    listener = await listening(app)
    peer = await Peer.connect(listener.port)
    idle = await Peer.connect(listener.port)
    try:
        assert (await idle.request("GET", "/")).status == 200
        slow = peer.open("GET", "/slow")
        await asyncio.sleep(0.2)
        # The busy client does not read for a while: it opens a stream before it sees the
        # server's new SETTINGS (as a client whose request crossed them would).
        peer.task.cancel()
        closing = asyncio.ensure_future(listener.close(10.0))
        # The idle connection gets GOAWAY (no error) and is closed at once.
        await idle.until(lambda: idle.eof)
        (goaway,) = idle.of_type(h2.events.ConnectionTerminated)
        assert goaway.error_code == h2.errors.ErrorCodes.NO_ERROR and goaway.last_stream_id == 1
        late = peer.open("GET", "/")
        peer.task = asyncio.ensure_future(peer._read())
        # The busy one says it takes no new streams, and refuses the one that crossed.
        await peer.until(lambda: peer.answers[late].done)
        assert peer.answers[late].reset == h2.errors.ErrorCodes.REFUSED_STREAM
        assert peer.answers[late].status == 0
        assert peer.h2.remote_settings.max_concurrent_streams == 0
        assert not closing.done() and not peer.of_type(h2.events.ConnectionTerminated)
        release.set()
        await peer.until(lambda: peer.eof)
        answer = peer.answers[slow]
        assert (answer.status, bytes(answer.body), answer.ended) == (200, b"done", True)
        (goaway,) = peer.of_type(h2.events.ConnectionTerminated)
        assert goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert goaway.last_stream_id == slow  # the refused stream was never processed
        await asyncio.wait_for(closing, 5)
        assert not listener.connections and listener.open == 0
    finally:
        peer.close()
        idle.close()
        await listener.close(1.0)


async def test_a_stream_still_running_after_the_grace_is_cancelled_and_dropped() -> None:
    cancelled = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await asyncio.Event().wait()  # never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise

    listener = await listening(app)
    peer = await Peer.connect(listener.port)
    try:
        stream_id = peer.open("GET", "/")
        await asyncio.sleep(0.2)
        began = time.monotonic()
        await asyncio.wait_for(listener.close(0.5), 5)
        assert 0.4 < time.monotonic() - began < 3
        assert cancelled.is_set()
        await peer.until(lambda: peer.eof)
        assert peer.answers[stream_id].status == 0  # dropped, never answered
        assert not listener.connections and listener.open == 0
    finally:
        peer.close()


@pytest.mark.slow
async def test_an_idle_connection_gets_goaway_after_the_header_timeout(
    server: RunningServer,
) -> None:
    peer = await Peer.connect(server.port)
    try:
        assert (await peer.request("GET", "/health")).status == 200
        began = time.monotonic()
        await peer.until(lambda: peer.eof, timeout_s=5)
        assert 0.8 < time.monotonic() - began < 3.5
        (goaway,) = peer.of_type(h2.events.ConnectionTerminated)
        assert goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
    finally:
        peer.close()


@pytest.mark.slow
async def test_a_connection_busy_with_a_long_poll_is_not_idle(server: RunningServer) -> None:
    peer = await Peer.connect(server.port)
    try:
        await make_stream(peer)
        answer = await peer.request(
            "GET", "/v1/streams/orders/records?seq_num=0&wait=2", S2_HEADERS
        )
        assert answer.status == 200 and not peer.eof  # 2 s > header_timeout (1 s)
    finally:
        peer.close()


async def _goaway_for(port: int, data: bytes) -> h2.events.ConnectionTerminated:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    # What the server sends, read as a client would.
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.data_to_send()
    events: list[h2.events.Event] = []
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(1 << 16), 5)
            if not chunk:
                break
            events += client.receive_data(chunk)
    finally:
        writer.close()
    (goaway,) = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    return goaway


async def test_a_malformed_frame_gets_goaway_protocol_error(server: RunningServer) -> None:
    window_update_of_zero = b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    goaway = await _goaway_for(server.port, PREFACE + EMPTY_SETTINGS + window_update_of_zero)
    assert goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR


async def test_a_preface_not_followed_by_settings_gets_goaway_protocol_error(
    server: RunningServer,
) -> None:
    ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678"
    goaway = await _goaway_for(server.port, PREFACE + ping)
    assert goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert server.listener.open == 0 or await _settles(server)


async def _settles(server: RunningServer) -> bool:
    for _ in range(50):
        if server.listener.open == 0:  # type: ignore[attr-defined]
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_body_longer_than_its_content_length_is_a_connection_error(
    server: RunningServer,
) -> None:
    peer = await Peer.connect(server.port, validate=False)
    try:
        await make_stream(peer)
        stream_id = peer.open(
            "POST",
            "/v1/streams/orders/records",
            S2_HEADERS + JSON_BODY + [(b"content-length", b"5")],
            end=False,
        )
        peer.h2.send_data(stream_id, appended("longer than five"), end_stream=True)
        peer.flush()
        await peer.until(lambda: bool(peer.of_type(h2.events.ConnectionTerminated)))
        (goaway,) = peer.of_type(h2.events.ConnectionTerminated)
        assert goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
        assert peer.answers[stream_id].status == 0
    finally:
        peer.close()


@pytest.mark.slow
async def test_a_header_list_over_64_kib_gets_431_and_the_connection_stays(
    tmp_path: Path,
) -> None:
    # (h2's HPACK encodes 300 KiB slowly: an idle timeout of 1 s could end the connection.)
    async with start(tmp_path, ServerLimits(header_timeout_s=30.0)) as server:
        await _header_lists(server)


async def _header_lists(server: RunningServer) -> None:
    peer = await Peer.connect(server.port)
    try:
        answer = await peer.request("GET", "/health", [(b"x-big", b"a" * (70 * 1024))])
        assert (answer.status, answer.json()["code"]) == (431, "invalid")
        assert (await peer.request("GET", "/health")).status == 200
        # Far over (past the HPACK decoder's bound): the connection is refused.
        peer.open("GET", "/health", [(b"x-huge", b"a" * (300 * 1024))])
        await peer.until(lambda: bool(peer.of_type(h2.events.ConnectionTerminated)))
        (goaway,) = peer.of_type(h2.events.ConnectionTerminated)
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    finally:
        peer.close()


async def test_a_header_block_that_does_not_end_is_cut_at_256_kib(server: RunningServer) -> None:
    """CONTINUATION bomb: HEADERS without END_HEADERS, then CONTINUATION frames of 64 KiB: the
    connection is refused once the block passes 256 KiB, before any end of it arrives (h2 alone
    would hold 64 such frames, 64 MiB with 1 MiB frames)."""

    def frame(kind: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes((kind, 0)) + (1).to_bytes(4, "big") + payload

    continuation = frame(0x9, b"\x00" * 65536)
    goaway = await _goaway_for(
        server.port, PREFACE + EMPTY_SETTINGS + frame(0x1, b"\x00" * 1024) + continuation * 5
    )
    assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


def test_the_header_block_guard_follows_frames_cut_anywhere() -> None:
    from walstream.server.http.frame_guard import HeaderBlockGuard

    def frame(kind: int, flags: int, size: int) -> bytes:
        return size.to_bytes(3, "big") + bytes((kind, flags)) + (1).to_bytes(4, "big") + b"h" * size

    data = frame(0x0, 0x1, 300_000)  # a DATA frame larger than the bound: not a header block
    ending = frame(0x1, 0, 100_000) + frame(0x9, 0, 100_000) + frame(0x9, 0x4, 50_000)
    growing = frame(0x1, 0, 100_000) + frame(0x9, 0, 100_000) + frame(0x9, 0, 100_000)
    for piece in (1, 7, 9, 4096, 1 << 20):
        guard = HeaderBlockGuard(256 * 1024)
        stream = data + ending + data
        assert all(guard.feed(stream[i : i + piece]) for i in range(0, len(stream), piece))
        guard = HeaderBlockGuard(256 * 1024)
        stream = data + growing
        results = [guard.feed(stream[i : i + piece]) for i in range(0, len(stream), piece)]
        assert results[-1] is False
        # Refused as soon as the frame head that passes the bound arrived, before its payload.
        cut = len(data) + 2 * (9 + 100_000) + 9
        assert results.index(False) == (cut - 1) // piece


@pytest.mark.parametrize(
    "headers",
    [
        [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/health"), (b"X-Upper", b"1")],
        [
            (b":method", b"GET"),
            (b":scheme", b"http"),
            (b":path", b"/health"),
            (b"connection", b"x"),
        ],
        [(b":method", b"GET"), (b":path", b"/health")],
        [(b":method", b"GET"), (b":scheme", b"http"), (b"a", b"1"), (b":path", b"/health")],
        [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/health"), (b"a", b"x\r\ny: 1")],
        [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/health"), (b":status", b"200")],
    ],
    ids=["upper-case", "connection", "no-scheme", "pseudo-after", "crlf", "response-pseudo"],
)
async def test_a_malformed_request_gets_rst_stream_protocol_error(
    server: RunningServer, headers: list[tuple[bytes, bytes]]
) -> None:
    peer = await Peer.connect(server.port, validate=False)
    try:
        stream_id = peer.h2.get_next_available_stream_id()
        peer.answers[stream_id] = Answer()
        peer.h2.send_headers(stream_id, headers, end_stream=True)
        peer.flush()
        await peer.until(lambda: peer.answers[stream_id].done)
        assert peer.answers[stream_id].reset == h2.errors.ErrorCodes.PROTOCOL_ERROR
        assert (await peer.request("GET", "/health")).status == 200  # the connection stays
    finally:
        peer.close()


# -- the application ----------------------------------------------------------------------------


async def test_an_application_error_is_a_500_before_the_headers_and_a_reset_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/late":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("the application broke")

    listener = await listening(app)
    try:
        peer = await Peer.connect(listener.port)
        early = await peer.request("GET", "/early")
        assert (early.status, early.json()["code"]) == (500, "other")
        late = await peer.request("GET", "/late")
        assert (late.status, bytes(late.body)) == (200, b"partial")
        assert late.reset == h2.errors.ErrorCodes.INTERNAL_ERROR and not late.ended
        peer.close()
    finally:
        await listener.close(1.0)
    failures = [r for r in caplog.records if r.exc_info and r.exc_info[1] is not None]
    assert [str(r.exc_info[1]) for r in failures if r.exc_info] == ["the application broke"] * 2


async def test_answers_stream_sse_and_drop_connection_headers_and_head_bodies() -> None:
    tick = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/events":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"Content-Type", b"text/event-stream"),
                        (b"connection", b"keep-alive"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b"", "more_body": True})
            await tick.wait()
            await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})
            return
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
        )
        await send({"type": "http.response.body", "body": b"hello"})

    listener = await listening(app)
    try:
        peer = await Peer.connect(listener.port)
        events = peer.open("GET", "/events")
        answer = peer.answers[events]
        await peer.until(lambda: answer.status == 200)  # the head before the first event
        assert answer.headers[b"content-type"] == b"text/event-stream"
        assert b"connection" not in answer.headers
        tick.set()
        await peer.until(lambda: answer.done)
        assert bytes(answer.body) == b"data: 1\n\ndata: 2\n\n" and answer.ended
        head = await peer.request("HEAD", "/")
        assert (head.status, head.headers[b"content-length"], bytes(head.body)) == (200, b"5", b"")
        peer.close()
    finally:
        await listener.close(1.0)


async def test_the_scope_is_asgi_3_over_http_2() -> None:
    scopes: list[dict[str, Any]] = []
    bodies: list[tuple[bytes, bool]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scopes.append(scope)
        while True:
            message = await receive()
            bodies.append((message["body"], message["more_body"]))
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    listener = await listening(app)
    try:
        peer = await Peer.connect(listener.port)
        stream_id = peer.open(
            "POST", "/a%20b/%E2%82%AC/c%2Fd?x=1&y=%20", [(b"x-mixed", b"V")], end=False
        )
        peer.h2.send_data(stream_id, b"hello")
        peer.flush()
        await asyncio.sleep(0.1)
        peer.h2.send_data(stream_id, b" world", end_stream=True)
        peer.flush()
        await peer.until(lambda: peer.answers[stream_id].done)
        assert peer.answers[stream_id].status == 204
        peer.close()
    finally:
        await listener.close(1.0)
    (scope,) = scopes
    assert scope["type"] == "http" and scope["asgi"]["version"] == "3.0"
    assert (scope["http_version"], scope["method"], scope["scheme"]) == ("2", "POST", "http")
    assert scope["path"] == "/a b/€/c/d"
    assert scope["raw_path"] == b"/a%20b/%E2%82%AC/c%2Fd"
    assert scope["query_string"] == b"x=1&y=%20"
    assert (b"x-mixed", b"V") in scope["headers"]
    assert (b"host", b"127.0.0.1") in scope["headers"]
    assert not any(name.startswith(b":") for name, _ in scope["headers"])
    assert scope["server"] == ("127.0.0.1", listener.port)
    assert scope["client"][0] == "127.0.0.1"
    assert b"".join(body for body, _ in bodies) == b"hello world"
    assert bodies[0] == (b"hello", True) and bodies[-1][1] is False


async def test_s2_python_sdk_style_use_keeps_one_connection_and_logs_nothing(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Appends and reads interleaved on one connection answer in S2's shapes with nothing
    logged at warning level (the connection's own bookkeeping stays quiet)."""
    caplog.set_level(logging.WARNING)
    peer = await Peer.connect(server.port)
    try:
        await make_stream(peer)
        for index in range(20):
            answer = await peer.request(
                "POST", "/v1/streams/orders/records", S2_HEADERS + JSON_BODY, appended(f"{index}")
            )
            assert answer.json()["start"]["seq_num"] == index
        tail = await peer.request("GET", "/v1/streams/orders/records/tail", S2_HEADERS)
        assert tail.json()["tail"]["seq_num"] == 20
        assert len(server.listener.connections) == 1  # type: ignore[attr-defined]
    finally:
        peer.close()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- the budgets against hostile clients --------------------------------------------------------


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes((kind, flags))
        + stream_id.to_bytes(4, "big")
        + payload
    )


async def _slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await asyncio.sleep(30)  # work a reset must cancel


async def _events_until_closed(
    reader: asyncio.StreamReader, timeout_s: float = 10.0
) -> list[h2.events.Event]:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.data_to_send()
    events: list[h2.events.Event] = []
    async with asyncio.timeout(timeout_s):
        while chunk := await reader.read(1 << 16):
            try:
                events += client.receive_data(chunk)
            except h2.exceptions.ProtocolError:
                break
    return events


def _resets(first_stream: int, count: int) -> bytes:
    """HEADERS (GET /, END_STREAM, END_HEADERS) then RST_STREAM, ``count`` streams."""
    block = b"\x82\x86\x84" + b"\x41\x01x"  # :method GET, :scheme http, :path /, :authority x
    out = bytearray()
    for number in range(count):
        stream_id = first_stream + 2 * number
        out += _frame(0x1, 0x5, stream_id, block)
        out += _frame(0x3, 0, stream_id, b"\x00\x00\x00\x08")  # CANCEL
    return bytes(out)


async def test_a_connection_past_its_reset_budget_gets_goaway_enhance_your_calm() -> None:
    limits = ServerLimits(max_resets_per_connection=20, max_resets_per_address=1000)
    listener = await listening(_slow_app, limits)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(PREFACE + EMPTY_SETTINGS + _resets(1, 50))
        events = await _events_until_closed(reader)
        writer.close()
        (goaway,) = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        # Every stream's work was cancelled, none is left running.
        await asyncio.sleep(0.2)
        assert not listener.connections
    finally:
        await listener.close(1.0)


async def test_an_address_past_its_reset_budget_is_refused_on_every_connection() -> None:
    """Spread over many connections (each under its own budget), the resets of one address
    still meet one budget: its connections get GOAWAY and a new one is refused (503)."""
    limits = ServerLimits(max_resets_per_connection=100, max_resets_per_address=30)
    listener = await listening(_slow_app, limits)
    try:
        calmed = 0
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(PREFACE + EMPTY_SETTINGS + _resets(1, 10))
            events = await _events_until_closed(reader, 2.0) if calmed else []
            if not calmed:
                try:
                    events = await _events_until_closed(reader, 0.5)
                except TimeoutError:
                    events = []
            writer.close()
            calmed += any(
                isinstance(e, h2.events.ConnectionTerminated)
                and e.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
                for e in events
            )
            if calmed:
                break
        assert calmed
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"server.max_resets_per_address" in answer
    finally:
        await listener.close(1.0)


@pytest.mark.parametrize(
    "frame",
    [
        _frame(0x6, 0, 0, b"\x00" * 8),  # PING
        _frame(0x4, 0, 0, b"\x00\x04\x00\x00\xff\xff"),  # SETTINGS
        _frame(0x2, 0, 1, b"\x00\x00\x00\x00\x10"),  # PRIORITY
    ],
    ids=["ping", "settings", "priority"],
)
async def test_a_control_frame_flood_gets_goaway_enhance_your_calm(frame: bytes) -> None:
    limits = ServerLimits(max_control_frames=100)
    listener = await listening(_slow_app, limits)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(PREFACE + EMPTY_SETTINGS + frame * 500)
        events = await _events_until_closed(reader)
        writer.close()
        (goaway,) = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    finally:
        await listener.close(1.0)


@pytest.mark.slow
async def test_nothing_is_read_while_the_client_does_not_read_its_answers() -> None:
    """A client that floods PINGs and never reads: once the server's socket buffer is full the
    server stops reading, so its memory holds no growing pile of PING answers (the flood
    stops at the client's own socket)."""
    limits = ServerLimits(max_control_frames=10**9)
    listener = await listening(_slow_app, limits)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(PREFACE + EMPTY_SETTINGS)
        ping = _frame(0x6, 0, 0, b"\x00" * 8) * 4096
        sent = 0
        stalled = False
        for _ in range(2000):  # up to ~140 MiB of PINGs: far more than the socket buffers
            writer.write(ping)
            sent += len(ping)
            try:
                await asyncio.wait_for(writer.drain(), 0.5)
            except TimeoutError:
                stalled = True  # the server stopped reading
                break
        assert stalled, f"the server read {sent >> 20} MiB of PINGs it could not answer"
        (connection,) = listener.connections
        assert connection.read_paused
        assert connection.transport.get_write_buffer_size() < 1 << 20  # answers held: bounded
        writer.transport.abort()
    finally:
        await listener.close(1.0)


async def test_an_answer_the_client_takes_nothing_of_is_reset_after_the_send_timeout() -> None:
    sent = asyncio.Event()
    cancelled = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            await send({"type": "http.response.body", "body": b"x" * 200_000})
            sent.set()
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    listener = await listening(app, ServerLimits(send_timeout_s=0.5))
    try:
        peer = await Peer.connect(listener.port)
        peer.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        peer.flush()
        stream_id = peer.open("GET", "/")
        await peer.until(lambda: peer.answers[stream_id].reset is not None)
        assert peer.answers[stream_id].reset == h2.errors.ErrorCodes.CANCEL
        await asyncio.wait_for(cancelled.wait(), 5)  # its work stopped
        # The connection serves on.
        peer.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
        peer.flush()
        peer.close()
    finally:
        await listener.close(1.0)


async def test_answers_not_taken_hold_the_output_budget_and_later_reads_wait_for_room() -> None:
    """A read reserves its answer before building it: with the connection's budget held by an
    answer the client does not take, the next reservation waits (nothing more is built), and
    gets room once the first answer went out."""
    from walstream.server.http import OUTPUT_ROOM

    granted: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        room = await scope["extensions"][OUTPUT_ROOM](1 << 20)
        granted.append(room)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"r" * room})

    limits = ServerLimits(max_connection_output_bytes=1 << 20, send_timeout_s=20.0)
    listener = await listening(app, limits)
    try:
        peer = await Peer.connect(listener.port)
        peer.read_slowly = True  # takes nothing until told
        first = peer.open("GET", "/first")
        await peer.until(lambda: granted == [1 << 20])
        second = peer.open("GET", "/second")
        await asyncio.sleep(0.5)
        assert granted == [1 << 20]  # the second read waits: it built nothing
        peer.read_slowly = False
        peer.acknowledge_all()
        await peer.until(lambda: peer.answers[second].done, timeout_s=20)
        assert granted == [1 << 20, 1 << 20]
        assert len(peer.answers[first].body) == 1 << 20
        peer.close()
    finally:
        await listener.close(1.0)
