"""The wire forms of the HTTP service: request parsing, the JSON and binary encodings of records,
streams and errors, and the error -> HTTP status mapping (the routes are in
:mod:`walstream.server.app`, the forms are described in :mod:`walstream.server`).

Every parser here checks its input completely and raises :class:`InvalidArgument` with a message
naming the field, so nothing unchecked reaches the engine and bad input never gets a 5xx.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    DataLossError,
    FencedError,
    InvalidArgument,
    NotFound,
    OutOfRangeError,
    PreconditionFailed,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
    Throttled,
    WalstreamError,
)
from walstream.records import (
    MAX_HEADER_COUNT,
    MAX_HEADER_NAME_BYTES,
    MAX_I64,
    MIN_I64,
    Record,
    SequencedRecord,
    check_int,
    check_optional_text,
    check_text,
    describe,
    parse_int_text,
    parse_stream_ref,
)

if TYPE_CHECKING:
    from walstream.metadata.contract import StreamInfo

__all__ = [
    "DEFAULT_READ_LIMIT_BYTES",
    "DEFAULT_READ_LIMIT_RECORDS",
    "FENCING_TOKEN_HEADER",
    "KEY_HEADER",
    "MATCH_TAIL_HEADER",
    "MAX_JSON_CONTAINERS",
    "MAX_READ_LIMIT_BYTES",
    "MAX_READ_LIMIT_RECORDS",
    "TIMESTAMP_HEADER",
    "AppendRequest",
    "BodyTimeout",
    "ReadRequest",
    "canned_response",
    "error_json",
    "error_status",
    "http_error_json",
    "int_field",
    "internal_error_json",
    "json_body",
    "optional_str",
    "parse_append",
    "parse_read",
    "read_body",
    "record_json",
    "refusal_json",
    "stream_info_json",
    "stream_ref",
]

KEY_HEADER = "X-Walstream-Key"
TIMESTAMP_HEADER = "X-Walstream-Timestamp-Ms"
MATCH_TAIL_HEADER = "X-Walstream-Match-Tail"
FENCING_TOKEN_HEADER = "X-Walstream-Fencing-Token"

DEFAULT_READ_LIMIT_RECORDS = 1000
DEFAULT_READ_LIMIT_BYTES = 1 << 20
#: Bounds of one read response, whatever the request asks for.
MAX_READ_LIMIT_RECORDS = 100_000
MAX_READ_LIMIT_BYTES = 64 << 20

#: Most JSON objects and arrays one request body may open. Parsed JSON takes ~50-100 times the
#: memory of its text when it is all tiny containers ("[{},{},...]"); this bounds what one request
#: can make the server allocate, whatever max_body_bytes is.
MAX_JSON_CONTAINERS = 1_000_000

# -- errors -------------------------------------------------------------------------------------

# Most specific first: the first class an error is an instance of decides its status.
_ERROR_STATUS: tuple[tuple[type[WalstreamError], int], ...] = (
    (StreamNotFound, 404),
    (NotFound, 404),
    (StreamExists, 409),
    (FencedError, 409),
    (TailMismatchError, 412),
    (PreconditionFailed, 412),
    (OutOfRangeError, 416),
    (DataLossError, 410),
    (InvalidArgument, 400),
    (ConfigError, 400),
    (CapacityError, 429),
    (Throttled, 503),
    (BackendUnavailable, 503),
    (AmbiguousError, 504),
    (CorruptionError, 500),
)


def error_status(error: WalstreamError) -> int:
    """The HTTP status an engine error is answered with (500 for anything unlisted)."""
    for error_type, status in _ERROR_STATUS:
        if isinstance(error, error_type):
            return status
    return 500


def error_json(error: WalstreamError) -> dict[str, Any]:
    """The JSON body of an engine error: its class name, message, ``definitely_not_applied``
    and the fields a caller acts on (the tail it missed, the range it lost)."""
    body: dict[str, Any] = {
        "error": type(error).__name__,
        "message": str(error) or type(error).__name__,
        "definitely_not_applied": error.definitely_not_applied,
    }
    if isinstance(error, TailMismatchError):
        body["actual_tail"] = error.actual_tail
    if isinstance(error, OutOfRangeError):
        body["start_offset"] = error.start_offset
        body["tail"] = error.tail
    if isinstance(error, DataLossError):
        body["stream_id"] = error.stream_id
        body["start_offset"] = error.start_offset
        body["end_offset"] = error.end_offset
    return body


def refusal_json(error: str, message: str) -> dict[str, Any]:
    """The JSON body of a request refused before it reached the engine: nothing happened."""
    return {"error": error, "message": message, "definitely_not_applied": True}


def internal_error_json() -> dict[str, Any]:
    """The JSON body of an unexpected failure (a bug): no traceback, and the caller is told the
    operation may have happened."""
    return {
        "error": "InternalError",
        "message": "the server failed unexpectedly (a bug, logged on the server); "
        "the operation may or may not have happened, read back before retrying",
        "definitely_not_applied": False,
    }


class BodyTimeout(web.HTTPRequestTimeout):
    """The request body did not arrive within ``body_timeout``."""


def http_error_json(
    request: web.Request, error: web.HTTPException, max_body_bytes: int
) -> dict[str, Any]:
    """The JSON body of an error aiohttp raised (no route, method not allowed, body too large,
    body timeout), with a message that says what to do."""
    name = (
        "RequestTimeout"
        if isinstance(error, BodyTimeout)
        else type(error).__name__.removeprefix("HTTP")
    )
    if isinstance(error, web.HTTPNotFound):
        message = (
            f"no route {request.method} {request.path}; the routes are /health, "
            "/metrics and /v1/streams[/{name}[/records|/trim|/tail|/fencing-token]]"
        )
    elif isinstance(error, web.HTTPMethodNotAllowed):
        message = (
            f"{request.method} is not allowed on {request.path}; allowed: "
            f"{', '.join(sorted(error.allowed_methods))}"
        )
    elif isinstance(error, web.HTTPRequestEntityTooLarge):
        message = (
            f"the request body is larger than this server accepts "
            f"({max_body_bytes} bytes; serve --max-body-bytes); "
            "split the batch"
        )
    else:
        message = error.text or error.reason
    # aiohttp answers these before any handler ran: nothing happened.
    return refusal_json(name, message)


def canned_response(status: int, reason: str, body: dict[str, Any]) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for answers given before aiohttp
    parsed any request (over the connection bound, no request head in time)."""
    payload = json.dumps(body).encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n"
        "Retry-After: 1\r\n\r\n"
    )
    return head.encode("ascii") + payload


# -- values -------------------------------------------------------------------------------------


def _b64(text: Any, field: str) -> bytes:
    if not isinstance(text, str):
        raise InvalidArgument(f"{field}: expected a base64 string, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(
            f"{field}: not valid base64 (standard alphabet with padding); "
            f"send UTF-8 text as value_text instead"
        ) from None


def _b64_text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def int_field(value: Any, field: str, minimum: int = 0) -> int:
    """A JSON integer within 64 bits (``minimum`` to 2**63-1)."""
    return check_int(value, field, minimum, MAX_I64)


def optional_str(value: Any, field: str) -> str | None:
    """A JSON string of valid text, or null (None)."""
    if value is None or isinstance(value, str):
        return check_optional_text(value, field)
    raise InvalidArgument(f"{field}: expected a string or null, got {describe(value)}")


def stream_ref(request: web.Request) -> str | int:
    """The stream of ``{name}``: ``#N`` or ``N`` (digits) is the stream with id N, anything
    else a name (:func:`walstream.records.parse_stream_ref`)."""
    return parse_stream_ref(request.match_info["name"])


# -- records ------------------------------------------------------------------------------------


def _parse_headers(raw: Any, field: str) -> tuple[tuple[str, bytes], ...]:
    if raw is None:
        return ()
    pairs: list[tuple[Any, Any]]
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in raw):
        pairs = [(pair[0], pair[1]) for pair in raw]
    else:
        raise InvalidArgument(
            f"{field}: expected an object {{name: base64}} or a list of [name, base64] pairs"
        )
    if len(pairs) > MAX_HEADER_COUNT:
        raise InvalidArgument(
            f"{field}: at most {MAX_HEADER_COUNT} headers per record, got {len(pairs)}"
        )
    headers = []
    for index, (name, value) in enumerate(pairs):
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"{field}[{index}]: header names must be non-empty strings")
        check_text(name, f"{field}[{index}] name", MAX_HEADER_NAME_BYTES)
        label = name if len(name) <= 60 else f"[{index}]"
        headers.append((name, _b64(value, f"{field}.{label}")))
    return tuple(headers)


_RECORD_FIELDS = frozenset({"value", "value_text", "key", "headers", "timestamp_ms"})


def _parse_record(raw: Any, field: str) -> Record:
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{field}: expected an object with value or value_text")
    unknown = sorted(set(raw) - _RECORD_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"{field}: unknown field(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(sorted(_RECORD_FIELDS))}"
        )
    if ("value" in raw) == ("value_text" in raw):
        raise InvalidArgument(f"{field}: give exactly one of value (base64) and value_text")
    if "value" in raw:
        value = _b64(raw["value"], f"{field}.value")
    else:
        value = check_text(raw["value_text"], f"{field}.value_text").encode("utf-8")
    key = None if raw.get("key") is None else _b64(raw["key"], f"{field}.key")
    timestamp = raw.get("timestamp_ms")
    timestamp_ms = None if timestamp is None else int_field(timestamp, f"{field}.timestamp_ms")
    return Record(
        value,
        key=key,
        headers=_parse_headers(raw.get("headers"), f"{field}.headers"),
        timestamp_ms=timestamp_ms,
    )


def record_json(record: SequencedRecord) -> dict[str, Any]:
    """One record of a read answer; bytes as standard base64, headers as ``[name, b64]``."""
    return {
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": None if record.key is None else _b64_text(record.key),
        "value": _b64_text(record.value),
        "headers": [[name, _b64_text(value)] for name, value in record.headers],
    }


def stream_info_json(info: StreamInfo) -> dict[str, Any]:
    """One stream of the ``GET /v1/streams`` answer."""
    return {
        "stream_id": info.stream_id,
        "name": info.name,
        "start_offset": info.start_offset,
        "committed_end": info.committed_end,
        "epoch": info.epoch,
        "owner_node_id": info.owner_node_id,
    }


# -- request bodies -----------------------------------------------------------------------------


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or 408 when it does not arrive within ``timeout_s`` (a slow sender
    holds a connection and a handler; it must not hold them forever)."""
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except TimeoutError:
        raise BodyTimeout(
            text=f"the request body did not arrive within {timeout_s:g} s "
            "(server.body_timeout); send it faster or raise the bound"
        ) from None


async def json_body(request: web.Request, timeout_s: float) -> Any:
    """The parsed JSON body (read within ``timeout_s``); :class:`InvalidArgument` when it is
    missing, not JSON, nested too deeply or holds more than :data:`MAX_JSON_CONTAINERS`."""
    data = await read_body(request, timeout_s)
    if not data:
        raise InvalidArgument("the request needs a JSON body")
    # Counted on the raw bytes (fast): brackets inside strings count too, so a body of many
    # bracket characters in value_text is refused as well; send such values base64 as value.
    if data.count(b"{") + data.count(b"[") > MAX_JSON_CONTAINERS:
        raise InvalidArgument(
            f"the request body holds more than {MAX_JSON_CONTAINERS} JSON objects and arrays; "
            "split the batch (or send values with many brackets base64-encoded as value)"
        )
    try:
        return json.loads(data)
    except RecursionError:
        # The parser recurses per nesting level and stops at the interpreter's recursion limit.
        raise InvalidArgument(
            "the request body nests JSON too deeply; a request needs at most 4 levels"
        ) from None
    except (UnicodeDecodeError, ValueError) as error:
        # ValueError also covers integers of more digits than Python converts.
        raise InvalidArgument(f"the request body is not valid JSON: {error}") from None


@dataclass(frozen=True)
class AppendRequest:
    """A checked append: the records and the conditions they are appended under."""

    records: list[Record]
    match_tail: int | None
    fencing_token: str | None


def _parse_append_json(body: Any) -> AppendRequest:
    if not isinstance(body, dict):
        raise InvalidArgument('expected a JSON object {"records": [...]}')
    unknown = sorted(set(body) - {"records", "match_tail", "fencing_token"})
    if unknown:
        raise InvalidArgument(
            f"unknown field(s) {', '.join(unknown)}; accepted: records, match_tail, fencing_token"
        )
    raw_records = body.get("records")
    if not isinstance(raw_records, list) or not raw_records:
        raise InvalidArgument("records: expected a non-empty list of records")
    records = [_parse_record(raw, f"records[{index}]") for index, raw in enumerate(raw_records)]
    match_tail = body.get("match_tail")
    return AppendRequest(
        records,
        None if match_tail is None else int_field(match_tail, "match_tail"),
        optional_str(body.get("fencing_token"), "fencing_token"),
    )


def _header_int(request: web.Request, name: str) -> int | None:
    text = request.headers.get(name)
    if text is None:
        return None
    return parse_int_text(text.strip(), f"header {name}")


async def _parse_append_binary(request: web.Request, body_timeout_s: float) -> AppendRequest:
    value = await read_body(request, body_timeout_s)
    key_text = request.headers.get(KEY_HEADER)
    key = None if key_text is None else _b64(key_text, f"header {KEY_HEADER}")
    record = Record(value, key=key, timestamp_ms=_header_int(request, TIMESTAMP_HEADER))
    return AppendRequest(
        [record],
        _header_int(request, MATCH_TAIL_HEADER),
        request.headers.get(FENCING_TOKEN_HEADER),
    )


async def parse_append(request: web.Request, body_timeout_s: float) -> AppendRequest:
    """The append of a request: one record per ``application/octet-stream`` body (its options
    in ``X-Walstream-*`` headers), else a JSON batch."""
    if request.content_type == "application/octet-stream":
        return await _parse_append_binary(request, body_timeout_s)
    return _parse_append_json(await json_body(request, body_timeout_s))


# -- read queries -------------------------------------------------------------------------------


def _query_int(request: web.Request, name: str, minimum: int = 0) -> int | None:
    text = request.query.get(name)
    if text is None or text == "":
        return None
    return parse_int_text(text, f"query parameter {name}", minimum)


def _query_seconds(request: web.Request, name: str) -> float:
    text = request.query.get(name)
    if text is None or text == "":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(
            f"query parameter {name}: expected seconds (a number), got {describe(text)}"
        ) from None
    if not value >= 0:  # also rejects NaN
        raise InvalidArgument(f"query parameter {name}: must be at least 0, got {describe(text)}")
    return value


@dataclass(frozen=True)
class ReadRequest:
    """A checked read: exactly one of ``start``, ``from_timestamp`` and ``tail_offset``, the
    bounds of the answer (capped) and the long-poll wait (0: answer at once)."""

    start: int | None
    from_timestamp: int | None
    tail_offset: int | None
    limit: int
    limit_bytes: int
    wait: float


def parse_read(request: web.Request, max_wait_s: float) -> ReadRequest:
    """The read of a ``GET .../records`` query; ``wait`` is capped at ``max_wait_s``."""
    start = _query_int(request, "start")
    from_timestamp = _query_int(request, "from_timestamp", minimum=MIN_I64)
    tail_offset = _query_int(request, "tail_offset")
    if sum(value is not None for value in (start, from_timestamp, tail_offset)) != 1:
        raise InvalidArgument(
            "give exactly one of the query parameters start=OFFSET, from_timestamp=MS, "
            "tail_offset=N"
        )
    limit = min(
        _query_int(request, "limit", minimum=1) or DEFAULT_READ_LIMIT_RECORDS,
        MAX_READ_LIMIT_RECORDS,
    )
    limit_bytes = min(
        _query_int(request, "limit_bytes", minimum=1) or DEFAULT_READ_LIMIT_BYTES,
        MAX_READ_LIMIT_BYTES,
    )
    wait = min(_query_seconds(request, "wait"), max_wait_s)
    return ReadRequest(start, from_timestamp, tail_offset, limit, limit_bytes, wait)
