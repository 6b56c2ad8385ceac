"""A node run by another process: a command reaches it through the HTTP API of a live
``walstream serve`` (S2's REST API v1, standard library only: HTTP/1.1 and JSON with base64
bytes, every stream addressed in the root basin ``walstream`` under its own name), or reads its
committed records straight from the metadata and object store when the server cannot be
reached."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import struct
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

from walstream.cli.deployments import backend, command_name, live_holder, load_deployment
from walstream.cli.output import PROG
from walstream.encryption import EncryptionKey, open_records
from walstream.errors import (
    ConfigError,
    InvalidArgument,
    OutOfRangeError,
    StreamNotFound,
    WalstreamError,
)
from walstream.records import ReadResult, Record, SequencedRecord
from walstream.stream_config import StreamConfig

__all__ = [
    "HTTP_TIMEOUT_S",
    "LIVE_POLL_WAIT_S",
    "READ_PAGE_RECORDS",
    "NodeUnreachable",
    "open_client",
    "open_follower",
]

READ_PAGE_RECORDS = 1000
LIVE_POLL_WAIT_S = 10
"""``tail -f`` through a live server: seconds each long poll waits for new records."""
HTTP_TIMEOUT_S = 60.0


@asynccontextmanager
async def open_client(config: str | None, *, writes: bool = True) -> AsyncIterator[Any]:
    """The node of ``config`` for one command, never taking it over from a live process.

    No live process runs the node: ``walstream.open(config)`` as always (recovering the node),
    holding the node lock (:mod:`walstream.engine.node_lock`) so that no server starts on it meanwhile.
    A live ``walstream serve`` runs it: a :class:`_LiveNodeClient` that sends writes to the
    server's HTTP API and asks it for what is not committed yet; when the server cannot be reached (or the live
    process is not a server), reads show the committed records only (with a warning on stderr)
    and writes raise :class:`~walstream.engine.node_lock.NodeBusy` naming the running process.
    """
    import walstream
    from walstream.engine import node_lock

    deployment = load_deployment(config)
    path = node_lock.lock_path(deployment)
    # A node this process runs already (a client opened in the same program) is not live
    # elsewhere: the command opens it in-process, as walstream.open does.
    mine = path is not None and node_lock.held_here(path)
    holder = None if mine else await live_holder(config, deployment)
    if holder is None and path is not None and not mine:
        try:
            lock = node_lock.NodeLock.acquire(path, deployment.node_id, f"{PROG} {command_name()}")
        except node_lock.NodeBusy as busy:
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


@asynccontextmanager
async def open_follower(config: str | None) -> AsyncIterator[Any]:
    """The node of ``config`` for ``tail --follow``, which never takes the node: through its
    live server when one answers (every acknowledged record, over long polls), else read-only
    from the metadata and object store (committed records, polled at the upload interval), so
    that writers in other processes keep running. A deployment whose metadata lives in memory
    is not shared with any other process: it is opened here, as :func:`open_client` does."""
    deployment = load_deployment(config)
    if (deployment.sections.get("metadata") or {}).get("type") == "memory":
        async with open_client(config, writes=False) as client:
            yield client
        return
    holder = await live_holder(config, deployment)
    async with _LiveNodeClient.open(
        config, deployment, holder, writes=False, following=True
    ) as client:
        yield client


def _upload_interval_s(deployment: Any) -> float:
    """``upload.max_interval`` of the deployment in seconds (how long an acknowledged record
    may wait in a running node before it is uploaded and committed)."""
    from walstream.config.engine import UploadConfig

    value = (deployment.sections.get("upload") or {}).get("max_interval")
    return float(value) if isinstance(value, (int, float)) else UploadConfig.max_interval_s


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
        headers: dict[str, str] | None = None,
    ) -> Any:
        return await _in_daemon_thread(
            lambda: self._call(method, path, body, query, timeout, headers or {})
        )

    def _call(
        self,
        method: str,
        path: str,
        body: Any,
        query: dict[str, Any] | None,
        timeout: float,
        extra_headers: dict[str, str],
    ) -> Any:
        import urllib.error
        import urllib.parse
        import urllib.request

        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {
            "Accept": "application/json",
            "s2-basin": ROOT_BASIN,
            "s2-format": "base64",
            **extra_headers,
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=timeout) as response:
                payload = response.read()
                return json.loads(payload) if payload else {}
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


#: Root basin of the S2 API: its streams are all walstream streams, under their own names.
ROOT_BASIN = "walstream"
_KEY_HEADER = "walstream-key"


def _remote_error(status: int, payload: bytes, url: str) -> WalstreamError:
    """The typed error of a server's S2 error answer (codes and bodies of the S2 API)."""
    from walstream import errors

    try:
        body = json.loads(payload)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return WalstreamError(f"the node's server at {url} answered HTTP {status}")
    if status == 412 and "seq_num_mismatch" in body:
        actual = int(body["seq_num_mismatch"])
        return errors.TailMismatchError(f"the tail is {actual}", actual)
    if status == 412 and "fencing_token_mismatch" in body:
        return errors.FencedError(
            f"fencing token mismatch: the stream's token is {body['fencing_token_mismatch']!r}"
        )
    if status == 416:
        tail = int((body.get("tail") or {}).get("seq_num", 0))
        return OutOfRangeError(f"the read starts past the tail {tail}", 0, tail)
    code = str(body.get("code", ""))
    message = str(body.get("message") or code)
    kinds: dict[str, type[WalstreamError]] = {
        "stream_not_found": StreamNotFound,
        "basin_not_found": StreamNotFound,
        "resource_already_exists": errors.StreamExists,
        "invalid": InvalidArgument,
        "bad_json": InvalidArgument,
        "bad_query": InvalidArgument,
        "bad_header": InvalidArgument,
        "bad_path": InvalidArgument,
        "transaction_conflict": errors.FencedError,
        "rate_limited": errors.CapacityError,
        "unavailable": errors.BackendUnavailable,
        "server_draining": errors.BackendUnavailable,
        "upstream_timeout": errors.AmbiguousError,
        "storage": errors.CorruptionError,
    }
    if status == 401:
        return ConfigError(
            f"the node's server at {url} wants a token: set WALSTREAM_TOKEN or server.token"
        )
    kind = kinds.get(code)
    if kind is not None:
        return kind(message)
    return WalstreamError(f"{code or 'HTTP ' + str(status)}: {message}")


def _name_path(name: str) -> str:
    import urllib.parse

    return urllib.parse.quote(name, safe="")


def _decode_record(raw: dict[str, Any]) -> SequencedRecord:
    """A record of an S2 ``ReadBatch`` (base64 format); the ``walstream-key`` first header is
    the key."""
    headers = [
        (base64.b64decode(name).decode("utf-8"), base64.b64decode(value))
        for name, value in raw.get("headers") or []
    ]
    key = None
    if headers and headers[0][0] == _KEY_HEADER:
        key = headers.pop(0)[1]
    return SequencedRecord(
        offset=int(raw["seq_num"]),
        value=base64.b64decode(raw.get("body") or ""),
        key=key,
        headers=tuple(headers),
        timestamp_ms=int(raw.get("timestamp", 0)),
    )


def _encode_record(record: Record) -> dict[str, Any]:
    headers = list(record.headers)
    if record.key is not None:
        headers.insert(0, (_KEY_HEADER, record.key))
    encoded: dict[str, Any] = {
        "body": base64.b64encode(record.value).decode(),
        "headers": [
            [base64.b64encode(name.encode("utf-8")).decode(), base64.b64encode(value).decode()]
            for name, value in headers
        ],
    }
    if record.timestamp_ms is not None:
        encoded["timestamp"] = record.timestamp_ms
    return encoded


def _s2_config(fields: Mapping[str, Any]) -> dict[str, Any]:
    """walstream stream config fields (:meth:`StreamConfig.to_json` names) as S2's
    ``StreamConfig`` JSON, for the fields given."""
    s2: dict[str, Any] = {}
    if "retention_age_s" in fields:
        age = fields["retention_age_s"]
        s2["retention_policy"] = {"infinite": {}} if age is None else {"age": age}
    stamping = {
        key: fields[name]
        for key, name in (("mode", "timestamping"), ("uncapped", "uncapped"))
        if name in fields
    }
    if stamping:
        s2["timestamping"] = stamping
    if "delete_on_empty_min_age_s" in fields:
        s2["delete_on_empty"] = {"min_age_secs": fields["delete_on_empty_min_age_s"]}
    if fields.get("storage_class") is not None:
        s2["storage_class"] = fields["storage_class"]
    return s2


class _LiveNodeClient:
    """What a command sees of a node that another live process runs: streams and committed
    records from the metadata and object store directly (nothing registered, nothing claimed);
    when the process is a reachable server, the tail, the records not yet uploaded, reads by
    timestamp or tail offset, and every write through its HTTP API."""

    def __init__(
        self,
        holder: Any,
        metadata: Any,
        reader: Any,
        remote: _RemoteNode | None,
        poll_interval_s: float = 0.25,
        stream_defaults: Any = None,
    ):
        self.stream_defaults = stream_defaults
        """The deployment's ``streams:`` defaults (what the server gives a new stream)."""
        self.holder = holder
        self.metadata = metadata
        self.reader = reader
        self.remote = remote
        self.poll_interval_s = poll_interval_s
        """Without a server, how often ``tail`` looks for newly committed records."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: str | None,
        deployment: Any,
        holder: Any,
        *,
        writes: bool,
        following: bool = False,
    ) -> AsyncIterator[_LiveNodeClient]:
        """``holder``: the live process that runs the node (None: no process does; only a
        follower opens the node's data then, read-only)."""
        from walstream.engine import node_lock
        from walstream.engine.object_reader import ObjectReader

        remote = None
        reason = "no `walstream serve` runs this node" if holder is None else holder.describe()
        if holder is not None and holder.url:
            candidate = _RemoteNode(holder.url, _token(deployment))
            try:
                await candidate.call("GET", "/health", timeout=10.0)
                remote = candidate
            except NodeUnreachable as unreachable:
                reason = str(unreachable)
            except WalstreamError as failed:
                reason = f"{holder.describe()}, but its /health answered: {failed}"
        if remote is None and writes:
            raise node_lock.NodeBusy(
                f"{reason}; this command would take the node over: stop that process, or "
                "retry once its server answers",
                holder,
            )
        interval_s = _upload_interval_s(deployment)
        if remote is None and following:
            print(
                f"{PROG}: note: {reason}; following committed records read-only (no node lock "
                "is taken, writers keep running): a record shows up once the node that "
                f"acknowledged it uploads it, at most upload.max_interval ({interval_s:g}s) "
                "after its append while that node runs, and at the latest when it closes",
                file=sys.stderr,
            )
        elif remote is None:
            print(
                f"{PROG}: warning: {reason}; showing committed records only (records it "
                "has acknowledged but not yet uploaded are not shown)",
                file=sys.stderr,
            )
        sys.stderr.flush()
        async with (
            backend(config, "metadata") as metadata,
            backend(config, "object_store") as objects,
        ):
            yield cls(
                holder,
                metadata,
                ObjectReader(objects, metadata),
                remote,
                # Polling the store more often than records can be committed finds nothing.
                poll_interval_s=min(max(interval_s, 0.05), 1.0),
                stream_defaults=deployment.engine_config.streams.config,
            )

    async def list_streams(
        self, prefix: str = "", start_after: str | int | None = None, limit: int | None = None
    ) -> list[Any]:
        result: list[Any] = await self.metadata.list_streams(prefix, start_after, limit)
        return result

    async def create_streams(self, names: list[str], *, config: Any = None) -> list[Any]:
        # Creating is a metadata transaction the server needs no part in: it finds a new
        # stream in metadata on first use, as it does one another node created. Its config is
        # the deployment's defaults, as the server would give it.
        chosen = self.stream_defaults if config is None else config
        result: list[Any] = await self.metadata.create_streams(names, chosen)
        return result

    async def open_stream(self, ref: str | int) -> _LiveStream:
        info = await self.metadata.get_stream(ref)
        return _LiveStream(self, info.stream_id, info.name)

    async def create_stream(self, name: str, *, changes: Mapping[str, Any] | None = None) -> Any:
        """Create through the server: the settings in ``changes`` (StreamConfig field names)
        over the server's ``streams:`` defaults."""
        body: dict[str, Any] = {"stream": name}
        if changes:
            body["config"] = _s2_config(changes)
        await self._remote().call("POST", "/v1/streams", body)
        info = await self.metadata.get_stream(name)
        return argparse.Namespace(name=info.name, stream_id=info.stream_id)

    async def delete_stream(self, ref: str | int) -> None:
        info = await self.metadata.get_stream(ref)
        await self._remote().call("DELETE", f"/v1/streams/{_named(info)}")

    def _remote(self) -> _RemoteNode:
        if self.remote is None:  # refused in open(); a read-only command never gets here
            from walstream.engine import node_lock

            if self.holder is None:
                raise InvalidArgument("this read-only view of the node cannot write")
            raise node_lock.NodeBusy(self.holder.describe(), self.holder)
        return self.remote


class _LiveStream:
    """A stream of a node run by another process (see :class:`_LiveNodeClient`)."""

    def __init__(self, client: _LiveNodeClient, stream_id: int, name: str | None) -> None:
        self._client = client
        self.stream_id = stream_id
        self.name = name
        self._path = f"/v1/streams/{_name_path(name or '')}"

    async def read(
        self,
        start: int | None = None,
        *,
        from_timestamp: int | None = None,
        tail_offset: int | None = None,
        limit_records: int = READ_PAGE_RECORDS,
        wait: float = 0,
        encryption: EncryptionKey | None = None,
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
                    opened = open_records(records, encryption, self.stream_id)
                    return ReadResult(opened, await self.check_tail())
        if remote is not None:
            return await self._read_remote(
                remote, start, from_timestamp, tail_offset, limit_records, wait, encryption
            )
        result = await self._read_committed(start, from_timestamp, tail_offset, limit_records)
        return ReadResult(open_records(result.records, encryption, self.stream_id), result.tail)

    async def _read_remote(
        self,
        remote: _RemoteNode,
        start: int | None,
        from_timestamp: int | None,
        tail_offset: int | None,
        limit_records: int,
        wait: float,
        encryption: EncryptionKey | None,
    ) -> ReadResult:
        self._require_name()
        query: dict[str, Any] = {"count": min(limit_records, READ_PAGE_RECORDS)}
        for name, value in (
            ("seq_num", start),
            ("timestamp", from_timestamp),
            ("tail_offset", tail_offset),
        ):
            if value is not None:
                query[name] = value
        if wait:
            query["wait"] = min(math.ceil(wait), 60)
        if start is not None:
            # S2 reads a trimmed position from the first record; the CLI reports it instead.
            first = int((await self._info()).start_offset)
            if start < first:
                tail = await self.check_tail()
                raise OutOfRangeError(
                    f"offset {start} is outside [{first}, {tail}] (trimmed)", first, tail
                )
        try:
            body = await remote.call(
                "GET",
                self._path + "/records",
                query=query,
                timeout=HTTP_TIMEOUT_S + wait,
                headers=_key_headers(encryption),
            )
        except OutOfRangeError as past:
            if start is None or start == past.tail:
                return ReadResult([], past.tail)  # at the tail: nothing yet
            first = int((await self._info()).start_offset)
            raise OutOfRangeError(
                f"offset {start} is outside [{first}, {past.tail}]", first, past.tail
            ) from None
        records = [_decode_record(raw) for raw in body.get("records", [])]
        tail = body.get("tail")
        return ReadResult(records, int(tail["seq_num"]) if tail else await self.check_tail())

    def _require_name(self) -> None:
        if self.name is None:
            raise InvalidArgument(
                f"stream {self.stream_id} has no name, and the server's API (S2) addresses "
                "streams by name; stop the server to work on it"
            )

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
        self._require_name()
        return int((await remote.call("GET", self._path + "/records/tail"))["tail"]["seq_num"])

    async def reconfigure(self, **changes: Any) -> StreamConfig:
        """Through the server (``PATCH`` of the S2 stream config): its owner applies it."""
        self._require_name()
        answer = await self._client._remote().call("PATCH", self._path, _s2_config(changes))
        del answer  # S2's form; the stored config is walstream's own
        return (await self._info()).config  # type: ignore[no-any-return]

    async def start_offset(self) -> int:
        # A trim updates the metadata before it is acknowledged: its start is current.
        return int((await self._info()).start_offset)

    async def append(
        self, records: Sequence[Record], *, encryption: EncryptionKey | None = None
    ) -> Any:
        """Appends in batches the S2 API accepts (1000 records, under 1 MiB each): atomic
        per batch, not across batches; ``encryption``: the server seals them with the key."""
        self._require_name()
        acks: list[Any] = []
        for batch in _batches(records):
            acks.append(
                await self._client._remote().call(
                    "POST",
                    self._path + "/records",
                    {"records": [_encode_record(record) for record in batch]},
                    headers=_key_headers(encryption),
                )
            )
        return argparse.Namespace(
            start=acks[0]["start"]["seq_num"],
            end=acks[-1]["end"]["seq_num"],
            tail=acks[-1]["tail"]["seq_num"],
        )

    async def trim(self, offset: int) -> None:
        """Through the server, a trim is S2's ``trim`` command record: appended to the stream
        (one more record), it moves the first readable record to ``offset``."""
        self._require_name()
        tail = await self.check_tail()
        if offset > tail:
            raise OutOfRangeError(
                f"trim({offset}) is beyond the tail {tail}", await self.start_offset(), tail
            )
        command = {
            "body": base64.b64encode(struct.pack(">Q", offset)).decode(),
            "headers": [["", base64.b64encode(b"trim").decode()]],
        }
        await self._client._remote().call("POST", self._path + "/records", {"records": [command]})

    async def tail(
        self, start: int, *, encryption: EncryptionKey | None = None
    ) -> AsyncIterator[SequencedRecord]:
        """Follow the stream from ``start``: with long polls through the server, else by
        looking for newly committed records every :attr:`_LiveNodeClient.poll_interval_s`
        (``encryption``: the key of encrypted records)."""
        position = start
        if self._client.remote is None:
            while True:
                info = await self._info()
                if position < info.start_offset:
                    position = int(info.start_offset)  # trimmed meanwhile: skip what is gone
                if position < info.committed_end:
                    result = await self._read_committed(position, None, None, READ_PAGE_RECORDS)
                    for record in open_records(result.records, encryption, self.stream_id):
                        yield record
                        position = record.offset + 1
                    if result.records:
                        continue
                await asyncio.sleep(self._client.poll_interval_s)
        while True:
            result = await self.read(position, wait=LIVE_POLL_WAIT_S, encryption=encryption)
            for record in result.records:
                yield record
                position = record.offset + 1


_BATCH_RECORDS = 1000
_BATCH_BYTES = 900 * 1024


def _batches(records: Sequence[Record]) -> list[list[Record]]:
    """``records`` cut into S2 append batches (at most 1000 records and about 900 KiB)."""
    batches: list[list[Record]] = [[]]
    size = 0
    for record in records:
        cost = 8 + len(record.value) + sum(2 + len(n) + len(v) for n, v in record.headers)
        if record.key is not None:
            cost += 2 + len(_KEY_HEADER) + len(record.key)
        if batches[-1] and (len(batches[-1]) >= _BATCH_RECORDS or size + cost > _BATCH_BYTES):
            batches.append([])
            size = 0
        batches[-1].append(record)
        size += cost
    return batches


def _key_headers(encryption: EncryptionKey | None) -> dict[str, str]:
    """The headers that carry a key to the server (for this request only)."""
    if encryption is None:
        return {}
    return {
        "s2-encryption-key": base64.b64encode(encryption.secret).decode("ascii"),
        "walstream-encryption-cipher": encryption.cipher.value,
    }


def _named(info: Any) -> str:
    if info.name is None:
        raise InvalidArgument(
            f"stream {info.stream_id} has no name, and the server's API (S2) addresses streams "
            "by name; stop the server to work on it"
        )
    return _name_path(info.name)


def _token(deployment: Any) -> str | None:
    """The token a server of this deployment wants: ``$WALSTREAM_TOKEN``, else server.token."""
    return os.environ.get("WALSTREAM_TOKEN") or deployment.sections.get("server", {}).get("token")
