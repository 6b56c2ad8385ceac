"""Each Kafka client produces to and consumes from a real ``walstream serve`` with its default
settings, and with each compression codec: kcat (librdkafka's command line, from Debian),
kafka-python, aiokafka and confluent-kafka (librdkafka). CI runs one codec per client; ``--soak``
runs every client with every codec."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest

from .conftest import KafkaServer

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
#: The codec each client runs in CI (each codec is covered by one client).
CI_CODEC = {"kcat": "zstd", "kafka-python": "gzip", "aiokafka": "lz4", "confluent-kafka": "snappy"}
RECORDS = 50


def records() -> list[tuple[bytes, bytes]]:
    return [
        (b"key-%d" % index, b"value-%d-" % index + bytes(range(256))) for index in range(RECORDS)
    ]


def pick(client: str, codec: str, soak: bool) -> None:
    if not soak and CI_CODEC[client] != codec:
        pytest.skip(f"{client} with {codec} runs with --soak (CI runs {CI_CODEC[client]})")


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_kcat_produces_and_consumes(
    kafka_server: KafkaServer, topic: str, codec: str, soak: bool
) -> None:
    pick("kcat", codec, soak)
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.fail("kcat is not installed: make install installs Debian's kcat")
    lines = "".join(f"k{index}:v{index}\n" for index in range(RECORDS))
    subprocess.run(
        [kcat, "-b", kafka_server.bootstrap, "-P", "-t", topic, "-K:", "-z", codec],
        input=lines.encode(),
        check=True,
        timeout=120,
    )
    consumed = (
        subprocess.run(
            [
                kcat,
                "-b",
                kafka_server.bootstrap,
                "-C",
                "-t",
                topic,
                "-o",
                "beginning",
                "-e",
                "-f",
                "%k=%s@%o\n",
            ],
            capture_output=True,
            check=True,
            timeout=120,
        )
        .stdout.decode()
        .splitlines()
    )
    assert consumed == [f"k{index}=v{index}@{index}" for index in range(RECORDS)]


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_produces_and_consumes(
    kafka_server: KafkaServer, topic: str, codec: str, soak: bool
) -> None:
    pick("kafka-python", codec, soak)
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=kafka_server.bootstrap,
        compression_type=None if codec == "none" else codec,
    )
    sent = [
        producer.send(topic, key=key, value=value, headers=[("n", key)]) for key, value in records()
    ]
    producer.flush()
    offsets = [future.get(timeout=60).offset for future in sent]
    producer.close()
    assert offsets == list(range(RECORDS))
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_server.bootstrap,
        auto_offset_reset="earliest",
        group_id=f"{topic}-group",
        consumer_timeout_ms=10_000,
    )
    got = []
    for message in consumer:
        got.append((message.key, message.value, message.headers, message.offset))
        if len(got) == RECORDS:
            break
    consumer.close()
    assert got == [(k, v, [("n", k)], index) for index, (k, v) in enumerate(records())]


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_produces_and_consumes(
    kafka_server: KafkaServer, topic: str, codec: str, soak: bool
) -> None:
    pick("aiokafka", codec, soak)
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run() -> list[tuple[bytes | None, bytes | None, int]]:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_server.bootstrap,
            compression_type=None if codec == "none" else codec,
        )
        await producer.start()
        try:
            for key, value in records():
                await producer.send(topic, key=key, value=value)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka_server.bootstrap,
            auto_offset_reset="earliest",
            group_id=f"{topic}-group",
        )
        await consumer.start()
        got: list[tuple[bytes | None, bytes | None, int]] = []
        try:
            async with asyncio.timeout(60):
                while len(got) < RECORDS:
                    for messages in (await consumer.getmany(timeout_ms=1000)).values():
                        got += [(m.key, m.value, m.offset) for m in messages]
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(run())
    assert got == [(k, v, index) for index, (k, v) in enumerate(records())]


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_produces_and_consumes(
    kafka_server: KafkaServer, topic: str, codec: str, soak: bool
) -> None:
    pick("confluent-kafka", codec, soak)
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": kafka_server.bootstrap, "compression.type": codec})
    delivered: list[int] = []
    for key, value in records():
        producer.produce(
            topic,
            key=key,
            value=value,
            headers=[("n", key)],
            on_delivery=lambda error, message: delivered.append(
                message.offset() if error is None else -1
            ),
        )
    assert producer.flush(60) == 0
    assert delivered == list(range(RECORDS))
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_server.bootstrap,
            "group.id": f"{topic}-group",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < RECORDS and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None or message.error() is not None:
            continue
        got.append((message.key(), message.value(), message.headers(), message.offset()))
    consumer.close()
    assert got == [(k, v, [("n", k)], index) for index, (k, v) in enumerate(records())]


def test_an_admin_client_lists_every_topic(kafka_server: KafkaServer, topic: str) -> None:
    """``AdminClient.list_topics()`` (a Metadata request for every topic, which librdkafka
    sends with bytes after its body) lists the brokers and the topics."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 2)]).values():
        future.result(60)
    listed = admin.list_topics(timeout=60)
    assert sorted(listed.brokers) == [1]
    assert sorted(listed.topics[topic].partitions) == [0, 1]
