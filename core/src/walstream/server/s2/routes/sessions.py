"""Streaming sessions of the S2 API: read sessions as Server-Sent Events (``Accept:
text/event-stream``) or S2S (``Content-Type: s2s/proto``), and S2S append sessions.

**Read sessions** send batches from the start position on and follow the tail: a session ends
when ``count`` or ``bytes`` (totals over the session) are reached, when ``until`` is reached,
when ``wait`` seconds pass at the tail without a new record (no ``wait``: it follows until the
client leaves), or when the server shuts down. As S2's (s2-lite's ``ReadEnd::may_follow``), a
session with a ``count``, ``bytes`` or ``until`` bound and no ``wait`` does not follow: it ends
at the tail (and a start at the tail answers 416); ``count=0`` or ``bytes=0`` sends no batch. While waiting at the tail a heartbeat goes out
every :data:`HEARTBEAT_S` seconds: an SSE ``ping`` event, or an empty S2S ``ReadBatch`` carrying
the tail. SSE batches carry ``id: <last seq_num>,<records so far>,<bytes so far>`` (S2's
``LastEventId``); a request with ``Last-Event-ID`` resumes after it (from that seq_num + 1,
with ``count`` and ``bytes`` less what was already delivered), as an ``EventSource`` does on a
reconnect; the last event is ``done``; an error becomes an ``error`` event (SSE) or a terminal
message (S2S).

**Append sessions** take a stream of ``AppendInput`` messages and answer one ``AppendAck`` per
input, in order. Inputs are pipelined into the engine in arrival order (which keeps their
order); an input after one that holds a command record waits for that one, so a ``fence``
applies to the inputs after it. The first failure ends the session with a terminal message
carrying S2's status and error body; inputs already handed to the engine may still land.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from walstream.errors import InvalidArgument, WalstreamError
from walstream.records import parse_int_text
from walstream.server.s2.appends import append_positions
from walstream.server.s2.compression import Coding, answer_coding
from walstream.server.s2.errors import S2Error, from_walstream
from walstream.server.s2.model import MAX_BATCH_BYTES, MAX_BATCH_RECORDS, metered_bytes
from walstream.server.s2.reads import (
    ReadParams,
    batch_bytes,
    batch_tail,
    read_once,
    reads_nothing,
    resolve_start,
    wants_base64,
    wire,
    wire_headers,
)
from walstream.server.s2.wire import (
    FrameReader,
    decode_append_input,
    encode_append_ack,
    encode_frame,
    encode_read_batch,
    encode_terminal,
    json_read_batch,
)

if TYPE_CHECKING:
    from walstream.encryption import EncryptionKey
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = ["HEARTBEAT_S", "append_session", "read_session"]

log = logging.getLogger(__name__)

#: Longest silence of a read session waiting at the tail.
HEARTBEAT_S = 10.0
#: Appends of one session in flight at once.
MAX_PIPELINED_INPUTS = 256
_S2S = b"s2s/proto"


def _as_s2(error: BaseException) -> S2Error:
    if isinstance(error, S2Error):
        return error
    if isinstance(error, WalstreamError):
        return from_walstream(error)
    return S2Error(500, "other", "internal error; the server log has the details")


async def _first(work: asyncio.Future[Any], *others: asyncio.Future[Any]) -> bool:
    """Wait until ``work`` or one of ``others`` is done; True when ``work`` is."""
    done, _ = await asyncio.wait({work, *others}, return_when=asyncio.FIRST_COMPLETED)
    return work in done


# -- read sessions ------------------------------------------------------------------------------


async def read_session(
    app: S2Context, request: Request, basin: str, name: str, params: ReadParams, sse: bool
) -> None:
    base64_format = wants_base64(request) if sse else False
    if sse:
        params = resume_after(params, request.header("last-event-id"))
    stream = await app.open_for(basin, name, "create_stream_on_read")
    encryption = await app.encryption_for(request, stream)
    start, timestamp = await resolve_start(app, stream, params, may_follow=may_follow(params))
    with app.long_poll(request):
        if sse:
            await request.start(200, b"text/event-stream", [(b"cache-control", b"no-cache")])
        else:
            await request.start(200, _S2S)
        stopping = asyncio.ensure_future(app.stopping.wait())
        gone = asyncio.ensure_future(request.disconnected())
        try:
            await _follow(
                app,
                request,
                stream,
                start,
                timestamp,
                params,
                sse,
                base64_format,
                stopping,
                gone,
                Coding.NONE if sse else answer_coding(request.header("accept-encoding")),
                encryption,
            )
        except Exception as error:  # the answer began: report in-band, then end it
            s2_error = _as_s2(error)
            if s2_error.status >= 500:
                log.warning("a read session failed", exc_info=error)
            if not gone.done():
                with suppress(Exception):
                    if sse:
                        await request.write(b"event: error\ndata: " + s2_error.encoded() + b"\n\n")
                    else:
                        await request.write(encode_terminal(s2_error.status, s2_error.encoded()))
        finally:
            stopping.cancel()
            gone.cancel()
            with suppress(Exception):
                await request.finish()


async def _follow(
    app: S2Context,
    request: Request,
    stream: Any,
    start: int | None,
    timestamp: int | None,
    params: ReadParams,
    sse: bool,
    base64_format: bool,
    stopping: asyncio.Future[Any],
    gone: asyncio.Future[Any],
    coding: Coding,
    encryption: EncryptionKey | None,
) -> None:
    if reads_nothing(params):
        if sse:
            await request.write(b"event: done\ndata: [DONE]\n\n")
        return
    follows = may_follow(params)
    remaining_count = params.count
    remaining_bytes = params.bytes
    sent_count = sent_bytes = 0
    deadline: float | None = None
    loop = asyncio.get_running_loop()
    while True:
        count = min(remaining_count or MAX_BATCH_RECORDS, MAX_BATCH_RECORDS)
        byte_limit = min(remaining_bytes or MAX_BATCH_BYTES, MAX_BATCH_BYTES)
        wait = HEARTBEAT_S
        if params.wait is not None:
            if deadline is None:
                deadline = loop.time() + params.wait
            wait = max(0.0, min(wait, deadline - loop.time()))
        if not follows:
            wait = 0.0
        reading = asyncio.ensure_future(
            read_once(stream, start, timestamp, count, byte_limit, params.until, wait, encryption)
        )
        if not await _first(reading, stopping, gone):
            reading.cancel()
            with suppress(BaseException):
                await reading
            if stopping.done() and not gone.done() and sse:
                await request.write(b"event: done\ndata: [DONE]\n\n")
            return
        records, tail, until_reached = reading.result()
        if records:  # room for the batch's answer (the budgets of the HTTP stack)
            await request.reserve_output(batch_bytes(records))
        timestamp = None
        position = await batch_tail(app, stream, records, tail)
        if records:
            start = records[-1].offset + 1
            size = sum(metered_bytes(wire_headers(r), r.value) for r in records)
            sent_count += len(records)
            sent_bytes += size
            deadline = None  # a delivered batch renews the wait
            if sse:
                document = json_read_batch(wire(records), position, base64_format)
                event = (
                    b"event: batch\ndata: "
                    + json.dumps(document, separators=(",", ":")).encode()
                    + f"\nid: {start - 1},{sent_count},{sent_bytes}\n\n".encode()
                )
                await request.write(event)
            else:
                batch = encode_read_batch(wire(records), position)
                await request.write(encode_frame(batch, coding))
            if remaining_count is not None:
                remaining_count -= len(records)
            if remaining_bytes is not None:
                remaining_bytes -= size
            if (remaining_count is not None and remaining_count <= 0) or (
                remaining_bytes is not None and remaining_bytes <= 0
            ):
                break
        else:
            start = tail if start is None or start < tail else start
            if until_reached or not follows:
                break
            if params.wait is not None and deadline is not None and loop.time() >= deadline:
                break
            if sse:
                ping = json.dumps({"timestamp": app.now_ms()}).encode()
                await request.write(b"event: ping\ndata: " + ping + b"\n\n")
            else:
                await request.write(encode_frame(encode_read_batch([], position)))
        if until_reached:
            break
        if not follows and start is not None and start >= tail:
            break
    if sse:
        await request.write(b"event: done\ndata: [DONE]\n\n")


def resume_after(params: ReadParams, last_event_id: str | None) -> ReadParams:
    """``params`` of an SSE read resumed after ``Last-Event-ID`` (S2's ``apply_last_event_id``):
    ``<seq_num>,<count>,<bytes>`` of the last batch delivered; 400 ``bad_header`` when it is
    not of that form."""
    if last_event_id is None:
        return params
    parts = last_event_id.strip().split(",")
    try:
        if len(parts) != 3:
            raise InvalidArgument("three numbers")
        seq_num, count, size = (parse_int_text(part.strip(), "last-event-id") for part in parts)
    except InvalidArgument:
        raise S2Error(
            400, "bad_header", "last-event-id is <seq_num>,<count>,<bytes> of an SSE event"
        ) from None
    return dataclasses.replace(
        params,
        seq_num=seq_num + 1,
        timestamp=None,
        tail_offset=None,
        count=None if params.count is None else max(params.count - count, 0),
        bytes=None if params.bytes is None else max(params.bytes - size, 0),
    )


def may_follow(params: ReadParams) -> bool:
    """Whether a read session waits at the tail for new records (S2's ``may_follow``): when it
    has no bound (count, bytes, until) or a ``wait`` above 0."""
    unbounded = params.count is None and params.bytes is None and params.until is None
    return unbounded or (params.wait or 0) > 0


# -- append sessions ----------------------------------------------------------------------------


async def append_session(app: S2Context, request: Request, basin: str, name: str) -> None:
    coding = answer_coding(request.header("accept-encoding"))
    stream = await app.open_for(basin, name, "create_stream_on_append")
    encryption = await app.encryption_for(request, stream)
    await request.start(200, _S2S)
    frames = FrameReader(max_message_bytes=min(app.max_body_bytes, (1 << 24) - 1))
    acks: asyncio.Queue[asyncio.Future[Any] | None] = asyncio.Queue(MAX_PIPELINED_INPUTS)

    async def send_acks() -> None:
        while True:
            appended = await acks.get()
            if appended is None:
                return
            start, end, tail = await appended
            await request.write(encode_frame(encode_append_ack(start, end, tail), coding))

    sender = asyncio.ensure_future(send_acks())
    stopping = asyncio.ensure_future(app.stopping.wait())
    submitted: list[asyncio.Future[Any]] = []
    try:
        barrier: asyncio.Future[Any] | None = None
        while True:
            chunk_read = asyncio.ensure_future(request.chunk())
            if not await _first(chunk_read, sender, stopping):
                chunk_read.cancel()
                break
            chunk = chunk_read.result()
            if chunk is None:
                break
            for body in frames.feed(chunk):
                parsed = decode_append_input(body)
                if barrier is not None:
                    await asyncio.wait({barrier})
                    barrier = None
                appended = asyncio.ensure_future(append_positions(app, stream, parsed, encryption))
                appended.add_done_callback(_retrieve)
                submitted.append(appended)
                if any(any(not n for n, _ in r.headers) for r in parsed.records):
                    barrier = appended
                await acks.put(appended)
            if sender.done():
                break
            submitted = [task for task in submitted if not task.done()]
        if frames.pending and not sender.done() and not stopping.done():
            raise S2Error(400, "bad_frame", "the session ended inside an S2S message")
        if not sender.done():
            await acks.put(None)
        await sender
    except Exception as error:
        s2_error = _as_s2(error)
        if s2_error.status >= 500:
            log.warning("an append session failed", exc_info=error)
        with suppress(Exception):
            await request.write(encode_terminal(s2_error.status, s2_error.encoded()))
        # Let the client's last frames arrive before the answer ends (see S2App.answer_error).
        await request.drain()
    finally:
        stopping.cancel()
        if not sender.done():
            sender.cancel()
        # Appends already handed to the engine finish on their own (their outcome is unknown
        # to the client, which treats the session's tail as ambiguous).
        submitted.clear()
        with suppress(Exception):
            await request.finish()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
