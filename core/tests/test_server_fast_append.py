"""The hot path of ``walstream serve`` (unary appends to a stream this node writes, answered
without the generic request layers) gives the general route's answers and keeps its checks; and
the body deadlines that bound every request body."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from walstream.server.limits import ServerLimits
from walstream.server.s2.errors import S2Error
from walstream.server.s2.request import BodyDeadlines, read_body
from walstream.server.serve import RunningServer, serve

TOKEN = "hot-path-token"
BASIN = "hot-path-basin"
PATH = "/v1/streams/orders/records"
TIMEOUT = aiohttp.ClientTimeout(total=20)
LIMITS = ServerLimits(body_timeout_s=1.0)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    """The node served over HTTP."""
    deployment = tmp_path / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        f"wal: {{type: memory, name: hot-{tmp_path.name}}}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
    )
    async with serve(
        deployment,
        listen="127.0.0.1:0",
        token=TOKEN,
        limits=LIMITS,
        environ={},
    ) as running:
        yield running


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[aiohttp.ClientSession]:
    """A session that sends the token and names a basin holding the stream ``orders``, which
    this node writes (one append claimed it)."""
    async with aiohttp.ClientSession(
        base_url=server.url,
        headers={"Authorization": f"Bearer {TOKEN}", "s2-basin": BASIN},
        timeout=TIMEOUT,
    ) as session:
        await call(session, "POST", "/v1/basins", 201, json={"basin": BASIN})
        await call(session, "POST", "/v1/streams", 201, json={"stream": "orders"})
        await call(session, "POST", PATH, 200, json={"records": [{"body": "first"}]})
        yield session


async def call(
    session: aiohttp.ClientSession, method: str, path: str, expect: int, **kwargs: Any
) -> Any:
    async with session.request(method, path, **kwargs) as response:
        text = await response.text()
        assert response.status == expect, (response.status, text)
        return json.loads(text) if text else None


async def test_plain_appends_take_the_hot_path_with_the_general_routes_answers(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    hot = server.app.fast_append
    before = hot.taken
    one = await call(http, "POST", PATH, 200, json={"records": [{"body": "a"}, {"body": "b"}]})
    # A query string sends the same append through the general route.
    two = await call(http, "POST", PATH + "?via=general", 200, json={"records": [{"body": "c"}]})
    three = await call(
        http,
        "POST",
        PATH,
        200,
        json={"records": [{"body": "ZA=="}]},
        headers={"s2-format": "base64"},
    )
    assert hot.taken == before + 2
    assert (one["start"]["seq_num"], one["end"]["seq_num"], one["tail"]["seq_num"]) == (1, 3, 3)
    assert (two["start"]["seq_num"], two["end"]["seq_num"]) == (3, 4)
    assert (three["start"]["seq_num"], three["end"]["seq_num"]) == (4, 5)
    for answer in (one, two, three):
        assert set(answer) == {"start", "end", "tail"}
        assert answer["end"]["timestamp"] >= answer["start"]["timestamp"] > 0
    read = await call(http, "GET", PATH + "?seq_num=0", 200)
    assert [record["body"] for record in read["records"]] == ["first", "a", "b", "c", "d"]


async def test_the_hot_path_keeps_match_seq_num_and_fencing(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    hot = server.app.fast_append
    before = hot.taken
    mismatch = await call(
        http, "POST", PATH, 412, json={"records": [{"body": "x"}], "match_seq_num": 7}
    )
    assert mismatch == {"seq_num_mismatch": 1}
    await call(http, "POST", PATH, 200, json={"records": [{"body": "x"}], "match_seq_num": 1})
    fence = {"headers": [["", "fence"]], "body": "token-1"}
    await call(http, "POST", PATH, 200, json={"records": [fence]})
    wrong = await call(
        http, "POST", PATH, 412, json={"records": [{"body": "y"}], "fencing_token": "other"}
    )
    assert wrong == {"fencing_token_mismatch": "token-1"}
    await call(
        http, "POST", PATH, 200, json={"records": [{"body": "y"}], "fencing_token": "token-1"}
    )
    trim = {"headers": [["", "trim"]], "body": struct.pack(">Q", 2).decode("latin-1")}
    await call(http, "POST", PATH, 200, json={"records": [trim], "fencing_token": "token-1"})
    bad = await call(http, "POST", PATH, 400, data=b"{not json")
    assert bad["code"] == "bad_json"
    too_many = await call(http, "POST", PATH, 422, json={"records": [{"body": "z"}] * 1001})
    assert too_many["code"] == "invalid"
    assert hot.taken == before + 8
    tail = await call(http, "GET", PATH + "/tail", 200)
    assert tail["tail"]["seq_num"] == 5  # first, x, the fence record, y, the trim record
    read = await call(http, "GET", PATH + "?seq_num=0", 200)
    assert [record["seq_num"] for record in read["records"]] == [2, 3, 4]  # trimmed to 2


async def test_requests_the_hot_path_cannot_judge_go_to_the_general_route(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    hot = server.app.fast_append
    before = hot.taken
    wrong_token = {"Authorization": "Bearer not-the-token"}
    body = {"records": [{"body": "x"}]}
    assert (await call(http, "POST", PATH, 401, json=body, headers=wrong_token))["code"] == "authn"
    missing = await call(http, "POST", "/v1/streams/missing/records", 404, json=body)
    assert missing["code"] == "stream_not_found"
    bad_format = await call(http, "POST", PATH, 400, json=body, headers={"s2-format": "hex"})
    assert bad_format["code"] == "bad_header"
    other_basin = {"s2-basin": "no-such-basin"}
    assert (await call(http, "POST", PATH, 404, json=body, headers=other_basin))[
        "code"
    ] == "basin_not_found"
    assert hot.taken == before
    counts = await metrics_counts(http)
    assert counts[("POST", "/v1/streams/{name}/records", "401")] == 1
    assert counts[("POST", "/v1/streams/{name}/records", "200")] == 1  # the fixture's append


async def metrics_counts(http: aiohttp.ClientSession) -> dict[tuple[str, str, str], float]:
    async with http.get("/metrics") as response:
        text = await response.text()
    counts: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("walstream_http_requests_total{"):
            labels, _, value = line.partition("} ")
            fields = dict(
                part.split("=", 1) for part in labels.split("{", 1)[1].split('",') if "=" in part
            )
            key = tuple(fields[name].strip('"') for name in ("method", "route", "status"))
            counts[key] = float(value)  # type: ignore[index]
    return counts


@pytest.mark.slow
async def test_a_slow_append_body_gets_408(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(
            f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"s2-basin: {BASIN}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n{".encode()
        )
        began = time.monotonic()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        waited = time.monotonic() - began
        length = re.search(rb"(?im)^content-length: *(\d+)", head)
        assert length is not None, head
        body = await asyncio.wait_for(reader.readexactly(int(length.group(1))), 10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 408"), head
    # The rest of the declared body may still come: the client is told to close.
    assert re.search(rb"(?im)^connection: *close", head), head
    assert b"request_timeout" in body and b"server.body_timeout" in body
    assert 0.9 <= waited < 4.0, waited
    assert server.app.fast_append.taken == 1


# -- body deadlines ----------------------------------------------------------------------------


def _message(body: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


async def test_a_body_past_its_deadline_is_cut_with_408_and_others_are_left_alone() -> None:
    deadlines = BodyDeadlines(0.2)
    stalled = asyncio.Event()

    async def never() -> dict[str, Any]:
        await stalled.wait()
        return _message(b"")

    async def at_once() -> dict[str, Any]:
        return _message(b"abc")

    async def cut() -> None:
        began = time.monotonic()
        with pytest.raises(S2Error) as caught:
            await read_body(never, deadlines, 1024, lambda: None)
        assert caught.value.status == 408 and caught.value.code == "request_timeout"
        assert 0.2 <= time.monotonic() - began < 1.0
        await asyncio.sleep(0.4)  # the cancellation was withdrawn: the task goes on

    async def finished() -> bytes:
        body = await read_body(at_once, deadlines, 1024, lambda: None)
        await asyncio.sleep(0.6)  # well past the deadline: not cancelled
        return body

    _, body = await asyncio.gather(cut(), finished())
    assert body == b"abc"


async def test_a_body_over_the_bound_is_413_and_an_outside_cancel_stays_a_cancel() -> None:
    deadlines = BodyDeadlines(0.2)
    parts = iter([_message(b"x" * 600, more=True), _message(b"y" * 600)])

    async def chunks() -> dict[str, Any]:
        return next(parts)

    async def too_large() -> None:
        with pytest.raises(S2Error) as caught:
            await read_body(chunks, deadlines, 1000, lambda: None)
        assert caught.value.status == 413
        await asyncio.sleep(0.5)  # not cancelled later by the deadline of the read it left

    await too_large()

    async def never() -> dict[str, Any]:
        await asyncio.Event().wait()
        return _message(b"")

    reading = asyncio.ensure_future(read_body(never, deadlines, 1024, lambda: None))
    await asyncio.sleep(0.05)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading


async def test_a_body_is_complete_once_its_declared_length_arrived() -> None:
    deadlines = BodyDeadlines(0.3)
    parts = iter([_message(b"abc", more=True)])

    async def then_nothing() -> dict[str, Any]:
        part = next(parts, None)
        if part is None:
            await asyncio.Event().wait()  # the end-of-body message would come later, or never
        assert part is not None
        return part

    assert await read_body(then_nothing, deadlines, 1024, lambda: None, declared=3) == b"abc"
