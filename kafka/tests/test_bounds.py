"""What a hostile or broken client cannot do to the Kafka listener, and TLS.

- one remote address holds at most ``kafka.max_connections_per_address`` connections; a
  connection over it is closed at accept, and one closed makes room;
- a request frame over ``kafka.max_request_size`` closes its connection before the body is
  read (a 2 GiB length costs the server nothing);
- a client that pipelines fetches and never reads their answers is cut off after
  ``kafka.send_timeout``, its answers dropped;
- with ``server.tls`` the listener speaks TLS: confluent-kafka produces and consumes over
  ``SASL_SSL``, and a cleartext client gets no answer.

Every case checks that the server still serves a well-behaved client afterwards.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .conftest import TOKEN, KafkaServer, start_server

pytestmark = pytest.mark.slow

TIMEOUT_S = 60.0


def api_versions_request(correlation: int) -> bytes:
    """ApiVersions v0 (no body): every Kafka server answers it before authentication."""
    body = struct.pack(">hhih", 18, 0, correlation, 4) + b"test"
    return struct.pack(">i", len(body)) + body


def read_answer(sock: socket.socket) -> bytes:
    """One answer frame; b"" when the server closed the connection."""
    head = receive(sock, 4)
    if len(head) < 4:
        return b""
    return receive(sock, struct.unpack(">i", head)[0])


def receive(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        try:
            chunk = sock.recv(count - len(data))
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    return data


def connect(server: KafkaServer) -> socket.socket:
    host, port = server.bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    return sock


def still_serves(server: KafkaServer) -> None:
    with connect(server) as sock:
        sock.sendall(api_versions_request(7))
        answer = read_answer(sock)
        assert answer[:4] == struct.pack(">i", 7), "a well-behaved client gets no answer"


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = start_server(
        tmp_path_factory.mktemp("bounded"),
        kafka_options=(
            ", max_connections_per_address: 3, send_timeout: 500ms, max_request_size: 1MiB"
        ),
    )
    try:
        yield server
    finally:
        server.process.stop_cleanly()


def test_one_address_holds_at_most_its_connections(bounded: KafkaServer) -> None:
    held = [connect(bounded) for _ in range(3)]
    try:
        for index, sock in enumerate(held):  # each is served
            sock.sendall(api_versions_request(index))
            assert read_answer(sock)[:4] == struct.pack(">i", index)
        with connect(bounded) as extra:
            extra.sendall(api_versions_request(99))
            assert read_answer(extra) == b"", "a 4th connection from one address was served"
        held.pop().close()
        deadline = time.monotonic() + TIMEOUT_S
        while True:  # the server notices the close on its own time: the room comes back
            with connect(bounded) as again:
                again.sendall(api_versions_request(5))
                if read_answer(again)[:4] == struct.pack(">i", 5):
                    break
            assert time.monotonic() < deadline, "a closed connection never made room"
            time.sleep(0.05)
    finally:
        for sock in held:
            sock.close()


def test_an_oversized_frame_closes_its_connection_unread(bounded: KafkaServer) -> None:
    with connect(bounded) as sock:
        sock.sendall(struct.pack(">i", 2**31 - 1) + b"\0" * 64)
        assert read_answer(sock) == b""
    still_serves(bounded)


def fetch_request(correlation: int, topic: str, max_bytes: int) -> bytes:
    """Fetch v4 of partition 0 from offset 0, up to ``max_bytes``."""
    name = topic.encode()
    body = struct.pack(">hhih", 1, 4, correlation, 4) + b"test"
    body += struct.pack(">iiiib", -1, 0, 1, max_bytes, 0)
    body += struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iiqi", 1, 0, 0, max_bytes)
    return struct.pack(">i", len(body)) + body


def test_a_client_that_reads_no_answers_is_cut_off(bounded: KafkaServer, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bounded.bootstrap, "linger.ms": 50})
    for _ in range(8):
        producer.produce(topic, value=b"x" * 100_000, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    with connect(bounded) as sock:
        # 32 fetches of ~800 kB each (26 MB) pipelined; not one answer byte read meanwhile.
        for index in range(32):
            sock.sendall(fetch_request(index, topic, 1 << 20))
        deadline = time.monotonic() + TIMEOUT_S
        while "kafka.send_timeout" not in bounded.process._read_log(tail_chars=None):
            assert time.monotonic() < deadline, "the server never cut the non-reader off"
            time.sleep(0.1)
        received = 0
        while read_answer(sock):
            received += 1
        assert received < 32
    still_serves(bounded)


# -- TLS -----------------------------------------------------------------------------------------


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "walstream kafka test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certificate_path, key_path = folder / "server.pem", folder / "server.key"
    certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certificate_path, key_path


def test_over_tls_with_sasl_plain(tmp_path: Path, topic: str) -> None:
    certificate, key = self_signed(tmp_path)
    server = start_server(
        tmp_path,
        token=TOKEN,
        extra=f"server: {{tls: {{certificate: '{certificate}', key: '{key}'}}}}\n",
    )
    try:
        with connect(server) as sock:  # cleartext: no Kafka answer
            sock.sendall(api_versions_request(1))
            assert not read_answer(sock).startswith(struct.pack(">i", 1))
        config = {
            "bootstrap.servers": server.bootstrap,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(certificate),
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "test",
            "sasl.password": TOKEN,
        }
        producer = Producer(config)
        producer.produce(topic, key=b"k", value=b"over tls")
        assert producer.flush(TIMEOUT_S) == 0
        consumer = Consumer({**config, "group.id": "tls-reader"})
        try:
            consumer.assign([TopicPartition(topic, 0, 0)])
            deadline = time.monotonic() + TIMEOUT_S
            message = None
            while message is None or message.error() is not None:
                assert time.monotonic() < deadline, "nothing read over TLS"
                message = consumer.poll(0.5)
            assert (message.key(), message.value()) == (b"k", b"over tls")
        finally:
            consumer.close()
    finally:
        server.process.stop_cleanly()
