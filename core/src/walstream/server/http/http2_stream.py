"""One request and its answer on an HTTP/2 connection (one stream): the ASGI 3.0 ``receive`` and
``send`` (HTTP spec 2.3) the application gets, on the connection's ``h2`` state machine
(:mod:`walstream.server.http.http2`).

``receive()`` gives the body as its DATA frames arrive (``more_body``) and hands their bytes back
to the client's flow-control windows as it gives them (WINDOW_UPDATE, batched by ``h2``): an
application that does not read holds the client back at one stream window. Once the body was
all given it waits until the client is gone (RST_STREAM, a closed connection) or the answer is
complete, and says ``http.disconnect``; after that what the application sends is dropped (a long
poll or a read session whose client left just ends). It is safe to cancel a ``receive()``.

``send()``: the answer's headers (``:status`` and the application's, lower-cased, without the
connection-specific ones HTTP/2 forbids) are held until its first body bytes, so a small answer
is one HEADERS and one DATA frame in one write. A body goes out in DATA frames within the peer's
frame size and flow-control windows; when they are exhausted ``send()`` waits for the peer's
WINDOW_UPDATE (nothing is buffered beyond what the windows allow), and while the transport's
buffer is over its high-water mark it waits for it to drain. END_STREAM ends the last frame. A
``HEAD``, ``1xx``, ``204`` or ``304`` answer has no body. A body longer than its
``content-length`` is cut, one that ends short resets the stream (the client must not take it as
whole). Response trailers are not supported (the application sends none).

A ``send()`` that makes no progress for ``server.send_timeout`` (no window opened, the socket
did not drain) abandons the stream: RST_STREAM ``CANCEL`` and its task is cancelled. A stream
the client resets is cancelled too (:meth:`Http2Stream.cancel`); it counts against the
connection's streams until its task has ended.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError

from walstream.server.http.request_body import RequestBody

if TYPE_CHECKING:
    import h2.connection

    from walstream.server.http.state import OutputBudget, ServingState


class Http2Link(Protocol):
    """What a stream needs of its HTTP/2 connection."""

    loop: asyncio.AbstractEventLoop
    listener: ServingState
    output: OutputBudget
    h2: h2.connection.H2Connection
    writing_paused: bool
    closed: bool

    def schedule_flush(self) -> None: ...
    def stream_done(self, stream: Http2Stream) -> None: ...
    def flush(self) -> None: ...
    def acknowledge(self, stream_id: int, size: int) -> None: ...
    def reset(self, stream: Http2Stream, code: ErrorCodes) -> None: ...
    async def drained(self, timeout_s: float | None = None) -> bool: ...


__all__ = ["Http2Stream"]

log = logging.getLogger("walstream.server.http")

#: Headers an HTTP/2 message must not carry (RFC 9113 8.2.2); the listener drops them from the
#: application's answer.
CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
_NO_BODY_STATUSES = frozenset((204, 304))
_STATUS_VALUES: dict[int, bytes] = {}


def _status_value(status: int) -> bytes:
    value = _STATUS_VALUES.get(status)
    if value is None:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 999:
            raise ValueError(f"an HTTP status is 100 to 999, got {status!r}")
        value = _STATUS_VALUES[status] = b"%d" % status
    return value


class Http2Stream(RequestBody):
    """One request and its answer: the ASGI ``receive`` and ``send`` of the application."""

    __slots__ = (
        "body_allowed",
        "connection",
        "credit",
        "head",
        "head_request",
        "length_left",
        "scope",
        "started",
        "stream_id",
        "task",
        "window_waiter",
    )

    def __init__(self, connection: Http2Link, stream_id: int, scope: dict[str, Any]) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.scope = scope
        self.head_request = scope["method"] == "HEAD"
        self.start_body()
        self.credit = 0
        """Flow-controlled bytes received and not yet handed back (WINDOW_UPDATE)."""
        self.window_waiter: asyncio.Future[None] | None = None
        self.started = False
        self.head: list[tuple[bytes, bytes]] | None = None
        """The answer's headers, until they go out with its first body bytes."""
        self.body_allowed = True
        self.length_left = -1
        self.task: asyncio.Task[None] | None = None

    def wake_writer(self) -> None:
        waiter = self.window_waiter
        if waiter is not None:
            self.window_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def lose(self) -> None:
        """The client is gone (reset, closed connection): wake whoever waits."""
        self.gone = True
        if self.waiters:
            self.wake()
        if self.window_waiter is not None:
            self.wake_writer()

    def cancel(self) -> None:
        """The client reset the stream, or it stalled: its work stops (the task is cancelled;
        the stream counts until the task has ended)."""
        self.lose()
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            # A task cancelled before its first step never runs its finally: finish the stream
            # when the task is done either way (stream_done runs once).
            task.add_done_callback(self.finished_by_cancel)

    def finished_by_cancel(self, task: asyncio.Task[None]) -> None:
        self.connection.stream_done(self)

    def stalled(self) -> None:
        """The client took nothing of the answer for ``send_timeout``: reset and cancel."""
        log.info(
            "HTTP/2 stream %d took nothing for %.0f s (server.send_timeout); reset",
            self.stream_id,
            self.connection.listener.limits.send_timeout_s,
        )
        if not self.gone:
            self.connection.reset(self, ErrorCodes.CANCEL)
        self.cancel()

    # -- receive -----------------------------------------------------------------------------

    def event_loop(self) -> asyncio.AbstractEventLoop:
        return self.connection.loop

    def output_budgets(self) -> tuple[OutputBudget, OutputBudget, float]:
        listener = self.connection.listener
        return self.connection.output, listener.output, listener.limits.send_timeout_s

    def taken(self, size: int) -> None:
        if self.credit:
            credit, self.credit = self.credit, 0
            self.connection.acknowledge(self.stream_id, credit)

    # -- send --------------------------------------------------------------------------------

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            body = message.get("body", b"")
            more = message.get("more_body", False)
            left = self.body(body, more)
            if left:
                await self.body_rest(body, len(body) - left, more)
            connection = self.connection
            if connection.writing_paused and not connection.closed:
                if not await connection.drained(connection.listener.limits.send_timeout_s):
                    self.stalled()
                    return
            if self.reserved:
                self.settle(len(body))
            return
        if kind == "http.response.start":
            self.start(message["status"], message.get("headers", ()))
        else:
            raise ValueError(f"unexpected ASGI message {kind!r} for an HTTP request")

    def start(self, status: int, headers: Any) -> None:
        if self.started:
            raise RuntimeError("http.response.start sent twice")
        head = [(b":status", _status_value(status))]
        length = -1
        for name, value in headers:
            name = name.lower()
            if name in CONNECTION_SPECIFIC:
                continue
            if (  # LF, CR, NUL, ':', space (as ints: found far faster than as bytes)
                10 in value
                or 13 in value
                or 0 in value
                or 58 in name
                or 10 in name
                or 13 in name
                or 32 in name
                or not name
            ):
                raise ValueError(f"an answer header cannot hold a line break: {name[:40]!r}")
            if name == b"content-length":
                length = int(value)
            head.append((name, value))
        self.started = True  # (not before: an answer refused above can still be a 500)
        body_allowed = not self.head_request and status >= 200 and status not in _NO_BODY_STATUSES
        self.body_allowed = body_allowed
        if body_allowed and length >= 0:
            self.length_left = length
        self.head = head

    def body(self, body: bytes, more: bool) -> int:
        """Hand ``body`` to ``h2`` as far as the windows allow; returns how many of its bytes
        are left (0: all of it, or it is dropped)."""
        if not self.started:
            raise RuntimeError("http.response.body before http.response.start")
        if self.finished:
            raise RuntimeError("http.response.body after the answer was complete")
        cut = False
        if not more:
            self.finished = True
            if self.waiters:
                self.wake()  # a receive() waiting for the end of the exchange
        if self.gone:
            return 0
        if not self.body_allowed:
            body = b""
        elif self.length_left >= 0:
            if len(body) > self.length_left:
                log.warning(
                    "%s %s: the answer's body is longer than its content-length; cut",
                    self.scope["method"],
                    self.scope["path"],
                )
                body = body[: self.length_left]
            self.length_left -= len(body)
            cut = not more and self.length_left > 0
        connection = self.connection
        h2 = connection.h2
        stream_id = self.stream_id
        end = not more and not cut
        try:
            head = self.head
            if head is not None:
                self.head = None
                if not body:
                    h2.send_headers(stream_id, head, end_stream=end)
                    if cut:
                        self.reset_short()
                    connection.schedule_flush()
                    return 0
                h2.send_headers(stream_id, head)
            size = len(body)
            if size:
                room = h2.local_flow_control_window(stream_id)
                frame = h2.max_outbound_frame_size
                if size > room or size > frame:
                    connection.schedule_flush()
                    return size
                h2.send_data(stream_id, body, end_stream=end)
            elif end:
                h2.end_stream(stream_id)
        except ProtocolError:  # the stream closed meanwhile (reset, or the connection failed)
            self.gone = True
            return 0
        if cut:
            self.reset_short()
        connection.schedule_flush()
        return 0

    async def body_rest(self, body: bytes, sent: int, more: bool) -> None:
        """The rest of a body that did not fit the peer's windows or frame size: frame by
        frame, waiting for WINDOW_UPDATE whenever the windows are exhausted."""
        connection = self.connection
        h2 = connection.h2
        stream_id = self.stream_id
        view = memoryview(body)
        size = len(body)
        cut = not more and self.length_left > 0
        loop = connection.loop
        timeout_s = connection.listener.limits.send_timeout_s
        deadline = loop.time() + timeout_s
        try:
            while sent < size:
                if self.gone or connection.closed:
                    return
                room = min(h2.local_flow_control_window(stream_id), h2.max_outbound_frame_size)
                if room <= 0:
                    connection.flush()  # what went out lets the client read, then open windows
                    left = deadline - loop.time()
                    if left <= 0:
                        self.stalled()
                        return
                    waiter = loop.create_future()
                    self.window_waiter = waiter
                    handle = loop.call_later(left, self.wake_writer)
                    try:
                        await waiter
                    finally:
                        handle.cancel()
                        self.window_waiter = None
                    continue
                if connection.writing_paused:
                    # The socket is full: what h2 would frame now would only wait in memory.
                    connection.flush()
                    if not await connection.drained(deadline - loop.time()):
                        self.stalled()
                        return
                    continue
                deadline = loop.time() + timeout_s  # progress: the window opened
                end = min(size, sent + room)
                h2.send_data(
                    stream_id, view[sent:end], end_stream=end == size and not more and not cut
                )
                sent = end
                connection.flush()  # frame by frame: the socket says when to wait
        except ProtocolError:
            self.gone = True
            return
        if cut:
            self.reset_short()
        connection.schedule_flush()

    def reset_short(self) -> None:
        log.error(
            "%s %s: the answer's body is shorter than its content-length; stream reset",
            self.scope["method"],
            self.scope["path"],
        )
        self.connection.reset(self, ErrorCodes.INTERNAL_ERROR)
