"""Moving a stream between nodes: ``POST /cluster/v1/streams/{id}/move?to=NODE`` and
``POST /cluster/v1/streams/{id}/claim``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from walstream.errors import FencedError, InvalidArgument
from walstream.metadata.contract import NodeState
from walstream.records import parse_int_text
from walstream.server.s2 import routing
from walstream.server.s2.errors import S2Error
from walstream.server.s2.forward import FORWARDED_HEADER, call, relay
from walstream.server.s2.routing import not_owner_here

if TYPE_CHECKING:
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = ["cluster_route"]


async def cluster_route(app: S2Context, request: Request, parts: list[str]) -> None:
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
            credentials=app.node_credentials,
        )
        return None
    if to == client.node_id:
        await client.claim_stream(stream_id)
        return await request.respond_json(200, _moved(stream_id, to))
    target = await client.metadata.get_node(to)
    address = None if target is None else routing.advertised(target)
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
            address,
            "POST",
            f"/cluster/v1/streams/{stream_id}/claim",
            headers,
            credentials=app.node_credentials,
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
