"""What S2's own Python SDK integration suite checks beyond the basics, with S2's official SDK
(``s2-sdk``) against one ``walstream serve`` process: reads with zero limits and ``until``,
basin reconfiguration, compressed bodies, UTF-8 stream names, client-key encryption,
idempotent creates and SSE resumption.

Each test names the behaviour of S2 it holds walstream to (s2-lite's code and S2's spec are the
reference; the guide ``docs/guides/http.md`` says where the two differ and which one we follow).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import zstandard
from walstream_conformance.harness.serve import WalstreamServe

s2_sdk = pytest.importorskip("s2_sdk")
from s2_sdk import (  # noqa: E402
    S2,
    AppendInput,
    BasinConfig,
    Compression,
    Encryption,
    Endpoints,
    EnsureStatus,
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


# -- basin reconfiguration and ensure -----------------------------------------------------------


@pytest.fixture
async def http(server: WalstreamServe) -> AsyncIterator[aiohttp.ClientSession]:
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(server.url, headers=headers) as session:
        yield session


async def test_a_basin_is_reconfigured_partially_and_the_change_is_kept(s2: S2) -> None:
    """S2: ``PATCH /v1/basins/{basin}`` changes the fields given and keeps the others."""
    name = await new_basin(s2, config=BasinConfig(create_stream_on_read=True))
    changed = await s2.reconfigure_basin(name, config=BasinConfig(create_stream_on_append=True))
    assert (changed.create_stream_on_append, changed.create_stream_on_read) == (True, True)
    changed = await s2.reconfigure_basin(name, config=BasinConfig(create_stream_on_read=False))
    assert (changed.create_stream_on_append, changed.create_stream_on_read) == (True, False)
    kept = await s2.get_basin_config(name)
    assert (kept.create_stream_on_append, kept.create_stream_on_read) == (True, False)
    # The new flag takes effect: an append creates its stream.
    stream = s2.basin(name).stream("made-by-append")
    assert (await stream.append(AppendInput(records=[Record(body=b"v")]))).end.seq_num == 1


async def test_an_empty_or_invalid_basin_reconfiguration(
    s2: S2, http: aiohttp.ClientSession
) -> None:
    """An empty body or ``{}`` changes nothing (200 with the config); a missing basin is 404
    ``basin_not_found``; a bad value or an unknown field is 422 ``invalid`` and changes
    nothing; ``stream_cipher: null`` removes the cipher."""
    name = await new_basin(s2, config=BasinConfig(create_stream_on_append=True))
    for body in (None, b"{}"):
        async with http.patch(f"/v1/basins/{name}", data=body) as answer:
            assert answer.status == 200
            assert (await answer.json())["create_stream_on_append"] is True
    async with http.patch("/v1/basins/no-such-basin-here", json={}) as answer:
        assert (answer.status, (await answer.json())["code"]) == (404, "basin_not_found")
    for bad in (
        {"create_stream_on_append": "yes"},
        {"stream_cipher": "rot13"},
        {"surprise": 1},
        {"default_stream_config": {"storage_class": "premium"}},
        [],
    ):
        async with http.patch(f"/v1/basins/{name}", json=bad) as answer:
            assert (answer.status, (await answer.json())["code"]) == (422, "invalid"), bad
    assert (await s2.get_basin_config(name)).create_stream_on_append is True
    async with http.patch(f"/v1/basins/{name}", json={"stream_cipher": "aes-256-gcm"}) as answer:
        assert (await answer.json())["stream_cipher"] == "aes-256-gcm"
    async with http.patch(f"/v1/basins/{name}", json={"stream_cipher": None}) as answer:
        assert (await answer.json())["stream_cipher"] is None
        assert (await answer.json())["create_stream_on_append"] is True


async def test_ensure_reports_unchanged_only_when_nothing_changed(s2: S2) -> None:
    """S2: ``ensure`` makes the config the one given: created, then unchanged for the same
    config, updated for another (and the new config is kept)."""
    name = f"parity-ensure-{os.getpid() % 10_000}"
    config = BasinConfig(create_stream_on_append=True)
    assert (await s2.ensure_basin(name, config=config)).status is EnsureStatus.CREATED
    assert (await s2.ensure_basin(name, config=config)).status is EnsureStatus.CONFIG_UNCHANGED
    current = await s2.get_basin_config(name)
    assert (await s2.ensure_basin(name, config=current)).status is EnsureStatus.CONFIG_UNCHANGED
    other = BasinConfig(create_stream_on_append=False)
    assert (await s2.ensure_basin(name, config=other)).status is EnsureStatus.CONFIG_UPDATED
    assert (await s2.get_basin_config(name)).create_stream_on_append is False
    assert (await s2.ensure_basin(name, config=other)).status is EnsureStatus.CONFIG_UNCHANGED
    await s2.delete_basin(name)


async def test_a_basin_create_with_a_request_token_is_idempotent(
    http: aiohttp.ClientSession,
) -> None:
    """S2: a create retried with the same ``s2-request-token`` and config answers 201 ``noop``
    with the basin; another token, or the same token with another config, answers 409."""
    name = f"parity-token-{os.getpid() % 10_000}"
    body = {"basin": name, "config": {"create_stream_on_read": True}}
    first_headers = {"s2-request-token": "retry-1"}
    async with http.post("/v1/basins", json=body, headers=first_headers) as answer:
        assert (answer.status, answer.headers["s2-provision-result"]) == (201, "created")
        created = await answer.json()
    async with http.post("/v1/basins", json=body, headers=first_headers) as answer:
        assert (answer.status, answer.headers["s2-provision-result"]) == (201, "noop")
        assert await answer.json() == created
    other_config = {"basin": name, "config": {"create_stream_on_read": False}}
    for headers, document in (
        ({"s2-request-token": "retry-2"}, body),
        ({}, body),
        (first_headers, other_config),
    ):
        async with http.post("/v1/basins", json=document, headers=headers) as answer:
            assert (answer.status, (await answer.json())["code"]) == (
                409,
                "resource_already_exists",
            )
    async with http.post("/v1/basins", json=body, headers={"s2-request-token": "x" * 37}) as ans:
        assert (ans.status, (await ans.json())["code"]) == (400, "bad_header")
    async with http.get(f"/v1/basins/{name}") as answer:
        assert "creation_token_sha256" not in await answer.json()
    async with http.delete(f"/v1/basins/{name}") as answer:
        assert answer.status == 202


# -- compressed bodies --------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [Compression.GZIP, Compression.ZSTD])
async def test_compressed_appends_and_reads_unary_and_in_sessions(
    server: WalstreamServe, compression: Compression
) -> None:
    """S2's SDK with ``compression=`` sends ``content-encoding`` bodies and compressed S2S
    messages, and takes compressed answers; records arrive whole both ways."""
    async with S2(
        TOKEN, endpoints=Endpoints(account=server.url, basin=server.url), compression=compression
    ) as s2:
        basin = s2.basin(await new_basin(s2))
        await basin.create_stream("s")
        stream = basin.stream("s")
        bodies = [b"s" * 4096, bytes(range(256)) * 20]
        ack = await stream.append(AppendInput(records=[Record(body=b) for b in bodies]))
        assert (ack.start.seq_num, ack.end.seq_num) == (0, 2)
        async with stream.append_session() as session:
            ticket = await session.submit(AppendInput(records=[Record(body=b"z" * 20_000)]))
            assert (await ticket).end.seq_num == 3
        batch = await stream.read(start=SeqNum(0))
        assert [r.body for r in batch.records] == [*bodies, b"z" * 20_000]
        in_session = [
            r.body
            async for b in stream.read_session(start=SeqNum(0), limit=ReadLimit(count=3))
            for r in b.records
        ]
        assert in_session == [*bodies, b"z" * 20_000]


async def test_compressed_bodies_over_http(http: aiohttp.ClientSession, s2: S2) -> None:
    """Answers of 1 KiB and more are compressed with the coding ``accept-encoding`` prefers
    (zstd at equal quality); smaller ones are not; an unknown coding is 415, data that is not
    valid for its coding 400, and a body that decompresses past the limit 413; nothing of a
    refused append is stored."""
    name = await new_basin(s2)
    await s2.basin(name).create_stream("s")
    headers = {"s2-basin": name, "content-type": "application/json"}
    document = json.dumps({"records": [{"body": "x" * 3000}]}).encode()
    for coding, packed in (
        ("gzip", gzip.compress(document)),
        ("zstd", zstandard.ZstdCompressor().compress(document)),
    ):
        async with http.post(
            "/v1/streams/s/records", data=packed, headers={**headers, "content-encoding": coding}
        ) as answer:
            assert answer.status == 200, await answer.text()
    for accept, expected in (("gzip", "gzip"), ("gzip, zstd", "zstd"), ("zstd;q=0, gzip", "gzip")):
        async with http.get(
            "/v1/streams/s/records?seq_num=0",
            headers={"s2-basin": name, "accept-encoding": accept},
            auto_decompress=False,
        ) as answer:
            raw = await answer.read()
            assert answer.headers.get("content-encoding") == expected
            text = gzip.decompress(raw) if expected == "gzip" else _unzstd(raw)
            assert [r["body"] for r in json.loads(text)["records"]] == ["x" * 3000] * 2
    async with http.get(
        "/v1/streams/s/records/tail",
        headers={"s2-basin": name, "accept-encoding": "gzip"},
        auto_decompress=False,
    ) as answer:
        assert "content-encoding" not in answer.headers  # under 1 KiB
    for coding, body, status in (
        ("br", document, 415),
        ("gzip", b"not gzip at all", 400),
        ("zstd", gzip.compress(document), 400),
        ("gzip", gzip.compress(document)[:-12], 400),
        ("zstd", zstandard.ZstdCompressor().compress(bytes(17 << 20)), 413),
    ):
        async with http.post(
            "/v1/streams/s/records", data=body, headers={**headers, "content-encoding": coding}
        ) as answer:
            assert answer.status == status, (coding, await answer.text())
    assert (await s2.basin(name).stream("s").check_tail()).seq_num == 2


def _unzstd(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def _gzip_bomb(expanded_bytes: int) -> bytes:
    """One gzip member of ``expanded_bytes`` zeros (about 1/1000 of that compressed)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    pieces = [packer.compress(zeros) for _ in range(expanded_bytes >> 20)]
    return b"".join([*pieces, packer.flush()])


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.slow
async def test_a_gigabyte_gzip_bomb_gets_413_and_little_memory(
    server: WalstreamServe, http: aiohttp.ClientSession, s2: S2
) -> None:
    """A 1 GiB gzip bomb (about 1 MiB sent) is cut at the body limit (16 MiB): 413, and the
    server's peak resident memory grows by less than 64 MiB (measured on the ``walstream
    serve`` process: its high-water mark is reset first through ``/proc/<pid>/clear_refs``)."""
    name = await new_basin(s2)
    await s2.basin(name).create_stream("s")
    bomb = _gzip_bomb(1 << 30)
    assert len(bomb) < 2 << 20
    pid = server.pid
    headers = {"s2-basin": name, "content-type": "application/json", "content-encoding": "gzip"}
    # Warm up the path once (imports, buffers) so the measurement sees the bomb alone.
    async with http.post("/v1/streams/s/records", data=bomb, headers=headers) as answer:
        assert answer.status == 413
    before_kib = _rss_kib(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from now
    for _ in range(3):
        async with http.post("/v1/streams/s/records", data=bomb, headers=headers) as answer:
            assert answer.status == 413
            assert "decompresses to over" in (await answer.json())["message"]
    growth_mib = (_rss_kib(pid, "VmHWM") - before_kib) / 1024
    assert growth_mib < 64, f"peak RSS grew by {growth_mib:.1f} MiB"
    assert (await s2.basin(name).stream("s").check_tail()).seq_num == 0


# -- encryption with a client key ---------------------------------------------------------------


@pytest.mark.parametrize("cipher", [Encryption.AEGIS_256, Encryption.AES_256_GCM])
async def test_an_encrypted_stream_round_trips_with_its_key_unary_and_in_sessions(
    s2: S2, cipher: Encryption
) -> None:
    """S2: a basin's ``stream_cipher`` is the cipher of its streams (``StreamInfo.cipher``);
    appends and reads with the ``s2-encryption-key`` header round-trip, unary and in
    sessions; a plaintext stream ignores a key."""
    basin = s2.basin(await new_basin(s2, config=BasinConfig(stream_cipher=cipher)))
    info = await basin.create_stream("secret")
    assert info.cipher == cipher
    assert [s.cipher for s in (await basin.list_streams()).items] == [cipher]
    key = os.urandom(32)
    stream = basin.stream("secret", encryption_key=key)
    ack = await stream.append(
        AppendInput(records=[Record(body=b"hello", headers=[(b"h", b"v")]), Record(body=b"")])
    )
    assert (ack.start.seq_num, ack.end.seq_num) == (0, 2)
    async with stream.append_session() as session:
        ticket = await session.submit(AppendInput(records=[Record(body=b"s2" * 10240)]))
        assert (await ticket).end.seq_num == 3
    batch = await stream.read(start=SeqNum(0))
    assert [(r.body, r.headers) for r in batch.records] == [
        (b"hello", [(b"h", b"v")]),
        (b"", []),
        (b"s2" * 10240, []),
    ]
    in_session = [
        r.body
        async for b in stream.read_session(start=SeqNum(0), limit=ReadLimit(count=3))
        for r in b.records
    ]
    assert in_session == [b"hello", b"", b"s2" * 10240]

    plain = s2.basin(await new_basin(s2))
    await plain.create_stream("open")
    keyed = plain.stream("open", encryption_key=key)
    await keyed.append(AppendInput(records=[Record(body=b"clear")]))
    assert [r.body for r in (await plain.stream("open").read(start=SeqNum(0))).records] == [
        b"clear"
    ]


@pytest.mark.parametrize("cipher", [Encryption.AEGIS_256, Encryption.AES_256_GCM])
async def test_an_encrypted_stream_refuses_a_missing_malformed_or_wrong_key(
    s2: S2, http: aiohttp.ClientSession, cipher: Encryption
) -> None:
    """S2: no key is 400 ``bad_header`` naming the cipher (append and read); a key that is not
    base64 of 32 bytes is 400 ``bad_header``; a read with another key is 400
    ``decryption_failed``, and nothing is appended by a refused append."""
    name = await new_basin(s2, config=BasinConfig(stream_cipher=cipher))
    basin = s2.basin(name)
    await basin.create_stream("secret")
    bare = basin.stream("secret")
    with pytest.raises(S2ServerError) as refused:
        await bare.append(AppendInput(records=[Record(body=b"x")]))
    assert refused.value.code == "bad_header" and cipher.value in str(refused.value)
    with pytest.raises(S2ServerError) as refused:
        await bare.read(start=SeqNum(0))
    assert refused.value.code == "bad_header" and cipher.value in str(refused.value)
    writer = basin.stream("secret", encryption_key=os.urandom(32))
    await writer.append(AppendInput(records=[Record(body=b"secret")]))
    with pytest.raises(S2ServerError) as wrong:
        await basin.stream("secret", encryption_key=os.urandom(32)).read(start=SeqNum(0))
    assert (wrong.value.status_code, wrong.value.code) == (400, "decryption_failed")
    for bad in ("!!!!", base64.b64encode(b"short").decode(), "A" * 45):
        async with http.post(
            "/v1/streams/secret/records",
            json={"records": [{"body": "x"}]},
            headers={"s2-basin": name, "s2-encryption-key": bad},
        ) as answer:
            assert (answer.status, (await answer.json())["code"]) == (400, "bad_header"), bad
    assert (await bare.check_tail()).seq_num == 1


@pytest.mark.slow
async def test_the_key_is_stored_nowhere_and_logged_nowhere(tmp_path: Path) -> None:
    """A server with debug logging, an encrypted stream written and read (and refused with a
    wrong key): neither the key nor the plaintext is in any file of the deployment (WAL file,
    object files, metadata) nor in the server's log."""
    deployment = tmp_path / "deploy.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        "wal: {type: ebs, path: data/wal.img, capacity: 64MiB}\n"
        "object_store: {type: local, root: data/objects}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 64KiB, max_interval: 50ms}\n"
    )
    serve = WalstreamServe(deployment, token=TOKEN, serve_args=["-v"])
    serve.start()
    key = os.urandom(32)
    marker = b"PLAINTEXT-" + os.urandom(8).hex().encode()
    try:
        async with S2(TOKEN, endpoints=Endpoints(account=serve.url, basin=serve.url)) as s2:
            name = await new_basin(s2, config=BasinConfig(stream_cipher=Encryption.AEGIS_256))
            basin = s2.basin(name)
            await basin.create_stream("secret")
            stream = basin.stream("secret", encryption_key=key)
            for _ in range(50):
                await stream.append(AppendInput(records=[Record(body=marker * 50)] * 10))
            assert len((await stream.read(start=SeqNum(0))).records) > 0
            with pytest.raises(S2ServerError):
                await basin.stream("secret", encryption_key=os.urandom(32)).read(start=SeqNum(0))
        _, log = serve.stop_and_read_log()
    finally:
        if serve.running:
            serve.stop()
    assert "walstream" in log  # the server's log was read
    encoded = base64.b64encode(key)
    files = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert any("objects" in p.parts for p in files)
    for path in files:
        data = path.read_bytes()
        assert key not in data and encoded not in data, path
        assert marker not in data, path
    assert encoded.decode() not in log and key.hex() not in log


# -- UTF-8 stream names ---------------------------------------------------------------------------

S2_NAMES = [
    "orders",
    "a/b",
    "a b",
    "a-b",
    "a.b",
    "Ünïcode",
    "ü",
    "日本語/ストリーム",
    "🙂-smile",
    "#5",
    "5",
    "=x",
    "~tilde",
    "-dash",
    ".dot",
    "é" * 240,
]


@pytest.mark.parametrize("root", [False, True], ids=["basin", "root-basin"])
async def test_utf8_stream_names_list_in_s2_order_with_pages_and_prefixes(
    s2: S2, server: WalstreamServe, root: bool
) -> None:
    """S2 accepts any UTF-8 name of 1 to 512 bytes: each is created, appended to and read
    back under its own name; listings are in UTF-8 byte order, page with ``start_after`` and
    ``limit``, and prefix queries find exactly the names with that prefix, in every basin and
    in the root basin (whose streams the Python API sees under their encoded names)."""
    prefix = f"u{os.getpid() % 10_000}-{next(_basins)}-"
    # S2's longest name is 512 bytes (in the root basin the test's prefix takes some).
    names = [prefix + name for name in S2_NAMES] if root else [*S2_NAMES, "é" * 256]
    basin_name = "walstream" if root else await new_basin(s2)
    basin = s2.basin(basin_name)
    for name in names:
        assert (await basin.create_stream(name)).name == name
        await basin.stream(name).append(AppendInput(records=[Record(body=name.encode())]))
    for name in names:
        got = await basin.stream(name).read(start=SeqNum(0))
        assert [r.body for r in got.records] == [name.encode()]
    listed_prefix = prefix if root else ""
    ordered = sorted(names, key=lambda n: n.encode())
    assert [s.name for s in (await basin.list_streams(prefix=listed_prefix)).items] == ordered
    # Pages of 4 in order, each after the last of the previous one.
    paged: list[str] = []
    after = ""
    while True:
        page = await basin.list_streams(prefix=listed_prefix, start_after=after, limit=4)
        paged += [s.name for s in page.items]
        if not page.has_more:
            break
        after = page.items[-1].name
    assert paged == ordered
    for query in ("a", "a/", "日本", "é" * 10, "#", "5", "🙂"):
        wanted = [n for n in ordered if n.startswith(listed_prefix + query)]
        found = await basin.list_streams(prefix=listed_prefix + query)
        assert [s.name for s in found.items] == wanted, query
    async with aiohttp.ClientSession(server.url) as http:
        headers = {"authorization": f"Bearer {TOKEN}", "s2-basin": basin_name}
        for name in (".", "..", "é" * 257):
            async with http.post("/v1/streams", json={"stream": name}, headers=headers) as ans:
                assert (ans.status, (await ans.json())["code"]) == (422, "invalid")
        target = quote(names[1], safe="")  # 'a/b': its '/' percent-encoded in the path
        async with http.get(f"/v1/streams/{target}", headers=headers) as answer:
            assert answer.status == 200
    if root:
        for name in names:
            await basin.delete_stream(name)


def test_the_name_encoding_keeps_order_prefixes_and_is_reversible() -> None:
    """For arbitrary UTF-8 names: decode(encode(n)) == n, encode(n) is a valid walstream name,
    and order and prefixes of the UTF-8 bytes are those of the encodings."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from walstream.records import check_stream_name, decode_stream_name, encode_stream_name

    names = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30)

    @settings(max_examples=400, deadline=None)
    @given(names, names)
    def check(first: str, second: str) -> None:
        one, two = encode_stream_name(first), encode_stream_name(second)
        assert decode_stream_name(one) == first
        if first not in (".", ".."):
            assert check_stream_name(one) == one
        assert (one < two) == (first.encode() < second.encode())
        assert two.startswith(one) == second.encode().startswith(first.encode())

    check()
    for plain in ("orders", "order-lines", "eu.orders_2", "_x", "5"):
        assert encode_stream_name(plain) == plain


# -- SSE resumption and idempotent stream creates ---------------------------------------------------


async def _sse_events(answer: aiohttp.ClientResponse) -> list[tuple[str, str, str]]:
    """(event, data, id) of each event of a finished SSE answer."""
    text = (await answer.read()).decode()
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if fields:
            events.append((fields.get("event", ""), fields.get("data", ""), fields.get("id", "")))
    return events


async def test_an_sse_read_resumes_after_last_event_id(s2: S2, http: aiohttp.ClientSession) -> None:
    """S2: a batch event's id is ``<last seq_num>,<records so far>,<bytes so far>``; a request
    with ``Last-Event-ID`` (what an EventSource sends when it reconnects) continues after that
    record with ``count`` and ``bytes`` less what was delivered; a malformed one is 400."""
    name = await new_basin(s2)
    basin = s2.basin(name)
    await basin.create_stream("s")
    for i in range(5):
        await basin.stream("s").append(AppendInput(records=[Record(body=b"r%d" % i)]))
    headers = {"s2-basin": name, "accept": "text/event-stream"}
    query = {"seq_num": "0", "count": "3"}
    async with http.get("/v1/streams/s/records", params=query, headers=headers) as answer:
        events = await _sse_events(answer)
    batches = [e for e in events if e[0] == "batch"]
    first_bodies = [r["body"] for e in batches for r in json.loads(e[1])["records"]]
    assert first_bodies == ["r0", "r1", "r2"]
    last_id = batches[-1][2]
    assert last_id.split(",")[:2] == ["2", "3"]
    # Resumed after a first batch of two records: the third follows, and the count is spent.
    resumed = {**headers, "last-event-id": f"1,2,{2 * 10}"}
    async with http.get("/v1/streams/s/records", params=query, headers=resumed) as answer:
        events = await _sse_events(answer)
    bodies = [r["body"] for e in events if e[0] == "batch" for r in json.loads(e[1])["records"]]
    assert bodies == ["r2"] and events[-1][0] == "done"
    without_count = {**headers, "last-event-id": "3,4,40"}
    async with http.get(
        "/v1/streams/s/records", params={"seq_num": "0", "wait": "0"}, headers=without_count
    ) as answer:
        events = await _sse_events(answer)
    bodies = [r["body"] for e in events if e[0] == "batch" for r in json.loads(e[1])["records"]]
    assert bodies == ["r4"]
    for bad in ("x", "1,2", "1,2,3,4", "-1,0,0"):
        async with http.get(
            "/v1/streams/s/records", params=query, headers={**headers, "last-event-id": bad}
        ) as answer:
            assert (answer.status, (await answer.json())["code"]) == (400, "bad_header"), bad


async def test_a_stream_create_with_a_request_token_is_idempotent(
    s2: S2, http: aiohttp.ClientSession
) -> None:
    """S2: a create retried with the same ``s2-request-token`` (and config) answers 201 with
    the stream; another token, or none, answers 409."""
    name = await new_basin(s2)
    headers = {"s2-basin": name, "s2-request-token": "create-1"}
    async with http.post("/v1/streams", json={"stream": "s"}, headers=headers) as answer:
        assert answer.status == 201
        created = await answer.json()
    async with http.post("/v1/streams", json={"stream": "s"}, headers=headers) as answer:
        assert answer.status == 201 and await answer.json() == created
    for other in ({"s2-basin": name, "s2-request-token": "create-2"}, {"s2-basin": name}):
        async with http.post("/v1/streams", json={"stream": "s"}, headers=other) as answer:
            assert (answer.status, (await answer.json())["code"]) == (
                409,
                "resource_already_exists",
            )
    # Deleted and made again by another create: the old token does not answer for it.
    await s2.basin(name).delete_stream("s")
    async with http.post("/v1/streams", json={"stream": "s"}, headers={"s2-basin": name}) as ans:
        assert ans.status == 201
    async with http.post("/v1/streams", json={"stream": "s"}, headers=headers) as answer:
        assert answer.status == 409
