"""Appends through the S2 API (unary, the hot path and sessions): S2's rules on top of the
engine's append.

 1 to 1000 records of at most 1 MiB metered bytes (S2's measure: 8 bytes per record,
2 per header, plus the bytes of names, values and body). ``match_seq_num`` is walstream's
``match_tail`` (412 ``seq_num_mismatch`` with the tail). ``fencing_token`` must equal the token
last set by a ``fence`` command (S2's token starts as ``""``, which is walstream's "no token"),
else 412 ``fencing_token_mismatch`` with the current token. Command records (exactly one header,
with an empty name): ``fence`` (the body, at most 36 bytes of UTF-8, becomes the token once the
batch is durable; appends that arrive meanwhile wait for it, so none checked against the old
token lands after the fence record) and ``trim`` (the body, an 8-byte big-endian sequence number, becomes the
first readable record once the batch is durable; clamped to the tail). Command records are
stored like any record. Timestamps are the engine's: by the stream's timestamping mode
(:mod:`walstream.stream_config`; S2's ``client-prefer`` caps a client timestamp at the arrival
time unless ``uncapped``, ``client-require`` refuses a record without one with 422 ``invalid``,
``arrival`` ignores them), never decreasing. On a stream with a cipher
every record of the append (command records too) is sealed with the request's key by the
engine (:mod:`walstream.encryption`).
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from walstream.errors import FencedError, TailMismatchError
from walstream.records import MAX_I64, Record
from walstream.server.s2.errors import S2Error
from walstream.server.s2.model import (
    KEY_HEADER,
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    MAX_FENCING_TOKEN_BYTES,
    metered_bytes,
)
from walstream.server.s2.wire import AppendRequest, position_json

if TYPE_CHECKING:
    from walstream.encryption import EncryptionKey
    from walstream.engine.client import Stream
    from walstream.server.s2.context import S2Context

__all__ = ["append_once", "append_positions"]


@dataclass(frozen=True, slots=True)
class _Prepared:
    records: list[Record]
    fence: str | None
    """The token a ``fence`` command sets (``""`` clears it), None without one."""
    trim: int | None


def _prepare(request: AppendRequest) -> _Prepared:
    """S2's own rules on an append (the engine checks its own, once: ``check_append_input``,
    and stamps the records by the stream's timestamping mode)."""
    count = len(request.records)
    if not 1 <= count <= MAX_BATCH_RECORDS:
        raise S2Error(
            422, "invalid", f"an append takes 1 to {MAX_BATCH_RECORDS} records, got {count}"
        )
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
                fence = _fence_token(s2_record.body, f"records[{index}]: a fencing token")
            elif command == b"trim":
                if len(s2_record.body) != 8:
                    raise S2Error(
                        422, "invalid", f"records[{index}]: a trim command's body is 8 bytes"
                    )
                point = struct.unpack(">Q", s2_record.body)[0]
                trim = point if trim is None else max(trim, point)
            else:
                raise S2Error(422, "invalid", f"records[{index}]: unknown command {command[:40]!r}")
        records.append(_record(s2_record.headers, s2_record.body, s2_record.timestamp))
    if size > MAX_BATCH_BYTES:
        raise S2Error(
            422,
            "invalid",
            f"a batch has at most {MAX_BATCH_BYTES} metered bytes (1 MiB), got {size} bytes",
        )
    return _Prepared(records, fence, trim)


def _fence_token(token: bytes, what: str) -> str:
    """A fencing token as S2 takes it: UTF-8 of at most :data:`MAX_FENCING_TOKEN_BYTES` bytes."""
    if len(token) > MAX_FENCING_TOKEN_BYTES:
        raise S2Error(422, "invalid", f"{what} has at most {MAX_FENCING_TOKEN_BYTES} bytes")
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        raise S2Error(422, "invalid", f"{what} is UTF-8") from None


def _record(
    headers: tuple[tuple[bytes, bytes], ...], body: bytes, timestamp: int | None
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
    stamped = None if timestamp is None else min(timestamp, MAX_I64)
    return Record(body, key, tuple(pairs), stamped)


async def append_once(
    app: S2Context,
    stream: Stream,
    request: AppendRequest,
    encryption: EncryptionKey | None = None,
) -> dict[str, Any]:
    """Append one ``AppendInput``; its ``AppendAck`` as JSON."""
    start, end, tail = await append_positions(app, stream, request, encryption)
    return {
        "start": position_json(*start),
        "end": position_json(*end),
        "tail": position_json(*tail),
    }


async def append_positions(
    app: S2Context,
    stream: Stream,
    request: AppendRequest,
    encryption: EncryptionKey | None = None,
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    prepared = _prepare(request)
    wanted = request.fencing_token
    if wanted:
        _fence_token(wanted.encode("utf-8", "surrogatepass"), "fencing_token")
    engine_token = wanted or None
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
                prepared.records,
                match_tail=request.match_seq_num,
                fencing_token=engine_token,
                encryption=encryption,
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
