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
(:class:`~walstream.server.limits.ServerLimits`). Every input is checked before it reaches the
engine (out-of-range numbers, invalid UTF-8, too-deep JSON, requests aiohttp cannot parse: 400),
so bad input never gets a 5xx; an unexpected exception is a bug and answers 500 ``InternalError``
without a traceback.

The wire forms are parsed and encoded in :mod:`walstream.server.codec`;
:func:`walstream.server.serve.serve` runs a node with this application behind the listener of
:mod:`walstream.server.limits`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from aiohttp import web

from walstream.errors import CapacityError, ConfigError, InvalidArgument, WalstreamError
from walstream.records import check_stream_name, check_text
from walstream.server.codec import (
    BodyTimeout,
    ReadRequest,
    error_json,
    error_status,
    http_error_json,
    int_field,
    internal_error_json,
    json_body,
    optional_str,
    parse_append,
    parse_read,
    record_json,
    refusal_json,
    stream_info_json,
    stream_ref,
)
from walstream.server.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WAIT_S, ServerLimits

if TYPE_CHECKING:
    from walstream.engine.node import Client, Stream

__all__ = ["PROMETHEUS_CONTENT_TYPE", "begin_shutdown", "make_app"]

log = logging.getLogger(__name__)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _token_bytes(token: str) -> bytes:
    try:
        return check_text(token, "server.token").encode("utf-8")
    except InvalidArgument as error:
        raise ConfigError(f"{error}; set a token of valid UTF-8 text") from None


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
            return web.json_response(error_json(error), status=status, headers=headers)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            response = web.json_response(
                http_error_json(request, error, self.max_body_bytes),
                status=error.status,
                headers=_kept_headers(error),
            )
            if isinstance(error, BodyTimeout):
                # Part of the body may still be on its way: the connection cannot be reused.
                response.force_close()
            return response
        except Exception:
            # Every input is checked before it reaches the engine, so this is a bug: say so,
            # log the traceback, and never send the traceback to the caller.
            log.exception("%s %s failed unexpectedly", request.method, request.path)
            return web.json_response(internal_error_json(), status=500)

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
            refusal_json("Unauthorized", message),
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
        return web.json_response({"streams": [stream_info_json(info) for info in infos]})

    async def create_stream(self, request: web.Request) -> web.Response:
        body = await json_body(request, self.limits.body_timeout_s)
        if not isinstance(body, dict) or set(body) - {"name"}:
            raise InvalidArgument('expected a JSON object {"name": "<stream name>"}')
        stream = await self.client.create_stream(check_stream_name(body.get("name")))
        return web.json_response({"stream_id": stream.stream_id, "name": stream.name}, status=201)

    async def delete_stream(self, request: web.Request) -> web.Response:
        ref = stream_ref(request)
        stream = await self.client.open_stream(ref)
        await self.client.delete_stream(stream.stream_id)
        return web.json_response({"deleted": stream.name, "stream_id": stream.stream_id})

    async def append(self, request: web.Request) -> web.Response:
        stream = await self.client.open_stream(stream_ref(request))
        parsed = await parse_append(request, self.limits.body_timeout_s)
        ack = await stream.append(
            parsed.records, match_tail=parsed.match_tail, fencing_token=parsed.fencing_token
        )
        return web.json_response({"start": ack.start, "end": ack.end, "tail": ack.tail})

    async def read(self, request: web.Request) -> web.Response:
        query = parse_read(request, self.max_wait_s)
        stream = await self.client.open_stream(stream_ref(request))
        if query.wait <= 0:
            return await self._read(stream, query)
        if self.long_polls >= self.limits.max_long_polls:
            # Each waiting read holds a connection and a task: bounded, so a crowd of pollers
            # cannot take the memory or the connections of the node.
            raise CapacityError(
                f"{self.long_polls} long polls are already waiting (server.max_long_polls); "
                "retry later, read without wait=, or raise the bound"
            )
        self.long_polls += 1
        try:
            return await self._read(stream, query)
        finally:
            self.long_polls -= 1

    async def _read(self, stream: Stream, query: ReadRequest) -> web.Response:
        reading = asyncio.ensure_future(
            stream.read(
                query.start,
                from_timestamp=query.from_timestamp,
                tail_offset=query.tail_offset,
                limit_records=query.limit,
                limit_bytes=query.limit_bytes,
                wait=query.wait,
            )
        )
        if query.wait > 0 and not await self._unless_stopping(reading):
            # Shutting down: answer the long poll now, empty, so the caller re-polls elsewhere.
            return web.json_response({"records": [], "tail": await stream.check_tail()})
        result = await reading
        return web.json_response(
            {
                "records": [record_json(record) for record in result.records],
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
        body = await json_body(request, self.limits.body_timeout_s)
        if not isinstance(body, dict) or "start" not in body or set(body) - {"start"}:
            raise InvalidArgument('expected a JSON object {"start": <new first offset>}')
        new_start = int_field(body["start"], "start")
        stream = await self.client.open_stream(stream_ref(request))
        await stream.trim(new_start)
        return web.json_response({"start": new_start})

    async def tail(self, request: web.Request) -> web.Response:
        stream = await self.client.open_stream(stream_ref(request))
        tail = await stream.check_tail()
        return web.json_response({"tail": tail, "start_offset": await stream.start_offset()})

    async def set_fencing_token(self, request: web.Request) -> web.Response:
        body = await json_body(request, self.limits.body_timeout_s)
        if not isinstance(body, dict) or set(body) != {"token"}:
            raise InvalidArgument('expected a JSON object {"token": "<token>" | null}')
        token = optional_str(body["token"], "token")
        stream: Stream = await self.client.open_stream(stream_ref(request))
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
    need the listener of :func:`walstream.server.serve.serve`.
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


def begin_shutdown(app: web.Application) -> None:
    """Answer the long polls of ``app`` now (shutdown began; ``/health`` says ``stopping``)."""
    app[_SERVICE].stopping.set()
