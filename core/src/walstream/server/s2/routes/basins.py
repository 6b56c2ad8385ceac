"""``/v1/basins``: list, create, get, ensure and delete basins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from walstream.errors import BasinNotFound, InvalidArgument
from walstream.metadata.rules import check_basin_name
from walstream.server.s2.errors import S2Error
from walstream.server.s2.model import (
    ROOT_BASIN,
    basin_config_json,
    check_basin_config,
    rfc3339,
)
from walstream.server.s2.request import json_object
from walstream.server.s2.routes.common import list_query, not_allowed

if TYPE_CHECKING:
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = ["basins_route"]


async def basins_route(app: S2Context, request: Request, method: str, rest: list[str]) -> None:
    if not rest:
        if method == "GET":
            return await _list_basins(app, request)
        if method == "POST":
            body = await json_object(request)
            name = _basin_name(body.get("basin"))
            if name == ROOT_BASIN:
                raise _root_basin_exists()
            info = await app.client.metadata.create_basin(
                name, check_basin_config(body.get("config"))
            )
            app.basins[name] = info.config
            return await request.respond_json(201, _basin_info(info.name, info.created_ms))
        raise not_allowed(method)
    if len(rest) != 1:
        raise S2Error(404, "bad_path", "no such basin route")
    name = _basin_name(rest[0], status=400)
    if method == "GET":
        config = await app.basin_config(name)
        return await request.respond_json(200, basin_config_json(config))
    if method == "PUT":
        body = await json_object(request, allow_empty=True)
        config = check_basin_config(body.get("config"))
        if name == ROOT_BASIN:
            return await request.respond_json(
                200, _basin_info(name, 0), headers=[(b"s2-provision-result", b"noop")]
            )
        try:
            info = await app.client.metadata.get_basin(name)
            result, status = b"noop", 200
        except BasinNotFound:
            info = await app.client.metadata.create_basin(name, config)
            result, status = b"created", 201
        app.basins[name] = info.config
        return await request.respond_json(
            status,
            _basin_info(info.name, info.created_ms),
            headers=[(b"s2-provision-result", result)],
        )
    if method == "DELETE":
        if name == ROOT_BASIN:
            raise S2Error(
                403,
                "permission_denied",
                f"basin {ROOT_BASIN!r} holds every walstream stream and cannot be deleted",
            )
        await app.basin_config(name)
        for stream_info in await app.client.list_streams(prefix=f"{name}."):
            await app.client.delete_stream(stream_info.stream_id)
            app.stream_ids.pop(stream_info.name or "", None)
        app.basins.pop(name, None)
        await app.client.metadata.delete_basin(name)
        return await request.respond(202)
    raise not_allowed(method)


async def _list_basins(app: S2Context, request: Request) -> None:
    prefix, start_after, limit = list_query(request)
    found = [
        (b.name, b.created_ms)
        for b in await app.client.metadata.list_basins(
            prefix, start_after, min(limit + 1, 1000)
        )
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


def _basin_info(name: str, created_ms: int) -> dict[str, Any]:
    return {"name": name, "created_at": rfc3339(created_ms), "deleted_at": None, "scope": None}
