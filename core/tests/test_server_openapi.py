"""``GET /openapi.json`` describes what ``walstream serve`` answers: schemathesis generates
requests for every operation of the document against a live server process and checks each
answer against it (no 5xx, documented statuses, content types, headers and bodies).

Bounded for CI (a few hundred requests in all); ``--soak`` runs many more.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from walstream_conformance.harness.serve import WalstreamServe

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

# A server per HTTP stack and the generated requests of schemathesis: seconds per test.
pytestmark = pytest.mark.slow

#: "The answers match the document": no 5xx, and statuses, content types, headers and bodies as
#: documented. (schemathesis' positive_data_acceptance and negative_data_rejection judge the
#: API's semantics instead: a schema-valid create of an existing name is a correct 409.)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

TOKEN = "openapi-token"
BASIN = "schema-basin"


def call(url: str, method: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    sent = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "s2-basin": BASIN, **(headers or {})},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(sent, timeout=30) as answer:
        payload = answer.read()
        return json.loads(payload) if payload else None


@pytest.fixture(scope="module")
def server_url(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """``walstream serve`` for the module."""
    folder = tmp_path_factory.mktemp("openapi")
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        "wal: {type: memory, name: openapi}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
        "server: {max_long_polls: 4}\n"
    )
    server = WalstreamServe(deployment, token=TOKEN)
    url = server.start()
    try:
        call(url + "/v1/basins", "POST", {"basin": BASIN})
        call(url + "/v1/streams", "POST", {"stream": "target"})
        call(url + "/v1/streams/target/records", "POST", {"records": [{"body": "a"}] * 3})
        yield url
    finally:
        server.stop_cleanly()


def test_the_document_lists_exactly_the_implemented_operations(server_url: str) -> None:
    document = call(server_url + "/openapi.json", "GET", headers={"Authorization": ""})
    operations = {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert operations == {
        ("GET", "/health"),
        ("GET", "/v1/basins"),
        ("POST", "/v1/basins"),
        ("GET", "/v1/basins/{basin}"),
        ("PUT", "/v1/basins/{basin}"),
        ("PATCH", "/v1/basins/{basin}"),
        ("DELETE", "/v1/basins/{basin}"),
        ("GET", "/v1/streams"),
        ("POST", "/v1/streams"),
        ("GET", "/v1/streams/{stream}"),
        ("PUT", "/v1/streams/{stream}"),
        ("PATCH", "/v1/streams/{stream}"),
        ("DELETE", "/v1/streams/{stream}"),
        ("GET", "/v1/streams/{stream}/records"),
        ("POST", "/v1/streams/{stream}/records"),
        ("GET", "/v1/streams/{stream}/records/tail"),
    }


def test_every_answer_matches_the_document(server_url: str, soak: bool) -> None:
    schema = schemathesis.openapi.from_url(server_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 16
    auth = {"Authorization": f"Bearer {TOKEN}"}

    for operation in operations:
        if operation.method.upper() == "DELETE":
            continue  # checked below on names made for it; random deletes would empty the basin

        @settings(
            max_examples=400 if soak else 20,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(), real=st.booleans())
        def check(case: Any, real: bool) -> None:
            headers = dict(auth)
            if real:  # half the cases address the prepared basin and stream
                if case.headers is not None and "s2-basin" in case.headers:
                    case.headers["s2-basin"] = BASIN
                if case.path_parameters and "stream" in case.path_parameters:
                    case.path_parameters["stream"] = "target"
            if case.query and "wait" in case.query:
                case.query["wait"] = 0  # no 60 s long polls in CI
            case.call_and_validate(base_url=server_url, headers=headers, checks=CHECKS, timeout=30)

        check()

    call(server_url + "/v1/streams", "POST", {"stream": "doomed"})
    call(server_url + "/v1/streams/doomed", "DELETE")
    call(server_url + "/v1/basins", "POST", {"basin": "doomed-basin"})
    call(server_url + "/v1/basins/doomed-basin", "DELETE")
