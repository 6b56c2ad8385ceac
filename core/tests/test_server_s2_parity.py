"""What S2's own Python SDK integration suite checks beyond the basics, with S2's official SDK
(``s2-sdk``) against one ``walstream serve`` process: reads with zero limits and ``until``,
basin reconfiguration, compressed bodies, UTF-8 stream names, client-key encryption,
idempotent creates and SSE resumption.

Each test names the behaviour of S2 it holds walstream to (s2-lite's code and S2's spec are the
reference; the guide ``docs/guides/http.md`` says where the two differ and which one we follow).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import Any

import pytest
from walstream_conformance.harness.serve import WalstreamServe

s2_sdk = pytest.importorskip("s2_sdk")
from s2_sdk import (  # noqa: E402
    S2,
    AppendInput,
    Endpoints,
    ReadLimit,
    ReadUnwrittenError,
    Record,
    S2ServerError,
    SeqNum,
    Timestamp,
)

TOKEN = "parity-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WalstreamServe]:
    """One ``walstream serve`` process for the module (each test uses its own basin)."""
    folder = tmp_path_factory.mktemp("s2-parity")
    deployment = folder / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        "wal: {type: memory, name: parity}\n"
        "object_store: {type: local, root: data/objects, fsync: false}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
    )
    serve = WalstreamServe(deployment, token=TOKEN)
    serve.start()
    try:
        yield serve
    finally:
        serve.stop_cleanly()


@pytest.fixture
async def s2(server: WalstreamServe) -> AsyncIterator[S2]:
    client = S2(TOKEN, endpoints=Endpoints(account=server.url, basin=server.url))
    try:
        yield client
    finally:
        await client.close()


_basins = iter(range(10_000))


async def new_basin(s2: S2, **options: object) -> str:
    name = f"parity-{os.getpid() % 10_000}-{next(_basins)}"
    await s2.create_basin(name, **options)  # type: ignore[arg-type]
    return name


async def _collect(items: AsyncIterable[Any]) -> list[Any]:
    return [item async for item in items]


# -- reads with zero limits and until -----------------------------------------------------------


async def test_a_read_with_count_or_bytes_zero_is_an_empty_batch(s2: S2) -> None:
    """S2: ``ReadLimit::from_count_and_bytes`` makes a zero count or byte limit a limit of zero
    records, unary and in sessions; the start is still checked (416 at the tail)."""
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s")
    stream = basin.stream("s")
    await stream.append(AppendInput(records=[Record(body=b"data"), Record(body=b"more")]))

    for limit in (ReadLimit(count=0), ReadLimit(bytes=0), ReadLimit(count=0, bytes=100)):
        batch = await stream.read(start=SeqNum(0), limit=limit)
        assert batch.records == []
        session = stream.read_session(start=SeqNum(0), limit=limit)
        batches = await asyncio.wait_for(_collect(session), 60)
        assert [r for b in batches for r in b.records] == []
    # Records are still there for a read with a limit.
    assert [r.body for r in (await stream.read(start=SeqNum(0))).records] == [b"data", b"more"]
    with pytest.raises(ReadUnwrittenError):
        await stream.read(start=SeqNum(2), limit=ReadLimit(count=0))


async def test_a_read_session_with_a_bound_and_no_wait_ends_at_the_tail(s2: S2) -> None:
    """S2: a session follows the tail only without a count/bytes/until bound, or with a wait."""
    basin = s2.basin(await new_basin(s2))
    await basin.create_stream("s")
    stream = basin.stream("s")
    await stream.append(AppendInput(records=[Record(body=b"a"), Record(body=b"b")]))

    async def session() -> list[bytes]:
        return [
            r.body
            async for batch in stream.read_session(start=SeqNum(0), limit=ReadLimit(count=5))
            for r in batch.records
        ]

    # A session that followed the tail would still be waiting after the generous bound.
    assert await asyncio.wait_for(session(), 60) == [b"a", b"b"]


async def test_a_read_from_a_timestamp_at_or_past_until_is_refused(s2: S2) -> None:
    """S2: ``validate_read_until`` answers 422 ``invalid`` before the stream is looked up, so the
    refused read does not create a stream on a ``create_stream_on_read`` basin either."""
    from s2_sdk import BasinConfig

    name = await new_basin(s2, config=BasinConfig(create_stream_on_read=True))
    basin = s2.basin(name)
    await basin.create_stream("s")
    stream = basin.stream("s")
    base = 1_700_000_000_000
    await stream.append(
        AppendInput(records=[Record(body=b"x", timestamp=base + i) for i in range(3)])
    )
    for start, until in ((base + 2, base + 2), (base + 2, base + 1)):
        with pytest.raises(S2ServerError) as refused:
            await stream.read(start=Timestamp(start), until_timestamp=until)
        assert (refused.value.status_code, refused.value.code) == (422, "invalid")
        assert "until" in str(refused.value)
    # One below until still reads.
    batch = await stream.read(start=Timestamp(base + 1), until_timestamp=base + 2)
    assert [r.seq_num for r in batch.records] == [1]
    with pytest.raises(S2ServerError):
        await basin.stream("never-made").read(start=Timestamp(5), until_timestamp=5)
    assert [s.name for s in (await basin.list_streams()).items] == ["s"]
