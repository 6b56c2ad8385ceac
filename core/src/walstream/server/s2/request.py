"""The request of one HTTP exchange, over ASGI: its path segments, query and headers, its body
read under the size and time bounds, and the ways to answer it. Independent of the HTTP server
that runs the application.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, unquote

from walstream.server.s2.compression import (
    THRESHOLD_BYTES,
    Coding,
    answer_coding,
    compress,
    decompress,
    request_coding,
)
from walstream.server.s2.errors import S2Error

#: The HTTP stack's scope extension for reserving output room
#: (:data:`walstream.server.http.request_body.OUTPUT_ROOM`).
OUTPUT_ROOM = "walstream.output_room"

__all__ = [
    "BodyDeadlines",
    "Receive",
    "Request",
    "Scope",
    "Send",
    "json_bytes",
    "json_object",
    "lifespan",
    "read_body",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = b"application/json"


def json_bytes(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


class BodyDeadlines:
    """Bounds the time each request's body takes to arrive, for all requests with one timer.

    A reader calls :meth:`begin` before it awaits the body and :meth:`end` as soon as it has
    it (in the same step of its task, with no await between the last read and ``end``). A sweep
    every ``timeout_s / 8`` (at most 1 s) cancels the tasks still reading past their deadline;
    :meth:`end` then says the deadline passed and the reader answers 408. So a body is cut at
    ``timeout_s`` to ``timeout_s * 1.125`` (or + 1 s). Per request this is two dict operations,
    where an ``asyncio.timeout`` (a timer armed and cancelled per request) costs ten times more
    on the append hot path.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._sweep_s = min(1.0, timeout_s / 8)
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def begin(self) -> asyncio.Task[Any]:
        """Start the clock for the current task's body read; returns the task for :meth:`end`."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a request body is read inside a task")
        loop = task.get_loop()
        self._reading[task] = loop.time() + self.timeout_s
        if self._timer is None:
            self._timer = loop.call_later(self._sweep_s, self._sweep, loop)
        return task

    def end(self, task: asyncio.Task[Any]) -> bool:
        """Stop the clock; True when the deadline passed and the task was cancelled for it (the
        caller has caught that cancellation: it is withdrawn here)."""
        self._reading.pop(task, None)
        if task in self._expired:
            self._expired.discard(task)
            task.uncancel()
            return True
        return False

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        late = [task for task, deadline in self._reading.items() if deadline <= now]
        for task in late:
            del self._reading[task]
            if task.cancel():
                self._expired.add(task)
        self._timer = loop.call_later(self._sweep_s, self._sweep, loop) if self._reading else None


class Request:
    """One HTTP request and its answer (exactly one ``respond`` or one ``start``/``write``...)."""

    __slots__ = (
        "body_done",
        "client_host",
        "deadlines",
        "error",
        "headers",
        "http_version",
        "max_body_bytes",
        "method",
        "node_id",
        "output_room",
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
        deadlines: BodyDeadlines,
    ) -> None:
        self.method: str = scope["method"]
        self.http_version: str = scope.get("http_version", "1.1")
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
        self.deadlines = deadlines
        self.started = False
        self.status = 0
        self.body_done = False
        client = scope.get("client")
        self.client_host: str = str(client[0]) if client else ""
        """The remote address (bounds per address: long polls)."""
        self.node_id: int | None = None
        """The node that signed this request (node credentials), else None."""
        extensions = scope.get("extensions")
        self.output_room: Callable[[int], Awaitable[int]] | None = (
            None if not extensions else extensions.get(OUTPUT_ROOM)
        )

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    async def reserve_output(self, want: int) -> int:
        """Reserve room for an answer of about ``want`` bytes before building it (the HTTP
        stack's output budgets: answers built and not yet taken by clients); returns what may be
        built (``want`` when the server keeps no budget). 503 when no room came within
        ``server.send_timeout``."""
        room = self.output_room
        if room is None:
            return want
        try:
            return await room(want)
        except TimeoutError as busy:
            raise S2Error(
                503, "unavailable", str(busy) or "no output room; retry shortly"
            ) from None

    async def body(self) -> bytes:
        """The whole request body: 413 over ``max_body_bytes``, 408 when it does not arrive
        within the body timeout (``server.body_timeout``)."""
        declared = self.headers.get("content-length")
        length = int(declared) if declared is not None and declared.isdigit() else None
        if length is not None and length > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        coding = request_coding(self.headers.get("content-encoding"))
        data = await read_body(
            self.receive, self.deadlines, self.max_body_bytes, self._set_body_done, length
        )
        # A compressed body is bounded twice: as sent, and once decompressed.
        return decompress(data, coding, self.max_body_bytes)

    def _set_body_done(self) -> None:
        self.body_done = True

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

    async def disconnected(self) -> None:
        """Returns when the client is gone (reading and dropping any body meanwhile): the
        ASGI server says ``http.disconnect``."""
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.body_done = True
                return

    async def drain(self, limit_s: float = 5.0) -> None:
        """Read and drop the rest of the body (for at most ``limit_s`` seconds)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(limit_s, self.deadlines.timeout_s)
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
        if len(body) >= THRESHOLD_BYTES:
            coding = answer_coding(self.headers.get("accept-encoding"))
            if coding is not Coding.NONE:
                body = compress(body, coding)
                extra = [*extra, (b"content-encoding", coding.token), (b"vary", b"accept-encoding")]
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


async def read_body(
    receive: Receive,
    deadlines: BodyDeadlines,
    max_body_bytes: int,
    on_done: Callable[[], None],
    declared: int | None = None,
) -> bytes:
    """The whole body from ASGI ``receive`` (``on_done`` is called once its last message was
    read): 413 over ``max_body_bytes``, 408 past the deadline, 499 when the client left.

    ``declared``: the request's ``Content-Length``. The HTTP server enforces it (a body that
    ends short or runs long is a broken request, never handed on as complete), so the body is
    complete once that many bytes arrived: the read stops there instead of waiting for the
    server's end-of-body message (granian sends it as a second message, one more round trip
    between its thread and the event loop on every request)."""
    chunks: list[bytes] = []
    size = 0
    task = deadlines.begin()
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                on_done()
                raise S2Error(499, "client_hangup", "the client closed the request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_body_bytes:
                raise _too_large(max_body_bytes)
            chunks.append(chunk)
            if size == declared or not message.get("more_body", False):
                on_done()
                break
    except asyncio.CancelledError:
        if deadlines.end(task):
            raise S2Error(
                408,
                "request_timeout",
                f"the request body did not arrive within {deadlines.timeout_s:g} s "
                "(server.body_timeout)",
            ) from None
        raise
    finally:
        # No await between the last read and here: a sweep cannot cancel the task meanwhile.
        deadlines.end(task)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


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


async def lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge ASGI lifespan events (the node is opened and closed around the server)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def json_object(request: Request, allow_empty: bool = False) -> dict[str, Any]:
    """The body as a JSON object (422 otherwise); ``{}`` for no body when ``allow_empty``."""
    if allow_empty and not has_body(request):
        return {}
    document = await request.json()
    if document is None and allow_empty:
        return {}
    if not isinstance(document, dict):
        raise S2Error(422, "invalid", "the body must be a JSON object")
    return document


def has_body(request: Request) -> bool:
    """True when the request has a body (a PUT may come without one)."""
    length = request.header("content-length")
    if length is not None:
        return length not in ("0", "")
    return (
        request.header("content-type") is not None
        or request.header("transfer-encoding") is not None
    )
