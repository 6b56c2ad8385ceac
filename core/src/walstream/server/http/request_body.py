"""The request side of an exchange, shared by the native listener's HTTP/1.1 exchange and HTTP/2
stream: the body's bytes as the connection receives them, and the ASGI ``receive()`` that gives
them to the application.

``receive()`` gives the body as it arrives (``more_body``), then, once it was all given, waits
until the client is gone or the answer is complete and says ``http.disconnect``; it says
``http.disconnect`` at once when the client left before the body was all received. It is safe to
cancel a ``receive()``: nothing is lost. The connection appends to ``chunks``, sets ``complete``
and ``gone`` and calls :meth:`RequestBody.wake`; the answer sets ``finished``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from walstream.server.http.state import OutputBudget, OutputBusy

__all__ = ["OUTPUT_ROOM", "RequestBody"]

#: The ASGI scope extension through which the application reserves room for an answer before
#: it builds it (``scope["extensions"][OUTPUT_ROOM](want_bytes)``: awaitable, returns the bytes
#: granted, raises :class:`~walstream.server.http.state.OutputBusy`, a TimeoutError, when no room
#: came within ``server.send_timeout``).
OUTPUT_ROOM = "walstream.output_room"


class RequestBody:
    """The body half of one exchange (see the module's docstring).

    A subclass sets ``loop`` and calls :meth:`start_body` when it is made; it says what taking
    bytes means for its connection (:meth:`taken`: flow control) and may act before a
    ``receive()`` first waits for the client (:meth:`before_waiting`: ``100 Continue``)."""

    __slots__ = ("chunks", "complete", "delivered", "finished", "gone", "reserved", "waiters")

    def start_body(self) -> None:
        self.reserved = 0
        """Output bytes reserved by :meth:`output_room` and not yet given back."""
        self.chunks: list[bytes] = []
        self.complete = False
        """The request's body was all received."""
        self.delivered = False
        """The last ``http.request`` message was given to the application."""
        self.gone = False
        """The client is gone (or its request broke off): ``http.disconnect``, answers dropped."""
        self.finished = False
        """The answer is complete."""
        self.waiters: list[asyncio.Future[None]] = []

    def event_loop(self) -> asyncio.AbstractEventLoop:
        raise NotImplementedError

    def output_budgets(self) -> tuple[OutputBudget, OutputBudget, float]:
        """The connection's output budget, the server's, and ``server.send_timeout``."""
        raise NotImplementedError

    async def output_room(self, want: int) -> int:
        """Reserve ``want`` bytes (at most the connection's budget) of answer before building
        it: waits while the connection's or the server's budget is full (answers built and not
        yet taken by clients). Given back as the answer's body goes out (:meth:`settle`), the
        rest when the exchange ends (:meth:`settle_all`). Raises :class:`OutputBusy` when no room
        came within ``server.send_timeout``, or the client left while it waited."""
        connection, server, timeout_s = self.output_budgets()
        want = max(0, min(want, connection.limit))
        loop = self.event_loop()
        deadline = loop.time() + timeout_s
        while not (connection.fits(want) and server.fits(want)):
            if self.gone:
                raise OutputBusy("the client is gone: nothing to build an answer for")
            left = deadline - loop.time()
            if left <= 0:
                raise OutputBusy(
                    "no room for an answer within server.send_timeout: the server holds "
                    "server.max_output (or this connection server.max_connection_output) bytes "
                    "of answers its clients have not taken; retry shortly"
                )
            budget = connection if not connection.fits(want) else server
            try:
                async with asyncio.timeout(left):
                    await budget.wait(loop)
            except TimeoutError:
                continue  # looks once more, then raises
        connection.used += want
        server.used += want
        self.reserved += want
        return want

    def settle(self, sent: int) -> None:
        """``sent`` bytes of body went out: give back as much of the reservation."""
        reserved = self.reserved
        if reserved:
            given = reserved if sent >= reserved else sent
            self.reserved = reserved - given
            connection, server, _ = self.output_budgets()
            connection.release(given)
            server.release(given)

    def settle_all(self) -> None:
        """The exchange ended: give back what is still reserved."""
        if self.reserved:
            self.settle(self.reserved)

    def taken(self, size: int) -> None:
        """``size`` bytes of body were given to the application."""

    def before_waiting(self) -> None:
        """A ``receive()`` is about to wait for more of a body the client is still sending."""

    def wake(self) -> None:
        """Wake every ``receive()`` waiting (it looks again)."""
        waiters = self.waiters
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()

    async def receive(self) -> dict[str, Any]:
        while True:
            if self.chunks:
                return self._take()
            if self.complete:
                if not self.delivered:
                    self.delivered = True
                    return {"type": "http.request", "body": b"", "more_body": False}
                if self.gone or self.finished:
                    return {"type": "http.disconnect"}
            elif self.gone:
                return {"type": "http.disconnect"}
            else:
                self.before_waiting()
            waiter = self.event_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():  # cancelled: no longer waiting
                    self.waiters.remove(waiter)

    def _take(self) -> dict[str, Any]:
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.taken(len(body))
        more = not self.complete
        if not more:
            self.delivered = True
        return {"type": "http.request", "body": body, "more_body": more}
