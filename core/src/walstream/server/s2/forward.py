"""Relaying one S2 request to the node that owns its stream (HTTP/1.1 over the standard
library's asyncio streams, one connection per forwarded request).

The forwarded request carries :data:`FORWARDED_HEADER` (the forwarding node's id) and, with a
cluster secret, the node's signature (:mod:`walstream.server.node_auth`; the owner refuses a
forwarded request without a valid one): a node never forwards such a request again, so a disagreement between nodes about who owns a stream ends in
a 503 with a retry hint instead of a loop. The owner's answer is relayed as it comes (status,
headers but the hop-by-hop ones, the body piece by piece), so long polls, SSE and S2S sessions
work through any node. A request body is streamed to the owner while its answer is relayed.

Failures before the owner could have seen the request (no connection) are 503 ``unavailable``
with a retry hint: a client may safely retry them. A connection that breaks after the request
was sent is 504 ``upstream_timeout`` (the append may or may not have happened; S2 clients retry
with ``match_seq_num``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import urlsplit

from walstream.server.node_auth import NODE_AUTH_HEADER, NodeCredentials
from walstream.server.s2.errors import S2Error
from walstream.server.s2.request import Request

__all__ = ["FORWARDED_HEADER", "OwnerUnreachable", "call", "relay"]

FORWARDED_HEADER = "s2-walstream-forwarded"
"""Set on a forwarded request to the id of the node that forwarded it (the loop guard)."""

#: Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus those the
#: relay sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
        "http2-settings",
    }
)
_CONNECT_TIMEOUT_S = 5.0
_CHUNK = 64 * 1024


class OwnerUnreachable(S2Error):
    """503 ``unavailable``: the owner could not be reached; the request was not sent."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "unavailable", message)


async def relay(
    request: Request,
    address: str,
    *,
    owner_id: int,
    from_node_id: int,
    basin: str,
    header_timeout_s: float,
    credentials: NodeCredentials | None = None,
) -> None:
    """Send ``request`` to the node at ``address`` (its advertised base URL) and answer with
    what it answers. Raises :class:`OwnerUnreachable` when no connection could be made, and
    :class:`S2Error` 504 when the owner's answer did not arrive (``header_timeout_s``) or broke
    before its headers; once the answer began, a break ends the relayed answer early."""
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OwnerUnreachable(
            f"node {owner_id} advertises {address!r}, not an http(s) URL; set its node.advertise"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(_CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(
                parts.hostname,
                port,
                ssl=ssl.create_default_context() if parts.scheme == "https" else None,
            )
    except (OSError, TimeoutError) as failure:
        raise OwnerUnreachable(
            f"the stream is owned by node {owner_id} at {address}, which cannot be reached "
            f"({failure or type(failure).__name__}); retry shortly (it fails over once its lease "
            "expires)"
        ) from None
    pump: asyncio.Task[None] | None = None
    try:
        head, streamed = _request_head(request, parts.netloc, basin, from_node_id, credentials)
        writer.write(head)
        if streamed:
            pump = asyncio.ensure_future(_pump_body(request, writer, chunked=streamed == "chunked"))
        else:
            await writer.drain()
        try:
            async with asyncio.timeout(header_timeout_s):
                status, headers = await _read_head(reader)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as failure:
            raise S2Error(
                504,
                "upstream_timeout",
                f"node {owner_id} at {address} did not answer the forwarded request "
                f"({failure or type(failure).__name__}); it may or may not have been applied, "
                "retry with match_seq_num",
            ) from None
        await _relay_answer(request, reader, status, headers)
    finally:
        if pump is not None and not pump.done():
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _request_head(
    request: Request,
    netloc: str,
    basin: str,
    from_node_id: int,
    credentials: NodeCredentials | None = None,
) -> tuple[bytes, str]:
    """The request line and headers, and how the body goes: "" none, "length", "chunked"."""
    lines = [f"{request.method} {request.target} HTTP/1.1", f"host: {netloc}"]
    for name, value in request.headers.items():
        if (
            name not in _HOP_BY_HOP
            and not name.startswith(":")
            and name != FORWARDED_HEADER
            and name != NODE_AUTH_HEADER
        ):
            lines.append(f"{name}: {value}")
    if credentials is not None:
        lines.append(f"{NODE_AUTH_HEADER}: {credentials.sign(request.method, request.target)}")
    if "s2-basin" not in request.headers:
        lines.append(f"s2-basin: {basin}")  # the basin may have come from the Host header
    lines.append(f"{FORWARDED_HEADER}: {from_node_id}")
    lines.append("connection: close")
    length = request.headers.get("content-length")
    if request.body_done:
        streamed = ""
        lines.append("content-length: 0")
    elif length is not None and length.isdigit():
        streamed = "length" if int(length) else ""
        lines.append(f"content-length: {int(length)}")
    elif request.method in ("GET", "HEAD", "DELETE") and "transfer-encoding" not in request.headers:
        streamed = ""
    else:
        streamed = "chunked"
        lines.append("transfer-encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), streamed


async def _pump_body(request: Request, writer: asyncio.StreamWriter, chunked: bool) -> None:
    """Copy the request body to the owner as it arrives (S2S sessions stream it)."""
    with contextlib.suppress(OSError):
        while (chunk := await request.chunk()) is not None:
            if not chunk:
                continue
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]]]:
    """The status and headers of the owner's answer (a 1xx interim answer is skipped)."""
    while True:
        status_line = (await reader.readuntil(b"\r\n")).decode("latin-1")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x answer: {status_line.strip()!r}")
        status = int(rest.split(" ", 1)[0])
        headers: list[tuple[str, str]] = []
        while (line := (await reader.readuntil(b"\r\n")).decode("latin-1")) != "\r\n":
            name, _, value = line.partition(":")
            headers.append((name.strip().lower(), value.strip()))
        if status >= 200:
            return status, headers


async def _relay_answer(
    request: Request, reader: asyncio.StreamReader, status: int, headers: list[tuple[str, str]]
) -> None:
    by_name = dict(headers)
    request.started = True
    request.status = status
    await request.send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in headers
                if name not in _HOP_BY_HOP or name == "content-length"
            ],
        }
    )
    with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
        if by_name.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    break
                data = await reader.readexactly(size)
                await reader.readexactly(2)
                await request.write(data)
        elif "content-length" in by_name:
            left = int(by_name["content-length"])
            while left > 0:
                data = await reader.read(min(left, _CHUNK))
                if not data:
                    break
                left -= len(data)
                await request.write(data)
        else:
            while data := await reader.read(_CHUNK):
                await request.write(data)
    await request.finish()


async def call(
    address: str,
    method: str,
    target: str,
    headers: dict[str, str],
    timeout_s: float = 30.0,
    credentials: NodeCredentials | None = None,
) -> tuple[int, bytes]:
    """One small request without a body to the node at ``address`` (signed with
    ``credentials`` when given): (status, body). Raises :class:`OwnerUnreachable` when it
    cannot be reached, TimeoutError past ``timeout_s``."""
    if credentials is not None:
        headers = {**headers, **credentials.headers(method, target)}
    parts = urlsplit(address)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(_CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(
                parts.hostname,
                port,
                ssl=ssl.create_default_context() if parts.scheme == "https" else None,
            )
    except (OSError, TimeoutError) as failure:
        raise OwnerUnreachable(f"node at {address} cannot be reached ({failure})") from None
    try:
        lines = [f"{method} {target} HTTP/1.1", f"host: {parts.netloc}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines += ["content-length: 0", "connection: close"]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        async with asyncio.timeout(timeout_s):
            status, answer_headers = await _read_head(reader)
            length = dict(answer_headers).get("content-length")
            body = await (reader.readexactly(int(length)) if length else reader.read())
        return status, body
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
