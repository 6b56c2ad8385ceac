"""Running an ASGI application with granian, embedded in this process (granian's Rust runtime
owns the sockets and parses HTTP; the application runs on this process's event loop, so it
reaches the node's client in memory): HTTP/1.1 and cleartext HTTP/2 with prior knowledge (h2c)
on one port, behind the bounds of :class:`~walstream.server.limits.ServerLimits`.

The same contract as :mod:`walstream.server.hosting` (hypercorn), with these differences, all
granian's own:

- ``max_connections`` is granian's ``backpressure``: the connections served at once. One more
  is not answered ``503``: it waits, accepted by the kernel, until a served one closes.
- ``header_timeout`` bounds an HTTP/1.1 request head (hyper's ``header_read_timeout``); an idle
  HTTP/2 connection is pinged every ``header_timeout`` and closed when it stops answering.
- malformed HTTP is refused by hyper with a bare ``400`` (no body) or a disconnect.

Shutdown stops accepting, asks every connection to finish (HTTP/1.1: close after the response
in progress; HTTP/2: GOAWAY), waits for them up to ``grace_s``, then abandons what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings, HTTP2Settings
from granian.server.embed import Server

from walstream.errors import ConfigError
from walstream.server.limits import ServerLimits

__all__ = ["GranianListener", "open_listener"]

log = logging.getLogger(__name__)

#: How long shutdown waits for requests still running after long polls were answered.
SHUTDOWN_GRACE_S = 10.0
#: Largest HTTP/1.1 request head and HTTP/2 header list, in bytes (as with hypercorn).
MAX_HEAD_BYTES = 64 * 1024
#: How long :func:`open_listener` waits for granian's runtime to accept connections.
STARTUP_TIMEOUT_S = 10.0


@dataclass
class GranianListener:
    """A granian server serving an ASGI application (made by :func:`open_listener`)."""

    server: Server
    task: asyncio.Task[None]
    host: str
    port: int
    refused: int = 0
    """Always 0: granian makes a connection over the bound wait instead of refusing it."""

    async def close(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting, let requests in progress finish (HTTP/2 connections get GOAWAY),
        and after ``grace_s`` stop waiting for what is left."""
        self.server.stop()  # type: ignore[no-untyped-call]
        try:
            await asyncio.wait_for(asyncio.shield(self.task), grace_s)
        except TimeoutError:
            log.warning("granian: connections still open %.0f s after shutdown began", grace_s)
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self.task, 1.0)


def _reserve_port(host: str, port: int) -> int:
    """Check that ``host:port`` is free and resolve port 0 to a free port. granian binds with
    SO_REUSEPORT, so without this check a second server on a busy port would share it
    silently instead of failing. SO_REUSEADDR, as granian's own socket: connections of a killed
    server left in TIME_WAIT must not keep its restart off its port (a listening socket still
    refuses the bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))  # OSError EADDRINUSE when taken
        return int(probe.getsockname()[1])


async def _until_accepting(host: str, port: int, task: asyncio.Task[None]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STARTUP_TIMEOUT_S
    while True:
        if task.done():
            task.result()  # raises granian's startup error
            raise ConfigError(f"granian stopped while starting on {host}:{port}")
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            if loop.time() > deadline:
                raise ConfigError(
                    f"granian did not accept connections on {host}:{port} within "
                    f"{STARTUP_TIMEOUT_S:.0f} s"
                ) from None
            await asyncio.sleep(0.01)
            continue
        writer.close()
        return


async def open_listener(
    app: Callable[..., Awaitable[None]], host: str, port: int, limits: ServerLimits
) -> GranianListener:
    """Listen on ``host:port`` (port 0: any free port) and serve ``app`` on each connection."""
    port = _reserve_port(host, port)
    head_timeout_ms = max(1, round(limits.header_timeout_s * 1000))
    server = Server(
        app,
        address=host,
        port=port,
        # No lifespan: the node is open before the server starts and closed after it stops.
        interface=Interfaces.ASGINL,
        http=HTTPModes.auto,
        websockets=False,
        backlog=1024,
        backpressure=limits.max_connections,
        http1_settings=HTTP1Settings(
            header_read_timeout=head_timeout_ms,
            keep_alive=True,
            max_buffer_size=MAX_HEAD_BYTES,
        ),
        http2_settings=HTTP2Settings(
            keep_alive_interval=head_timeout_ms,
            keep_alive_timeout=max(1, round(limits.header_timeout_s)),
            max_headers_size=MAX_HEAD_BYTES,
        ),
        # granian's own log goes to stdout; walstream's output stays its own.
        log_enabled=False,
    )
    task: asyncio.Task[Any] = asyncio.ensure_future(server.serve())
    try:
        await _until_accepting(host, port, task)
    except BaseException:
        server.stop()  # type: ignore[no-untyped-call]
        task.cancel()
        raise
    return GranianListener(server, task, host, port)
