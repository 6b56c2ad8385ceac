"""The ASGI scope of an HTTP/2 request, from its decoded header list, checked as RFC 9113 8.2
and 8.3 require (``h2``'s own validation is off: it costs more than the rest of a request).

A malformed request (a pseudo-header missing, unknown, repeated or after a regular header; an
empty, upper-case or otherwise invalid name; a connection-specific header; ``te`` other than
``trailers``; a value holding CR, LF or NUL or starting or ending with a space or tab; a
``:path`` neither ``/...`` nor ``*``) raises :class:`Malformed` (the stream is reset with
``PROTOCOL_ERROR``). A header list over :data:`MAX_HEADER_LIST_BYTES` raises ``S2Error(431)``
and ``CONNECT`` ``S2Error(400)`` (answered in S2's error shape). ``:authority`` becomes a
``host`` header when the request has none (the application reads the basin from it)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

from walstream.server.http.http2_stream import CONNECTION_SPECIFIC
from walstream.server.s2.errors import S2Error

__all__ = ["MAX_HEADER_LIST_BYTES", "Malformed", "request_scope"]

#: Largest request header list (RFC 9113 6.5.2: names, values and 32 bytes per field), as the
#: HTTP/1.1 head; a larger one gets 431.
MAX_HEADER_LIST_BYTES = 64 * 1024

_METHODS = {
    method.encode(): method
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE")
}
#: Bytes a request header name may hold (RFC 9113 8.2.1: lower-case token characters).
_NAME_BYTES = bytes(
    c for c in range(0x21, 0x7F) if not 0x41 <= c <= 0x5A and c not in b'"(),/:;<=>?@[\\]{}'
)
_PSEUDO = {b":method": 0, b":scheme": 1, b":authority": 2, b":path": 3}
#: Request header names found valid (process-wide; forgotten all at once beyond the bound, so a
#: client cycling through names cannot grow the server's memory).
_CHECKED_NAMES: set[bytes] = set()
_MAX_CHECKED_NAMES = 1024
_MAX_CHECKED_NAME_BYTES = 64


class Malformed(Exception):
    """The request is malformed (RFC 9113 8.1.1): a stream error ``PROTOCOL_ERROR``."""


def request_scope(
    fields: list[Any],
    asgi: dict[str, str],
    server: tuple[str, int] | None,
    client: tuple[str, int] | None,
) -> dict[str, Any]:
    """The ASGI HTTP scope of a request's header list (see the module's docstring)."""
    pseudo: list[bytes | None] = [None, None, None, None]
    headers: list[tuple[bytes, bytes]] = []
    size = 32 * len(fields)
    host = False
    for name, value in fields:
        size += len(name) + len(value)
        slot = _PSEUDO.get(name)
        if slot is not None:
            if headers or pseudo[slot] is not None:
                raise Malformed(f"pseudo-header {name.decode()} repeated or late")
            pseudo[slot] = value
            continue
        if name not in _CHECKED_NAMES:
            _check_name(name, value)
        # (An int is found far faster than a one-byte bytes: 40 against 250 ns.)
        if 10 in value or 13 in value or 0 in value or value.strip(b" \t") != value:
            raise Malformed(f"the value of {name.decode()!r} holds CR, LF, NUL or edge spaces")
        if name == b"host":
            host = True
        headers.append((name, value))
    method, scheme, authority, path = pseudo
    if size > MAX_HEADER_LIST_BYTES:
        raise S2Error(431, "invalid", "the request's header list is over 64 KiB")
    if method is None:
        raise Malformed("no :method")
    if method == b"CONNECT":
        raise S2Error(400, "invalid", "CONNECT is not supported")
    if scheme is None or not path or not (path[:1] == b"/" or path == b"*"):
        raise Malformed("no :scheme, or no :path (or one that is neither /... nor *)")
    if authority is not None and not host:
        headers.append((b"host", authority))
    raw_path, _, query = path.partition(b"?")
    if b"%" in raw_path or not raw_path.isascii():
        decoded = unquote_to_bytes(raw_path).decode("utf-8", "replace")
    else:
        decoded = raw_path.decode("ascii")
    return {
        "type": "http",
        "asgi": asgi,
        "http_version": "2",
        "server": server,
        "client": client,
        "scheme": "http" if scheme == b"http" else scheme.decode("latin-1"),
        "method": _METHODS.get(method) or method.decode("latin-1"),
        "root_path": "",
        "path": decoded,
        "raw_path": raw_path,
        "query_string": query,
        "headers": headers,
    }


def _check_name(name: bytes, value: bytes) -> None:
    """Refuse a request header name HTTP/2 does not allow (RFC 9113 8.2.1, 8.2.2); a name
    found good is remembered (``te`` is checked with its value each time)."""
    if not name or name.translate(None, _NAME_BYTES):
        raise Malformed(f"header name {name[:40]!r} is not lower-case token characters")
    if name in CONNECTION_SPECIFIC:
        raise Malformed(f"connection-specific header {name.decode()!r}")
    if name == b"te":
        if value != b"trailers":
            raise Malformed("te other than trailers")
        return
    if len(name) > _MAX_CHECKED_NAME_BYTES:
        return  # checked each time: a long name is not remembered
    if len(_CHECKED_NAMES) >= _MAX_CHECKED_NAMES:
        _CHECKED_NAMES.clear()
    _CHECKED_NAMES.add(name)
