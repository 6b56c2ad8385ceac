"""Running an ASGI application with hypercorn on one listening socket: HTTP/1.1 and cleartext
HTTP/2 with prior knowledge (h2c, what S2's SDKs speak) on the same port, behind the bounds of
:class:`~walstream.server.limits.ServerLimits`.

This module, :mod:`walstream.server.hosting_granian` and :mod:`walstream.server.hosting_native`
are the only ones that know an ASGI server (``server.http_stack: hypercorn`` chooses this one); the application
(:class:`walstream.server.s2.app.S2App`) is plain ASGI. hypercorn's connection handler is driven directly (instead of
``hypercorn.asyncio.serve``) so the listener can bound the connections open at once: one more
is answered ``503`` and closed.

Bounds: ``max_connections`` (here), ``header_timeout`` (hypercorn's keep-alive timeout: an idle
connection, or one that has not sent a complete request, is closed after it), the body timeout
and the long-poll bound (in the application), ``max_body_bytes`` (in the application).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config

from walstream.server.limits import ServerLimits

__all__ = ["HypercornConnection", "Listener", "hypercorn_config", "open_listener"]

log = logging.getLogger(__name__)

#: How long shutdown waits for requests still running after long polls were answered.
SHUTDOWN_GRACE_S = 10.0
#: Largest HTTP/1.1 request head, in bytes (longer heads are refused by hypercorn).
MAX_HEAD_BYTES = 64 * 1024


def _refusal(open_connections: int) -> bytes:
    body = json.dumps(
        {
            "code": "unavailable",
            "message": f"this server already has {open_connections} connections open "
            "(server.max_connections); retry later or raise the bound",
        }
    ).encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"retry-after-ms: 1000\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
    ) + body


class HypercornConnection(TCPServer):
    """hypercorn's connection handler, ending as soon as the client has closed: hypercorn
    would keep the connection's task (and its place under ``max_connections``) until its
    keep-alive timer ran out."""

    async def _read_data(self) -> None:
        await super()._read_data()
        await self.idle_task.stop()


@dataclass
class Listener:
    """A listening socket serving an ASGI application (made by :func:`open_listener`)."""

    server: asyncio.Server
    host: str
    port: int
    context: WorkerContext
    open: int = 0
    """Connections being served (refused ones are not counted)."""
    refused: int = 0
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def close(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting, let requests in progress finish (HTTP/2 connections get GOAWAY),
        and after ``grace_s`` cancel what is left."""
        self.server.close()
        await self.context.terminated.set()
        tasks = set(self.tasks)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        await self.server.wait_closed()


def hypercorn_config(limits: ServerLimits) -> Config:
    config = Config()
    config.keep_alive_timeout = limits.header_timeout_s
    config.graceful_timeout = SHUTDOWN_GRACE_S
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    # hypercorn ends a connection after 1000 requests by default (HTTP/1.1: `connection: close`,
    # HTTP/2: GOAWAY); a client that keeps one connection open would have to open a new one.
    config.keep_alive_max_requests = 1 << 62
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


async def open_listener(
    app: Callable[..., Awaitable[None]], host: str, port: int, limits: ServerLimits
) -> Listener:
    """Listen on ``host:port`` (port 0: any free port) and serve ``app`` on each connection."""
    config = hypercorn_config(limits)
    wrapped = ASGIWrapper(app)
    loop = asyncio.get_running_loop()
    context = WorkerContext(None)
    listener: Listener | None = None

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert listener is not None
        if listener.open >= limits.max_connections:
            listener.refused += 1
            writer.write(_refusal(listener.open))
            try:
                await asyncio.wait_for(writer.drain(), 1.0)
            except (TimeoutError, ConnectionError):
                pass
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        listener.tasks.add(task)
        listener.open += 1
        try:
            await HypercornConnection(wrapped, loop, config, context, {}, reader, writer)
        finally:
            listener.open -= 1
            listener.tasks.discard(task)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = await asyncio.start_server(connected, host, port, family=family, backlog=1024)
    bound = server.sockets[0].getsockname()
    listener = Listener(server, host, int(bound[1]), context)
    return listener
