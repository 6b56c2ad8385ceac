"""The hot path of ``walstream serve``: a unary append (``POST /v1/streams/{stream}/records``,
JSON or protobuf) to a stream this node writes, answered without the generic request layers.

It gives the same answers as the general route (:func:`walstream.server.s2.routes.records.records_route`)
and keeps every guarantee: the records are durable in the WAL before the 200, ``match_seq_num``,
fencing tokens and ``fence``/``trim`` commands go through the same
:func:`~walstream.server.s2.appends.append_positions`, the token is checked, and the body is read
under the same size and time bounds. What it skips is work whose outcome is already known for
a stream this node writes: the parsing of the whole request into a
:class:`~walstream.server.s2.request.Request`, the route tree, the basin and stream name checks
(remembered per name), and the lookup of the stream's owner (a stream this node writes is served
here).

A request takes the hot path only when nothing about it needs more: a plain path without query,
the basin in the ``s2-basin`` header and known to exist, a stream known by name whose writer is
this node, a correct token (when one is configured), a declared length within the bound, and a
server that is not draining. Anything else — including every error before the body is read —
goes to the general route, which answers it as before. An error after the body is read is
answered by the application's error path (``S2Context.answer_error``), as on the general route.
"""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING

from walstream.errors import FencedError, InvalidArgument, WalstreamError
from walstream.metadata.rules import check_basin_name
from walstream.server.s2.appends import append_positions
from walstream.server.s2.errors import S2Error, from_walstream
from walstream.server.s2.model import ROOT_BASIN, walstream_stream_name
from walstream.server.s2.request import Receive, Request, Scope, Send, read_body
from walstream.server.s2.wire import (
    PROTOBUF_TYPES,
    S2S,
    append_input,
    encode_append_ack,
    media_type,
)

if TYPE_CHECKING:
    from walstream.server.s2.context import S2Context

__all__ = ["FastAppend"]

log = logging.getLogger(__name__)

_PREFIX = b"/v1/streams/"
_SUFFIX = b"/records"
#: Names remembered at most (basin and stream as sent -> walstream name); forgotten all at once
#: beyond it, so a client cycling through names cannot grow the server's memory.
_MAX_NAMES = 4096
#: The request headers the hot path reads; the others are ignored as on the general route.
_WANTED = frozenset(
    (
        b"content-type",
        b"accept",
        b"s2-basin",
        b"s2-format",
        b"authorization",
        b"content-length",
        b"content-encoding",
        b"s2-encryption-key",
        b"walstream-encryption-cipher",
    )
)
_ACK_JSON = (
    b'{"start":{"seq_num":%d,"timestamp":%d},"end":{"seq_num":%d,"timestamp":%d},'
    b'"tail":{"seq_num":%d,"timestamp":%d}}'
)
ROUTE = "/v1/streams/{name}/records"
"""The route name the request counts of ``/metrics`` use (as the general route's)."""


class FastAppend:
    """The hot path of one application (see the module's docstring)."""

    def __init__(self, app: S2Context) -> None:
        self.app = app
        self._names: dict[tuple[bytes, bytes], tuple[str, str]] = {}
        self.taken = 0
        """Requests answered here, successful or not (for tests and metrics)."""

    def _name(self, basin_raw: bytes, stream_raw: bytes) -> tuple[str, str] | None:
        """(basin, walstream stream name) for names as sent, None when either is not valid
        (the general route answers why)."""
        key = (basin_raw, stream_raw)
        known = self._names.get(key)
        if known is not None:
            return known
        try:
            basin = check_basin_name(basin_raw.decode("latin-1"))
            name = walstream_stream_name(basin, stream_raw.decode("ascii"))
        except (InvalidArgument, S2Error, UnicodeDecodeError):
            return None
        if len(self._names) >= _MAX_NAMES:
            self._names.clear()
        self._names[key] = (basin, name)
        return basin, name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request when it takes the hot path (True); False when it does not, and
        nothing of it was read or answered (the general route serves it)."""
        app = self.app
        path: bytes = scope.get("raw_path") or b""
        if (
            not path.startswith(_PREFIX)
            or not path.endswith(_SUFFIX)
            or scope.get("query_string")
            or app.stopping.is_set()
        ):
            return False
        stream_raw = path[len(_PREFIX) : -len(_SUFFIX)]
        if not stream_raw or b"/" in stream_raw or b"%" in stream_raw:
            return False
        headers: dict[bytes, bytes] = {}
        for header_name, value in scope["headers"]:  # names are lower case in ASGI
            if header_name in _WANTED:
                if header_name in headers:
                    return False  # given twice: the general route decides
                headers[header_name] = value
        basin_raw = headers.get(b"s2-basin")
        if basin_raw is None or b"content-encoding" in headers:
            return False  # (a compressed body: the general route decodes it)
        content_type = _media_type(headers.get(b"content-type"))
        if content_type == S2S:
            return False
        declared = headers.get(b"content-length")
        length: int | None = None
        if declared is not None:
            if not declared.isdigit():
                return False
            length = int(declared)
            if length > app.max_body_bytes:
                return False
        if app.token is not None and not self._authorized(headers.get(b"authorization")):
            return False
        base64_format = False
        chosen = headers.get(b"s2-format")
        if chosen is not None:
            lowered_format = chosen.lower()
            if lowered_format not in (b"raw", b"base64"):
                return False
            base64_format = lowered_format == b"base64"
        names = self._name(basin_raw, stream_raw)
        if names is None:
            return False
        basin, name = names
        if basin != ROOT_BASIN and basin not in app.basins:
            return False
        if b"s2-encryption-key" in headers or b"walstream-encryption-cipher" in headers:
            return False  # the general route resolves the key
        stream_id = app.stream_ids.get(name)
        if stream_id is None:
            return False
        try:
            stream = await app.client.open_stream(stream_id)
        except WalstreamError:
            return False  # deleted meanwhile, or the node stopped: the general route answers
        if stream.config.cipher is not None:
            return False  # an encrypted stream: the general route resolves its key
        if not stream.owned_here:
            # Not written here, or claimed by a node past its lease: the general route
            # forwards to the stream's current owner.
            return False
        accept = _media_type(headers.get(b"accept"))
        done = False

        def body_read() -> None:
            nonlocal done
            done = True

        status = 200
        try:
            body = await read_body(receive, app.deadlines, app.max_body_bytes, body_read, length)
            parsed = append_input(body, content_type in PROTOBUF_TYPES, base64_format)
            try:
                start, end, tail = await append_positions(app, stream, parsed)
            except FencedError:
                # As the general route: a claim lost to another node is answered with where
                # the stream went; this node's own fencing is reported as it is.
                await app.refused_claim(name)
                raise
            if accept in PROTOBUF_TYPES:
                answer = encode_append_ack(start, end, tail)
                content = accept.encode("latin-1")
            else:
                answer = _ACK_JSON % (*start, *end, *tail)
                content = b"application/json"
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", content),
                        (b"content-length", b"%d" % len(answer)),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": answer, "more_body": False})
        except Exception as error:
            if isinstance(error, S2Error):
                failure = error
            elif isinstance(error, WalstreamError):
                failure = from_walstream(error)
            else:
                log.exception("POST %s failed unexpectedly", path.decode("latin-1"))
                failure = S2Error(500, "other", "internal error; the server log has the details")
            status = failure.status
            request = Request(scope, receive, send, app.max_body_bytes, app.deadlines)
            request.body_done = done
            await app.answer_error(request, failure)
        self.taken += 1
        app.count_request("POST", ROUTE, status)
        return True

    def _authorized(self, given: bytes | None) -> bool:
        scheme, _, token = (given or b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(
            token.strip(), self.app.token_bytes
        )


def _media_type(value: bytes | None) -> str:
    """:func:`~walstream.server.s2.wire.media_type` of a header as sent (JSON at once)."""
    if value == b"application/json":
        return "application/json"
    return media_type(None if value is None else value.decode("latin-1"))
