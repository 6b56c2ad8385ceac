"""Scenarios across clients and interfaces: a consumer group rebalancing and resuming from its
committed offsets (confluent-kafka), an idempotent producer whose first attempt is cut off by
the server being written once (confluent-kafka through a proxy that drops the first produce
answer), and Kafka-produced records read back through S2's SDK."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from walstream_conformance.harness.child import free_port

from .conftest import KafkaServer, ProduceAnswerRelay, start_server


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions)]).values():
        future.result(60)


def produce(bootstrap: str, topic: str, values: list[bytes], **config: object) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    failures: list[object] = []
    for index, value in enumerate(values):
        producer.produce(
            topic,
            value=value,
            partition=index % 4,
            on_delivery=lambda error, _m: failures.append(error) if error else None,
        )
    assert producer.flush(60) == 0
    assert failures == []


REBALANCING = (
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
)


class Member:
    """A consumer-group member polled in its own thread; ``assigned`` is its current set."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
            }
        )
        self.assigned: set[int] = set()
        self.values: list[bytes] = []
        self.uncommitted: list[bytes] = []
        """Values whose commit a rebalance refused: the partition's next owner may read them
        again."""
        self.stop = threading.Event()
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _c, parts: self._set({p.partition for p in parts}),
            on_revoke=lambda _c, _parts: self._set(set()),
        )
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _set(self, parts: set[int]) -> None:
        self.assigned = parts

    def _run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is not None and message.error() is None:
                self.values.append(message.value())
                try:
                    self.consumer.commit(message=message, asynchronous=False)
                except KafkaException as refused:
                    # A commit racing a rebalance is refused, as by a Kafka broker (a member
                    # that joins while another consumes, on a loaded machine); the member
                    # keeps polling, or the rebalance waits for it forever.
                    if refused.args[0].code() not in REBALANCING:
                        raise
                    self.uncommitted.append(message.value())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.consumer.close()


def wait_until(condition, what: str, timeout_s: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_consumer_group_rebalances_and_resumes_from_committed_offsets(
    kafka_server: KafkaServer, topic: str
) -> None:
    bootstrap = kafka_server.bootstrap
    create_topic(bootstrap, topic, 4)
    group = f"{topic}-group"
    first_values = [b"a%d" % index for index in range(40)]

    def covered(members: list[Member]) -> bool:
        sets = [member.assigned for member in members]
        return all(sets) and sum(map(len, sets)) == 4 and set().union(*sets) == {0, 1, 2, 3}

    members = [Member(bootstrap, group, topic), Member(bootstrap, group, topic)]
    refused: set[bytes] = set()
    try:
        wait_until(lambda: covered(members), "2 members to share the 4 partitions")
        # Produced once the group settled: had the first member started reading before the
        # second joined, its commits would race that rebalance (refused, read again later).
        produce(bootstrap, topic, first_values)
        wait_until(
            lambda: len({value for m in members for value in m.values}) == 40,
            "the first 40 records",
        )
        members.append(Member(bootstrap, group, topic))
        wait_until(lambda: covered(members), "a rebalance over 3 members")
        leaving = members.pop(0)
        leaving.close()
        wait_until(lambda: covered(members), "a rebalance over the 2 remaining members")
        everyone = [*members, leaving]
        consumed = [value for member in everyone for value in member.values]
        assert sorted(set(consumed)) == sorted(first_values)
        # committed offsets: nothing read twice, except a record whose commit was refused
        refused = {value for member in everyone for value in member.uncommitted}
        twice = {value for value in consumed if consumed.count(value) > 1}
        assert twice <= refused, twice
    finally:
        for member in members:
            member.close()
    # Everyone left; the group's committed offsets bring a new member to exactly the new records
    # (and to none it read before, but those whose commit was refused).
    later_values = [b"b%d" % index for index in range(20)]
    produce(bootstrap, topic, later_values)
    resumed = Member(bootstrap, group, topic)
    try:
        wait_until(
            lambda: set(later_values) <= set(resumed.values),
            "the 20 records produced after the commits",
        )
        time.sleep(1.0)  # a record read twice would show up within a few polls
        assert sorted(value for value in resumed.values if value not in refused) == sorted(
            later_values
        )
    finally:
        resumed.close()


class DropFirstProduceAnswer(ProduceAnswerRelay):
    """A TCP proxy in front of the Kafka listener that closes the client's connection instead
    of relaying the first Produce answer: the batch is stored, the client never hears so."""

    def __init__(self, upstream_port: int) -> None:
        self.dropped = 0
        super().__init__(upstream_port)

    def on_produce_answer(self) -> bool:
        if self.dropped == 0:
            self.dropped += 1
            raise ConnectionResetError("dropped the first produce answer")
        return True


@pytest.fixture
def proxied(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[KafkaServer, DropFirstProduceAnswer]]:
    kafka_port = free_port()
    proxy = DropFirstProduceAnswer(kafka_port)
    server = start_server(
        tmp_path_factory.mktemp("proxied"),
        kafka_port=kafka_port,
        advertise=f"127.0.0.1:{proxy.port}",
    )
    try:
        yield server, proxy
    finally:
        server.process.stop_cleanly()
        proxy.close()


@pytest.mark.slow
def test_an_idempotent_retry_is_written_once(
    proxied: tuple[KafkaServer, DropFirstProduceAnswer], topic: str
) -> None:
    _server, proxy = proxied
    bootstrap = f"127.0.0.1:{proxy.port}"
    create_topic(bootstrap, topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 0,
            "message.timeout.ms": 60_000,
        }
    )
    offsets: list[int] = []
    producer.produce(
        topic,
        value=b"once",
        on_delivery=lambda e, m: offsets.append(m.offset() if e is None else -1),
    )
    assert producer.flush(60) == 0
    assert proxy.dropped == 1  # the first attempt's answer was cut off
    producer.produce(
        topic,
        value=b"after",
        on_delivery=lambda e, m: offsets.append(m.offset() if e is None else -1),
    )
    assert producer.flush(60) == 0
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic}-g", "auto.offset.reset": "earliest"}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(values) < 3:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
        elif values == [b"once", b"after"]:
            break
    consumer.close()
    assert values == [b"once", b"after"]
    assert offsets == [0, 1]


@pytest.mark.slow
def test_kafka_records_read_back_through_s2_sdk(
    tmp_path_factory: pytest.TempPathFactory, topic: str
) -> None:
    s2_sdk = pytest.importorskip("s2_sdk")
    server = start_server(tmp_path_factory.mktemp("s2"), token="s2-token")
    try:
        producer = Producer(
            {
                "bootstrap.servers": server.bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "PLAIN",
                "sasl.username": "any",
                "sasl.password": "s2-token",
            }
        )
        sent = [
            (
                b"key-%d" % index,
                b"value-%d" % index,
                [("trace", b"t%d" % index), ("bin", b"\x00\xff")],
                1_700_000_000_000 + index * 1000,
            )
            for index in range(10)
        ]
        for key, value, headers, timestamp in sent:
            producer.produce(topic, key=key, value=value, headers=headers, timestamp=timestamp)
        assert producer.flush(60) == 0

        async def read() -> list[object]:
            client = s2_sdk.S2(
                "s2-token", endpoints=s2_sdk.Endpoints(account=server.url, basin=server.url)
            )
            try:
                stream = client.basin("walstream").stream(f"_k.{topic}.0")
                batch = await stream.read(start=s2_sdk.SeqNum(0))
                return list(batch.records)
            finally:
                await client.close()

        records = asyncio.run(read())
        got = [
            (
                dict(record.headers).get(b"walstream-key"),
                record.body,
                [
                    (name.decode(), data)
                    for name, data in record.headers
                    if name != b"walstream-key"
                ],
                record.timestamp,
            )
            for record in records
        ]
        assert got == [(k, v, h, ts) for k, v, h, ts in sent]
    finally:
        server.process.stop_cleanly()
