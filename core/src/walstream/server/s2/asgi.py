"""A small ASGI toolkit: the request of one HTTP exchange (path segments, query, headers, a body
read under the size and time bounds) and the ways to answer it. Independent of the ASGI server
that runs the application (:mod:`walstream.server.serve` runs granian or hypercorn).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, unquote

from walstream.server.s2.errors import S2Error

__all__ = ["Receive", "Request", "Scope", "Send", "json_bytes"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = b"application/json"


def json_bytes(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


class Request:
    """One HTTP request and its answer (exactly one ``respond`` or one ``start``/``write``...)."""

    __slots__ = (
        "body_done",
        "body_timeout_s",
        "error",
        "headers",
        "max_body_bytes",
        "method",
        "query",
        "receive",
        "segments",
        "send",
        "started",
        "status",
        "target",
    )

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        max_body_bytes: int,
        body_timeout_s: float,
    ) -> None:
        self.method: str = scope["method"]
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        path = raw_path.split(b"?", 1)[0].decode("latin-1")
        query_string: bytes = scope.get("query_string", b"")
        self.target = path + ("?" + query_string.decode("latin-1") if query_string else "")
        """The request target as sent (path and query, still percent-encoded)."""
        self.error: S2Error | None = None
        """Why the path or query cannot be read (raised when the request is dispatched)."""
        self.segments: list[str] = []
        self.query: dict[str, str] = {}
        try:
            # Split before unquoting: an S2 stream name may hold an encoded '/'.
            self.segments = [unquote(part, errors="strict") for part in path.split("/") if part]
            self.query = _query(scope.get("query_string", b""))
        except UnicodeDecodeError:
            self.error = S2Error(400, "bad_path", "the path is not valid UTF-8 once decoded")
        except S2Error as error:
            self.error = error
        self.headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", ())
        }
        self.receive = receive
        self.send = send
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.started = False
        self.status = 0
        self.body_done = False

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    async def body(self) -> bytes:
        """The whole request body: 413 over ``max_body_bytes``, 408 when it does not arrive
        within ``body_timeout_s``."""
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        try:
            # One timer for the whole body (not one per message: this is the hot path).
            async with asyncio.timeout(self.body_timeout_s):
                while not self.body_done:
                    message = await self.receive()
                    if message["type"] == "http.disconnect":
                        raise S2Error(499, "client_hangup", "the client closed the request")
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise _too_large(self.max_body_bytes)
                    chunks.append(chunk)
                    self.body_done = not message.get("more_body", False)
        except TimeoutError:
            raise S2Error(
                408,
                "request_timeout",
                f"the request body did not arrive within {self.body_timeout_s:g} s "
                "(server.body_timeout)",
            ) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def chunk(self) -> bytes | None:
        """The next piece of a streaming body (None at its end or when the client left)."""
        if self.body_done:
            return None
        message = await self.receive()
        if message["type"] == "http.disconnect":
            self.body_done = True
            return None
        self.body_done = not message.get("more_body", False)
        return bytes(message.get("body", b""))

    async def drain(self, limit_s: float = 5.0) -> None:
        """Read and drop the rest of the body (for at most ``limit_s`` seconds)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(limit_s, self.body_timeout_s)
        while not self.body_done:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                message = await asyncio.wait_for(self.receive(), remaining)
            except TimeoutError:
                return
            if message["type"] == "http.disconnect":
                self.body_done = True
                return
            self.body_done = not message.get("more_body", False)

    async def json(self) -> Any:
        data = await self.body()
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise S2Error(400, "bad_json", "the body is not valid JSON") from None

    async def respond(
        self,
        status: int,
        body: bytes = b"",
        content_type: bytes = _JSON,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        extra = headers or []
        await self.start(status, content_type, [*extra, (b"content-length", b"%d" % len(body))])
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    async def respond_json(
        self, status: int, document: Any, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        await self.respond(status, json_bytes(document), headers=headers)

    async def start(
        self, status: int, content_type: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.started = True
        self.status = status
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", content_type), *(headers or [])],
            }
        )

    async def write(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def finish(self) -> None:
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})


def _too_large(limit: int) -> S2Error:
    return S2Error(
        413,
        "invalid",
        f"the request body is over {limit} bytes (server.max_body_bytes); send less at once",
    )


def _query(raw: bytes) -> dict[str, str]:
    try:
        pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise S2Error(400, "bad_query", "the query string is not valid UTF-8") from None
    query: dict[str, str] = {}
    for name, value in pairs:
        if name in query:
            raise S2Error(400, "bad_query", f"query parameter {name!r} is given twice")
        query[name] = value
    return query
