"""Produce: Kafka record batches appended to the partitions' streams.

An acknowledgement (``acks=1`` or ``acks=all``: the same here) means every record of the batch
is durable in the WAL: the answer is sent once the append returned. ``acks=0`` is not answered.

Order: :func:`begin` runs before the connection reads its next request. It checks and decodes
every partition's batches and *starts* their appends in the order they sit in the request
(the engine gives one stream's appends their offsets in the order they began); the answer is
awaited afterwards. So the batches a producer pipelines to one partition over one connection
(``max.in.flight`` > 1) are stored in the order it sent them, and answered in that order.

A partition's batches are all-or-nothing per batch: a batch that fails its checks is refused
whole and nothing after it in the same partition of the request is appended.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    FencedError,
    InvalidArgument,
    StreamNotFound,
    WalstreamError,
)

from walstream_kafka import codes
from walstream_kafka.batches import BatchError, ProducedBatch, split_batches
from walstream_kafka.broker import KafkaBroker, Partition
from walstream_kafka.mapping import ProducerMark, check_topic_name, to_walstream
from walstream_kafka.producer_ids import PartitionProducers
from walstream_kafka.wire import DecodedRequest

__all__ = ["begin", "error_code_of"]

log = logging.getLogger(__name__)


def error_code_of(error: BaseException) -> int:
    """The Kafka error code of a failed append or read."""
    if isinstance(error, FencedError):
        return codes.NOT_LEADER_OR_FOLLOWER
    if isinstance(error, StreamNotFound):
        return codes.UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(error, InvalidArgument):
        return codes.INVALID_REQUEST
    if isinstance(error, (AmbiguousError, CapacityError, BackendUnavailable)):
        return codes.REQUEST_TIMED_OUT  # retriable; an idempotent retry is written once
    if isinstance(error, WalstreamError):
        return codes.KAFKA_STORAGE_ERROR
    return codes.UNKNOWN_SERVER_ERROR


async def _producers(broker: KafkaBroker, partition: Partition) -> PartitionProducers:
    """The partition's sequence table, claiming the stream and rebuilding the table from its
    tail the first time this node writes it."""
    stream = partition.stream
    table: PartitionProducers | None = broker.producer_tables.get(stream.stream_id)
    if table is not None and stream.writing:
        return table
    if not stream.writing:
        stream = await broker.client.claim_stream(stream.stream_id)
    table = await PartitionProducers.recover(stream)
    broker.producer_tables[stream.stream_id] = table
    return table


async def _append(partition: Partition, records: list[Any]) -> int:
    ack = await partition.stream.append(records)
    return ack.start


async def _partition_answer(
    index: int,
    started: list[asyncio.Future[int]],
    error: int,
    message: str | None,
) -> dict[str, Any]:
    base_offset = -1
    code = error
    for position, future in enumerate(started):
        try:
            offset = await future
        except Exception as failure:
            if code == codes.NONE:
                code = error_code_of(failure)
                message = f"{type(failure).__name__}: {failure}"
                if code in (codes.UNKNOWN_SERVER_ERROR, codes.KAFKA_STORAGE_ERROR):
                    log.warning("kafka: produce to partition %d failed: %s", index, failure)
            continue
        if position == 0:
            base_offset = offset
    return {
        "index": index,
        "error_code": code,
        "base_offset": base_offset if code == codes.NONE else -1,
        "log_append_time": -1,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": message,
    }


async def _begin_partition(
    broker: KafkaBroker, topic: str, index: int, records: bytes | None
) -> tuple[list[asyncio.Future[int]], int, str | None]:
    """Check and start the appends of one partition's batches: (their offsets, the error that
    stopped the rest, its message)."""
    if check_topic_name(topic) is not None:
        return [], codes.INVALID_TOPIC_EXCEPTION, None
    partition = await broker.partition(topic, index)
    if partition is None:
        return [], codes.UNKNOWN_TOPIC_OR_PARTITION, None
    if not await broker.leads(partition):
        return [], codes.NOT_LEADER_OR_FOLLOWER, None
    try:
        batches = split_batches(records or b"")
    except BatchError as error:
        return [], error.code, str(error)
    started: list[asyncio.Future[int]] = []
    table: PartitionProducers | None = None
    for batch in batches:
        mark: ProducerMark | None = None
        if batch.producer_id >= 0:
            try:
                if table is None:
                    table = await _producers(broker, partition)
            except Exception as failure:
                broker.forget(topic, index)
                return started, error_code_of(failure), str(failure)
            verdict = table.check(
                batch.producer_id, batch.producer_epoch, batch.base_sequence, len(batch.records)
            )
            if verdict.duplicate is not None:
                started.append(verdict.duplicate)
                continue
            if not verdict.append:
                return started, verdict.error, None
            mark = ProducerMark(
                batch.producer_id, batch.producer_epoch, batch.base_sequence, len(batch.records)
            )
        try:
            stored = _records_of(batch, mark)
        except InvalidArgument as error:
            return started, codes.INVALID_RECORD, str(error)
        future: asyncio.Future[int] = asyncio.ensure_future(_append(partition, stored))
        if mark is not None and table is not None:
            table.sent(
                mark.producer_id, mark.producer_epoch, mark.base_sequence, mark.count, future
            )
        started.append(future)
    return started, codes.NONE, None


def _records_of(batch: ProducedBatch, mark: ProducerMark | None) -> list[Any]:
    last = len(batch.records) - 1
    return [
        to_walstream(
            record.key,
            record.value,
            record.headers,
            None if record.timestamp_ms < 0 else record.timestamp_ms,
            mark if position == last else None,
        )
        for position, record in enumerate(batch.records)
    ]


async def begin(session: Any, request: DecodedRequest) -> asyncio.Future[dict[str, Any] | None]:
    """Start the request's appends (module docstring); the returned future is its answer."""
    broker: KafkaBroker = session.broker
    body = request.body
    topics: list[tuple[str, list[tuple[int, list[asyncio.Future[int]], int, str | None]]]] = []
    for topic_data in body.topic_data:
        partitions: list[tuple[int, list[asyncio.Future[int]], int, str | None]] = []
        for partition_data in topic_data.partition_data:
            if body.transactional_id is not None:
                partitions.append(
                    (partition_data.index, [], codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None)
                )
                continue
            started, error, message = await _begin_partition(
                broker, topic_data.name, partition_data.index, partition_data.records
            )
            partitions.append((partition_data.index, started, error, message))
        topics.append((topic_data.name, partitions))

    async def answer() -> dict[str, Any] | None:
        responses = []
        for name, partitions in topics:
            answers = [
                await _partition_answer(index, started, error, message)
                for index, started, error, message in partitions
            ]
            responses.append({"name": name, "partition_responses": answers})
        if body.acks == 0:
            return None
        return {"responses": responses, "throttle_time": 0}

    return asyncio.ensure_future(answer())
