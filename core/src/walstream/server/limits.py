"""Bounds that keep a slow, greedy or hostile client from holding the node's connections, tasks,
CPU and memory: :class:`ServerLimits` (the ``server:`` section of a deployment), and the TLS
settings (:class:`TlsSettings`, ``server.tls``).

The HTTP stack (:mod:`walstream.server.http`) keeps the connection bounds (in all and per remote
address), the request-head and send timeouts, the output budgets and the HTTP/2 reset and
control-frame budgets; the application (:mod:`walstream.server.s2`) the body size, the body
timeout and the long-poll bounds. ``docs/architecture/http.md`` lists each bound with what it
protects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from walstream.errors import ConfigError

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_LONG_POLLS",
    "DEFAULT_MAX_WAIT_S",
    "RESET_WINDOW_S",
    "ServerLimits",
    "TlsSettings",
    "limits_from_section",
]

DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_WAIT_S = 60.0
#: A connection must deliver a complete request head within this many seconds of opening (or of
#: its previous response, which also bounds an idle keep-alive connection); else it is closed.
DEFAULT_HEADER_TIMEOUT_S = 15.0
#: A request body must arrive completely within this many seconds of its head; else 408.
DEFAULT_BODY_TIMEOUT_S = 60.0
#: Connections open at once; past it an idle keep-alive connection is closed to make room, and
#: when none is idle the new one is answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 512
#: Connections one remote address may hold open at once (node-to-node requests are exempt).
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 64
#: Reads with ``wait > 0`` in progress at once; one more is answered 429.
DEFAULT_MAX_LONG_POLLS = 256
#: ... and per remote address (node-to-node requests are exempt).
DEFAULT_MAX_LONG_POLLS_PER_ADDRESS = 64
#: An answer that makes no progress (the client takes none of its bytes: a zero flow-control
#: window, a full socket) this long is abandoned: its stream is reset, or its HTTP/1.1
#: connection closed, and its work cancelled.
DEFAULT_SEND_TIMEOUT_S = 30.0
#: Bytes of answers built and not yet taken by the client, per connection and in all.
DEFAULT_MAX_CONNECTION_OUTPUT_BYTES = 4 << 20
DEFAULT_MAX_OUTPUT_BYTES = 64 << 20
#: HTTP/2 streams reset (by the client, or by the server for the client's fault) per
#: :data:`RESET_WINDOW_S`, per connection and per remote address.
DEFAULT_MAX_RESETS_PER_CONNECTION = 100
DEFAULT_MAX_RESETS_PER_ADDRESS = 400
#: HTTP/2 PING, SETTINGS and PRIORITY frames a connection may send per :data:`RESET_WINDOW_S`.
DEFAULT_MAX_CONTROL_FRAMES = 1000
#: The window over which the reset and control-frame budgets refill (a token bucket: the whole
#: budget comes back over this many seconds).
RESET_WINDOW_S = 10.0
#: Smallest per-connection output budget: one largest S2 read answer (1 MiB) must fit.
_MIN_CONNECTION_OUTPUT_BYTES = 1 << 20


@dataclass(frozen=True)
class TlsSettings:
    """``server.tls``: serve HTTPS (HTTP/1.1 and HTTP/2, chosen by ALPN) instead of cleartext."""

    certificate: Path
    """PEM certificate chain of the server (its own certificate first)."""
    key: Path
    """PEM private key of the certificate."""
    client_ca: Path | None = None
    """PEM CA bundle: when set, every client must present a certificate it signed (mutual
    TLS); when unset, clients are not asked for one."""

    def __post_init__(self) -> None:
        for name in ("certificate", "key", "client_ca"):
            value = getattr(self, name)
            if value is None:
                continue
            if not Path(value).is_file():
                raise ConfigError(f"server.tls.{name}: no file at {value}")


@dataclass(frozen=True)
class ServerLimits:
    """Bounds that keep a slow or hostile client from holding the node's connections, tasks and
    memory (the ``server:`` section of a deployment; ``docs/architecture/http.md``)."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """A connection that has not sent a complete request head this long after it opened (or
    after its previous response: the idle keep-alive bound too) is closed."""
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    """A request body not complete this long after its head gets 408 and the connection closes."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections open at once; past it the longest-idle keep-alive connection is closed for
    the new one, and when none is idle the new one gets 503 ``BackendUnavailable``."""
    max_connections_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    """Connections one remote address may hold; one more gets 503 unless its first request
    carries node credentials (``WALSTREAM_CLUSTER_SECRET``)."""
    max_long_polls: int = DEFAULT_MAX_LONG_POLLS
    """Reads with ``wait > 0`` in progress at once; one more gets 429 ``rate_limited``."""
    max_long_polls_per_address: int = DEFAULT_MAX_LONG_POLLS_PER_ADDRESS
    """... and per remote address (node-to-node requests are exempt)."""
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    """An answer the client takes nothing of for this long is abandoned (stream reset or
    connection closed, its work cancelled)."""
    max_connection_output_bytes: int = DEFAULT_MAX_CONNECTION_OUTPUT_BYTES
    """Bytes of answers built and not yet taken by the client, per connection (a read waits for
    room before it reads)."""
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    """... and for the whole server."""
    max_resets_per_connection: int = DEFAULT_MAX_RESETS_PER_CONNECTION
    """HTTP/2 streams reset per 10 s on one connection; one more: GOAWAY ENHANCE_YOUR_CALM."""
    max_resets_per_address: int = DEFAULT_MAX_RESETS_PER_ADDRESS
    """... and over all connections of one remote address (its new connections are refused
    until the budget refills)."""
    max_control_frames: int = DEFAULT_MAX_CONTROL_FRAMES
    """HTTP/2 PING, SETTINGS and PRIORITY frames per 10 s on one connection; one more: GOAWAY
    ENHANCE_YOUR_CALM."""
    tls: TlsSettings | None = None
    """Serve HTTPS with this certificate (None: cleartext HTTP/1.1 and h2c)."""

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "send_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name}: expected a positive number of seconds, got {value!r}")
        for name in (
            "max_connections",
            "max_connections_per_address",
            "max_long_polls",
            "max_long_polls_per_address",
            "max_resets_per_connection",
            "max_resets_per_address",
            "max_control_frames",
            "max_connection_output_bytes",
            "max_output_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
        if self.max_connection_output_bytes < _MIN_CONNECTION_OUTPUT_BYTES:
            raise ConfigError(
                "max_connection_output_bytes: expected at least 1MiB (one largest read answer "
                f"must fit), got {self.max_connection_output_bytes!r}"
            )
        if self.max_output_bytes < self.max_connection_output_bytes:
            raise ConfigError(
                "max_output_bytes: expected at least max_connection_output_bytes "
                f"({self.max_connection_output_bytes}), got {self.max_output_bytes!r}"
            )


def tls_from_section(section: Any) -> TlsSettings | None:
    """The :class:`TlsSettings` of ``server.tls`` (None when unset)."""
    if section is None:
        return None
    if isinstance(section, TlsSettings):
        return section
    if not isinstance(section, Mapping):
        raise ConfigError(
            "server.tls: expected a mapping {certificate: PATH, key: PATH, client_ca: PATH}, "
            f"got {section!r}"
        )
    if not section.get("certificate") or not section.get("key"):
        raise ConfigError("server.tls: needs both certificate and key (PEM file paths)")
    client_ca = section.get("client_ca")
    return TlsSettings(
        certificate=Path(section["certificate"]),
        key=Path(section["key"]),
        client_ca=None if not client_ca else Path(client_ca),
    )


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
        max_connections_per_address=pick(
            "max_connections_per_address", DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
        ),
        max_long_polls=pick("max_long_polls", DEFAULT_MAX_LONG_POLLS),
        max_long_polls_per_address=pick(
            "max_long_polls_per_address", DEFAULT_MAX_LONG_POLLS_PER_ADDRESS
        ),
        send_timeout_s=pick("send_timeout", DEFAULT_SEND_TIMEOUT_S),
        max_connection_output_bytes=pick(
            "max_connection_output", DEFAULT_MAX_CONNECTION_OUTPUT_BYTES
        ),
        max_output_bytes=pick("max_output", DEFAULT_MAX_OUTPUT_BYTES),
        max_resets_per_connection=pick(
            "max_resets_per_connection", DEFAULT_MAX_RESETS_PER_CONNECTION
        ),
        max_resets_per_address=pick("max_resets_per_address", DEFAULT_MAX_RESETS_PER_ADDRESS),
        max_control_frames=pick("max_control_frames", DEFAULT_MAX_CONTROL_FRAMES),
        tls=tls_from_section(server_section.get("tls")),
    )
