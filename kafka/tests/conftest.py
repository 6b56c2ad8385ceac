"""Fixtures of the Kafka listener's tests: a real ``walstream serve`` process with a ``kafka:``
section (the clients connect to it as to any Kafka broker)."""

from __future__ import annotations

import asyncio
import itertools
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from walstream_conformance.harness.child import free_port
from walstream_conformance.harness.serve import WalstreamServe

TOKEN = "kafka-test-token"

PRODUCE = 0
"""Kafka's API key of Produce requests."""


class ProduceAnswerRelay:
    """A TCP relay in front of a Kafka listener, on a port of its own and a thread of its own,
    that hands the fate of every Produce answer to :meth:`on_produce_answer`: relayed when it
    returns true, swallowed when false; when it raises, the client's connection is closed.
    Every other request and answer passes unchanged."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def on_produce_answer(self) -> bool:
        return True

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._relay, "127.0.0.1", self.port)
        )
        ready.set()
        self.loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        produce_ids: set[int] = set()

        async def requests() -> None:
            while True:
                head = await reader.readexactly(4)
                frame = await reader.readexactly(struct.unpack(">i", head)[0])
                api_key, _version, correlation = struct.unpack_from(">hhi", frame)
                if api_key == PRODUCE:
                    produce_ids.add(correlation)
                up_writer.write(head + frame)
                await up_writer.drain()

        async def answers() -> None:
            while True:
                head = await up_reader.readexactly(4)
                frame = await up_reader.readexactly(struct.unpack(">i", head)[0])
                (correlation,) = struct.unpack_from(">i", frame)
                if correlation in produce_ids and not self.on_produce_answer():
                    continue
                writer.write(head + frame)
                await writer.drain()

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(answers())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for stream in (writer, up_writer):
            stream.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class KafkaServer:
    process: WalstreamServe
    bootstrap: str
    url: str
    token: str | None


def start_server(
    folder: Path,
    *,
    token: str | None = None,
    advertise: str | None = None,
    kafka_port: int | None = None,
    kafka_options: str = "",
    extra: str = "",
) -> KafkaServer:
    """A ``walstream serve`` with a ``kafka:`` section (``kafka_options``: more keys of it, as
    ``, key: value``; ``extra``: more YAML sections)."""
    port = kafka_port or free_port()
    advertised = f", advertise: '{advertise}'" if advertise else ""
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        "wal: {type: ebs, path: data/wal.img, capacity: 128MiB}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 1MiB, max_interval: 100ms}\n"
        f"kafka: {{listen: '127.0.0.1:{port}'{advertised}{kafka_options}}}\n"
        f"{extra}"
    )
    process = WalstreamServe(deployment, token=token)
    url = process.start()
    return KafkaServer(process, f"127.0.0.1:{port}", url, token)


@pytest.fixture(scope="module")
def kafka_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """One server (no token) shared by a module's tests; each test uses its own topics."""
    server = start_server(tmp_path_factory.mktemp("kafka"))
    try:
        yield server
    finally:
        server.process.stop_cleanly()


_names = itertools.count()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (dots included, as Kafka allows)."""
    return f"t.{request.node.name[:60].replace('[', '_').replace(']', '')}.{next(_names)}".replace(
        "-", "_"
    )
