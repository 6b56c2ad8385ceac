"""A no-op HTTP/1.1 server: prints ``PORT <n>``, then answers every request at once with a fixed
S2 append answer. Driving it shows what the load generator's client alone can do (``http-noop``
in ``bench/peers.py``).

    .venv/bin/python bench/common/noop_http.py

It imports nothing of ``common`` (it runs as a file, with ``bench/common`` first on
``sys.path``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from pathlib import Path
from typing import Any

_HEAD_END = b"\r\n\r\n"
_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_BODY = (
    b'{"start":{"seq_num":0,"timestamp":0},"end":{"seq_num":1,"timestamp":0},'
    b'"tail":{"seq_num":1,"timestamp":0}}'
)
_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(_BODY)
) + _BODY


def command() -> list[str]:
    """The command line that starts this server."""
    return [sys.executable, str(Path(__file__).resolve())]


class NoopServer(asyncio.Protocol):
    """Answers every request at once (Content-Length bodies only, what our client sends)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(_HEAD_END)
            if head_end < 0:
                return
            length = _LENGTH.search(bytes(self.buffer[:head_end]))
            end = head_end + 4 + (int(length.group(1)) if length else 0)
            if len(self.buffer) < end:
                return
            del self.buffer[:end]
            self.transport.write(_ANSWER)


async def serve() -> None:
    server = await asyncio.get_running_loop().create_server(NoopServer, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


def main() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
