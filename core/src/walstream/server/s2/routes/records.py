"""``/v1/streams/{stream}/records``: append and read, unary or as sessions
(:mod:`walstream.server.s2.routes.sessions`), and ``.../records/tail``: check tail."""

from __future__ import annotations

from typing import TYPE_CHECKING

from walstream.server.s2.appends import append_once, append_positions
from walstream.server.s2.errors import S2Error
from walstream.server.s2.model import MAX_BATCH_BYTES, MAX_BATCH_RECORDS
from walstream.server.s2.reads import (
    batch_bytes,
    batch_tail,
    long_poll,
    parse_read_params,
    protobuf_answer,
    read_once,
    reads_nothing,
    resolve_start,
    tail_timestamp,
    wants_base64,
    wire,
)
from walstream.server.s2.routes.sessions import append_session, read_session
from walstream.server.s2.wire import (
    PROTOBUF_TYPES,
    S2S,
    append_input,
    encode_append_ack,
    encode_read_batch,
    json_read_batch,
    media_type,
    position_json,
)

if TYPE_CHECKING:
    from walstream.records import SequencedRecord
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = ["check_tail", "records_route"]


async def records_route(app: S2Context, request: Request, basin: str, name: str) -> None:
    if request.method == "POST":
        return await _append_route(app, request, basin, name)
    if request.method == "GET":
        return await _read_route(app, request, basin, name)
    raise S2Error(405, "bad_path", f"method {request.method} is not allowed on records")


async def _append_route(app: S2Context, request: Request, basin: str, name: str) -> None:
    content_type = media_type(request.header("content-type"))
    if content_type == S2S:
        return await append_session(app, request, basin, name)
    body = await request.body()
    stream = await app.open_for(basin, name, "create_stream_on_append")
    encryption = await app.encryption_for(request, stream)
    # The body's form follows Content-Type, the answer's form follows Accept (as S2's own server).
    parsed = append_input(body, content_type in PROTOBUF_TYPES, wants_base64(request))
    answer_type = protobuf_answer(request)
    if answer_type is None:
        return await request.respond_json(200, await append_once(app, stream, parsed, encryption))
    start, end, tail = await append_positions(app, stream, parsed, encryption)
    await request.respond(200, encode_append_ack(start, end, tail), answer_type)


async def _read_route(app: S2Context, request: Request, basin: str, name: str) -> None:
    params = parse_read_params(request.query)
    accept = (request.header("accept") or "").lower()
    content_type = (request.header("content-type") or "").lower()
    if content_type.startswith(S2S) or "text/event-stream" in accept:
        return await read_session(app, request, basin, name, params, sse=S2S not in content_type)
    wants_base64(request)  # a bad s2-format is refused before the stream is looked up
    stream = await app.open_for(basin, name, "create_stream_on_read")
    encryption = await app.encryption_for(request, stream)
    wait = min(params.wait or 0, app.max_wait_s)
    start, timestamp = await resolve_start(app, stream, params, may_follow=wait > 0)
    if reads_nothing(params):
        # S2: a limit of zero records reads an empty batch, without a tail.
        return await _respond_batch(request, [], None)
    count = min(params.count or MAX_BATCH_RECORDS, MAX_BATCH_RECORDS)
    byte_limit = min(params.bytes or MAX_BATCH_BYTES, MAX_BATCH_BYTES)
    records: list[SequencedRecord]
    if wait > 0:
        records, tail = await long_poll(
            app,
            request,
            stream,
            start,
            timestamp,
            count,
            byte_limit,
            params.until,
            wait,
            encryption,
        )
        # Room for its answer once records came (a wait holds no output budget).
        await request.reserve_output(batch_bytes(records))
    else:
        # Room for the answer before the read: it builds no more than the budgets allow.
        await request.reserve_output(byte_limit)
        records, tail, _ = await read_once(
            stream, start, timestamp, count, byte_limit, params.until, 0, encryption
        )
    position = await batch_tail(app, stream, records, tail)
    await _respond_batch(request, records, position)


async def _respond_batch(
    request: Request, records: list[SequencedRecord], position: tuple[int, int] | None
) -> None:
    answer_type = protobuf_answer(request)
    if answer_type is not None:
        return await request.respond(200, encode_read_batch(wire(records), position), answer_type)
    await request.respond_json(200, json_read_batch(wire(records), position, wants_base64(request)))


async def check_tail(app: S2Context, request: Request, basin: str, name: str) -> None:
    stream = await app.open_for(basin, name, "create_stream_on_read")
    tail = await stream.check_tail()
    timestamp = await tail_timestamp(app, stream, tail)
    await request.respond_json(200, {"tail": position_json(tail, timestamp)})
