"""The S3 gate of the cluster rig: a TCP forwarder from a fixed port to the moto server.

moto keeps its objects in memory, so the rig never restarts moto to simulate S3 going away: it
kills and restarts this forwarder instead (:meth:`.cluster.Cluster.restart_s3`), on the same
port, and nothing stored is lost.

``python -m walstream_metadata_postgres.testing.gate PORT UPSTREAM_PORT`` listens on
``127.0.0.1:PORT`` (0: a free port), prints ``PORT <n>`` once listening, forwards every
connection to ``127.0.0.1:UPSTREAM_PORT`` and exits when its standard input closes.
"""

from __future__ import annotations

import asyncio
import sys

__all__ = ["MODULE", "main", "serve_gate"]

MODULE = "walstream_metadata_postgres.testing.gate"
"""This module's importable name, for ``python -m`` (never ``__name__``, which is
``__main__`` when the module runs as a program)."""


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def serve_gate(port: int, upstream_port: int) -> None:
    """Forward connections from 127.0.0.1:``port`` to 127.0.0.1:``upstream_port`` until stdin
    closes; prints ``PORT n`` once listening."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))

    async def run() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        server.close()

    asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not all(arg.isdigit() for arg in args):
        print(f"usage: python -m {MODULE} PORT UPSTREAM_PORT", file=sys.stderr)
        return 2
    serve_gate(int(args[0]), int(args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
