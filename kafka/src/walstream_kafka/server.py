"""The Kafka listener: TCP connections, framing, bounds, authentication and dispatch.

Per connection, requests are read one after another and answered in the order they arrived
(Kafka's rule), while several may be in progress at once (``max.in.flight`` pipelining):

- a Produce is *begun* before the next request is read: its partitions' appends are submitted
  to the engine in arrival order, and only their acknowledgements are awaited in the background
  (:mod:`walstream_kafka.produce`). So batches a producer pipelines to one partition are stored
  in the order it sent them;
- any other request runs as its own task (a Fetch long poll does not stop the reading);
- the answers are written by one writer task in request order.

Bounds a hostile client cannot get past: a request frame larger than ``kafka.max_request_size``
closes the connection before its body is read; at most ``kafka.max_in_flight`` requests per
connection are in progress (reading stops until one is answered); at most
``kafka.max_connections`` connections at once, and ``kafka.max_connections_per_address`` from
one remote address (more are closed at accept); a connection that sends nothing for
``kafka.idle_timeout`` is closed, and one that takes none of an answer's bytes for
``kafka.send_timeout`` (it stopped reading) is closed with its work; a request that does not
decode closes its connection. With a server token, a connection must authenticate
(SASL/PLAIN, the token as the password) before any request but ApiVersions and the SASL ones,
else it is closed. With ``server.tls`` the listener speaks TLS (Kafka's ``SSL`` and
``SASL_SSL``) with the same certificate, and a TLS handshake not done within
``kafka.idle_timeout`` (at most 60 s) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from walstream.errors import ConfigError

from walstream_kafka import admin, auth, fetch, groups, metadata, produce, producer_ids
from walstream_kafka.broker import KafkaBroker
from walstream_kafka.codes import UNSUPPORTED_VERSION
from walstream_kafka.wire import (
    API_NAMES,
    DecodedRequest,
    UnsupportedRequest,
    decode_request,
    encode_api_versions_error,
    encode_response,
)

__all__ = ["KafkaListener", "ListenerLimits"]

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">i")

Answer = Awaitable[dict[str, Any] | None]
Handler = Callable[["Session", DecodedRequest], Awaitable[Answer]]


@dataclass(frozen=True)
class ListenerLimits:
    max_request_bytes: int = 100 << 20
    max_in_flight: int = 32
    max_connections: int = 1024
    max_connections_per_address: int = 64
    idle_timeout_s: float = 600.0
    send_timeout_s: float = 30.0
    tls: ssl.SSLContext | None = None


class Session:
    """One connection's state, seen by the handlers."""

    def __init__(self, broker: KafkaBroker, peer: str) -> None:
        self.broker = broker
        self.peer = peer
        self.authenticated = broker.token is None
        self.sasl_mechanism: str | None = None


def _later(coroutine: Awaitable[dict[str, Any] | None]) -> Answer:
    return asyncio.ensure_future(coroutine)


HANDLERS: dict[int, Handler] = {}


def _task_handler(
    function: Callable[[Session, DecodedRequest], Awaitable[dict[str, Any] | None]],
) -> Handler:
    async def begin(session: Session, request: DecodedRequest) -> Answer:
        return _later(function(session, request))

    return begin


def _register() -> None:
    HANDLERS[0] = produce.begin
    for api_key, function in {
        1: fetch.handle_fetch,
        2: fetch.handle_list_offsets,
        3: metadata.handle_metadata,
        8: groups.handle_offset_commit,
        9: groups.handle_offset_fetch,
        10: groups.handle_find_coordinator,
        11: groups.handle_join_group,
        12: groups.handle_heartbeat,
        13: groups.handle_leave_group,
        14: groups.handle_sync_group,
        15: groups.handle_describe_groups,
        16: groups.handle_list_groups,
        17: auth.handle_sasl_handshake,
        18: metadata.handle_api_versions,
        19: admin.handle_create_topics,
        20: admin.handle_delete_topics,
        21: fetch.handle_delete_records,
        22: producer_ids.handle_init_producer_id,
        32: admin.handle_describe_configs,
        33: admin.handle_alter_configs,
        36: auth.handle_sasl_authenticate,
        37: admin.handle_create_partitions,
        44: admin.handle_incremental_alter_configs,
    }.items():
        HANDLERS[api_key] = _task_handler(function)


_register()

#: What a connection may ask before it authenticated.
_BEFORE_AUTH = frozenset({17, 18, 36})


class KafkaListener:
    """A bound Kafka listener (the :class:`walstream.config.listeners.ExtraListener` of
    ``walstream serve``)."""

    def __init__(self, broker: KafkaBroker, limits: ListenerLimits) -> None:
        self.broker = broker
        self.limits = limits
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], Connection] = {}
        self._host = ""
        self._port = 0
        self._per_address: dict[str, int] = {}
        self.refused = 0

    @property
    def address(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    async def start(self, host: str, port: int) -> None:
        try:
            self._server = await asyncio.start_server(
                self._accept,
                host,
                port,
                limit=64 * 1024,
                reuse_address=True,
                ssl=self.limits.tls,
                ssl_handshake_timeout=(
                    None if self.limits.tls is None else min(60.0, self.limits.idle_timeout_s)
                ),
            )
        except OSError as error:
            raise ConfigError(
                f"kafka.listen: cannot listen on {host}:{port} ({error.strerror or error}); "
                "stop the other server or choose another port"
            ) from None
        socket = self._server.sockets[0]
        self._host, self._port = host, int(socket.getsockname()[1])

    def rebind(self, client: Any) -> None:
        self.broker.rebind(client)

    def begin_shutdown(self) -> None:
        self.broker.shutting_down.set()
        if self._server is not None:
            self._server.close()

    async def close(self, grace_s: float) -> None:
        """Let requests in progress be answered (at most ``grace_s``), then close every
        connection; its reader sees the end of the stream and its task ends."""
        self.begin_shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while loop.time() < deadline and any(
            connection.busy for connection in self._connections.values()
        ):
            await asyncio.sleep(0.05)
        for connection in self._connections.values():
            connection.writer.close()
        if self._connections:
            _done, pending = await asyncio.wait(set(self._connections), timeout=5.0)
            for task in pending:
                task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        held = self._per_address.get(address, 0)
        if (
            len(self._connections) >= self.limits.max_connections
            or held >= self.limits.max_connections_per_address
            or self.broker.shutting_down.is_set()
        ):
            if self.refused % 1000 == 0:
                log.warning(
                    "kafka: refusing a connection from %s (%d open from that address, %d in "
                    "all; kafka.max_connections_per_address %d, kafka.max_connections %d)",
                    address,
                    held,
                    len(self._connections),
                    self.limits.max_connections_per_address,
                    self.limits.max_connections,
                )
            self.refused += 1
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        connection = Connection(self, reader, writer)
        self._connections[task] = connection
        self._per_address[address] = held + 1
        try:
            await connection.run()
        finally:
            self._connections.pop(task, None)
            left = self._per_address.get(address, 1) - 1
            if left > 0:
                self._per_address[address] = left
            else:
                self._per_address.pop(address, None)


class Connection:
    """One client connection (module docstring)."""

    def __init__(
        self, listener: KafkaListener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.listener = listener
        self.limits = listener.limits
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.session = Session(listener.broker, str(peer))
        self.answers: asyncio.Queue[tuple[DecodedRequest | None, Answer | bytes | None]] = (
            asyncio.Queue(maxsize=self.limits.max_in_flight)
        )

    @property
    def busy(self) -> bool:
        """True while a request of this connection is unanswered."""
        return bool(self.answers._unfinished_tasks)  # type: ignore[attr-defined]

    async def run(self) -> None:
        writing = asyncio.create_task(self._write_answers())
        try:
            await self._read_requests()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, ssl.SSLError):
            pass
        except _Close as reason:
            log.info("kafka: closing connection from %s: %s", self.session.peer, reason)
        finally:
            # Answers already begun are still written (a produce's acknowledgement included),
            # then the connection closes.
            with contextlib.suppress(asyncio.QueueFull):
                self.answers.put_nowait((None, None))
            if not writing.done():
                try:
                    await asyncio.wait_for(writing, 60.0)
                except (TimeoutError, asyncio.CancelledError):
                    writing.cancel()
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _read_requests(self) -> None:
        broker = self.listener.broker
        while not broker.shutting_down.is_set():
            head = await asyncio.wait_for(self.reader.readexactly(4), self.limits.idle_timeout_s)
            (length,) = _LENGTH.unpack(head)
            if length < 8 or length > self.limits.max_request_bytes:
                raise _Close(
                    f"a request of {length} bytes (kafka.max_request_size is "
                    f"{self.limits.max_request_bytes})"
                )
            frame = await asyncio.wait_for(
                self.reader.readexactly(length), self.limits.idle_timeout_s
            )
            try:
                request = decode_request(frame)
            except UnsupportedRequest as unsupported:
                if unsupported.api_key == 18:
                    await self.answers.put(
                        (
                            None,
                            encode_api_versions_error(
                                unsupported.correlation_id, UNSUPPORTED_VERSION
                            ),
                        )
                    )
                    continue
                raise _Close(str(unsupported)) from None
            except Exception as error:
                raise _Close(f"a request that does not decode ({type(error).__name__})") from None
            if not self.session.authenticated and request.api_key not in _BEFORE_AUTH:
                raise _Close("a request before SASL authentication (the server has a token)")
            answer = await HANDLERS[request.api_key](self.session, request)
            await self.answers.put((request, answer))
            if request.api_key in (17, 36):
                await asyncio.wait(
                    [asyncio.ensure_future(answer)]
                )  # the SASL state it sets governs what follows
            if request.api_key == 36 and not self.session.authenticated:
                # A failed authentication is answered, then the connection closes.
                await self.answers.join()
                raise _Close("SASL authentication failed")

    async def _write_answers(self) -> None:
        while True:
            request, answer = await self.answers.get()
            try:
                if request is None and answer is None:
                    return
                if isinstance(answer, bytes):
                    self.writer.write(answer)
                    await self._drain()
                    continue
                assert request is not None and answer is not None
                try:
                    tree = await answer
                    if tree is None:  # acks=0: no answer
                        continue
                    framed = encode_response(
                        request.api_key, request.api_version, request.correlation_id, tree
                    )
                except Exception:
                    log.exception(
                        "kafka: %s v%d from %s failed; closing the connection",
                        API_NAMES.get(request.api_key, request.api_key),
                        request.api_version,
                        self.session.peer,
                    )
                    self.writer.close()
                    return
                self.writer.write(framed)
                await self._drain()
            except (ConnectionError, OSError):
                return
            finally:
                self.answers.task_done()

    async def _drain(self) -> None:
        """Wait until the client takes the answer written; one that takes nothing for
        ``kafka.send_timeout`` is cut off (the connection aborted, its reading ends)."""
        try:
            await asyncio.wait_for(self.writer.drain(), self.limits.send_timeout_s)
        except TimeoutError:
            log.warning(
                "kafka: closing connection from %s: it took no answer bytes for %gs "
                "(kafka.send_timeout)",
                self.session.peer,
                self.limits.send_timeout_s,
            )
            # Reset, not closed: the answers queued in the kernel are dropped, not delivered.
            raw = self.writer.get_extra_info("socket")
            if raw is not None:
                with contextlib.suppress(OSError):
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.writer.transport.abort()
            raise ConnectionResetError("send timeout") from None


class _Close(Exception):
    """Close this connection (the reason is logged)."""
