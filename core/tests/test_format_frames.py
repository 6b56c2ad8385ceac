"""The shared payload framing (walstream.format.frames): CRC trailers and record tables."""

from __future__ import annotations

import struct

import crc32c
import pytest
from walstream.errors import CorruptionError
from walstream.format.frames import (
    CRC_BYTES,
    TableErrors,
    crc_trailer_ok,
    decode_record_table,
    encode_record_table,
    with_crc,
)

ERRORS = TableErrors("length overruns", "payload overruns", "{count} bytes left over")


def test_with_crc_appends_the_crc32c_of_all_parts_big_endian() -> None:
    sealed = with_crc(b"head", b"", b"body")
    assert sealed[:-CRC_BYTES] == b"headbody"
    assert sealed[-CRC_BYTES:] == struct.pack(">I", crc32c.crc32c(b"headbody"))
    assert with_crc(b"") == struct.pack(">I", 0)


def test_crc_trailer_check_catches_every_flipped_byte_and_short_spans() -> None:
    sealed = with_crc(b"some framed bytes")
    assert crc_trailer_ok(sealed)
    for position in range(len(sealed)):
        damaged = bytearray(sealed)
        damaged[position] ^= 0x01
        assert not crc_trailer_ok(bytes(damaged)), position
    assert not crc_trailer_ok(sealed[:-1])
    assert not crc_trailer_ok(b"abc")


def test_crc_trailer_check_of_a_span_inside_larger_bytes() -> None:
    record = with_crc(b"\x01\x00\x00\x00\x02ok")
    data = b"garbage" + record + b"more"
    start, end = 7, 7 + len(record)
    assert crc_trailer_ok(data, start, end)
    assert not crc_trailer_ok(data, start, end + 1)
    assert not crc_trailer_ok(data, start + 1, end)


def test_record_table_round_trips_empty_and_binary_payloads() -> None:
    payloads = [b"", b"a", bytes(range(256)), b"\x00" * 5]
    table = encode_record_table(payloads)
    assert table[:8] == b"\x00\x00\x00\x00\x00\x00\x00\x01"
    assert len(table) == sum(4 + len(payload) for payload in payloads)
    assert decode_record_table(table, len(payloads), ERRORS) == payloads
    assert decode_record_table(b"HEAD" + table, len(payloads), ERRORS, start=4) == payloads
    assert encode_record_table([]) == b""
    assert decode_record_table(b"", 0, ERRORS) == []


def test_record_table_refuses_overruns_and_left_over_bytes_in_the_formats_words() -> None:
    table = encode_record_table([b"abc", b"de"])
    with pytest.raises(CorruptionError, match=r"^length overruns$"):
        decode_record_table(table, 3, ERRORS)
    with pytest.raises(CorruptionError, match=r"^payload overruns$"):
        decode_record_table(table[:-1], 2, ERRORS)
    with pytest.raises(CorruptionError, match=r"^length overruns$"):
        decode_record_table(table[:9], 2, ERRORS)
    with pytest.raises(CorruptionError, match=r"^6 bytes left over$"):
        decode_record_table(table, 1, ERRORS)
    with pytest.raises(CorruptionError, match=r"^1 bytes left over$"):
        decode_record_table(table + b"x", 2, ERRORS)
