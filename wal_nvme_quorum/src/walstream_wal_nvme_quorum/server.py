"""``walstream-chunkd``: the chunk server, one per local disk.

    walstream-chunkd --listen 127.0.0.1:7400 --data /mnt/nvme0/walstream [--token SECRET]

It serves the binary protocol of :mod:`.protocol` over TCP and stores chunks with
:class:`.store.ChunkStore`. A malformed request gets an error reply; the server keeps serving
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
from pathlib import Path

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
    MIN_FRAME_LENGTH,
    BodyReader,
    FrameError,
    Op,
    Status,
    decode_identity,
    encode_frame,
    encode_listing,
    pack_u64,
    parse_frame,
)
from .store import DEFAULT_SEGMENT_BYTES, ChunkStore

__all__ = ["ChunkServer", "main"]

log = logging.getLogger("walstream.chunkd")

#: Requests one connection may have in progress; reading pauses beyond it (back-pressure).
MAX_REQUESTS_PER_CONNECTION = 256
#: A frame that started arriving must finish within this time.
FRAME_READ_TIMEOUT_S = 30.0


class ChunkServer:
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
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve_connection, host, port)
        address = self._server.sockets[0].getsockname()
        return str(address[0]), int(address[1])

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    # -- one connection -------------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        slots = asyncio.Semaphore(MAX_REQUESTS_PER_CONNECTION)
        handlers: set[asyncio.Task[None]] = set()
        authenticated = [self.token is None]
        try:
            while True:
                try:
                    prefix = await reader.readexactly(FRAME_PREFIX.size)
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        self._reply(writer, 0, Status.BAD_REQUEST, b"truncated frame length")
                    break
                (length,) = FRAME_PREFIX.unpack(prefix)
                if length < MIN_FRAME_LENGTH or length > self.max_frame_bytes:
                    self._reply(
                        writer,
                        0,
                        Status.BAD_REQUEST,
                        f"frame length {length} outside {MIN_FRAME_LENGTH}.."
                        f"{self.max_frame_bytes}; closing the connection".encode(),
                    )
                    break
                try:
                    payload = await asyncio.wait_for(
                        reader.readexactly(length), FRAME_READ_TIMEOUT_S
                    )
                except (asyncio.IncompleteReadError, TimeoutError):
                    self._reply(writer, 0, Status.BAD_REQUEST, b"truncated frame")
                    break
                try:
                    frame = parse_frame(payload)
                except FrameError as exc:
                    self._reply(writer, 0, Status.BAD_REQUEST, str(exc).encode())
                    continue
                await slots.acquire()
                handler = asyncio.create_task(
                    self._handle(frame.code, frame.request_id, frame.body, writer, authenticated)
                )
                handlers.add(handler)
                handler.add_done_callback(handlers.discard)
                handler.add_done_callback(lambda _: slots.release())
        except (ConnectionError, OSError):
            pass
        finally:
            self._connections.discard(task)
            for handler in list(handlers):
                handler.cancel()
            try:
                await writer.drain()
                writer.close()
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, request_id: int, status: Status, body: bytes) -> None:
        if not writer.is_closing():
            writer.write(encode_frame(status, request_id, body))

    async def _handle(
        self,
        code: int,
        request_id: int,
        body: bytes,
        writer: asyncio.StreamWriter,
        authenticated: list[bool],
    ) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        try:
            status, reply = await self._dispatch(code, body, authenticated)
        except FencedError as exc:
            status, reply = Status.FENCED, str(exc).encode()
        except NotFound as exc:
            status, reply = Status.NOT_FOUND, str(exc).encode()
        except PreconditionFailed as exc:
            status, reply = Status.CONFLICT, str(exc).encode()
        except IdentityMismatch as exc:
            status, reply = Status.IDENTITY_MISMATCH, str(exc).encode()
        except CorruptionError as exc:
            status, reply = Status.CORRUPT, str(exc).encode()
        except (FrameError, ValueError) as exc:
            status, reply = Status.BAD_REQUEST, str(exc).encode()
        except (WalstreamError, OSError) as exc:
            log.exception("request %s failed", code)
            status, reply = Status.INTERNAL, f"{type(exc).__name__}: {exc}".encode()
        self._reply(writer, request_id, status, reply)
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            pass

    async def _dispatch(
        self, code: int, body: bytes, authenticated: list[bool]
    ) -> tuple[Status, bytes]:
        request = BodyReader(body)
        if code == Op.HELLO:
            token = request.rest()
            if self.token is not None and not hmac.compare_digest(token, self.token.encode()):
                return Status.UNAUTHORIZED, b"wrong token"
            authenticated[0] = True
            return Status.OK, b""
        if not authenticated[0]:
            return Status.UNAUTHORIZED, b"send HELLO with the server's token first"
        store = self.store
        if code == Op.PING:
            request.end()
            return Status.OK, b""
        if code == Op.CLAIM:
            log_id, epoch = request.string(), request.u64()
            request.end()
            return Status.OK, encode_listing(await store.claim(log_id, epoch))
        if code == Op.LIST:
            log_id = request.string()
            request.end()
            return Status.OK, encode_listing(await store.list_chunks(log_id))
        if code == Op.CLAIM_IDENTIFIED:
            log_id, epoch = request.string(), request.u64()
            identity = decode_identity(request)
            request.end()
            listing = await store.claim(log_id, epoch, identity)
            return Status.OK, encode_listing(listing, identified=True)
        if code == Op.LIST_IDENTIFIED:
            log_id = request.string()
            request.end()
            return Status.OK, encode_listing(await store.list_chunks(log_id), identified=True)
        if code == Op.WRITE:
            log_id, epoch, seq, crc = request.string(), request.u64(), request.u64(), request.u32()
            await store.write(log_id, epoch, seq, request.rest(), crc)
            return Status.OK, b""
        if code == Op.READ:
            log_id, seq = request.string(), request.u64()
            request.end()
            epoch, data = await store.read(log_id, seq)
            return Status.OK, pack_u64(epoch) + data
        if code == Op.SEAL:
            log_id, epoch, end_seq = request.string(), request.u64(), request.u64()
            request.end()
            await store.seal(log_id, epoch, end_seq)
            return Status.OK, b""
        if code == Op.TRIM:
            log_id, epoch, through_seq = request.string(), request.u64(), request.u64()
            trim_offset = request.i64()
            request.end()
            await store.trim(log_id, epoch, through_seq, trim_offset)
            return Status.OK, b""
        return Status.BAD_REQUEST, f"unknown operation {code}".encode()


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
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="chunkd %(levelname)s %(message)s")
    try:
        asyncio.run(_run(args))
    except CorruptionError as exc:
        print(f"walstream-chunkd: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
