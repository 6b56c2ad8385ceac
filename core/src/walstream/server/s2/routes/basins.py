"""``/v1/basins``: list, create, get, ensure, reconfigure and delete basins.

A create that carries ``s2-request-token`` is idempotent (S2's ``CreateOnly { request_token }``):
the basin keeps a digest of the token and the config it was created with, and a create of the
same name with the same token and config answers 201 ``s2-provision-result: noop`` with the
basin, where any other create of a taken name answers 409.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from walstream.errors import BasinExists, BasinNotFound, InvalidArgument
from walstream.metadata.rules import check_basin_name
from walstream.server.s2.errors import S2Error
from walstream.server.s2.model import (
    CREATION_TOKEN_KEY,
    ROOT_BASIN,
    basin_config_json,
    check_basin_config,
    reconfigure_basin,
    rfc3339,
    same_basin_config,
)
from walstream.server.s2.request import json_object
from walstream.server.s2.routes.common import creation_token, list_query, not_allowed

if TYPE_CHECKING:
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = ["basins_route"]


async def basins_route(app: S2Context, request: Request, method: str, rest: list[str]) -> None:
    if not rest:
        if method == "GET":
            return await _list_basins(app, request)
        if method == "POST":
            return await _create_basin(app, request)
        raise not_allowed(method)
    if len(rest) != 1:
        raise S2Error(404, "bad_path", "no such basin route")
    name = _basin_name(rest[0], status=400)
    if method == "GET":
        config = await app.basin_config(name)
        return await request.respond_json(200, basin_config_json(config))
    if method == "PUT":
        body = await json_object(request, allow_empty=True)
        return await _ensure_basin(app, request, name, check_basin_config(body.get("config")))
    if method == "PATCH":
        changes = await json_object(request, allow_empty=True)
        if name == ROOT_BASIN:
            if reconfigure_basin({}, changes) != {}:
                raise _root_basin_fixed()
            return await request.respond_json(200, basin_config_json({}))
        stored = (await app.client.metadata.get_basin(name)).config
        updated = reconfigure_basin(stored, changes)
        if updated != stored:
            stored = (await app.client.metadata.update_basin_config(name, updated)).config
        app.basins[name] = stored
        return await request.respond_json(200, basin_config_json(stored))
    if method == "DELETE":
        if name == ROOT_BASIN:
            raise S2Error(
                403,
                "permission_denied",
                f"basin {ROOT_BASIN!r} holds every walstream stream and cannot be deleted",
            )
        await app.basin_config(name)
        # A page at a time (each page starts again at the prefix: its streams are gone), so a
        # basin of a million streams never sits in memory whole.
        while page := await app.client.list_streams(f"{name}.", None, _DELETE_PAGE):
            for stream_info in page:
                await app.client.delete_stream(stream_info.stream_id)
                app.stream_ids.pop(stream_info.name or "", None)
        app.basins.pop(name, None)
        await app.client.metadata.delete_basin(name)
        return await request.respond(202)
    raise not_allowed(method)


_DELETE_PAGE = 1_000
"""Streams a basin delete lists at a time."""


async def _create_basin(app: S2Context, request: Request) -> None:
    token = creation_token(request)
    body = await json_object(request)
    name = _basin_name(body.get("basin"))
    if name == ROOT_BASIN:
        raise _root_basin_exists()
    config = check_basin_config(body.get("config"))
    stored = dict(config)
    if token is not None:
        stored[CREATION_TOKEN_KEY] = token.digest(basin_config_json(config))
    try:
        info = await app.client.metadata.create_basin(name, stored)
        result = b"created"
    except BasinExists:
        info = await app.client.metadata.get_basin(name)
        if token is None or info.config.get(CREATION_TOKEN_KEY) != stored[CREATION_TOKEN_KEY]:
            raise
        result = b"noop"  # the same create again (a retry): S2 answers what it answered
    app.basins[name] = info.config
    await request.respond_json(
        201,
        _basin_info(info.name, info.created_ms),
        headers=[(b"s2-provision-result", result)],
    )


async def _ensure_basin(
    app: S2Context, request: Request, name: str, config: dict[str, Any]
) -> None:
    """S2's ``ensure``: create the basin with ``config``, or make its config ``config``;
    ``s2-provision-result`` says ``created`` (201), ``updated`` or ``noop`` (200)."""
    if name == ROOT_BASIN:
        if not same_basin_config({}, config):
            raise _root_basin_fixed()
        return await request.respond_json(
            200, _basin_info(name, 0), headers=[(b"s2-provision-result", b"noop")]
        )
    try:
        info = await app.client.metadata.get_basin(name)
    except BasinNotFound:
        try:
            info = await app.client.metadata.create_basin(name, config)
            result, status = b"created", 201
        except BasinExists:  # created meanwhile by another request: ensure it as below
            info = await app.client.metadata.get_basin(name)
            result, status = b"", 200
    else:
        result, status = b"", 200
    if not result:
        if same_basin_config(info.config, config):
            result = b"noop"
        else:
            kept = {k: v for k, v in info.config.items() if k == CREATION_TOKEN_KEY}
            info = await app.client.metadata.update_basin_config(name, {**config, **kept})
            result = b"updated"
    app.basins[name] = info.config
    await request.respond_json(
        status,
        _basin_info(info.name, info.created_ms),
        headers=[(b"s2-provision-result", result)],
    )


async def _list_basins(app: S2Context, request: Request) -> None:
    prefix, start_after, limit = list_query(request)
    found = [
        (b.name, b.created_ms)
        for b in await app.client.metadata.list_basins(prefix, start_after, min(limit + 1, 1000))
    ]
    if ROOT_BASIN.startswith(prefix) and ROOT_BASIN > start_after:
        found = sorted([*found, (ROOT_BASIN, 0)])
    await request.respond_json(
        200,
        {
            "basins": [_basin_info(name, created) for name, created in found[:limit]],
            "has_more": len(found) > limit,
        },
    )


def _basin_name(value: Any, status: int = 422) -> str:
    try:
        return check_basin_name(value)
    except InvalidArgument as error:
        raise S2Error(status, "invalid" if status == 422 else "bad_path", str(error)) from None


def _root_basin_exists() -> S2Error:
    return S2Error(
        409,
        "resource_already_exists",
        f"basin {ROOT_BASIN!r} always exists: it holds every walstream stream",
    )


def _root_basin_fixed() -> S2Error:
    return S2Error(
        403,
        "permission_denied",
        f"basin {ROOT_BASIN!r} holds every walstream stream and its config cannot be changed",
    )


def _basin_info(name: str, created_ms: int) -> dict[str, Any]:
    return {"name": name, "created_at": rfc3339(created_ms), "deleted_at": None, "scope": None}
