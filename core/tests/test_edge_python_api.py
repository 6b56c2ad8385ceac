"""Bad input through the Python API fails with ``InvalidArgument`` (a ``walstream.errors`` type)
and never with ``struct.error``, ``OverflowError``, ``UnicodeEncodeError`` or ``RecursionError``;
the stream-name rule holds on every metadata store; the CLI resolves ``#N`` and ``N`` to ids.

Explicit examples first, then property-based tests (hypothesis) that drive a Client on memory
backends with arbitrary arguments. ``--soak`` runs many more examples.
"""

from __future__ import annotations

import array
import asyncio
import json
import math
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from walstream import Client, Record
from walstream.config import EngineConfig, UploadConfig
from walstream.errors import InvalidArgument, StreamExists, WalstreamError
from walstream.metadata import MetadataStore
from walstream.metadata.memory import MemoryMetadataStore
from walstream.metadata.sqlite import SqliteMetadataStore
from walstream.objects.memory import MemoryObjectStore
from walstream.records import MAX_HEADER_COUNT, MAX_STREAM_NAME_LENGTH, parse_stream_ref
from walstream.wal.memory import MemoryWal

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"
CONFIG = EngineConfig(upload=UploadConfig(max_bytes=64 * 1024, max_interval_s=0.05))
_counter = iter(range(1_000_000))


def make_client(tag: str) -> Client:
    name = f"edge-{tag}-{next(_counter)}"
    return Client(
        wal=MemoryWal(name=name),
        objects=MemoryObjectStore(name),
        metadata=MemoryMetadataStore(name=name),
        config=CONFIG,
    )


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with make_client("api") as started:
        yield started


# -- records ------------------------------------------------------------------------------------

BAD_RECORDS: list[tuple[str, Callable[[], Record], str]] = [
    ("timestamp 2**63", lambda: Record(b"v", timestamp_ms=2**63), "timestamp_ms"),
    ("negative timestamp", lambda: Record(b"v", timestamp_ms=-1), "timestamp_ms"),
    ("float timestamp", lambda: Record(b"v", timestamp_ms=1.5), "timestamp_ms"),  # type: ignore[arg-type]
    ("bool timestamp", lambda: Record(b"v", timestamp_ms=True), "timestamp_ms"),
    ("str timestamp", lambda: Record(b"v", timestamp_ms="1"), "timestamp_ms"),  # type: ignore[arg-type]
    ("value not bytes", lambda: Record("text"), "Record.value"),  # type: ignore[arg-type]
    ("key not bytes", lambda: Record(b"v", key=5), "Record.key"),  # type: ignore[arg-type]
    (
        "header name of 65,536 bytes",
        lambda: Record(b"v", headers=(("n" * 65536, b""),)),
        "at most 65535 bytes",
    ),
    (
        "65,536 headers",
        lambda: Record(b"v", headers=tuple(("h", b"") for _ in range(MAX_HEADER_COUNT + 1))),
        "at most 65535 headers",
    ),
    (
        "lone surrogate in a header name",
        lambda: Record(b"v", headers=(("\ud800", b"x"),)),
        "not valid UTF-8",
    ),
    ("header value not bytes", lambda: Record(b"v", headers=(("h", "x"),)), "headers[0]"),  # type: ignore[arg-type]
    ("header not a pair", lambda: Record(b"v", headers=(("h",),)), "headers[0]"),  # type: ignore[arg-type]
    ("headers not a sequence", lambda: Record(b"v", headers=5), "Record.headers"),  # type: ignore[arg-type]
    ("headers a string", lambda: Record(b"v", headers="ab"), "Record.headers"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    ("make", "needle"),
    [(make, needle) for _, make, needle in BAD_RECORDS],
    ids=[label for label, _, _ in BAD_RECORDS],
)
def test_a_record_the_batch_format_cannot_encode_is_invalid(
    make: Callable[[], Record], needle: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        make()
    assert needle in str(raised.value)


def test_the_largest_encodable_header_fields_are_accepted() -> None:
    record = Record(
        b"v",
        headers=tuple([("n" * 65535, b"x")] + [("h", b"") for _ in range(MAX_HEADER_COUNT - 1)]),
        timestamp_ms=2**63 - 1,
    )
    assert len(record.headers) == MAX_HEADER_COUNT


async def test_a_memoryview_of_wide_items_is_stored_as_its_bytes(client: Client) -> None:
    # len() of such a view counts items, not bytes: the stored value must be the bytes.
    numbers = array.array("i", [1, 2, 3])
    stream = await client.create_stream("views")
    await stream.append([Record(memoryview(numbers), key=memoryview(numbers))])
    (record,) = (await stream.read(start=0)).records
    assert record.value == numbers.tobytes()
    assert record.key == numbers.tobytes()


async def test_append_arguments_are_checked(client: Client) -> None:
    stream = await client.create_stream("appends")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"match_tail": 10**5000}, "match_tail"),
        ({"match_tail": 2**63}, "match_tail"),
        ({"match_tail": -1}, "match_tail"),
        ({"match_tail": "0"}, "match_tail"),
        ({"fencing_token": "\udc80"}, "fencing_token"),
        ({"fencing_token": "t" * 5000}, "fencing_token"),
        ({"fencing_token": 7}, "fencing_token"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(InvalidArgument) as raised:
            await stream.append([Record(b"v")], **kwargs)
        assert needle in str(raised.value), kwargs
        assert len(str(raised.value)) < 400  # a 5,000-digit number is not echoed back
    for records in (Record(b"v"), 5, b"abc", [b"abc"], []):
        with pytest.raises(InvalidArgument):
            await stream.append(records)  # type: ignore[arg-type]
    ack = await stream.append([Record(b"ok")], match_tail=0)
    assert (ack.start, ack.end) == (0, 1)


async def test_read_trim_and_token_arguments_are_checked(client: Client) -> None:
    stream = await client.create_stream("reads")
    await stream.append([Record(b"a")])
    bad_reads: list[dict[str, Any]] = [
        {"start": 2**63},
        {"start": -1},
        {"start": 10**5000},
        {"start": 1.0},
        {"tail_offset": 2**64},
        {"from_timestamp": 2**63},
        {"from_timestamp": -(2**63) - 1},
        {"start": 0, "limit_records": 0},
        {"start": 0, "limit_records": 2**64},
        {"start": 0, "limit_bytes": True},
        {"start": 0, "wait": math.nan},
        {"start": 0, "wait": -1},
        {"start": 0, "wait": "1"},
        {"start": 0, "wait": -(10**400)},
    ]
    for kwargs in bad_reads:
        with pytest.raises(InvalidArgument):
            await stream.read(**kwargs)
    for new_start in (2**63, -1, 10**5000, "1"):
        with pytest.raises(InvalidArgument):
            await stream.trim(new_start)  # type: ignore[arg-type]
    for token in ("\ud800", "x" * 4097, b"t"):
        with pytest.raises(InvalidArgument):
            await stream.set_fencing_token(token)  # type: ignore[arg-type]
    # Good values still work, including the extremes of the ranges.
    assert [r.value for r in (await stream.read(from_timestamp=-(2**63))).records] == [b"a"]
    assert (await stream.read(start=0, limit_records=2**63 - 1, wait=math.inf)).records
    await stream.set_fencing_token("é" * 2048)  # 4096 bytes of UTF-8


async def test_stream_lookups_are_checked(client: Client) -> None:
    for ref in (2**63, 2**64, -1, 10**5000, True, None, 1.0, b"x", "", "\ud800"):
        with pytest.raises(InvalidArgument):
            await client.open_stream(ref)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            await client.delete_stream(ref)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await client.list_streams(prefix="\udfff")
    with pytest.raises(InvalidArgument):
        await client.list_streams(prefix=None)  # type: ignore[arg-type]


# -- the stream-name rule -------------------------------------------------------------------------

BAD_NAMES = [
    "../x",
    "..",
    ".",
    "a/b",
    "a\x00b",
    "\x00",
    "tab\there",
    "new\nline",
    "with space",
    "#5",
    "#orders",
    "=5",
    "ünïcode",
    "+2D",  # an escape of a byte that stands for itself ('-')
    "~41",  # an escape outside its range ('A')
    "+2c",  # lower-case hex
    "~C3",  # a lone UTF-8 lead byte
    "x+2",  # a cut escape
    "\ud800",
    "x" * (MAX_STREAM_NAME_LENGTH + 1),
    "x" * (1 << 20),
    "",
]
GOOD_NAMES = [
    "orders",
    "order-lines",
    "eu.orders_2",
    "_private",
    "2024-orders",
    "5a",
    "A",
    "x" * MAX_STREAM_NAME_LENGTH,
    "conformance-123-4-raced",
    "bench-0001-3",
    # Encodings of S2's UTF-8 names (walstream.records.encode_stream_name).
    "5",
    "0042",
    ".hidden",
    "-looks-like-an-option",
    "a/2Fb",
    "~C3~BCn~C3~AFcode",
    "with+20space",
]


def metadata_stores(tmp_path: Path) -> Iterator[MetadataStore]:
    yield MemoryMetadataStore()
    yield SqliteMetadataStore(tmp_path / "meta.db")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_every_metadata_store_enforces_the_stream_name_rule(
    kind: str, tmp_path: Path
) -> None:
    store: MetadataStore = (
        MemoryMetadataStore() if kind == "memory" else SqliteMetadataStore(tmp_path / "meta.db")
    )
    try:
        for name in BAD_NAMES:
            with pytest.raises(InvalidArgument) as raised:
                await store.create_stream(name)
            assert len(str(raised.value)) < 400, "a 1 MiB name is not echoed back"
        assert await store.list_streams() == []
        for name in GOOD_NAMES:
            assert (await store.create_stream(name)).name == name
        with pytest.raises(StreamExists):
            await store.create_stream("orders")
        assert (await store.create_stream(None)).name is None
    finally:
        await store.close()


async def test_the_client_enforces_the_stream_name_rule(client: Client) -> None:
    for name in BAD_NAMES:
        with pytest.raises(InvalidArgument):
            await client.create_stream(name)
    for name in GOOD_NAMES:
        assert (await client.create_stream(name)).name == name
    for name in GOOD_NAMES:
        assert (await client.open_stream(name)).name == name


def test_stream_references_are_unambiguous() -> None:
    assert parse_stream_ref("#5") == 5
    assert parse_stream_ref("5") == 5
    assert parse_stream_ref("007") == 7
    assert parse_stream_ref("orders") == "orders"
    assert parse_stream_ref("5a") == "5a"
    assert parse_stream_ref("=5") == "5"  # the stream called 5
    assert parse_stream_ref("=#5") == "#5"
    for text in ("#", "#x", "#5a", "#-1", "#" + "9" * 30, "9" * 30, "#١", "", "="):
        with pytest.raises(InvalidArgument):
            parse_stream_ref(text)
    assert parse_stream_ref("١") == "١"  # not ASCII digits: a (nonexistent) name, not an id


@pytest.mark.slow
def test_the_cli_addresses_streams_by_id_and_refuses_hash_names(tmp_path: Path) -> None:
    config = tmp_path / "deploy.yaml"
    config.write_text(
        "node: {id: 1}\nwal: {type: memory}\n"
        "object_store: {type: local, root: data/objects}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
    )

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [WALSTREAM, "--config", str(config), *args],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )

    refused = cli("streams", "create", "#5")
    assert refused.returncode == 1 and "InvalidArgument" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert cli("streams", "create", "orders").returncode == 0
    assert cli("append", "#1", stdin="by-hash\n").returncode == 0
    assert cli("append", "1", stdin="by-number\n").returncode == 0
    read = cli("read", "orders", "--format", "json")
    assert read.returncode == 0, read.stderr
    values = [json.loads(line)["value"] for line in read.stdout.splitlines() if line.strip()]
    assert values == ["by-hash", "by-number"]
    unclear = cli("append", "#orders", stdin="x\n")
    assert unclear.returncode == 1 and "InvalidArgument" in unclear.stderr
    assert "'#' introduces a stream id" in unclear.stderr
    # A stream literally called 5 (S2 allows it): '=5' names it, '5' and '#5' stay ids.
    assert cli("streams", "create", "5").returncode == 0
    assert cli("append", "=5", stdin="named-five\n").returncode == 0
    named = cli("read", "=5", "--format", "json")
    assert [json.loads(line)["value"] for line in named.stdout.splitlines()] == ["named-five"]
    by_id = cli("read", "5", "--format", "json")
    assert by_id.returncode == 1 and "StreamNotFound" in by_id.stderr, by_id.stderr


# -- property-based: arbitrary arguments --------------------------------------------------------

huge_ints = st.one_of(
    st.integers(),
    st.integers(min_value=2**62, max_value=2**66),
    st.integers(min_value=-(2**66), max_value=-(2**62)),
    st.just(5000).map(lambda digits: 10**digits),  # a 5,001-digit number
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64]),
)
texts = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(exclude_categories=()), max_size=10),
    st.sampled_from(["\ud800", "..", "#5", "5", "orders", "a/b", "\x00", "x" * 300]),
)
scalars = st.one_of(
    st.none(), st.booleans(), huge_ints, st.floats(allow_nan=True), texts, st.binary(max_size=40)
)
anything = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner), max_leaves=8
)
headers = st.one_of(
    st.lists(st.tuples(texts, st.binary(max_size=10)), max_size=4),
    anything,
)


@st.composite
def records(draw: st.DrawFn) -> Any:
    """A Record built from arbitrary fields, or the InvalidArgument building it raised."""
    try:
        return Record(
            draw(st.one_of(st.binary(max_size=30), anything)),
            key=draw(st.one_of(st.none(), st.binary(max_size=10), anything)),
            headers=draw(headers),
            timestamp_ms=draw(st.one_of(st.none(), huge_ints, anything)),
        )
    except WalstreamError as error:
        assert isinstance(error, InvalidArgument), error
        return Record(b"fallback")


operations = st.one_of(
    st.tuples(st.just("create"), st.one_of(texts, anything)),
    st.tuples(st.just("open"), st.one_of(texts, huge_ints, anything)),
    st.tuples(st.just("delete"), st.one_of(texts, huge_ints)),
    st.tuples(st.just("list"), st.one_of(texts, anything)),
    st.tuples(
        st.just("append"),
        st.lists(records(), min_size=0, max_size=3),
        st.one_of(st.none(), huge_ints, anything),
        st.one_of(st.none(), texts, anything),
    ),
    st.tuples(
        st.just("read"),
        st.fixed_dictionaries(
            {},
            optional={
                "start": st.one_of(huge_ints, anything),
                "from_timestamp": huge_ints,
                "tail_offset": huge_ints,
                "limit_records": st.one_of(huge_ints, anything),
                "limit_bytes": huge_ints,
                "wait": st.one_of(st.floats(max_value=0.01), st.sampled_from([0, -1, "x"])),
            },
        ),
    ),
    st.tuples(st.just("trim"), st.one_of(huge_ints, anything)),
    st.tuples(st.just("token"), st.one_of(st.none(), texts, anything)),
)


async def _run(client: Client, operation: tuple[Any, ...]) -> None:
    stream = await client.open_stream("target")
    kind = operation[0]
    if kind == "create":
        await client.create_stream(operation[1])
    elif kind == "open":
        await client.open_stream(operation[1])
    elif kind == "delete":
        if operation[1] not in ("target", 1):
            await client.delete_stream(operation[1])
    elif kind == "list":
        await client.list_streams(operation[1])
    elif kind == "append":
        await stream.append(operation[1], match_tail=operation[2], fencing_token=operation[3])
    elif kind == "read":
        await stream.read(**operation[1])
    elif kind == "trim":
        await stream.trim(operation[1])
    elif kind == "token":
        # Set, then clear: later appends without a token keep working.
        await stream.set_fencing_token(operation[1])
        await stream.set_fencing_token(None)


def test_arbitrary_python_api_arguments_raise_only_walstream_errors(soak: bool) -> None:
    loop = asyncio.new_event_loop()
    client = make_client("property")
    try:
        loop.run_until_complete(client.start())
        loop.run_until_complete(client.create_stream("target"))

        @settings(
            max_examples=2000 if soak else 150,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            database=None,
        )
        @given(st.lists(operations, min_size=1, max_size=4))
        def check(sequence: list[tuple[Any, ...]]) -> None:
            for operation in sequence:
                try:
                    loop.run_until_complete(asyncio.wait_for(_run(client, operation), 10))
                except WalstreamError:
                    pass  # any walstream error is a valid answer to arbitrary input

        check()
        # The node still works after all of that.
        stream = loop.run_until_complete(client.open_stream("target"))
        tail = loop.run_until_complete(stream.check_tail())
        ack = loop.run_until_complete(stream.append([Record(b"after")]))
        assert ack.start == tail
    finally:
        loop.run_until_complete(client.close())
        loop.close()
