"""What several routes share: the list query and the answer to a method a route does not take."""

from __future__ import annotations

from typing import TYPE_CHECKING

from walstream.errors import InvalidArgument
from walstream.records import parse_int_text
from walstream.server.s2.errors import S2Error

if TYPE_CHECKING:
    from walstream.server.s2.request import Request

__all__ = ["MAX_LIST", "list_query", "not_allowed"]

MAX_LIST = 1000
"""The most items of a list answer (basins, streams)."""


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
