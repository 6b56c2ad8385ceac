"""The listener: one listening socket in the node's own event loop (cleartext, or TLS with ALPN
choosing HTTP/2 or HTTP/1.1), its connections, the bounds of
:class:`~walstream.server.limits.ServerLimits` it keeps, and its graceful close."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from walstream.server.http.http1 import Connection
from walstream.server.http.state import ServingState
from walstream.server.http.tls import server_context
from walstream.server.limits import ServerLimits

if TYPE_CHECKING:
    from walstream.server.node_auth import NodeCredentials

__all__ = ["SHUTDOWN_GRACE_S", "HttpListener", "open_listener"]

log = logging.getLogger("walstream.server.http")

#: How long shutdown waits for requests still running after long polls were answered.
SHUTDOWN_GRACE_S = 10.0
#: How long shutdown waits for connections it dropped (after the grace) to be gone.
_ABORT_WAIT_S = 1.0


class HttpListener(ServingState):
    """A listening socket serving an ASGI application (made by :func:`open_listener`)."""

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        limits: ServerLimits,
        loop: asyncio.AbstractEventLoop,
        host: str,
        *,
        node_credentials: NodeCredentials | None = None,
    ) -> None:
        super().__init__(
            app,
            limits,
            loop,
            scheme="https" if limits.tls is not None else "http",
            node_credentials=node_credentials,
        )
        self.host = host
        self.port = 0
        self.server: asyncio.Server | None = None
        self._sweep_s = min(1.0, limits.header_timeout_s / 8)
        self._sweep_handle: asyncio.TimerHandle | None = None

    def start_sweep(self) -> None:
        self._sweep_handle = self.loop.call_later(self._sweep_s, self._sweep)

    def _sweep(self) -> None:
        """Close the connections waiting for a request head past ``header_timeout``, and the
        HTTP/2 ones without a stream for that long (one timer for all of them: per request this
        costs one clock read)."""
        now = self.loop.time()
        for connection in list(self.connections):
            connection.check_head_deadline(now)
        self.sweep_addresses()
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
    app: Callable[..., Awaitable[None]],
    host: str,
    port: int,
    limits: ServerLimits,
    *,
    node_credentials: NodeCredentials | None = None,
) -> HttpListener:
    """Listen on ``host:port`` (port 0: any free port) and serve ``app`` on each connection
    (HTTPS when ``limits.tls`` is set)."""
    loop = asyncio.get_running_loop()
    listener = HttpListener(app, limits, loop, host, node_credentials=node_credentials)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    context = None if limits.tls is None else server_context(limits.tls)

    def accepted() -> Any:
        return Connection(listener)

    server = await loop.create_server(
        accepted,
        host,
        port,
        family=family,
        backlog=1024,
        ssl=context,
        ssl_handshake_timeout=None if context is None else limits.header_timeout_s,
    )
    listener.server = server
    listener.port = int(server.sockets[0].getsockname()[1])
    listener.start_sweep()
    return listener
