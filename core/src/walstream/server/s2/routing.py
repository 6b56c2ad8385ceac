"""Any node serves any stream: which node a stream request goes to.

Placement rule: a stream is written by the node that owns it in metadata. A stream without a
live owner (never written, released by a node that stopped or drained, or failed over) is
claimed by the first node that receives a write for it. A request for a stream owned by another
live node is forwarded to that node's advertised address (``node.advertise``) and its answer is
relayed (:mod:`walstream.server.s2.forward`). A read whose answer lies wholly in committed
data is answered here from object storage (:func:`walstream.server.s2.records.read_committed_here`);
other reads go to the owner, so that a read sees every acknowledged record and the tail the
writer reports. A stream nobody owns is read here, straight from object storage.

No answer is older than an acknowledged append: a node answers reads and tails of a stream it
writes from its own view only while it holds its lease (:attr:`walstream.Stream.owned_here`);
past its lease it may have been failed over, so the stream's owner is looked up afresh and the
request forwarded there, or refused with 503 ``unavailable`` when there is none to forward to.

A node is *live* when it is RUNNING, advertises an address, and its lease (when it holds one)
has not expired on the metadata store's clock. A forwarded request that reaches a node which
does not own its stream is answered 503 ``unavailable`` with a retry hint, never forwarded again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from walstream.errors import FencedError, InvalidArgument, StreamNotFound
from walstream.metadata.contract import MetadataStore, NodeInfo, NodeState
from walstream.records import parse_int_text
from walstream.server.s2 import records
from walstream.server.s2.errors import S2Error
from walstream.server.s2.forward import FORWARDED_HEADER, OwnerUnreachable, call, relay

if TYPE_CHECKING:
    from walstream.engine.client import Client
    from walstream.server.s2.app import S2App
    from walstream.server.s2.asgi import Request

__all__ = ["Owner", "Router", "cluster_route", "forward_if_elsewhere", "not_owner_here"]

#: How long a stream's owner, once looked up, is trusted before it is looked up again. A stale
#: owner costs one 503 (the old owner refuses a stream it no longer owns), never a wrong write.
OWNER_CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class Owner:
    """The other node that owns a stream, and where it is reached: ``address`` None when it is
    not live (lease expired, or being failed over) and nobody may serve the stream until it is
    failed over (its WAL may hold acknowledged records no other node can read yet)."""

    node_id: int
    address: str | None


class Router:
    """Looks up, and briefly remembers, which other live node owns a stream."""

    def __init__(self, client: Client, cache_s: float = OWNER_CACHE_S) -> None:
        self.client = client
        self.cache_s = cache_s
        self._owners: dict[int, tuple[float, Owner]] = {}
        self.forwarded = 0
        """Requests relayed to another node (for tests and metrics)."""
        self.served_committed = 0
        """Reads of streams other nodes write answered here from committed data."""

    def rebind(self, client: Client) -> None:
        """Look owners up through ``client`` from now on (a rejoined node's new epoch); what
        was remembered through the old client is dropped."""
        self.client = client
        self._owners.clear()

    def forget(self, stream_id: int) -> None:
        """Drop what is remembered about ``stream_id``'s owner (it did not answer)."""
        self._owners.pop(stream_id, None)

    async def owner_elsewhere(self, stream_id: int, *, fresh: bool = False) -> Owner | None:
        """The other node that owns ``stream_id``, or None when this node may serve it: it owns
        it, nobody owns it, its owner stopped or was failed over (it released its streams), or
        its owner is RUNNING but advertises no address (reads here see what is committed;
        writes are refused by the claim)."""
        now = time.monotonic()
        remembered = self._owners.get(stream_id)
        if remembered is not None and not fresh and remembered[0] > now:
            return remembered[1]
        self._owners.pop(stream_id, None)
        metadata = self.client.metadata
        info = (await metadata.get_streams([stream_id])).get(stream_id)
        owner_id = None if info is None else info.owner_node_id
        if owner_id is None or owner_id == self.client.node_id:
            return None
        node = await metadata.get_node(owner_id)
        if node is None or node.state in (NodeState.STOPPED, NodeState.FAILED_OVER):
            return None
        if node.state is not NodeState.RUNNING or await _lease_expired(metadata, node):
            return Owner(owner_id, None)
        address = _advertised(node)
        if address is None:
            return None
        owner = Owner(owner_id, address)
        self._owners[stream_id] = (now + self.cache_s, owner)
        return owner


def _advertised(node: NodeInfo) -> str | None:
    """The node's advertised base URL (None when it advertises none)."""
    return node.address or None


async def _lease_expired(metadata: MetadataStore, node: NodeInfo) -> bool:
    """True when the node holds a lease that has expired on the store's clock. A RUNNING node
    with no lease yet (it registered and has not renewed, or runs without heartbeats) counts as
    reachable: if it is gone, forwarding fails fast with 503 and the client retries."""
    if node.lease_expires_ms <= 0:
        return False
    return not node.live(await metadata.store_time_ms())


def not_owner_here(owner: Owner | None, node_id: int, *, forwarded: bool = False) -> S2Error:
    """503 for a stream request this node cannot serve: it was forwarded here on a stale view of
    who owns the stream, or the stream's owner is not live yet not failed over."""
    if forwarded:
        where = "another node" if owner is None else f"node {owner.node_id} at {owner.address}"
        message = (
            f"node {node_id} does not own this stream ({where} does) and does not forward a "
            "forwarded request again; retry, the next attempt is routed afresh"
        )
    else:
        message = (
            f"node {node_id} cannot write this stream: another node owns it and is not "
            "reachable (not live, or not failed over yet); retry shortly"
        )
    return S2Error(503, "unavailable", message)


async def forward_if_elsewhere(app: S2App, request: Request, basin: str, name: str) -> bool:
    """Relay ``request`` to the owner of stream ``name`` when another live node owns it (True);
    False when this node serves it. A forwarded request for a stream owned elsewhere is 503."""
    try:
        stream = await app.open_stream(name)
    except StreamNotFound:
        return False  # this node answers 404, or creates it on append
    if stream.owned_here:
        return False
    # A stream this node claimed but can no longer vouch for (it lost its lease or was fenced:
    # it may have been failed over) is looked up afresh: forwarded to its new owner, else
    # refused by the engine (503) rather than answered from a view that may be stale.
    owner = await app.router.owner_elsewhere(stream.stream_id, fresh=stream.writing)
    if owner is None:
        return False
    if (
        request.method == "GET"
        and request.segments[-1] == "records"
        and not stream.writing  # its view here is what it claimed, not what is committed
        and await records.read_committed_here(app, request, stream)
    ):
        app.router.served_committed += 1
        return True
    if owner.address is None:
        raise S2Error(
            503,
            "unavailable",
            f"the stream's owner, node {owner.node_id}, is not live (its lease expired or it is "
            "being failed over); its acknowledged records are served once it is failed over, "
            "retry shortly",
        )
    if request.header(FORWARDED_HEADER) is not None:
        raise not_owner_here(owner, app.client.node_id, forwarded=True)
    try:
        await relay(
            request,
            owner.address,
            owner_id=owner.node_id,
            from_node_id=app.client.node_id,
            basin=basin,
            header_timeout_s=app.max_wait_s + app.limits.body_timeout_s + 10.0,
        )
    except OwnerUnreachable:
        app.router.forget(stream.stream_id)
        raise
    if request.status == 503:
        app.router.forget(stream.stream_id)  # draining, or it no longer owns the stream
    app.router.forwarded += 1
    return True


# -- moving a stream: POST /cluster/v1/streams/{id}/move?to=NODE and .../claim -------------------


async def cluster_route(app: S2App, request: Request, parts: list[str]) -> None:
    """``POST /cluster/v1/streams/{id}/move?to=NODE`` (sent to any node: the owner uploads
    what it holds for the stream, releases it, and the target claims it before the owner lets
    held appends go) and ``POST /cluster/v1/streams/{id}/claim`` (the target's half)."""
    if len(parts) != 4 or parts[:2] != ["v1", "streams"] or parts[3] not in ("move", "claim"):
        raise S2Error(404, "bad_path", "no such cluster route")
    if request.method != "POST":
        raise S2Error(405, "bad_path", f"method {request.method} is not allowed on this route")
    try:
        stream_id = parse_int_text(parts[2], "stream id")
        to = parse_int_text(request.query.get("to", str(app.client.node_id)), "to")
    except InvalidArgument as error:
        raise S2Error(400, "bad_query", str(error)) from None
    client = app.client
    if parts[3] == "claim":
        stream = await client.claim_stream(stream_id)
        app.router.forget(stream_id)
        return await request.respond_json(200, _moved(stream_id, client.node_id))
    stream = await client.open_stream(stream_id)
    owner = None if stream.writing else await app.router.owner_elsewhere(stream_id, fresh=True)
    if owner is not None:
        if owner.address is None or request.header(FORWARDED_HEADER) is not None:
            raise not_owner_here(owner, client.node_id, forwarded=owner.address is not None)
        await relay(
            request,
            owner.address,
            owner_id=owner.node_id,
            from_node_id=client.node_id,
            basin="",
            header_timeout_s=60.0,
        )
        return None
    if to == client.node_id:
        await client.claim_stream(stream_id)
        return await request.respond_json(200, _moved(stream_id, to))
    target = await client.metadata.get_node(to)
    address = None if target is None else _advertised(target)
    if target is None or target.state is not NodeState.RUNNING or address is None:
        raise S2Error(
            422,
            "invalid",
            f"node {to} is not a running node with an advertised address (node.advertise); "
            "`walstream cluster status` lists the nodes",
        )
    headers = {FORWARDED_HEADER: str(client.node_id)}
    if app.token is not None:
        headers["authorization"] = f"Bearer {app.token}"

    async def handoff() -> None:
        status, body = await call(
            address, "POST", f"/cluster/v1/streams/{stream_id}/claim", headers
        )
        if status != 200:
            raise FencedError(
                f"node {to} did not claim stream {stream_id} ({status}: "
                f"{body.decode('utf-8', 'replace')[:200]}); the stream is released, the next "
                "node that writes it claims it"
            )

    if not await client.release_stream(stream_id, handoff):
        await handoff()  # nobody writes it here: the target claims it directly
    app.router.forget(stream_id)
    await request.respond_json(200, _moved(stream_id, to))


def _moved(stream_id: int, owner: int) -> dict[str, int]:
    return {"stream_id": stream_id, "owner_node_id": owner}
