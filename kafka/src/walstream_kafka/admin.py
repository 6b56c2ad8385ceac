"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs.

A topic is its partitions' streams (:mod:`walstream_kafka.mapping`). Creating a topic creates
streams ``0..n-1`` in order; deleting it deletes them. Replication is walstream's (the WAL and
object storage): any replication factor a client asks for is accepted (``-1`` or ``>= 1``) and
every partition reports all live nodes as replicas.

Configuration: walstream keeps every record until it is trimmed (DeleteRecords), so the topic
configuration is fixed and answered by DescribeConfigs as read-only values:
``cleanup.policy=delete``, ``retention.ms=-1``, ``retention.bytes=-1``,
``message.timestamp.type=CreateTime``. A create or alter that asks for anything else
(``cleanup.policy=compact``, a finite ``retention.ms`` …) is refused with ``INVALID_CONFIG``
naming the key; time-based retention arrives with walstream's stream configuration.
"""

from __future__ import annotations

import logging
from typing import Any

from walstream.errors import StreamExists, StreamNotFound, WalstreamError

from walstream_kafka import codes
from walstream_kafka.broker import KafkaBroker
from walstream_kafka.mapping import check_topic_name, max_partitions, stream_name
from walstream_kafka.wire import DecodedRequest

__all__ = [
    "TOPIC_CONFIGS",
    "handle_alter_configs",
    "handle_create_partitions",
    "handle_create_topics",
    "handle_delete_topics",
    "handle_describe_configs",
]

log = logging.getLogger(__name__)

#: The configuration every topic has (read-only).
TOPIC_CONFIGS: dict[str, str] = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "message.timestamp.type": "CreateTime",
    "compression.type": "producer",
    "max.message.bytes": str(64 << 20),
    "min.insync.replicas": "1",
}
_RESOURCE_TOPIC = 2
_RESOURCE_BROKER = 4


def _config_problem(name: str, value: str | None) -> str | None:
    """Why a topic cannot take ``name=value``, or None when it is the fixed value."""
    fixed = TOPIC_CONFIGS.get(name)
    if fixed is None:
        return f"{name}: not a topic configuration walstream supports (it supports {', '.join(sorted(TOPIC_CONFIGS))})"
    if value == fixed or (name == "retention.ms" and value in ("-1", None)):
        return None
    if name == "cleanup.policy":
        return f"cleanup.policy={value}: log compaction is not supported by walstream (use cleanup.policy=delete)"
    if name == "retention.ms":
        return f"retention.ms={value}: time-based retention is not supported yet; records are kept until DeleteRecords trims them (retention.ms=-1)"
    return f"{name}={value}: walstream's topics have {name}={fixed}, which cannot be changed"


async def handle_create_topics(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    answers = []
    for topic in body.topics:
        error, message, partitions = await _create_one(
            broker, topic, body.validate_only if hasattr(body, "validate_only") else False
        )
        answers.append(
            {
                "name": topic.name,
                "error_code": error,
                "error_message": message,
                "num_partitions": partitions if error == codes.NONE else -1,
                "replication_factor": 1 if error == codes.NONE else -1,
                "configs": None
                if error != codes.NONE
                else [
                    {
                        "name": name,
                        "value": value,
                        "read_only": True,
                        "config_source": 5,
                        "is_sensitive": False,
                    }
                    for name, value in TOPIC_CONFIGS.items()
                ],
            }
        )
    return {"throttle_time": 0, "topics": answers}


async def _create_one(
    broker: KafkaBroker, topic: Any, validate_only: bool
) -> tuple[int, str | None, int]:
    name = topic.name
    problem = check_topic_name(name)
    if problem is not None:
        return codes.INVALID_TOPIC_EXCEPTION, problem, -1
    if topic.assignments:
        return codes.INVALID_REQUEST, "manual replica assignments are not supported", -1
    count = broker.default_partitions if topic.num_partitions == -1 else topic.num_partitions
    if count < 1 or count > max_partitions(name):
        return (
            codes.INVALID_PARTITIONS,
            f"a topic named {name!r} has 1 to {max_partitions(name)} partitions, got {count}",
            -1,
        )
    if topic.replication_factor == 0 or topic.replication_factor < -1:
        return codes.INVALID_REPLICATION_FACTOR, "replication factor must be -1 or at least 1", -1
    for config in topic.configs:
        problem = _config_problem(config.name, config.value)
        if problem is not None:
            return codes.INVALID_CONFIG, problem, -1
    if (await broker.list_topics(name)).get(name) is not None:
        return codes.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists", -1
    if validate_only:
        return codes.NONE, None, count
    try:
        await broker.create_partitions(name, 0, count)
    except StreamExists:
        return codes.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists", -1
    except WalstreamError as error:
        return codes.UNKNOWN_SERVER_ERROR, str(error), -1
    return codes.NONE, None, count


async def handle_delete_topics(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    names = (
        [topic.name for topic in body.topics] if hasattr(body, "topics") else list(body.topic_names)
    )
    answers = []
    for name in names:
        error, message = codes.NONE, None
        partitions = None if name is None else (await broker.list_topics(name)).get(name)
        if partitions is None:
            error = codes.UNKNOWN_TOPIC_OR_PARTITION
        else:
            broker.forget_topic(name)
            try:
                for index in reversed(range(len(partitions))):
                    await broker.client.delete_stream(stream_name(name, index))
            except StreamNotFound:
                pass
            except WalstreamError as failure:
                error, message = codes.UNKNOWN_SERVER_ERROR, str(failure)
        answers.append(
            {"name": name, "topic_id": None, "error_code": error, "error_message": message}
        )
    return {"throttle_time": 0, "responses": answers}


async def handle_create_partitions(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    answers = []
    for topic in body.topics:
        error, message = codes.NONE, None
        partitions = (await broker.list_topics(topic.name)).get(topic.name)
        if partitions is None:
            error = codes.UNKNOWN_TOPIC_OR_PARTITION
        elif topic.count <= len(partitions) or topic.count > max_partitions(topic.name):
            error = codes.INVALID_PARTITIONS
            message = (
                f"topic {topic.name!r} has {len(partitions)} partitions; ask for more, "
                f"at most {max_partitions(topic.name)}"
            )
        elif topic.assignments:
            error, message = codes.INVALID_REQUEST, "manual replica assignments are not supported"
        elif not body.validate_only:
            try:
                await broker.create_partitions(topic.name, len(partitions), topic.count)
            except WalstreamError as failure:
                error, message = codes.UNKNOWN_SERVER_ERROR, str(failure)
        answers.append({"name": topic.name, "error_code": error, "error_message": message})
    return {"throttle_time": 0, "results": answers}


async def handle_describe_configs(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    results = []
    for resource in request.body.resources:
        keys = resource.configuration_keys
        error, message = codes.NONE, None
        configs: list[dict[str, Any]] = []
        if resource.resource_type == _RESOURCE_TOPIC:
            if (await broker.list_topics(resource.resource_name)).get(
                resource.resource_name
            ) is None:
                error = codes.UNKNOWN_TOPIC_OR_PARTITION
            else:
                configs = [
                    {
                        "name": name,
                        "value": value,
                        "read_only": True,
                        "is_default": False,
                        "config_source": 5,
                        "is_sensitive": False,
                        "synonyms": [],
                        "config_type": 0,
                        "documentation": None,
                    }
                    for name, value in TOPIC_CONFIGS.items()
                    if keys is None or name in keys
                ]
        elif resource.resource_type == _RESOURCE_BROKER:
            configs = []
        else:
            error, message = codes.INVALID_REQUEST, "only topic and broker resources are described"
        results.append(
            {
                "error_code": error,
                "error_message": message,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
                "configs": configs,
            }
        )
    return {"throttle_time": 0, "results": results}


async def handle_alter_configs(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    responses = []
    for resource in request.body.resources:
        error, message = codes.NONE, None
        if resource.resource_type != _RESOURCE_TOPIC:
            error, message = codes.INVALID_REQUEST, "only topic configurations can be altered"
        elif (await broker.list_topics(resource.resource_name)).get(resource.resource_name) is None:
            error = codes.UNKNOWN_TOPIC_OR_PARTITION
        else:
            for config in resource.configs:
                problem = _config_problem(config.name, config.value)
                if problem is not None:
                    error, message = codes.INVALID_CONFIG, problem
                    break
        responses.append(
            {
                "error_code": error,
                "error_message": message,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
            }
        )
    return {"throttle_time": 0, "responses": responses}
