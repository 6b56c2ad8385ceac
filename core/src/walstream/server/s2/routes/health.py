"""``/health`` (no token) and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from walstream.server.cluster_status import cluster_health
from walstream.server.s2.errors import S2Error

if TYPE_CHECKING:
    from walstream.server.s2.context import S2Context
    from walstream.server.s2.request import Request

__all__ = ["PROMETHEUS_CONTENT_TYPE", "health", "metrics"]

PROMETHEUS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


async def health(app: S2Context, request: Request) -> None:
    body: dict[str, Any] = {
        "status": "ok",
        "node_id": app.client.node_id,
        "node_epoch": app.client.node_epoch,
    }
    cluster = cluster_health(app.client, app.rejoins)
    if cluster is not None:
        body["cluster"] = cluster
    failure = app.client.failure
    if failure is not None:
        body.update(status="failed", error=type(failure).__name__, message=str(failure))
        return await request.respond_json(503, body)
    if app.stopping.is_set():
        body["status"] = "stopping"
        return await request.respond_json(503, body)
    await request.respond_json(200, body)


async def metrics(app: S2Context, request: Request) -> None:
    if app.render_metrics is None:
        raise S2Error(
            404,
            "bad_path",
            "metrics are disabled in this deployment (hooks.disable lists 'metrics'); "
            "remove it from hooks.disable to serve /metrics",
        )
    lines = [
        "# HELP walstream_http_requests_total HTTP requests answered by walstream serve.",
        "# TYPE walstream_http_requests_total counter",
    ]
    for (method, route, status), count in sorted(app.requests.items()):
        label = route.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(
            f'walstream_http_requests_total{{method="{method}",route="{label}",'
            f'status="{status}"}} {count}'
        )
    text = app.render_metrics() + "\n".join(lines) + "\n"
    await request.respond(200, text.encode("utf-8"), PROMETHEUS_CONTENT_TYPE)
