"""Kafka record batches (magic 2) in and out, through aiokafka's record codec (C accelerated)
and its compression codecs: gzip, snappy (raw and xerial-framed, as the Java client and
librdkafka write it), lz4 and zstd.

Produced batches are checked before anything is appended: the length and magic of each batch,
its CRC-32C, its compression, and that it decodes to exactly ``last_offset_delta + 1`` records.
A batch that fails is refused whole (``CORRUPT_MESSAGE``), so a torn or forged request never
stores part of a batch. Fetched records go out as uncompressed batches built from the stored
records, one per contiguous run.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from walstream_kafka.mapping import KafkaRecord

__all__ = ["BatchError", "ProducedBatch", "ProducedRecord", "encode_batch", "split_batches"]

_HEADER = struct.Struct(">qiib")  # base offset, batch length, leader epoch, magic
_LOG_OVERHEAD = 12  # base offset + batch length
_MIN_BATCH_BYTES = 61  # the v2 batch header, without records
_CRC = struct.Struct(">I")
_CRC_START = 17  # after base offset, batch length, leader epoch, magic
_CRC_END = _CRC_START + 4  # the CRC covers the attributes onwards
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20
#: A built batch never grows past this (records beyond it go in the next batch).
_BUILDER_LIMIT_BYTES = 1 << 30


class BatchError(Exception):
    """A produced batch that cannot be stored; ``code`` is the Kafka error code to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


CORRUPT_MESSAGE = 2
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


class ProducedRecord(NamedTuple):
    """One record of a produced batch (a tuple: made 100 times per batch on the produce path,
    where a frozen dataclass's ``__init__`` showed in the profile)."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[ProducedRecord]


def split_batches(data: bytes | memoryview) -> list[ProducedBatch]:
    """Every batch of a produce request's partition data, decoded and checked
    (:class:`BatchError` for the first that fails)."""
    view = memoryview(data)
    batches: list[ProducedBatch] = []
    position = 0
    while position < len(view):
        if len(view) - position < _LOG_OVERHEAD + 5:
            raise BatchError(CORRUPT_MESSAGE, "a record batch is cut short")
        _base, length, _epoch, magic = _HEADER.unpack_from(view, position)
        if magic != 2:
            raise BatchError(
                UNSUPPORTED_FOR_MESSAGE_FORMAT,
                f"message format v{magic} is not supported; produce record batches (magic 2, "
                "Kafka 0.11+ clients)",
            )
        end = position + _LOG_OVERHEAD + length
        if length < _MIN_BATCH_BYTES - _LOG_OVERHEAD or end > len(view):
            raise BatchError(CORRUPT_MESSAGE, "a record batch's length does not match its bytes")
        batches.append(_decode(bytes(view[position:end])))
        position = end
    if not batches:
        raise BatchError(CORRUPT_MESSAGE, "the produce request holds no record batch")
    return batches


def _decode(raw: bytes) -> ProducedBatch:
    # The CRC-32C covers the batch from its attributes to its end; checked with the crc32c
    # package (hardware instructions where the CPU has them), 2-3x faster than aiokafka's
    # validate_crc() on a 100 KiB batch, the same check.
    if crc32c.crc32c(memoryview(raw)[_CRC_END:]) != _CRC.unpack_from(raw, _CRC_START)[0]:
        raise BatchError(CORRUPT_MESSAGE, "a record batch failed its CRC-32C check")
    batch = DefaultRecordBatch(raw)
    attributes = batch.attributes
    if attributes & _ATTR_CONTROL:
        raise BatchError(INVALID_RECORD, "control batches are written by brokers, not producers")
    if attributes & _ATTR_TRANSACTIONAL:
        raise BatchError(
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "transactions are not supported by walstream; produce without transactional.id",
        )
    try:
        records = [
            ProducedRecord(record.timestamp, record.key, record.value, list(record.headers))
            for record in batch
        ]
    except UnsupportedCodecError as error:
        raise BatchError(UNSUPPORTED_COMPRESSION_TYPE, str(error)) from None
    except (CorruptRecordException, ValueError, struct.error, UnicodeDecodeError) as error:
        raise BatchError(CORRUPT_MESSAGE, f"a record batch does not decode: {error}") from None
    except Exception as error:  # a codec library's own error on damaged compressed bytes
        raise BatchError(CORRUPT_MESSAGE, f"a record batch does not decompress: {error}") from None
    if len(records) != batch.last_offset_delta + 1:
        raise BatchError(
            CORRUPT_MESSAGE,
            f"a record batch says it holds {batch.last_offset_delta + 1} records but holds "
            f"{len(records)}",
        )
    for record in records:
        if record.timestamp_ms < 0 and record.timestamp_ms != -1:
            raise BatchError(INVALID_RECORD, f"a record's timestamp is {record.timestamp_ms}")
    return ProducedBatch(batch.producer_id, batch.producer_epoch, batch.base_sequence, records)


def encode_batch(records: Sequence[KafkaRecord]) -> bytes:
    """One uncompressed batch of contiguous ``records`` (their offsets must not skip)."""
    base = records[0].offset
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=_BUILDER_LIMIT_BYTES,
    )
    for record in records:
        builder.append(
            record.offset - base, record.timestamp_ms, record.key, record.value, record.headers
        )
    built = builder.build()
    struct.pack_into(">q", built, 0, base)  # the base offset is not covered by the CRC
    return bytes(built)
