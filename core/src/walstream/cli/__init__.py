"""The ``walstream`` command line.

Every command takes ``--config FILE`` (a deployment YAML; default: the embedded deployment in
``./walstream-data``) and ``-v`` (debug logging of walstream, tracebacks on errors; ``-vv`` also
debug logging of third-party libraries such as botocore). Failures print one line,
``walstream: error: <ErrorClass>: <message>``, and exit with 1 (2 for configuration and usage
errors).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from walstream.config.factory import BackendKind
from walstream.config.host import HostDeployment, PluginHost, find_host
from walstream.errors import (
    ConfigError,
    CorruptionError,
    InvalidArgument,
    NotFound,
    OutOfRangeError,
    StreamNotFound,
    WalstreamError,
)
from walstream.records import ReadResult, Record, SequencedRecord, parse_stream_ref

if TYPE_CHECKING:
    from walstream.engine.node import Stream

__all__ = ["ProgressBar", "build_parser", "main", "progress_bar"]

log = logging.getLogger("walstream.cli")

PROG = "walstream"
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CORRUPT = 2
"""``inspect wal``: the medium is damaged or belongs to another deployment or node."""
EXIT_INTERRUPTED = 130
EXIT_DEADLINE = 124
"""The command did not finish within ``--timeout`` (the code of coreutils ``timeout``)."""

DEFAULT_TIMEOUT_S = 120.0
"""Deadline of a one-shot command unless ``--timeout`` says otherwise."""
# Long-running by nature: an append streams its input (a large file, a producer's pipe) for as
# long as the input lasts; Ctrl-C or an explicit --timeout stops it.
UNBOUNDED_COMMANDS = frozenset({"serve", "bench", "demo", "append"})
"""Commands that run until stopped: no deadline unless ``--timeout`` is given (also
``tail --follow``)."""
STOP_GRACE_S = 2.0
"""After Ctrl-C or the deadline, how long a command may take to close before it is abandoned
(each of two steps: the command's own cleanup, then every task left)."""
DURABILITY_NOTE = (
    "records acknowledged before are durable in the write-ahead log; the next start on this "
    "deployment uploads them"
)

READ_PAGE_RECORDS = 1000
DEFAULT_APPEND_BATCH = 100
DEFAULT_TAIL_LINES = 10

EPILOG = """\
examples:
  walstream streams create orders
  seq 1 1000 | walstream append orders
  walstream append orders --file events.txt --key user-42 --batch 500
  walstream read orders --start 0 --limit 10 --format json
  walstream tail orders -n 100 -f
  walstream trim orders 500
  walstream --config deploy.yaml streams list --prefix ord
  walstream inspect metadata          # lists every object with its KEY
  walstream inspect object KEY        # or the object's file under ./walstream-data/objects/
  walstream recover -c deploy.yaml    # recover the WAL, or say what was lost
  walstream plugins
  walstream demo --streams 3 --records 20000
  walstream serve -c deploy.yaml --listen 127.0.0.1:7400
  walstream bench --streams 4 --records 50000 --json bench.json

Without --config every command uses the embedded deployment in ./walstream-data
(an ebs or memory WAL, a local object store and SQLite metadata).
Exit status: 0 ok, 1 error (one line on stderr), 2 bad configuration or usage.
While `walstream serve` runs the node (it holds <metadata file>.node-N.lock),
append, trim and streams create/delete go through its HTTP API, and read and
tail get the records not yet uploaded from it; nothing takes the node over.
When it cannot be reached,
read/tail show committed records only (and say so), and writes, recover, demo,
bench and a second serve refuse with NodeBusy naming it (exit 2).
Short options mean the same in every command: -c config, -v verbose, -f follow,
-n count, -i input file, -k key (conformance: -k EXPR selects tests, as in pytest),
-b batch. --json and --format json write JSON lines (one object per line).
"""


# -- progress -------------------------------------------------------------------------------------


class ProgressBar(Protocol):
    def update(self, amount: int) -> Any: ...

    def close(self) -> Any: ...


class _TextProgress:
    """A dependency-free progress line on stderr, redrawn at most ten times a second."""

    def __init__(self, total: int | None, description: str, unit: str, stream: IO[str]) -> None:
        self._total = total
        self._description = description
        self._unit = unit
        self._stream = stream
        self._done = 0
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._drawn_width = 0

    def update(self, amount: int) -> None:
        self._done += amount
        now = time.monotonic()
        if now - self._last_draw >= 0.1:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self._started, 1e-9)
        done = _human(self._done, self._unit)
        rate = _human(int(self._done / elapsed), self._unit)
        if self._total:
            percent = 100.0 * self._done / self._total
            width = 30
            filled = int(width * min(self._done, self._total) / self._total)
            bar = "#" * filled + "-" * (width - filled)
            line = f"{self._description} [{bar}] {percent:5.1f}% {done} {rate}/s"
        else:
            line = f"{self._description} {done} {rate}/s"
        # Pad over the rest of a longer previous line.
        self._stream.write("\r" + line.ljust(self._drawn_width))
        self._drawn_width = len(line)
        self._stream.flush()

    def close(self) -> None:
        self._draw(time.monotonic())
        self._stream.write("\n")
        self._stream.flush()


class _NoProgress:
    def update(self, amount: int) -> None:
        return None

    def close(self) -> None:
        return None


def _human(amount: int, unit: str) -> str:
    if unit != "B":
        return f"{amount} {unit}"
    value = float(amount)
    for suffix in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or suffix == "GiB":
            return f"{value:.0f} {suffix}" if suffix == "B" else f"{value:.1f} {suffix}"
        value /= 1024
    return f"{amount} B"


def progress_bar(
    total: int | None, description: str, unit: str = "B", enabled: bool = True
) -> ProgressBar:
    """A progress bar on stderr: tqdm when installed, else a plain redrawn line."""
    if not enabled:
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _TextProgress(total, description, unit, sys.stderr)
    bar: ProgressBar = tqdm(
        total=total,
        desc=description,
        unit=unit,
        unit_scale=unit == "B",
        unit_divisor=1024,
        file=sys.stderr,
        leave=True,
        dynamic_ncols=True,
    )
    return bar


# -- deployments and clients ----------------------------------------------------------------------


@asynccontextmanager
async def _open_client(config: str | None, *, writes: bool = True) -> AsyncIterator[Any]:
    """The node of ``config`` for one command, never taking it over from a live process.

    No live process runs the node: ``walstream.open(config)`` as always (recovering the node),
    holding the node lock (:mod:`walstream.server.live`) so that no server starts on it meanwhile.
    A live ``walstream serve`` runs it: a :class:`_LiveNodeClient` that sends writes to the
    server's HTTP API and asks it for what is not committed yet; when the server cannot be reached (or the live
    process is not a server), reads show the committed records only (with a warning on stderr)
    and writes raise :class:`~walstream.server.live.NodeBusy` naming the running process.
    """
    import walstream
    from walstream.server import live

    deployment = _load_deployment(config)
    path = live.lock_path(deployment)
    holder = live.probe(path)
    if holder is None and path is not None:
        try:
            lock = live.NodeLock.acquire(path, deployment.node_id, f"{PROG} {_command_name()}")
        except live.NodeBusy as busy:
            holder = busy.holder  # a server started between the probe and the lock
        else:
            try:
                async with walstream.open(config) as client:
                    yield client
            finally:
                lock.release()
            return
    if holder is None:
        async with walstream.open(config) as client:
            yield client
        return
    async with _LiveNodeClient.open(config, deployment, holder, writes=writes) as client:
        yield client


_running_command = "command"
"""The command being run (``read``, ``streams list``...), recorded in the node lock it holds."""


def _command_name() -> str:
    return _running_command


@asynccontextmanager
async def _holding_node(config: str | None) -> AsyncIterator[None]:
    """Hold the node lock of ``config`` for a command that runs the node itself and has no
    way through a server (``recover``, ``demo``, ``bench``): raises
    :class:`~walstream.server.live.NodeBusy` (exit 2) naming the live process that runs the node."""
    from walstream.server import live

    deployment = _load_deployment(config)
    path = live.lock_path(deployment)
    if path is None:
        yield
        return
    lock = live.NodeLock.acquire(path, deployment.node_id, f"{PROG} {_command_name()}")
    try:
        yield
    finally:
        lock.release()


def _plugin_host() -> PluginHost:
    """The plugin host (found through its entry point), which reads deployments and lists
    backends for every command."""
    return find_host(f"{PROG} {_command_name()} reads deployments through the plugin host")


def _load_deployment(config: str | None) -> HostDeployment:
    """The deployment of ``--config``, or the embedded default one."""
    return _plugin_host().load_deployment(config)


@asynccontextmanager
async def _backend(config: str | None, kind: BackendKind) -> AsyncIterator[Any]:
    """Build one backend (``object_store`` or ``metadata``) of the deployment without starting
    a node: inspecting must not register a node or claim a WAL."""
    deployment = _load_deployment(config)
    factory = deployment.factories[kind]
    options = {key: value for key, value in deployment.sections[kind].items() if key != "type"}
    backend = factory.create(options, deployment.build_context())
    try:
        yield backend
    finally:
        await backend.close()


# -- a node run by another process ---------------------------------------------------------------

LIVE_POLL_WAIT_S = 10
"""``tail -f`` through a live server: seconds each long poll waits for new records."""
HTTP_TIMEOUT_S = 60.0


class NodeUnreachable(WalstreamError):
    """The live server of the node did not answer (connection refused, reset or timed out)."""


class _RemoteNode:
    """The HTTP API of a live ``walstream serve`` (standard library only: urllib in a thread)."""

    def __init__(self, url: str, token: str | None) -> None:
        import urllib.request

        self.url = url
        self._token = token
        # Never through an HTTP proxy of the environment: the node's address is what it recorded.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        timeout: float = HTTP_TIMEOUT_S,
    ) -> Any:
        return await _in_daemon_thread(lambda: self._call(method, path, body, query, timeout))

    def _call(
        self, method: str, path: str, body: Any, query: dict[str, Any] | None, timeout: float
    ) -> Any:
        import urllib.error
        import urllib.parse
        import urllib.request

        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as failed:
            raise _remote_error(failed.code, failed.read(), self.url) from None
        except (urllib.error.URLError, OSError, ValueError) as failed:
            reason = getattr(failed, "reason", failed)
            raise NodeUnreachable(
                f"the node's server at {self.url} did not answer: {reason}"
            ) from None


async def _in_daemon_thread(work: Callable[[], Any]) -> Any:
    """``work()`` in a daemon thread. Not the loop's default executor: asyncio.run waits for
    that one's threads at exit, so Ctrl-C during a long poll would hang until it answered; an
    abandoned daemon thread never keeps the process alive."""
    import threading

    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(outcome: Any, failure: BaseException | None) -> None:
        if done.cancelled():
            return
        if failure is not None:
            done.set_exception(failure)
        else:
            done.set_result(outcome)

    def run() -> None:
        try:
            outcome = work()
        except BaseException as failure:  # handed to the waiting task, which re-raises it
            with suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(settle, None, failure)
            return
        with suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, outcome, None)

    threading.Thread(target=run, name="walstream-http", daemon=True).start()
    return await done


def _remote_error(status: int, payload: bytes, url: str) -> WalstreamError:
    """The typed error of a server's JSON error answer (fields as in walstream.server)."""
    from walstream import errors

    try:
        body = json.loads(payload)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return WalstreamError(f"the node's server at {url} answered HTTP {status}")
    name = str(body.get("error", ""))
    message = str(body.get("message") or name)
    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, OutOfRangeError):
        return kind(message, int(body.get("start_offset", 0)), int(body.get("tail", 0)))
    if isinstance(kind, type) and issubclass(kind, errors.DataLossError):
        return kind(
            message,
            int(body.get("stream_id", 0)),
            int(body.get("start_offset", 0)),
            int(body.get("end_offset", 0)),
        )
    if isinstance(kind, type) and issubclass(kind, errors.TailMismatchError):
        return kind(message, int(body.get("actual_tail", 0)))
    if isinstance(kind, type) and issubclass(kind, WalstreamError):
        try:
            return kind(message)
        except TypeError:
            pass
    if status == 401:
        return ConfigError(
            f"the node's server at {url} wants a token: set WALSTREAM_TOKEN or server.token"
        )
    return WalstreamError(f"{name or 'HTTP ' + str(status)}: {message}")


def _ref_path(ref: str | int) -> str:
    import urllib.parse

    return urllib.parse.quote(f"#{ref}" if isinstance(ref, int) else ref, safe="")


def _decode_record(raw: dict[str, Any]) -> SequencedRecord:
    key = raw.get("key")
    return SequencedRecord(
        offset=int(raw["offset"]),
        value=base64.b64decode(raw["value"]),
        key=None if key is None else base64.b64decode(key),
        headers=tuple((str(name), base64.b64decode(value)) for name, value in raw["headers"]),
        timestamp_ms=int(raw.get("timestamp_ms", 0)),
    )


class _LiveNodeClient:
    """What a command sees of a node that another live process runs: streams and committed
    records from the metadata and object store directly (nothing registered, nothing claimed);
    when the process is a reachable server, the tail, the records not yet uploaded, reads by
    timestamp or tail offset, and every write through its HTTP API."""

    def __init__(self, holder: Any, metadata: Any, reader: Any, remote: _RemoteNode | None):
        self.holder = holder
        self.metadata = metadata
        self.reader = reader
        self.remote = remote

    @classmethod
    @asynccontextmanager
    async def open(
        cls, config: str | None, deployment: Any, holder: Any, *, writes: bool
    ) -> AsyncIterator[_LiveNodeClient]:
        from walstream.engine.object_reader import ObjectReader
        from walstream.server import live

        remote = None
        reason = holder.describe()
        if holder.url:
            candidate = _RemoteNode(holder.url, _token(deployment))
            try:
                await candidate.call("GET", "/health", timeout=10.0)
                remote = candidate
            except NodeUnreachable as unreachable:
                reason = str(unreachable)
            except WalstreamError as failed:
                reason = f"{holder.describe()}, but its /health answered: {failed}"
        if remote is None and writes:
            raise live.NodeBusy(
                f"{reason}; this command would take the node over: stop that process, or "
                "retry once its server answers",
                holder,
            )
        if remote is None:
            print(
                f"{PROG}: warning: {reason}; showing committed records only (records it "
                "has acknowledged but not yet uploaded are not shown)",
                file=sys.stderr,
            )
        async with (
            _backend(config, "metadata") as metadata,
            _backend(config, "object_store") as objects,
        ):
            yield cls(holder, metadata, ObjectReader(objects, metadata), remote)

    async def list_streams(self, prefix: str = "") -> list[Any]:
        result: list[Any] = await self.metadata.list_streams(prefix)
        return result

    async def open_stream(self, ref: str | int) -> _LiveStream:
        info = await self.metadata.get_stream(ref)
        return _LiveStream(self, info.stream_id, info.name)

    async def create_stream(self, name: str) -> Any:
        body = await self._remote().call("POST", "/v1/streams", {"name": name})
        return argparse.Namespace(name=body["name"], stream_id=body["stream_id"])

    async def delete_stream(self, ref: str | int) -> None:
        await self._remote().call("DELETE", f"/v1/streams/{_ref_path(ref)}")

    def _remote(self) -> _RemoteNode:
        if self.remote is None:  # refused in open(); a read-only command never gets here
            from walstream.server import live

            raise live.NodeBusy(self.holder.describe(), self.holder)
        return self.remote


class _LiveStream:
    """A stream of a node run by another process (see :class:`_LiveNodeClient`)."""

    def __init__(self, client: _LiveNodeClient, stream_id: int, name: str | None) -> None:
        self._client = client
        self.stream_id = stream_id
        self.name = name
        self._path = f"/v1/streams/{_ref_path(stream_id)}"

    async def read(
        self,
        start: int | None = None,
        *,
        from_timestamp: int | None = None,
        tail_offset: int | None = None,
        limit_records: int = READ_PAGE_RECORDS,
        wait: float = 0,
    ) -> ReadResult:
        remote = self._client.remote
        if remote is not None and start is not None and not wait:
            # Committed records straight from the object store: a long `read` does not load
            # the server, which is asked only for its tail and the records not yet uploaded.
            info = await self._info()
            if info.start_offset <= start < info.committed_end:
                records = await self._client.reader.read(
                    self.stream_id, start, info.committed_end, limit_records, 1 << 20
                )
                if records:
                    return ReadResult(list(records), await self.check_tail())
        if remote is not None:
            query: dict[str, Any] = {"limit": limit_records}
            for name, value in (
                ("start", start),
                ("from_timestamp", from_timestamp),
                ("tail_offset", tail_offset),
            ):
                if value is not None:
                    query[name] = value
            if wait:
                query["wait"] = wait
            body = await remote.call(
                "GET", self._path + "/records", query=query, timeout=HTTP_TIMEOUT_S + wait
            )
            return ReadResult([_decode_record(raw) for raw in body["records"]], int(body["tail"]))
        return await self._read_committed(start, from_timestamp, tail_offset, limit_records)

    async def _read_committed(
        self,
        start: int | None,
        from_timestamp: int | None,
        tail_offset: int | None,
        limit_records: int,
    ) -> ReadResult:
        if from_timestamp is not None:
            raise InvalidArgument(
                "--from-timestamp needs the node's server, which cannot be reached; read "
                "with --start instead"
            )
        info = await self._info()
        tail = info.committed_end
        if tail_offset is not None:
            start = max(info.start_offset, tail - tail_offset)
        assert start is not None
        if start < info.start_offset or start > tail:
            raise OutOfRangeError(
                f"offset {start} is outside the committed records [{info.start_offset}, {tail}]",
                info.start_offset,
                tail,
            )
        if start == tail:
            return ReadResult([], tail)
        records = await self._client.reader.read(
            self.stream_id, start, tail, limit_records, 1 << 20
        )
        return ReadResult(list(records), tail)

    async def _info(self) -> Any:
        infos = await self._client.metadata.get_streams([self.stream_id])
        if self.stream_id not in infos:
            raise StreamNotFound(f"stream {self.stream_id} was deleted")
        return infos[self.stream_id]

    async def check_tail(self) -> int:
        remote = self._client.remote
        if remote is None:
            return int((await self._info()).committed_end)
        return int((await remote.call("GET", self._path + "/tail"))["tail"])

    async def start_offset(self) -> int:
        remote = self._client.remote
        if remote is None:
            return int((await self._info()).start_offset)
        return int((await remote.call("GET", self._path + "/tail"))["start_offset"])

    async def append(self, records: Sequence[Record]) -> Any:
        body = await self._client._remote().call(
            "POST",
            self._path + "/records",
            {
                "records": [
                    {
                        "value": base64.b64encode(record.value).decode(),
                        **(
                            {}
                            if record.key is None
                            else {"key": base64.b64encode(record.key).decode()}
                        ),
                        "headers": [
                            [name, base64.b64encode(value).decode()]
                            for name, value in record.headers
                        ],
                    }
                    for record in records
                ]
            },
        )
        return argparse.Namespace(start=body["start"], end=body["end"], tail=body["tail"])

    async def trim(self, offset: int) -> None:
        await self._client._remote().call("POST", self._path + "/trim", {"start": offset})

    async def tail(self, start: int) -> AsyncIterator[SequencedRecord]:
        """Follow the stream from ``start`` with long polls (needs the server)."""
        if self._client.remote is None:
            raise InvalidArgument("following (-f) needs the node's server, which cannot be reached")
        position = start
        while True:
            result = await self.read(position, wait=LIVE_POLL_WAIT_S)
            for record in result.records:
                yield record
                position = record.offset + 1


def _token(deployment: Any) -> str | None:
    """The token a server of this deployment wants: ``$WALSTREAM_TOKEN``, else server.token."""
    return os.environ.get("WALSTREAM_TOKEN") or deployment.sections.get("server", {}).get("token")


# -- formatting -----------------------------------------------------------------------------------


def _text(data: bytes | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", errors="backslashreplace")


def _json_bytes(data: bytes | None) -> Any:
    """UTF-8 text when the bytes are valid UTF-8, else ``{"base64": ...}``: never lossy."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def format_record(record: SequencedRecord, output_format: str) -> str:
    if output_format == "json":
        return json.dumps(
            {
                "offset": record.offset,
                "timestamp_ms": record.timestamp_ms,
                "key": _json_bytes(record.key),
                "value": _json_bytes(record.value),
                "headers": [[name, _json_bytes(value)] for name, value in record.headers],
            },
            ensure_ascii=False,
        )
    if output_format == "hex":
        key = "" if record.key is None else record.key.hex()
        return f"{record.offset}\t{key}\t{record.value.hex()}"
    return f"{record.offset}\t{_text(record.value)}"


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in cells
    ]
    return "\n".join(line.rstrip() for line in lines)


def _enum_value(value: Any) -> Any:
    return getattr(value, "value", value)


def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def _plural(count: int, noun: str) -> str:
    """``1 record``, ``2 records``, ``1 batch``, ``3 batches``."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}es" if noun.endswith(("s", "sh", "ch", "x")) else f"{count} {noun}s"


# -- commands: streams ----------------------------------------------------------------------------


async def cmd_streams_create(args: argparse.Namespace) -> int:
    async with _open_client(args.config) as client:
        stream = await client.create_stream(args.name)
        _out(f"created stream {stream.name!r} (id {stream.stream_id})")
    return EXIT_OK


async def cmd_streams_list(args: argparse.Namespace) -> int:
    async with _open_client(args.config, writes=False) as client:
        infos = await client.list_streams(prefix=args.prefix)
    if args.json:
        for info in infos:
            _out(
                json.dumps(
                    {
                        "stream_id": info.stream_id,
                        "name": info.name,
                        "start_offset": info.start_offset,
                        "committed_end": info.committed_end,
                        "epoch": info.epoch,
                        "owner_node_id": info.owner_node_id,
                    }
                )
            )
        return EXIT_OK
    rows = [
        (
            info.stream_id,
            info.name or "-",
            info.start_offset,
            info.committed_end,
            info.epoch,
            "-" if info.owner_node_id is None else info.owner_node_id,
        )
        for info in infos
    ]
    _out(_table(rows, ("ID", "NAME", "START", "COMMITTED_END", "EPOCH", "OWNER")))
    return EXIT_OK


async def cmd_streams_delete(args: argparse.Namespace) -> int:
    async with _open_client(args.config) as client:
        await client.delete_stream(_name_or_id(args.name))
        _out(f"deleted stream {args.name!r}")
    return EXIT_OK


def _name_or_id(text: str) -> str | int:
    """``#7`` or a bare ``7`` selects the stream with id 7, anything else is a name (stream names
    never start with ``#`` and are never all digits); ``#x`` is refused with InvalidArgument."""
    return parse_stream_ref(text)


# -- commands: append -----------------------------------------------------------------------------


def _lines(source: IO[bytes]) -> Iterator[bytes]:
    for line in source:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def _batches(values: Iterable[bytes], batch_size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for value in values:
        batch.append(value)
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


async def cmd_append(args: argparse.Namespace) -> int:
    key = None if args.key is None else os.fsencode(args.key)
    headers = tuple(args.header)
    source: IO[bytes]
    if args.file is not None:
        path = Path(args.file)
        try:
            source = path.open("rb")
        except FileNotFoundError:
            print(f"{PROG}: error: append --file {args.file}: no such file", file=sys.stderr)
            return EXIT_USAGE
        except IsADirectoryError:
            print(f"{PROG}: error: append --file {args.file}: is a folder", file=sys.stderr)
            return EXIT_USAGE
        progress = progress_bar(
            path.stat().st_size, f"append {args.stream}", enabled=not args.no_progress
        )
    else:
        source = sys.stdin.buffer
        progress = _NoProgress()
    appended = 0
    batches = 0
    tail = None
    try:
        async with _open_client(args.config) as client:
            stream = await client.open_stream(_name_or_id(args.stream))
            for values in _batches(_lines(source), args.batch):
                records = [Record(value, key=key, headers=headers) for value in values]
                ack = await stream.append(records)
                appended += len(records)
                batches += 1
                tail = ack.tail
                _out(f"offsets {ack.start}..{ack.end - 1}")
                progress.update(sum(len(value) + 1 for value in values))
    finally:
        progress.close()
        if source is not sys.stdin.buffer:
            source.close()
    if appended:
        print(
            f"appended {_plural(appended, 'record')} in {_plural(batches, 'batch')} to "
            f"{args.stream!r} (tail {tail})",
            file=sys.stderr,
        )
    else:
        print("nothing to append (no input lines)", file=sys.stderr)
    return EXIT_OK


def _header(text: str) -> tuple[str, bytes]:
    """An argparse type for ``--header NAME=VALUE``."""
    name, separator, value = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, os.fsencode(value)


# -- commands: read / tail / trim -----------------------------------------------------------------


async def _first_read(stream: Stream, args: argparse.Namespace, page: int) -> ReadResult:
    """The first page of ``read``: at --start, --from-timestamp or --tail-offset; without any of
    them at the stream's first readable offset."""
    if args.from_timestamp is not None:
        return await stream.read(from_timestamp=args.from_timestamp, limit_records=page)
    if args.tail_offset is not None:
        return await stream.read(tail_offset=args.tail_offset, limit_records=page)
    if args.start is not None:
        return await stream.read(start=args.start, limit_records=page)
    try:
        return await stream.read(start=0, limit_records=page)
    except OutOfRangeError as trimmed:
        # Trimmed: begin where the stream begins now.
        return await stream.read(start=trimmed.start_offset, limit_records=page)


async def cmd_read(args: argparse.Namespace) -> int:
    remaining = args.limit
    async with _open_client(args.config, writes=False) as client:
        stream = await client.open_stream(_name_or_id(args.stream))
        page = READ_PAGE_RECORDS if remaining is None else min(READ_PAGE_RECORDS, remaining)
        if page == 0:
            return EXIT_OK
        result = await _first_read(stream, args, page)
        await _print_pages(stream, result, remaining, args.format)
    return EXIT_OK


async def _print_pages(
    stream: Stream, result: ReadResult, remaining: int | None, output_format: str
) -> int:
    """Print ``result`` and the pages after it, up to the tail the first read saw (records
    appended since are not waited for) and at most ``remaining`` records. One read returns at
    most a page of records and of bytes (1 MiB by default), so a large count always takes
    several reads. Returns the offset after the last record printed (the tail when none)."""
    end = result.tail  # the records present when the read began
    position = end
    while True:
        records = result.records if remaining is None else result.records[:remaining]
        for record in records:
            _out(format_record(record, output_format))
        if remaining is not None:
            remaining -= len(records)
        if not records:
            return position
        position = records[-1].offset + 1
        if remaining == 0 or position >= end:
            return position
        page = READ_PAGE_RECORDS if remaining is None else min(READ_PAGE_RECORDS, remaining)
        result = await stream.read(start=position, limit_records=page)


async def cmd_tail(args: argparse.Namespace) -> int:
    async with _open_client(args.config, writes=False) as client:
        stream = await client.open_stream(_name_or_id(args.stream))
        if args.start is not None:
            position = args.start
        else:
            position = await _print_last(stream, args.lines, args.format)
        if args.start is not None and not args.follow:
            tail = await stream.check_tail()
            while position < tail:
                result = await stream.read(
                    start=position, limit_records=min(READ_PAGE_RECORDS, tail - position)
                )
                if not result.records:
                    break
                for record in result.records:
                    _out(format_record(record, args.format))
                position = result.records[-1].offset + 1
        if args.follow:
            async for record in stream.tail(start=position):
                _out(format_record(record, args.format))
                sys.stdout.flush()
    return EXIT_OK


async def _print_last(stream: Stream, lines: int, output_format: str) -> int:
    """Print the last ``lines`` records (every readable one when the stream holds fewer);
    return the offset after them."""
    if lines <= 0:
        return await stream.check_tail()
    result = await stream.read(tail_offset=lines, limit_records=min(lines, READ_PAGE_RECORDS))
    return await _print_pages(stream, result, lines, output_format)


async def cmd_trim(args: argparse.Namespace) -> int:
    async with _open_client(args.config) as client:
        stream = await client.open_stream(_name_or_id(args.stream))
        start = await stream.start_offset()
        if args.offset <= start:
            # Trimming never moves the start back: the records before it are already gone.
            _out(
                f"nothing trimmed: {args.stream!r} already starts at offset {start} "
                f"(trim only moves the first readable offset forward)"
            )
            return EXIT_OK
        await stream.trim(args.offset)
        _out(f"trimmed {args.stream!r}: offsets before {args.offset} are gone")
    return EXIT_OK


# -- commands: recover ----------------------------------------------------------------------------


async def cmd_recover(args: argparse.Namespace) -> int:
    """Recover the node's WAL and stop; with --accept-loss, record what the WAL lost. Refuses
    (NodeBusy, exit 2) while a live process runs the node: recovering would take it over."""
    async with _holding_node(args.config):
        return await _recover(args)


async def _recover(args: argparse.Namespace) -> int:
    import walstream
    from walstream.engine.recovery import RecoveryRefused

    try:
        client = await walstream.open(args.config, accept_loss=args.accept_loss)
    except RecoveryRefused as refused:
        _error(refused, args.verbose)
        return EXIT_USAGE
    try:
        stats = client.recovery
        wal = client.wal.describe()
    finally:
        await client.close()
    assert stats is not None
    _out(
        f"node {client.node_id}: recovered {stats.records} records in {stats.batches} batches "
        f"from the WAL {wal} ({stats.dropped_batches} batches already committed or stale)"
    )
    if not stats.loss_detected:
        _out("the WAL showed no damage: nothing was lost")
        if args.accept_loss:
            _out("nothing to accept: no data-loss gap was recorded")
            return EXIT_USAGE
        _out("the WAL was reset and the node stopped")
        return EXIT_OK
    _out("damage accepted:")
    for line in stats.loss_lines():
        _out(line)
    count = len(stats.recorded_gaps)
    _out(
        f"recorded as lost ({count} gap{'' if count == 1 else 's'}; reads raise DataLossError, "
        "the offsets are never reused):"
    )
    for gap in stats.recorded_gaps:
        _out(f"  stream {gap.stream_id}: [{gap.start_offset}, {gap.end_offset})")
    _out("everything else was committed; the WAL was reset and the node stopped")
    return EXIT_OK


# -- commands: plugins / inspect ------------------------------------------------------------------


def cmd_plugins(args: argparse.Namespace) -> int:
    backends = sorted(
        _plugin_host().installed_backends(),
        key=lambda entry: (_kind_order(entry.kind), entry.name),
    )
    if args.json:
        for backend in backends:
            _out(json.dumps(_backend_dict(backend)))
        return EXIT_OK

    def distribution(backend: Any) -> str:
        return f"{backend.dist} {backend.version or ''}".strip() if backend.dist else "-"

    name_width = max((len(backend.name) for backend in backends), default=0)
    dist_width = max((len(distribution(backend)) for backend in backends), default=0)
    current_kind = None
    for backend in backends:
        if backend.kind != current_kind:
            current_kind = backend.kind
            _out(f"{current_kind} (entry-point group walstream.{current_kind}):")
        _out(
            f"  {backend.name:<{name_width}}  {distribution(backend):<{dist_width}}  "
            f"{backend.description}"
        )
        for option in backend.options:
            _out(f"      {option.describe()}")
        if backend.error:
            _out(f"      (cannot be loaded: {backend.error})")
    return EXIT_OK


def _kind_order(kind: str) -> int:
    return {"wal": 0, "object_store": 1, "metadata": 2}.get(kind, 3)


def _backend_dict(backend: Any) -> dict[str, Any]:
    return {
        "kind": backend.kind,
        "name": backend.name,
        "dist": backend.dist,
        "version": backend.version,
        "description": backend.description,
        "options": [
            {
                "name": option.name,
                "kind": option.kind,
                "default": _jsonable(option.default),
                "required": option.required,
                "doc": option.doc,
            }
            for option in backend.options
        ],
        "error": backend.error,
    }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


async def cmd_inspect_object(args: argparse.Namespace) -> int:
    from walstream.format import object as object_format

    path = Path(args.object)
    if path.is_file():
        data = path.read_bytes()
        source = str(path)
    else:
        async with _backend(args.config, "object_store") as objects:
            try:
                data = await objects.get(args.object)
            except (InvalidArgument, NotFound):
                raise NotFound(
                    f"{args.object}: no such file, and no object with that key in the "
                    "configured object store; `walstream inspect metadata` lists every object "
                    "with its KEY (a local store keeps it in the file <object_store.root>/KEY)"
                ) from None
        source = f"key {args.object}"
    description = object_format.describe_object(data)
    _out(f"object {source}: {len(data)} bytes")
    for line in _describe_lines(description):
        _out(line)
    object_format.verify_object(data)
    _out("verified: every block checksum is correct")
    return EXIT_OK


def _describe_lines(description: Any) -> list[str]:
    if isinstance(description, str):
        return description.splitlines()
    if isinstance(description, dict):
        return [f"{key}: {value}" for key, value in description.items()]
    return [str(line) for line in description]


async def cmd_inspect_metadata(args: argparse.Namespace) -> int:
    async with _backend(args.config, "metadata") as metadata:
        streams = await metadata.list_streams()
        objects = await metadata.list_objects()
        nodes = await metadata.list_nodes()
        gaps = [gap for info in streams for gap in await metadata.get_data_loss(info.stream_id)]
    _out(f"streams ({len(streams)} active):")
    _out(
        _table(
            [
                (
                    info.stream_id,
                    info.name or "-",
                    info.start_offset,
                    info.committed_end,
                    info.epoch,
                    "-" if info.owner_node_id is None else info.owner_node_id,
                )
                for info in streams
            ],
            ("ID", "NAME", "START", "COMMITTED_END", "EPOCH", "OWNER"),
        )
    )
    _out()
    total_bytes = sum(info.size for info in objects)
    _out(f"objects ({len(objects)}, {_human(total_bytes, 'B')}):")
    _out(
        _table(
            [
                (
                    info.object_id,
                    _enum_value(info.kind),
                    _enum_value(info.state),
                    info.size,
                    " ".join(
                        f"{rng.stream_id}:[{rng.start_offset},{rng.end_offset})"
                        for rng in info.ranges
                    )
                    or "-",
                    info.key,
                )
                for info in objects
            ],
            ("ID", "KIND", "STATE", "SIZE", "RANGES", "KEY"),
        )
    )
    _out()
    _out(f"nodes ({len(nodes)}):")
    _out(
        _table(
            [
                (
                    info.node_id,
                    info.node_epoch,
                    _enum_value(info.state),
                    info.wal_config.get("type", "-") if info.wal_config else "-",
                )
                for info in nodes
            ],
            ("ID", "EPOCH", "STATE", "WAL"),
        )
    )
    if gaps:
        _out()
        _out(f"data-loss gaps ({len(gaps)}; reads of them raise DataLossError):")
        _out(
            _table(
                [(gap.stream_id, gap.start_offset, gap.end_offset, gap.reason) for gap in gaps],
                ("STREAM", "START", "END", "REASON"),
            )
        )
    return EXIT_OK


def cmd_inspect_wal(args: argparse.Namespace) -> int:
    factory = _plugin_host().load_factory("wal", args.type)
    if factory.inspect is None:
        raise ConfigError(
            f"the {args.type!r} WAL cannot be inspected from a path (its factory has no inspect)"
        )
    expected: dict[str, Any] = {}
    if args.deployment_id is not None:
        try:
            expected["deployment_id"] = bytes.fromhex(args.deployment_id)
        except ValueError as exc:
            raise InvalidArgument(f"--deployment-id: not hexadecimal: {exc}") from exc
    if args.node_id is not None:
        expected["node_id"] = args.node_id
    try:
        for line in factory.inspect(Path(args.path), **expected):
            _out(str(line))
    except CorruptionError as exc:
        # Damage or a foreign identity (IdentityMismatch): a distinct status for scripts.
        _error(exc, args.verbose)
        return EXIT_CORRUPT
    return EXIT_OK


# -- commands: conformance / demo -----------------------------------------------------------------


def cmd_conformance(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        import walstream_conformance
    except ImportError:
        print(
            f"{PROG}: error: the conformance suite is not installed; "
            "run: pip install walstream-conformance",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        conformance_cli = importlib.import_module("walstream_conformance.cli")
    except ModuleNotFoundError as missing:
        if missing.name != "walstream_conformance.cli":
            raise
        print(
            f"{PROG}: error: the installed walstream-conformance "
            f"({walstream_conformance.__file__}) has no command line; upgrade it, or run "
            "its pytest plugin directly: pytest -p walstream_conformance",
            file=sys.stderr,
        )
        return EXIT_USAGE
    parser = argparse.ArgumentParser(
        prog=f"{PROG} conformance",
        description="Run the shared conformance suite against a backend.",
    )
    conformance_cli.add_arguments(parser)
    conformance_args = parser.parse_args(extra)
    if not hasattr(conformance_args, "config"):
        conformance_args.config = args.config
    if not hasattr(conformance_args, "verbose"):
        conformance_args.verbose = args.verbose
    return int(conformance_cli.run(conformance_args) or 0)


async def cmd_demo(args: argparse.Namespace) -> int:
    from walstream.cli import demo

    async with _holding_node(args.config):
        return await demo.run_demo(
            config=args.config,
            streams=args.streams,
            records=args.records,
            value_bytes=args.value_bytes,
            batch_records=args.batch,
            progress=not args.no_progress,
        )


# -- commands: serve / bench ---------------------------------------------------------------------


async def cmd_serve(args: argparse.Namespace) -> int:
    # aiohttp stays out of the import path of every other command.
    try:
        from walstream.server import app as server
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] != "aiohttp":
            raise
        raise ConfigError(
            "walstream serve needs aiohttp; run: pip install 'walstream[server]'"
        ) from None

    def announce(running: Any) -> None:
        auth = "token required" if running.token else "no token"
        _out(
            f"walstream serve: node {running.client.node_id} (epoch "
            f"{running.client.node_epoch}) listening on {running.url} ({auth})"
        )
        sys.stdout.flush()

    await server.run_until_signalled(
        args.config,
        listen=args.listen,
        token=args.token,
        max_body_bytes=args.max_body_bytes,
        max_wait_s=args.max_wait,
        announce=announce,
    )
    return EXIT_OK


async def cmd_bench(args: argparse.Namespace) -> int:
    from walstream.cli import bench

    async with _holding_node(args.config):
        report = await bench.run_bench(
            args.config,
            streams=args.streams,
            records=args.records,
            value_bytes=args.value_bytes,
            batch_records=args.batch,
            concurrency=args.concurrency,
            json_path=args.json,
            keep=args.keep,
            progress=not args.no_progress,
        )
    return EXIT_OK if report.ok else EXIT_ERROR


def _size(text: str) -> int:
    """An argparse type for sizes such as 16MiB."""
    from walstream.config.options import parse_size

    try:
        value = parse_size(text.strip())
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _add_serve_and_bench(subparsers: Any, common: argparse.ArgumentParser) -> None:
    serve = _add_command(
        subparsers,
        "serve",
        "serve this node over HTTP (JSON and binary append/read/trim, long-poll tail reads, "
        "health, Prometheus metrics) until SIGTERM or Ctrl-C",
        cmd_serve,
        common,
        "examples:\n  walstream serve -c deploy.yaml\n"
        "  WALSTREAM_TOKEN=s3cret walstream serve -c deploy.yaml --listen 0.0.0.0:7400\n\n"
        "  curl -s localhost:7400/health\n"
        "  curl -s -H 'Authorization: Bearer s3cret' -d '{\"name\": \"orders\"}' "
        "localhost:7400/v1/streams\n"
        "  curl -s -H 'Authorization: Bearer s3cret' -H 'Content-Type: application/json' \\\n"
        '       -d \'{"records": [{"value_text": "hello"}]}\' '
        "localhost:7400/v1/streams/orders/records\n"
        "  curl -s -H 'Authorization: Bearer s3cret' "
        "'localhost:7400/v1/streams/orders/records?start=0&wait=30'\n\n"
        "Listens on server.listen of the deployment (default 127.0.0.1:7400). The token is\n"
        "--token, else $WALSTREAM_TOKEN, else server.token; without one there is no\n"
        "authentication. SIGTERM or SIGINT stops accepting, answers long polls, then closes\n"
        "the node (uploading everything acknowledged) and exits 0. The routes are listed in\n"
        "the README and in the walstream.server module. Timeouts and bounds of slow or greedy\n"
        "clients come from the server section: header_timeout, body_timeout,\n"
        "max_connections, max_long_polls.\n\n"
        "While it runs, the server holds the node lock <metadata file>.node-N.lock with its\n"
        "URL in it: other walstream commands on this deployment go through its HTTP API\n"
        "instead of taking the node over, and a second serve of the same node exits 2\n"
        "(NodeBusy, naming this one).",
    )
    serve.add_argument(
        "--listen", metavar="HOST:PORT", help="overrides server.listen (port 0 picks a free port)"
    )
    serve.add_argument(
        "--token",
        metavar="TOKEN",
        help="bearer token clients must send (default: $WALSTREAM_TOKEN, then server.token)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=_size,
        default=16 << 20,
        metavar="SIZE",
        help="largest request body; larger ones get 413 (default 16MiB)",
    )
    serve.add_argument(
        "--max-wait",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="bound of a long-poll read's wait= (default 60)",
    )

    bench = _add_command(
        subparsers,
        "bench",
        "benchmark appends (records/s, MiB/s, p50/p99/p999 batch latency), then a cold read "
        "back after a client restart; prints a table, optionally writes JSON",
        cmd_bench,
        common,
        "examples:\n  walstream bench\n"
        "  walstream bench --streams 8 --records 200000 --value-bytes 512 --batch 200 "
        "--concurrency 16\n"
        "  walstream -c deploy.yaml bench --json bench.json\n\n"
        "Streams are named bench-<run>-<n> and deleted afterwards unless --keep. Values carry\n"
        "(appender, sequence) so the read back is verified; exit status 1 if it is not intact.",
    )
    bench.add_argument(
        "--streams", type=_count(1), default=4, metavar="N", help="streams to append to (default 4)"
    )
    bench.add_argument(
        "--records",
        type=_count(1),
        default=50_000,
        metavar="N",
        help="records in total, over all streams (default 50000)",
    )
    bench.add_argument(
        "--value-bytes",
        type=_count(8),
        default=1024,
        metavar="N",
        help="bytes per record value (default 1024)",
    )
    bench.add_argument(
        "--batch", type=_count(1), default=100, metavar="N", help="records per append (default 100)"
    )
    bench.add_argument(
        "--concurrency",
        type=_count(1),
        default=8,
        metavar="N",
        help="appenders running at once; appender i writes stream i %% streams (default 8)",
    )
    bench.add_argument("--json", metavar="PATH", help="also write the numbers as JSON here")
    bench.add_argument("--keep", action="store_true", help="keep the bench streams")
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")


# -- parser ---------------------------------------------------------------------------------------


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (a bad one is a usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def _common_options(suppress_defaults: bool) -> argparse.ArgumentParser:
    """--config and -v, accepted before or after the command."""
    parser = argparse.ArgumentParser(add_help=False)
    default: Any = argparse.SUPPRESS if suppress_defaults else None
    parser.add_argument(
        "--config",
        "-c",
        metavar="FILE",
        default=default,
        help="deployment YAML (sections node, wal, object_store, metadata, cache, upload, "
        "compaction, server, hooks, and the key append_timeout); default: the embedded "
        "deployment in ./walstream-data",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS if suppress_defaults else 0,
        help="debug logging of walstream on stderr, and full tracebacks on errors; -vv also "
        "debug logging of other libraries (botocore, aiohttp, ...)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_deadline_seconds,
        default=argparse.SUPPRESS if suppress_defaults else None,
        help=f"stop the command if it has not finished after this long (exit {EXIT_DEADLINE}); "
        f"0: no deadline; default {DEFAULT_TIMEOUT_S:g} s, none for serve, bench, demo, append and "
        "tail --follow",
    )
    return parser


def _deadline_seconds(text: str) -> float:
    """An argparse type for ``--timeout``: seconds, 0 for no deadline."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 (no deadline) or positive, got {text!r}")
    return value


def _add_command(
    subparsers: Any,
    name: str,
    help_text: str,
    handler: Callable[..., Any],
    common: argparse.ArgumentParser,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help_text,
        description=help_text,
        parents=[common],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=handler)
    return parser


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("text", "json", "hex"),
        default="text",
        help="text: OFFSET<TAB>VALUE (UTF-8, undecodable bytes escaped); json: JSON lines, one "
        "object per line with offset, timestamp_ms, key, value, headers (bytes that are not UTF-8 "
        'appear as {"base64": ...}); hex: OFFSET<TAB>KEY<TAB>VALUE in hex',
    )


def build_parser() -> argparse.ArgumentParser:
    common = _common_options(suppress_defaults=True)
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="walstream: append-only streams, durable in a write-ahead log, stored in "
        "object storage.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common_options(suppress_defaults=False)],
    )
    from walstream import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # streams
    streams = commands.add_parser(
        "streams",
        help="create, list and delete streams",
        parents=[common],
        description="Create, list and delete streams.",
        epilog="examples:\n  walstream streams create orders\n  walstream streams list "
        "--prefix ord\n  walstream streams delete orders",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    streams_commands = streams.add_subparsers(
        dest="streams_command", metavar="ACTION", required=True
    )
    create = _add_command(
        streams_commands,
        "create",
        "create a stream",
        cmd_streams_create,
        common,
        "example:\n  walstream streams create orders",
    )
    create.add_argument("name", help="the new stream's name (unique among active streams)")
    listing = _add_command(
        streams_commands,
        "list",
        "list active streams",
        cmd_streams_list,
        common,
        "example:\n  walstream streams list --prefix orders-",
    )
    listing.add_argument("--prefix", default="", help="only streams whose name starts with it")
    listing.add_argument(
        "--json",
        action="store_true",
        help="JSON lines: one JSON object per stream per line (not one JSON array)",
    )
    delete = _add_command(
        streams_commands,
        "delete",
        "delete a stream and its data",
        cmd_streams_delete,
        common,
        "example:\n  walstream streams delete orders",
    )
    delete.add_argument("name", help="stream name (or #ID)")

    # append
    append = _add_command(
        commands,
        "append",
        "append one record per input line (stdin or --file); prints the offsets of each batch",
        cmd_append,
        common,
        "examples:\n  echo hello | walstream append orders\n"
        "  walstream append orders --file events.txt --batch 1000 --key k1\n"
        "  walstream append orders -i events.txt -b 1000 -k k1\n\n"
        "Each line (without its newline) becomes one record's value. Batches are appended\n"
        "atomically and printed as 'offsets FIRST..LAST'. Reading a file shows a progress bar\n"
        "on stderr.",
    )
    append.add_argument("stream", help="stream name (or #ID)")
    append.add_argument(
        "--file", "-i", metavar="F", help="read lines from this file, not stdin (-i: input)"
    )
    # The former short spelling: -f means --follow elsewhere, so it is kept but not advertised.
    append.add_argument("-f", dest="file", metavar="F", help=argparse.SUPPRESS)
    append.add_argument("--key", "-k", metavar="K", help="key of every appended record")
    append.add_argument(
        "--header",
        action="append",
        type=_header,
        default=[],
        metavar="NAME=VALUE",
        help="a header on every record (repeatable)",
    )
    append.add_argument(
        "--batch",
        "-b",
        type=_count(1),
        default=DEFAULT_APPEND_BATCH,
        metavar="N",
        help=f"records per atomic batch (default {DEFAULT_APPEND_BATCH})",
    )
    append.add_argument("--no-progress", action="store_true", help="no progress bar")

    # read
    read = _add_command(
        commands,
        "read",
        "print records of a stream up to its current tail",
        cmd_read,
        common,
        "examples:\n  walstream read orders                 # from the first readable offset\n"
        "  walstream read orders --start 100 --limit 10\n"
        "  walstream read orders --tail-offset 5 --format json   # the last 5 records\n"
        "  walstream read orders --from-timestamp 1700000000000",
    )
    read.add_argument("stream", help="stream name (or #ID)")
    position = read.add_mutually_exclusive_group()
    position.add_argument(
        "--start",
        type=_count(0),
        metavar="N",
        help="first offset to read (default: the first readable offset)",
    )
    position.add_argument(
        "--from-timestamp",
        type=int,
        metavar="MS",
        help="start at the first record with timestamp_ms >= MS",
    )
    position.add_argument(
        "--tail-offset",
        type=_count(0),
        metavar="N",
        help="start N records before the tail: the last N records (all of them when fewer "
        "are readable)",
    )
    read.add_argument("--limit", "-n", type=_count(0), metavar="N", help="print at most N records")
    _add_format(read)

    # tail
    tail = _add_command(
        commands,
        "tail",
        "print the last records of a stream; with -f keep following",
        cmd_tail,
        common,
        "examples:\n  walstream tail orders            # the last 10 records\n"
        "  walstream tail orders -f         # then follow new records until Ctrl-C\n"
        "  walstream tail orders -f --start 0",
    )
    tail.add_argument("stream", help="stream name (or #ID)")
    tail.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new records as they are appended, until Ctrl-C (exits 0)",
    )
    tail.add_argument(
        "--start",
        type=_count(0),
        metavar="N",
        help="begin at offset N instead of the last --lines records",
    )
    tail.add_argument(
        "-n",
        "--lines",
        type=_count(0),
        default=DEFAULT_TAIL_LINES,
        metavar="N",
        help=f"print the last N records first, paging through as many reads as that takes; "
        f"all of them when the stream holds fewer (default {DEFAULT_TAIL_LINES})",
    )
    _add_format(tail)

    # trim
    trim = _add_command(
        commands,
        "trim",
        "make every offset before OFFSET unreadable",
        cmd_trim,
        common,
        "example:\n  walstream trim orders 1000\n\n"
        "Trimming only moves the first readable offset forward: an OFFSET at or before it\n"
        "trims nothing, says so ('nothing trimmed: ... already starts at offset N') and\n"
        "exits 0. An OFFSET beyond the tail is an error (exit 1).",
    )
    trim.add_argument("stream", help="stream name (or #ID)")
    trim.add_argument("offset", type=_count(0), help="the new first readable offset")

    # recover
    recover = _add_command(
        commands,
        "recover",
        "recover the node's WAL, commit it and stop; refuses (exit 2) when acknowledged records "
        "were lost, unless --accept-loss",
        cmd_recover,
        common,
        "examples:\n  walstream recover -c deploy.yaml\n"
        "  walstream recover -c deploy.yaml --accept-loss\n\n"
        "Starts the node configured by --config, which recovers its WAL exactly as a normal\n"
        "start does, then stops it. When the WAL shows damage (a damaged region, a record that\n"
        "is not a batch, a gap in a stream's offsets), acknowledged records may be lost: the\n"
        "node refuses, prints the WAL positions and the streams and offsets affected, and\n"
        "changes nothing that matters (records before the damage may be committed).\n"
        "--accept-loss then records each lost range in metadata (reads of it raise\n"
        "DataLossError; its offsets are never reused), commits everything valid and resets\n"
        "the WAL.\n\n"
        "Exit status: 0 recovered (and with --accept-loss: the loss recorded); 2 refused\n"
        "(damage found, no --accept-loss), or --accept-loss found nothing to accept;\n"
        "1 another error.",
    )
    recover.add_argument(
        "--accept-loss",
        action="store_true",
        help="record the lost ranges as data-loss gaps and start anyway (an operator's "
        "decision: the records are gone)",
    )

    # plugins
    plugins = _add_command(
        commands,
        "plugins",
        "list installed backends (WAL, object store, metadata) with versions and options",
        cmd_plugins,
        common,
        "example:\n  walstream plugins",
    )
    plugins.add_argument(
        "--json",
        action="store_true",
        help="JSON lines: one JSON object per backend per line (not one JSON array)",
    )

    # inspect
    inspect = commands.add_parser(
        "inspect",
        help="decode and verify objects, metadata and WALs",
        parents=[common],
        description="Decode and verify stored data.",
        epilog="examples:\n"
        "  walstream inspect metadata                  # streams, nodes, objects with their KEY\n"
        "  walstream inspect object KEY                # a KEY from that list\n"
        "  walstream inspect object ./walstream-data/objects/KEY   # the same object's file\n"
        "  walstream inspect wal walstream-data/wal.img",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect_commands = inspect.add_subparsers(dest="inspect_command", metavar="WHAT", required=True)
    inspect_object = _add_command(
        inspect_commands,
        "object",
        "decode an object (index, blocks) and verify every checksum; exit 1 on damage",
        cmd_inspect_object,
        common,
        "examples:\n"
        "  walstream inspect metadata      # the KEY column lists every object's key\n"
        "  walstream inspect object KEY    # fetched from the configured object store\n"
        "  walstream inspect object ./walstream-data/objects/KEY   # a local object's file",
    )
    inspect_object.add_argument(
        "object",
        metavar="FILE|KEY",
        help="a local object file, or else a key in the configured object store",
    )
    _add_command(
        inspect_commands,
        "metadata",
        "print the streams, objects, nodes and data-loss gaps of the configured metadata store",
        cmd_inspect_metadata,
        common,
        "example:\n  walstream inspect metadata",
    )
    inspect_wal = _add_command(
        inspect_commands,
        "wal",
        "decode and verify a WAL medium (e.g. an ebs WAL file); exit 2 on damage or a foreign "
        "identity",
        cmd_inspect_wal,
        common,
        "example:\n  walstream inspect wal ./walstream-data/wal.img --type ebs",
    )
    inspect_wal.add_argument("path", help="the WAL's file, device or folder")
    inspect_wal.add_argument(
        "--type", default="ebs", help="WAL plugin name whose inspector decodes it (default ebs)"
    )
    inspect_wal.add_argument(
        "--deployment-id",
        help="hex deployment id the WAL must belong to (exit 2 if it records another)",
    )
    inspect_wal.add_argument(
        "--node-id", type=int, help="node id the WAL must belong to (exit 2 if it records another)"
    )

    # conformance
    commands.add_parser(
        "conformance",
        add_help=False,
        help="run the conformance suite (needs walstream-conformance); "
        "'walstream conformance --help' lists its options",
    ).set_defaults(handler=cmd_conformance)

    # demo
    demo = _add_command(
        commands,
        "demo",
        "append a generated workload to a few streams, read it back, restart, verify again "
        "and print a summary (what `make run` runs)",
        cmd_demo,
        common,
        "examples:\n  walstream demo\n  walstream demo --streams 3 --records 20000 "
        "--value-bytes 256\n  walstream demo --config deploy.yaml",
    )
    demo.add_argument(
        "--streams",
        type=_count(1),
        default=3,
        metavar="N",
        help="streams written concurrently (default 3)",
    )
    demo.add_argument(
        "--records",
        type=_count(1),
        default=20_000,
        metavar="N",
        help="records per stream (default 20000)",
    )
    demo.add_argument(
        "--value-bytes",
        type=_count(1),
        default=256,
        metavar="N",
        help="bytes per record value (default 256)",
    )
    demo.add_argument(
        "--batch", type=_count(1), default=100, metavar="N", help="records per append (default 100)"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")

    _add_serve_and_bench(commands, common)
    return parser


# -- entry point ----------------------------------------------------------------------------------


def _configure_logging(verbose: int) -> None:
    """No ``-v``: warnings only. ``-v``: debug logging of walstream and its plugins (loggers
    named ``walstream*``), other libraries at INFO (botocore alone logs thousands of DEBUG lines
    per S3 run). ``-vv``: everything at DEBUG."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if verbose == 1:
        for handler in logging.root.handlers:
            handler.addFilter(_own_debug_only)


def _own_debug_only(record: logging.LogRecord) -> bool:
    """A handler filter: DEBUG records only from walstream's own loggers (a filter on the
    handler also covers the loggers that plugins create after logging is configured)."""
    return record.levelno >= logging.INFO or record.name.startswith("walstream")


def _error(exc: BaseException, verbose: int) -> None:
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    message = str(exc).strip() or "(no message)"
    if isinstance(exc, StreamNotFound):
        # The message is written for the Python API; point a shell user at the command.
        message = message.replace("list_streams()", "`walstream streams list`")
    print(f"{PROG}: error: {type(exc).__name__}: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the process exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "conformance":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _configure_logging(args.verbose)
    global _running_command
    _running_command = " ".join(
        str(part)
        for part in (args.command, getattr(args, "streams_command", None))
        if part is not None
    )
    handler: Callable[..., Any] = args.handler
    try:
        if handler is cmd_conformance:
            return cmd_conformance(args, extra)
        outcome = handler(args)
        if isinstance(outcome, Awaitable):
            outcome = _run_command(outcome, args.command, _deadline(args))
        return int(outcome)
    except _Stopped as stop:
        return _report_stop(stop, args.command)
    except KeyboardInterrupt:
        return _report_stop(_Stopped(interrupted=True), args.command)
    except BrokenPipeError:
        # The reader went away (`walstream read s | head`): not an error.
        _silence_stdout()
        return EXIT_OK
    except ConfigError as exc:
        _error(exc, args.verbose)
        return EXIT_USAGE
    except WalstreamError as exc:
        _error(exc, args.verbose)
        return EXIT_ERROR
    except OSError as exc:
        _error(exc, args.verbose)
        return EXIT_ERROR


class _Stopped(Exception):
    """The command was stopped before it finished: Ctrl-C, or its deadline."""

    def __init__(self, *, interrupted: bool, deadline_s: float | None = None) -> None:
        super().__init__("interrupted" if interrupted else f"deadline {deadline_s} s")
        self.interrupted = interrupted
        self.deadline_s = deadline_s


def _deadline(args: argparse.Namespace) -> float | None:
    """The command's deadline in seconds, None for none."""
    value: float | None = getattr(args, "timeout", None)
    if value is None:
        follows = args.command == "tail" and bool(getattr(args, "follow", False))
        return None if args.command in UNBOUNDED_COMMANDS or follows else DEFAULT_TIMEOUT_S
    return value or None


def _report_stop(stop: _Stopped, command: str) -> int:
    """Say why ``command`` stopped (and that nothing acknowledged is lost); the exit status."""
    if stop.interrupted:
        if command == "tail":
            return EXIT_OK
        print(f"{PROG}: interrupted; {DURABILITY_NOTE}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(
        f"{PROG}: error: {command} did not finish within {stop.deadline_s:g} s "
        f"(--timeout; 0 for no deadline); the log lines above say what it was waiting for; "
        f"{DURABILITY_NOTE}",
        file=sys.stderr,
    )
    return EXIT_DEADLINE


def _run_command(outcome: Awaitable[Any], command: str, deadline_s: float | None) -> Any:
    """Run a command's coroutine on a new event loop, bounded by ``deadline_s``; Ctrl-C stops it.

    Unlike :func:`asyncio.run`, stopping is bounded: the command gets :data:`STOP_GRACE_S` to
    close (a final upload that cannot reach the object store is abandoned — the records are
    durable in the WAL), then the tasks left get as long again. A process that still does not
    end — its tasks ignore cancellation, or the loop is blocked in a synchronous call such as
    reading standard input — is ended by a watchdog thread with :func:`os._exit` (acknowledged
    data is durable, so this loses nothing). A second Ctrl-C raises KeyboardInterrupt at once.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    interrupted: asyncio.Future[None] = loop.create_future()
    watchdog = _Watchdog()
    limit_s = 2 * STOP_GRACE_S + 1.0
    if deadline_s is not None:
        watchdog.arm(
            deadline_s + limit_s, _Stopped(interrupted=False, deadline_s=deadline_s), command
        )

    def on_sigint(signum: int, frame: object) -> None:
        if interrupted.done() or watchdog.interrupt_armed:
            raise KeyboardInterrupt
        watchdog.arm(limit_s, _Stopped(interrupted=True), command)
        loop.call_soon_threadsafe(_set_once, interrupted)

    # serve handles SIGINT itself (a graceful stop); a handler can only be set in the main
    # thread.
    previous: Any = None
    watch_signal = command != "serve" and threading.current_thread() is threading.main_thread()
    if watch_signal:
        previous = signal.signal(signal.SIGINT, on_sigint)
    stopped = False
    try:
        return loop.run_until_complete(_run(outcome, command, deadline_s, interrupted))
    except (_Stopped, KeyboardInterrupt):
        stopped = True
        raise
    finally:
        clean = _close_loop(loop)
        if stopped and not clean:
            _leave(_Stopped(interrupted=True), command, "its tasks did not end")
        watchdog.disarm()
        if watch_signal:
            signal.signal(signal.SIGINT, previous)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Watchdog:
    """Timers that end the process from another thread when the event loop cannot stop the
    command in time (see :func:`_run_command`)."""

    def __init__(self) -> None:
        self._timers: list[threading.Timer] = []
        self.interrupt_armed = False

    def arm(self, after_s: float, stop: _Stopped, command: str) -> None:
        self.interrupt_armed = self.interrupt_armed or stop.interrupted
        timer = threading.Timer(
            after_s, _leave, (stop, command, f"not stopped after {after_s:g} s")
        )
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def disarm(self) -> None:
        for timer in self._timers:
            timer.cancel()


def _leave(stop: _Stopped, command: str, why: str) -> None:
    """Report ``stop`` and end the process now (``why``: why it could not end normally)."""
    code = _report_stop(stop, command)
    print(f"{PROG}: {command}: {why}; leaving it", file=sys.stderr)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


async def _run(
    outcome: Awaitable[Any],
    command: str,
    deadline_s: float | None,
    interrupted: asyncio.Future[None],
) -> Any:
    """Await ``outcome``; when ``interrupted`` is set (Ctrl-C) or at the deadline cancel it,
    give it :data:`STOP_GRACE_S` to close and raise :class:`_Stopped`."""
    task = asyncio.ensure_future(outcome)
    await asyncio.wait({task, interrupted}, timeout=deadline_s, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task}, timeout=STOP_GRACE_S)
    if task.done() and not task.cancelled() and task.exception() is not None:
        log.debug("%s failed while stopping: %s", command, task.exception())
    raise _Stopped(interrupted=interrupted.done(), deadline_s=deadline_s)


def _close_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Cancel the tasks left, wait at most :data:`STOP_GRACE_S` for them, close the loop;
    False if some did not end (the loop is then left open)."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=STOP_GRACE_S))
        if any(not task.done() for task in pending):
            return False
        for task in pending:
            if not task.cancelled() and task.exception() is not None:
                log.debug("task failed while stopping: %s", task.exception())
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), STOP_GRACE_S))
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), STOP_GRACE_S))
    except TimeoutError:
        return False
    finally:
        asyncio.set_event_loop(None)
    loop.close()
    return True


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
