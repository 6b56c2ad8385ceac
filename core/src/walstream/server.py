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

``{name}`` is a stream name; ``%23N`` (``#N``) selects a stream by id. A JSON append body is::

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
InvalidArgument and ConfigError 400 (malformed JSON or base64 too), CapacityError 429,
BackendUnavailable 503, AmbiguousError 504, CorruptionError 500, a body over ``max_body_bytes``
413, a missing or wrong token 401.

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

from .errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
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
from .records import Record, SequencedRecord

if TYPE_CHECKING:
    from .client import Client, Stream

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_WAIT_S",
    "RunningServer",
    "error_status",
    "make_app",
    "parse_listen",
    "run_until_signalled",
    "serve",
]

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:7400"
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_WAIT_S = 60.0
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


def _int_field(value: Any, field: str, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{field}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{field}: must be at least {minimum}, got {value}")
    return value


def _optional_str(value: Any, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidArgument(f"{field}: expected a string or null, got {type(value).__name__}")


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
    headers = []
    for name, value in pairs:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"{field}: header names must be non-empty strings")
        headers.append((name, _b64(value, f"{field}.{name}")))
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
        text = raw["value_text"]
        if not isinstance(text, str):
            raise InvalidArgument(f"{field}.value_text: expected a string")
        value = text.encode("utf-8")
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
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"header {name}: expected an integer, got {text!r}") from None
    if value < 0:
        raise InvalidArgument(f"header {name}: must be at least 0, got {value}")
    return value


def _query_int(request: web.Request, name: str, minimum: int = 0) -> int | None:
    text = request.query.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(
            f"query parameter {name}: expected an integer, got {text!r}"
        ) from None
    if value < minimum:
        raise InvalidArgument(f"query parameter {name}: must be at least {minimum}, got {value}")
    return value


def _query_seconds(request: web.Request, name: str) -> float:
    text = request.query.get(name)
    if text is None or text == "":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(
            f"query parameter {name}: expected seconds (a number), got {text!r}"
        ) from None
    if not value >= 0:  # also rejects NaN
        raise InvalidArgument(f"query parameter {name}: must be at least 0, got {text!r}")
    return value


async def _json_body(request: web.Request) -> Any:
    data = await request.read()
    if not data:
        raise InvalidArgument("the request needs a JSON body")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidArgument(f"the request body is not valid JSON: {error}") from None


def _stream_ref(request: web.Request) -> str | int:
    """The stream of ``{name}``: a name, or ``#N`` for the stream with id N."""
    name = request.match_info["name"]
    if name.startswith("#") and name[1:].isdigit():
        return int(name[1:])
    return name


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
    return body


def _http_error_json(
    request: web.Request, error: web.HTTPException, max_body_bytes: int
) -> dict[str, Any]:
    name = type(error).__name__.removeprefix("HTTP")
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
    return {"error": name, "message": message}


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
    ) -> None:
        self.client = client
        self.max_body_bytes = max_body_bytes
        self.token = token or None
        self.render_metrics = render_metrics
        self.max_wait_s = max_wait_s
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
            return web.json_response(
                _http_error_json(request, error, self.max_body_bytes),
                status=error.status,
                headers=_kept_headers(error),
            )

    def _check_token(self, request: web.Request) -> web.Response | None:
        assert self.token is not None
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode("utf-8"), self.token.encode("utf-8")
        ):
            return None
        message = (
            "wrong bearer token"
            if scheme.lower() == "bearer"
            else "this server needs a token: send the header 'Authorization: Bearer <token>'"
        )
        return web.json_response(
            {"error": "Unauthorized", "message": message},
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
        infos = await self.client.list_streams(prefix=request.query.get("prefix", ""))
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
        body = await _json_body(request)
        if not isinstance(body, dict) or set(body) - {"name"}:
            raise InvalidArgument('expected a JSON object {"name": "<stream name>"}')
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgument(f"name: expected a non-empty string or null, got {name!r}")
        stream = await self.client.create_stream(name)
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
            parsed = _parse_append_json(await _json_body(request))
        ack = await stream.append(
            parsed.records, match_tail=parsed.match_tail, fencing_token=parsed.fencing_token
        )
        return web.json_response({"start": ack.start, "end": ack.end, "tail": ack.tail})

    async def _binary_append(self, request: web.Request) -> _AppendRequest:
        value = await request.read()
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
        from_timestamp = _query_int(request, "from_timestamp", minimum=-(2**63))
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
        body = await _json_body(request)
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
        body = await _json_body(request)
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
) -> web.Application:
    """The aiohttp application serving ``client`` (already started; the caller closes it).

    ``token``: required bearer token (None: no authentication). ``render_metrics``: returns the
    engine's Prometheus text (None: /metrics answers 404). ``max_body_bytes``: larger request
    bodies get 413. ``max_wait_s``: bound of a long-poll read's ``wait``.
    """
    service = _Service(
        client,
        token=token,
        render_metrics=render_metrics,
        max_body_bytes=max_body_bytes,
        max_wait_s=max_wait_s,
    )
    app = web.Application(middlewares=[service.middleware], client_max_size=max_body_bytes)
    app.add_routes(service.routes())
    app[_SERVICE] = service
    return app


def _begin_shutdown(app: web.Application) -> None:
    app[_SERVICE].stopping.set()


# -- running a node -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningServer:
    """A node serving HTTP (yielded by :func:`serve`)."""

    client: Client
    host: str
    port: int
    token: str | None
    app: web.Application

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
    environ: Mapping[str, str] | None = None,
) -> AsyncIterator[RunningServer]:
    """Open the node of ``config`` (a deployment YAML path, mapping, Deployment, or None for
    the embedded default) and serve it over HTTP until the context exits; then stop accepting,
    answer long polls, and close the client (which uploads everything acknowledged).

    ``listen`` and ``token`` override the deployment's ``server`` section (port 0: any free
    port, see :attr:`RunningServer.port`).
    """
    import walstream_plugins

    import walstream

    deployment = walstream_plugins.load_deployment(config)
    server_section = deployment.sections["server"]
    host, port = parse_listen(listen or server_section["listen"] or DEFAULT_LISTEN)
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
    plugin_manager = walstream_plugins.make_plugin_manager(
        load_entrypoints=True, disabled=deployment.disabled_hooks
    )
    metrics = walstream_plugins.get_metrics(plugin_manager)
    hooks = walstream_plugins.PluggyHooks(plugin_manager)
    client = await walstream.open(deployment, hooks=hooks)
    runner: web.AppRunner | None = None
    try:
        app = make_app(
            client,
            token=chosen_token,
            render_metrics=None if metrics is None else metrics.render_prometheus,
            max_body_bytes=max_body_bytes,
            max_wait_s=max_wait_s,
        )
        runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_port = _bound_port(runner, port)
        yield RunningServer(client, host, bound_port, chosen_token, app)
    finally:
        try:
            if runner is not None:
                _begin_shutdown(runner.app)
                await runner.cleanup()
        finally:
            await client.close()


def _bound_port(runner: web.AppRunner, requested: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return requested


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
