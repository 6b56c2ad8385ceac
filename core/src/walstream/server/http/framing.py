"""Bytes the native listener writes on its own: status lines, the ``Date`` header, and the
answers it gives without the application (refusals and malformed requests, in S2's error
shape ``{"code", "message"}``, each closing the connection)."""

from __future__ import annotations

import email.utils
import http
import time

from walstream.server.s2.errors import S2Error

__all__ = ["LINGER_S", "PREFACE", "date_line", "error_answer", "status_line"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""The HTTP/2 client connection preface (RFC 9113 3.4): a connection that opens with it speaks
HTTP/2 with prior knowledge."""
#: After the listener closes a connection (HTTP/1.1 or HTTP/2) it reads (and drops) what the
#: client still sends for at most this long, so the kernel does not answer it with a reset that
#: would destroy the last answer before the client read it.
LINGER_S = 2.0

_REASONS = {status.value: status.phrase.encode("latin-1") for status in http.HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}
_date_second = -1
_date_line = b""


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` (cached per status)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 999:
            raise ValueError(f"an HTTP status is 100 to 999, got {status!r}")
        line = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))
        _STATUS_LINES[status] = line
    return line


def date_line() -> bytes:
    """``date: <IMF-fixdate>\\r\\n`` of this second (RFC 9110 5.6.7: an origin server with a
    clock sends it), formatted once per second."""
    global _date_second, _date_line
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_line = b"date: %s\r\n" % email.utils.formatdate(now, usegmt=True).encode("ascii")
    return _date_line


def error_answer(status: int, code: str, message: str, *, retry_after: bool = False) -> bytes:
    """A whole HTTP/1.1 answer with S2's error body that tells the client the connection
    closes (the listener closes it after writing this)."""
    body = S2Error(status, code, message).encoded()
    retry = b"retry-after-ms: 1000\r\n" if retry_after else b""
    return (
        status_line(status)
        + b"content-type: application/json\r\n"
        + retry
        + b"content-length: %d\r\nconnection: close\r\n" % len(body)
        + date_line()
        + b"\r\n"
        + body
    )
