"""``walstream serve`` as the HTTP benchmarks run it: the embedded deployment, the command line,
the stream they append to and the request body, and the sources of another checkout to serve
from (``--before PATH``: a change measured side by side with the code before it).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import string
import sys
from pathlib import Path
from typing import Any

from common.clients import Http1Connection, HttpError

__all__ = [
    "BASIN",
    "PAYLOAD",
    "RECORD_BYTES",
    "STREAM",
    "append_body",
    "checkout_environment",
    "create_stream_http",
    "detect_api",
    "embedded_deployment",
    "serve_command",
]

RECORD_BYTES = 1024
BASIN = "walstream-bench"
STREAM = "bench"
# Printable ASCII so the same bytes are valid for every peer, S2's raw (UTF-8) format included.
PAYLOAD = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=RECORD_BYTES))

DIST_SOURCES = (
    "core/src",
    "plugins/src",
    "wal_ebs/src",
    "wal_s3/src",
    "wal_s3express/src",
    "wal_nvme_quorum/src",
    "metadata_postgres/src",
    "conformance/src",
)
"""The dists whose ``src`` folders a ``--before`` checkout serves from."""


def checkout_environment(checkout: Path | None) -> dict[str, str] | None:
    """``PYTHONPATH`` that serves walstream from ``checkout``'s sources (None: this checkout)."""
    if checkout is None:
        return None
    if not (checkout / "core/src/walstream").is_dir():
        raise SystemExit(f"--before {checkout}: not a walstream checkout (no core/src/walstream)")
    folders = [str(checkout / source) for source in DIST_SOURCES if (checkout / source).is_dir()]
    return {"PYTHONPATH": os.pathsep.join(folders)}


def serve_command() -> list[str]:
    """``walstream serve`` on the embedded default deployment (rooted in the working folder)."""
    return [sys.executable, "-m", "walstream.cli", "serve", "--listen", "127.0.0.1:0"]


def embedded_deployment(root: Path) -> dict[str, Any]:
    """The embedded default of ``walstream.open(None)``, rooted in ``root``."""
    return {
        "node": {"id": 1},
        "wal": {"type": "ebs", "path": str(root / "wal.img"), "capacity": "512MiB"},
        "object_store": {"type": "local", "root": str(root / "objects")},
        "metadata": {"type": "sqlite", "path": str(root / "meta.db")},
    }


async def detect_api(port: int) -> str:
    """``s2`` when ``GET /v1/basins`` answers 2xx, else ``walstream`` (the previous API)."""
    connection = await Http1Connection.open("127.0.0.1", port)
    try:
        await connection.request("GET", "/v1/basins")
        return "s2"
    except HttpError:
        return "walstream"
    finally:
        connection.close()


async def create_stream_http(port: int, api: str) -> None:
    """The basin and stream the benchmarks append to (409, it exists: fine)."""
    connection = await Http1Connection.open("127.0.0.1", port)
    json_type = {"content-type": "application/json"}
    try:
        if api == "s2":
            for path, body, headers in (
                ("/v1/basins", {"basin": BASIN}, json_type),
                ("/v1/streams", {"stream": STREAM}, {**json_type, "s2-basin": BASIN}),
            ):
                with contextlib.suppress(HttpError):
                    await connection.request("POST", path, json.dumps(body).encode(), headers)
        else:
            await connection.request(
                "POST", "/v1/streams", json.dumps({"name": STREAM}).encode(), json_type
            )
    finally:
        connection.close()


def append_body(api: str, batch: int) -> bytes:
    """An append of ``batch`` records of :data:`PAYLOAD` in the JSON of ``api``."""
    field = "body" if api == "s2" else "value_text"
    return json.dumps({"records": [{field: PAYLOAD}] * batch}).encode()
