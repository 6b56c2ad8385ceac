"""The uploader: moves sealed LogCache blocks into object storage (docs/architecture/write-path.md).

For each sealed block, in FIFO order of commits: ``prepare`` object ids → build and put the
object(s) (several blocks may be building and putting at once) → ``commit`` to metadata strictly
in block order → ``wal.trim`` up to the block's last WAL offset → the block becomes evictable.

A block with one stream becomes a *stream object*; otherwise streams with at least
``split_bytes`` in the block get their own stream object and the rest share one *stream-set
object*.

Objects are never overwritten: every object is created with ``put_if_absent`` under a key that
names the deployment and carries the deployment and object id in its footer
(:func:`publish_object`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from walstream.clock import Clock, Rng
from walstream.config.engine import UploadConfig
from walstream.engine.cache import LogBlock, LogCache, StreamRun
from walstream.engine.events import EngineHooks, ObjectCommitted, ObjectUploaded
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CorruptionError,
    IdentityMismatch,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)
from walstream.format.object import ObjectIdentity, parse_footer
from walstream.format.object_builder import BuiltObject, ObjectBuilder
from walstream.format.object_keys import object_key
from walstream.metadata.contract import MetadataStore, ObjectCommit, ObjectKind, StreamRange
from walstream.objects.contract import ObjectStore
from walstream.wal.contract import WriteAheadLog

__all__ = ["Uploader", "publish_object", "retry_transient"]

log = logging.getLogger(__name__)

_OFFLOAD_BUILD_BYTES = 1 << 20


async def retry_transient(
    operation: Callable[[], asyncio.Future[object] | object],
    *,
    what: str,
    clock: Clock,
    rng: Rng,
    give_up: Callable[[], bool],
    max_delay_s: float = 5.0,
) -> object:
    """Run ``operation`` until it succeeds, retrying :class:`BackendUnavailable` (and
    ``Throttled``) and :class:`AmbiguousError` with jittered exponential backoff; other errors
    propagate. Only for idempotent operations: a put of the same key and bytes, a repeated
    commit (metadata invariant 4), or preparing ids (a lost id just expires)."""
    delay = 0.02
    attempt = 0
    while True:
        attempt += 1
        try:
            result = operation()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                return await result
            return result
        except (BackendUnavailable, AmbiguousError) as exc:
            if give_up():
                raise
            if attempt in (1, 10) or attempt % 100 == 0:
                log.warning("%s failed (attempt %d, retrying): %s", what, attempt, exc)
            await clock.sleep(rng.uniform(delay / 2, delay))
            delay = min(max_delay_s, delay * 2)


async def publish_object(
    objects: ObjectStore,
    key: str,
    data: bytes,
    identity: ObjectIdentity,
    *,
    clock: Clock,
    rng: Rng,
    give_up: Callable[[], bool],
) -> None:
    """Create object ``key`` holding ``data`` (an object built for ``identity``), never
    overwriting anything.

    The put is conditional (``put_if_absent``) and retried on transient errors. When the key
    already exists — typically because an earlier attempt whose answer was lost did create it —
    the existing object is read back: the same bytes mean it is ours and the publish succeeded.
    Anything else is left untouched and raises :class:`IdentityMismatch` (another deployment's
    or another object's file holds the key) or :class:`PreconditionFailed` (a different object
    of the same identity: the object id was handed out twice, e.g. metadata restored from an
    older backup).
    """
    try:
        await retry_transient(
            lambda: objects.put_if_absent(key, data),
            what=f"put {key}",
            clock=clock,
            rng=rng,
            give_up=give_up,
        )
        return
    except PreconditionFailed:
        pass
    try:
        existing = await retry_transient(
            lambda: objects.get(key),
            what=f"read back existing {key}",
            clock=clock,
            rng=rng,
            give_up=give_up,
        )
    except NotFound:
        raise PreconditionFailed(
            f"object {key!r} was reported to exist but cannot be read back; it was not "
            "overwritten. Check for another writer using this object store"
        ) from None
    assert isinstance(existing, bytes)
    if existing == data:
        log.info("object %s already holds exactly our bytes: an earlier attempt created it", key)
        return
    try:
        found = parse_footer(existing, len(existing)).identity
    except CorruptionError:
        found = None
    if found is not None and found != identity:
        raise IdentityMismatch(
            f"cannot create object {key!r}: it already exists with {found.describe()}, expected "
            f"{identity.describe()}; it was not overwritten. Another deployment writes to the "
            "same object store location: give each deployment its own bucket prefix or folder"
        )
    raise PreconditionFailed(
        f"cannot create object {key!r} ({identity.describe()}): another object "
        f"({len(existing)} bytes, identity "
        f"{'none or unreadable' if found is None else found.describe()}) already exists under "
        "this key and was not overwritten. The object id was handed out twice (was metadata "
        "restored from an older backup?)"
    )


@dataclass
class _PlannedObject:
    kind: ObjectKind
    streams: list[StreamRun]


class Uploader:
    def __init__(
        self,
        *,
        cache: LogCache,
        wal: WriteAheadLog,
        objects: ObjectStore,
        metadata: MetadataStore,
        node_id: int,
        node_epoch: int,
        config: UploadConfig,
        hooks: EngineHooks,
        clock: Clock,
        rng: Rng,
        is_live: Callable[[int], bool],
        on_fatal: Callable[[BaseException], None],
        trim_wal: bool = True,
        deployment_id: bytes | None = None,
    ) -> None:
        self._cache = cache
        self._deployment_id = deployment_id
        """The deployment whose objects this writes (loaded from metadata when not given)."""
        self._wal = wal
        self._objects = objects
        self._metadata = metadata
        self.node_id = node_id
        self.node_epoch = node_epoch
        self._config = config
        self._hooks = hooks
        self._clock = clock
        self._rng = rng
        self._is_live = is_live
        self._on_fatal = on_fatal
        self.trim_wal = trim_wal
        """False while recovery still iterates the WAL (its final ``reset`` covers the trim)."""
        self._semaphore = asyncio.Semaphore(max(1, config.max_concurrency))
        self._kick = asyncio.Event()
        self._last_commit: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._sealer: asyncio.Task[None] | None = None
        self._stopping = False
        self._aborted = False
        self.objects_written = 0
        self.bytes_written = 0
        self.failure: BaseException | None = None

    def start(self) -> None:
        self._sealer = asyncio.create_task(self._seal_loop(), name=f"uploader-{self.node_id}")

    def notify_added(self) -> None:
        """Called after each append: seal at once when the block is full, start its timer when
        it was empty."""
        active = self._cache.active
        if active.size_bytes >= self._config.max_bytes or len(active) == 1:
            self._kick.set()

    def request_upload(self) -> None:
        """Seal the active block now (back-pressure, flush)."""
        self._seal_now()

    async def flush(self) -> None:
        """Seal the active block and wait until everything sealed so far is committed."""
        self._seal_now()
        last = self._last_commit
        if last is not None:
            await asyncio.shield(last)

    async def close(self, abort: bool = False) -> None:
        """Stop the sealer; unless ``abort``, upload and commit everything first."""
        if not abort and self.failure is None:
            await self.flush()
        self._stopping = True
        self._aborted = abort
        self._kick.set()
        if self._sealer is not None:
            await asyncio.gather(self._sealer, return_exceptions=True)
        if abort:
            for task in list(self._tasks):
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- sealing --------------------------------------------------------------------------------

    async def _seal_loop(self) -> None:
        while not self._stopping:
            self._kick.clear()
            active = self._cache.active
            if active.size_bytes >= self._config.max_bytes:
                self._seal_now()
                continue
            if len(active):
                remaining = self._config.max_interval_s - self._cache.active_age()
                if remaining <= 0:
                    self._seal_now()
                    continue
                await self._clock.wait(self._kick, remaining)
            else:
                await self._kick.wait()

    def _seal_now(self) -> None:
        block = self._cache.seal_active()
        if block is None:
            return
        previous = self._last_commit
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_commit = done
        task = asyncio.create_task(self._upload(block, previous, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one block --------------------------------------------------------------------------------

    async def _upload(
        self, block: LogBlock, previous: asyncio.Future[None] | None, done: asyncio.Future[None]
    ) -> None:
        try:
            await block.settled.wait()
            runs = [run for run in block.acked_runs() if self._is_live(run.stream_id)]
            commits: list[ObjectCommit] = []
            if runs:
                async with self._semaphore:
                    commits = await self._write_objects(runs)
            if previous is not None:
                await asyncio.shield(previous)
            if commits:
                await retry_transient(
                    lambda: self._metadata.commit_objects(self.node_id, self.node_epoch, commits),
                    what="metadata commit",
                    clock=self._clock,
                    rng=self._rng,
                    give_up=lambda: self._aborted,
                )
            wal_offset = block.last_acked_wal_offset
            if wal_offset >= 0 and self.trim_wal:
                await self._wal.trim(wal_offset)
            self._cache.mark_committed(block)
            self._hooks.emit(
                ObjectCommitted(
                    self.node_id,
                    [commit.object_id for commit in commits],
                    sum(commit.size for commit in commits),
                    wal_offset,
                )
            )
            done.set_result(None)
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
                if not isinstance(exc, asyncio.CancelledError):
                    log.error("upload of block %d failed: %s", block.block_id, exc)
                    self._on_fatal(exc)
            done.set_exception(
                exc
                if isinstance(exc, WalstreamError)
                else BackendUnavailable(f"upload failed: {exc!r}")
            )
            done.exception()
            if isinstance(exc, asyncio.CancelledError):
                raise

    def _plan(self, runs: list[StreamRun]) -> list[_PlannedObject]:
        if len(runs) == 1:
            return [_PlannedObject(ObjectKind.STREAM, runs)]
        planned: list[_PlannedObject] = []
        shared: list[StreamRun] = []
        for run in runs:
            if run.size_bytes >= self._config.split_bytes:
                planned.append(_PlannedObject(ObjectKind.STREAM, [run]))
            else:
                shared.append(run)
        if shared:
            kind = ObjectKind.STREAM if len(shared) == 1 else ObjectKind.STREAM_SET
            planned.append(_PlannedObject(kind, shared))
        return planned

    async def _write_objects(self, runs: list[StreamRun]) -> list[ObjectCommit]:
        planned = self._plan(runs)
        ttl_ms = int(self._config.prepare_ttl_s * 1000)
        object_ids = await retry_transient(
            lambda: self._metadata.prepare_objects(len(planned), ttl_ms),
            what="prepare object ids",
            clock=self._clock,
            rng=self._rng,
            give_up=lambda: self._aborted,
        )
        assert isinstance(object_ids, list)
        if self._deployment_id is None:
            self._deployment_id = await self._metadata.deployment_id()
        commits = await asyncio.gather(
            *(
                self._write_one(object_id, plan)
                for object_id, plan in zip(object_ids, planned, strict=True)
            )
        )
        return list(commits)

    async def _write_one(self, object_id: int, plan: _PlannedObject) -> ObjectCommit:
        assert self._deployment_id is not None
        identity = ObjectIdentity(self._deployment_id, object_id)
        total = sum(run.size_bytes for run in plan.streams)
        if total >= _OFFLOAD_BUILD_BYTES:
            built = await asyncio.to_thread(
                _build, plan.streams, identity, self._config.object_format
            )
        else:
            built = _build(plan.streams, identity, self._config.object_format)
        key = object_key(object_id, self._deployment_id)
        await publish_object(
            self._objects,
            key,
            built.data,
            identity,
            clock=self._clock,
            rng=self._rng,
            give_up=lambda: self._aborted,
        )
        self.objects_written += 1
        self.bytes_written += len(built.data)
        self._hooks.emit(
            ObjectUploaded(self.node_id, object_id, key, len(built.data), plan.kind.value)
        )
        ranges = tuple(
            StreamRange(
                stream_id=run.stream_id,
                start_offset=run.start_offset,
                end_offset=run.end_offset,
                epoch=run.epoch,
                min_timestamp_ms=run.min_timestamp_ms,
                max_timestamp_ms=run.max_timestamp_ms,
            )
            for run in plan.streams
        )
        return ObjectCommit(object_id, key, plan.kind, len(built.data), built.index_size, ranges)


def _build(runs: list[StreamRun], identity: ObjectIdentity, format_version: int) -> BuiltObject:
    builder = ObjectBuilder(identity=identity, format_version=format_version)
    for run in runs:
        if len(run.indexes) == 1:
            (index,) = run.indexes
            builder.add_stream_batch(
                run.stream_id, run.block.data[index], run.start_offset, run.end_offset
            )
        else:
            builder.add_stream_run(run.stream_id, *run.columns())
    return builder.finish()
