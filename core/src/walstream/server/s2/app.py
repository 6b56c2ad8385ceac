"""The ASGI application of ``walstream serve``: S2's REST API v1 over one walstream node, plus
``/health``, ``/metrics`` and ``/openapi.json``.

Routes (the account endpoint and the basin endpoint are the same server; a stream request names
its basin with the ``s2-basin`` header, or with a ``Host`` of the form ``{basin}.b.<domain>``)::

    GET    /health                              {"status": "ok", "node_id", "node_epoch"}; 503
                                                when the node failed or is stopping (no token)
    GET    /metrics                             Prometheus text (engine hooks + request counts)
    GET    /openapi.json                        the OpenAPI document of what is implemented
    GET    /v1/basins                           list basins (prefix, start_after, limit)
    POST   /v1/basins                           create a basin -> 201 BasinInfo
    GET    /v1/basins/{basin}                   BasinConfig
    PUT    /v1/basins/{basin}                   ensure a basin -> 201 created / 200 unchanged
    DELETE /v1/basins/{basin}                   delete a basin and its streams -> 202
    GET    /v1/streams                          list streams of the basin
    POST   /v1/streams                          create a stream -> 201 StreamInfo
    GET    /v1/streams/{stream}                 StreamConfig
    PUT    /v1/streams/{stream}                 ensure a stream -> 201 created / 200 unchanged
    PATCH  /v1/streams/{stream}                 reconfigure (only the fixed config is accepted)
    DELETE /v1/streams/{stream}                 delete -> 202
    POST   /v1/streams/{stream}/records         append (JSON, protobuf, or an S2S session)
    GET    /v1/streams/{stream}/records         read (JSON, protobuf, SSE, or an S2S session)
    GET    /v1/streams/{stream}/records/tail    check tail

When a token is configured every route but ``/health`` and ``/openapi.json`` needs
``Authorization: Bearer <token>`` (else 401). The records routes are in
:mod:`walstream.server.s2.records`, the concept mapping in :mod:`walstream.server.s2.model`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from walstream.errors import (
    BasinNotFound,
    ConfigError,
    FencedError,
    InvalidArgument,
    StreamNotFound,
    WalstreamError,
)
from walstream.metadata.rules import check_basin_name
from walstream.records import check_text, parse_int_text
from walstream.server.cluster_status import cluster_health
from walstream.server.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WAIT_S, ServerLimits
from walstream.server.s2 import records, routing
from walstream.server.s2.asgi import (
    BodyDeadlines,
    Receive,
    Request,
    Scope,
    Send,
    json_object,
    lifespan,
)
from walstream.server.s2.errors import S2Error, from_walstream
from walstream.server.s2.fast_append import FastAppend
from walstream.server.s2.model import (
    ROOT_BASIN,
    basin_config_json,
    basin_prefix,
    check_basin_config,
    check_stream_config,
    rfc3339,
    s2_stream_name,
    stream_config_json,
    walstream_stream_name,
)

if TYPE_CHECKING:
    from walstream.engine.client import Client, Stream

__all__ = ["PROMETHEUS_CONTENT_TYPE", "S2App"]

log = logging.getLogger(__name__)

PROMETHEUS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_MAX_LIST = 1000


class S2App:
    """The ASGI application over one started client (the caller closes the client)."""

    def __init__(
        self,
        client: Client,
        *,
        token: str | None = None,
        render_metrics: Callable[[], str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        limits: ServerLimits | None = None,
    ) -> None:
        self.client = client
        self.token = token or None
        self.token_bytes = b"" if self.token is None else _token_bytes(self.token)
        self.render_metrics = render_metrics
        self.max_body_bytes = max_body_bytes
        self.max_wait_s = max_wait_s
        self.limits = limits or ServerLimits()
        self.deadlines = BodyDeadlines(self.limits.body_timeout_s)
        """Bounds the time every request body takes to arrive (``server.body_timeout``)."""
        self.long_polls = 0
        """Reads that wait (``wait > 0``, SSE and S2S sessions) in progress."""
        self.stopping = asyncio.Event()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.basins: dict[str, dict[str, Any]] = {}
        """Basins known to exist: name -> stored config (a cache; deletes go through here)."""
        self.stream_ids: dict[str, int] = {}
        """walstream stream name -> id, so the hot path opens streams without a metadata query."""
        self.fences: dict[int, asyncio.Future[None]] = {}
        """stream id -> a fence command in progress (appends wait for its token)."""
        self.tail_timestamps: dict[int, tuple[int, int]] = {}
        """stream id -> (tail, timestamp of the record before it), as last seen."""
        self.router = routing.Router(client)
        """Which other node owns a stream (requests for it are forwarded there)."""
        self.rejoins = 0
        """Times :meth:`replace_client` swapped in a new client (a fenced node rejoined)."""
        self.fast_append = FastAppend(self)
        """The hot path of unary appends to streams this node writes."""

    def replace_client(self, client: Client) -> Client:
        """Serve ``client`` from now on and return the one it replaces (the caller closes it).

        Used when the served client was fenced and a new epoch of the same node was opened.
        Requests that start after this call use ``client``; requests in progress finish (or
        fail fenced) on the old one. Caches that describe the old epoch are dropped."""
        old = self.client
        self.client = client
        self.router.rebind(client)
        self.tail_timestamps.clear()
        self.rejoins += 1
        return old

    @contextmanager
    def long_poll(self) -> Iterator[None]:
        """Count one waiting read (429 ``rate_limited`` over ``server.max_long_polls``): each
        holds a connection and a task, so a crowd of pollers cannot take the node's memory."""
        if self.long_polls >= self.limits.max_long_polls:
            raise S2Error(
                429,
                "rate_limited",
                f"{self.long_polls} waiting reads are already in progress "
                "(server.max_long_polls); retry later, read without wait, or raise the bound",
            )
        self.long_polls += 1
        try:
            yield
        finally:
            self.long_polls -= 1

    async def unless_stopping(
        self, work: asyncio.Future[Any], *others: asyncio.Future[Any]
    ) -> bool:
        """Wait for ``work``, or cancel it when shutdown begins or one of ``others`` is done;
        True when it finished."""
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            done, _ = await asyncio.wait(
                {work, stopping, *others}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
            if not work.done():
                work.cancel()
                with suppress(asyncio.CancelledError):
                    await work
        return work in done

    def begin_shutdown(self) -> None:
        """Answer waiting reads now and end sessions (shutdown began; /health says stopping)."""
        self.stopping.set()

    # -- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
            return
        if scope["method"] == "POST" and await self.fast_append(scope, receive, send):
            return
        request = Request(scope, receive, send, self.max_body_bytes, self.deadlines)
        route = "(unmatched)"
        try:
            if request.error is not None:
                raise request.error
            route = self._route_name(request)
            await self._dispatch(request)
        except S2Error as error:
            await self.answer_error(request, error)
        except WalstreamError as error:
            await self.answer_error(request, from_walstream(error))
        except Exception:
            log.exception("%s %s failed unexpectedly", request.method, scope.get("path"))
            await self.answer_error(
                request, S2Error(500, "other", "internal error; the server log has the details")
            )
        self.count_request(request.method, route, request.status)

    def count_request(self, method: str, route: str, status: int) -> None:
        """Count one answered request for ``/metrics``."""
        key = (method, route, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    async def answer_error(self, request: Request, error: S2Error) -> None:
        """Answer ``error`` (unless a streaming answer began: then it is reported in-band)."""
        if error.status >= 500:
            log.warning("%s failed: %s %s", request.method, error.code, error.message)
        if request.started:
            return  # a streaming answer already began: the session code reports in-band
        # Read what is left of the body first: an HTTP/2 answer that ends its stream while
        # the client still sends data makes hypercorn drop the whole connection. Not after a
        # 408: that body did not come in time, and waiting longer for it only delays the answer.
        if error.status != 408:
            await request.drain()
        headers: list[tuple[bytes, bytes]] = []
        if error.status in (429, 503):
            headers.append((b"retry-after-ms", b"1000"))
        if error.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="walstream"'))
        if error.status == 408 and request.http_version.startswith("1"):
            # The rest of the body may still come: the connection cannot carry another request
            # (HTTP/2 ends just this stream; it has no Connection header).
            headers.append((b"connection", b"close"))
        await request.respond(error.status, error.encoded(), headers=headers)

    @staticmethod
    def _route_name(request: Request) -> str:
        """The route pattern of a request, for the request counts of /metrics."""
        parts = request.segments
        if parts[:1] != ["v1"] or len(parts) < 2:
            return "/" + "/".join(parts) if len(parts) <= 1 else "(unmatched)"
        shape = ["v1", parts[1], *["{name}"] * min(len(parts) - 2, 1), *parts[3:5]]
        return "/" + "/".join(shape)

    async def _dispatch(self, request: Request) -> None:
        parts, method = request.segments, request.method
        if parts == ["health"] and method == "GET":
            return await self.health(request)
        if parts == ["openapi.json"] and method == "GET":
            from walstream.server.s2.openapi import document

            return await request.respond_json(200, document())
        self._check_token(request)
        if parts == ["metrics"] and method == "GET":
            return await self.metrics(request)
        if parts[:1] == ["cluster"]:
            return await routing.cluster_route(self, request, parts[1:])
        if len(parts) < 2 or parts[0] != "v1":
            raise S2Error(404, "bad_path", f"no route {'/' + '/'.join(parts)}")
        resource, rest = parts[1], parts[2:]
        if resource == "basins":
            return await self._basins(request, method, rest)
        if resource == "streams":
            return await self._streams(request, method, rest)
        if resource in ("access-tokens", "metrics", "locations"):
            raise S2Error(501, "not_implemented", f"/v1/{resource} is not implemented by walstream")
        raise S2Error(404, "bad_path", f"no route /v1/{resource}")

    def _check_token(self, request: Request) -> None:
        if self.token is None:
            return
        scheme, _, given = (request.header("authorization") or "").partition(" ")
        given_bytes = given.strip().encode("latin-1")
        if scheme.lower() == "bearer" and hmac.compare_digest(given_bytes, self.token_bytes):
            return
        raise S2Error(
            401,
            "authn",
            "wrong bearer token"
            if scheme.lower() == "bearer"
            else "this server needs a token: send the header 'Authorization: Bearer <token>'",
        )

    # -- health and metrics -----------------------------------------------------------------------

    async def health(self, request: Request) -> None:
        body: dict[str, Any] = {
            "status": "ok",
            "node_id": self.client.node_id,
            "node_epoch": self.client.node_epoch,
        }
        cluster = cluster_health(self.client, self.rejoins)
        if cluster is not None:
            body["cluster"] = cluster
        failure = self.client.failure
        if failure is not None:
            body.update(status="failed", error=type(failure).__name__, message=str(failure))
            return await request.respond_json(503, body)
        if self.stopping.is_set():
            body["status"] = "stopping"
            return await request.respond_json(503, body)
        await request.respond_json(200, body)

    async def metrics(self, request: Request) -> None:
        if self.render_metrics is None:
            raise S2Error(
                404,
                "bad_path",
                "metrics are disabled in this deployment (hooks.disable lists 'metrics'); "
                "remove it from hooks.disable to serve /metrics",
            )
        lines = [
            "# HELP walstream_http_requests_total HTTP requests answered by walstream serve.",
            "# TYPE walstream_http_requests_total counter",
        ]
        for (method, route, status), count in sorted(self.requests.items()):
            label = route.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(
                f'walstream_http_requests_total{{method="{method}",route="{label}",'
                f'status="{status}"}} {count}'
            )
        text = self.render_metrics() + "\n".join(lines) + "\n"
        await request.respond(200, text.encode("utf-8"), PROMETHEUS_CONTENT_TYPE)

    # -- basins -------------------------------------------------------------------------------

    async def _basins(self, request: Request, method: str, rest: list[str]) -> None:
        if not rest:
            if method == "GET":
                return await self.list_basins(request)
            if method == "POST":
                body = await json_object(request)
                name = _basin_name(body.get("basin"))
                if name == ROOT_BASIN:
                    raise _root_basin_exists()
                info = await self.client.metadata.create_basin(
                    name, check_basin_config(body.get("config"))
                )
                self.basins[name] = info.config
                return await request.respond_json(201, _basin_info(info.name, info.created_ms))
            raise _not_allowed(method)
        if len(rest) != 1:
            raise S2Error(404, "bad_path", "no such basin route")
        name = _basin_name(rest[0], status=400)
        if method == "GET":
            config = await self.basin_config(name)
            return await request.respond_json(200, basin_config_json(config))
        if method == "PUT":
            body = await json_object(request, allow_empty=True)
            config = check_basin_config(body.get("config"))
            if name == ROOT_BASIN:
                return await request.respond_json(
                    200, _basin_info(name, 0), headers=[(b"s2-provision-result", b"noop")]
                )
            try:
                info = await self.client.metadata.get_basin(name)
                result, status = b"noop", 200
            except BasinNotFound:
                info = await self.client.metadata.create_basin(name, config)
                result, status = b"created", 201
            self.basins[name] = info.config
            return await request.respond_json(
                status,
                _basin_info(info.name, info.created_ms),
                headers=[(b"s2-provision-result", result)],
            )
        if method == "DELETE":
            if name == ROOT_BASIN:
                raise S2Error(
                    403,
                    "permission_denied",
                    f"basin {ROOT_BASIN!r} holds every walstream stream and cannot be deleted",
                )
            await self.basin_config(name)
            for stream_info in await self.client.list_streams(prefix=f"{name}."):
                await self.client.delete_stream(stream_info.stream_id)
                self.stream_ids.pop(stream_info.name or "", None)
            self.basins.pop(name, None)
            await self.client.metadata.delete_basin(name)
            return await request.respond(202)
        raise _not_allowed(method)

    async def list_basins(self, request: Request) -> None:
        prefix, start_after, limit = _list_query(request)
        found = [
            (b.name, b.created_ms)
            for b in await self.client.metadata.list_basins(
                prefix, start_after, min(limit + 1, 1000)
            )
        ]
        if ROOT_BASIN.startswith(prefix) and ROOT_BASIN > start_after:
            found = sorted([*found, (ROOT_BASIN, 0)])
        await request.respond_json(
            200,
            {
                "basins": [_basin_info(name, created) for name, created in found[:limit]],
                "has_more": len(found) > limit,
            },
        )

    async def basin_config(self, name: str) -> dict[str, Any]:
        """The stored config of basin ``name`` (404 ``basin_not_found`` if there is none)."""
        if name == ROOT_BASIN:
            return {}
        config = self.basins.get(name)
        if config is None:
            config = (await self.client.metadata.get_basin(name)).config
            self.basins[name] = config
        return config

    async def basin_of(self, request: Request) -> str:
        """The basin a stream request addresses (``s2-basin`` header or ``{basin}.b.`` host)."""
        name = request.header("s2-basin")
        if name is None:
            host = (request.header("host") or request.header(":authority") or "").lower()
            label, _, rest = host.partition(".")
            if not rest.startswith("b."):
                raise S2Error(
                    400,
                    "bad_header",
                    "name the basin with the s2-basin header (or a host {basin}.b.<domain>)",
                )
            name = label
        try:
            check_basin_name(name)
        except InvalidArgument as error:
            raise S2Error(400, "bad_header", str(error)) from None
        await self.basin_config(name)
        return name

    # -- streams ------------------------------------------------------------------------------

    async def _streams(self, request: Request, method: str, rest: list[str]) -> None:
        basin = await self.basin_of(request)
        if not rest:
            if method == "GET":
                return await self.list_streams(request, basin)
            if method == "POST":
                body = await json_object(request)
                stream = body.get("stream")
                if not isinstance(stream, str):
                    raise S2Error(422, "invalid", "stream: expected the stream name (a string)")
                check_stream_config(body.get("config"))
                name = walstream_stream_name(basin, stream)
                await self.client.create_stream(name)
                return await request.respond_json(201, await self._stream_info(basin, name))
            raise _not_allowed(method)
        name = walstream_stream_name(basin, rest[0])
        if await routing.forward_if_elsewhere(self, request, basin, name):
            return None
        if self.stopping.is_set() and method == "POST" and rest[1:] == ["records"]:
            # Draining: what is acknowledged gets uploaded and the streams released; a client
            # retries elsewhere (or here until the stream is claimed by another node).
            raise S2Error(
                503,
                "server_draining",
                f"node {self.client.node_id} is shutting down; retry on another node",
            )
        try:
            return await self._stream_route(request, method, basin, name, rest)
        except FencedError:
            await self.refused_claim(name)
            raise

    async def refused_claim(self, name: str) -> None:
        """After a FencedError on stream ``name``: when this node does not write it, its claim
        was refused (another node took it meanwhile, or its owner is not reachable yet) and the
        answer is 503 with where it went (a retry is routed afresh); else the caller re-raises
        (this node's writer was fenced)."""
        stream = await self.open_stream(name)
        if stream.writing:
            return
        owner = await self.router.owner_elsewhere(stream.stream_id, fresh=True)
        raise routing.not_owner_here(owner, self.client.node_id) from None

    async def _stream_route(
        self, request: Request, method: str, basin: str, name: str, rest: list[str]
    ) -> None:
        if len(rest) == 2 and rest[1] == "records":
            return await records.records_route(self, request, basin, name)
        if len(rest) == 3 and rest[1:] == ["records", "tail"] and method == "GET":
            return await records.check_tail(self, request, basin, name)
        if len(rest) != 1:
            raise S2Error(404, "bad_path", "no such stream route")
        if method == "GET":
            await self.open_stream(name)
            return await request.respond_json(200, stream_config_json())
        if method == "PUT":
            body = await json_object(request, allow_empty=True)
            check_stream_config(body)
            try:
                await self.open_stream(name)
                result, status = b"noop", 200
            except StreamNotFound:
                await self.client.create_stream(name)
                result, status = b"created", 201
            return await request.respond_json(
                status,
                await self._stream_info(basin, name),
                headers=[(b"s2-provision-result", result)],
            )
        if method == "PATCH":
            check_stream_config(await json_object(request, allow_empty=True))
            await self.open_stream(name)
            return await request.respond_json(200, stream_config_json())
        if method == "DELETE":
            stream = await self.open_stream(name)
            await self.client.delete_stream(stream.stream_id)
            self.stream_ids.pop(name, None)
            return await request.respond(202)
        raise _not_allowed(method)

    async def list_streams(self, request: Request, basin: str) -> None:
        prefix, start_after, limit = _list_query(request)
        infos = await self.client.list_streams(prefix=basin_prefix(basin) + prefix)
        named = sorted(
            (s2_stream_name(basin, info.name), info.created_ms)
            for info in infos
            if info.name is not None
        )
        chosen = [item for item in named if item[0] > start_after]
        await request.respond_json(
            200,
            {
                "streams": [
                    {"name": name, "created_at": rfc3339(created), "deleted_at": None}
                    for name, created in chosen[:limit]
                ],
                "has_more": len(chosen) > limit,
            },
        )

    async def _stream_info(self, basin: str, name: str) -> dict[str, Any]:
        info = await self.client.metadata.get_stream(name)
        self.stream_ids[name] = info.stream_id
        return {
            "name": s2_stream_name(basin, name),
            "created_at": rfc3339(info.created_ms),
            "deleted_at": None,
        }

    async def open_stream(self, name: str) -> Stream:
        """The stream named ``name`` (StreamNotFound if there is none), without a metadata
        query once its id is known."""
        stream_id = self.stream_ids.get(name)
        if stream_id is not None:
            try:
                return await self.client.open_stream(stream_id)
            except StreamNotFound:
                self.stream_ids.pop(name, None)  # deleted (perhaps made again under the name)
        stream = await self.client.open_stream(name)
        self.stream_ids[name] = stream.stream_id
        return stream


# -- internals ----------------------------------------------------------------------------------


def _token_bytes(token: str) -> bytes:
    try:
        return check_text(token, "server.token").encode("utf-8")
    except InvalidArgument as error:
        raise ConfigError(f"{error}; set a token of valid UTF-8 text") from None


def _not_allowed(method: str) -> S2Error:
    return S2Error(405, "bad_path", f"method {method} is not allowed on this route")


def _basin_name(value: Any, status: int = 422) -> str:
    try:
        return check_basin_name(value)
    except InvalidArgument as error:
        raise S2Error(status, "invalid" if status == 422 else "bad_path", str(error)) from None


def _root_basin_exists() -> S2Error:
    return S2Error(
        409,
        "resource_already_exists",
        f"basin {ROOT_BASIN!r} always exists: it holds every walstream stream",
    )


def _basin_info(name: str, created_ms: int) -> dict[str, Any]:
    return {"name": name, "created_at": rfc3339(created_ms), "deleted_at": None, "scope": None}


def _list_query(request: Request) -> tuple[str, str, int]:
    query = request.query
    limit = _MAX_LIST
    if "limit" in query:
        try:
            limit = parse_int_text(query["limit"], "limit")
        except InvalidArgument as error:
            raise S2Error(400, "bad_query", str(error)) from None
        limit = min(max(limit, 1), _MAX_LIST)
    return query.get("prefix", ""), query.get("start_after", ""), limit
