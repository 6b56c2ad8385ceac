"""One connection of the listener: HTTP/1.1 (and 1.0) parsed by ``httptools`` and served to the
ASGI application, or handed to HTTP/2 (:class:`~walstream.server.http.http2.Http2Connection`)
when it opens with the client preface (h2c with prior knowledge, or HTTP/2 chosen by ALPN).

Admission (:meth:`Connection.connection_made`, every connection starts here): past
``max_connections`` the longest-idle connection is closed to make room, and when none is idle
the new one gets ``503``; past ``max_connections_per_address`` for its remote address it is
admitted on probation: its first request must carry node credentials
(:mod:`walstream.server.node_auth`), else it gets ``503``; an address whose HTTP/2 reset budget
is spent gets ``503``. A stalled answer (the client takes none of it for ``send_timeout``)
closes the connection and cancels its request.

Per connection (:class:`Connection`, an :class:`asyncio.Protocol`): the parser's callbacks turn
bytes into :class:`~walstream.server.http.exchange.Exchange` objects (one request and
its answer) queued in arrival order; one task per connection (not one per request) runs the
application on them one at a time, so pipelined requests are answered in order. Reading pauses
while more than ``HIGH_WATER_BYTES`` of body or ``MAX_PIPELINED`` requests wait for the
application, and resumes as it takes them.

The connection answers on its own, in S2's error shape, and closes: ``400`` for a request it
cannot parse, ``431`` for a request head over ``MAX_HEAD_BYTES``, ``500`` when the application
fails before it answered (after that the connection is closed mid-answer). A request that asks
to switch protocols (``Upgrade:``, as curl's ``h2c``) is served as HTTP/1.1 (RFC 9110 7.8).

The application runs in the connection's task, one request at a time: a per-request context
(such as a ``contextvars`` value) set by one request is seen by the next on the same connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote_to_bytes

import httptools

from walstream.server.http.exchange import Exchange
from walstream.server.http.flow import WriteFlow
from walstream.server.http.framing import LINGER_S, PREFACE, error_answer
from walstream.server.http.http2 import Http2Connection
from walstream.server.http.request_body import OUTPUT_ROOM
from walstream.server.http.state import OutputBudget

if TYPE_CHECKING:
    from walstream.server.http.state import ServingState

__all__ = ["Connection"]

log = logging.getLogger("walstream.server.http")

#: Largest request head (request line and headers), in bytes; a longer one gets 431.
MAX_HEAD_BYTES = 64 * 1024
#: Reading pauses while this many body bytes wait for the application ...
HIGH_WATER_BYTES = 256 * 1024
#: ... and resumes once at most this many do.
LOW_WATER_BYTES = 64 * 1024
#: Reading pauses while this many pipelined requests wait for their turn.
MAX_PIPELINED = 16

_METHODS = {
    method.encode(): method
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT", "TRACE")
}

# Connection states.
_SNIFF = 0  # deciding between HTTP/1.1 and the HTTP/2 preface
_HTTP1 = 1
_HTTP2 = 2  # handed to Http2Connection, the transport's protocol from then on
_CLOSING = 3  # lingering after the last answer, or refused: input is dropped


class _HeadTooLarge(Exception):
    pass


class _Refused(Exception):
    """A request on probation without node credentials: its refusal is queued."""


class _Failure:
    """A request that cannot be served (malformed, head too large): its answer, written in
    its turn, after which the connection closes."""

    __slots__ = ("answer",)

    def __init__(self, answer: bytes) -> None:
        self.answer = answer


class Connection(WriteFlow):
    """One accepted connection (see the module's docstring)."""

    __slots__ = (
        "buffered",
        "client",
        "counted",
        "current",
        "draining",
        "expect",
        "head_deadline",
        "head_size",
        "headers",
        "host",
        "in_head",
        "linger_handle",
        "listener",
        "output",
        "parser",
        "parsing",
        "pending",
        "probation",
        "raw_body_left",
        "raw_head",
        "reading_paused",
        "server_address",
        "sniffed",
        "state",
        "task",
        "too_large",
        "transport",
        "url",
        "waiter",
    )

    def __init__(self, listener: ServingState) -> None:
        self.listener = listener
        self.loop = listener.loop
        self.host = ""
        """The remote address (counted in the listener's per-address table while open)."""
        self.probation = False
        """Over ``max_connections_per_address``: its first request must be a node's."""
        self.output = OutputBudget(listener.limits.max_connection_output_bytes)
        self.transport: asyncio.Transport | None = None
        self.state = _SNIFF
        self.sniffed = b""
        self.parser: httptools.HttpRequestParser | None = None
        self.client: tuple[str, int] | None = None
        self.server_address: tuple[str, int] | None = None
        self.counted = False
        self.closed = False
        self.draining = False
        self.task: asyncio.Task[Any] | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.pending: deque[Exchange | _Failure] = deque()
        self.current: Exchange | None = None
        self.parsing: Exchange | None = None
        self.buffered = 0
        """Body bytes received and not yet taken by the application."""
        self.reading_paused = False
        self.writing_paused = False
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.head_deadline = 0.0
        self.linger_handle: asyncio.TimerHandle | None = None
        self.in_head = True
        self.raw_head = 0
        self.head_size = 0
        self.too_large = False
        self.raw_body_left = 0
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's, only alike.
        self.transport = cast(asyncio.Transport, transport)
        listener = self.listener
        limits = listener.limits
        listener.connections.add(self)
        self.client = _address(transport.get_extra_info("peername"))
        self.server_address = _address(transport.get_extra_info("sockname"))
        host = "" if self.client is None else self.client[0]
        refusal = None
        if listener.closing:
            refusal = "this server is shutting down; retry on another node"
        elif listener.open >= limits.max_connections and not listener.make_room():
            refusal = (
                f"this server already has {listener.open} connections open, none of them idle "
                "(server.max_connections); retry later or raise the bound"
            )
        elif host and host in listener.addresses:
            address = listener.addresses[host]
            if address.resets.exhausted(self.loop.time()):
                refusal = (
                    "this address reset too many HTTP/2 streams (server.max_resets_per_address); "
                    "retry later"
                )
            elif address.connections >= limits.max_connections_per_address:
                self.probation = True
        if refusal is not None:
            listener.refused += 1
            self.linger(error_answer(503, "unavailable", refusal, retry_after=True))
            return
        listener.open += 1
        self.counted = True
        if host:
            self.host = host
            listener.address(host).connections += 1
        listener.mark_idle(self)
        self.head_deadline = self.loop.time() + limits.header_timeout_s

    def uncount(self) -> None:
        """Leave the listener's counts (the connection closed, or was handed to HTTP/2)."""
        if self.counted:
            self.counted = False
            listener = self.listener
            listener.open -= 1
            listener.mark_busy(self)
            if self.host:
                address = listener.addresses.get(self.host)
                if address is not None:
                    address.connections -= 1
                    listener.forget_address(self.host)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state == _HTTP1:
            self.feed(data)
        elif state == _SNIFF:
            received = self.sniffed + data if self.sniffed else data
            if len(received) < len(PREFACE) and PREFACE.startswith(received):
                self.sniffed = received  # could still be the preface: wait for more
                return
            self.sniffed = b""
            if received.startswith(PREFACE):
                self.hand_to_http2(received)
                return
            self.state = _HTTP1
            self.parser = httptools.HttpRequestParser(self)
            self.feed(received)
        # _CLOSING: what the client still sends is dropped

    def eof_received(self) -> bool | None:
        return None  # the client is done: close (an exchange in progress sees http.disconnect)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.state = _CLOSING
        self.uncount()
        # The parser holds this protocol (its callbacks): drop it, so the connection and what it
        # buffered are freed by reference counting, not at the next full collection.
        self.parser = None
        self.output.wake_all()  # a read waiting for output room sees it is gone
        if self.linger_handle is not None:
            self.linger_handle.cancel()
            self.linger_handle = None
        for item in (self.current, *self.pending):
            if isinstance(item, Exchange):
                item.gone = True
                if item.waiters:
                    item.wake()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self.wake_drained()
        if self.task is None or self.task.done():
            self.listener.connection_closed(self)

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.head_size = 0
        self.expect = False

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_size += len(url)
        if self.head_size > MAX_HEAD_BYTES:
            self.too_large = True
            raise _HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if self.head_size > MAX_HEAD_BYTES:
            self.too_large = True
            raise _HeadTooLarge
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None
        method_bytes = parser.get_method()
        method = _METHODS.get(method_bytes) or method_bytes.decode("ascii")
        version = parser.get_http_version()
        url = self.url
        if url[:1] == b"/":
            raw_path, _, query = url.partition(b"?")
        elif url == b"*":
            raw_path, query = url, b""
        else:  # absolute form (RFC 9112 3.2.2)
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path or b"/", parsed.query or b""
        if b"%" in raw_path or not raw_path.isascii():
            path = unquote_to_bytes(raw_path).decode("utf-8", "replace")
        else:
            path = raw_path.decode("ascii")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": self.listener.asgi_version,
            "http_version": version,
            "server": self.server_address,
            "client": self.client,
            "scheme": self.listener.scheme,
            "method": method,
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": self.headers,
        }
        exchange = Exchange(
            self, scope, parser.should_keep_alive(), self.expect and version == "1.1"
        )
        scope["extensions"] = {OUTPUT_ROOM: exchange.output_room}
        if self.probation:
            self.probation = False
            credentials = self.listener.node_credentials
            target = url.decode("latin-1")
            if (
                credentials is None
                or credentials.verify_headers(method, target, self.headers) is None
            ):
                self.listener.refused += 1
                self.state = _CLOSING
                self.pending.append(
                    _Failure(
                        error_answer(
                            503,
                            "unavailable",
                            "this address already holds server.max_connections_per_address "
                            "connections; close some, or retry later",
                            retry_after=True,
                        )
                    )
                )
                self.start_serving()
                raise _Refused
        self.listener.mark_busy(self)
        self.parsing = exchange
        self.in_head = False
        self.raw_head = 0
        self.pending.append(exchange)
        self.start_serving()

    def start_serving(self) -> None:
        """Wake the connection's task (or start it) for what ``pending`` holds."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)
        elif self.task is None:
            self.task = self.loop.create_task(self.serve(), name="walstream-http1-connection")
            self.task.add_done_callback(self.served)

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        assert exchange is not None
        exchange.chunks.append(body)
        self.buffered += len(body)
        if exchange.waiters:
            exchange.wake()

    def on_message_complete(self) -> None:
        exchange = self.parsing
        assert exchange is not None
        exchange.complete = True
        if exchange.waiters:
            exchange.wake()
        self.parsing = None
        self.in_head = True

    # -- reading -----------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self.raw_body_left:
            data = self.take_raw_body(data)
            if not data:
                return
        if self.in_head:
            self.raw_head += len(data)
        parser = self.parser
        assert parser is not None
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.ignore_upgrade(data, int(upgrade.args[0]))
        except httptools.HttpParserError as error:
            if self.state == _CLOSING:  # refused on probation (_Refused): its answer is queued
                if self.transport is not None and not self.reading_paused:
                    self.reading_paused = True
                    self.transport.pause_reading()
                return
            if self.too_large:
                self.fail(431, "the request head is over 64 KiB (request line and headers)")
            else:
                reason = str(error) or type(error).__name__
                self.fail(400, f"malformed HTTP/1.1 request: {reason[:200]}")
            return
        if self.state != _HTTP1:
            return
        if self.in_head and self.raw_head > 2 * MAX_HEAD_BYTES:
            self.fail(431, "the request head is over 64 KiB (request line and headers)")
            return
        if not self.reading_paused and (
            self.buffered > HIGH_WATER_BYTES or len(self.pending) > MAX_PIPELINED
        ):
            self.reading_paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def ignore_upgrade(self, data: bytes, offset: int) -> None:
        """A request asked to switch protocols (``Upgrade:``, such as curl's ``h2c``): it is
        served as HTTP/1.1, as RFC 9110 7.8 allows. The parser took it as the end of HTTP/1.1
        and skipped its body; that body (``Content-Length`` bytes) is read here."""
        exchange = self.pending[-1] if self.pending else None
        if not isinstance(exchange, Exchange) or exchange.scope["method"] == "CONNECT":
            self.fail(400, "CONNECT is not supported")
            return
        length = 0
        for name, value in exchange.scope["headers"]:
            if name == b"transfer-encoding":
                self.fail(400, "an Upgrade request with a chunked body is not supported")
                return
            if name == b"content-length" and value.strip().isdigit():
                length = int(value)
        rest = data[offset:]
        if length:
            exchange.complete = False
            self.parsing = exchange
            self.in_head = False
            self.raw_body_left = length
            rest = self.take_raw_body(rest)
        if rest:
            self.feed(rest)

    def take_raw_body(self, data: bytes) -> bytes:
        """Body bytes of an ignored upgrade; returns what follows them."""
        exchange = self.parsing
        assert exchange is not None
        body, rest = data[: self.raw_body_left], data[self.raw_body_left :]
        self.raw_body_left -= len(body)
        self.on_body(body)
        if not self.raw_body_left:
            self.on_message_complete()
        return rest

    def maybe_resume(self) -> None:
        if (
            self.reading_paused
            and self.buffered <= LOW_WATER_BYTES
            and len(self.pending) <= MAX_PIPELINED // 2
            and self.state == _HTTP1
            and (not self.draining or self.parsing is not None)
        ):
            self.reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def fail(self, status: int, message: str) -> None:
        """The rest of the input cannot be read: answer ``status`` in the request's turn and
        close. A request whose body broke off sees ``http.disconnect``."""
        self.state = _CLOSING
        broken = self.parsing
        if broken is not None:
            if broken is self.current:
                broken.gone = True
                if broken.waiters:
                    broken.wake()
            else:
                self.pending.remove(broken)
        self.parsing = None
        self.pending.append(_Failure(error_answer(status, "invalid", message)))
        if self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)
        elif self.task is None:
            self.task = self.loop.create_task(self.serve(), name="walstream-http1-connection")
            self.task.add_done_callback(self.served)

    # -- writing -----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.closed:
            assert self.transport is not None
            self.transport.write(data)

    def write_pieces(self, pieces: list[bytes]) -> None:
        if not self.closed:
            assert self.transport is not None
            self.transport.writelines(pieces)

    # -- serving -----------------------------------------------------------------------------

    async def serve(self) -> None:
        """The connection's task: run the application on each request in turn."""
        loop = self.loop
        pending = self.pending
        while True:
            if pending:
                item = pending.popleft()
            elif self.closed or self.draining or self.state != _HTTP1:
                return
            else:
                waiter = loop.create_future()
                self.waiter = waiter
                try:
                    await waiter
                finally:
                    self.waiter = None
                continue
            if isinstance(item, _Failure):
                self.linger(item.answer)
                return
            if not await self.run(item):
                # A request whose body broke off is answered by its failure, unless its own
                # answer began.
                failure = pending[0] if pending else None
                if isinstance(failure, _Failure) and not item.head_written:
                    self.linger(failure.answer)
                elif not self.closed:
                    self.linger(None)
                return
            if self.reading_paused:
                self.maybe_resume()
            if not pending:
                self.head_deadline = loop.time() + self.listener.limits.header_timeout_s
                if self.counted:
                    self.listener.mark_idle(self)

    async def run(self, exchange: Exchange) -> bool:
        """Serve one request; True when the connection may carry the next one."""
        self.current = exchange
        try:
            await self.listener.app(exchange.scope, exchange.receive, exchange.send)
        except Exception:
            log.exception(
                "%s %s failed in the application", exchange.scope["method"], exchange.scope["path"]
            )
            if exchange.started:
                return False  # the answer began: it cannot be completed
            self.internal_error(exchange)
        else:
            if not exchange.finished:
                if exchange.started:
                    log.error(
                        "%s %s: the application returned before its answer was complete",
                        exchange.scope["method"],
                        exchange.scope["path"],
                    )
                    return False
                log.error(
                    "%s %s: the application returned without answering",
                    exchange.scope["method"],
                    exchange.scope["path"],
                )
                self.internal_error(exchange)
        finally:
            self.current = None
            exchange.settle_all()
            # The scope's extension holds the exchange (a reference cycle): drop it, so the
            # exchange is freed by reference counting, not by the cyclic collector.
            exchange.scope.pop("extensions", None)
        if exchange.chunks:  # body the application did not read
            self.buffered -= sum(len(chunk) for chunk in exchange.chunks)
            exchange.chunks.clear()
        return not (exchange.close_after or exchange.gone or self.closed or self.draining)

    def internal_error(self, exchange: Exchange) -> None:
        body = b'{"code":"other","message":"internal error; the server log has the details"}'
        exchange.start(
            500,
            [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        )
        exchange.body(body, False)

    def served(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("an HTTP/1.1 connection failed", exc_info=task.exception())
            if not self.closed:
                assert self.transport is not None
                self.transport.abort()
        if self.closed:
            self.listener.connection_closed(self)

    # -- closing -----------------------------------------------------------------------------

    def linger(self, answer: bytes | None) -> None:
        """Write ``answer`` (if any), then close: the write side at once, the connection once
        the client closed its side too or ``LINGER_S`` passed (see ``LINGER_S``)."""
        self.state = _CLOSING
        transport = self.transport
        assert transport is not None
        if self.closed:
            return
        if answer:
            transport.write(answer)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
        self.linger_handle = self.loop.call_later(LINGER_S, transport.close)

    def hand_to_http2(self, received: bytes) -> None:
        """The connection speaks HTTP/2: an :class:`Http2Connection` takes the transport (and
        this connection's place in the listener) from here on."""
        transport = self.transport
        assert transport is not None
        listener = self.listener
        if self.probation:
            # Over max_connections_per_address: only node requests (HTTP/1.1) are admitted.
            listener.refused += 1
            self.state = _CLOSING
            transport.close()
            return
        self.state = _HTTP2
        connection = Http2Connection(listener, transport, self.client, self.server_address)
        connection.counted, self.counted = self.counted, False
        connection.host, self.host = self.host, ""
        listener.mark_busy(self)
        listener.connections.discard(self)
        listener.connections.add(connection)
        if connection.counted:
            listener.mark_idle(connection)  # no stream yet: it gives way when the server is full
        transport.set_protocol(connection)
        connection.start(received)

    def check_head_deadline(self, now: float) -> None:
        """Close the connection when it waited for a request head past ``header_timeout``
        (idle since its previous answer, or slow to send a head)."""
        if (
            self.state in (_SNIFF, _HTTP1)
            and self.current is None
            and not self.pending
            and self.head_deadline <= now
            and not self.closed
        ):
            assert self.transport is not None
            self.state = _CLOSING
            self.transport.close()

    def evict(self) -> None:
        """The server is full and this connection is idle: close it for a new one."""
        if self.closed or self.current is not None or self.pending:
            return
        self.state = _CLOSING
        assert self.transport is not None
        self.transport.close()

    def stalled(self) -> None:
        """The client took nothing of an answer for ``send_timeout``: drop the connection and
        cancel the request in progress (its work stops)."""
        log.info(
            "HTTP/1.1 connection from %s took nothing for %.0f s (server.send_timeout); closed",
            self.client,
            self.listener.limits.send_timeout_s,
        )
        self.abort()

    def shutdown(self) -> None:
        """The listener is closing: close now when idle, else after the answer in progress
        (which says ``connection: close`` unless it began already)."""
        self.draining = True
        if self.closed:
            return
        transport = self.transport
        assert transport is not None
        if self.state != _HTTP1 or (self.current is None and not self.pending):
            self.state = _CLOSING
            transport.close()
            return
        if self.parsing is None and not self.reading_paused:
            # No body is arriving: nothing more is read (requests after this one are dropped;
            # the answer in progress says connection: close).
            self.reading_paused = True
            transport.pause_reading()

    def abort(self) -> None:
        """Shutdown's grace ran out: cancel the request in progress and drop the connection."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.transport is not None and not self.closed:
            self.transport.abort()


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None
