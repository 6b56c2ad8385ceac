"""The native listener: one listening socket in the node's own event loop, its connections, the
bounds of :class:`~walstream.server.limits.ServerLimits` it keeps, and its graceful close."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from walstream.server.hosting_native.http1 import Connection
from walstream.server.limits import ServerLimits

if TYPE_CHECKING:
    from walstream.server.hosting_native.http2 import Http2Connection

__all__ = ["SHUTDOWN_GRACE_S", "NativeListener", "open_listener"]

log = logging.getLogger("walstream.server.hosting_native")

#: How long shutdown waits for requests still running after long polls were answered.
SHUTDOWN_GRACE_S = 10.0
#: How long shutdown waits for connections it dropped (after the grace) to be gone.
_ABORT_WAIT_S = 1.0


class NativeListener:
    """A listening socket serving an ASGI application (made by :func:`open_listener`)."""

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        limits: ServerLimits,
        loop: asyncio.AbstractEventLoop,
        host: str,
    ) -> None:
        self.app = app
        self.limits = limits
        self.loop = loop
        self.host = host
        self.port = 0
        self.server: asyncio.Server | None = None
        self.open = 0
        """Connections being served (refused ones are not counted)."""
        self.refused = 0
        """Connections answered 503 because ``max_connections`` were open."""
        self.connections: set[Connection | Http2Connection] = set()
        self.closing = False
        self.asgi_version = {"version": "3.0", "spec_version": "2.3"}
        self._sweep_s = min(1.0, limits.header_timeout_s / 8)
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._all_closed: asyncio.Future[None] | None = None

    def connection_closed(self, connection: Connection | Http2Connection) -> None:
        self.connections.discard(connection)
        if not self.connections and self._all_closed is not None:
            if not self._all_closed.done():
                self._all_closed.set_result(None)

    def start_sweep(self) -> None:
        self._sweep_handle = self.loop.call_later(self._sweep_s, self._sweep)

    def _sweep(self) -> None:
        """Close the connections waiting for a request head past ``header_timeout``, and the
        HTTP/2 ones without a stream for that long (one timer for all of them: per request this
        costs one clock read)."""
        now = self.loop.time()
        for connection in list(self.connections):
            connection.check_head_deadline(now)
        if not self.closing:
            self._sweep_handle = self.loop.call_later(self._sweep_s, self._sweep)

    async def close(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting, close idle connections, let requests in progress finish (an
        HTTP/1.1 answer that has not begun says ``connection: close``; an HTTP/2 connection
        refuses new streams and gets GOAWAY once its streams ended), and after ``grace_s``
        cancel what is left."""
        self.closing = True
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.shutdown()
        if self.connections:
            self._all_closed = self.loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._all_closed), grace_s)
            except TimeoutError:
                log.warning(
                    "%d connections still open %.0f s after shutdown began; dropping them",
                    len(self.connections),
                    grace_s,
                )
                for connection in list(self.connections):
                    connection.abort()
                try:
                    await asyncio.wait_for(asyncio.shield(self._all_closed), _ABORT_WAIT_S)
                except TimeoutError:
                    pass
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        if self.server is not None:
            try:
                await asyncio.wait_for(self.server.wait_closed(), _ABORT_WAIT_S)
            except TimeoutError:
                pass


async def open_listener(
    app: Callable[..., Awaitable[None]], host: str, port: int, limits: ServerLimits
) -> NativeListener:
    """Listen on ``host:port`` (port 0: any free port) and serve ``app`` on each connection."""
    loop = asyncio.get_running_loop()
    listener = NativeListener(app, limits, loop, host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    def accepted() -> Any:
        return Connection(listener)

    server = await loop.create_server(accepted, host, port, family=family, backlog=1024)
    listener.server = server
    listener.port = int(server.sockets[0].getsockname()[1])
    listener.start_sweep()
    return listener
