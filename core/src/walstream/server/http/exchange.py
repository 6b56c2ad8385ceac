"""One request and its answer on an HTTP/1.1 connection of the native listener: the ASGI 3.0
``receive`` and ``send`` (HTTP spec 2.3) the application gets.

``receive()`` gives the body as it arrives (``more_body``), then, once it was all given, waits
until the client is gone or the answer is complete and says ``http.disconnect``. A client that
closes the connection ends the exchange: ``receive()`` says ``http.disconnect`` and what the
application still sends is dropped (no error: a long poll or an event stream whose client left
just ends). It is safe to cancel a ``receive()``: nothing is lost.

``send()`` frames the answer: with the ``content-length`` the application gives (the head is
held until the body, so a small answer is one write), else with chunked transfer coding, its
head written at once (server-sent events: the client sees the answer begin). A ``HEAD``,
``1xx``, ``204`` or ``304`` answer has no body. ``Expect: 100-continue`` is answered when the
application first waits for the body. The answer says ``connection: close`` (and the connection
closes after it) when the request said so (``Connection: close``, or HTTP/1.0 without
keep-alive), when the application's headers say so, when the request's body was not all
received when the answer began, or when the listener is shutting down.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from walstream.server.http.framing import date_line, status_line
from walstream.server.http.request_body import RequestBody

if TYPE_CHECKING:
    from walstream.server.http.state import OutputBudget, ServingState


class Http1Link(Protocol):
    """What an exchange needs of its HTTP/1.1 connection."""

    loop: asyncio.AbstractEventLoop
    listener: ServingState
    output: OutputBudget
    buffered: int
    reading_paused: bool
    writing_paused: bool
    closed: bool
    draining: bool

    def maybe_resume(self) -> None: ...
    def write(self, data: bytes) -> None: ...
    def write_pieces(self, pieces: list[bytes]) -> None: ...
    async def drained(self, timeout_s: float | None = None) -> bool: ...
    def stalled(self) -> None: ...


__all__ = ["Exchange"]

log = logging.getLogger("walstream.server.http")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_CRLF = b"\r\n"
_NO_BODY_STATUSES = frozenset((204, 304))
#: A body up to this size is joined with its framing into one write; a larger one is handed
#: to the transport in pieces (not copied).
_JOIN_BYTES = 16 * 1024


class Exchange(RequestBody):
    """One request and its answer: the ASGI ``receive`` and ``send`` of the application."""

    __slots__ = (
        "body_allowed",
        "chunked",
        "close_after",
        "connection",
        "expect_continue",
        "head",
        "head_request",
        "head_written",
        "http10",
        "keep_alive",
        "length_left",
        "scope",
        "started",
    )

    def __init__(
        self,
        connection: Http1Link,
        scope: dict[str, Any],
        keep_alive: bool,
        expect_continue: bool,
    ) -> None:
        self.connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        """The request allows another one on the connection after it."""
        self.expect_continue = expect_continue
        self.head_request = scope["method"] == "HEAD"
        self.http10 = scope["http_version"] == "1.0"
        self.start_body()
        self.started = False
        self.head: bytes | None = None
        """The answer's head, until it is written with the first body bytes."""
        self.head_written = False
        self.body_allowed = True
        self.chunked = False
        self.length_left = -1
        self.close_after = False

    def event_loop(self) -> asyncio.AbstractEventLoop:
        return self.connection.loop

    def output_budgets(self) -> tuple[OutputBudget, OutputBudget, float]:
        listener = self.connection.listener
        return self.connection.output, listener.output, listener.limits.send_timeout_s

    def taken(self, size: int) -> None:
        connection = self.connection
        connection.buffered -= size
        if connection.reading_paused:
            connection.maybe_resume()

    def before_waiting(self) -> None:
        if self.expect_continue:
            self.expect_continue = False
            if not self.started:
                self.connection.write(_CONTINUE)

    # -- send --------------------------------------------------------------------------------

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            body = message.get("body", b"")
            self.body(body, message.get("more_body", False))
            if self.connection.writing_paused and not await self._wait_for_room():
                return
            if self.reserved:
                self.settle(len(body))
            return
        if kind == "http.response.start":
            self.start(message["status"], message.get("headers", ()))
        else:
            raise ValueError(f"unexpected ASGI message {kind!r} for an HTTP request")
        if self.connection.writing_paused:
            await self._wait_for_room()

    async def _wait_for_room(self) -> bool:
        """Wait for the paused writes of an open connection to drain (called only while they are
        paused, so an answer that fits costs no await); False when the client took nothing
        within ``send_timeout``: the connection is then stalled and dropped."""
        connection = self.connection
        if not connection.closed and not await connection.drained(
            connection.listener.limits.send_timeout_s
        ):
            connection.stalled()
            return False
        return True

    def start(self, status: int, headers: Any) -> None:
        if self.started:
            raise RuntimeError("http.response.start sent twice")
        lines = [status_line(status)]
        close = False
        length = -1
        for name, value in headers:
            if name == b"content-length":
                length = int(value)
                continue
            if name == b"connection":
                close = close or b"close" in value.lower()
                continue  # the listener writes its own
            if name == b"transfer-encoding":
                continue  # framing is the listener's
            # Byte values, not one-byte strings: an int lookup is several times cheaper.
            if 10 in value or 13 in value or 10 in name or 58 in name:  # \n \r \n :
                raise ValueError(f"an answer header cannot hold a line break: {name[:40]!r}")
            lines.append(b"%s: %s\r\n" % (name, value))
        self.started = True  # (not before: an answer refused above can still be a 500)
        body_allowed = not self.head_request and status >= 200 and status not in _NO_BODY_STATUSES
        self.body_allowed = body_allowed
        if length >= 0:
            lines.append(b"content-length: %d\r\n" % length)
            if body_allowed:
                self.length_left = length
        elif body_allowed:
            if self.http10:
                close = True  # the end of the body is the end of the connection
            else:
                self.chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
        keep = self.keep_alive and not close and self.complete and not self.connection.draining
        if not keep:
            lines.append(b"connection: close\r\n")
        elif self.http10:
            lines.append(b"connection: keep-alive\r\n")
        self.close_after = not keep
        lines.append(date_line())
        lines.append(_CRLF)
        head = b"".join(lines)
        if length >= 0 or not body_allowed:
            self.head = head  # written with the body, which follows at once
        elif not self.gone:
            self.head_written = True
            self.connection.write(head)

    def body(self, body: bytes, more: bool) -> None:
        if not self.started:
            raise RuntimeError("http.response.body before http.response.start")
        if self.finished:
            raise RuntimeError("http.response.body after the answer was complete")
        if not more:
            self.finished = True
            if self.waiters:
                self.wake()  # a receive() waiting for the end of the exchange
        if self.gone:
            return
        if not self.body_allowed:
            body = b""
        elif self.chunked:
            self.write(
                (b"%x\r\n" % len(body) if body else b""),
                body,
                (_CRLF if body else b"") + (b"" if more else _LAST_CHUNK),
            )
            return
        elif len(body) > self.length_left:
            log.warning(
                "%s %s: the answer's body is longer than its content-length; cut",
                self.scope["method"],
                self.scope["path"],
            )
            body = body[: self.length_left]
            self.close_after = True
        self.length_left -= len(body)
        if not more and self.length_left > 0:
            self.close_after = True  # shorter than announced: the framing is lost
        self.write(b"", body, b"")

    def write(self, before: bytes, body: bytes, after: bytes) -> None:
        """Write ``body`` framed by ``before`` and ``after``, after the head if it is still
        held: one write when small, else the pieces (a large body is not copied)."""
        head = self.head
        if head is not None:
            self.head = None
            self.head_written = True
            before = head + before
        if len(body) <= _JOIN_BYTES:
            data = before + body + after if before or after else body
            if data:
                self.connection.write(data)
        else:
            self.connection.write_pieces([piece for piece in (before, body, after) if piece])
