"""Bounds that keep a slow or greedy client from holding the node's connections, tasks and
memory: :class:`ServerLimits` (the ``server:`` section of a deployment) and the listener's
connection guard, which enforces the connection bound and the request-head timeout before
aiohttp sees a byte. The body timeout and the long-poll bound are enforced by the routes
(:mod:`walstream.server.app`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from walstream.errors import ConfigError
from walstream.server.codec import canned_response, internal_error_json, refusal_json

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_LONG_POLLS",
    "DEFAULT_MAX_WAIT_S",
    "LINGERING_S",
    "REFUSED_LINGER_S",
    "ConnectionGuard",
    "ServerLimits",
    "limits_from_section",
]

log = logging.getLogger(__name__)

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
#: How long a refused connection may still send before it is closed (so the client reads the
#: 503 instead of a reset).
REFUSED_LINGER_S = 1.0


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


# -- connections --------------------------------------------------------------------------------


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
            body = internal_error_json()
        else:
            detail = " ".join(str(message or exc or "").split())[:300]
            log.info("refused a malformed HTTP request (%d): %s", status, detail)
            body = refusal_json(
                "InvalidArgument" if status == 400 else f"HTTP{status}",
                f"malformed HTTP request: {detail}",
            )
        response = web.json_response(body, status=status)
        response.force_close()
        return response


class ConnectionGuard:
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
        return canned_response(
            503,
            "Service Unavailable",
            refusal_json(
                "BackendUnavailable",
                f"this server already has {self.open} connections open "
                "(server.max_connections); retry later or raise the bound",
            ),
        )

    def head_timeout(self) -> bytes:
        return canned_response(
            408,
            "Request Timeout",
            refusal_json(
                "RequestTimeout",
                f"no complete request head within {self.limits.header_timeout_s:g} s "
                "(server.header_timeout); the connection is closed",
            ),
        )


class _GuardedConnection(asyncio.Protocol):
    """One connection: refused over the bound, else handed to aiohttp's handler, and closed
    when its first request head does not arrive within ``header_timeout``."""

    def __init__(self, guard: ConnectionGuard) -> None:
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
