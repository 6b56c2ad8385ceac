"""The wire forms of ``walstream serve`` (:mod:`walstream.server.s2`): the S2 status and code of
every walstream error, the protobuf and S2S codecs checked against S2's own generated messages
(from the ``s2-sdk`` package), and the answer to a bug, checked by calling the ASGI application
directly over a stub node."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from typing import Any, cast

import pytest
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    BasinExists,
    BasinNotFound,
    CapacityError,
    ConfigError,
    CorruptionError,
    DataLossError,
    FencedError,
    IdentityMismatch,
    InvalidArgument,
    OutOfRangeError,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
    Throttled,
    WalstreamError,
)
from walstream.server.s2.app import S2App
from walstream.server.s2.compression import Coding
from walstream.server.s2.errors import S2Error, from_walstream
from walstream.server.s2.wire import (
    FrameReader,
    decode_append_input,
    encode_append_ack,
    encode_frame,
    encode_read_batch,
    encode_terminal,
)

pb = pytest.importorskip("s2_sdk._generated.s2.v1.s2_pb2")

TOKEN = "codec-token"


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (StreamNotFound("no stream"), 404, "stream_not_found"),
        (BasinNotFound("no basin"), 404, "basin_not_found"),
        (StreamExists("exists"), 409, "resource_already_exists"),
        (BasinExists("exists"), 409, "resource_already_exists"),
        (FencedError("fenced"), 409, "transaction_conflict"),
        (InvalidArgument("bad"), 422, "invalid"),
        (ConfigError("bad config"), 422, "invalid"),
        (CapacityError("full"), 429, "rate_limited"),
        (Throttled("slow down"), 429, "rate_limited"),
        (BackendUnavailable("down"), 503, "unavailable"),
        (AmbiguousError("unknown outcome"), 504, "upstream_timeout"),
        (CorruptionError("bad crc"), 500, "storage"),
        (IdentityMismatch("other deployment"), 500, "storage"),
        (DataLossError("lost", 1, 2, 3), 500, "storage"),
        (WalstreamError("unlisted"), 500, "other"),
    ],
)
def test_every_error_class_has_its_status_and_code(
    error: WalstreamError, status: int, code: str
) -> None:
    answer = from_walstream(error)
    assert (answer.status, answer.code) == (status, code)
    assert json.loads(answer.encoded()) == {"code": code, "message": answer.message}


def test_the_412_and_416_bodies_are_s2s() -> None:
    assert json.loads(from_walstream(TailMismatchError("moved", 7)).encoded()) == {
        "seq_num_mismatch": 7
    }
    assert json.loads(from_walstream(OutOfRangeError("past", 0, 9)).encoded()) == {
        "tail": {"seq_num": 9, "timestamp": 0}
    }
    lost = from_walstream(DataLossError("lost", 1, 10, 20)).message
    assert "read from seq_num 20" in lost


def test_an_append_input_from_s2s_generated_code_decodes_exactly() -> None:
    message = pb.AppendInput(
        records=[
            pb.AppendRecord(
                timestamp=0,
                headers=[pb.Header(name=b"", value=b"fence"), pb.Header(name=b"n", value=b"")],
                body=b"body",
            ),
            pb.AppendRecord(body=b"\x00" * 300),
        ],
        match_seq_num=2**64 - 1,
        fencing_token="tøken",
    )
    decoded = decode_append_input(message.SerializeToString())
    assert decoded.match_seq_num == 2**64 - 1 and decoded.fencing_token == "tøken"
    first, second = decoded.records
    assert (first.timestamp, first.headers, first.body) == (
        0,
        ((b"", b"fence"), (b"n", b"")),
        b"body",
    )
    assert (second.timestamp, second.headers, second.body) == (None, (), b"\x00" * 300)
    absent = decode_append_input(pb.AppendInput(records=[]).SerializeToString())
    assert (absent.match_seq_num, absent.fencing_token, absent.records) == (None, None, [])


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x05ab", b"\x80", b"\x0a", b"\x00\x01", b"\x0b", b"\x0a\x02\x1a\xff", b"\xff" * 11],
)
def test_malformed_protobuf_is_a_400_bad_proto(data: bytes) -> None:
    with pytest.raises(S2Error) as raised:
        decode_append_input(data)
    assert (raised.value.status, raised.value.code) == (400, "bad_proto")


def test_acks_and_batches_parse_with_s2s_generated_code() -> None:
    ack = pb.AppendAck.FromString(encode_append_ack((0, 5), (3, 2**40), (2**63, 7)))
    assert (ack.start.seq_num, ack.start.timestamp) == (0, 5)
    assert (ack.end.seq_num, ack.end.timestamp, ack.tail.seq_num) == (3, 2**40, 2**63)
    batch = pb.ReadBatch.FromString(
        encode_read_batch([(0, 0, ((b"", b"trim"),), b""), (9, 1, (), b"x" * 200)], (10, 1))
    )
    assert [(r.seq_num, r.timestamp, r.body) for r in batch.records] == [
        (0, 0, b""),
        (9, 1, b"x" * 200),
    ]
    assert [(h.name, h.value) for h in batch.records[0].headers] == [(b"", b"trim")]
    assert batch.HasField("tail") and batch.tail.seq_num == 10
    heartbeat = pb.ReadBatch.FromString(encode_read_batch([], (4, 0)))
    assert not heartbeat.records and heartbeat.HasField("tail") and heartbeat.tail.seq_num == 4
    assert not pb.ReadBatch.FromString(encode_read_batch([], None)).HasField("tail")


def test_s2s_frames_round_trip_and_a_terminal_carries_status_and_json() -> None:
    reader = FrameReader(max_message_bytes=1 << 20)
    stream = encode_frame(b"one") + encode_frame(b"") + encode_frame(b"x" * 70_000)
    messages: list[bytes] = []
    for index in range(0, len(stream), 7):  # split anywhere
        messages += reader.feed(stream[index : index + 7])
    assert messages == [b"one", b"", b"x" * 70_000] and not reader.pending
    terminal = encode_terminal(412, b'{"seq_num_mismatch":3}')
    assert terminal[3] == 0x80 and struct.unpack(">H", terminal[4:6])[0] == 412
    with pytest.raises(S2Error, match="terminal"):
        FrameReader(1 << 20).feed(terminal)
    with pytest.raises(S2Error, match="not valid zstd"):
        FrameReader(1 << 20).feed(b"\x00\x00\x02\x20x")
    # Compressed messages (flag bits 01 zstd, 10 gzip) come out decompressed, bounded.
    for coding in (Coding.ZSTD, Coding.GZIP):
        packed = encode_frame(b"q" * 5000, coding)
        assert packed[3] == coding << 5 and len(packed) < 200
        assert FrameReader(1 << 20).feed(packed) == [b"q" * 5000]
        with pytest.raises(S2Error, match="decompresses to over 4096"):
            FrameReader(4096).feed(packed)
        assert encode_frame(b"small", coding)[3] == 0  # under 1 KiB: sent as it is
    with pytest.raises(S2Error, match="outside"):
        FrameReader(16).feed(encode_frame(b"y" * 100))


class _BrokenNode:
    """A node whose every call fails with an unexpected exception (a bug)."""

    node_id = 1
    node_epoch = 1
    failure = None
    metadata = property(lambda self: self)

    async def list_basins(self, *args: Any) -> list[Any]:
        raise RuntimeError("internal detail that must not leak: /secret/path")


async def asgi(app: S2App, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """One request straight into the ASGI application."""
    sent: list[dict[str, Any]] = []
    received = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        return received.pop(0) if received else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    await app(scope, receive, send)
    status = sent[0]["status"]
    body = b"".join(message.get("body", b"") for message in sent[1:])
    return status, json.loads(body) if body else None


async def test_a_bug_answers_500_other_without_its_traceback() -> None:
    app = S2App(cast(Any, _BrokenNode()), token=TOKEN)
    status, body = await asgi(app, "GET", "/v1/basins", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 500
    assert body == {"code": "other", "message": "internal error; the server log has the details"}
    assert "secret" not in json.dumps(body)


async def test_answers_given_before_the_engine() -> None:
    app = S2App(cast(Any, _BrokenNode()), token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    cases: list[tuple[str, str, dict[str, str], int, str]] = [
        ("GET", "/v1/basins", {}, 401, "authn"),
        ("GET", "/v1/basins", {"Authorization": "Bearer wrong"}, 401, "authn"),
        ("GET", "/nowhere", auth, 404, "bad_path"),
        ("PUT", "/v1/basins", auth, 405, "bad_path"),
        ("GET", "/v1/streams", auth, 400, "bad_header"),
        ("GET", "/v1/streams", {**auth, "s2-basin": "Bad_Name"}, 400, "bad_header"),
        ("GET", "/v1/access-tokens", auth, 501, "not_implemented"),
    ]
    for method, path, headers, status, code in cases:
        got, body = await asgi(app, method, path, headers)
        assert (got, body["code"]) == (status, code), body
        assert body["message"]


def test_the_server_package_and_the_node_lock_do_not_import_the_http_server() -> None:
    # Every command imports walstream.engine.node_lock; only `walstream serve` needs the HTTP stack.
    probe = (
        "import sys, walstream.server, walstream.engine.node_lock; "
        "print('httptools' in sys.modules or 'h2' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
