"""ApiVersions and Metadata: what this listener speaks, which nodes are brokers, which topics
exist and which node leads each partition (:mod:`walstream_kafka.broker`).

Every node is a replica of every partition in the answers (the data is in object storage and
any node can take a partition over); the in-sync set is the leader alone. Leader epochs are
answered unknown (-1), so clients skip the leader-epoch validation that needs
OffsetForLeaderEpoch, which this listener does not serve.
"""

from __future__ import annotations

import logging
from typing import Any

from walstream.errors import InvalidArgument, StreamExists, WalstreamError

from walstream_kafka import codes
from walstream_kafka.mapping import check_topic_name
from walstream_kafka.wire import SUPPORTED, DecodedRequest

__all__ = ["handle_api_versions", "handle_metadata", "topic_entry"]

log = logging.getLogger(__name__)


async def handle_api_versions(session: Any, request: DecodedRequest) -> dict[str, Any]:
    return {
        "error_code": codes.NONE,
        "api_keys": [
            {"api_key": key, "min_version": low, "max_version": high}
            for key, (low, high) in sorted(SUPPORTED.items())
        ],
        "throttle_time": 0,
    }


async def topic_entry(broker: Any, topic: str, partitions: list[Any]) -> dict[str, Any]:
    live = [address.node_id for address in await broker.brokers()]
    entries = []
    for index, info in enumerate(partitions):
        leader = await broker.leader_of(info)
        entries.append(
            {
                "error_code": codes.NONE,
                "partition_index": index,
                "leader_id": leader,
                "leader_epoch": -1,
                "replica_nodes": live,
                "isr_nodes": [leader],
                "offline_replicas": [],
            }
        )
    return {
        "error_code": codes.NONE,
        "name": topic,
        "topic_id": await broker.topic_id(partitions),
        "is_internal": False,
        "partitions": entries,
        "topic_authorized_operations": -2147483648,
    }


async def handle_metadata(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker = session.broker
    body = request.body
    brokers = await broker.brokers()
    wanted = None if body.topics is None else [topic.name for topic in body.topics]
    allow_create = getattr(body, "allow_auto_topic_creation", True) and broker.auto_create_topics
    topics: list[dict[str, Any]] = []
    if wanted is None:
        for topic, partitions in sorted((await broker.list_topics()).items()):
            topics.append(await topic_entry(broker, topic, partitions))
    else:
        for topic in wanted:
            if topic is None:
                topics.append({"error_code": codes.UNKNOWN_TOPIC_OR_PARTITION, "name": None})
                continue
            problem = check_topic_name(topic)
            if problem is not None:
                topics.append({"error_code": codes.INVALID_TOPIC_EXCEPTION, "name": topic})
                continue
            partitions = (await broker.list_topics(topic)).get(topic)
            if partitions is None and allow_create:
                partitions = await _auto_create(broker, topic)
            if partitions is None:
                topics.append({"error_code": codes.UNKNOWN_TOPIC_OR_PARTITION, "name": topic})
            else:
                topics.append(await topic_entry(broker, topic, partitions))
    return {
        "throttle_time": 0,
        "brokers": [
            {"node_id": address.node_id, "host": address.host, "port": address.port, "rack": None}
            for address in brokers
        ],
        "cluster_id": broker.cluster_id,
        "controller_id": broker.node_id,
        "topics": topics,
        "cluster_authorized_operations": -2147483648,
    }


async def _auto_create(broker: Any, topic: str) -> list[Any] | None:
    """Create ``topic`` with ``kafka.default_partitions`` partitions (Kafka's
    ``auto.create.topics.enable``); None when that fails."""
    try:
        await broker.create_partitions(topic, 0, broker.default_partitions)
    except StreamExists:
        pass  # another client or node created it at the same time
    except (InvalidArgument, WalstreamError) as error:
        log.warning("kafka: auto-creating topic %r failed: %s", topic, error)
        return None
    found: list[Any] | None = (await broker.list_topics(topic)).get(topic)
    return found
