"""Node credentials: how the nodes of a cluster prove to each other that a request comes from a
node, not from a client.

Every node of a cluster is given the same secret in the environment variable
:data:`SECRET_ENVIRONMENT_VARIABLE` (``WALSTREAM_CLUSTER_SECRET``, at least 16 bytes). A node
signs each request it forwards to another node, and each internal request (``/cluster/...``), with
the header :data:`NODE_AUTH_HEADER`::

    s2-walstream-node-auth: v1 node=<sending node id> ts=<unix ms> sig=<hex HMAC-SHA256>

over ``v1``, the method, the request target (path and query), the timestamp and the node id. A
receiving node accepts it when the signature matches and the timestamp is within
:data:`REPLAY_WINDOW_S` of its own clock (either way: the nodes' clocks may differ by that much),
so a captured header cannot be replayed later, nor on another route. The signature does not cover
the body (it is streamed); TLS between the nodes (``server.tls``) keeps it intact in transit.

What holds (``docs/guides/security.md``):

1. With a secret, a request carrying the forwarding header (``s2-walstream-forwarded``) or asking
   for an internal route is refused (401) unless it carries a valid node signature, whatever
   bearer token it holds; the service token alone opens no internal route.
2. Without a secret, node-to-node requests are not authenticated: the forwarding header is
   honoured as sent and internal routes take the service token (the behaviour before node
   credentials). ``walstream serve`` logs a warning for a cluster without one.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Mapping

from walstream.errors import ConfigError

__all__ = [
    "NODE_AUTH_HEADER",
    "REPLAY_WINDOW_S",
    "SECRET_ENVIRONMENT_VARIABLE",
    "NodeCredentials",
    "credentials_from_environment",
]

SECRET_ENVIRONMENT_VARIABLE = "WALSTREAM_CLUSTER_SECRET"
NODE_AUTH_HEADER = "s2-walstream-node-auth"
_NODE_AUTH_HEADER_BYTES = NODE_AUTH_HEADER.encode("ascii")
#: A signature is accepted this long before and after its timestamp (by the receiver's clock).
REPLAY_WINDOW_S = 30.0
#: Shortest secret accepted, in bytes.
MIN_SECRET_BYTES = 16


class NodeCredentials:
    """The cluster secret of this node: signs outgoing node-to-node requests and checks incoming
    ones (see the module's docstring). ``clock`` returns Unix seconds (the wall clock: the
    nodes' clocks are compared)."""

    __slots__ = ("_key", "clock", "node_id")

    def __init__(
        self, secret: str | bytes, node_id: int, clock: Callable[[], float] = time.time
    ) -> None:
        key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        if len(key) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"{SECRET_ENVIRONMENT_VARIABLE}: the cluster secret must be at least "
                f"{MIN_SECRET_BYTES} bytes (got {len(key)}); generate one with "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'` and give every "
                "node the same"
            )
        self._key = key
        self.node_id = node_id
        self.clock = clock

    def _mac(self, method: str, target: str, timestamp_ms: int, node_id: int) -> str:
        message = f"v1\n{method.upper()}\n{target}\n{timestamp_ms}\n{node_id}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def sign(self, method: str, target: str) -> str:
        """The :data:`NODE_AUTH_HEADER` value for a request ``method target`` sent now."""
        timestamp_ms = int(self.clock() * 1000)
        mac = self._mac(method, target, timestamp_ms, self.node_id)
        return f"v1 node={self.node_id} ts={timestamp_ms} sig={mac}"

    def headers(self, method: str, target: str) -> dict[str, str]:
        return {NODE_AUTH_HEADER: self.sign(method, target)}

    def verify(self, method: str, target: str, value: str | bytes | None) -> int | None:
        """The id of the node that signed ``method target`` with ``value`` (the header's value),
        or None when it is missing, malformed, wrong or outside the replay window."""
        if value is None:
            return None
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                return None
        fields: dict[str, str] = {}
        version, _, rest = value.strip().partition(" ")
        if version != "v1":
            return None
        for part in rest.split():
            name, _, field = part.partition("=")
            fields[name] = field
        node, stamp, mac = fields.get("node", ""), fields.get("ts", ""), fields.get("sig", "")
        if not (node.isdigit() and stamp.isdigit() and len(mac) == 64):
            return None
        timestamp_ms, node_id = int(stamp), int(node)
        if abs(self.clock() * 1000 - timestamp_ms) > REPLAY_WINDOW_S * 1000:
            return None
        if not hmac.compare_digest(mac, self._mac(method, target, timestamp_ms, node_id)):
            return None
        return node_id

    def verify_headers(
        self, method: str, target: str, headers: Iterable[tuple[bytes, bytes]]
    ) -> int | None:
        """:meth:`verify` with the header looked up in an ASGI header list."""
        for name, value in headers:
            if name == _NODE_AUTH_HEADER_BYTES:
                return self.verify(method, target, value)
        return None


def credentials_from_environment(
    environ: Mapping[str, str], node_id: int
) -> NodeCredentials | None:
    """The node's credentials from ``WALSTREAM_CLUSTER_SECRET`` (None when it is unset or
    empty); a secret that is too short is a ConfigError."""
    secret = environ.get(SECRET_ENVIRONMENT_VARIABLE)
    if not secret:
        return None
    return NodeCredentials(secret, node_id)
