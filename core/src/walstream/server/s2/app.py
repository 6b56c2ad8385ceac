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
``Authorization: Bearer <token>`` (else 401). With a cluster secret
(:mod:`walstream.server.node_auth`), a request that carries the forwarding header or asks for an
internal route (``/cluster/...``) must also carry a valid node signature (else 401, whatever
token it holds). The routes are in
:mod:`walstream.server.s2.routes` (one module per resource), the state they share in
:mod:`walstream.server.s2.context`, the concept mapping in :mod:`walstream.server.s2.model`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from walstream.errors import WalstreamError
from walstream.server.node_auth import NODE_AUTH_HEADER, SECRET_ENVIRONMENT_VARIABLE
from walstream.server.s2.context import S2Context
from walstream.server.s2.errors import S2Error, from_walstream
from walstream.server.s2.fast_append import FastAppend
from walstream.server.s2.forward import FORWARDED_HEADER
from walstream.server.s2.openapi import document
from walstream.server.s2.request import Receive, Request, Scope, Send, lifespan
from walstream.server.s2.routes.basins import basins_route
from walstream.server.s2.routes.cluster import cluster_route
from walstream.server.s2.routes.health import PROMETHEUS_CONTENT_TYPE, health, metrics
from walstream.server.s2.routes.streams import streams_route

if TYPE_CHECKING:
    from walstream.engine.client import Client

__all__ = ["PROMETHEUS_CONTENT_TYPE", "S2App"]

log = logging.getLogger(__name__)

_NODE_AUTH = NODE_AUTH_HEADER.encode("ascii")
_FORWARDED = FORWARDED_HEADER.encode("ascii")
#: :meth:`S2App._node_of`: a forwarded or internal request without a valid node signature.
_REFUSED = -1


def _no_node_credentials() -> S2Error:
    return S2Error(
        401,
        "authn",
        "forwarded and internal (/cluster) requests must carry a valid node signature "
        f"({NODE_AUTH_HEADER}, made with the cluster secret {SECRET_ENVIRONMENT_VARIABLE}); "
        "a client token does not open them. From a node: check that every node has the same "
        "secret and that their clocks agree within 30 s",
    )


class S2App(S2Context):
    """The ASGI application over one started client (the caller closes the client)."""

    def __init__(self, client: Client, **options: Any) -> None:
        super().__init__(client, **options)
        self.fast_append = FastAppend(self)
        """The hot path of unary appends to streams this node writes."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
            return
        node_id: int | None = None
        if self.node_credentials is not None:
            node_id = self._node_of(scope)
            if node_id == _REFUSED:
                node_id = None
                request = Request(scope, receive, send, self.max_body_bytes, self.deadlines)
                await self.answer_error(request, _no_node_credentials())
                self.count_request(request.method, "(node credentials)", request.status)
                return
        if (
            scope["method"] == "POST"
            and node_id is None
            and await self.fast_append(scope, receive, send)
        ):
            return
        request = Request(scope, receive, send, self.max_body_bytes, self.deadlines)
        request.node_id = node_id
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

    def _node_of(self, scope: Scope) -> int | None:
        """With a cluster secret: the node that signed a forwarded or internal request,
        :data:`_REFUSED` when such a request is not validly signed, None for a client's."""
        credentials = self.node_credentials
        assert credentials is not None
        signature: bytes | None = None
        forwarded = False
        for name, value in scope["headers"]:
            if name == _NODE_AUTH:
                signature = value
            elif name == _FORWARDED:
                forwarded = True
        internal = (scope.get("raw_path") or b"").startswith(b"/cluster")
        if not forwarded and not internal and signature is None:
            return None
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        query: bytes = scope.get("query_string", b"")
        target = raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        node_id = credentials.verify(scope["method"], target, signature)
        if node_id is None:
            if forwarded or internal:
                return _REFUSED
            return None  # a bad signature on a client's request grants nothing
        return node_id

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
            return await health(self, request)
        if parts == ["openapi.json"] and method == "GET":
            return await request.respond_json(200, document())
        self.check_token(request)
        if parts == ["metrics"] and method == "GET":
            return await metrics(self, request)
        if parts[:1] == ["cluster"]:
            return await cluster_route(self, request, parts[1:])
        if len(parts) < 2 or parts[0] != "v1":
            raise S2Error(404, "bad_path", f"no route {'/' + '/'.join(parts)}")
        resource, rest = parts[1], parts[2:]
        if resource == "basins":
            return await basins_route(self, request, method, rest)
        if resource == "streams":
            return await streams_route(self, request, method, rest)
        if resource in ("access-tokens", "metrics", "locations"):
            raise S2Error(501, "not_implemented", f"/v1/{resource} is not implemented by walstream")
        raise S2Error(404, "bad_path", f"no route /v1/{resource}")
