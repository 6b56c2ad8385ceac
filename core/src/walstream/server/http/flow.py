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

    async def drained(self, timeout_s: float | None = None) -> bool:
        """Returns when the transport's write buffer is below its high-water mark again (or
        the connection closed): True; False when ``timeout_s`` passed first (the client took
        nothing for that long)."""
        loop = self.loop
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self.writing_paused and not self.closed:
            waiter = loop.create_future()
            self.drain_waiters.append(waiter)
            if deadline is None:
                await waiter
                continue
            left = deadline - loop.time()
            if left <= 0:
                return False
            handle = loop.call_later(left, _expire, waiter)
            try:
                await waiter
            finally:
                handle.cancel()
        return True


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
