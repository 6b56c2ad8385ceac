"""Reads through the S2 API (unary, long polls, sessions and reads of committed data served
for another node): S2's rules on top of the engine's read.

From ``seq_num``, ``timestamp`` (the first record at or after it) or ``tail_offset``
(default: ``tail_offset=0``); ``count`` (at most 1000) and ``bytes`` (metered, at most 1 MiB)
bound the batch, ``until`` stops before the first record with a timestamp at or after it;
a start past the tail answers 416 with the tail unless ``clamp=true``; reading at the tail
answers 416 unless ``wait`` (seconds, 0 to 60) lets the read wait for new records. A start
before the first readable record (trimmed) reads from the first readable record.

As S2 (s2-lite's ``ReadLimit::from_count_and_bytes`` and ``validate_read_until``): ``count=0``
or ``bytes=0`` is a limit of zero records, so the batch is empty (and carries no tail), after
the start was checked as for any read; a ``timestamp`` start at or past ``until`` is refused
with 422 ``invalid`` before the stream is looked up (so it creates no stream either).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from walstream.errors import InvalidArgument, OutOfRangeError
from walstream.records import SequencedRecord, parse_int_text
from walstream.server.s2.errors import S2Error
from walstream.server.s2.model import (
    KEY_HEADER,
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    MAX_UNARY_WAIT_S,
    metered_bytes,
)
from walstream.server.s2.wire import (
    PROTOBUF_TYPES,
    S2S,
    encode_read_batch,
    json_read_batch,
    media_type,
    position_json,
)

if TYPE_CHECKING:
    from walstream.encryption import EncryptionKey
    from walstream.engine.client import Stream
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = [
    "ReadParams",
    "Wire",
    "batch_bytes",
    "batch_tail",
    "long_poll",
    "parse_read_params",
    "protobuf_answer",
    "read_committed_here",
    "read_once",
    "reads_nothing",
    "resolve_start",
    "tail_timestamp",
    "wants_base64",
    "wire",
    "wire_headers",
]

Wire = tuple[int, int, tuple[tuple[bytes, bytes], ...], bytes]
"""A record as the codecs take it: (seq_num, timestamp, headers, body)."""


def protobuf_answer(request: Request) -> bytes | None:
    """The protobuf media type to answer with when the first type ``Accept`` names is one (the
    type the client named), else None: the answer is JSON."""
    accepted = media_type(request.header("accept"))
    return accepted.encode() if accepted in PROTOBUF_TYPES else None


def wants_base64(request: Request) -> bool:
    chosen = (request.header("s2-format") or "raw").lower()
    if chosen not in ("raw", "base64"):
        raise S2Error(400, "bad_header", "s2-format is raw or base64")
    return chosen == "base64"


@dataclass(frozen=True, slots=True)
class ReadParams:
    seq_num: int | None
    timestamp: int | None
    tail_offset: int | None
    count: int | None
    bytes: int | None
    until: int | None
    clamp: bool
    wait: int | None


def parse_read_params(query: dict[str, str]) -> ReadParams:
    def number(key: str) -> int | None:
        if key not in query:
            return None
        try:
            return parse_int_text(query[key], key)
        except InvalidArgument as error:
            raise S2Error(400, "bad_query", str(error)) from None

    starts = [key for key in ("seq_num", "timestamp", "tail_offset") if key in query]
    if len(starts) > 1:
        raise S2Error(400, "bad_query", "give at most one of seq_num, timestamp, tail_offset")
    clamp = query.get("clamp", "false").lower()
    if clamp not in ("true", "false"):
        raise S2Error(400, "bad_query", "clamp is true or false")
    wait = number("wait")
    if wait is not None and wait > MAX_UNARY_WAIT_S:
        raise S2Error(400, "bad_query", "wait is 0 to 60 seconds")
    params = ReadParams(
        number("seq_num"),
        number("timestamp"),
        number("tail_offset"),
        number("count"),
        number("bytes"),
        number("until"),
        clamp == "true",
        wait,
    )
    if not starts:
        params = ReadParams(None, None, 0, *_rest(params))
    if (
        params.timestamp is not None
        and params.until is not None
        and params.timestamp >= params.until
    ):
        raise S2Error(422, "invalid", "start `timestamp` exceeds or equal to `until`")
    return params


def reads_nothing(params: ReadParams) -> bool:
    """True when the limits admit no record at all (``count=0`` or ``bytes=0``)."""
    return params.count == 0 or params.bytes == 0


def _rest(params: ReadParams) -> tuple[int | None, int | None, int | None, bool, int | None]:
    return params.count, params.bytes, params.until, params.clamp, params.wait


async def tail_timestamp(app: S2Context, stream: Stream, tail: int) -> int:
    """The timestamp of the record before ``tail`` (0 when there is none or it is trimmed)."""
    cached = app.tail_timestamps.get(stream.stream_id)
    if cached is not None and cached[0] == tail:
        return cached[1]
    timestamp = 0
    if tail > 0:
        try:
            result = await stream.read(tail - 1, limit_records=1, stored=True)
        except OutOfRangeError:
            result = None
        if result is not None and result.records and result.records[0].offset == tail - 1:
            timestamp = result.records[0].timestamp_ms
    app.tail_timestamps[stream.stream_id] = (tail, timestamp)
    return timestamp


async def _unwritten(app: S2Context, stream: Stream, tail: int) -> S2Error:
    position = position_json(tail, await tail_timestamp(app, stream, tail))
    return S2Error(416, "", "read from an unwritten position", {"tail": position})


async def resolve_start(
    app: S2Context, stream: Stream, params: ReadParams, may_follow: bool
) -> tuple[int | None, int | None]:
    """(offset, None) or (None, timestamp) to read from; 416 past the tail without ``clamp``,
    or at the tail when the read may not wait."""
    tail = await stream.check_tail()
    if params.timestamp is not None:
        if tail > 0 and params.timestamp > await tail_timestamp(app, stream, tail):
            if not params.clamp:
                raise await _unwritten(app, stream, tail)
            start = tail
        else:
            return None, params.timestamp
    elif params.tail_offset is not None:
        start = max(tail - params.tail_offset, 0)
    else:
        assert params.seq_num is not None
        start = params.seq_num
        if start > tail:
            if not params.clamp:
                raise await _unwritten(app, stream, tail)
            start = tail
    if start == tail and not may_follow:
        raise await _unwritten(app, stream, tail)
    return start, None


async def read_once(
    stream: Stream,
    start: int | None,
    timestamp: int | None,
    count: int,
    byte_limit: int,
    until: int | None,
    wait: float,
    encryption: EncryptionKey | None = None,
) -> tuple[list[SequencedRecord], int, bool]:
    """One batch: (records, tail, done) where ``done`` says ``until`` was reached; encrypted
    records are opened with ``encryption``."""
    try:
        result = await stream.read(
            start,
            from_timestamp=timestamp,
            limit_records=count,
            limit_bytes=byte_limit,
            wait=wait,
            encryption=encryption,
        )
    except OutOfRangeError as error:
        if start is None or start >= error.start_offset:
            raise
        result = await stream.read(
            error.start_offset,
            limit_records=count,
            limit_bytes=byte_limit,
            wait=wait,
            encryption=encryption,
        )
    records: list[SequencedRecord] = []
    size = 0
    done = False
    for record in result.records:
        if until is not None and record.timestamp_ms >= until:
            done = True
            break
        size += metered_bytes(wire_headers(record), record.value)
        if size > byte_limit:
            break
        records.append(record)
    return records, result.tail, done


def batch_bytes(records: list[SequencedRecord]) -> int:
    """The metered size of a batch (what its answer is built from)."""
    return sum(metered_bytes(wire_headers(record), record.value) for record in records)


def wire_headers(record: SequencedRecord) -> tuple[tuple[bytes, bytes], ...]:
    headers = tuple((name.encode("utf-8"), value) for name, value in record.headers)
    if record.key is not None:
        return ((KEY_HEADER.encode(), record.key), *headers)
    return headers


def wire(records: list[SequencedRecord]) -> list[Wire]:
    return [
        (record.offset, record.timestamp_ms, wire_headers(record), record.value)
        for record in records
    ]


async def batch_tail(
    app: S2Context, stream: Stream, records: list[SequencedRecord], tail: int
) -> tuple[int, int] | None:
    """The tail to report with a batch: when the batch ends at the tail, or is empty."""
    if records:
        last = records[-1]
        if last.offset + 1 != tail:
            return None
        app.tail_timestamps[stream.stream_id] = (tail, last.timestamp_ms)
        return tail, last.timestamp_ms
    return tail, await tail_timestamp(app, stream, tail)


async def read_committed_here(app: S2Context, request: Request, stream: Stream) -> bool:
    """Answer a unary read of a stream another node writes from what is committed (object
    storage), when the answer cannot differ from the owner's: it starts at a sequence number or
    a timestamp and its batch ends before the committed end, so it carries no tail (records
    below the committed end never change). False: the owner must answer (tails, sessions,
    reads that reach the committed end)."""
    accept = (request.header("accept") or "").lower()
    content_type = (request.header("content-type") or "").lower()
    if content_type.startswith(S2S) or "text/event-stream" in accept:
        return False
    try:
        params = parse_read_params(request.query)
    except S2Error:
        return False  # the owner answers the error
    if params.seq_num is None and params.timestamp is None:
        return False
    committed_end = await stream.check_tail()
    if params.seq_num is not None and params.seq_num >= committed_end:
        return False
    count = min(params.count or MAX_BATCH_RECORDS, MAX_BATCH_RECORDS)
    byte_limit = min(params.bytes or MAX_BATCH_BYTES, MAX_BATCH_BYTES)
    await request.reserve_output(byte_limit)
    try:
        records, _, _ = await read_once(
            stream,
            params.seq_num,
            params.timestamp,
            count,
            byte_limit,
            params.until,
            0,
            await app.encryption_for(request, stream),
        )
    except OutOfRangeError:
        return False
    if not records or records[-1].offset + 1 >= committed_end:
        return False
    answer_type = protobuf_answer(request)
    if answer_type is not None:
        await request.respond(200, encode_read_batch(wire(records), None), answer_type)
    else:
        await request.respond_json(200, json_read_batch(wire(records), None, wants_base64(request)))
    return True


async def long_poll(
    app: S2Context,
    request: Request,
    stream: Stream,
    start: int | None,
    timestamp: int | None,
    count: int,
    byte_limit: int,
    until: int | None,
    wait: float,
    encryption: EncryptionKey | None = None,
) -> tuple[list[SequencedRecord], int]:
    """A read that waits: it ends when records arrive, at shutdown (answered with what it
    has), or as soon as its client is gone (which frees its place under max_long_polls)."""
    with app.long_poll(request):
        reading = asyncio.ensure_future(
            read_once(stream, start, timestamp, count, byte_limit, until, wait, encryption)
        )
        gone = asyncio.ensure_future(request.disconnected())
        try:
            if not await app.unless_stopping(reading, gone):
                return [], await stream.check_tail()
        finally:
            gone.cancel()
        records, tail, _ = reading.result()
        return records, tail
