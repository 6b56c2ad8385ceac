"""The records routes of the S2 API: append, read and check tail (unary forms here, the SSE and
S2S session forms in :mod:`walstream.server.s2.sessions`).

**Append.** 1 to 1000 records of at most 1 MiB metered bytes (S2's measure: 8 bytes per record,
2 per header, plus the bytes of names, values and body). ``match_seq_num`` is walstream's
``match_tail`` (412 ``seq_num_mismatch`` with the tail). ``fencing_token`` must equal the token
last set by a ``fence`` command (S2's token starts as ``""``, which is walstream's "no token"),
else 412 ``fencing_token_mismatch`` with the current token. Command records (exactly one header,
with an empty name): ``fence`` (the body, at most 36 bytes of UTF-8, becomes the token once the
batch is durable; appends that arrive meanwhile wait for it, so none checked against the old
token lands after the fence record) and ``trim`` (the body, an 8-byte big-endian sequence number, becomes the
first readable record once the batch is durable; clamped to the tail). Command records are
stored like any record. Timestamps: a client timestamp is capped at the arrival time, a missing
one is the arrival time, and the engine keeps them non-decreasing.

**Read.** From ``seq_num``, ``timestamp`` (the first record at or after it) or ``tail_offset``
(default: ``tail_offset=0``); ``count`` (at most 1000) and ``bytes`` (metered, at most 1 MiB)
bound the batch, ``until`` stops before the first record with a timestamp at or after it;
a start past the tail answers 416 with the tail unless ``clamp=true``; reading at the tail
answers 416 unless ``wait`` (seconds, 0 to 60) lets the read wait for new records. A start
before the first readable record (trimmed) reads from the first readable record.
"""

from __future__ import annotations

import asyncio
import struct
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from walstream.errors import (
    FencedError,
    InvalidArgument,
    OutOfRangeError,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
)
from walstream.records import MAX_I64, Record, SequencedRecord, parse_int_text
from walstream.server.s2.errors import S2Error
from walstream.server.s2.model import KEY_HEADER
from walstream.server.s2.wire import (
    AppendRequest,
    append_input,
    encode_append_ack,
    encode_read_batch,
    json_read_batch,
    position_json,
)

if TYPE_CHECKING:
    from walstream.engine.client import Stream
    from walstream.server.s2.app import S2App
    from walstream.server.s2.asgi import Request

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "ReadParams",
    "Wire",
    "append_once",
    "check_tail",
    "open_for",
    "read_committed_here",
    "read_once",
    "records_route",
    "resolve_start",
    "tail_timestamp",
    "wants_base64",
]

MAX_BATCH_RECORDS = 1000
MAX_BATCH_BYTES = 1 << 20
MAX_FENCING_TOKEN_BYTES = 36
MAX_UNARY_WAIT_S = 60
PROTOBUF_TYPES = frozenset({"application/protobuf", "application/x-protobuf"})
"""The media types of the protobuf forms: S2's TypeScript SDK sends the first, its Python SDK the
second; both name the same messages."""
S2S = "s2s/proto"

Wire = tuple[int, int, tuple[tuple[bytes, bytes], ...], bytes]
"""A record as the codecs take it: (seq_num, timestamp, headers, body)."""


def metered_bytes(headers: tuple[tuple[bytes, bytes], ...], body: bytes) -> int:
    return 8 + 2 * len(headers) + sum(len(n) + len(v) for n, v in headers) + len(body)


async def records_route(app: S2App, request: Request, basin: str, name: str) -> None:
    if request.method == "POST":
        return await _append_route(app, request, basin, name)
    if request.method == "GET":
        return await _read_route(app, request, basin, name)
    raise S2Error(405, "bad_path", f"method {request.method} is not allowed on records")


async def open_for(app: S2App, basin: str, name: str, create_flag: str) -> Stream:
    """The stream, created first when the basin's ``create_flag`` config says so."""
    try:
        return await app.open_stream(name)
    except StreamNotFound:
        if not (await app.basin_config(basin)).get(create_flag):
            raise
    with suppress(StreamExists):
        await app.client.create_stream(name)
    return await app.open_stream(name)


# -- append -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Prepared:
    records: list[Record]
    fence: str | None
    """The token a ``fence`` command sets (``""`` clears it), None without one."""
    trim: int | None


def _prepare(request: AppendRequest) -> _Prepared:
    count = len(request.records)
    if not 1 <= count <= MAX_BATCH_RECORDS:
        raise S2Error(422, "invalid", f"an append takes 1 to 1000 records, got {count}")
    now_ms = int(time.time() * 1000)
    records: list[Record] = []
    fence: str | None = None
    trim: int | None = None
    size = 0
    for index, s2_record in enumerate(request.records):
        headers = s2_record.headers
        size += metered_bytes(headers, s2_record.body)
        if any(not name for name, _ in headers):
            if len(headers) != 1:
                raise S2Error(
                    422,
                    "invalid",
                    f"records[{index}]: a command record has exactly one header, with an "
                    "empty name",
                )
            command = headers[0][1]
            if command == b"fence":
                fence = _fence_token(s2_record.body, index)
            elif command == b"trim":
                if len(s2_record.body) != 8:
                    raise S2Error(
                        422, "invalid", f"records[{index}]: a trim command's body is 8 bytes"
                    )
                point = struct.unpack(">Q", s2_record.body)[0]
                trim = point if trim is None else max(trim, point)
            else:
                raise S2Error(422, "invalid", f"records[{index}]: unknown command {command[:40]!r}")
        records.append(_record(s2_record.headers, s2_record.body, s2_record.timestamp, now_ms))
    if size > MAX_BATCH_BYTES:
        raise S2Error(
            422, "invalid", f"a batch has at most 1 MiB of metered bytes, got {size} bytes"
        )
    return _Prepared(records, fence, trim)


def _fence_token(body: bytes, index: int) -> str:
    try:
        token = body.decode("utf-8")
    except UnicodeDecodeError:
        raise S2Error(422, "invalid", f"records[{index}]: a fencing token is UTF-8") from None
    if len(body) > MAX_FENCING_TOKEN_BYTES:
        raise S2Error(422, "invalid", f"records[{index}]: a fencing token has at most 36 bytes")
    return token


def _record(
    headers: tuple[tuple[bytes, bytes], ...], body: bytes, timestamp: int | None, now_ms: int
) -> Record:
    key: bytes | None = None
    pairs: list[tuple[str, bytes]] = []
    try:
        for position, (name, value) in enumerate(headers):
            text = name.decode("utf-8")
            if position == 0 and text == KEY_HEADER:
                key = value
            else:
                pairs.append((text, value))
    except UnicodeDecodeError:
        raise S2Error(
            422, "invalid", "header names are UTF-8 text on this server (walstream stores text)"
        ) from None
    stamped = None if timestamp is None else min(timestamp, now_ms, MAX_I64)
    return Record(body, key, tuple(pairs), stamped)


async def append_once(app: S2App, stream: Stream, request: AppendRequest) -> dict[str, Any]:
    """Append one ``AppendInput``; its ``AppendAck`` as JSON."""
    start, end, tail = await append_positions(app, stream, request)
    return {
        "start": position_json(*start),
        "end": position_json(*end),
        "tail": position_json(*tail),
    }


async def append_positions(
    app: S2App, stream: Stream, request: AppendRequest
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    prepared = _prepare(request)
    wanted = request.fencing_token
    engine_token = wanted or None
    if wanted is not None and wanted != "" and len(wanted.encode("utf-8")) > 36:
        raise S2Error(422, "invalid", "fencing_token has at most 36 bytes")
    # A fence in progress on this stream: wait for the token it sets, so no append checked
    # against the old token lands after the fence record.
    fences = app.fences
    while (pending := fences.get(stream.stream_id)) is not None:
        await asyncio.shield(pending)
    gate: asyncio.Future[None] | None = None
    if prepared.fence is not None:
        gate = asyncio.get_running_loop().create_future()
        fences[stream.stream_id] = gate
    try:
        if wanted is not None and engine_token is None and stream.fencing_token is not None:
            raise _token_mismatch(stream)
        try:
            ack = await stream.append(
                prepared.records, match_tail=request.match_seq_num, fencing_token=engine_token
            )
        except TailMismatchError as error:
            raise S2Error(412, "", str(error), {"seq_num_mismatch": error.actual_tail}) from None
        except FencedError:
            if wanted is not None and stream.fencing_token != engine_token:
                raise _token_mismatch(stream) from None
            raise
        if prepared.fence is not None:
            await stream.set_fencing_token(prepared.fence or None)
    finally:
        if gate is not None:
            if fences.get(stream.stream_id) is gate:
                del fences[stream.stream_id]
            gate.set_result(None)
    if prepared.trim is not None:
        await stream.trim(min(prepared.trim, ack.tail))
    if ack.tail == ack.end:
        app.tail_timestamps[stream.stream_id] = (ack.end, ack.last_timestamp_ms)
    return (
        (ack.start, ack.first_timestamp_ms),
        (ack.end, ack.last_timestamp_ms),
        (ack.tail, ack.last_timestamp_ms),
    )


def _token_mismatch(stream: Stream) -> S2Error:
    current = stream.fencing_token or ""
    return S2Error(
        412,
        "",
        "fencing token mismatch",
        {"fencing_token_mismatch": current},
    )


def media_type(value: str | None) -> str:
    """The first media type of a ``Content-Type`` or ``Accept`` value, lower case, without its
    parameters (``""`` when there is none): S2 reads only the first type of ``Accept``."""
    return (value or "").split(",", 1)[0].split(";", 1)[0].strip().lower()


def protobuf_answer(request: Request) -> bytes | None:
    """The protobuf media type to answer with when the first type ``Accept`` names is one (the
    type the client named), else None: the answer is JSON."""
    accepted = media_type(request.header("accept"))
    return accepted.encode() if accepted in PROTOBUF_TYPES else None


async def _append_route(app: S2App, request: Request, basin: str, name: str) -> None:
    content_type = media_type(request.header("content-type"))
    if content_type == S2S:
        from walstream.server.s2.sessions import append_session

        return await append_session(app, request, basin, name)
    body = await request.body()
    stream = await open_for(app, basin, name, "create_stream_on_append")
    # The body's form follows Content-Type, the answer's form follows Accept (as S2's own server).
    parsed = append_input(body, content_type in PROTOBUF_TYPES, wants_base64(request))
    answer_type = protobuf_answer(request)
    if answer_type is None:
        return await request.respond_json(200, await append_once(app, stream, parsed))
    start, end, tail = await append_positions(app, stream, parsed)
    await request.respond(200, encode_append_ack(start, end, tail), answer_type)


def wants_base64(request: Request) -> bool:
    chosen = (request.header("s2-format") or "raw").lower()
    if chosen not in ("raw", "base64"):
        raise S2Error(400, "bad_header", "s2-format is raw or base64")
    return chosen == "base64"


# -- read ---------------------------------------------------------------------------------------


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
    return params


def _rest(params: ReadParams) -> tuple[int | None, int | None, int | None, bool, int | None]:
    return params.count, params.bytes, params.until, params.clamp, params.wait


async def tail_timestamp(app: S2App, stream: Stream, tail: int) -> int:
    """The timestamp of the record before ``tail`` (0 when there is none or it is trimmed)."""
    cached = app.tail_timestamps.get(stream.stream_id)
    if cached is not None and cached[0] == tail:
        return cached[1]
    timestamp = 0
    if tail > 0:
        try:
            result = await stream.read(tail - 1, limit_records=1)
        except OutOfRangeError:
            result = None
        if result is not None and result.records and result.records[0].offset == tail - 1:
            timestamp = result.records[0].timestamp_ms
    app.tail_timestamps[stream.stream_id] = (tail, timestamp)
    return timestamp


async def _unwritten(app: S2App, stream: Stream, tail: int) -> S2Error:
    position = position_json(tail, await tail_timestamp(app, stream, tail))
    return S2Error(416, "", "read from an unwritten position", {"tail": position})


async def resolve_start(
    app: S2App, stream: Stream, params: ReadParams, may_follow: bool
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
) -> tuple[list[SequencedRecord], int, bool]:
    """One batch: (records, tail, done) where ``done`` says ``until`` was reached."""
    try:
        result = await stream.read(
            start,
            from_timestamp=timestamp,
            limit_records=count,
            limit_bytes=byte_limit,
            wait=wait,
        )
    except OutOfRangeError as error:
        if start is None or start >= error.start_offset:
            raise
        result = await stream.read(
            error.start_offset, limit_records=count, limit_bytes=byte_limit, wait=wait
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
    app: S2App, stream: Stream, records: list[SequencedRecord], tail: int
) -> tuple[int, int] | None:
    """The tail to report with a batch: when the batch ends at the tail, or is empty."""
    if records:
        last = records[-1]
        if last.offset + 1 != tail:
            return None
        app.tail_timestamps[stream.stream_id] = (tail, last.timestamp_ms)
        return tail, last.timestamp_ms
    return tail, await tail_timestamp(app, stream, tail)


async def _read_route(app: S2App, request: Request, basin: str, name: str) -> None:
    params = parse_read_params(request.query)
    accept = (request.header("accept") or "").lower()
    content_type = (request.header("content-type") or "").lower()
    if content_type.startswith(S2S) or "text/event-stream" in accept:
        from walstream.server.s2.sessions import read_session

        return await read_session(app, request, basin, name, params, sse=S2S not in content_type)
    base64_format = wants_base64(request)
    stream = await open_for(app, basin, name, "create_stream_on_read")
    wait = min(params.wait or 0, app.max_wait_s)
    start, timestamp = await resolve_start(app, stream, params, may_follow=wait > 0)
    count = min(params.count or MAX_BATCH_RECORDS, MAX_BATCH_RECORDS)
    byte_limit = min(params.bytes or MAX_BATCH_BYTES, MAX_BATCH_BYTES)
    records: list[SequencedRecord]
    if wait > 0:
        records, tail = await _long_poll(
            app, request, stream, start, timestamp, count, byte_limit, params.until, wait
        )
    else:
        records, tail, _ = await read_once(
            stream, start, timestamp, count, byte_limit, params.until, 0
        )
    position = await batch_tail(app, stream, records, tail)
    answer_type = protobuf_answer(request)
    if answer_type is not None:
        return await request.respond(200, encode_read_batch(wire(records), position), answer_type)
    await request.respond_json(200, json_read_batch(wire(records), position, base64_format))


async def read_committed_here(app: S2App, request: Request, stream: Stream) -> bool:
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
    try:
        records, _, _ = await read_once(
            stream, params.seq_num, params.timestamp, count, byte_limit, params.until, 0
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


async def _long_poll(
    app: S2App,
    request: Request,
    stream: Stream,
    start: int | None,
    timestamp: int | None,
    count: int,
    byte_limit: int,
    until: int | None,
    wait: float,
) -> tuple[list[SequencedRecord], int]:
    """A read that waits: it ends when records arrive, at shutdown (answered with what it
    has), or as soon as its client is gone (which frees its place under max_long_polls)."""
    with app.long_poll():
        reading = asyncio.ensure_future(
            read_once(stream, start, timestamp, count, byte_limit, until, wait)
        )
        gone = asyncio.ensure_future(request.disconnected())
        try:
            if not await app.unless_stopping(reading, gone):
                return [], await stream.check_tail()
        finally:
            gone.cancel()
        records, tail, _ = reading.result()
        return records, tail


async def check_tail(app: S2App, request: Request, basin: str, name: str) -> None:
    stream = await open_for(app, basin, name, "create_stream_on_read")
    tail = await stream.check_tail()
    timestamp = await tail_timestamp(app, stream, tail)
    await request.respond_json(200, {"tail": position_json(tail, timestamp)})
