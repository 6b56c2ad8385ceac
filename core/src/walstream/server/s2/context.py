"""What every route of the S2 service shares: the node's client, the server's bounds and token,
the caches of basins and stream ids, the fences in progress, the owner lookups, and the answers
common to all routes (errors, request counts, refusals of streams written elsewhere).

:class:`S2Context` is the state of :class:`walstream.server.s2.app.S2App` (which adds the ASGI
entry and the route tree on top). The routes, the sessions and the hot path of unary appends
(:mod:`walstream.server.s2.fast_append`) take a context and nothing above it, so no module of
the service imports the application back.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from walstream.encryption import Cipher, EncryptionKey
from walstream.errors import ConfigError, InvalidArgument, StreamExists, StreamNotFound
from walstream.metadata.rules import check_basin_name
from walstream.records import check_text
from walstream.server.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WAIT_S, ServerLimits
from walstream.server.s2.errors import S2Error
from walstream.server.s2.lru import Lru
from walstream.server.s2.model import ROOT_BASIN, new_stream_config, stream_changes
from walstream.server.s2.request import BodyDeadlines, Request
from walstream.server.s2.routing import Router, not_owner_here
from walstream.stream_config import StreamConfig

if TYPE_CHECKING:
    from walstream.engine.client import Client, Stream
    from walstream.server.node_auth import NodeCredentials

__all__ = ["CIPHER_HEADER", "S2Context"]

CIPHER_HEADER = "walstream-encryption-cipher"
"""A request's cipher, for a stream whose basin names none (walstream's own header)."""

log = logging.getLogger("walstream.server.s2.app")


class S2Context:
    """The state and the shared answers of the S2 service over one started client (the caller
    closes the client)."""

    def __init__(
        self,
        client: Client,
        *,
        token: str | None = None,
        render_metrics: Callable[[], str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        limits: ServerLimits | None = None,
        node_credentials: NodeCredentials | None = None,
    ) -> None:
        self.client = client
        self.node_credentials = node_credentials
        """The cluster secret (``WALSTREAM_CLUSTER_SECRET``): signs what this node forwards and
        is required of forwarded and internal requests (None: not configured)."""
        self.token = token or None
        self.token_bytes = b"" if self.token is None else _token_bytes(self.token)
        self.render_metrics = render_metrics
        self.max_body_bytes = max_body_bytes
        self.max_wait_s = max_wait_s
        self.limits = limits or ServerLimits()
        self.deadlines = BodyDeadlines(self.limits.body_timeout_s)
        """Bounds the time every request body takes to arrive (``server.body_timeout``)."""
        self.long_polls = 0
        """Reads that wait (``wait > 0``, SSE and S2S sessions) in progress."""
        self.long_polls_by_address: dict[str, int] = {}
        """... per remote address (node-to-node requests are not counted)."""
        self.stopping = asyncio.Event()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.basins: dict[str, dict[str, Any]] = {}
        """Basins known to exist: name -> stored config (a cache; deletes go through here)."""
        self.stream_ids: Lru[str, int] = Lru()
        """walstream stream name -> id, so the hot path opens streams without a metadata query
        (the most recently used :data:`~walstream.server.s2.lru.STREAM_CACHE_ENTRIES`)."""
        self.fences: dict[int, asyncio.Future[None]] = {}
        """stream id -> a fence command in progress (appends wait for its token)."""
        self.tail_timestamps: Lru[int, tuple[int, int]] = Lru()
        """stream id -> (tail, timestamp of the record before it), as last seen."""
        self.router = Router(client)
        """Which other node owns a stream (requests for it are forwarded there)."""
        self.rejoins = 0
        """Times :meth:`replace_client` swapped in a new client (a fenced node rejoined)."""

    def now_ms(self) -> int:
        """The node's clock (arrival times of records, heartbeats)."""
        return self.client.clock.now_ms()

    def replace_client(self, client: Client) -> Client:
        """Serve ``client`` from now on and return the one it replaces (the caller closes it).

        Used when the served client was fenced and a new epoch of the same node was opened.
        Requests that start after this call use ``client``; requests in progress finish (or
        fail fenced) on the old one. Caches that describe the old epoch are dropped."""
        old = self.client
        self.client = client
        self.router.rebind(client)
        self.tail_timestamps.clear()
        self.rejoins += 1
        return old

    @contextmanager
    def long_poll(self, request: Request | None = None) -> Iterator[None]:
        """Count one waiting read (429 ``rate_limited`` over ``server.max_long_polls``, or over
        ``server.max_long_polls_per_address`` for the request's remote address; a request signed
        by a node is not counted per address): each holds a connection and a task, so a crowd of
        pollers cannot take the node's memory."""
        if self.long_polls >= self.limits.max_long_polls:
            raise S2Error(
                429,
                "rate_limited",
                f"{self.long_polls} waiting reads are already in progress "
                "(server.max_long_polls); retry later, read without wait, or raise the bound",
            )
        host = "" if request is None or request.node_id is not None else request.client_host
        by_address = self.long_polls_by_address
        if host:
            held = by_address.get(host, 0)
            if held >= self.limits.max_long_polls_per_address:
                raise S2Error(
                    429,
                    "rate_limited",
                    f"this address already has {held} waiting reads in progress "
                    "(server.max_long_polls_per_address); retry later or read without wait",
                )
            by_address[host] = held + 1
        self.long_polls += 1
        try:
            yield
        finally:
            self.long_polls -= 1
            if host:
                left = by_address[host] - 1
                if left:
                    by_address[host] = left
                else:
                    del by_address[host]

    async def unless_stopping(
        self, work: asyncio.Future[Any], *others: asyncio.Future[Any]
    ) -> bool:
        """Wait for ``work``, or cancel it when shutdown begins or one of ``others`` is done;
        True when it finished."""
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            done, _ = await asyncio.wait(
                {work, stopping, *others}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
            if not work.done():
                work.cancel()
                with suppress(asyncio.CancelledError):
                    await work
        return work in done

    def begin_shutdown(self) -> None:
        """Answer waiting reads now and end sessions (shutdown began; /health says stopping)."""
        self.stopping.set()

    # -- answers ------------------------------------------------------------------------------

    def count_request(self, method: str, route: str, status: int) -> None:
        """Count one answered request for ``/metrics``."""
        key = (method, route, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    async def answer_error(self, request: Request, error: S2Error) -> None:
        """Answer ``error`` (unless a streaming answer began: then it is reported in-band)."""
        if error.status >= 500:
            log.warning("%s failed: %s %s", request.method, error.code, error.message)
        if request.started:
            return  # a streaming answer already began: the session code reports in-band
        # Read what is left of the body first: an HTTP/2 answer that ends its stream while
        # the client still sends data makes some clients drop the whole connection. Not after a
        # 408: that body did not come in time, and waiting longer for it only delays the answer.
        if error.status != 408:
            await request.drain()
        headers: list[tuple[bytes, bytes]] = []
        if error.status in (429, 503):
            headers.append((b"retry-after-ms", b"1000"))
        if error.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="walstream"'))
        if error.status == 408 and request.http_version.startswith("1"):
            # The rest of the body may still come: the connection cannot carry another request
            # (HTTP/2 ends just this stream; it has no Connection header).
            headers.append((b"connection", b"close"))
        await request.respond(error.status, error.encoded(), headers=headers)

    def check_token(self, request: Request) -> None:
        """401 unless the request carries the server's bearer token (when it has one)."""
        if self.token is None:
            return
        scheme, _, given = (request.header("authorization") or "").partition(" ")
        given_bytes = given.strip().encode("latin-1")
        if scheme.lower() == "bearer" and hmac.compare_digest(given_bytes, self.token_bytes):
            return
        raise S2Error(
            401,
            "authn",
            "wrong bearer token"
            if scheme.lower() == "bearer"
            else "this server needs a token: send the header 'Authorization: Bearer <token>'",
        )

    async def refused_claim(self, name: str) -> None:
        """After a FencedError on stream ``name``: when this node does not write it, its claim
        was refused (another node took it meanwhile, or its owner is not reachable yet) and the
        answer is 503 with where it went (a retry is routed afresh); else the caller re-raises
        (this node's writer was fenced)."""
        stream = await self.open_stream(name)
        if stream.writing:
            return
        owner = await self.router.owner_elsewhere(stream.stream_id, fresh=True)
        raise not_owner_here(owner, self.client.node_id) from None

    # -- basins and streams -------------------------------------------------------------------

    async def basin_config(self, name: str) -> dict[str, Any]:
        """The stored config of basin ``name`` (404 ``basin_not_found`` if there is none)."""
        if name == ROOT_BASIN:
            return {}
        config = self.basins.get(name)
        if config is None:
            config = (await self.client.metadata.get_basin(name)).config
            self.basins[name] = config
        return config

    async def basin_of(self, request: Request) -> str:
        """The basin a stream request addresses (``s2-basin`` header or ``{basin}.b.`` host)."""
        name = request.header("s2-basin")
        if name is None:
            host = (request.header("host") or request.header(":authority") or "").lower()
            label, _, rest = host.partition(".")
            if not rest.startswith("b."):
                raise S2Error(
                    400,
                    "bad_header",
                    "name the basin with the s2-basin header (or a host {basin}.b.<domain>)",
                )
            name = label
        try:
            check_basin_name(name)
        except InvalidArgument as error:
            raise S2Error(400, "bad_header", str(error)) from None
        await self.basin_config(name)
        return name

    async def new_stream_config(self, basin: str, given: dict[str, Any]) -> StreamConfig:
        """The configuration of a stream created in ``basin`` through this API: ``given`` (a
        checked S2 ``StreamConfig``) over the basin's ``default_stream_config`` over S2's
        defaults, with the basin's ``stream_cipher`` (fixed for the stream's life). In the
        root basin (walstream's own streams) the deployment's ``streams:`` defaults stand for
        S2's, as for a stream created with the Python API or the CLI."""
        if basin == ROOT_BASIN:
            set_fields = {k: v for k, v in given.items() if v is not None}
            return self.client.config.streams.config.with_changes(stream_changes(set_fields))
        stored = await self.basin_config(basin)
        return new_stream_config(
            stored.get("default_stream_config", {}), given, stored.get("stream_cipher")
        )

    async def encryption_for(self, request: Request, stream: Stream) -> EncryptionKey | None:
        """The key of a request to ``stream`` (S2's ``EncryptionSpec::resolve``): None for
        a plaintext stream (a key sent is ignored); for an encrypted one (or a request naming
        its cipher in the walstream header :data:`CIPHER_HEADER`, which S2's SDKs do not send:
        walstream's CLI does, for streams of a basin without ``stream_cipher``), the
        ``s2-encryption-key`` header (base64 of 32 bytes), else 400 ``bad_header`` naming the
        stream's cipher. The key lives for the request only: it is never stored or logged."""
        configured = stream.config.cipher
        cipher = None if configured is None else Cipher(configured)
        chosen = request.header(CIPHER_HEADER)
        if chosen is not None:
            try:
                named = Cipher.named(chosen)
            except InvalidArgument as error:
                raise S2Error(400, "bad_header", f"{CIPHER_HEADER}: {error}") from None
            if cipher is not None and named is not cipher:
                raise S2Error(
                    400,
                    "bad_header",
                    f"{CIPHER_HEADER}: the stream's cipher is {cipher.value}, not {named.value}",
                )
            cipher = named
        if cipher is None:
            return None
        given = request.header("s2-encryption-key")
        if given is None or not given.strip():
            raise S2Error(
                400, "bad_header", f"missing encryption key for stream cipher '{cipher.value}'"
            )
        if len(given.strip()) > 44:
            raise S2Error(
                400,
                "bad_header",
                f"invalid encryption key for stream cipher '{cipher.value}': over 44 characters",
            )
        return EncryptionKey.from_base64(cipher, given)

    async def open_stream(self, name: str) -> Stream:
        """The stream named ``name`` (StreamNotFound if there is none), without a metadata
        query once its id is known."""
        stream_id = self.stream_ids.get(name)
        if stream_id is not None:
            try:
                return await self.client.open_stream(stream_id)
            except StreamNotFound:
                self.stream_ids.pop(name, None)  # deleted (perhaps made again under the name)
        stream = await self.client.open_stream(name)
        self.stream_ids[name] = stream.stream_id
        return stream

    async def open_for(self, basin: str, name: str, create_flag: str) -> Stream:
        """The stream, created first (with the basin's ``default_stream_config``) when the
        basin's ``create_flag`` config says so. Of creates racing on several nodes one makes
        it (the metadata store's names are unique) and the others open what it made."""
        try:
            return await self.open_stream(name)
        except StreamNotFound:
            if not (await self.basin_config(basin)).get(create_flag):
                raise
        config = await self.new_stream_config(basin, {})
        with suppress(StreamExists):
            await self.client.create_stream(name, config=config)
        return await self.open_stream(name)


def _token_bytes(token: str) -> bytes:
    try:
        return check_text(token, "server.token").encode("utf-8")
    except InvalidArgument as error:
        raise ConfigError(f"{error}; set a token of valid UTF-8 text") from None
