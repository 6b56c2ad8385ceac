"""Bounds that keep a slow or greedy client from holding the node's connections, tasks and
memory: :class:`ServerLimits` (the ``server:`` section of a deployment). The listener
(:mod:`walstream.server.hosting_granian` or :mod:`walstream.server.hosting`) enforces the connection bound and the request-head timeout;
the application (:mod:`walstream.server.s2`) the body size, the body timeout and the long-poll
bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from walstream.errors import ConfigError

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_LONG_POLLS",
    "DEFAULT_MAX_WAIT_S",
    "ServerLimits",
    "limits_from_section",
]

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


@dataclass(frozen=True)
class ServerLimits:
    """Bounds that keep a slow or greedy client from holding the node's connections, tasks and
    memory (the ``server:`` section of a deployment; docs/guides/http.md)."""

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
