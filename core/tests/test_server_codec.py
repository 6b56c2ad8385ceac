"""The wire forms of ``walstream serve`` (:mod:`walstream.server.codec`): error statuses and
bodies, the responses given before aiohttp parsed a request, and the answer to a bug, checked on
an application served on 127.0.0.1 over a stub node."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    DataLossError,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    NotFound,
    OutOfRangeError,
    PreconditionFailed,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
    Throttled,
    WalstreamError,
)
from walstream.server.app import make_app
from walstream.server.codec import canned_response, error_json, error_status

TOKEN = "codec-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (StreamNotFound("no stream"), 404),
        (NotFound("no object"), 404),
        (StreamExists("exists"), 409),
        (FencedError("fenced"), 409),
        (TailMismatchError("tail moved", 7), 412),
        (PreconditionFailed("changed"), 412),
        (OutOfRangeError("before start", 3, 9), 416),
        (DataLossError("lost", 1, 2, 3), 410),
        (InvalidArgument("bad"), 400),
        (ConfigError("bad config"), 400),
        (CapacityError("full"), 429),
        (Throttled("slow down"), 503),
        (BackendUnavailable("down"), 503),
        (AmbiguousError("unknown outcome"), 504),
        (CorruptionError("bad crc"), 500),
        (IdentityMismatch("other deployment"), 500),
        (WalstreamError("unlisted"), 500),
    ],
)
def test_every_error_class_has_its_status(error: WalstreamError, status: int) -> None:
    assert error_status(error) == status


def test_error_bodies_carry_the_fields_a_caller_acts_on() -> None:
    assert error_json(TailMismatchError("the tail is 7", 7)) == {
        "error": "TailMismatchError",
        "message": "the tail is 7",
        "definitely_not_applied": True,
        "actual_tail": 7,
    }
    body = error_json(OutOfRangeError("offset 1 is before the start 3", 3, 9))
    assert (body["error"], body["start_offset"], body["tail"]) == ("OutOfRangeError", 3, 9)
    # An error without a message is named by its class.
    assert error_json(AmbiguousError())["message"] == "AmbiguousError"


def test_a_canned_response_is_one_complete_http_answer_that_closes() -> None:
    body = {"error": "BackendUnavailable", "message": "too many connections: ü"}
    raw = canned_response(503, "Service Unavailable", body)
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert fields["Content-Length"] == str(len(payload))
    assert fields["Connection"] == "close"
    assert fields["Retry-After"] == "1"
    assert json.loads(payload) == body


class _BrokenNode:
    """A started node whose stream listing fails with a bug (not a WalstreamError)."""

    node_id = 1
    node_epoch = 1
    failure = None

    async def list_streams(self, prefix: str = "") -> list[Any]:
        raise RuntimeError("internal detail that must not leak: /secret/path")


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    app = make_app(cast(Any, _BrokenNode()), token=TOKEN)
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client


async def test_a_bug_answers_500_internal_error_without_its_traceback(
    client: TestClient[Any, Any],
) -> None:
    response = await client.get("/v1/streams", headers=AUTH)
    text = await response.text()
    assert response.status == 500
    assert json.loads(text) == {
        "error": "InternalError",
        "message": "the server failed unexpectedly (a bug, logged on the server); "
        "the operation may or may not have happened, read back before retrying",
        "definitely_not_applied": False,
    }
    assert "secret" not in text and "Traceback" not in text


async def test_answers_given_before_the_engine_say_nothing_happened(
    client: TestClient[Any, Any],
) -> None:
    cases: list[tuple[str, str, dict[str, str], int, str]] = [
        ("GET", "/v1/streams", {}, 401, "Unauthorized"),
        ("GET", "/v1/streams", {"Authorization": "Bearer wrong"}, 401, "Unauthorized"),
        ("GET", "/nowhere", AUTH, 404, "NotFound"),
        ("PUT", "/v1/streams", AUTH, 405, "MethodNotAllowed"),
    ]
    for method, path, headers, status, name in cases:
        response = await client.request(method, path, headers=headers)
        body = await response.json()
        assert (response.status, body["error"]) == (status, name), body
        assert body["definitely_not_applied"] is True
        assert body["message"]
    response = await client.get("/v1/streams")
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="walstream"'
    response = await client.put("/v1/streams", headers=AUTH)
    assert "POST" in response.headers["Allow"]


def test_the_server_package_and_the_node_lock_do_not_import_aiohttp() -> None:
    # Every command imports walstream.engine.live; only `walstream serve` needs aiohttp.
    probe = "import sys, walstream.server, walstream.engine.live; print('aiohttp' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
