"""S2's TypeScript SDK (``@s2-dev/streamstore``, installed in ``clients/node`` by ``make
install``) against ``walstream serve``: ``clients/node/sdk-check.mjs`` runs each check (create
basin and stream, appends JSON and protobuf, match_seq_num, fencing, reads by seq_num, tail
offset and timestamp, long polls, trim, append and read sessions over HTTP/2 (s2s) and over
HTTP/1.1 (fetch), the producer, errors, a stream's own configuration) and prints one JSON line
per check; each check is one test here.

The test skips only when the server does not answer S2's REST API v1 (``GET /v1/basins`` is not
200 with the token); a missing Node.js or SDK install is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from walstream_conformance.harness.serve import WalstreamServe

# The module's fixture runs the whole SDK script under Node against each HTTP server.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NODE_PROJECT = ROOT / "clients" / "node"
SCRIPT = NODE_PROJECT / "sdk-check.mjs"
TOKEN = "sdk-check-token"
CHECKS = [
    "create_basin",
    "create_stream",
    "create_stream_exists",
    "append",
    "append_bytes",
    "append_match_seq_num",
    "append_match_seq_num_mismatch",
    "fence",
    "fence_wrong_token",
    "check_tail",
    "read_seq_num",
    "read_bytes",
    "read_tail_offset",
    "read_timestamp",
    "read_beyond_tail",
    "read_long_poll",
    "read_long_poll_empty",
    "trim",
    *(
        f"{check}_{transport}"
        for transport in ("s2s", "fetch")
        for check in ("append_session", "producer", "read_session", "read_session_follow")
    ),
    "read_count_zero",
    "reconfigure_basin",
    "stream_config",
    "utf8_stream_name",
    "encryption_aegis-256",
    "encryption_aes-256-gcm",
    "compressed_session_gzip",
    "error_stream_not_found",
    "error_wrong_token",
    "error_bad_basin_name",
    "delete_stream",
]


def walstream_serve(folder: Path) -> WalstreamServe:
    """``walstream serve`` of an embedded-style deployment in ``folder``, with a token."""
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        "wal: {type: ebs, path: ./walstream-data/wal.img, capacity: 64MiB}\n"
        "object_store: {type: local, root: ./walstream-data/objects}\n"
        "metadata: {type: sqlite, path: ./walstream-data/meta.db}\n"
    )
    return WalstreamServe(deployment, token=TOKEN)


def s2_api_answer(endpoint: str) -> str | None:
    """None when ``GET /v1/basins`` answers 200 (S2's REST API v1), else what it answered."""
    request = urllib.request.Request(
        f"{endpoint}/v1/basins", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return None if answer.status == 200 else f"status {answer.status}"
    except urllib.error.HTTPError as error:
        return f"status {error.code}: {error.read()[:200]!r}"
    except OSError as error:
        return f"no answer: {error}"


@pytest.fixture(scope="module")
def sdk_results(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, dict[str, Any]]]:
    """The SDK's checks against ``walstream serve`` (the SDK speaks HTTP/1.1 through fetch)."""
    folder = tmp_path_factory.mktemp("sdk")
    with walstream_serve(folder) as server:
        refusal = s2_api_answer(server.endpoint_url)
        if refusal is not None:
            pytest.skip(
                f"walstream serve does not answer S2's REST API v1 (GET /v1/basins -> "
                f"{refusal}); these checks run once it does"
            )
        node = shutil.which("node")
        assert node is not None, "Node.js 20+ is needed: install it (make install checks for npm)"
        assert (NODE_PROJECT / "node_modules" / "@s2-dev" / "streamstore").is_dir(), (
            "the SDK is not installed: run make install (npm ci in clients/node)"
        )
        completed = subprocess.run(
            [node, str(SCRIPT)],
            cwd=NODE_PROJECT,
            env={
                **os.environ,
                "S2_ENDPOINT": server.endpoint_url,
                "S2_ACCESS_TOKEN": TOKEN,
                "S2_CHECK_TIMEOUT_MS": "15000",
            },
            capture_output=True,
            text=True,
            timeout=300,
        )
    results: dict[str, dict[str, Any]] = {}
    for line in completed.stdout.splitlines():
        document = json.loads(line)
        if "check" in document:
            results[document["check"]] = document
    assert results, f"sdk-check.mjs printed no results: {completed.stderr[-2000:]}"
    yield results


def test_the_script_reports_every_check(sdk_results: dict[str, dict[str, Any]]) -> None:
    assert sorted(sdk_results) == sorted(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_typescript_sdk(check: str, sdk_results: dict[str, dict[str, Any]]) -> None:
    result = sdk_results.get(check)
    assert result is not None, f"{check}: not reported by sdk-check.mjs"
    assert result["ok"], f"{check}: {result.get('error')} (status {result.get('status')})"
