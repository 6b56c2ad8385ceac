"""``/v1/streams``: list, create, get, ensure, reconfigure and delete streams, and the records
routes below a stream (:mod:`walstream.server.s2.routes.records`); a request for a stream another
live node owns is relayed there (:mod:`walstream.server.s2.forwarding`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from walstream.errors import FencedError, InvalidArgument, StreamExists, StreamNotFound
from walstream.server.s2.errors import S2Error
from walstream.server.s2.forwarding import forward_if_elsewhere
from walstream.server.s2.model import (
    check_stream_config,
    rfc3339,
    s2_prefix,
    s2_stream_name,
    stream_config_json,
    walstream_stream_name,
)
from walstream.server.s2.request import json_object
from walstream.server.s2.routes.common import creation_token, list_query, not_allowed
from walstream.server.s2.routes.records import check_tail, records_route

if TYPE_CHECKING:
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = ["streams_route"]


async def streams_route(app: S2Context, request: Request, method: str, rest: list[str]) -> None:
    basin = await app.basin_of(request)
    if not rest:
        if method == "GET":
            return await _list_streams(app, request, basin)
        if method == "POST":
            body = await json_object(request)
            stream = body.get("stream")
            if not isinstance(stream, str):
                raise S2Error(422, "invalid", "stream: expected the stream name (a string)")
            check_stream_config(body.get("config"))
            name = walstream_stream_name(basin, stream)
            token = creation_token(request)
            digest = None if token is None else token.digest(body.get("config"))
            try:
                created = await app.client.create_stream(name)
            except StreamExists:
                # A retry of the same create (same token and config) answers as the first did.
                existing = await app.open_stream(name)
                if digest is None or app.creation_tokens.get(existing.stream_id) != digest:
                    raise
            else:
                if digest is not None:
                    app.remember_creation(created.stream_id, digest)
            return await request.respond_json(201, await _stream_info(app, basin, name))
        raise not_allowed(method)
    name = walstream_stream_name(basin, rest[0])
    if await forward_if_elsewhere(app, request, basin, name):
        return None
    if app.stopping.is_set() and method == "POST" and rest[1:] == ["records"]:
        # Draining: what is acknowledged gets uploaded and the streams released; a client
        # retries elsewhere (or here until the stream is claimed by another node).
        raise S2Error(
            503,
            "server_draining",
            f"node {app.client.node_id} is shutting down; retry on another node",
        )
    try:
        return await _stream_route(app, request, method, basin, name, rest)
    except FencedError:
        await app.refused_claim(name)
        raise


async def _stream_route(
    app: S2Context, request: Request, method: str, basin: str, name: str, rest: list[str]
) -> None:
    if len(rest) == 2 and rest[1] == "records":
        return await records_route(app, request, basin, name)
    if len(rest) == 3 and rest[1:] == ["records", "tail"] and method == "GET":
        return await check_tail(app, request, basin, name)
    if len(rest) != 1:
        raise S2Error(404, "bad_path", "no such stream route")
    if method == "GET":
        await app.open_stream(name)
        return await request.respond_json(200, stream_config_json())
    if method == "PUT":
        body = await json_object(request, allow_empty=True)
        check_stream_config(body)
        try:
            await app.open_stream(name)
            result, status = b"noop", 200
        except StreamNotFound:
            await app.client.create_stream(name)
            result, status = b"created", 201
        return await request.respond_json(
            status,
            await _stream_info(app, basin, name),
            headers=[(b"s2-provision-result", result)],
        )
    if method == "PATCH":
        check_stream_config(await json_object(request, allow_empty=True))
        await app.open_stream(name)
        return await request.respond_json(200, stream_config_json())
    if method == "DELETE":
        stream = await app.open_stream(name)
        await app.client.delete_stream(stream.stream_id)
        app.stream_ids.pop(name, None)
        app.creation_tokens.pop(stream.stream_id, None)
        return await request.respond(202)
    raise not_allowed(method)


async def _list_streams(app: S2Context, request: Request, basin: str) -> None:
    prefix, start_after, limit = list_query(request)
    infos = await app.client.list_streams(prefix=s2_prefix(basin, prefix))
    named: list[tuple[str, int]] = []
    for info in sorted(infos, key=lambda found: found.name or ""):
        if info.name is None:
            continue
        try:
            named.append((s2_stream_name(basin, info.name), info.created_ms))
        except InvalidArgument:
            continue  # a name from before the name rule: it has no S2 name
    # The encoding keeps UTF-8 byte order, which is the order of the decoded names too.
    chosen = [item for item in named if item[0] > start_after]
    cipher = await app.stream_cipher(basin, "")
    await request.respond_json(
        200,
        {
            "streams": [
                {
                    "name": name,
                    "created_at": rfc3339(created),
                    "deleted_at": None,
                    "cipher": None if cipher is None else cipher.value,
                }
                for name, created in chosen[:limit]
            ],
            "has_more": len(chosen) > limit,
        },
    )


async def _stream_info(app: S2Context, basin: str, name: str) -> dict[str, Any]:
    info = await app.client.metadata.get_stream(name)
    app.stream_ids[name] = info.stream_id
    cipher = await app.stream_cipher(basin, name)
    return {
        "name": s2_stream_name(basin, name),
        "created_at": rfc3339(info.created_ms),
        "deleted_at": None,
        "cipher": None if cipher is None else cipher.value,
    }
