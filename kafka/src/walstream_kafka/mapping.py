"""How Kafka's names and records map onto walstream's: the one module to change if the mapping
changes (docs/guides/kafka.md states it for users).

**Names.** Partition ``P`` of topic ``T`` is the walstream stream ``_k.T.P`` (``P`` in decimal).
Kafka topic names are 1 to 249 characters from ``[a-zA-Z0-9._-]``, so the stream name obeys
walstream's stream-name rule, and it parses back unambiguously: the partition is what follows the
*last* ``.`` (always digits), the topic is what lies between ``_k.`` and that dot, dots included
(``_k.orders.1.0`` is partition 0 of topic ``orders.1``; ``_k.orders.1`` is partition 1 of
``orders``). The ``_`` that begins the prefix keeps Kafka's streams apart from the S2 service's
``<basin>.<stream>`` names: basin names begin with a lowercase letter or digit. Through the S2
API the streams are the basin ``walstream``'s (which shows every walstream stream under its own
name). A stream name has at most 255 characters, so a topic of ``L`` characters has at most
``10 ** (251 - L)`` partitions (every topic of up to 241 characters can have Kafka's 2**31 - 1);
CreateTopics and CreatePartitions refuse more with ``INVALID_PARTITIONS``.

**Records.** One Kafka record is one walstream record: key → key, value → value, headers →
headers (names are the Kafka header keys, UTF-8), timestamp (CreateTime) → ``timestamp_ms``;
offsets are the same numbers. What walstream cannot say by itself travels in one extra header,
last, named :data:`META_HEADER`, whose value is comma-separated tokens:

- ``value``: the Kafka value was null (stored as empty bytes);
- ``h<index>``: the value of header ``index`` was null (stored as empty bytes);
- ``p<producer id>:<epoch>:<base sequence>:<record count>``: this record ends a batch of an
  idempotent producer, so the node that owns the partition next recovers each producer's last
  sequence from the stream's tail (:mod:`walstream_kafka.producer_ids`) without a metadata write
  per batch.

The header is written when there is a token, and also (empty) when the record's own last header
has that name, so reading strips exactly one trailing :data:`META_HEADER` whenever it is there
and a record reads back as it was produced. Kafka consumers never see it; S2 and Python readers
see it on records that hold a null or end an idempotent batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from walstream.records import MAX_STREAM_NAME_LENGTH, Record, SequencedRecord

__all__ = [
    "MAX_TOPIC_NAME_LENGTH",
    "META_HEADER",
    "STREAM_PREFIX",
    "KafkaRecord",
    "ProducerMark",
    "check_topic_name",
    "max_partitions",
    "parse_stream_name",
    "read_producer_mark",
    "stream_name",
    "to_kafka",
    "to_walstream",
]

#: Every Kafka partition's stream name begins with it.
STREAM_PREFIX = "_k."
#: Kafka's own limit on a topic name's length.
MAX_TOPIC_NAME_LENGTH = 249
META_HEADER = "walstream-kafka"
MAX_PARTITIONS = 2**31 - 1

_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")


def check_topic_name(topic: str) -> str | None:
    """Why ``topic`` is not a legal Kafka topic name, or None when it is."""
    if not topic:
        return "a topic name must not be empty"
    if len(topic) > MAX_TOPIC_NAME_LENGTH:
        return f"a topic name has at most {MAX_TOPIC_NAME_LENGTH} characters, got {len(topic)}"
    if topic in (".", ".."):
        return f"topic name {topic!r} is not allowed"
    if _TOPIC.fullmatch(topic) is None:
        return f"topic name {topic[:60]!r} may only hold ASCII letters, digits, '.', '_' and '-'"
    return None


def max_partitions(topic: str) -> int:
    """How many partitions topic ``topic`` can have (its stream names fit 255 characters)."""
    digits = MAX_STREAM_NAME_LENGTH - len(STREAM_PREFIX) - len(topic) - 1
    if digits >= 10:
        return MAX_PARTITIONS
    return int(min(MAX_PARTITIONS, 10**digits))


def stream_name(topic: str, partition: int) -> str:
    """The walstream stream of ``topic``'s partition ``partition``."""
    return f"{STREAM_PREFIX}{topic}.{partition}"


def parse_stream_name(name: str | None) -> tuple[str, int] | None:
    """(topic, partition) of a Kafka partition's stream, or None for any other stream."""
    if name is None or not name.startswith(STREAM_PREFIX):
        return None
    topic, dot, partition = name[len(STREAM_PREFIX) :].rpartition(".")
    if not dot or not partition.isdigit() or check_topic_name(topic) is not None:
        return None
    if partition != str(int(partition)):  # "01" is nobody's partition
        return None
    return topic, int(partition)


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """A record as Kafka sees it."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class ProducerMark:
    """An idempotent producer's batch, as stored on its last record."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int


def to_walstream(
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] | tuple[tuple[str, bytes | None], ...],
    timestamp_ms: int | None,
    mark: ProducerMark | None = None,
) -> Record:
    """The walstream record of a produced Kafka record (``mark`` on a batch's last record)."""
    if not headers and mark is None and value is not None:
        # The common record (no headers, a value, not a batch's idempotence mark): nothing to say
        # in META_HEADER.
        return Record(value=value, key=key, timestamp_ms=timestamp_ms)
    tokens: list[str] = [] if value is not None else ["value"]
    stored: list[tuple[str, bytes]] = []
    for index, (name, data) in enumerate(headers):
        if data is None:
            tokens.append(f"h{index}")
            data = b""
        stored.append((name, data))
    if mark is not None:
        tokens.append(
            f"p{mark.producer_id}:{mark.producer_epoch}:{mark.base_sequence}:{mark.count}"
        )
    if tokens or (stored and stored[-1][0] == META_HEADER):
        stored.append((META_HEADER, ",".join(tokens).encode()))
    return Record(
        value=b"" if value is None else value,
        key=key,
        headers=tuple(stored),
        timestamp_ms=timestamp_ms,
    )


def _meta_tokens(record: SequencedRecord) -> list[str] | None:
    headers = record.headers
    if not headers or headers[-1][0] != META_HEADER:
        return None
    return headers[-1][1].decode("ascii", "replace").split(",")


def to_kafka(record: SequencedRecord) -> KafkaRecord:
    """The Kafka record of a stored walstream record (any walstream record has one)."""
    tokens = _meta_tokens(record)
    if tokens is None:
        return KafkaRecord(
            record.offset, record.timestamp_ms, record.key, record.value, list(record.headers)
        )
    headers: list[tuple[str, bytes | None]] = list(record.headers[:-1])
    value: bytes | None = record.value
    for token in tokens:
        if token == "value":
            value = None
        elif token.startswith("h") and token[1:].isdigit() and int(token[1:]) < len(headers):
            index = int(token[1:])
            headers[index] = (headers[index][0], None)
    return KafkaRecord(record.offset, record.timestamp_ms, record.key, value, headers)


def read_producer_mark(record: SequencedRecord) -> ProducerMark | None:
    """The idempotent producer's batch that ``record`` ends, if it ends one."""
    for token in _meta_tokens(record) or ():
        if not token.startswith("p"):
            continue
        parts = token[1:].split(":")
        try:
            producer_id, epoch, base_sequence, count = (int(part) for part in parts)
        except ValueError:
            return None
        return ProducerMark(producer_id, epoch, base_sequence, count)
    return None
