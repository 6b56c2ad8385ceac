"""Closed-loop load generation shared by ``bench/peers.py`` and the other HTTP benchmarks.

- :func:`closed_loop`: ``clients`` coroutines each issue one operation, wait for its answer,
  issue the next, for ``seconds``; latency is from the call to the answer.
- :class:`Http1Connection`: a minimal HTTP/1.1 keep-alive client on an asyncio protocol (one
  request in flight per connection, ``Content-Length`` or chunked answers). It parses only what
  it needs, so it costs far less per request than a general client library.
- :class:`H2cConnection`: HTTP/2 over cleartext with prior knowledge (the ``h2`` state machine),
  one stream in flight per connection.
- ``python bench/_loadgen.py noop-http``: a no-op HTTP/1.1 server (prints ``PORT <n>``, answers
  every request with a fixed JSON body). Driving it shows what the client alone can do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

Operation = Callable[[int], Awaitable[int]]
"""One operation of client ``i``; returns how many records it appended."""


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


async def closed_loop(operation: Operation, clients: int, seconds: float) -> dict[str, float]:
    """Run ``clients`` closed loops of ``operation`` for ``seconds``; requests/s, records/s,
    latency percentiles in milliseconds and the CPU this process used per second
    (``client_cpu``). Errors propagate (a benchmark that fails says so)."""
    latencies: list[float] = []
    records = 0
    stop_at = time.perf_counter() + seconds

    async def loop(index: int) -> None:
        nonlocal records
        clock = time.perf_counter
        while clock() < stop_at:
            started = clock()
            appended = await operation(index)  # not `records += await ...`: that reads first
            records += appended
            latencies.append(clock() - started)

    started = time.perf_counter()
    cpu_started = time.process_time()
    await asyncio.gather(*(loop(index) for index in range(clients)))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    latencies.sort()
    return {
        # CPU seconds this process spent per second: near 1.0 means the benchmark's own process
        # (the clients, and the node itself for an in-process run) is saturating its core.
        "client_cpu": cpu / elapsed,
        "requests": len(latencies),
        "requests_per_s": len(latencies) / elapsed,
        "records_per_s": records / elapsed,
        "p50_ms": percentile(latencies, 0.50) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "latencies_ms": [value * 1e3 for value in latencies],
    }


class HttpError(RuntimeError):
    """An answer that is not 2xx (the benchmark stops: it measures successful appends)."""


_HEAD_END = b"\r\n\r\n"
_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:\s*chunked", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection:\s*close", re.IGNORECASE)


class _Http1Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None
        self.closing = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._try_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("server closed the connection")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)

    def _try_complete(self) -> None:
        if self.waiter is None or self.waiter.done():
            return
        head_end = self.buffer.find(_HEAD_END)
        if head_end < 0:
            return
        head = bytes(self.buffer[:head_end])
        body_start = head_end + 4
        length = _LENGTH.search(head)
        if length is not None:
            end = body_start + int(length.group(1))
            if len(self.buffer) < end:
                return
            body = bytes(self.buffer[body_start:end])
        elif _CHUNKED.search(head):
            parsed = _dechunk(self.buffer, body_start)
            if parsed is None:
                return
            body, end = parsed
        else:
            end, body = body_start, b""
        del self.buffer[:end]
        self.closing = _CLOSE.search(head) is not None
        status = int(head[9:12])
        self.waiter.set_result((status, body))


def _dechunk(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    body = bytearray()
    position = start
    while True:
        line_end = buffer.find(b"\r\n", position)
        if line_end < 0:
            return None
        size = int(bytes(buffer[position:line_end]).split(b";")[0], 16)
        chunk_start = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n", chunk_start)
            return None if trailer_end < 0 else (bytes(body), trailer_end + 2)
        if len(buffer) < chunk_start + size + 2:
            return None
        body += buffer[chunk_start : chunk_start + size]
        position = chunk_start + size + 2


class Http1Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, protocol: _Http1Protocol, host: str, port: int) -> None:
        self._protocol = protocol
        self._host, self._port = host, port
        self._authority = f"{host}:{port}".encode()
        self.reconnects = 0
        """Connections the server closed between requests (``connection: close``, an idle
        timeout, or an idle connection closed for a new one), reopened for the next request."""

    @classmethod
    async def open(cls, host: str, port: int) -> Http1Connection:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(_Http1Protocol, host, port)
        return cls(protocol, host, port)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """Send one request and return (status, body); raises HttpError on a non-2xx status."""
        protocol = self._protocol
        if protocol.closing or protocol.lost is not None:
            # Closed by the server between requests (``connection: close``, or an idle
            # keep-alive timeout): nothing was in flight, so a new connection is safe.
            protocol.transport.close()  # type: ignore[union-attr]
            loop = asyncio.get_running_loop()
            _, protocol = await loop.create_connection(_Http1Protocol, self._host, self._port)
            self._protocol = protocol
            self.reconnects += 1
        if protocol.lost is not None:
            raise protocol.lost
        lines = [f"{method} {path} HTTP/1.1".encode(), b"host: " + self._authority]
        lines += [f"{name}: {value}".encode() for name, value in (headers or {}).items()]
        lines.append(b"content-length: %d" % len(body))
        protocol.waiter = asyncio.get_running_loop().create_future()
        assert protocol.transport is not None
        protocol.transport.write(b"\r\n".join(lines) + _HEAD_END + body)
        status, answer = await protocol.waiter
        if not 200 <= status < 300:
            raise HttpError(f"{method} {path}: {status} {answer[:300]!r}")
        return status, answer

    def close(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.close()


class H2cConnection:
    """One HTTP/2 connection with prior knowledge (no TLS, no upgrade), one stream at a time."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        import h2.config
        import h2.connection

        self._reader = reader
        self._writer = writer
        self._authority = f"{host}:{port}"
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self._h2.initiate_connection()
        writer.write(self._h2.data_to_send())

    @classmethod
    async def open(cls, host: str, port: int) -> H2cConnection:
        reader, writer = await asyncio.open_connection(host, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, host, port)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        connection = self._h2
        stream_id = connection.get_next_available_stream_id()
        request_headers = [
            (":method", method),
            (":path", path),
            (":scheme", "http"),
            (":authority", self._authority),
            ("content-length", str(len(body))),
            *((headers or {}).items()),
        ]
        connection.send_headers(stream_id, request_headers, end_stream=not body)
        answer = _H2Answer()
        # The body goes out in frames of at most the server's frame size, as its flow-control
        # windows allow (a 100-record batch is larger than the default 64 KiB window).
        sent = 0
        while sent < len(body) and not answer.done:
            room = min(
                connection.local_flow_control_window(stream_id),
                connection.max_outbound_frame_size,
                len(body) - sent,
            )
            if room > 0:
                connection.send_data(
                    stream_id, body[sent : sent + room], end_stream=sent + room == len(body)
                )
                sent += room
                continue
            self._writer.write(connection.data_to_send())
            await self._receive(stream_id, answer)
        self._writer.write(connection.data_to_send())
        while not answer.done:
            await self._receive(stream_id, answer)
        if not 200 <= answer.status < 300:
            raise HttpError(f"{method} {path}: {answer.status} {bytes(answer.body[:300])!r}")
        return answer.status, bytes(answer.body)

    async def _receive(self, stream_id: int, answer: _H2Answer) -> None:
        """Read once from the server and apply what came (the answer, window updates)."""
        import h2.events

        connection = self._h2
        data = await self._reader.read(65536)
        if not data:
            raise ConnectionResetError("server closed the HTTP/2 connection")
        for event in connection.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                answer.status = int(dict(event.headers)[":status"])
            elif isinstance(event, h2.events.DataReceived):
                answer.body += event.data
                connection.acknowledge_received_data(event.flow_controlled_length, stream_id)
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
                answer.done = True
            elif isinstance(event, h2.events.StreamReset):
                raise HttpError(f"stream {event.stream_id} reset ({event.error_code})")
        pending = connection.data_to_send()
        if pending:
            self._writer.write(pending)

    def close(self) -> None:
        self._writer.close()


class _H2Answer:
    __slots__ = ("body", "done", "status")

    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()
        self.done = False


class RespError(RuntimeError):
    """A Redis error reply."""


def _resp_end(buffer: bytearray, position: int) -> int | None:
    """The end of the RESP2 reply starting at ``position``, or None if it is not complete."""
    line_end = buffer.find(b"\r\n", position)
    if line_end < 0:
        return None
    kind = buffer[position]
    if kind in b"+:":
        return line_end + 2
    if kind == ord("-"):
        raise RespError(bytes(buffer[position + 1 : line_end]).decode(errors="replace"))
    count = int(buffer[position + 1 : line_end])
    if kind == ord("$"):
        end = line_end + 2 + max(count, 0) + (2 if count >= 0 else 0)
        return end if len(buffer) >= end else None
    if kind == ord("*"):
        end: int | None = line_end + 2
        for _ in range(max(count, 0)):
            assert end is not None
            end = _resp_end(buffer, end)
            if end is None:
                return None
        return end
    raise RespError(f"unexpected RESP reply type {chr(kind)!r}")


def resp_command(*parts: bytes) -> bytes:
    """One command in RESP2 (an array of bulk strings)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class _RespProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.expected = 0
        self.position = 0
        self.waiter: asyncio.Future[None] | None = None
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        try:
            while self.expected:
                end = _resp_end(self.buffer, self.position)
                if end is None:
                    return
                self.position = end
                self.expected -= 1
        except RespError as error:
            waiter.set_exception(error)
            return
        del self.buffer[: self.position]
        self.position = 0
        waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionResetError("redis closed the connection"))


class RespConnection:
    """A minimal Redis (RESP2) connection: send pre-encoded commands, wait for their replies.

    The replies are checked for errors and counted, not decoded: the benchmark needs only to know
    that every command succeeded, and redis-py without hiredis spends more CPU decoding a
    100-command ``MULTI``/``EXEC`` than Redis spends running it."""

    def __init__(self, protocol: _RespProtocol) -> None:
        self._protocol = protocol

    @classmethod
    async def open(cls, host: str, port: int) -> RespConnection:
        _, protocol = await asyncio.get_running_loop().create_connection(_RespProtocol, host, port)
        return cls(protocol)

    async def send(self, commands: bytes, replies: int) -> None:
        """Send ``commands`` (RESP bytes) and wait for ``replies`` top-level replies."""
        protocol = self._protocol
        protocol.expected = replies
        protocol.waiter = asyncio.get_running_loop().create_future()
        protocol.transport.write(commands)
        await protocol.waiter

    def close(self) -> None:
        self._protocol.transport.close()


class _NatsProtocol(asyncio.Protocol):
    """Core NATS protocol: counts ``MSG`` deliveries to our inbox and checks each PubAck."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.expected = 0
        self.waiter: asyncio.Future[None] | None = None
        self.transport: Any = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _fail(self, error: Exception) -> None:
        for future in (self.ready, self.waiter):
            if future is not None and not future.done():
                future.set_exception(error)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        buffer = self.buffer
        position = 0
        while True:
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                break
            line = bytes(buffer[position:line_end])
            if line.startswith(b"MSG "):
                size = int(line.rsplit(b" ", 1)[1])
                end = line_end + 2 + size + 2
                if len(buffer) < end:
                    break
                ack = bytes(buffer[line_end + 2 : line_end + 2 + size])
                position = end
                if b'"error"' in ack:
                    self._fail(RuntimeError(f"JetStream refused a publish: {ack!r}"))
                    continue
                self.expected -= 1
                if self.expected == 0 and self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(None)
                continue
            position = line_end + 2
            if line.startswith(b"PING"):
                self.transport.write(b"PONG\r\n")
            elif line.startswith(b"PONG") and not self.ready.done():
                self.ready.set_result(None)
            elif line.startswith(b"-ERR"):
                self._fail(RuntimeError(line.decode(errors="replace")))
        del buffer[:position]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("nats-server closed the connection"))


class NatsPublisher:
    """A minimal JetStream publisher on the core NATS protocol: ``PUB`` with a reply subject,
    then wait for one PubAck per message (an ack carrying ``"error"`` raises).

    nats-py's ``js.publish`` makes a future, an inbox subject and a JSON decode per message;
    this sends pre-encoded ``PUB`` frames and only scans the acks, so it is not the bottleneck."""

    def __init__(self, protocol: _NatsProtocol, inbox: bytes) -> None:
        self._protocol = protocol
        self._inbox = inbox

    @classmethod
    async def open(cls, host: str, port: int, inbox: str) -> NatsPublisher:
        _, protocol = await asyncio.get_running_loop().create_connection(_NatsProtocol, host, port)
        connect = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true}\r\n'
        protocol.transport.write(connect + f"SUB {inbox}.* 1\r\nPING\r\n".encode())
        await protocol.ready
        return cls(protocol, inbox.encode())

    def frames(self, subject: str, payload: bytes, count: int) -> bytes:
        """``count`` PUB frames of ``payload`` to ``subject``, acks to our inbox."""
        head = f"PUB {subject} ".encode()
        return b"".join(
            head + self._inbox + b".%d %d\r\n" % (i, len(payload)) + payload + b"\r\n"
            for i in range(count)
        )

    async def publish(self, frames: bytes, count: int) -> None:
        protocol = self._protocol
        protocol.expected = count
        protocol.waiter = asyncio.get_running_loop().create_future()
        protocol.transport.write(frames)
        await protocol.waiter

    def close(self) -> None:
        self._protocol.transport.close()


class ServerProcess:
    """A server child process, ready once a line of its output (stdout and stderr) matches
    ``pattern``; its port is ``port`` when given, else the pattern's group 1. The output goes
    on to ``server.log`` in ``cwd``."""

    def __init__(
        self,
        command: list[str],
        pattern: str,
        *,
        cwd: Path,
        port: int | None = None,
        timeout_s: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = cwd / "server.log"
        self._log_file = self.log.open("w")
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        regex = re.compile(pattern)
        assert self.process.stdout is not None
        output = self.process.stdout
        found = threading.Event()
        self.port = 0

        def drain() -> None:
            # Read until the server exits, so a chatty server never blocks on a full pipe.
            for line in output:
                self._log_file.write(line)
                if not found.is_set():
                    match = regex.search(line)
                    if match:
                        self.port = port if port is not None else int(match.group(1))
                        found.set()
            found.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        found.wait(timeout_s)
        if not self.port:
            self.stop()
            raise RuntimeError(f"{command[0]} did not become ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._drain.join(timeout=5)
        self._log_file.close()


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def noop_http_server_command() -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "noop-http"]


_NOOP_BODY = (
    b'{"start":{"seq_num":0,"timestamp":0},"end":{"seq_num":1,"timestamp":0},'
    b'"tail":{"seq_num":1,"timestamp":0}}'
)
_NOOP_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    % len(_NOOP_BODY)
) + _NOOP_BODY


class _NoopServer(asyncio.Protocol):
    """Answers every request at once (Content-Length bodies only, what our client sends)."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(_HEAD_END)
            if head_end < 0:
                return
            length = _LENGTH.search(bytes(self.buffer[:head_end]))
            end = head_end + 4 + (int(length.group(1)) if length else 0)
            if len(self.buffer) < end:
                return
            del self.buffer[:end]
            self.transport.write(_NOOP_ANSWER)


async def _serve_noop() -> None:
    server = await asyncio.get_running_loop().create_server(_NoopServer, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


def use_uvloop() -> str:
    """Install uvloop's event loop policy if it is installed; the loop's name."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


if __name__ == "__main__":
    if sys.argv[1:] == ["noop-http"]:
        use_uvloop()
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve_noop())
    else:
        sys.exit("usage: _loadgen.py noop-http")
