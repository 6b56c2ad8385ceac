"""What several routes share: the list query and the answer to a method a route does not take."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from walstream.errors import InvalidArgument
from walstream.records import parse_int_text
from walstream.server.s2.errors import S2Error

if TYPE_CHECKING:
    from walstream.server.s2.request import Request

__all__ = [
    "MAX_LIST",
    "MAX_REQUEST_TOKEN_BYTES",
    "CreationToken",
    "creation_token",
    "list_query",
    "not_allowed",
]

MAX_LIST = 1000
"""The most items of a list answer (basins, streams)."""


MAX_REQUEST_TOKEN_BYTES = 36
"""S2's bound of an ``s2-request-token``."""


@dataclass(frozen=True, slots=True)
class CreationToken:
    """The ``s2-request-token`` of a create: a retry with the same token and the same config is
    the same create."""

    token: str

    def digest(self, config: Any) -> str:
        """What a resource created with this token keeps: SHA-256 of the token and the config
        as JSON with sorted keys, each preceded by its length (never the token itself)."""
        parts = [self.token.encode("utf-8"), json.dumps(config, sort_keys=True).encode("utf-8")]
        hashed = hashlib.sha256()
        for part in parts:
            hashed.update(len(part).to_bytes(8, "big"))
            hashed.update(part)
        return hashed.hexdigest()


def creation_token(request: Request) -> CreationToken | None:
    """The request's ``s2-request-token`` (400 ``bad_header`` over 36 bytes), None without."""
    value = request.header("s2-request-token")
    if value is None:
        return None
    if len(value.encode("latin-1")) > MAX_REQUEST_TOKEN_BYTES:
        raise S2Error(
            400,
            "bad_header",
            f"s2-request-token has at most {MAX_REQUEST_TOKEN_BYTES} bytes",
        )
    return CreationToken(value)


def not_allowed(method: str) -> S2Error:
    return S2Error(405, "bad_path", f"method {method} is not allowed on this route")


def list_query(request: Request) -> tuple[str, str, int]:
    """``prefix``, ``start_after`` and ``limit`` (1 to :data:`MAX_LIST`) of a list request."""
    query = request.query
    limit = MAX_LIST
    if "limit" in query:
        try:
            limit = parse_int_text(query["limit"], "limit")
        except InvalidArgument as error:
            raise S2Error(400, "bad_query", str(error)) from None
        limit = min(max(limit, 1), MAX_LIST)
    return query.get("prefix", ""), query.get("start_after", ""), limit
