"""Fixtures of the Kafka listener's tests: a real ``walstream serve`` process with a ``kafka:``
section (the clients connect to it as to any Kafka broker)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from walstream_conformance.harness.child import free_port
from walstream_conformance.harness.serve import WalstreamServe

TOKEN = "kafka-test-token"


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
