"""A produced record batch is checked whole before anything is appended: a batch whose bytes
changed after its producer computed the CRC-32C is refused with ``CORRUPT_MESSAGE``."""

from __future__ import annotations

import os

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from walstream_kafka.batches import CORRUPT_MESSAGE, BatchError, split_batches


def batch(records: int = 100, size: int = 1024) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for index in range(records):
        builder.append(index, 1_700_000_000_000 + index, b"k%d" % index, os.urandom(size), [])
    return bytes(builder.build())


def test_an_intact_batch_decodes_to_its_records() -> None:
    raw = batch()
    (decoded,) = split_batches(raw + raw)[:1]
    assert len(decoded.records) == 100
    assert decoded.records[7].key == b"k7"
    assert len(split_batches(raw + raw)) == 2


@pytest.mark.parametrize("where", ["attributes", "crc", "first value", "middle", "last byte"])
def test_a_flipped_byte_is_corrupt_message(where: str) -> None:
    raw = bytearray(batch())
    position = {
        "attributes": 22,
        "crc": 18,
        "first value": 80,
        "middle": len(raw) // 2,
        "last byte": len(raw) - 1,
    }[where]
    raw[position] ^= 0x01
    with pytest.raises(BatchError) as refused:
        split_batches(bytes(raw))
    assert refused.value.code == CORRUPT_MESSAGE
    # The second of two batches damaged: the request is refused whole.
    with pytest.raises(BatchError):
        split_batches(batch() + bytes(raw))
