"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs.

A topic is its partitions' streams (:mod:`walstream_kafka.mapping`). Creating a topic creates
streams ``0..n-1`` in order; deleting it deletes them. Replication is walstream's (the WAL and
object storage): any replication factor a client asks for is accepted (``-1`` or ``>= 1``) and
every partition reports all live nodes as replicas.

Configuration: ``retention.ms`` is the retention age of the topic's partitions' streams
(:class:`walstream.stream_config.StreamConfig`'s ``retention_age_s``, applied by the engine's
lifecycle loop; ``-1``: infinite). It is set on every partition by CreateTopics, AlterConfigs and
IncrementalAlterConfigs, given to new partitions by CreatePartitions (partition 0's
configuration), and read from partition 0 by DescribeConfigs: source ``DEFAULT_CONFIG`` when it
equals the deployment's ``streams.retention`` default, else ``DYNAMIC_TOPIC_CONFIG``. walstream
keeps ages in whole seconds, so a value that is not ``-1`` or a whole number of seconds (at
least 1000 ms, at most 100 years) is refused with ``INVALID_CONFIG``. The other keys are fixed
and read-only: ``cleanup.policy=delete``, ``retention.bytes=-1``,
``message.timestamp.type=CreateTime`` …; asking for another value (``cleanup.policy=compact``
…) is refused with ``INVALID_CONFIG`` naming the key. An alter is checked whole before any
partition changes; it then reconfigures partitions in order, so a failure half-way (answered
``UNKNOWN_SERVER_ERROR``) leaves the first partitions changed, and repeating the alter completes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from walstream.errors import InvalidArgument, StreamExists, StreamNotFound, WalstreamError
from walstream.metadata.contract import StreamInfo
from walstream.stream_config import MAX_AGE_S, StreamConfig

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
    "handle_incremental_alter_configs",
    "parse_retention_ms",
]

log = logging.getLogger(__name__)

#: The configuration every topic has (read-only, but for ``retention.ms``, whose value here is
#: the default a topic's streams report when the deployment sets none).
TOPIC_CONFIGS: dict[str, str] = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "message.timestamp.type": "CreateTime",
    "compression.type": "producer",
    "max.message.bytes": str(64 << 20),
    "min.insync.replicas": "1",
}
#: Kafka's ConfigType of each key (DescribeConfigs v3+): STRING 2, INT 3, LONG 5, LIST 7.
_CONFIG_TYPES: dict[str, int] = {
    "cleanup.policy": 7,
    "retention.ms": 5,
    "retention.bytes": 5,
    "message.timestamp.type": 2,
    "compression.type": 2,
    "max.message.bytes": 3,
    "min.insync.replicas": 3,
}
_RESOURCE_TOPIC = 2
_RESOURCE_BROKER = 4
_SOURCE_TOPIC = 1  # DYNAMIC_TOPIC_CONFIG
_SOURCE_DEFAULT = 5  # DEFAULT_CONFIG
_OP_SET, _OP_DELETE = 0, 1  # IncrementalAlterConfigs' operations (APPEND, SUBTRACT: lists only)
_RETENTION = "retention.ms"


class _Default:
    """``retention.ms`` back to the deployment's default (a key left out of AlterConfigs, an
    IncrementalAlterConfigs DELETE, a null value)."""


_DEFAULT = _Default()


def parse_retention_ms(value: str) -> int | None:
    """``retention.ms`` → the streams' ``retention_age_s`` (None: infinite, for ``-1``).
    :class:`~walstream.errors.InvalidArgument` for anything walstream cannot keep exactly."""
    try:
        ms = int(value.strip())
    except ValueError:
        raise InvalidArgument(
            f"retention.ms={value}: expected a whole number of milliseconds, or -1 (infinite)"
        ) from None
    if ms == -1:
        return None
    if ms < 1000 or ms > MAX_AGE_S * 1000 or ms % 1000:
        raise InvalidArgument(
            f"retention.ms={value}: walstream keeps retention in whole seconds; give -1 "
            f"(infinite) or a multiple of 1000 from 1000 to {MAX_AGE_S * 1000} (100 years)"
        )
    return ms // 1000


def _config_change(name: str, value: str | None) -> int | _Default | None:
    """What ``name=value`` asks of a topic: for ``retention.ms``, the new retention age in
    seconds (None: infinite; :data:`_DEFAULT`: the deployment's default); for a fixed key given
    its fixed value, :data:`_DEFAULT` (nothing to change). InvalidArgument naming the key for
    anything else."""
    fixed = TOPIC_CONFIGS.get(name)
    if fixed is None:
        raise InvalidArgument(
            f"{name}: not a topic configuration walstream supports (it supports "
            f"{', '.join(sorted(TOPIC_CONFIGS))})"
        )
    if name == _RETENTION:
        return _DEFAULT if value is None else parse_retention_ms(value)
    if value is None or value == fixed:
        return _DEFAULT
    if name == "cleanup.policy":
        raise InvalidArgument(
            f"cleanup.policy={value}: log compaction is not supported by walstream (use "
            "cleanup.policy=delete)"
        )
    raise InvalidArgument(
        f"{name}={value}: walstream's topics have {name}={fixed}, which cannot be changed"
    )


def _retention_of(broker: KafkaBroker, chosen: int | _Default | None) -> int | None:
    if isinstance(chosen, _Default):
        return broker.client.config.streams.config.retention_age_s
    return chosen


def _topic_configs(broker: KafkaBroker, config: StreamConfig) -> list[tuple[str, str, bool, int]]:
    """(name, value, read only, source) of each configuration key of a topic whose partition 0
    has ``config``."""
    default = broker.client.config.streams.config.retention_age_s
    answer = []
    for name, value in TOPIC_CONFIGS.items():
        if name == _RETENTION:
            age = config.retention_age_s
            source = _SOURCE_DEFAULT if age == default else _SOURCE_TOPIC
            answer.append((name, "-1" if age is None else str(age * 1000), False, source))
        else:
            answer.append((name, value, True, _SOURCE_DEFAULT))
    return answer


async def _set_retention(
    broker: KafkaBroker, topic: str, partitions: list[StreamInfo], age_s: int | None
) -> None:
    """Give every partition of ``topic`` the retention ``age_s``, in partition order."""
    for index, info in enumerate(partitions):
        if info.config.retention_age_s == age_s:
            continue
        partition = await broker.partition(topic, index)
        if partition is None:
            raise StreamNotFound(f"partition {index} of topic {topic!r} is gone")
        await partition.stream.reconfigure(retention_age_s=age_s)


async def handle_create_topics(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    answers = []
    for topic in body.topics:
        error, message, partitions, config = await _create_one(
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
                        "read_only": read_only,
                        "config_source": source,
                        "is_sensitive": False,
                    }
                    for name, value, read_only, source in _topic_configs(broker, config)
                ],
            }
        )
    return {"throttle_time": 0, "topics": answers}


async def _create_one(
    broker: KafkaBroker, topic: Any, validate_only: bool
) -> tuple[int, str | None, int, StreamConfig]:
    name = topic.name
    default = broker.client.config.streams.config
    problem = check_topic_name(name)
    if problem is not None:
        return codes.INVALID_TOPIC_EXCEPTION, problem, -1, default
    if topic.assignments:
        return codes.INVALID_REQUEST, "manual replica assignments are not supported", -1, default
    count = broker.default_partitions if topic.num_partitions == -1 else topic.num_partitions
    if count < 1 or count > max_partitions(name):
        return (
            codes.INVALID_PARTITIONS,
            f"a topic named {name!r} has 1 to {max_partitions(name)} partitions, got {count}",
            -1,
            default,
        )
    if topic.replication_factor == 0 or topic.replication_factor < -1:
        return (
            codes.INVALID_REPLICATION_FACTOR,
            "replication factor must be -1 or at least 1",
            -1,
            default,
        )
    config = default
    for entry in topic.configs:
        try:
            change = _config_change(entry.name, entry.value)
        except InvalidArgument as problem:
            return codes.INVALID_CONFIG, str(problem), -1, default
        if entry.name == _RETENTION:
            config = config.with_changes({"retention_age_s": _retention_of(broker, change)})
    if (await broker.list_topics(name)).get(name) is not None:
        return codes.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists", -1, default
    if validate_only:
        return codes.NONE, None, count, config
    try:
        await broker.create_partitions(name, 0, count, config)
    except StreamExists:
        return codes.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists", -1, default
    except WalstreamError as error:
        return codes.UNKNOWN_SERVER_ERROR, str(error), -1, default
    return codes.NONE, None, count, config


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
                # New partitions take the topic's configuration (partition 0's): its retention.
                await broker.create_partitions(
                    topic.name, len(partitions), topic.count, partitions[0].config
                )
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
            partitions = (await broker.list_topics(resource.resource_name)).get(
                resource.resource_name
            )
            if partitions is None:
                error = codes.UNKNOWN_TOPIC_OR_PARTITION
            else:
                configs = [
                    {
                        "name": name,
                        "value": value,
                        "read_only": read_only,
                        "is_default": source == _SOURCE_DEFAULT,
                        "config_source": source,
                        "is_sensitive": False,
                        "synonyms": [],
                        "config_type": _CONFIG_TYPES[name],
                        "documentation": None,
                    }
                    for name, value, read_only, source in _topic_configs(
                        broker, partitions[0].config
                    )
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
    """AlterConfigs replaces a topic's whole configuration, as Kafka's does: ``retention.ms``
    left out goes back to the deployment's default."""

    def changes(resource: Any) -> list[tuple[str, int, str | None]]:
        named = [(config.name, _OP_SET, config.value) for config in resource.configs]
        if not any(name == _RETENTION for name, _, _ in named):
            named.append((_RETENTION, _OP_DELETE, None))
        return named

    return await _alter_resources(session.broker, request, changes)


async def handle_incremental_alter_configs(session: Any, request: DecodedRequest) -> dict[str, Any]:
    """IncrementalAlterConfigs changes the keys named: SET, or DELETE (back to the default);
    APPEND and SUBTRACT apply to list-valued keys, which walstream's topics have none of."""

    def changes(resource: Any) -> list[tuple[str, int, str | None]]:
        return [
            (config.name, config.config_operation, config.value) for config in resource.configs
        ]

    return await _alter_resources(session.broker, request, changes)


async def _alter_resources(
    broker: KafkaBroker,
    request: DecodedRequest,
    changes: Callable[[Any], list[tuple[str, int, str | None]]],
) -> dict[str, Any]:
    """Each resource of an AlterConfigs or IncrementalAlterConfigs request altered by
    :func:`_alter_one` with the ``changes`` its request names."""
    responses = []
    for resource in request.body.resources:
        error, message = await _alter_one(
            broker,
            resource.resource_type,
            resource.resource_name,
            changes(resource),
            request.body.validate_only,
        )
        responses.append(
            {
                "error_code": error,
                "error_message": message,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
            }
        )
    return {"throttle_time": 0, "responses": responses}


async def _alter_one(
    broker: KafkaBroker,
    resource_type: int,
    topic: str,
    changes: list[tuple[str, int, str | None]],
    validate_only: bool,
) -> tuple[int, str | None]:
    """Check every change of one resource, then (unless ``validate_only``) apply them."""
    if resource_type != _RESOURCE_TOPIC:
        return codes.INVALID_REQUEST, "only topic configurations can be altered"
    partitions = (await broker.list_topics(topic)).get(topic)
    if partitions is None:
        return codes.UNKNOWN_TOPIC_OR_PARTITION, None
    retention: int | _Default | None = _DEFAULT
    named = False
    for name, operation, value in changes:
        try:
            if operation == _OP_SET:
                change = _config_change(name, value)
            elif operation == _OP_DELETE:
                change = _config_change(name, None)
            else:
                raise InvalidArgument(
                    f"{name}: operation {operation} (APPEND/SUBTRACT) applies to list-valued "
                    "configurations; walstream's topics have none (use SET or DELETE)"
                )
        except InvalidArgument as problem:
            return codes.INVALID_CONFIG, str(problem)
        if name == _RETENTION:
            retention, named = change, True
    if validate_only or not named:
        return codes.NONE, None
    try:
        await _set_retention(broker, topic, partitions, _retention_of(broker, retention))
    except StreamNotFound:
        return codes.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} was deleted during the alter"
    except WalstreamError as failure:
        return codes.UNKNOWN_SERVER_ERROR, str(failure)
    return codes.NONE, None
