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
    stream_changes,
    stream_config_json,
    walstream_stream_name,
)
from walstream.server.s2.request import json_object
from walstream.server.s2.routes.common import creation_token, list_query, not_allowed
from walstream.server.s2.routes.records import check_tail, records_route

if TYPE_CHECKING:
    from walstream.engine.client import Stream
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request
    from walstream.stream_config import StreamConfig

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
            given = check_stream_config(body.get("config"))
            name = walstream_stream_name(basin, stream)
            token = creation_token(request)
            digest = None if token is None else token.digest(body.get("config"))
            config = await app.new_stream_config(basin, given)
            try:
                await app.client.create_stream(name, config=config, creation_token=digest)
            except StreamExists:
                # A retry of the same create (same token and config) answers as the first did;
                # the token is kept with the stream, so this holds across restarts and nodes.
                existing = await app.client.metadata.get_stream(name)
                if digest is None or existing.creation_token != digest:
                    raise
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
        stream = await app.open_stream(name)
        info = await app.client.metadata.get_stream(stream.stream_id)
        return await request.respond_json(200, stream_config_json(info.config))
    if method == "PUT":
        given = check_stream_config(await json_object(request, allow_empty=True))
        try:
            stream = await app.open_stream(name)
        except StreamNotFound:
            try:
                config = await app.new_stream_config(basin, given)
                await app.client.create_stream(name, config=config)
                result, status = b"created", 201
            except StreamExists:  # created meanwhile: ensure it as below
                stream = await app.open_stream(name)
                result, status = b"", 200
        else:
            result, status = b"", 200
        if not result:
            before = (await app.client.metadata.get_stream(name)).config
            changes = stream_changes({k: v for k, v in given.items() if v is not None})
            after = before.with_changes(changes) if changes else before
            if stream_config_json(after) == stream_config_json(before):
                result = b"noop"  # the same in S2's terms (an unset storage class is express)
            else:
                await _reconfigure(app, stream, changes)
                result = b"updated"
        return await request.respond_json(
            status,
            await _stream_info(app, basin, name),
            headers=[(b"s2-provision-result", result)],
        )
    if method == "PATCH":
        changes = stream_changes(check_stream_config(await json_object(request, allow_empty=True)))
        stream = await app.open_stream(name)
        return await request.respond_json(
            200, stream_config_json(await _reconfigure(app, stream, changes))
        )
    if method == "DELETE":
        stream = await app.open_stream(name)
        await app.client.delete_stream(stream.stream_id)
        app.stream_ids.pop(name, None)
        return await request.respond(202)
    raise not_allowed(method)


async def _reconfigure(app: S2Context, stream: Stream, changes: dict[str, Any]) -> StreamConfig:
    """Apply a reconfiguration's changes (422 for what the engine refuses)."""
    if not changes:
        return (await app.client.metadata.get_stream(stream.stream_id)).config
    try:
        return await stream.reconfigure(**changes)
    except InvalidArgument as error:
        raise S2Error(422, "invalid", str(error)) from None


async def _list_streams(app: S2Context, request: Request, basin: str) -> None:
    prefix, start_after, limit = list_query(request)
    # One keyset page of the basin's names (the encoding keeps UTF-8 byte order, which is the
    # order of the decoded names too), one more than asked to learn whether more follow; a
    # stream named before the name rule has no S2 name and is skipped, so a page that held
    # one reads on.
    walstream_prefix = s2_prefix(basin, prefix)
    after: str = s2_prefix(basin, start_after) if start_after else ""
    named: list[tuple[str, int, str | None]] = []
    more = False
    while len(named) <= limit:
        want = limit + 1 - len(named)
        infos = await app.client.list_streams(walstream_prefix, after, want)
        for info in infos:
            assert info.name is not None  # a prefix query lists named streams only
            try:
                named.append(
                    (s2_stream_name(basin, info.name), info.created_ms, info.config.cipher)
                )
            except InvalidArgument:
                continue  # a name from before the name rule: it has no S2 name
        if len(infos) < want:
            break
        after = infos[-1].name or ""
    if len(named) > limit:
        more = True
        named = named[:limit]
    await request.respond_json(
        200,
        {
            "streams": [
                {
                    "name": name,
                    "created_at": rfc3339(created),
                    "deleted_at": None,
                    "cipher": cipher,
                }
                for name, created, cipher in named
            ],
            "has_more": more,
        },
    )


async def _stream_info(app: S2Context, basin: str, name: str) -> dict[str, Any]:
    info = await app.client.metadata.get_stream(name)
    app.stream_ids[name] = info.stream_id
    return {
        "name": s2_stream_name(basin, name),
        "created_at": rfc3339(info.created_ms),
        "deleted_at": None,
        "cipher": info.config.cipher,
    }
