"""``walstream-chunkd``: the chunk server, one per local disk.

    walstream-chunkd --listen 127.0.0.1:7400 --data /mnt/nvme0/walstream [--token SECRET]

It serves the binary protocol of :mod:`.protocol` over TCP (on uvloop when it is installed) and
stores chunks with :class:`.store.ChunkStore`. A malformed request gets an error reply; the server keeps serving
(a frame whose length cannot be trusted also closes that one connection). On start it prints
``listening on HOST:PORT`` (useful with port 0).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

from walstream.errors import (
    CorruptionError,
    FencedError,
    IdentityMismatch,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)

from .protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_PREFIX,
    BodyReader,
    FrameError,
    FrameLengthError,
    FrameReader,
    Op,
    Status,
    decode_identity,
    encode_frame,
    encode_listing,
    pack_u64,
)
from .store import DEFAULT_SEGMENT_BYTES, ChunkStore

__all__ = ["ChunkServer", "main"]

log = logging.getLogger("walstream.chunkd")

#: Requests one connection may have in progress; reading pauses beyond it (back-pressure).
MAX_REQUESTS_PER_CONNECTION = 256
#: A frame that started arriving must finish within this time.
FRAME_READ_TIMEOUT_S = 30.0

_Answer = Callable[[], tuple[Status, bytes]]
"""Computes a request's reply once what it wrote is durable."""
_OK: tuple[Status, bytes] = (Status.OK, b"")


def _ok() -> tuple[Status, bytes]:
    return _OK


class ChunkServer:
    """Serves one :class:`ChunkStore`. Each connection is an :class:`asyncio.Protocol` that
    handles requests synchronously as their frames arrive: a request changes the store, then
    its reply waits in :meth:`ChunkStore.when_durable` for the group's ``fdatasync`` — no task
    and no thread per request."""

    def __init__(
        self,
        store: ChunkStore,
        *,
        token: str | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        delay_s: float = 0.0,
    ) -> None:
        self.store = store
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.delay_s = delay_s
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port)
        address = self._server.sockets[0].getsockname()
        return str(address[0]), int(address[1])

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.abort()
        self._connections.clear()
        await asyncio.sleep(0)

    # -- requests -------------------------------------------------------------------------------

    def apply(
        self, code: int, body: bytes, connection: _Connection
    ) -> _Answer | tuple[Status, bytes]:
        """Carry out one request on the store. Returns the reply when it needs no sync, else a
        function computing it once what the request wrote is durable. Store errors raise."""
        request = BodyReader(body)
        store = self.store
        if code == Op.WRITE:
            log_id, epoch, seq, crc = request.string(), request.u64(), request.u64(), request.u32()
            if store.apply_write(log_id, epoch, seq, request.rest(), crc):
                return _deleting_dead_segments(store, _ok)
            return _ok
        if code == Op.HELLO:
            token = request.rest()
            if self.token is not None and not hmac.compare_digest(token, self.token.encode()):
                return Status.UNAUTHORIZED, b"wrong token"
            connection.authenticated = True
            return _OK
        if not connection.authenticated:
            return Status.UNAUTHORIZED, b"send HELLO with the server's token first"
        if code == Op.PING:
            request.end()
            return _OK
        if code in (Op.CLAIM, Op.CLAIM_IDENTIFIED):
            log_id, epoch = request.string(), request.u64()
            identified = code == Op.CLAIM_IDENTIFIED
            identity = decode_identity(request) if identified else None
            request.end()
            store.apply_claim(log_id, epoch, identity)
            return _listing(store, log_id, identified)
        if code in (Op.LIST, Op.LIST_IDENTIFIED):
            log_id = request.string()
            request.end()
            return _listing(store, log_id, code == Op.LIST_IDENTIFIED)
        if code == Op.READ:
            log_id, seq = request.string(), request.u64()
            request.end()
            epoch, data = store.read_now(log_id, seq)
            return Status.OK, pack_u64(epoch) + data
        if code == Op.SEAL:
            log_id, epoch, end_seq = request.string(), request.u64(), request.u64()
            request.end()
            store.apply_seal(log_id, epoch, end_seq)
            return _deleting_dead_segments(store, _ok)
        if code == Op.TRIM:
            log_id, epoch, through_seq = request.string(), request.u64(), request.u64()
            trim_offset = request.i64()
            request.end()
            store.apply_trim(log_id, epoch, through_seq, trim_offset)
            return _deleting_dead_segments(store, _ok)
        return Status.BAD_REQUEST, f"unknown operation {code}".encode()


def _listing(store: ChunkStore, log_id: str, identified: bool) -> _Answer:
    return lambda: (Status.OK, encode_listing(store.listing(log_id), identified=identified))


def _deleting_dead_segments(store: ChunkStore, answer: _Answer) -> _Answer:
    def answer_after_deleting() -> tuple[Status, bytes]:
        store.delete_dead_segments()
        return answer()

    return answer_after_deleting


def _error_reply(exc: Exception, code: int) -> tuple[Status, bytes]:
    """The error reply to a request ``code`` that raised ``exc`` (unexpected ones are logged)."""
    if isinstance(exc, FencedError):
        return Status.FENCED, str(exc).encode()
    if isinstance(exc, NotFound):
        return Status.NOT_FOUND, str(exc).encode()
    if isinstance(exc, PreconditionFailed):
        return Status.CONFLICT, str(exc).encode()
    if isinstance(exc, IdentityMismatch):
        return Status.IDENTITY_MISMATCH, str(exc).encode()
    if isinstance(exc, CorruptionError):
        return Status.CORRUPT, str(exc).encode()
    if isinstance(exc, FrameError | ValueError):
        return Status.BAD_REQUEST, str(exc).encode()
    log.error("request %s failed: %s: %s", code, type(exc).__name__, exc)
    return Status.INTERNAL, f"{type(exc).__name__}: {exc}".encode()


class _Connection(asyncio.Protocol):
    """One client connection: frames are parsed from the bytes as they arrive."""

    def __init__(self, server: ChunkServer) -> None:
        self.server = server
        self.authenticated = server.token is None
        self._transport: asyncio.Transport | None = None
        self._frames = FrameReader(server.max_frame_bytes)
        self._outstanding = 0
        self._reading_paused = False
        self._writing_paused = False
        self._stall: asyncio.TimerHandle | None = None
        self._closed = False

    # -- transport events -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's, only alike.
        self._transport = cast(asyncio.Transport, transport)
        self.server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server._connections.discard(self)
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            for frame in self._frames.feed(data):
                if isinstance(frame, FrameError):
                    self._reply(0, Status.BAD_REQUEST, str(frame).encode())
                    continue
                self._request(frame.code, frame.request_id, frame.body)
                if self._closed:
                    return
        except FrameLengthError as exc:
            self._reply(0, Status.BAD_REQUEST, f"{exc}; closing the connection".encode())
            self._close()
            return
        if self._frames.buffered:
            if self._stall is None:
                loop = asyncio.get_running_loop()
                self._stall = loop.call_later(FRAME_READ_TIMEOUT_S, self._stalled)
        elif self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def eof_received(self) -> bool:
        if self._frames.buffered:
            message = (
                b"truncated frame length"
                if self._frames.buffered < FRAME_PREFIX.size
                else b"truncated frame"
            )
            self._reply(0, Status.BAD_REQUEST, message)
        self._close()
        return False

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    # -- requests -------------------------------------------------------------------------------

    def _request(self, code: int, request_id: int, body: bytes) -> None:
        self._outstanding += 1
        self._update_reading()
        if self.server.delay_s:
            loop = asyncio.get_running_loop()
            loop.call_later(self.server.delay_s, self._execute, code, request_id, body)
        else:
            self._execute(code, request_id, body)

    def _execute(self, code: int, request_id: int, body: bytes) -> None:
        try:
            outcome = self.server.apply(code, body, self)
        except (WalstreamError, ValueError, OSError) as exc:
            self._answer(request_id, *_error_reply(exc, code))
            return
        if isinstance(outcome, tuple):
            self._answer(request_id, *outcome)
            return

        def durable(error: OSError | None) -> None:
            if error is not None:
                self._answer(request_id, *_error_reply(error, code))
                return
            try:
                status, reply = outcome()
            except (WalstreamError, OSError) as exc:
                status, reply = _error_reply(exc, code)
            self._answer(request_id, status, reply)

        self.server.store.when_durable(durable)

    def _answer(self, request_id: int, status: Status, body: bytes) -> None:
        self._outstanding -= 1
        self._reply(request_id, status, body)
        self._update_reading()

    def _reply(self, request_id: int, status: Status, body: bytes) -> None:
        transport = self._transport
        if transport is not None and not self._closed and not transport.is_closing():
            transport.write(encode_frame(status, request_id, body))

    # -- flow control and closing ---------------------------------------------------------------

    def _update_reading(self) -> None:
        """Back-pressure: no new requests while too many are in progress or the client does not
        read its replies."""
        transport = self._transport
        if transport is None or self._closed:
            return
        pause = self._writing_paused or self._outstanding >= MAX_REQUESTS_PER_CONNECTION
        if pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def _stalled(self) -> None:
        self._stall = None
        if self._frames.buffered and not self._closed:
            self._reply(0, Status.BAD_REQUEST, b"truncated frame")
            self._close()

    def _close(self) -> None:
        """Close after the replies written so far (requests still waiting for their sync are
        applied but not answered: the client sees the connection end with them in flight)."""
        if self._transport is not None and not self._closed:
            self._transport.close()
        self._closed = True
        self._frames.clear()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._closed = True


def _parse_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


async def _run(args: argparse.Namespace) -> None:
    store = ChunkStore(args.data, segment_bytes=args.segment_bytes)
    store.open()
    server = ChunkServer(
        store,
        token=args.token,
        max_frame_bytes=args.max_frame_bytes,
        delay_s=args.delay_ms / 1000.0,
    )
    host, port = await server.start(*args.listen)
    print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    serving = asyncio.create_task(server.serve_forever())
    await stop.wait()
    await server.stop()
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    store.close()


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit(
                    "walstream-chunkd: --event-loop uvloop: pip install uvloop"
                ) from None
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="walstream-chunkd", description="walstream chunk server: stores WAL chunks on disk"
    )
    parser.add_argument(
        "--listen", type=_parse_listen, required=True, help="HOST:PORT (port 0: any free port)"
    )
    parser.add_argument("--data", type=Path, required=True, help="folder for the segment files")
    parser.add_argument("--token", default=None, help="shared secret clients must present")
    parser.add_argument(
        "--segment-bytes", type=int, default=DEFAULT_SEGMENT_BYTES, help="segment rotation size"
    )
    parser.add_argument(
        "--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES, help="largest request"
    )
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=0.0,
        help="debugging: answer every request this much later (simulates a slow server)",
    )
    parser.add_argument(
        "--event-loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="auto: uvloop when it is installed (less CPU per request), else asyncio's",
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="chunkd %(levelname)s %(message)s")
    try:
        with asyncio.Runner(loop_factory=_loop_factory(args.event_loop)) as runner:
            runner.run(_run(args))
    except CorruptionError as exc:
        print(f"walstream-chunkd: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
