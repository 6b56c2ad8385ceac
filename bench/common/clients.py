"""Lean asyncio clients the load generator drives: they parse only what a benchmark needs, so
they cost far less per request than a general client library and the client is not what is
measured.

- :class:`Http1Connection`: HTTP/1.1 keep-alive, one request in flight per connection
  (``Content-Length`` or chunked answers), reopened when the server closed it between requests;
- :class:`H2cConnection`: HTTP/2 over cleartext with prior knowledge (the ``h2`` state
  machine), one stream in flight per connection;
- :class:`RespConnection`: Redis (RESP2), pre-encoded commands, replies checked and counted;
- :class:`NatsPublisher`: JetStream publishes on the core NATS protocol, one PubAck awaited per
  message.
"""

from __future__ import annotations

import asyncio
import re
import socket
from typing import Any

__all__ = [
    "H2cConnection",
    "Http1Connection",
    "HttpError",
    "NatsPublisher",
    "RespConnection",
    "RespError",
    "resp_command",
]


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
                # header_encoding="utf-8": names and values arrive as str (h2 types them bytes)
                headers: dict[Any, Any] = dict(event.headers or ())
                answer.status = int(headers[":status"])
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
        bulk_end = line_end + 2 + max(count, 0) + (2 if count >= 0 else 0)
        return bulk_end if len(buffer) >= bulk_end else None
    if kind == ord("*"):
        element_end: int | None = line_end + 2
        for _ in range(max(count, 0)):
            assert element_end is not None
            element_end = _resp_end(buffer, element_end)
            if element_end is None:
                return None
        return element_end
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
