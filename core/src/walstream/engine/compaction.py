"""Compaction and garbage collection of objects, shaped like AutoMQ's s3stream compaction.

Uploads leave many small objects: a *stream-set object* (SSO) per upload holding every stream
that had data, and a *stream object* when one stream had the block to itself. Compaction keeps
their number per byte bounded without giving each stream objects of its own:

1. **Stream-set merge** (phase A). Candidates are stream-set objects smaller than
   ``small_object_bytes`` and stream objects smaller than ``stream_split_bytes``. Oldest first,
   they are taken in *steps* of at most ``max_object_bytes`` of input (and at most
   :data:`MAX_STEP_SOURCES` objects). A step rewrites its sources' live data into one new
   stream-set object; a stream whose live bytes in the step reach ``stream_split_bytes`` is
   *split* into a stream object of its own instead. Small streams therefore stay together.
2. **Stream-object merge** (phase B). Stream objects of ``stream_split_bytes`` up to
   ``small_object_bytes`` that hold contiguous offsets of one stream are merged, up to
   ``max_object_bytes`` per new object.

Rules every step keeps (each has a test that fails when it is broken):

- it writes no more objects than it replaces (:mod:`walstream.engine.compaction_plan` caps the
  split streams and layers by the step's source count; phase B merges two or more into one);
- each source object is fetched whole with ONE ranged GET, its index parsed from that read, so
  every source index is read once per pass and a pass's I/O is the bytes it rewrites;
- the CPU work (index parsing, block CRCs, building objects) runs in a worker thread, off the
  event loop; block bodies are copied, not decoded;
- nothing is lost, duplicated or reordered: live data (ACTIVE streams, at or after their
  ``start_offset``, inside the ranges metadata records) is copied block by block in offset
  order; data-loss gaps and data held outside the step split a stream into separate runs;
- every step commits on its own with :meth:`~walstream.metadata.contract.MetadataStore
  .replace_objects`, which fails if a source changed meanwhile (trimmed away, stream deleted,
  compacted by another node), so an interrupted pass keeps every step it committed and redoes at
  most one step;
- crash safety: new objects get prepared ids first (a crash leaves them to expire and be
  collected), are written with a conditional create, and become visible only through the
  replace; output keys are deleted only when the replace definitely did not apply
  (:class:`PreconditionFailed`, or nothing was sent); after a cancelled or ambiguous replace they
  are left for the prepared-id expiry, since the replace may have committed them;
- :meth:`Compactor.close` cancels a running pass at once (the worker thread stops at its next
  block), so ``client.close()`` and a server drain are not held up by compaction.

Garbage collection deletes the keys of MARK_DESTROYED objects and of prepared ids whose TTL
expired (uploads or compaction outputs that never committed), then forgets them in metadata. A
reader that raced a deletion gets ``NotFound`` and looks the range up again.

Schedule: when a pass is due is derived from durable state, so restarts do not reset it. A pass
is due once the oldest candidate has been committed for ``interval_s`` (its ``committed_ms``),
or at once when garbage waits; within one process passes are at least ``interval_s`` apart.

Bound: once a pass has run over quiet data, every object is at least ``stream_split_bytes`` or
``small_object_bytes`` (whichever is smaller), except at most one small stream-set object per step
and per stream-object run; docs/architecture/compaction.md turns this into objects per GiB.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from walstream.clock import Clock, Rng, make_rng
from walstream.config.engine import CompactionConfig
from walstream.engine.compaction_plan import (
    StepPlan,
    build_outputs,
    plan_step,
)
from walstream.engine.events import Compacted, EngineHooks
from walstream.engine.upload import publish_object
from walstream.errors import (
    CorruptionError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)
from walstream.format.object import ObjectIdentity
from walstream.format.object_builder import DEFAULT_BLOCK_TARGET_BYTES
from walstream.format.object_keys import object_key
from walstream.metadata.contract import (
    MetadataStore,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
)
from walstream.objects.contract import ObjectStore

__all__ = ["MAX_STEP_SOURCES", "Compactor", "PassReport"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_STEP_SOURCES = 500
"""Most source objects one step replaces: bounds a step's metadata transaction and GETs
(AutoMQ's default for one stream-set compaction is 500 objects too)."""
_FETCH_CONCURRENCY = 8
_DEFAULT_PREPARE_TTL_MS = 600_000


@dataclass(frozen=True, slots=True)
class PassReport:
    """What one :meth:`Compactor.compact_once` pass did."""

    steps: int
    """Steps committed."""
    planned_steps: int
    sources: int
    """Objects replaced."""
    outputs: int
    """Objects written in their place (never more than ``sources``)."""
    bytes_read: int
    bytes_written: int
    skipped_corrupt: int = 0
    """Steps left alone because a source failed its checks (logged as errors)."""


@dataclass(frozen=True, slots=True)
class _Step:
    phase: str
    sources: tuple[ObjectInfo, ...]

    @property
    def size(self) -> int:
        return sum(info.size for info in self.sources)


class Compactor:
    def __init__(
        self,
        *,
        objects: ObjectStore,
        metadata: MetadataStore,
        config: CompactionConfig,
        hooks: EngineHooks,
        clock: Clock,
        on_destroyed: Callable[[set[int]], None] | None = None,
        deployment_id: bytes | None = None,
        rng: Rng | None = None,
        prepare_ttl_ms: int = _DEFAULT_PREPARE_TTL_MS,
        object_format: int | None = None,
    ) -> None:
        self._object_format = object_format
        """The object format version outputs are written in (None: the current one)."""
        self._deployment_id = deployment_id
        """The deployment whose objects this compacts (loaded from metadata when not given)."""
        self._rng = rng or make_rng(None)
        self._objects = objects
        self._metadata = metadata
        self._config = config
        self._hooks = hooks
        self._clock = clock
        self._on_destroyed = on_destroyed
        self._prepare_ttl_ms = prepare_ttl_ms
        self._task: asyncio.Task[None] | None = None
        self._passes: set[asyncio.Task[bool]] = set()
        self._stop = asyncio.Event()
        self._one_pass = asyncio.Lock()
        """One pass at a time: a pass asked for by hand waits for the periodic one."""
        self._halt = threading.Event()
        """Set with ``_stop``: tells a worker thread to abandon its step."""
        self.last_pass: PassReport | None = None
        """The report of the last pass that ran to its end."""
        self.in_thread = True
        """Run the CPU work of a step in a worker thread (False: on the event loop, to measure
        what the thread buys: ``bench/streams_scale.py --inline-compaction``)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="compactor")

    async def close(self) -> None:
        """Stop: cancel the periodic loop and any running pass (its committed steps stay; the
        step in flight is abandoned and its outputs left for garbage collection)."""
        self._stop.set()
        self._halt.set()
        tasks = [task for task in (self._task, *self._passes) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        last_pass_ms: int | None = None
        while not self._stop.is_set():
            try:
                delay = await self.seconds_until_due(last_pass_ms)
            except WalstreamError as exc:
                log.warning("cannot tell when compaction is due, will retry: %s", exc)
                delay = self._config.interval_s
            if delay > 0:
                if await self._clock.wait(self._stop, delay):
                    return
            try:
                await self.compact_once()
                await self.collect_garbage()
            except WalstreamError as exc:
                log.warning("compaction pass failed, will retry: %s", exc)
            last_pass_ms = self._clock.now_ms()

    async def seconds_until_due(self, last_pass_ms: int | None = None) -> float:
        """Seconds until the next pass is due (0: now), from durable state: due when the oldest
        candidate was committed ``interval_s`` ago, or now when garbage waits; never sooner than
        ``interval_s`` after ``last_pass_ms`` (this process's previous pass, if any). With fewer
        candidates than ``min_objects`` and no garbage, the answer is ``interval_s`` (look
        again then)."""
        interval_ms = int(self._config.interval_s * 1000)
        now_ms = self._clock.now_ms()
        earliest = now_ms if last_pass_ms is None else last_pass_ms + interval_ms
        committed = await self._metadata.list_objects(state=ObjectState.COMMITTED)
        candidates = [info for info in committed if self._is_candidate(info)]
        if len(candidates) >= self._config.min_objects:
            due = min(info.committed_ms for info in candidates) + interval_ms
        elif await self._metadata.list_objects(state=ObjectState.MARK_DESTROYED):
            due = now_ms
        else:
            due = now_ms + interval_ms
        return max(0, max(due, earliest) - now_ms) / 1000

    def _merges_into_sets(self, info: ObjectInfo) -> bool:
        """A phase-A candidate: merged with others into a stream-set object."""
        if info.kind is ObjectKind.STREAM_SET:
            return info.size < self._config.small_object_bytes
        return info.size < self._config.stream_split_bytes

    def _merges_per_stream(self, info: ObjectInfo) -> bool:
        """A phase-B candidate: merged with the stream's neighbouring stream objects."""
        return (
            info.kind is ObjectKind.STREAM
            and self._config.stream_split_bytes <= info.size < self._config.small_object_bytes
            and len(info.ranges) == 1
        )

    def _is_candidate(self, info: ObjectInfo) -> bool:
        return self._merges_into_sets(info) or self._merges_per_stream(info)

    async def _deployment(self) -> bytes:
        if self._deployment_id is None:
            self._deployment_id = await self._metadata.deployment_id()
        return self._deployment_id

    def plan_steps(self, committed: Sequence[ObjectInfo]) -> list[_Step]:
        """The steps of a pass over ``committed`` (every COMMITTED object), in order: phase A
        steps oldest first, then phase B. Each step has two or more sources, at most
        ``max_object_bytes`` of them and at most :data:`MAX_STEP_SOURCES`."""
        limit = self._config.max_object_bytes
        steps: list[_Step] = []

        def close(group: list[ObjectInfo], phase: str) -> None:
            if len(group) >= 2:
                steps.append(_Step(phase, tuple(group)))

        group: list[ObjectInfo] = []
        size = 0
        ordered = sorted(committed, key=lambda info: (info.committed_ms, info.object_id))
        for info in ordered:
            if not self._merges_into_sets(info):
                continue
            if group and (size + info.size > limit or len(group) >= MAX_STEP_SOURCES):
                close(group, "stream-set")
                group, size = [], 0
            group.append(info)
            size += info.size
        close(group, "stream-set")

        per_stream: dict[int, list[ObjectInfo]] = {}
        for info in committed:
            if self._merges_per_stream(info):
                per_stream.setdefault(info.ranges[0].stream_id, []).append(info)
        for stream_id in sorted(per_stream):
            infos = sorted(per_stream[stream_id], key=lambda info: info.ranges[0].start_offset)
            group, size = [], 0
            for info in infos:
                contiguous = bool(group) and (
                    group[-1].ranges[0].end_offset == info.ranges[0].start_offset
                )
                if group and (
                    not contiguous or size + info.size > limit or len(group) >= MAX_STEP_SOURCES
                ):
                    close(group, "stream")
                    group, size = [], 0
                group.append(info)
                size += info.size
            close(group, "stream")
        return steps

    async def compact_once(self) -> bool:
        """One pass; True if objects were rewritten. The pass runs as a task of its own so that
        :meth:`close` can cancel it: then this raises :class:`InvalidArgument` (the client
        closed) and the steps committed so far stay."""
        task = asyncio.create_task(self._pass(), name="compaction-pass")
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled() or not self._stop.is_set():
                task.cancel()
                raise
            raise InvalidArgument(
                "the client closed during the compaction pass; the steps it committed stay, "
                "the next pass redoes the rest"
            ) from None

    async def _pass(self) -> bool:
        async with self._one_pass:
            return await self._pass_alone()

    async def _pass_alone(self) -> bool:
        if self._stop.is_set():
            return False
        committed = await self._metadata.list_objects(state=ObjectState.COMMITTED)
        candidates = sum(1 for info in committed if self._is_candidate(info))
        if candidates < self._config.min_objects:
            return False
        steps = self.plan_steps(committed)
        if not steps:
            return False
        log.info(
            "compaction pass: %d steps over %d of %d objects (%d bytes)",
            len(steps),
            sum(len(step.sources) for step in steps),
            len(committed),
            sum(step.size for step in steps),
        )
        done = sources = outputs = bytes_read = bytes_written = corrupt = 0
        pace_from = self._clock.monotonic()
        paced_bytes = 0
        for number, step in enumerate(steps, 1):
            if self._config.max_bytes_per_s and paced_bytes:
                # Keep the pass's average under max_bytes_per_s: wait until the bytes read so
                # far are due, then go on (the wait ends at once when the compactor stops).
                due = pace_from + paced_bytes / self._config.max_bytes_per_s
                delay = due - self._clock.monotonic()
                if delay > 0 and await self._clock.wait(self._stop, delay):
                    break
            paced_bytes += step.size
            try:
                result = await self._run_step(step)
            except CorruptionError as exc:
                # Never rewrite from a damaged source: leave the step's objects as they are
                # (reads of the bad block keep failing loudly) and go on with the next step.
                corrupt += 1
                log.error(
                    "compaction step %d/%d skipped: a source object failed its checks: %s",
                    number, len(steps), exc,
                )  # fmt: skip
                continue
            if result is None:
                continue
            read, written, output_count = result
            done += 1
            sources += len(step.sources)
            outputs += output_count
            bytes_read += read
            bytes_written += written
            log.info(
                "compaction step %d/%d (%s): %d objects (%d bytes) -> %d objects (%d bytes)",
                number, len(steps), step.phase, len(step.sources), read, output_count, written,
            )  # fmt: skip
        self.last_pass = PassReport(
            done, len(steps), sources, outputs, bytes_read, bytes_written, corrupt
        )
        return done > 0

    async def _run_step(self, step: _Step) -> tuple[int, int, int] | None:
        """Rewrite one step; ``(bytes read, bytes written, objects written)``, or None when
        the step lost a race (a source changed) and was dropped."""
        deployment_id = await self._deployment()
        stream_ids = sorted({r.stream_id for info in step.sources for r in info.ranges})
        streams = await self._metadata.get_streams(stream_ids)
        try:
            datas = await self._fetch_all(step.sources)
        except NotFound:
            log.info("compaction step dropped: a source was removed meanwhile")
            return None
        plan: StepPlan = await self._offload(
            plan_step,
            list(zip(step.sources, datas, strict=True)),
            streams,
            deployment_id,
            self._config.stream_split_bytes,
            self._halt,
        )
        if len(plan.outputs) > len(step.sources):  # the planner's own rule; never relaxed
            raise AssertionError(
                f"compaction planned {len(plan.outputs)} objects for {len(step.sources)}"
            )
        ids = (
            await self._metadata.prepare_objects(len(plan.outputs), self._prepare_ttl_ms)
            if plan.outputs
            else []
        )
        identities = [ObjectIdentity(deployment_id, object_id) for object_id in ids]
        built = await self._offload(
            build_outputs,
            plan.outputs,
            identities,
            DEFAULT_BLOCK_TARGET_BYTES,
            self._halt,
            self._object_format,
        )
        shapes = [
            (output.kind, tuple(run.stream_range() for run in output.runs))
            for output in plan.outputs
        ]
        del datas, plan  # the sources' bytes are no longer needed
        commits: list[ObjectCommit] = []
        written: list[str] = []
        try:
            for identity, (kind, ranges), result in zip(identities, shapes, built, strict=True):
                key = object_key(identity.object_id, deployment_id)
                await publish_object(
                    self._objects,
                    key,
                    result.data,
                    identity,
                    clock=self._clock,
                    rng=self._rng,
                    give_up=self._stop.is_set,
                )
                written.append(key)
                commits.append(
                    ObjectCommit(
                        identity.object_id, key, kind, len(result.data), result.index_size, ranges
                    )
                )
        except WalstreamError:
            # Nothing was committed: the outputs are ours alone to delete.
            await self._delete_quietly(written)
            raise
        source_ids = sorted(info.object_id for info in step.sources)
        try:
            await self._metadata.replace_objects(source_ids, commits)
        except PreconditionFailed as exc:
            # The replace definitely did not apply (a source changed): drop the outputs.
            log.info("compaction step lost a race (%s); its output is discarded", exc)
            await self._delete_quietly(written)
            return None
        # Any other failure (or a cancellation) may have committed the replace: the outputs
        # stay; if they did not commit, their prepared ids expire and the garbage collector
        # deletes them.
        size = sum(commit.size for commit in commits)
        self._hooks.emit(Compacted(source_ids, [commit.object_id for commit in commits], size))
        return sum(info.size for info in step.sources), size, len(commits)

    async def _offload(self, function: Callable[..., _T], *args: object) -> _T:
        """Run CPU-heavy ``function`` in a worker thread (:attr:`in_thread`, the default) or
        inline on the event loop (benchmarks compare the two)."""
        if self.in_thread:
            return await asyncio.to_thread(function, *args)
        return function(*args)

    async def _fetch_all(self, sources: Sequence[ObjectInfo]) -> list[bytes]:
        """Every source object whole, one GET each, a few at a time."""
        gate = asyncio.Semaphore(_FETCH_CONCURRENCY)

        async def fetch(info: ObjectInfo) -> bytes:
            async with gate:
                data = await self._objects.get(info.key)
            if len(data) != info.size:
                raise CorruptionError(
                    f"object {info.key!r} is {len(data)} bytes, metadata says {info.size} "
                    "(truncated or replaced)"
                )
            return data

        return list(await asyncio.gather(*(fetch(info) for info in sources)))

    async def _delete_quietly(self, keys: list[str]) -> None:
        if not keys:
            return
        try:
            await self._objects.delete(keys)
        except WalstreamError as exc:
            log.warning("could not delete discarded compaction output %s: %s", keys, exc)

    async def collect_garbage(self) -> int:
        """Delete destroyed objects and expired uploads; returns how many were removed."""
        destroyed = await self._metadata.list_objects(state=ObjectState.MARK_DESTROYED)
        expired = await self._metadata.expired_prepared(self._clock.now_ms())
        keys = [info.key for info in destroyed]
        if expired:
            deployment_id = await self._deployment()
            # An expired id has no key in metadata: delete where an upload would have put it.
            # Keys of the format before (without the deployment) are left alone: another
            # deployment sharing the location may own an object under the same legacy key.
            keys.extend(object_key(object_id, deployment_id) for object_id in expired)
        if not keys:
            return 0
        await self._objects.delete(keys)
        ids = [info.object_id for info in destroyed] + list(expired)
        await self._metadata.forget_objects(ids)
        if self._on_destroyed is not None:
            self._on_destroyed(set(ids))
        return len(ids)
