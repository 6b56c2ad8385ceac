"""HTTP/2 with prior knowledge (h2c) on the native listener's port: a connection that opens with
the HTTP/2 client preface is handed, with the bytes already read, to hypercorn's connection
handler (:class:`walstream.server.hosting.HypercornConnection`, as the hypercorn stack serves
it). walstream has no HTTP/2 implementation of its own.

The handoff builds an asyncio stream pair over the transport the listener accepted
(``transport.set_protocol`` to a :class:`asyncio.StreamReaderProtocol`) and feeds it the bytes
read so far, so hypercorn sees the connection from its first byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.worker_context import WorkerContext

from walstream.server.hosting import HypercornConnection, hypercorn_config
from walstream.server.limits import ServerLimits

__all__ = ["H2cServer"]

#: The stream reader's buffer limit (hypercorn reads 64 KiB at a time).
_READ_LIMIT = 1 << 16


class H2cServer:
    """hypercorn's HTTP/2 for the connections of one listener (made at the first one)."""

    def __init__(self, app: Callable[..., Awaitable[None]], limits: ServerLimits) -> None:
        self.app = ASGIWrapper(app)
        self.config = hypercorn_config(limits)
        self.context = WorkerContext(None)
        """Its ``terminated`` event makes hypercorn send GOAWAY and close idle connections."""

    def serve(
        self, transport: asyncio.Transport, received: bytes, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Task[Any]:
        """Take over ``transport`` (``received``: its bytes read so far, the preface first);
        the task ends when the connection does."""
        reader = asyncio.StreamReader(limit=_READ_LIMIT, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        reader.feed_data(received)
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        handler = HypercornConnection(self.app, loop, self.config, self.context, {}, reader, writer)
        return loop.create_task(handler.run(), name="walstream-h2c-connection")

    async def terminate(self) -> None:
        """Shutdown: GOAWAY to every connection, which closes once its requests finished."""
        await self.context.terminated.set()
