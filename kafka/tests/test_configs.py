"""``retention.ms`` is the retention of the topic's partitions' streams: CreateTopics,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs and CreatePartitions through real clients
(confluent-kafka's AdminClient, kafka-python's KafkaAdminClient) against a real
``walstream serve``, checked against what the S2 API says of each partition's stream; and
records older than a short retention stop being fetchable."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from walstream_conformance.waiting import eventually

from .conftest import KafkaServer


def stream_retention(server: KafkaServer, topic: str, partition: int) -> Any:
    """The S2 API's ``retention_policy`` of the stream of ``topic``'s ``partition``."""
    request = urllib.request.Request(
        f"{server.url}/v1/streams/_k.{topic}.{partition}", headers={"s2-basin": "walstream"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["retention_policy"]


def describe(admin: AdminClient, topic: str) -> ConfigEntry:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=60)
    return entries["retention.ms"]


def incremental(admin: AdminClient, topic: str, operation: AlterConfigOpType, value: str) -> None:
    entry = ConfigEntry("retention.ms", value, incremental_operation=operation)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(timeout=60)


def test_retention_ms_is_the_partitions_stream_retention(
    kafka_server: KafkaServer, topic: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    new = NewTopic(
        topic, num_partitions=3, replication_factor=1, config={"retention.ms": "3600000"}
    )
    admin.create_topics([new], validate_only=True)[topic].result(timeout=60)
    assert topic not in admin.list_topics(timeout=60).topics
    admin.create_topics([new])[topic].result(timeout=60)
    entry = describe(admin, topic)
    assert (entry.value, entry.source, entry.is_read_only) == (
        "3600000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
        False,
    )
    assert [stream_retention(kafka_server, topic, p) for p in range(3)] == [{"age": 3600}] * 3

    incremental(admin, topic, AlterConfigOpType.SET, "7200000")
    assert describe(admin, topic).value == "7200000"
    assert [stream_retention(kafka_server, topic, p) for p in range(3)] == [{"age": 7200}] * 3

    # New partitions take the topic's retention.
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=60)
    assert stream_retention(kafka_server, topic, 3) == {"age": 7200}

    # DELETE: back to the deployment's default (infinite), reported as the default.
    incremental(admin, topic, AlterConfigOpType.DELETE, "")
    entry = describe(admin, topic)
    assert (entry.value, entry.source, entry.is_default) == (
        "-1",
        ConfigSource.DEFAULT_CONFIG.value,
        True,
    )
    assert [stream_retention(kafka_server, topic, p) for p in range(4)] == [{"infinite": {}}] * 4


def test_kafka_python_alters_retention_with_both_apis(
    kafka_server: KafkaServer, topic: str
) -> None:
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    admin = KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap)
    try:
        admin.create_topics([KpNewTopic(topic, 2, 1, topic_configs={"retention.ms": "-1"})])
        assert stream_retention(kafka_server, topic, 1) == {"infinite": {}}
        resource = KpResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "86400000"})
        admin.alter_configs([resource], incremental=False)  # AlterConfigs
        assert [stream_retention(kafka_server, topic, p) for p in range(2)] == [{"age": 86400}] * 2
        # kafka-python's default filter lists the keys whose source is not a default.
        described = admin.describe_configs([KpResource(ConfigResourceType.TOPIC, topic)])
        assert described == {
            "topic": {
                topic: {
                    "retention.ms": {
                        "value": "86400000",
                        "read_only": False,
                        "config_source": "DYNAMIC_TOPIC_CONFIG",
                        "is_sensitive": False,
                        "synonyms": [],
                        "config_type": "LONG",
                        "documentation": None,
                    }
                }
            }
        }
        resource = KpResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "5000"})
        admin.alter_configs([resource], incremental=True)  # IncrementalAlterConfigs
        assert [stream_retention(kafka_server, topic, p) for p in range(2)] == [{"age": 5}] * 2
    finally:
        admin.close()


def test_alter_configs_resets_retention_left_out(kafka_server: KafkaServer, topic: str) -> None:
    """AlterConfigs (not incremental) replaces the whole configuration, as Kafka's does."""
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    new = NewTopic(topic, num_partitions=2, replication_factor=1, config={"retention.ms": "60000"})
    admin.create_topics([new])[topic].result(timeout=60)
    assert stream_retention(kafka_server, topic, 1) == {"age": 60}
    resource = ConfigResource(
        ConfigResource.Type.TOPIC, topic, set_config={"cleanup.policy": "delete"}
    )
    admin.alter_configs([resource])[resource].result(timeout=60)
    assert [stream_retention(kafka_server, topic, p) for p in range(2)] == [{"infinite": {}}] * 2


@pytest.mark.parametrize("value", ["0", "500", "1500", "-2", "7d", str(101 * 365 * 86_400_000)])
def test_a_retention_walstream_cannot_keep_is_invalid_config(
    kafka_server: KafkaServer, topic: str, value: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    new = NewTopic(topic, num_partitions=1, replication_factor=1, config={"retention.ms": value})
    with pytest.raises(KafkaException) as refused:
        admin.create_topics([new])[topic].result(timeout=60)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "retention.ms" in refused.value.args[0].str()
    assert topic not in admin.list_topics(timeout=60).topics

    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(
        timeout=60
    )
    incremental(admin, topic, AlterConfigOpType.SET, "60000")
    set_ = AlterConfigOpType.SET
    refused_alters = (
        [ConfigEntry("retention.ms", value, incremental_operation=set_)],
        # One bad key refuses the whole alter: the good one is not applied either.
        [
            ConfigEntry("retention.ms", "120000", incremental_operation=set_),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=set_),
        ],
    )
    for configs in refused_alters:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=configs)
        with pytest.raises(KafkaException) as refused:
            admin.incremental_alter_configs([resource])[resource].result(timeout=60)
        assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert [stream_retention(kafka_server, topic, p) for p in range(2)] == [{"age": 60}] * 2


@pytest.mark.slow
def test_records_older_than_the_retention_stop_being_fetchable(
    kafka_server: KafkaServer, topic: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    new = NewTopic(topic, num_partitions=1, replication_factor=1, config={"retention.ms": "2000"})
    admin.create_topics([new])[topic].result(timeout=60)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap})
    for index in range(5):
        producer.produce(topic, b"old-%d" % index)
    assert producer.flush(60) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_server.bootstrap,
            "group.id": f"g-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=60) == (0, 5)

        def expired() -> bool:
            low, _high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=60)
            return bool(low == 5)

        asyncio.run(eventually(expired, "the earliest offset to move past the expired records"))
        # Fetching an expired offset: OFFSET_OUT_OF_RANGE (with auto.offset.reset=error, the
        # consumer reports it as _AUTO_OFFSET_RESET).
        consumer.assign([TopicPartition(topic, 0, 0)])
        while True:
            message = consumer.poll(60)
            assert message is not None, "no answer to a fetch of an expired offset"
            if message.error() is not None:
                break
            raise AssertionError(f"an expired record was fetched: {message.value()!r}")
        assert message.error().code() == KafkaError._AUTO_OFFSET_RESET
        assert "out of range" in message.error().str().lower()
    finally:
        consumer.close()
