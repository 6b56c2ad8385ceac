"""The HTTP service of one node: ``walstream serve -c deploy.yaml`` (DESIGN §11).

One process runs one node (``walstream.open(deployment)``) and serves it over HTTP with aiohttp
(the ``walstream[server]`` extra; nothing else in core imports aiohttp). It listens on
``server.listen`` of the deployment (default ``127.0.0.1:7400``). When a token is configured
(``server.token``, ``WALSTREAM_TOKEN`` or ``--token``) every route except ``/health`` requires
``Authorization: Bearer <token>``; a missing or wrong token gets ``401``.

Routes (bytes travel as standard base64 in JSON)::

    GET    /health                          {"status": "ok", "node_id", "node_epoch"}; 503 when
                                            the node failed or is stopping (no token needed)
    GET    /metrics                         Prometheus text (engine hooks + HTTP request counts)
    GET    /v1/streams[?prefix=P]           {"streams": [{"stream_id", "name", "start_offset",
                                            "committed_end", "epoch", "owner_node_id"}]}
    POST   /v1/streams                      {"name": "orders"} -> 201 {"stream_id", "name"}
    DELETE /v1/streams/{name}               {"deleted": name, "stream_id"}
    POST   /v1/streams/{name}/records       append, JSON or binary (below) -> {"start", "end",
                                            "tail"}
    GET    /v1/streams/{name}/records       read: exactly one of start=N, from_timestamp=MS,
                                            tail_offset=N; limit=N (records, default 1000),
                                            limit_bytes=N (default 1 MiB), wait=S (long poll:
                                            at the tail, wait up to S seconds for new records;
                                            capped at max_wait, 60 s by default)
                                            -> {"records": [{"offset", "timestamp_ms", "key",
                                            "value", "headers": [[name, b64], ...]}], "tail"}
    POST   /v1/streams/{name}/trim          {"start": N} -> {"start": N}
    GET    /v1/streams/{name}/tail          {"tail": N, "start_offset": N}
    POST   /v1/streams/{name}/fencing-token {"token": "t" | null}: later appends must carry it

``{name}`` is a stream name; ``%23N`` (``#N``) or ``N`` (digits) selects a stream by id (the
stream-name rule of :mod:`walstream.records` keeps the two apart). A JSON append body is::

    {"records": [{"value": "<b64>" | "value_text": "utf-8 text", "key": "<b64>",
                  "headers": {"name": "<b64>"} | [["name", "<b64>"], ...],
                  "timestamp_ms": 1700000000000}, ...],
     "match_tail": 42, "fencing_token": "t"}

The binary form appends one record per request: ``Content-Type: application/octet-stream``, the
body is the value, and optional headers ``X-Walstream-Key`` (base64), ``X-Walstream-Timestamp-Ms``,
``X-Walstream-Match-Tail`` and ``X-Walstream-Fencing-Token``.

Errors are JSON, ``{"error": "<ClassName>", "message": "...", "definitely_not_applied": bool}``
plus the fields of the error: StreamNotFound 404, StreamExists 409, FencedError 409,
TailMismatchError 412 (``actual_tail``), OutOfRangeError 416 (``start_offset``, ``tail``),
DataLossError 410 (``stream_id``, ``start_offset``, ``end_offset``),
InvalidArgument and ConfigError 400 (malformed JSON or base64 too), CapacityError 429,
BackendUnavailable 503, AmbiguousError 504, CorruptionError 500, a body over ``max_body_bytes``
413, a missing or wrong token 401, a head or body not complete in time 408, more connections
than ``max_connections`` 503 and more long polls than ``max_long_polls`` 429
(:class:`ServerLimits`). Every input is checked before it reaches the engine (out-of-range
numbers, invalid UTF-8, too-deep JSON, requests aiohttp cannot parse: 400), so bad input never
gets a 5xx; an unexpected exception is a bug and answers 500 ``InternalError`` without a traceback.

Shutdown (SIGTERM or SIGINT): stop accepting connections, answer waiting long polls with what
they have, then close the client, which uploads and commits everything acknowledged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
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
    check_stream_name,
    check_text,
    describe,
    parse_int_text,
    parse_stream_ref,
)
from walstream.server import live

if TYPE_CHECKING:
    from walstream.engine.node import Client, Stream

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_LISTEN",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_LONG_POLLS",
    "DEFAULT_MAX_WAIT_S",
    "RunningServer",
    "ServerLimits",
    "error_status",
    "limits_from_section",
    "make_app",
    "parse_listen",
    "run_until_signalled",
    "serve",
]

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:7400"
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_WAIT_S = 60.0
#: A connection must deliver a complete request head within this many seconds of opening (or of
#: its previous response, which also bounds an idle keep-alive connection); else it is closed.
DEFAULT_HEADER_TIMEOUT_S = 15.0
#: A request body must arrive completely within this many seconds of its head; else 408.
DEFAULT_BODY_TIMEOUT_S = 60.0
#: Connections open at once; one more is answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 512
#: Reads with ``wait > 0`` in progress at once; one more is answered 429.
DEFAULT_MAX_LONG_POLLS = 256
#: How long a request that was answered without reading its body may still send it.
LINGERING_S = 2.0
DEFAULT_READ_LIMIT_RECORDS = 1000
DEFAULT_READ_LIMIT_BYTES = 1 << 20
#: Bounds of one read response, whatever the request asks for.
MAX_READ_LIMIT_RECORDS = 100_000
MAX_READ_LIMIT_BYTES = 64 << 20
#: How long shutdown waits for requests still running after long polls were answered.
SHUTDOWN_GRACE_S = 10.0
TOKEN_ENVIRONMENT_VARIABLE = "WALSTREAM_TOKEN"

KEY_HEADER = "X-Walstream-Key"
TIMESTAMP_HEADER = "X-Walstream-Timestamp-Ms"
MATCH_TAIL_HEADER = "X-Walstream-Match-Tail"
FENCING_TOKEN_HEADER = "X-Walstream-Fencing-Token"
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

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


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:7400`` for IPv6) → (host, port); port 0 picks a free one."""
    host, separator, port = listen.rpartition(":")
    host = host.strip("[]")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"listen: expected host:port such as 127.0.0.1:7400 or [::1]:7400, got {listen!r}"
        )
    return host, int(port)


@dataclass(frozen=True)
class ServerLimits:
    """Bounds that keep a slow or greedy client from holding the node's connections, tasks and
    memory (the ``server:`` section of a deployment; README "HTTP service")."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """A connection that has not sent a complete request head this long after it opened (or
    after its previous response: the idle keep-alive bound too) is closed."""
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    """A request body not complete this long after its head gets 408 and the connection closes."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections open at once; one more is answered 503 ``BackendUnavailable`` and closed."""
    max_long_polls: int = DEFAULT_MAX_LONG_POLLS
    """Reads with ``wait > 0`` in progress at once; one more gets 429 ``CapacityError``."""

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name}: expected a positive number of seconds, got {value!r}")
        for name in ("max_connections", "max_long_polls"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: expected a positive integer, got {value!r}")


# -- request parsing ----------------------------------------------------------------------------


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


def _int_field(value: Any, field: str, minimum: int = 0) -> int:
    """A JSON integer within 64 bits (``minimum`` to 2**63-1)."""
    return check_int(value, field, minimum, MAX_I64)


def _optional_str(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return check_optional_text(value, field)
    raise InvalidArgument(f"{field}: expected a string or null, got {describe(value)}")


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
    timestamp_ms = None if timestamp is None else _int_field(timestamp, f"{field}.timestamp_ms")
    return Record(
        value,
        key=key,
        headers=_parse_headers(raw.get("headers"), f"{field}.headers"),
        timestamp_ms=timestamp_ms,
    )


@dataclass(frozen=True)
class _AppendRequest:
    records: list[Record]
    match_tail: int | None
    fencing_token: str | None


def _parse_append_json(body: Any) -> _AppendRequest:
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
    return _AppendRequest(
        records,
        None if match_tail is None else _int_field(match_tail, "match_tail"),
        _optional_str(body.get("fencing_token"), "fencing_token"),
    )


def _header_int(request: web.Request, name: str) -> int | None:
    text = request.headers.get(name)
    if text is None:
        return None
    return parse_int_text(text.strip(), f"header {name}")


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


class _BodyTimeout(web.HTTPRequestTimeout):
    """The request body did not arrive within ``body_timeout``."""


async def _read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or 408 when it does not arrive within ``timeout_s`` (a slow sender
    holds a connection and a handler; it must not hold them forever)."""
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except TimeoutError:
        raise _BodyTimeout(
            text=f"the request body did not arrive within {timeout_s:g} s "
            "(server.body_timeout); send it faster or raise the bound"
        ) from None


#: Most JSON objects and arrays one request body may open. Parsed JSON takes ~50-100 times the
#: memory of its text when it is all tiny containers ("[{},{},...]"); this bounds what one request
#: can make the server allocate, whatever max_body_bytes is.
MAX_JSON_CONTAINERS = 1_000_000


async def _json_body(request: web.Request, timeout_s: float) -> Any:
    data = await _read_body(request, timeout_s)
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


def _stream_ref(request: web.Request) -> str | int:
    """The stream of ``{name}``: ``#N`` or ``N`` (digits) is the stream with id N, anything
    else a name (:func:`walstream.records.parse_stream_ref`)."""
    return parse_stream_ref(request.match_info["name"])


# -- responses ----------------------------------------------------------------------------------


def _record_json(record: SequencedRecord) -> dict[str, Any]:
    return {
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": None if record.key is None else _b64_text(record.key),
        "value": _b64_text(record.value),
        "headers": [[name, _b64_text(value)] for name, value in record.headers],
    }


def _error_json(error: WalstreamError) -> dict[str, Any]:
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


def _http_error_json(
    request: web.Request, error: web.HTTPException, max_body_bytes: int
) -> dict[str, Any]:
    name = (
        "RequestTimeout"
        if isinstance(error, _BodyTimeout)
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
    return {"error": name, "message": message, "definitely_not_applied": True}


def _token_bytes(token: str) -> bytes:
    try:
        return check_text(token, "server.token").encode("utf-8")
    except InvalidArgument as error:
        raise ConfigError(f"{error}; set a token of valid UTF-8 text") from None


# -- the service --------------------------------------------------------------------------------


class _RequestCounts:
    """HTTP requests answered, by method, route and status (for /metrics)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, int], int] = {}

    def add(self, method: str, route: str, status: int) -> None:
        key = (method, route, status)
        self.counts[key] = self.counts.get(key, 0) + 1

    def render(self) -> str:
        lines = [
            "# HELP walstream_http_requests_total HTTP requests answered by walstream serve.",
            "# TYPE walstream_http_requests_total counter",
        ]
        for (method, route, status), count in sorted(self.counts.items()):
            route_label = route.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(
                f'walstream_http_requests_total{{method="{method}",route="{route_label}",'
                f'status="{status}"}} {count}'
            )
        return "\n".join(lines) + "\n"


class _Service:
    """The route handlers over one started client."""

    def __init__(
        self,
        client: Client,
        *,
        token: str | None,
        render_metrics: Callable[[], str] | None,
        max_body_bytes: int,
        max_wait_s: float,
        limits: ServerLimits,
    ) -> None:
        self.client = client
        self.max_body_bytes = max_body_bytes
        self.token = token or None
        self.token_bytes = b"" if self.token is None else _token_bytes(self.token)
        self.render_metrics = render_metrics
        self.max_wait_s = max_wait_s
        self.limits = limits
        self.long_polls = 0
        """Reads with ``wait > 0`` in progress (bounded by ``limits.max_long_polls``)."""
        self.stopping = asyncio.Event()
        self.requests = _RequestCounts()

    # -- middleware ---------------------------------------------------------------------------

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        response = await self._answer(request, handler)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "(unmatched)"
        self.requests.add(request.method, route, response.status)
        return response

    async def _answer(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        try:
            if self.token is not None and request.path != "/health":
                refusal = self._check_token(request)
                if refusal is not None:
                    return refusal
            return await handler(request)
        except WalstreamError as error:
            status = error_status(error)
            if status >= 500:
                log.warning(
                    "%s %s failed: %s: %s",
                    request.method,
                    request.path,
                    type(error).__name__,
                    error,
                )
            headers = {"Retry-After": "1"} if status in (429, 503) else None
            return web.json_response(_error_json(error), status=status, headers=headers)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            response = web.json_response(
                _http_error_json(request, error, self.max_body_bytes),
                status=error.status,
                headers=_kept_headers(error),
            )
            if isinstance(error, _BodyTimeout):
                # Part of the body may still be on its way: the connection cannot be reused.
                response.force_close()
            return response
        except Exception:
            # Every input is checked before it reaches the engine, so this is a bug: say so,
            # log the traceback, and never send the traceback to the caller.
            log.exception("%s %s failed unexpectedly", request.method, request.path)
            return web.json_response(
                {
                    "error": "InternalError",
                    "message": "the server failed unexpectedly (a bug, logged on the server); "
                    "the operation may or may not have happened, read back before retrying",
                    "definitely_not_applied": False,
                },
                status=500,
            )

    def _check_token(self, request: web.Request) -> web.Response | None:
        assert self.token is not None
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # aiohttp hands over undecodable header bytes as surrogate escapes: encode them back,
        # so a non-ASCII header is compared byte for byte (and refused) instead of failing.
        given_bytes = given.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() == "bearer" and hmac.compare_digest(given_bytes, self.token_bytes):
            return None
        message = (
            "wrong bearer token"
            if scheme.lower() == "bearer"
            else "this server needs a token: send the header 'Authorization: Bearer <token>'"
        )
        return web.json_response(
            {"error": "Unauthorized", "message": message, "definitely_not_applied": True},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="walstream"'},
        )

    # -- routes -------------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/metrics", self.metrics),
            web.get("/v1/streams", self.list_streams),
            web.post("/v1/streams", self.create_stream),
            web.delete("/v1/streams/{name}", self.delete_stream),
            web.post("/v1/streams/{name}/records", self.append),
            web.get("/v1/streams/{name}/records", self.read),
            web.post("/v1/streams/{name}/trim", self.trim),
            web.get("/v1/streams/{name}/tail", self.tail),
            web.post("/v1/streams/{name}/fencing-token", self.set_fencing_token),
        ]

    async def health(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {
            "status": "ok",
            "node_id": self.client.node_id,
            "node_epoch": self.client.node_epoch,
        }
        failure = self.client.failure
        if failure is not None:
            body.update(status="failed", error=type(failure).__name__, message=str(failure))
            return web.json_response(body, status=503)
        if self.stopping.is_set():
            body["status"] = "stopping"
            return web.json_response(body, status=503)
        return web.json_response(body)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.render_metrics is None:
            return web.json_response(
                {
                    "error": "NotFound",
                    "message": "metrics are disabled in this deployment (hooks.disable lists "
                    "'metrics'); remove it from hooks.disable to serve /metrics",
                },
                status=404,
            )
        text = self.render_metrics() + self.requests.render()
        response = web.Response(text=text)
        response.headers["Content-Type"] = PROMETHEUS_CONTENT_TYPE
        return response

    async def list_streams(self, request: web.Request) -> web.Response:
        prefix = check_text(request.query.get("prefix", ""), "query parameter prefix")
        infos = await self.client.list_streams(prefix=prefix)
        return web.json_response(
            {
                "streams": [
                    {
                        "stream_id": info.stream_id,
                        "name": info.name,
                        "start_offset": info.start_offset,
                        "committed_end": info.committed_end,
                        "epoch": info.epoch,
                        "owner_node_id": info.owner_node_id,
                    }
                    for info in infos
                ]
            }
        )

    async def create_stream(self, request: web.Request) -> web.Response:
        body = await _json_body(request, self.limits.body_timeout_s)
        if not isinstance(body, dict) or set(body) - {"name"}:
            raise InvalidArgument('expected a JSON object {"name": "<stream name>"}')
        stream = await self.client.create_stream(check_stream_name(body.get("name")))
        return web.json_response({"stream_id": stream.stream_id, "name": stream.name}, status=201)

    async def delete_stream(self, request: web.Request) -> web.Response:
        ref = _stream_ref(request)
        stream = await self.client.open_stream(ref)
        await self.client.delete_stream(stream.stream_id)
        return web.json_response({"deleted": stream.name, "stream_id": stream.stream_id})

    async def append(self, request: web.Request) -> web.Response:
        stream = await self.client.open_stream(_stream_ref(request))
        if request.content_type == "application/octet-stream":
            parsed = await self._binary_append(request)
        else:
            parsed = _parse_append_json(await _json_body(request, self.limits.body_timeout_s))
        ack = await stream.append(
            parsed.records, match_tail=parsed.match_tail, fencing_token=parsed.fencing_token
        )
        return web.json_response({"start": ack.start, "end": ack.end, "tail": ack.tail})

    async def _binary_append(self, request: web.Request) -> _AppendRequest:
        value = await _read_body(request, self.limits.body_timeout_s)
        key_text = request.headers.get(KEY_HEADER)
        key = None if key_text is None else _b64(key_text, f"header {KEY_HEADER}")
        record = Record(value, key=key, timestamp_ms=_header_int(request, TIMESTAMP_HEADER))
        return _AppendRequest(
            [record],
            _header_int(request, MATCH_TAIL_HEADER),
            request.headers.get(FENCING_TOKEN_HEADER),
        )

    async def read(self, request: web.Request) -> web.Response:
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
        wait = min(_query_seconds(request, "wait"), self.max_wait_s)
        stream = await self.client.open_stream(_stream_ref(request))
        if wait <= 0:
            return await self._read(
                stream, start, from_timestamp, tail_offset, limit, limit_bytes, 0
            )
        if self.long_polls >= self.limits.max_long_polls:
            # Each waiting read holds a connection and a task: bounded, so a crowd of pollers
            # cannot take the memory or the connections of the node.
            raise CapacityError(
                f"{self.long_polls} long polls are already waiting (server.max_long_polls); "
                "retry later, read without wait=, or raise the bound"
            )
        self.long_polls += 1
        try:
            return await self._read(
                stream, start, from_timestamp, tail_offset, limit, limit_bytes, wait
            )
        finally:
            self.long_polls -= 1

    async def _read(
        self,
        stream: Stream,
        start: int | None,
        from_timestamp: int | None,
        tail_offset: int | None,
        limit: int,
        limit_bytes: int,
        wait: float,
    ) -> web.Response:
        reading = asyncio.ensure_future(
            stream.read(
                start,
                from_timestamp=from_timestamp,
                tail_offset=tail_offset,
                limit_records=limit,
                limit_bytes=limit_bytes,
                wait=wait,
            )
        )
        if wait > 0 and not await self._unless_stopping(reading):
            # Shutting down: answer the long poll now, empty, so the caller re-polls elsewhere.
            return web.json_response({"records": [], "tail": await stream.check_tail()})
        result = await reading
        return web.json_response(
            {
                "records": [_record_json(record) for record in result.records],
                "tail": result.tail,
            }
        )

    async def _unless_stopping(self, work: asyncio.Future[Any]) -> bool:
        """Wait for ``work``, or cancel it when shutdown begins; True when it finished."""
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            done, _ = await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not work.done():
                work.cancel()
                with suppress(asyncio.CancelledError):
                    await work
        return work in done

    async def trim(self, request: web.Request) -> web.Response:
        body = await _json_body(request, self.limits.body_timeout_s)
        if not isinstance(body, dict) or "start" not in body or set(body) - {"start"}:
            raise InvalidArgument('expected a JSON object {"start": <new first offset>}')
        new_start = _int_field(body["start"], "start")
        stream = await self.client.open_stream(_stream_ref(request))
        await stream.trim(new_start)
        return web.json_response({"start": new_start})

    async def tail(self, request: web.Request) -> web.Response:
        stream = await self.client.open_stream(_stream_ref(request))
        tail = await stream.check_tail()
        return web.json_response({"tail": tail, "start_offset": await stream.start_offset()})

    async def set_fencing_token(self, request: web.Request) -> web.Response:
        body = await _json_body(request, self.limits.body_timeout_s)
        if not isinstance(body, dict) or set(body) != {"token"}:
            raise InvalidArgument('expected a JSON object {"token": "<token>" | null}')
        token = _optional_str(body["token"], "token")
        stream: Stream = await self.client.open_stream(_stream_ref(request))
        await stream.set_fencing_token(token)
        return web.json_response({"fencing_token_set": token is not None})


def _kept_headers(error: web.HTTPException) -> dict[str, str]:
    """Headers of an aiohttp error worth keeping on its JSON form (e.g. Allow on 405)."""
    return {name: value for name, value in error.headers.items() if name in ("Allow",)}


_SERVICE = web.AppKey("walstream_service", _Service)


def make_app(
    client: Client,
    *,
    token: str | None = None,
    render_metrics: Callable[[], str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    limits: ServerLimits | None = None,
) -> web.Application:
    """The aiohttp application serving ``client`` (already started; the caller closes it).

    ``token``: required bearer token (None: no authentication). ``render_metrics``: returns the
    engine's Prometheus text (None: /metrics answers 404). ``max_body_bytes``: larger request
    bodies get 413. ``max_wait_s``: bound of a long-poll read's ``wait``. ``limits``: the body
    timeout and the long-poll bound apply here; the header timeout and the connection bound
    need the listener of :func:`serve`.
    """
    service = _Service(
        client,
        token=token,
        render_metrics=render_metrics,
        max_body_bytes=max_body_bytes,
        max_wait_s=max_wait_s,
        limits=limits or ServerLimits(),
    )
    app = web.Application(middlewares=[service.middleware], client_max_size=max_body_bytes)
    app.add_routes(service.routes())
    app[_SERVICE] = service
    return app


def _begin_shutdown(app: web.Application) -> None:
    app[_SERVICE].stopping.set()


# -- connections --------------------------------------------------------------------------------

#: How long a refused connection may still send before it is closed (so the client reads the
#: 503 instead of a reset).
REFUSED_LINGER_S = 1.0


def _canned_response(status: int, reason: str, body: dict[str, Any]) -> bytes:
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


class _JsonErrorsHandler(web.RequestHandler):
    """aiohttp's connection handler, answering requests it cannot parse (a request line or
    header over its size bounds, bad framing) with the walstream error body instead of text."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            # A response is already on its way: the connection is broken, as aiohttp does.
            raise ConnectionError("the response was already started; cannot send an error")
        if status >= 500:
            log.error("failed handling a request: %s", exc, exc_info=exc)
            body = {
                "error": "InternalError",
                "message": "the server failed unexpectedly (a bug, logged on the server); the "
                "operation may or may not have happened, read back before retrying",
                "definitely_not_applied": False,
            }
        else:
            detail = " ".join(str(message or exc or "").split())[:300]
            log.info("refused a malformed HTTP request (%d): %s", status, detail)
            body = {
                "error": "InvalidArgument" if status == 400 else f"HTTP{status}",
                "message": f"malformed HTTP request: {detail}",
                "definitely_not_applied": True,
            }
        response = web.json_response(body, status=status)
        response.force_close()
        return response


class _ConnectionGuard:
    """The listener's protocol factory, in front of aiohttp's: it bounds the connections open at
    once and the time a new connection may take to send its first request head (aiohttp's
    keep-alive timeout, set to the same value, bounds the heads of later requests)."""

    def __init__(self, manager: web.Server, limits: ServerLimits) -> None:
        self.manager = manager
        self.limits = limits
        self.open = 0
        """Connections being served (refused ones are not counted)."""
        self.refused = 0
        self.timed_out = 0

    def __call__(self) -> asyncio.Protocol:
        return _GuardedConnection(self)

    def make_handler(self) -> asyncio.Protocol:
        # What web.Server() makes, with JSON error answers; aiohttp's keep-alive timeout
        # closes a connection whose next request head is not complete in time.
        return _JsonErrorsHandler(
            self.manager,
            loop=asyncio.get_running_loop(),
            keepalive_timeout=self.limits.header_timeout_s,
            lingering_time=LINGERING_S,
        )

    def refusal(self) -> bytes:
        return _canned_response(
            503,
            "Service Unavailable",
            {
                "error": "BackendUnavailable",
                "message": f"this server already has {self.open} connections open "
                "(server.max_connections); retry later or raise the bound",
                "definitely_not_applied": True,
            },
        )

    def head_timeout(self) -> bytes:
        return _canned_response(
            408,
            "Request Timeout",
            {
                "error": "RequestTimeout",
                "message": f"no complete request head within {self.limits.header_timeout_s:g} s "
                "(server.header_timeout); the connection is closed",
                "definitely_not_applied": True,
            },
        )


class _GuardedConnection(asyncio.Protocol):
    """One connection: refused over the bound, else handed to aiohttp's handler, and closed
    when its first request head does not arrive within ``header_timeout``."""

    def __init__(self, guard: _ConnectionGuard) -> None:
        self.guard = guard
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.recent = b""
        """The last bytes received while the first head is incomplete (its end may straddle
        two reads)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        guard = self.guard
        loop = asyncio.get_running_loop()
        if guard.open >= guard.limits.max_connections:
            guard.refused += 1
            transport.write(guard.refusal())
            if transport.can_write_eof():
                transport.write_eof()
            # Read and drop what the client still sends, so it sees the 503, not a reset.
            self.timer = loop.call_later(REFUSED_LINGER_S, transport.close)
            return
        guard.open += 1
        self.timer = loop.call_later(guard.limits.header_timeout_s, self._head_timed_out)
        self.inner = guard.make_handler()
        self.inner.connection_made(transport)

    def _head_timed_out(self) -> None:
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.guard.timed_out += 1
            self.transport.write(self.guard.head_timeout())
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return  # refused: dropped
        if self.timer is not None:
            window = self.recent + data
            if b"\r\n\r\n" in window or b"\n\n" in window:
                self.timer.cancel()
                self.timer = None
                self.recent = b""
            else:
                self.recent = window[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.inner is None:
            return None  # refused: close now
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.inner is not None:
            self.guard.open -= 1
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


# -- running a node -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningServer:
    """A node serving HTTP (yielded by :func:`serve`)."""

    client: Client
    host: str
    port: int
    token: str | None
    app: web.Application
    limits: ServerLimits = ServerLimits()
    guard: _ConnectionGuard | None = None
    """Counts of the listener: ``open``, ``refused`` and ``timed_out`` connections."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _choose_token(
    explicit: str | None, configured: str | None, environ: Mapping[str, str]
) -> str | None:
    """``--token`` wins, then ``WALSTREAM_TOKEN``, then ``server.token``; empty means none."""
    for candidate in (explicit, environ.get(TOKEN_ENVIRONMENT_VARIABLE), configured):
        if candidate:
            return candidate
    return None


@asynccontextmanager
async def serve(
    config: Any = None,
    *,
    listen: str | None = None,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    limits: ServerLimits | None = None,
    environ: Mapping[str, str] | None = None,
) -> AsyncIterator[RunningServer]:
    """Open the node of ``config`` (a deployment YAML path, mapping, Deployment, or None for
    the embedded default) and serve it over HTTP until the context exits; then stop accepting,
    answer long polls, and close the client (which uploads everything acknowledged).

    ``listen``, ``token`` and ``limits`` override the deployment's ``server`` section (port 0:
    any free port, see :attr:`RunningServer.port`).

    While serving, the process holds the node lock of the deployment (:mod:`walstream.server.live`)
    with its URL in it, so `walstream` commands on the same deployment use this server instead
    of taking the node over. Raises :class:`~walstream.server.live.NodeBusy` (a ConfigError) naming
    the running process when another live process already runs the node.
    """
    import walstream
    from walstream.config.host import find_host

    plugin_host = find_host("walstream serve reads its deployment through the plugin host")
    deployment = plugin_host.load_deployment(config)
    server_section = deployment.sections["server"]
    host, port = parse_listen(listen or server_section["listen"] or DEFAULT_LISTEN)
    chosen_limits = limits or limits_from_section(server_section)
    chosen_token = _choose_token(
        token, server_section.get("token"), os.environ if environ is None else environ
    )
    if chosen_token is None and host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "serving %s:%d without a token: anyone who reaches it can write and "
            "delete streams (set server.token or WALSTREAM_TOKEN)",
            host,
            port,
        )
    hooks = plugin_host.make_hooks(deployment.disabled_hooks)
    render_metrics = plugin_host.metrics_renderer(hooks)
    # The node lock is taken before the node is opened: a second server of the same node must
    # refuse before it registers a new epoch and fences the running one (NodeBusy, exit 2).
    path = live.lock_path(deployment)
    node_lock = (
        None if path is None else live.NodeLock.acquire(path, deployment.node_id, "walstream serve")
    )
    try:
        client = await walstream.open(deployment, hooks=hooks)
    except BaseException:
        if node_lock is not None:
            node_lock.release()
        raise
    runner: web.AppRunner | None = None
    listener: asyncio.Server | None = None
    try:
        app = make_app(
            client,
            token=chosen_token,
            render_metrics=render_metrics,
            max_body_bytes=max_body_bytes,
            max_wait_s=max_wait_s,
            limits=chosen_limits,
        )
        runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        assert runner.server is not None
        guard = _ConnectionGuard(runner.server, chosen_limits)
        listener = await asyncio.get_running_loop().create_server(guard, host, port)
        bound_port = int(listener.sockets[0].getsockname()[1])
        running = RunningServer(client, host, bound_port, chosen_token, app, chosen_limits, guard)
        if node_lock is not None:
            # Where `walstream` commands on this deployment send their writes and live reads.
            node_lock.record(node_id=deployment.node_id, command="walstream serve", url=running.url)
        yield running
    finally:
        try:
            if listener is not None:
                listener.close()  # stop accepting; open connections are shut down below
            if runner is not None:
                _begin_shutdown(runner.app)
                await runner.cleanup()
        finally:
            try:
                await client.close()
            finally:
                if node_lock is not None:
                    node_lock.release()


def limits_from_section(server_section: Mapping[str, Any]) -> ServerLimits:
    """The :class:`ServerLimits` of a deployment's ``server`` section (defaults for keys it
    does not set)."""

    def pick(key: str, default: Any) -> Any:
        value = server_section.get(key)
        return default if value is None else value

    return ServerLimits(
        header_timeout_s=pick("header_timeout", DEFAULT_HEADER_TIMEOUT_S),
        body_timeout_s=pick("body_timeout", DEFAULT_BODY_TIMEOUT_S),
        max_connections=pick("max_connections", DEFAULT_MAX_CONNECTIONS),
        max_long_polls=pick("max_long_polls", DEFAULT_MAX_LONG_POLLS),
    )


async def run_until_signalled(
    config: Any = None,
    *,
    listen: str | None = None,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    announce: Callable[[RunningServer], None] | None = None,
) -> None:
    """``walstream serve``: serve until SIGTERM or SIGINT, then shut down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for signal_number in signals:
        loop.add_signal_handler(signal_number, stop.set)
    try:
        async with serve(
            config,
            listen=listen,
            token=token,
            max_body_bytes=max_body_bytes,
            max_wait_s=max_wait_s,
        ) as server:
            if announce is not None:
                announce(server)
            await stop.wait()
            print(
                "walstream serve: stopping (closing the node uploads everything acknowledged)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        for signal_number in signals:
            loop.remove_signal_handler(signal_number)
