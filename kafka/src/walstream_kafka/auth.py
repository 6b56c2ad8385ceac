"""SASL/PLAIN with the server's token (SaslHandshake v1, SaslAuthenticate v0-v2).

When the server has a token (``--token``, ``WALSTREAM_TOKEN`` or ``server.token``), a
connection must authenticate before any request but ApiVersions and these two: the PLAIN
password must be the token (the user name is not checked; it shows in the log). A wrong
password is answered ``SASL_AUTHENTICATION_FAILED`` and the connection closes. Without a token
the handshake is answered ``ILLEGAL_SASL_STATE``: the server expects no authentication.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from walstream_kafka import codes
from walstream_kafka.wire import DecodedRequest

__all__ = ["handle_sasl_authenticate", "handle_sasl_handshake"]

log = logging.getLogger(__name__)

MECHANISMS = ("PLAIN",)


async def handle_sasl_handshake(session: Any, request: DecodedRequest) -> dict[str, Any]:
    mechanism = request.body.mechanism
    if session.broker.token is None:
        return {"error_code": codes.ILLEGAL_SASL_STATE, "mechanisms": []}
    if mechanism not in MECHANISMS:
        return {"error_code": codes.UNSUPPORTED_SASL_MECHANISM, "mechanisms": list(MECHANISMS)}
    session.sasl_mechanism = mechanism
    return {"error_code": codes.NONE, "mechanisms": list(MECHANISMS)}


async def handle_sasl_authenticate(session: Any, request: DecodedRequest) -> dict[str, Any]:
    token = session.broker.token
    if token is None or session.sasl_mechanism != "PLAIN":
        return {
            "error_code": codes.ILLEGAL_SASL_STATE,
            "error_message": "send SaslHandshake with mechanism PLAIN first",
            "auth_bytes": b"",
            "session_lifetime": 0,
        }
    parts = bytes(request.body.auth_bytes).split(b"\0")
    password = parts[2] if len(parts) == 3 else b""
    if hmac.compare_digest(password, token.encode()):
        session.authenticated = True
        return {
            "error_code": codes.NONE,
            "error_message": None,
            "auth_bytes": b"",
            "session_lifetime": 0,
        }
    user = parts[1].decode("utf-8", "replace")[:64] if len(parts) == 3 else "?"
    log.warning("kafka: SASL/PLAIN authentication of user %r from %s failed", user, session.peer)
    return {
        "error_code": codes.SASL_AUTHENTICATION_FAILED,
        "error_message": "authentication failed: the password must be the server's token",
        "auth_bytes": b"",
        "session_lifetime": 0,
    }
