"""A synchronous facade over the async client, for scripts and Spark executors.

::

    import walstream.blocking
    from walstream import Record

    with walstream.blocking.open("deploy.yaml") as client:
        stream = client.create_stream("orders")
        ack = stream.append([Record(b"hello")])
        for record in stream.read(start=ack.start).records:
            print(record.offset, record.value)

A :class:`SyncClient` owns a private event loop running in a background daemon thread; every
method submits the matching coroutine to that loop and blocks until it finishes. The methods and
their arguments are those of :class:`walstream.engine.client.Client` and
:class:`walstream.engine.client.Stream`, and errors propagate unchanged (the same
:mod:`walstream.errors` instances). A client may be shared by several threads: calls run
concurrently on its loop, exactly as concurrent tasks would on the async client.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from walstream.encryption import EncryptionKey
from walstream.metadata.contract import StreamInfo
from walstream.records import AppendAck, ReadResult, Record, SequencedRecord
from walstream.stream_config import StreamConfig

if TYPE_CHECKING:
    from walstream.engine.client import Client, Stream

__all__ = ["EventLoopThread", "SyncClient", "SyncStream", "TailIterator", "open"]

T = TypeVar("T")


class EventLoopThread:
    """An asyncio event loop running forever in a daemon thread, until :meth:`stop`."""

    def __init__(self, name: str = "walstream-sync") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._loop.is_closed()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coroutine`` on the loop; the returned future completes with its result."""
        self._check_usable(coroutine)
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` on the loop and block until it is done; its exception is re-raised."""
        self._check_usable(awaitable)
        return self.submit(_await(awaitable)).result()

    def _check_usable(self, awaitable: Awaitable[Any]) -> None:
        problem = None
        if threading.current_thread() is self._thread:
            problem = (
                "a walstream.blocking call was made from its own event loop thread; use the "
                "async API there"
            )
        elif not self.running:
            problem = "this walstream.blocking client is closed"
        if problem is not None:
            if isinstance(awaitable, Coroutine):
                awaitable.close()  # never started: close it so no "never awaited" warning
            raise RuntimeError(problem)

    def stop(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            if threading.current_thread() is not self._thread:
                self._thread.join()


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


class SyncStream:
    """Blocking twin of :class:`walstream.engine.client.Stream`."""

    def __init__(self, stream: Stream, runner: EventLoopThread) -> None:
        self._stream = stream
        self._runner = runner

    @property
    def stream_id(self) -> int:
        return self._stream.stream_id

    @property
    def name(self) -> str | None:
        return self._stream.name

    @property
    def config(self) -> StreamConfig:
        """The stream's configuration (:attr:`walstream.Stream.config`)."""
        return self._stream.config

    def reconfigure(self, **changes: Any) -> StreamConfig:
        """Change the settings named, keep the others (:meth:`walstream.Stream.reconfigure`)."""
        return self._runner.run(self._stream.reconfigure(**changes))

    @property
    def async_stream(self) -> Stream:
        """The wrapped async stream (use it only on the client's loop, e.g. via ``client.run``)."""
        return self._stream

    def append(
        self,
        records: Sequence[Record],
        match_tail: int | None = None,
        fencing_token: str | None = None,
        *,
        encryption: EncryptionKey | None = None,
    ) -> AppendAck:
        """Append one batch atomically; durable in the WAL when this returns (``encryption``:
        seal the records with this key, :mod:`walstream.encryption`)."""
        return self._runner.run(
            self._stream.append(
                records, match_tail=match_tail, fencing_token=fencing_token, encryption=encryption
            )
        )

    def read(
        self,
        start: int | None = None,
        *,
        from_timestamp: int | None = None,
        tail_offset: int | None = None,
        limit_records: int | None = None,
        limit_bytes: int | None = None,
        wait: float = 0.0,
        encryption: EncryptionKey | None = None,
    ) -> ReadResult:
        """Read from ``start`` (or ``from_timestamp``, or ``tail_offset`` records before the tail).

        Limits left as ``None`` take the async client's defaults; ``encryption``: the key of
        encrypted records.
        """
        kwargs: dict[str, Any] = {"wait": wait, "encryption": encryption}
        if start is not None:
            kwargs["start"] = start
        if from_timestamp is not None:
            kwargs["from_timestamp"] = from_timestamp
        if tail_offset is not None:
            kwargs["tail_offset"] = tail_offset
        if limit_records is not None:
            kwargs["limit_records"] = limit_records
        if limit_bytes is not None:
            kwargs["limit_bytes"] = limit_bytes
        return self._runner.run(self._stream.read(**kwargs))

    def tail(
        self, start: int | None = None, *, encryption: EncryptionKey | None = None
    ) -> TailIterator:
        """Iterate records from ``start`` (default: the current tail) on, following new appends
        forever.

        Leave the loop with ``break`` (or call :meth:`TailIterator.close`); the underlying async
        iterator is closed on the client's loop.
        """
        return TailIterator(self._stream.tail(start, encryption=encryption), self._runner)

    def trim(self, new_start: int) -> None:
        """Make offsets before ``new_start`` unreadable."""
        self._runner.run(self._stream.trim(new_start))

    def check_tail(self) -> int:
        return self._runner.run(self._stream.check_tail())

    def set_fencing_token(self, token: str | None) -> None:
        """Require ``fencing_token=token`` on later appends (``None`` removes it)."""
        self._runner.run(self._stream.set_fencing_token(token))

    def start_offset(self) -> int:
        """The first readable offset (moved by trim)."""
        return self._runner.run(self._stream.start_offset())

    def __repr__(self) -> str:
        return f"SyncStream(stream_id={self.stream_id}, name={self.name!r})"


class TailIterator(Iterator[SequencedRecord]):
    """A blocking iterator over an async ``stream.tail()``; each ``next`` waits for a record."""

    def __init__(self, records: AsyncIterator[SequencedRecord], runner: EventLoopThread) -> None:
        self._records = records
        self._runner = runner
        self._closed = False

    def __iter__(self) -> TailIterator:
        return self

    def __next__(self) -> SequencedRecord:
        if self._closed:
            raise StopIteration
        try:
            return self._runner.run(self._records.__anext__())
        except StopAsyncIteration:
            self._closed = True
            raise StopIteration from None

    def close(self) -> None:
        """Stop following; idempotent."""
        if self._closed:
            return
        self._closed = True
        aclose = getattr(self._records, "aclose", None)
        if aclose is not None and self._runner.running:
            self._runner.run(aclose())

    def __enter__(self) -> TailIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # An abandoned iterator must not keep a reader registered on the loop.
        if self._closed:
            return
        self._closed = True
        aclose = getattr(self._records, "aclose", None)
        if aclose is not None and self._runner.running:
            with contextlib.suppress(RuntimeError):
                self._runner.submit(aclose())


class SyncClient:
    """Blocking twin of :class:`walstream.engine.client.Client`. Use :func:`open` to make one."""

    def __init__(self, client: Client, runner: EventLoopThread) -> None:
        self._client = client
        self._runner = runner
        self._closed = False

    @property
    def async_client(self) -> Client:
        """The wrapped async client (use it only on this client's loop, e.g. via :meth:`run`)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The private event loop the client runs on."""
        return self._runner.loop

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run any awaitable on the client's loop (e.g. ``client.run(client.async_client.metadata
        .list_objects())``) and return its result."""
        return self._runner.run(awaitable)

    def create_stream(self, name: str | None, *, config: StreamConfig | None = None) -> SyncStream:
        """Create a stream (``StreamExists`` if the name is taken) with ``config`` (None: the
        deployment's ``streams:`` defaults)."""
        return SyncStream(
            self._runner.run(self._client.create_stream(name, config=config)), self._runner
        )

    def open_stream(self, name_or_id: str | int) -> SyncStream:
        """Open a stream by name or id (``StreamNotFound`` if there is none)."""
        return SyncStream(self._runner.run(self._client.open_stream(name_or_id)), self._runner)

    def create_streams(self, names: Sequence[str]) -> list[SyncStream]:
        """Create streams in one transaction (:meth:`walstream.Client.create_streams`)."""
        return [
            SyncStream(stream, self._runner)
            for stream in self._runner.run(self._client.create_streams(names))
        ]

    def list_streams(
        self, prefix: str = "", start_after: str | int | None = None, limit: int | None = None
    ) -> list[StreamInfo]:
        """A page of streams (:meth:`walstream.Client.list_streams`)."""
        return self._runner.run(
            self._client.list_streams(prefix=prefix, start_after=start_after, limit=limit)
        )

    def delete_stream(self, name_or_id: str | int) -> None:
        self._runner.run(self._client.delete_stream(name_or_id))

    def flush(self) -> None:
        """Seal, upload and commit everything acknowledged so far."""
        self._runner.run(self._client.flush())

    def close(self) -> None:
        """Flush and close the client, then stop the loop thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._client.close())
        finally:
            self._runner.stop()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open(config: Any = None) -> SyncClient:
    """Open a client like :func:`walstream.open` and return its blocking facade.

    ``config`` is a deployment YAML path, a dict, a Deployment of the plugin host (walstream-plugins), or ``None``
    for the embedded default deployment in ``./walstream-data``.
    """
    import walstream

    if isinstance(config, Path):
        config = str(config)
    runner = EventLoopThread()
    try:
        client = runner.run(_open_client(walstream, config))
    except BaseException:
        runner.stop()
        raise
    return SyncClient(client, runner)


async def _open_client(module: Any, config: Any) -> Client:
    client: Client = await module.open(config)
    return client
