"""Write flow control shared by the native listener's HTTP/1.1 and HTTP/2 connections: the
transport says when its write buffer passes its high-water mark and when it is below it again;
a writer that must not buffer without bound awaits :meth:`WriteFlow.drained`."""

from __future__ import annotations

import asyncio

__all__ = ["WriteFlow"]


class WriteFlow(asyncio.Protocol):
    """``pause_writing``/``resume_writing`` of an asyncio protocol, and :meth:`drained`.

    A subclass sets the attributes (``writing_paused``, ``drain_waiters``, ``closed``, ``loop``)
    when it is made; :meth:`wake_drained` is for its ``connection_lost``."""

    __slots__ = ("closed", "drain_waiters", "loop", "writing_paused")

    writing_paused: bool
    drain_waiters: list[asyncio.Future[None]]
    closed: bool
    loop: asyncio.AbstractEventLoop

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self.wake_drained()

    def wake_drained(self) -> None:
        """Wake every writer waiting in :meth:`drained` (it looks again)."""
        for drain in self.drain_waiters:
            if not drain.done():
                drain.set_result(None)
        self.drain_waiters.clear()

    async def drained(self) -> None:
        """Returns when the transport's write buffer is below its high-water mark again (or
        the connection closed)."""
        while self.writing_paused and not self.closed:
            waiter = self.loop.create_future()
            self.drain_waiters.append(waiter)
            await waiter
