"""Fetch, ListOffsets and DeleteRecords: reading partitions, finding offsets, trimming.

**Fetch** reads each partition from its fetch offset (at least one record when any exists,
then up to the partition's and the request's byte limits) and answers them as uncompressed
record batches. When fewer than ``min_bytes`` are found it waits, up to ``max_wait``, for the
first of its partitions to receive records (a shutdown answers at once), then reads again. The
high watermark is the stream's tail: every record below it is acknowledged (durable), so the
last stable offset is the same. Fetch sessions (KIP-227) are not kept: every answer says
session 0, and clients send full fetches.

**ListOffsets**: ``-2`` (earliest) is the stream's start (moved by trims), ``-1`` (latest) its
tail, ``-3`` (the largest timestamp, v7) the last record; any other timestamp gives the first
record whose timestamp is at least that (``-1``/``-1`` when none is).

**DeleteRecords** trims the stream: records below the offset become unreadable (``-1``: the
high watermark).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from walstream.errors import (
    BackendUnavailable,
    CorruptionError,
    DataLossError,
    FencedError,
    OutOfRangeError,
    StreamNotFound,
)

from walstream_kafka import codes
from walstream_kafka.batches import encode_batch
from walstream_kafka.broker import KafkaBroker, Partition
from walstream_kafka.mapping import check_topic_name, to_kafka
from walstream_kafka.produce import error_code_of
from walstream_kafka.wire import DecodedRequest

__all__ = ["handle_delete_records", "handle_fetch", "handle_list_offsets"]

log = logging.getLogger(__name__)

#: Records one partition's read returns at most (the byte limits usually end it first).
_READ_RECORDS = 10_000
#: Partitions a long poll watches at once (a larger fetch polls the first ones).
_WATCHED = 64


def _read_error(error: BaseException) -> int:
    if isinstance(error, OutOfRangeError):
        return codes.OFFSET_OUT_OF_RANGE
    if isinstance(error, (BackendUnavailable, FencedError)):
        return codes.NOT_LEADER_OR_FOLLOWER
    if isinstance(error, StreamNotFound):
        return codes.UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(error, (DataLossError, CorruptionError)):
        log.error("kafka: a fetch found damaged data: %s", error)
        return codes.KAFKA_STORAGE_ERROR
    return error_code_of(error)


async def _locate(broker: KafkaBroker, topic: str, index: int) -> tuple[Partition | None, int]:
    if check_topic_name(topic) is not None:
        return None, codes.UNKNOWN_TOPIC_OR_PARTITION
    partition = await broker.partition(topic, index)
    if partition is None:
        return None, codes.UNKNOWN_TOPIC_OR_PARTITION
    if not await broker.leads(partition):
        return None, codes.NOT_LEADER_OR_FOLLOWER
    return partition, codes.NONE


async def _read_partition(
    partition: Partition | None, located: int, index: int, offset: int, max_bytes: int
) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "partition_index": index,
        "error_code": located,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": [],
        "preferred_read_replica": -1,
        # Empty, not null, as Kafka's brokers answer: librdkafka drops a partition whose
        # records are null as a protocol error ("invalid MessageSetSize -1") and never sees
        # its error code (OFFSET_OUT_OF_RANGE after retention or DeleteRecords).
        "records": b"",
    }
    if partition is None:
        return answer
    stream = partition.stream
    try:
        result = await stream.read(
            start=offset, limit_records=_READ_RECORDS, limit_bytes=max(1, max_bytes)
        )
        start = await stream.start_offset()
    except Exception as error:
        answer["error_code"] = _read_error(error)
        if isinstance(error, OutOfRangeError):
            answer["high_watermark"] = answer["last_stable_offset"] = error.tail
            answer["log_start_offset"] = error.start_offset
        return answer
    records = [to_kafka(record) for record in result.records if record.offset >= offset]
    answer.update(
        high_watermark=result.tail,
        last_stable_offset=result.tail,
        log_start_offset=start,
        records=encode_batch(records) if records else b"",
    )
    return answer


async def handle_fetch(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    max_wait_s = max(0.0, body.max_wait.total_seconds())
    wanted: list[tuple[str, int, int, int]] = [
        (topic.topic, part.partition, part.fetch_offset, part.partition_max_bytes)
        for topic in body.topics
        for part in topic.partitions
    ]
    located = [await _locate(broker, topic, index) for topic, index, _, _ in wanted]

    async def read_all() -> tuple[list[dict[str, Any]], int]:
        answers: list[dict[str, Any]] = []
        total = 0
        for (_topic, index, offset, part_max), (partition, error) in zip(
            wanted, located, strict=True
        ):
            room = body.max_bytes - total
            if room <= 0 and total > 0:
                partition, error = None, codes.NONE  # over the request's limit: next time
            answer = await _read_partition(
                partition, error, index, offset, min(part_max, max(room, 1))
            )
            total += len(answer["records"] or b"")
            answers.append(answer)
        return answers, total

    answers, total = await read_all()
    if total < max(1, body.min_bytes) and max_wait_s > 0 and not broker.shutting_down.is_set():
        watch = [
            (partition, offset)
            for (_, _, offset, _), (partition, error) in zip(wanted, located, strict=True)
            if partition is not None and error == codes.NONE
        ][:_WATCHED]
        if watch:
            waits: set[asyncio.Future[Any]] = {
                asyncio.ensure_future(
                    partition.stream.read(start=offset, limit_records=1, wait=max_wait_s)
                )
                for partition, offset in watch
            }
            waits.add(asyncio.ensure_future(broker.shutting_down.wait()))
            try:
                await asyncio.wait(waits, timeout=max_wait_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
                for waiting in waits:
                    with contextlib.suppress(BaseException):
                        await waiting
            answers, total = await read_all()
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, _, _, _), answer in zip(wanted, answers, strict=True):
        by_topic.setdefault(topic, []).append(answer)
    return {
        "throttle_time": 0,
        "error_code": codes.NONE,
        "session_id": 0,
        "responses": [
            {"topic": topic, "partitions": partitions} for topic, partitions in by_topic.items()
        ],
    }


async def _offset_for(partition: Partition, timestamp: int) -> tuple[int, int, int]:
    """(error, timestamp, offset) for ListOffsets' ``timestamp``."""
    stream = partition.stream
    try:
        if timestamp == -2:
            return codes.NONE, -1, await stream.start_offset()
        tail = await stream.check_tail()
        if timestamp == -1:
            return codes.NONE, -1, tail
        if timestamp == -3:
            if tail == 0 or tail <= await stream.start_offset():
                return codes.NONE, -1, -1
            last = await stream.read(start=tail - 1, limit_records=1)
            if not last.records:
                return codes.NONE, -1, -1
            return codes.NONE, last.records[-1].timestamp_ms, last.records[-1].offset
        if timestamp < 0:
            return codes.INVALID_REQUEST, -1, -1
        try:
            found = await stream.read(from_timestamp=timestamp, limit_records=1)
        except OutOfRangeError:
            return codes.NONE, -1, -1
        if not found.records:
            return codes.NONE, -1, -1
        record = found.records[0]
        return codes.NONE, record.timestamp_ms, record.offset
    except Exception as error:
        return _read_error(error), -1, -1


async def handle_list_offsets(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    topics = []
    for topic in request.body.topics:
        partitions = []
        for part in topic.partitions:
            partition, error = await _locate(broker, topic.name, part.partition_index)
            timestamp = offset = -1
            if partition is not None:
                error, timestamp, offset = await _offset_for(partition, part.timestamp)
            partitions.append(
                {
                    "partition_index": part.partition_index,
                    "error_code": error,
                    "timestamp": timestamp,
                    "offset": offset,
                    "leader_epoch": -1,
                }
            )
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


async def handle_delete_records(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    topics = []
    for topic in request.body.topics:
        partitions = []
        for part in topic.partitions:
            partition, error = await _locate(broker, topic.name, part.partition_index)
            low = -1
            if partition is not None:
                try:
                    stream = partition.stream
                    target = part.offset if part.offset >= 0 else await stream.check_tail()
                    tail = await stream.check_tail()
                    if part.offset < -1 or target > tail:
                        error = codes.OFFSET_OUT_OF_RANGE
                    else:
                        if target > await stream.start_offset():
                            await stream.trim(target)
                        low = await stream.start_offset()
                except Exception as failure:
                    error = _read_error(failure)
            partitions.append(
                {"partition_index": part.partition_index, "low_watermark": low, "error_code": error}
            )
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}
