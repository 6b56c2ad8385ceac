"""Relaying a stream request to the node that owns it, when another live node does (see
:mod:`walstream.server.s2.routing` for the placement rule)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from walstream.errors import StreamNotFound
from walstream.server.s2.errors import S2Error
from walstream.server.s2.forward import FORWARDED_HEADER, OwnerUnreachable, relay
from walstream.server.s2.reads import read_committed_here
from walstream.server.s2.routing import not_owner_here

if TYPE_CHECKING:
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = ["forward_if_elsewhere"]


async def forward_if_elsewhere(app: S2Context, request: Request, basin: str, name: str) -> bool:
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
        and await read_committed_here(app, request, stream)
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
            credentials=app.node_credentials,
        )
    except OwnerUnreachable:
        app.router.forget(stream.stream_id)
        raise
    if request.status == 503:
        app.router.forget(stream.stream_id)  # draining, or it no longer owns the stream
    app.router.forwarded += 1
    return True
