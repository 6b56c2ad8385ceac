"""S2's official Python SDK (``s2-sdk``, HTTP/2 only) against a ``walstream serve`` process:
basins, streams, unary appends and reads (protobuf), conditions and commands, long polls, and
the S2S producer and read sessions.

Not covered because walstream does not implement them (docs/guides/http.md): access tokens,
metrics, locations, stream configurations other than the fixed one; a test checks that the SDK
gets S2's errors for them. Basin reconfiguration, compression, encryption, UTF-8 names,
idempotent creates and SSE resumption are in test_server_s2_parity.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from walstream_conformance.harness.serve import WalstreamServe

s2_sdk = pytest.importorskip("s2_sdk")
from s2_sdk import (  # noqa: E402
    S2,
    AppendInput,
    BasinConfig,
    CommandRecord,
    Endpoints,
    EnsureStatus,
    FencingTokenMismatchError,
    ReadLimit,
    ReadUnwrittenError,
    Record,
    S2ServerError,
    SeqNum,
    SeqNumMismatchError,
    StreamConfig,
    TailOffset,
    Timestamp,
)

TOKEN = "sdk-token"


@pytest.fixture(scope="module")
def server_url(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """One ``walstream serve`` process (the SDK speaks HTTP/2) for the module (each test uses
    its own basin)."""
    folder = tmp_path_factory.mktemp("sdk")
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        "wal: {type: memory, name: sdk}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
        "server: {}\n"
    )
    server = WalstreamServe(deployment, token=TOKEN)
    url = server.start()
    try:
        yield url
    finally:
        server.stop_cleanly()


@pytest.fixture
async def s2(server_url: str) -> AsyncIterator[S2]:
    client = S2(TOKEN, endpoints=Endpoints(account=server_url, basin=server_url))
    try:
        yield client
    finally:
        await client.close()


_basins = iter(range(10_000))


async def new_basin(s2: S2) -> str:
    name = f"sdk-basin-{os.getpid() % 10_000}-{next(_basins)}"
    info = await s2.create_basin(name)
    assert info.name == name
    return name


async def test_basins_and_streams(s2: S2) -> None:
    name = await new_basin(s2)
    page = await s2.list_basins(prefix=name)
    assert [b.name for b in page.items] == [name] and not page.has_more
    ensured = await s2.ensure_basin(name)
    assert ensured.status is EnsureStatus.CONFIG_UNCHANGED
    assert (await s2.get_basin_config(name)).create_stream_on_append is False

    basin = s2.basin(name)
    created = await basin.create_stream("orders")
    assert created.name == "orders"
    with pytest.raises(S2ServerError) as exists:
        await basin.create_stream("orders")
    assert (exists.value.status_code, exists.value.code) == (409, "resource_already_exists")
    assert (await basin.ensure_stream("orders")).status is EnsureStatus.CONFIG_UNCHANGED
    assert (await basin.ensure_stream("lines")).status is EnsureStatus.CREATED
    assert [s.name for s in (await basin.list_streams()).items] == ["lines", "orders"]
    config = await basin.get_stream_config("orders")
    assert config.retention_policy == 7 * 86_400, "S2's default retention: 7 days"
    assert config.storage_class == "express"
    await basin.delete_stream("lines")
    assert [s.name for s in (await basin.list_streams()).items] == ["orders"]
    with pytest.raises(S2ServerError) as missing:
        await basin.get_stream_config("lines")
    assert (missing.value.status_code, missing.value.code) == (404, "stream_not_found")

    await s2.delete_basin(name)
    assert (await s2.list_basins(prefix=name)).items == []


async def test_append_conditions_fence_and_trim(s2: S2) -> None:
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s")
    stream = basin.stream("s")

    ack = await stream.append(
        AppendInput(records=[Record(body=b"a", headers=[(b"h", b"1")])], match_seq_num=0)
    )
    assert (ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num) == (0, 1, 1)
    with pytest.raises(SeqNumMismatchError) as mismatch:
        await stream.append(AppendInput(records=[Record(body=b"b")], match_seq_num=7))
    assert mismatch.value.expected_seq_num == 1

    await stream.append(AppendInput(records=[CommandRecord.fence("writer-1")]))
    with pytest.raises(FencingTokenMismatchError) as fenced:
        await stream.append(AppendInput(records=[Record(body=b"x")], fencing_token="writer-0"))
    assert fenced.value.expected_fencing_token == "writer-1"
    await stream.append(AppendInput(records=[Record(body=b"c")], fencing_token="writer-1"))
    assert (await stream.check_tail()).seq_num == 3

    await stream.append(AppendInput(records=[CommandRecord.trim(2)], fencing_token="writer-1"))
    batch = await stream.read(start=SeqNum(0), ignore_command_records=True)
    assert [(r.seq_num, r.body) for r in batch.records] == [(2, b"c")]
    assert (await stream.read(start=SeqNum(0))).records[-1].is_command_record()


@pytest.mark.slow
async def test_reads_by_seq_num_tail_offset_and_timestamp_with_headers(s2: S2) -> None:
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s")
    stream = basin.stream("s")
    first = await stream.append(
        AppendInput(
            records=[
                Record(body=b"zero", headers=[(b"kind", b"a"), (b"n", b"\x00\xff")]),
                Record(body=b"one"),
            ]
        )
    )
    await asyncio.sleep(0.01)
    second = await stream.append(AppendInput(records=[Record(body=b"two", headers=[(b"x", b"")])]))
    assert second.start.timestamp > first.end.timestamp

    by_seq = await stream.read(start=SeqNum(0))
    assert [(r.seq_num, r.body) for r in by_seq.records] == [(0, b"zero"), (1, b"one"), (2, b"two")]
    assert by_seq.records[0].headers == [(b"kind", b"a"), (b"n", b"\x00\xff")]
    assert by_seq.tail is not None and by_seq.tail.seq_num == 3
    assert by_seq.tail.timestamp == second.end.timestamp

    by_tail = await stream.read(start=TailOffset(1))
    assert [(r.body, r.headers) for r in by_tail.records] == [(b"two", [(b"x", b"")])]
    by_time = await stream.read(start=Timestamp(second.start.timestamp))
    assert [r.seq_num for r in by_time.records] == [2]
    limited = await stream.read(start=SeqNum(0), limit=ReadLimit(count=2))
    assert [r.seq_num for r in limited.records] == [0, 1]
    until = await stream.read(start=SeqNum(0), until_timestamp=second.start.timestamp)
    assert [r.seq_num for r in until.records] == [0, 1]

    with pytest.raises(ReadUnwrittenError) as unwritten:
        await stream.read(start=SeqNum(5))
    assert unwritten.value.tail.seq_num == 3
    clamped = await stream.read(start=SeqNum(5), clamp_to_tail=True, wait=1)
    assert clamped.records == [] and clamped.tail is not None and clamped.tail.seq_num == 3


async def test_a_long_poll_is_woken_by_an_append(s2: S2) -> None:
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s")
    stream = basin.stream("s")

    async def append_later() -> None:
        await asyncio.sleep(0.5)
        await stream.append(AppendInput(records=[Record(body=b"late")]))

    appending = asyncio.ensure_future(append_later())
    started = time.monotonic()
    batch = await stream.read(start=SeqNum(0), wait=20)
    assert [r.body for r in batch.records] == [b"late"]
    assert 0.3 < time.monotonic() - started < 10
    await appending


async def test_producer_session_of_200_records_and_a_read_session(s2: S2) -> None:
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s")
    stream = basin.stream("s")
    async with stream.producer() as producer:
        tickets = [await producer.submit(Record(body=b"r%03d" % i)) for i in range(200)]
        acks = [await ticket for ticket in tickets]
    assert [ack.seq_num for ack in acks] == list(range(200))

    read: list[bytes] = []
    async for batch in stream.read_session(start=SeqNum(0), limit=ReadLimit(count=200)):
        read += [record.body for record in batch.records]
    assert read == [b"r%03d" % i for i in range(200)]

    # A session following the tail sees records appended after it began.
    async def follow() -> list[bytes]:
        got: list[bytes] = []
        async for batch in stream.read_session(start=SeqNum(200), wait=10):
            got += [record.body for record in batch.records]
            if len(got) >= 2:
                break
        return got

    following = asyncio.ensure_future(follow())
    await asyncio.sleep(0.3)
    async with stream.append_session() as session:
        ticket = await session.submit(AppendInput(records=[Record(body=b"x"), Record(body=b"y")]))
        ack = await ticket
    assert (ack.start.seq_num, ack.end.seq_num) == (200, 202)
    assert await asyncio.wait_for(following, 15) == [b"x", b"y"]


async def test_an_append_session_ends_with_s2s_error_on_a_mismatch(s2: S2) -> None:
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s")
    stream = basin.stream("s")
    with pytest.raises(SeqNumMismatchError):
        async with stream.append_session() as session:
            ticket = await session.submit(AppendInput(records=[Record(body=b"a")], match_seq_num=3))
            await ticket
    assert (await stream.check_tail()).seq_num == 0


async def test_create_stream_on_append_and_unsupported_features_get_s2s_errors(s2: S2) -> None:
    name = f"sdk-auto-{os.getpid() % 10_000}"
    await s2.create_basin(name, config=BasinConfig(create_stream_on_append=True))
    stream = s2.basin(name).stream("made-on-append")
    assert (await stream.append(AppendInput(records=[Record(body=b"v")]))).end.seq_num == 1

    await s2.basin(name).create_stream("aged", config=StreamConfig(retention_policy=3600))
    assert (await s2.basin(name).get_stream_config("aged")).retention_policy == 3600
    with pytest.raises(S2ServerError) as refused:
        await s2.basin(name).create_stream("never", config=StreamConfig(retention_policy=0))
    assert (refused.value.status_code, refused.value.code) == (422, "invalid")
    with pytest.raises(S2ServerError) as tokens:
        await s2.list_access_tokens()
    assert (tokens.value.status_code, tokens.value.code) == (501, "not_implemented")


async def test_an_error_answered_before_the_body_keeps_the_http2_connection_serving(
    s2: S2,
) -> None:
    """An append to a missing basin is refused before its body is read; the server reads the
    body first, so the HTTP/2 connection (shared by every request of the client) survives."""
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s")
    stream = basin.stream("s")
    missing = s2.basin("no-such-basin").stream("s")
    for _ in range(3):
        with pytest.raises(S2ServerError) as refused:
            await missing.append(AppendInput(records=[Record(body=b"x" * 100_000)]))
        assert (refused.value.status_code, refused.value.code) == (404, "basin_not_found")
        ack = await stream.append(AppendInput(records=[Record(body=b"ok")]))
        assert ack.end.seq_num == ack.start.seq_num + 1
