"""The client side of one chunk server: a :class:`walstream.wal.quorum.Replica` over TCP.

One connection per server carries many requests at once (each frame has a request id; replies
are matched by it, in whatever order they come). The connection is an :class:`asyncio.Protocol`
that settles a request's future in the step that reads its reply (no reader task). When
the server cannot be reached, requests fail at once with :class:`BackendUnavailable` and the
next connection attempt waits an exponential backoff (50 ms doubling to 2 s), so a dead server
costs the writer nothing. A request whose connection breaks after it was sent fails with
:class:`AmbiguousError`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import cast

import crc32c
from walstream.clock import Clock, SystemClock
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CorruptionError,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)
from walstream.wal.quorum import LogIdentity, LogListing

from .protocol import (
    FrameError,
    FrameLengthError,
    FrameReader,
    Op,
    Status,
    decode_listing,
    encode_frame,
    encode_identity,
    pack_i64,
    pack_str,
    pack_u32,
    pack_u64,
)

__all__ = ["ChunkServerReplica", "parse_address"]

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 1 << 30
_INITIAL_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 2.0


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgument(f"chunk server address must be HOST:PORT, got {address!r}")
    return host, int(port)


class _Connection(asyncio.Protocol):
    """One TCP connection to a chunk server: requests out, replies parsed as they arrive."""

    def __init__(self, replica: ChunkServerReplica) -> None:
        self.replica = replica
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.closed = False
        self._frames = FrameReader(MAX_REPLY_BYTES)
        self._writable: asyncio.Future[None] | None = None
        """Set while the transport's write buffer is over its high-water mark."""
        self._reason = "the connection closed"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            for frame in self._frames.feed(data):
                if isinstance(frame, FrameError):
                    self._lost(f"a damaged reply ({frame})")
                    return
                future = self.pending.pop(frame.request_id, None)
                if future is not None and not future.done():
                    future.set_result((frame.code, frame.body))
                elif frame.request_id == 0 and frame.code == Status.BAD_REQUEST:
                    log.warning(
                        "chunk server %s: %s", self.replica.name, frame.body.decode("replace")
                    )
        except FrameLengthError as exc:
            self._lost(f"a reply frame of impossible length {exc.length}")

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(self._reason)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    async def drained(self) -> None:
        """Wait while the server does not read what was sent (back-pressure)."""
        if self._writable is not None:
            await asyncio.shield(self._writable)
        if self.closed:
            raise ConnectionResetError("the connection closed")

    def _lost(self, reason: str) -> None:
        if self.closed:
            return
        self.replica._connection_lost(
            self,
            AmbiguousError(
                f"lost the connection to chunk server {self.replica.name} ({reason}) with the "
                "request in flight; it may have been applied"
            ),
        )

    def fail_all(self, exc: WalstreamError) -> None:
        self.closed = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(exc)
                future.exception()
        self.pending.clear()
        self.resume_writing()
        if self.transport is not None:
            self.transport.close()


class ChunkServerReplica:
    """A chunk server at ``host:port`` as a quorum replica."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        connect_timeout_s: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        self.name = address
        self.host, self.port = parse_address(address)
        self.token = token
        self.connect_timeout_s = connect_timeout_s
        self.clock: Clock = clock or SystemClock()
        self._connection: _Connection | None = None
        self._connecting: asyncio.Lock | None = None
        self._retry_at = 0.0
        self._backoff_s = _INITIAL_BACKOFF_S
        self._request_ids = itertools.count(1)
        self._closed = False
        self._version_1_server = False
        """The server answered an identified request with "unknown operation"."""
        self.request_counts: dict[str, int] = {}
        """Requests sent per operation (cost accounting: chunk writes per GiB, ...)."""

    # -- connection management --------------------------------------------------------------------

    def healthy(self) -> bool:
        return self._connection is not None and not self._connection.closed

    async def _connect(self) -> _Connection:
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        if self._closed:
            raise BackendUnavailable(f"chunk server client {self.name} is closed")
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            connection = self._connection
            if connection is not None and not connection.closed:
                return connection
            now = self.clock.monotonic()
            if now < self._retry_at:
                raise BackendUnavailable(
                    f"chunk server {self.name} is unreachable; next attempt in "
                    f"{self._retry_at - now:.2f}s"
                )
            loop = asyncio.get_running_loop()
            try:
                _, opened = await asyncio.wait_for(
                    loop.create_connection(lambda: _Connection(self), self.host, self.port),
                    self.connect_timeout_s,
                )
            except (OSError, TimeoutError) as exc:
                self._retry_at = self.clock.monotonic() + self._backoff_s
                self._backoff_s = min(self._backoff_s * 2, _MAX_BACKOFF_S)
                raise BackendUnavailable(
                    f"cannot connect to chunk server {self.name} ({exc or type(exc).__name__}); "
                    "check that walstream-chunkd runs there"
                ) from None
            connection = self._connection = opened
            self._backoff_s = _INITIAL_BACKOFF_S
            if self.token is not None:
                status, body = await self._send(connection, Op.HELLO, self.token.encode())
                if status != Status.OK:
                    self._drop(connection, BackendUnavailable("chunk server refused the token"))
                    reason = body.decode(errors="replace")
                    raise BackendUnavailable(
                        f"chunk server {self.name} refused the token ({reason})"
                        "; set the same token on the WAL and on walstream-chunkd"
                    )
            return connection

    def _drop(self, connection: _Connection, exc: WalstreamError) -> None:
        connection.fail_all(exc)
        if self._connection is connection:
            self._connection = None

    def _connection_lost(self, connection: _Connection, exc: WalstreamError) -> None:
        """The server closed the connection or sent something unreadable: fail what is in
        flight; the next request reconnects at once."""
        self._retry_at = 0.0
        self._drop(connection, exc)

    async def _send(self, connection: _Connection, op: Op, body: bytes) -> tuple[int, bytes]:
        request_id = next(self._request_ids) & 0xFFFFFFFF or 1
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        connection.pending[request_id] = future
        transport = connection.transport
        assert transport is not None
        try:
            transport.write(encode_frame(op, request_id, body))
            await connection.drained()
            return await future
        except (ConnectionError, OSError) as exc:
            self._drop(connection, AmbiguousError(f"chunk server {self.name}: {exc}"))
            raise AmbiguousError(
                f"connection to chunk server {self.name} failed while sending ({exc}); the "
                "request may have been applied"
            ) from None
        finally:
            connection.pending.pop(request_id, None)

    async def _request(self, op: Op, body: bytes) -> bytes:
        connection = await self._connect()
        self.request_counts[op.name] = self.request_counts.get(op.name, 0) + 1
        status, reply = await self._send(connection, op, body)
        if status == Status.OK:
            return reply
        message = f"chunk server {self.name}: {reply.decode(errors='replace')}"
        if status == Status.FENCED:
            raise FencedError(message)
        if status == Status.NOT_FOUND:
            raise NotFound(message)
        if status == Status.CONFLICT:
            raise PreconditionFailed(message)
        if status == Status.IDENTITY_MISMATCH:
            raise IdentityMismatch(message)
        if status == Status.CORRUPT:
            raise CorruptionError(message)
        if status == Status.UNAUTHORIZED:
            raise BackendUnavailable(f"{message}; configure the server's token")
        if status == Status.BAD_REQUEST:
            raise InvalidArgument(f"{message} (a client/server version mismatch?)")
        raise AmbiguousError(f"{message}; the request may have been applied")

    # -- the Replica operations -----------------------------------------------------------------

    async def _identified(self, op: Op, body: bytes) -> LogListing | None:
        """A version-2 request; ``None`` when the server speaks only version 1."""
        if self._version_1_server:
            return None
        try:
            return decode_listing(await self._request(op, body), identified=True)
        except InvalidArgument as exc:
            if "unknown operation" not in str(exc):
                raise
            self._version_1_server = True
            log.warning(
                "chunk server %s speaks protocol version 1: it records no log identity; "
                "upgrade walstream-chunkd (chunks are still checked for their identity)",
                self.name,
            )
            return None

    async def claim(
        self, log_id: str, epoch: int, identity: LogIdentity | None = None
    ) -> LogListing:
        if identity is not None:
            body = pack_str(log_id) + pack_u64(epoch) + encode_identity(identity)
            listing = await self._identified(Op.CLAIM_IDENTIFIED, body)
            if listing is not None:
                return listing
        return decode_listing(await self._request(Op.CLAIM, pack_str(log_id) + pack_u64(epoch)))

    async def list_chunks(self, log_id: str) -> LogListing:
        listing = await self._identified(Op.LIST_IDENTIFIED, pack_str(log_id))
        if listing is not None:
            return listing
        return decode_listing(await self._request(Op.LIST, pack_str(log_id)))

    async def write_chunk(self, log_id: str, epoch: int, seq: int, data: bytes) -> None:
        body = pack_str(log_id) + pack_u64(epoch, seq) + pack_u32(crc32c.crc32c(data)) + data
        await self._request(Op.WRITE, body)

    async def read_chunk(self, log_id: str, seq: int) -> tuple[int, bytes]:
        reply = await self._request(Op.READ, pack_str(log_id) + pack_u64(seq))
        if len(reply) < 8:
            raise CorruptionError(f"chunk server {self.name}: short READ reply")
        return int.from_bytes(reply[:8], "big"), reply[8:]

    async def seal(self, log_id: str, epoch: int, end_seq: int) -> None:
        await self._request(Op.SEAL, pack_str(log_id) + pack_u64(epoch, end_seq))

    async def trim(self, log_id: str, epoch: int, through_seq: int, trim_offset: int) -> None:
        body = pack_str(log_id) + pack_u64(epoch, through_seq) + pack_i64(trim_offset)
        await self._request(Op.TRIM, body)

    async def ping(self) -> None:
        await self._request(Op.PING, b"")

    async def close(self) -> None:
        self._closed = True
        connection = self._connection
        if connection is not None:
            self._drop(connection, BackendUnavailable(f"chunk server client {self.name} closed"))
            await asyncio.sleep(0)  # let the transport close
