"""The Kafka listener on three ``walstream serve`` nodes sharing one throwaway PostgreSQL and one
moto S3 (the cluster rig of ``walstream_metadata_postgres.testing.cluster``, each node with its
own s3 WAL and a ``kafka:`` section), and real SIGKILLs:

- the **coordinator** of a consumer group dies: the member carries on with the same generation
  at the new coordinator (no rebalance), its commits are accepted there, and a new member of
  the group starts at the committed offset;
- the **partition leader** dies while an idempotent confluent-kafka producer and a consumer are
  running: the clients find the new leader through Metadata, and every acknowledged record is
  in the partition exactly once (the consumer that was reading across the kill saw the same).

CI runs one partition and a few thousand records; ``--soak`` three partitions and more.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from walstream_conformance.harness.child import free_port
from walstream_metadata_postgres.testing.cluster import (
    Cluster,
    ClusterSettings,
    cluster_features_available,
)

from .conftest import ProduceAnswerRelay

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not cluster_features_available(), reason="this walstream has no leases"),
]

TIMEOUT_S = 180.0
"""Generous bound of every wait: a SIGKILLed node's lease runs out in 3 s (walstream's default),
a live node notices within a heartbeat and replays the dead node's WAL; the rest is room for a
loaded machine."""

SETTINGS = ClusterSettings(nodes=3, extra={"upload": {"max_interval": "200ms"}})
SASL = {
    "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanisms": "PLAIN",
    "sasl.username": "test",
    "sasl.password": SETTINGS.token,
}
"""The nodes have a token (the rig's), so every client authenticates with SASL/PLAIN."""


class AnswerGate(ProduceAnswerRelay):
    """A TCP relay in front of one node's Kafka listener (the address the node advertises).
    While :attr:`swallowing`, it relays requests but not the answers to Produce requests: the
    node stores the batch and answers, the client never hears so and retries elsewhere once
    the node is gone — the batch whose acknowledgement a crash cut off."""

    def __init__(self, upstream_port: int) -> None:
        self.swallowing = False
        self.swallowed = 0
        super().__init__(upstream_port)

    def on_produce_answer(self) -> bool:
        if self.swallowing:
            self.swallowed += 1
            return False
        return True


class KafkaCluster(Cluster):
    """The cluster rig with a ``kafka:`` section per node, on a port kept across restarts,
    advertising an :class:`AnswerGate` in front of it."""

    def __init__(self, settings: ClusterSettings, folder: Path) -> None:
        super().__init__(settings, folder)
        self.kafka_ports: dict[int, int] = {}
        self.gates: dict[int, AnswerGate] = {}

    def deployment(self, node_id: int, port: int) -> dict[str, Any]:
        document = super().deployment(node_id, port)
        kafka_port = self.kafka_ports.setdefault(node_id, free_port())
        gate = self.gates.get(node_id) or self.gates.setdefault(node_id, AnswerGate(kafka_port))
        document["kafka"] = {
            "listen": f"127.0.0.1:{kafka_port}",
            "advertise": f"127.0.0.1:{gate.port}",
        }
        return document

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for gate in self.gates.values():
                gate.close()

    def bootstrap(self, *nodes: int) -> str:
        return ",".join(f"127.0.0.1:{self.gates[node].port}" for node in nodes or self.nodes)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    rig = KafkaCluster(SETTINGS, tmp_path_factory.mktemp("kafka-cluster"))
    with rig:
        yield rig


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **SASL})
    for future in admin.create_topics([NewTopic(topic, partitions)]).values():
        future.result(60)


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition → the node Metadata names as its leader."""
    described = AdminClient({"bootstrap.servers": bootstrap, **SASL}).list_topics(topic, timeout=60)
    return {index: part.leader for index, part in described.topics[topic].partitions.items()}


def coordinator_of(group: str, live: list[int]) -> int:
    """The node that coordinates ``group`` while ``live`` are the live nodes (the listener's
    rule, :mod:`walstream_kafka.groups`)."""
    return sorted(live)[zlib.crc32(group.encode()) % len(live)]


def produce_all(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, **SASL})
    failures: list[object] = []
    for value in values:
        producer.produce(
            topic, value=value, on_delivery=lambda e, _m: failures.append(e) if e else None
        )
    assert producer.flush(60) == 0
    assert failures == []


def read_partition(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    """Every record of the partition, from offset 0 to its end."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, **SASL, "group.id": f"reader-{time.monotonic_ns()}"}
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=60)
        consumer.assign([TopicPartition(topic, partition, low)])
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < high - low and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
        return values
    finally:
        consumer.close()


# -- the group coordinator dies --------------------------------------------------------------------


def take(consumer: Consumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < count:
        assert time.monotonic() < deadline, f"read {len(values)} of {count} records"
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            values.append(message.value())
    return values


def commit(consumer: Consumer, topic: str, offset: int, cluster: KafkaCluster) -> None:
    """Commit ``offset`` of partition 0, retrying while the coordinator is being replaced."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
            return
        except KafkaException as error:
            if time.monotonic() > deadline:
                logs = "\n".join(f"node {n}: {log}" for n, log in cluster.node_logs().items())
                raise AssertionError(f"commit refused until the end: {error}\n{logs}") from None
            assert error.args[0].retriable() or error.args[0].code() in (
                KafkaError._TRANSPORT,
                KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_NOT_AVAILABLE,
                KafkaError._WAIT_COORD,
            ), error
            consumer.poll(0.2)


def test_a_group_carries_on_after_its_coordinator_is_sigkilled(cluster: KafkaCluster) -> None:
    topic = "orders.coordinator-kill"
    bootstrap = cluster.bootstrap()
    create_topic(bootstrap, topic, 1)
    values = [b"v%d" % index for index in range(100)]
    produce_all(bootstrap, topic, values)
    leader = leaders(bootstrap, topic)[0]
    live = sorted(cluster.nodes)
    # A group whose coordinator is not the partition's leader: the kill takes the group's
    # coordinator away and leaves its records readable.
    group = next(
        name
        for name in (f"billing-{index}" for index in range(1000))
        if coordinator_of(name, live) != leader
    )
    victim = coordinator_of(group, live)
    assignments: list[list[int]] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **SASL,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            # Longer than a coordinator failover: the member keeps its membership meanwhile.
            "session.timeout.ms": 45_000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe(
        [topic], on_assign=lambda _c, parts: assignments.append([p.partition for p in parts])
    )
    try:
        assert take(consumer, 50) == values[:50]
        commit(consumer, topic, 50, cluster)
        cluster.kill(victim)
        assert take(consumer, 30) == values[50:80]
        commit(consumer, topic, 80, cluster)  # accepted by the new coordinator, same generation
        # The new coordinator carried the group on: no rebalance, one assignment all along.
        assert assignments == [[0]]
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=60)
        assert committed[0].offset == 80
    finally:
        consumer.close()
    # A new member of the group starts at the committed offset.
    resumed = Consumer(
        {
            **SASL,
            "bootstrap.servers": cluster.bootstrap(*[n for n in live if n != victim]),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        resumed.subscribe([topic])
        assert take(resumed, 20) == values[80:]
    finally:
        resumed.close()
        cluster.start_node(victim)


def brokers_seen(bootstrap: str) -> set[int] | None:
    """The broker ids Metadata lists (through the nodes of ``bootstrap``); None when no answer
    came (a node being failed over may drop the connection)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **SASL})
    try:
        return set(admin.list_topics(timeout=10).brokers)
    except KafkaException:
        return None


def test_a_coordinator_paused_past_its_lease_serves_its_groups_after_it_rejoins(
    cluster: KafkaCluster,
) -> None:
    """SIGSTOP past the lease: the node is failed over, wakes up fenced and rejoins with a new
    epoch (a new client and metadata store); the groups it coordinates again work there."""
    topic = "orders.paused-coordinator"
    bootstrap = cluster.bootstrap()
    create_topic(bootstrap, topic, 1)
    values = [b"p%d" % index for index in range(20)]
    produce_all(bootstrap, topic, values)
    live = sorted(cluster.nodes)
    victim = live[-1]
    group = next(
        name for name in (f"audit-{i}" for i in range(1000)) if coordinator_of(name, live) == victim
    )
    others = cluster.bootstrap(*[node for node in live if node != victim])
    cluster.pause(victim)
    try:
        wait_until(
            lambda: victim not in (brokers_seen(others) or {victim}),
            "the paused node's lease to expire",
        )
    finally:
        cluster.resume(victim)
    # The woken node finds itself fenced, opens a new epoch and closes the old client (whose
    # metadata store the listener must no longer use).
    wait_until(
        lambda: "rejoined with epoch" in cluster.nodes[victim]._read_log(tail_chars=None),
        "the woken node to rejoin",
    )
    wait_until(lambda: victim in (brokers_seen(others) or set()), "Metadata to list it again")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **SASL,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        assert take(consumer, 10) == values[:10]
        commit(consumer, topic, 10, cluster)
    finally:
        consumer.close()
    resumed = Consumer(
        {
            "bootstrap.servers": bootstrap,
            **SASL,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        resumed.subscribe([topic])
        assert take(resumed, 10) == values[10:]
    finally:
        resumed.close()


# -- the partition leader dies ---------------------------------------------------------------------


class Tail:
    """A consumer reading the topic's partitions from offset 0 in its own thread."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, **SASL, "group.id": f"tail-{time.monotonic_ns()}"}
        )
        self.consumer.assign([TopicPartition(topic, index, 0) for index in range(partitions)])
        self.values: dict[int, list[bytes]] = {index: [] for index in range(partitions)}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is None:
                self.values[message.partition()].append(message.value())
            elif not message.error().retriable() and message.error().code() not in (
                KafkaError._TRANSPORT,
                KafkaError._PARTITION_EOF,
            ):
                self.errors.append(str(message.error()))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.consumer.close()


def test_the_partition_leader_is_sigkilled_nothing_acknowledged_is_lost_or_doubled(
    cluster: KafkaCluster, soak: bool
) -> None:
    partitions, total = (3, 30_000) if soak else (1, 3_000)
    topic = f"payments.leader-kill.{partitions}"
    bootstrap = cluster.bootstrap()
    create_topic(bootstrap, topic, partitions)
    produce_all(bootstrap, topic, [b"warm-up"] * partitions)  # every partition has an owner
    victim = leaders(bootstrap, topic)[0]
    acknowledged: list[bytes] = []
    failed: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **SASL,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": int(TIMEOUT_S * 1000),
        }
    )

    def delivered(error: KafkaError | None, message: Any) -> None:
        if error is None:
            acknowledged.append(message.value())
        else:
            failed.append(str(error))

    tail = Tail(bootstrap, topic, partitions)
    try:
        sent = 0

        def send() -> None:
            nonlocal sent
            producer.produce(topic, value=b"r%d" % sent, on_delivery=delivered)
            sent += 1
            producer.poll(0)

        while sent < total // 3:
            send()
        assert producer.flush(TIMEOUT_S) == 0
        # The leader stores batches whose acknowledgement it never gets to send, then dies:
        # the producer retries them at the next leader, which must not store them again.
        gate = cluster.gates[victim]
        gate.swallowing = True
        while gate.swallowed == 0 and sent < total:
            send()
            time.sleep(0.001)
        cluster.kill(victim)
        gate.swallowing = False
        killed_at = sent
        while sent < total:
            send()
            if sent % 100 == 0:
                time.sleep(0.01)  # records keep coming while the clients look for the leader
        assert producer.flush(TIMEOUT_S) == 0
        assert 0 < killed_at < total, "the producer finished before the kill"
        assert cluster.gates[victim].swallowed > 0
        assert failed == []
        assert len(acknowledged) == total
        stored = {
            index: read_partition(
                cluster.bootstrap(*[n for n in cluster.nodes if n != victim]), topic, index
            )
            for index in range(partitions)
        }
        everything = [value for values in stored.values() for value in values]
        counts = Counter(everything)
        doubled = {value for value, count in counts.items() if count > 1} - {b"warm-up"}
        assert doubled == set(), f"{len(doubled)} records stored twice"
        lost = set(acknowledged) - set(everything)
        assert lost == set(), f"{len(lost)} acknowledged records lost"
        # The consumer reading across the kill saw each partition as it is stored.
        wait_until(
            lambda: all(len(tail.values[i]) >= len(stored[i]) for i in stored),
            "the tailing consumer to catch up",
        )
        assert tail.values == stored
        assert tail.errors == []
    finally:
        tail.close()
        cluster.start_node(victim)
